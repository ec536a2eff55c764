/* vec.h — float32 vector routines per ISA family, dispatched on hymt_active_isa:
 *
 *   hymt_dot_f32       dot product (REFERENCE.md §3.3). The variants differ only in summation order
 *                      (each is within §3.6 of the sequential sum); a given ISA always sums in the same
 *                      order, so results never depend on threads or batching. Tails use masked loads
 *                      (AVX-512) or scalar steps, never reading past n.
 *   hymt_silu_mul_f32  the FFN gate g ← silu(g) × u = g / (1 + e^−g) × u. One fixed sequence of float
 *                      operations (below) in every variant, so all families agree bit for bit: e^t by
 *                      Cody–Waite reduction t = n·ln2 + r (n = nearest integer to t·log2 e, ln2 split in
 *                      two so n·ln2_hi is exact), e^r by a degree-7 polynomial in fma Horner form (Cephes
 *                      expf coefficients, |error| ≤ 2 ulp on |r| ≤ ln2/2), times 2^n built in the exponent
 *                      bits. g is clamped to ≥ −88 and t to ≥ −87, so 2^n stays normal and e^t finite:
 *                      beyond, the gate is g itself (g > 87) or below 1e−35 in magnitude (g < −88). It
 *                      replaced a scalar expf() loop that took 13 % of a prefill. */
#ifndef HYMT_VEC_H
#define HYMT_VEC_H

#include "hymt_common.h"

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

/* ---- SiLU gate: the scalar reference defines the operation sequence ---- */

#define HYMT_EXP_MIN (-87.0f)
#define HYMT_EXP_MAX 88.0f
#define HYMT_LOG2E 1.44269504088896341f
#define HYMT_LN2_HI 0.693359375f /* 9 significant bits: n · HYMT_LN2_HI is exact for |n| ≤ 128 */
#define HYMT_LN2_LO (-2.12194440e-4f)
#define HYMT_EXP_C0 1.9875691500e-4f
#define HYMT_EXP_C1 1.3981999507e-3f
#define HYMT_EXP_C2 8.3334519073e-3f
#define HYMT_EXP_C3 4.1665795894e-2f
#define HYMT_EXP_C4 1.6666665459e-1f
#define HYMT_EXP_C5 5.0000001201e-1f

static inline float hymt_silu_scalar(float g) {
    g = fmaxf(g, -HYMT_EXP_MAX); /* below, the gate is below 1e-35 in magnitude anyway */
    float t = fmaxf(-g, HYMT_EXP_MIN);
    float n = rintf(t * HYMT_LOG2E); /* nearest, ties to even (the default rounding mode) */
    float r = fmaf(n, -HYMT_LN2_HI, t);
    r = fmaf(n, -HYMT_LN2_LO, r);
    float p = fmaf(HYMT_EXP_C0, r, HYMT_EXP_C1);
    p = fmaf(p, r, HYMT_EXP_C2);
    p = fmaf(p, r, HYMT_EXP_C3);
    p = fmaf(p, r, HYMT_EXP_C4);
    p = fmaf(p, r, HYMT_EXP_C5);
    float e = fmaf(p, r * r, r) + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return g / (1.0f + e * scale);
}

static void hymt_silu_mul_f32_scalar(float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) g[i] = hymt_silu_scalar(g[i]) * u[i];
}

#if defined(HYMT_X86)
HYMT_TARGET_AVX512 static inline __m512 hymt_silu512(__m512 g) {
    g = _mm512_max_ps(g, _mm512_set1_ps(-HYMT_EXP_MAX));
    __m512 t = _mm512_max_ps(_mm512_sub_ps(_mm512_setzero_ps(), g), _mm512_set1_ps(HYMT_EXP_MIN));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(t, _mm512_set1_ps(HYMT_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-HYMT_LN2_HI), t);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-HYMT_LN2_LO), r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(HYMT_EXP_C0), r, _mm512_set1_ps(HYMT_EXP_C1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(HYMT_EXP_C2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(HYMT_EXP_C3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(HYMT_EXP_C4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(HYMT_EXP_C5));
    __m512 e = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    __m512 scale = _mm512_castsi512_ps(bits);
    return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), _mm512_mul_ps(e, scale)));
}

HYMT_TARGET_AVX512 static void hymt_silu_mul_f32_avx512(float *g, const float *u, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(g + i, _mm512_mul_ps(hymt_silu512(_mm512_loadu_ps(g + i)), _mm512_loadu_ps(u + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        __m512 v = hymt_silu512(_mm512_maskz_loadu_ps(m, g + i));
        _mm512_mask_storeu_ps(g + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, u + i)));
    }
}

HYMT_TARGET_AVX2 static inline __m256 hymt_silu256(__m256 g) {
    g = _mm256_max_ps(g, _mm256_set1_ps(-HYMT_EXP_MAX));
    __m256 t = _mm256_max_ps(_mm256_sub_ps(_mm256_setzero_ps(), g), _mm256_set1_ps(HYMT_EXP_MIN));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(t, _mm256_set1_ps(HYMT_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-HYMT_LN2_HI), t);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-HYMT_LN2_LO), r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(HYMT_EXP_C0), r, _mm256_set1_ps(HYMT_EXP_C1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(HYMT_EXP_C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(HYMT_EXP_C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(HYMT_EXP_C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(HYMT_EXP_C5));
    __m256 e = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 scale = _mm256_castsi256_ps(bits);
    return _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), _mm256_mul_ps(e, scale)));
}

HYMT_TARGET_AVX2 static void hymt_silu_mul_f32_avx2(float *g, const float *u, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(g + i, _mm256_mul_ps(hymt_silu256(_mm256_loadu_ps(g + i)), _mm256_loadu_ps(u + i)));
    for (; i < n; i++) g[i] = hymt_silu_scalar(g[i]) * u[i];
}
#endif

#if defined(HYMT_ARM64)
static inline float32x4_t hymt_silu_neon(float32x4_t g) {
    g = vmaxq_f32(g, vdupq_n_f32(-HYMT_EXP_MAX));
    float32x4_t t = vmaxq_f32(vnegq_f32(g), vdupq_n_f32(HYMT_EXP_MIN));
    float32x4_t n = vrndnq_f32(vmulq_f32(t, vdupq_n_f32(HYMT_LOG2E)));
    float32x4_t r = vfmaq_f32(t, n, vdupq_n_f32(-HYMT_LN2_HI)); /* vfmaq_f32(a, b, c) = a + b·c */
    r = vfmaq_f32(r, n, vdupq_n_f32(-HYMT_LN2_LO));
    float32x4_t p = vfmaq_f32(vdupq_n_f32(HYMT_EXP_C1), vdupq_n_f32(HYMT_EXP_C0), r);
    p = vfmaq_f32(vdupq_n_f32(HYMT_EXP_C2), p, r);
    p = vfmaq_f32(vdupq_n_f32(HYMT_EXP_C3), p, r);
    p = vfmaq_f32(vdupq_n_f32(HYMT_EXP_C4), p, r);
    p = vfmaq_f32(vdupq_n_f32(HYMT_EXP_C5), p, r);
    float32x4_t e = vaddq_f32(vfmaq_f32(r, p, vmulq_f32(r, r)), vdupq_n_f32(1.0f));
    int32x4_t bits = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    float32x4_t scale = vreinterpretq_f32_s32(bits);
    return vdivq_f32(g, vaddq_f32(vdupq_n_f32(1.0f), vmulq_f32(e, scale)));
}

static void hymt_silu_mul_f32_neon(float *g, const float *u, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(g + i, vmulq_f32(hymt_silu_neon(vld1q_f32(g + i)), vld1q_f32(u + i)));
    for (; i < n; i++) g[i] = hymt_silu_scalar(g[i]) * u[i];
}
#endif

/* g [n] ← silu(g) × u [n] with the family isa's variant (all give the same bits). */
static void hymt_silu_mul_f32_isa(int isa, float *g, const float *u, int64_t n) {
    switch (isa) {
#if defined(HYMT_X86)
    case HYMT_ISA_AVX512:
        hymt_silu_mul_f32_avx512(g, u, n);
        return;
    case HYMT_ISA_AVX2:
        hymt_silu_mul_f32_avx2(g, u, n);
        return;
#endif
#if defined(HYMT_ARM64)
    case HYMT_ISA_NEON:
        hymt_silu_mul_f32_neon(g, u, n);
        return;
#endif
    default:
        hymt_silu_mul_f32_scalar(g, u, n);
    }
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
