/* vec.h — float32 vector routines per ISA family, dispatched on hymt_active_isa:
 *
 *   hymt_dot_f32       dot product (REFERENCE.md §3.3). The variants differ only in summation order
 *                      (each is within §3.6 of the sequential sum); a given ISA always sums in the same
 *                      order, so results never depend on threads or batching. Tails use masked loads
 *                      (AVX-512) or scalar steps, never reading past n.
 *   hymt_silu_mul_f32  the FFN gate g ← silu(g) × u = g / (1 + e^−g) × u, from one element-wise source
 *                      (vec16.h: the exp attention uses too) compiled for each family, so all families
 *                      give the same bits. It replaced a scalar expf() loop that took 13 % of a prefill. */
#ifndef HYMT_VEC_H
#define HYMT_VEC_H

#include "hymt_common.h"
#include "vec16.h"

/* Scalar reference: 8 partial sums over i % 8, combined by a fixed tree. */
static float hymt_dot_f32_scalar(const float *a, const float *b, int64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[i + l] * b[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

#if defined(HYMT_X86)
HYMT_TARGET_AVX512 static inline float hymt_hsum512(__m512 v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}

HYMT_TARGET_AVX2 static inline float hymt_hsum256(__m256 h) {
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}

HYMT_TARGET_AVX512 static float hymt_dot_f32_avx512(const float *a, const float *b, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(),
           s3 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
    }
    for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
    }
    return hymt_hsum512(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

HYMT_TARGET_AVX2 static float hymt_dot_f32_avx2(const float *a, const float *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(),
           s3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float tail = 0.0f;
    for (; i < n; i++) tail += a[i] * b[i];
    return hymt_hsum256(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3))) + tail;
}
#endif

#if defined(HYMT_ARM64)
static float hymt_dot_f32_neon(const float *a, const float *b, int64_t n) {
    float32x4_t s0 = vdupq_n_f32(0.0f), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
        s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
        s2 = vfmaq_f32(s2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
        s3 = vfmaq_f32(s3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
    }
    for (; i + 4 <= n; i += 4) s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
    float tail = 0.0f;
    for (; i < n; i++) tail += a[i] * b[i];
    return vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3))) + tail;
}
#endif

/* ---- SiLU gate: one element-wise source (vec16.h) compiled for each family ---- */

/* silu(g) = g / (1 + e^−g) with g clamped to >= −88 (below, the gate is under 1e−35 in magnitude). */
static inline __attribute__((always_inline)) hymt_v16f hymt_silu16(hymt_v16f g) {
    const hymt_v16f lo = hymt_splat16(-88.0f);
    g = hymt_select16(g < lo, lo, g);
    return g / (hymt_splat16(1.0f) + hymt_exp16(-g));
}

/* g [n] ← silu(g) × u; the tail goes through zero-padded lanes, so every element gets the same operations. */
static inline __attribute__((always_inline)) void hymt_silu_mul_body(float *g, const float *u, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) hymt_store16(g + i, hymt_silu16(hymt_load16(g + i)) * hymt_load16(u + i));
    if (i < n) {
        float gt[16] = {0}, ut[16] = {0};
        memcpy(gt, g + i, sizeof(float) * (size_t)(n - i));
        memcpy(ut, u + i, sizeof(float) * (size_t)(n - i));
        hymt_store16(gt, hymt_silu16(hymt_load16(gt)) * hymt_load16(ut));
        memcpy(g + i, gt, sizeof(float) * (size_t)(n - i));
    }
}

/* hymt_silu_mul_body over rows g [rows][len] (g_stride apart) and u [rows][len] (u_stride apart). matmul.h
 * calls it once per gate/up chunk, not once per token's 64 floats: the set-up of a call (silu16's constants,
 * the call itself) took 7 % of the gate's time (0.527 -> 0.488 ns per element, AVX-512, 160 tokens). */
static inline __attribute__((always_inline)) void hymt_silu_mul_rows_body(float *g, int64_t g_stride,
                                                                         const float *u, int64_t u_stride,
                                                                         int64_t len, int64_t rows) {
    for (int64_t r = 0; r < rows; r++) hymt_silu_mul_body(g + r * g_stride, u + r * u_stride, len);
}

/* The reference: the vector code lowered to the baseline ISA (SSE2 on x86, NEON on arm64). */
static void hymt_silu_mul_rows_f32_scalar(float *g, int64_t g_stride, const float *u, int64_t u_stride,
                                          int64_t len, int64_t rows) {
    hymt_silu_mul_rows_body(g, g_stride, u, u_stride, len, rows);
}

#if defined(HYMT_X86)
HYMT_TARGET_AVX2 static void hymt_silu_mul_rows_f32_avx2(float *g, int64_t g_stride, const float *u,
                                                          int64_t u_stride, int64_t len, int64_t rows) {
    hymt_silu_mul_rows_body(g, g_stride, u, u_stride, len, rows);
}

HYMT_TARGET_AVX512 static void hymt_silu_mul_rows_f32_avx512(float *g, int64_t g_stride, const float *u,
                                                            int64_t u_stride, int64_t len, int64_t rows) {
    hymt_silu_mul_rows_body(g, g_stride, u, u_stride, len, rows);
}
#endif

/* g [rows][len] (rows g_stride apart) ← silu(g) × u [rows][len] (u_stride apart) with the family isa's build
 * (all give the same bits). */
static void hymt_silu_mul_rows_f32_isa(int isa, float *g, int64_t g_stride, const float *u, int64_t u_stride,
                                       int64_t len, int64_t rows) {
    switch (isa) {
#if defined(HYMT_X86)
    case HYMT_ISA_AVX512:
        hymt_silu_mul_rows_f32_avx512(g, g_stride, u, u_stride, len, rows);
        return;
    case HYMT_ISA_AVX2:
        hymt_silu_mul_rows_f32_avx2(g, g_stride, u, u_stride, len, rows);
        return;
#endif
    default:
        hymt_silu_mul_rows_f32_scalar(g, g_stride, u, u_stride, len, rows);
    }
}

/* One row: g [n] ← silu(g) × u [n], the reference and the family isa's build. */
static void hymt_silu_mul_f32_scalar(float *g, const float *u, int64_t n) {
    hymt_silu_mul_rows_f32_scalar(g, 0, u, 0, n, 1);
}

static void hymt_silu_mul_f32_isa(int isa, float *g, const float *u, int64_t n) {
    hymt_silu_mul_rows_f32_isa(isa, g, 0, u, 0, n, 1);
}

static float hymt_dot_f32_isa(int isa, const float *a, const float *b, int64_t n) {
    switch (isa) {
#if defined(HYMT_X86)
    case HYMT_ISA_AVX512:
        return hymt_dot_f32_avx512(a, b, n);
    case HYMT_ISA_AVX2:
        return hymt_dot_f32_avx2(a, b, n);
#endif
#if defined(HYMT_ARM64)
    case HYMT_ISA_NEON:
        return hymt_dot_f32_neon(a, b, n);
#endif
    default:
        return hymt_dot_f32_scalar(a, b, n);
    }
}

/* The dot every float32 path uses (format row dots, the float reference path). */
static inline float hymt_dot_f32(const float *a, const float *b, int64_t n) {
    return hymt_dot_f32_isa(hymt_active_isa, a, b, n);
}

#endif /* HYMT_VEC_H */
