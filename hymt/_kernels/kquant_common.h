/* kquant_common.h — what the Q4_K and Q6_K kernels share and build on: two activation layouts for their
 * int8 paths and the lane layouts that go with them.
 *
 * Q6_K (chunk lanes, "kq layout"): a block is sixteen 16-weight chunks with one sub-scale each; the
 * vector GEMMs keep one int32 lane per chunk j (0..15) and need, per block, the exact integer dot of each
 * chunk with its 16 activations. An int32 lane of vpdpbusd / pmaddubsw+pmaddwd / sdot sums 4 consecutive
 * bytes, so the weights are transposed once per block into four 64-byte vectors v = 0..3 with
 *
 *     vector v, bytes 4j..4j+3  =  chunk j, weights 4v..4v+3          (kq layout)
 *
 * and the activations are stored in the same order when a token is prepared (hymt_kq8). Dot
 * instructions on the same int32 accumulator then leave chunk j's dot (or the dot of its first / second
 * 8 weights, vectors 0-1 / 2-3) in lane j, where the sub-scale sc_j multiplies it exactly; the block's
 * integer sum then needs a sum across lanes, which the x86 kernels do for 8 or 16 rows at once so that
 * it lands with lane = output row (fmt_q6_k.h).
 *
 * Q4_K (row lanes): its definition (fmt_q4_k.h) applies the sub-block scales and mins in exact integer
 * arithmetic, leaving two float operations per (row, token, block), so the kernels may lay lanes out
 * freely: row tiles (hymt_transpose16_epi32: 16 rows of code dwords -> 16 vectors, lane = output row) that
 * every token of a batch broadcasts its activation dwords against, or, for few tokens, one row at a
 * time with a 16-vector horizontal-sum tree (hymt_kq_hsum16). Activations in natural order (hymt_k8).
 *
 * Integer sums are exact, so every ISA gets the same integers however it computes them. */
#ifndef HYMT_KQUANT_COMMON_H
#define HYMT_KQUANT_COMMON_H

#include <stdlib.h>

#include "hymt_common.h"
#include "act_q8g.h"
#include "cpu.h"
#include "vec.h"

/* Token tiles of the scalar references (any size gives the same values; bounds the stack). */
#define HYMT_KQ_SCALAR_TILE 16

/* Token tiles of the Q6_K NEON kernel: TT tokens share each unpacked block of a row (the x86 kernels tile
 * rows and tokens, see fmt_q6_k.h). */
#define HYMT_KQ_TT 16

/* Software prefetch along a weight row: into L1 the block HYMT_KQ_PREFETCH_L1 bytes ahead, into L2
 * the one HYMT_KQ_PREFETCH_L2 bytes ahead. With the hardware prefetchers alone a single-row GEMV
 * reached ~70% of the streaming read rate; with both it reads faster than a plain streaming loop.
 * (Prefetches never fault and their data is never used unless the kernel reads it, so running past
 * the tensor is harmless.) */
#define HYMT_KQ_PREFETCH_L1 1024
#define HYMT_KQ_PREFETCH_L2 4096

HYMT_INLINE void hymt_kq_prefetch(const uint8_t *blk) {
    for (int k = 0; k < 256; k += 64) __builtin_prefetch(blk + HYMT_KQ_PREFETCH_L1 + k, 0, 3);
    for (int k = 0; k < 256; k += 64) __builtin_prefetch(blk + HYMT_KQ_PREFETCH_L2 + k, 0, 2);
}

/* ---- Q6_K: chunk-lane (kq) layout ----------------------------------------------------------------- */

/* One token's activations for one group of 256 inputs (REFERENCE.md §3.4 values, kq order), 448
 * bytes: a multiple of 64, so every member stays 64-byte aligned in a 64-aligned buffer. */
typedef struct {
    int8_t qs[256];       /* qs[64v + 4j + e] = q[16j + 4v + e]  (q = hymt_quantize_group_q8g) */
    int32_t nb32[2][16];  /* nb32[h][j] = −32 × Σ q[16j + 8h .. 16j + 8h + 8): the Q6_K −32 code offset of
                             the weights of vectors 2h, 2h + 1 (exact; |.| <= 32512, int16-sized) */
    int16_t bsum[16];     /* Σ q[16j .. 16j+16) in natural chunk order (the AVX2 kernel's −32 offset term) */
    float d;              /* activation scale s of the group */
    uint8_t pad[28];
} hymt_kq8;
_Static_assert(sizeof(hymt_kq8) == 448, "hymt_kq8 keeps its members 64-byte aligned");

static size_t hymt_act_stride_kq8(int64_t cols, int64_t n) {
    (void)n;
    return (size_t)(cols / 256) * sizeof(hymt_kq8);
}

/* The half-chunk sums and the scale, from the quantized group (the qs are already stored). */
static inline void hymt_kq8_sums(const hymt_q8g *g, hymt_kq8 *a) {
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 16; j++) {
            int32_t sum = 0;
            for (int i = 16 * j + 8 * h; i < 16 * j + 8 * h + 8; i++) sum += g->qs[i];
            a->nb32[h][j] = -32 * sum;
        }
    for (int j = 0; j < 16; j++) a->bsum[j] = g->bsums[j];
    a->d = g->d;
    memset(a->pad, 0, sizeof a->pad);
}

static void hymt_prepare_kq8_group_scalar(const float *x, hymt_kq8 *a) {
    hymt_q8g g;
    hymt_quantize_group_q8g(x, &g);
    for (int v = 0; v < 4; v++)
        for (int j = 0; j < 16; j++)
            for (int e = 0; e < 4; e++) a->qs[64 * v + 4 * j + e] = g.qs[16 * j + 4 * v + e];
    hymt_kq8_sums(&g, a);
}

/* The activation of natural index i (0..255) in a kq-ordered qs. */
HYMT_INLINE int32_t hymt_kq_act(const int8_t *qs, int i) {
    return qs[64 * ((i >> 2) & 3) + 4 * (i >> 4) + (i & 3)];
}

#if defined(HYMT_X86)
/* kq transpose of four 64-byte vectors in natural order: dword d (0..15) of n[s] holds weights
 * 4(d % 4)..+3 of chunk 4s + d / 4. Stage 1 (s1: lo01, hi01, lo23, hi23) gathers dwords {0, 1} (lo) and
 * {2, 3} (hi) of the 8 chunks of (n0, n1) and of (n2, n3), ordered 2·(chunk % 8) + (dword % 2); stage 2
 * (s2: even / odd dword) picks out vector v lane j = chunk j, dword v. */
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_kq_transpose_avx512(const __m512i s1[4], const __m512i s2[2],
                                                             __m512i n0, __m512i n1, __m512i n2,
                                                             __m512i n3, __m512i out[4]) {
    __m512i lo01 = _mm512_permutex2var_epi32(n0, s1[0], n1);
    __m512i hi01 = _mm512_permutex2var_epi32(n0, s1[1], n1);
    __m512i lo23 = _mm512_permutex2var_epi32(n2, s1[2], n3);
    __m512i hi23 = _mm512_permutex2var_epi32(n2, s1[3], n3);
    out[0] = _mm512_permutex2var_epi32(lo01, s2[0], lo23);
    out[1] = _mm512_permutex2var_epi32(lo01, s2[1], lo23);
    out[2] = _mm512_permutex2var_epi32(hi01, s2[0], hi23);
    out[3] = _mm512_permutex2var_epi32(hi01, s2[1], hi23);
}
#endif

#if defined(HYMT_X86)
/* The stage permutations of hymt_kq_transpose_avx512 (a pure function of constants). */
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_kq_perms_avx512(__m512i s1[4], __m512i s2[2]) {
    int32_t t1[4][16], t2[2][16];
    for (int pair = 0; pair < 2; pair++)
        for (int half = 0; half < 2; half++)
            for (int c = 0; c < 8; c++)
                for (int e = 0; e < 2; e++) /* chunk 8·pair + c sits in n[2·pair + c / 4], dwords 4(c % 4).. */
                    t1[2 * pair + half][2 * c + e] = 16 * (c / 4) + 4 * (c % 4) + 2 * half + e;
    for (int e = 0; e < 2; e++)
        for (int j = 0; j < 16; j++) t2[e][j] = j < 8 ? 2 * j + e : 16 + 2 * (j - 8) + e;
    for (int i = 0; i < 4; i++) s1[i] = _mm512_loadu_si512((const void *)t1[i]);
    for (int i = 0; i < 2; i++) s2[i] = _mm512_loadu_si512((const void *)t2[i]);
}

/* AVX2 kq transpose: natural chunk registers (two chunks per ymm, chunk pairs (0,1),(2,3),...,
 * (14,15) in nat[0..7]) -> out[v][h], v = dword, h = lanes 8h..8h+7. */
HYMT_TARGET_AVX2 HYMT_INLINE void hymt_kq_transpose_avx2(const __m256i nat[8], __m256i out[4][2]) {
    for (int h = 0; h < 2; h++) {
        const __m256i *p = nat + 4 * h; /* chunks 8h .. 8h+7 */
        __m256i x0 = _mm256_permute2x128_si256(p[0], p[2], 0x20); /* chunks 8h+0, 8h+4 */
        __m256i x1 = _mm256_permute2x128_si256(p[0], p[2], 0x31); /* 8h+1, 8h+5 */
        __m256i x2 = _mm256_permute2x128_si256(p[1], p[3], 0x20); /* 8h+2, 8h+6 */
        __m256i x3 = _mm256_permute2x128_si256(p[1], p[3], 0x31); /* 8h+3, 8h+7 */
        __m256i t0 = _mm256_unpacklo_epi32(x0, x1), t1 = _mm256_unpackhi_epi32(x0, x1);
        __m256i t2 = _mm256_unpacklo_epi32(x2, x3), t3 = _mm256_unpackhi_epi32(x2, x3);
        out[0][h] = _mm256_unpacklo_epi64(t0, t2);
        out[1][h] = _mm256_unpackhi_epi64(t0, t2);
        out[2][h] = _mm256_unpacklo_epi64(t1, t3);
        out[3][h] = _mm256_unpackhi_epi64(t1, t3);
    }
}
#endif

#if defined(HYMT_ARM64)
/* NEON kq transpose: chunk registers c[0..15] (16 bytes each) -> out[v][k] = lanes 4k..4k+3. */
HYMT_INLINE void hymt_kq_transpose_neon(const int8x16_t c[16], int8x16_t out[4][4]) {
    for (int k = 0; k < 4; k++) {
        int32x4_t a0 = vreinterpretq_s32_s8(c[4 * k]), a1 = vreinterpretq_s32_s8(c[4 * k + 1]);
        int32x4_t a2 = vreinterpretq_s32_s8(c[4 * k + 2]), a3 = vreinterpretq_s32_s8(c[4 * k + 3]);
        int32x4_t t0 = vtrn1q_s32(a0, a1), t1 = vtrn2q_s32(a0, a1); /* [a0.0 a1.0 a0.2 a1.2], [.1 .1 .3 .3] */
        int32x4_t t2 = vtrn1q_s32(a2, a3), t3 = vtrn2q_s32(a2, a3);
        int64x2_t u0 = vreinterpretq_s64_s32(t0), u1 = vreinterpretq_s64_s32(t1);
        int64x2_t u2 = vreinterpretq_s64_s32(t2), u3 = vreinterpretq_s64_s32(t3);
        out[0][k] = vreinterpretq_s8_s64(vtrn1q_s64(u0, u2));
        out[1][k] = vreinterpretq_s8_s64(vtrn1q_s64(u1, u3));
        out[2][k] = vreinterpretq_s8_s64(vtrn2q_s64(u0, u2));
        out[3][k] = vreinterpretq_s8_s64(vtrn2q_s64(u1, u3));
    }
}
#endif

/* cols is a multiple of 256 (whole Q6_K blocks). */
#if defined(HYMT_X86)
/* The same values as hymt_quantize_group_q8g: max|x| is exact in any order, inverse and scale are
 * the same two float32 divisions, x × inverse the same product, and vcvtps2dq rounds half to even
 * like nearbyintf (both follow MXCSR, round-to-nearest), and the clamp comes first (it only acts
 * when 127 / max overflows, for subnormal groups). Groups with NaN or infinity take the scalar code. */
HYMT_TARGET_AVX512 static void hymt_prepare_kq8_avx512(const float *x, int64_t cols, uint8_t *act) {
    __m512i s1[4], s2[2];
    hymt_kq_perms_avx512(s1, s2);
    hymt_kq8 *a = (hymt_kq8 *)act;
    for (int64_t b = 0; b < cols / 256; b++, x += 256) {
        __m512 v[16], amax = _mm512_setzero_ps();
        __mmask16 nan = 0;
        for (int k = 0; k < 16; k++) {
            v[k] = _mm512_loadu_ps(x + 16 * k);
            amax = _mm512_max_ps(amax, _mm512_abs_ps(v[k]));
            nan |= _mm512_cmp_ps_mask(v[k], v[k], _CMP_UNORD_Q);
        }
        float m = _mm512_reduce_max_ps(amax);
        if (nan || m > 3.402823466e38f) {
            hymt_prepare_kq8_group_scalar(x, a + b);
            continue;
        }
        const float inverse = m > 0.0f ? 127.0f / m : 0.0f, d = m > 0.0f ? m / 127.0f : 0.0f;
        const __m512 inv = _mm512_set1_ps(inverse), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
        __m512i nat[4]; /* chunks 4s..4s+3 */
        for (int s = 0; s < 4; s++) {
            __m128i c[4];
            for (int k = 0; k < 4; k++)
                c[k] = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(
                    _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v[4 * s + k], inv), lo), hi)));
            __m512i z = _mm512_castsi128_si512(c[0]);
            z = _mm512_inserti32x4(z, c[1], 1);
            z = _mm512_inserti32x4(z, c[2], 2);
            nat[s] = _mm512_inserti32x4(z, c[3], 3);
        }
        __m512i qs[4];
        hymt_kq_transpose_avx512(s1, s2, nat[0], nat[1], nat[2], nat[3], qs);
        const __m512i ones = _mm512_set1_epi8(1);
        for (int k = 0; k < 4; k++) _mm512_storeu_si512((void *)(a[b].qs + 64 * k), qs[k]);
        __m512i total = _mm512_setzero_si512(); /* lane j: Σ of chunk j */
        for (int h = 0; h < 2; h++) { /* lane j: Σ of chunk j's weights 8h .. 8h+7 */
            const __m512i sums = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, qs[2 * h]),
                                                     ones, qs[2 * h + 1]);
            _mm512_storeu_si512((void *)a[b].nb32[h], _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sums, 5)));
            total = _mm512_add_epi32(total, sums);
        }
        _mm256_storeu_si256((__m256i *)a[b].bsum, _mm512_cvtepi32_epi16(total));
        a[b].d = d;
        memset(a[b].pad, 0, sizeof a[b].pad);
    }
}
#endif

#if defined(HYMT_X86)
/* AVX2 form of hymt_prepare_kq8_avx512 (same values, same reasons). */
HYMT_TARGET_AVX2 static void hymt_prepare_kq8_avx2(const float *x, int64_t cols, uint8_t *act) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* undo the in-lane packs */
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    hymt_kq8 *a = (hymt_kq8 *)act;
    for (int64_t b = 0; b < cols / 256; b++, x += 256) {
        __m256 amax = _mm256_setzero_ps();
        int nan = 0;
        for (int k = 0; k < 32; k++) {
            __m256 v = _mm256_loadu_ps(x + 8 * k);
            amax = _mm256_max_ps(amax, _mm256_and_ps(v, abs_mask));
            nan |= _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        const float m = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        if (nan || m > 3.402823466e38f) {
            hymt_prepare_kq8_group_scalar(x, a + b);
            continue;
        }
        const float inverse = m > 0.0f ? 127.0f / m : 0.0f, d = m > 0.0f ? m / 127.0f : 0.0f;
        const __m256 inv = _mm256_set1_ps(inverse);
        __m256i nat[8]; /* chunk pairs (0,1), ..., (14,15) */
        for (int p = 0; p < 8; p++) {
            __m256i q[4];
            for (int k = 0; k < 4; k++) {
                __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + 32 * p + 8 * k), inv);
                q[k] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, lo), hi));
            }
            __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            nat[p] = _mm256_permutevar8x32_epi32(packed, order);
        }
        __m256i qs[4][2];
        hymt_kq_transpose_avx2(nat, qs);
        for (int h = 0; h < 2; h++) {
            __m256i total = _mm256_setzero_si256(); /* lane k: Σ of chunk 8h + k */
            for (int e = 0; e < 2; e++) {
                __m256i sums = _mm256_setzero_si256(); /* lane k: Σ of chunk 8h + k's weights 8e .. 8e+7 */
                for (int v = 2 * e; v < 2 * e + 2; v++) {
                    _mm256_storeu_si256((__m256i *)(a[b].qs + 64 * v + 32 * h), qs[v][h]);
                    sums = _mm256_add_epi32(sums, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, qs[v][h]), ones16));
                }
                _mm256_storeu_si256((__m256i *)(a[b].nb32[e] + 8 * h),
                                    _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sums, 5)));
                total = _mm256_add_epi32(total, sums);
            }
            _mm_storeu_si128((__m128i *)(a[b].bsum + 8 * h),
                             _mm_packs_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1)));
        }
        a[b].d = d;
        memset(a[b].pad, 0, sizeof a[b].pad);
    }
}
#endif

/* One token's activations for the Q6_K int8 GEMM; every variant stores the same bytes. */
static void hymt_prepare_kq8(const float *x, int64_t cols, int64_t n, uint8_t *act) {
    (void)n;
#if defined(HYMT_X86)
    if (hymt_active_isa == HYMT_ISA_AVX512) {
        hymt_prepare_kq8_avx512(x, cols, act);
        return;
    }
    if (hymt_active_isa == HYMT_ISA_AVX2) {
        hymt_prepare_kq8_avx2(x, cols, act);
        return;
    }
#endif
    hymt_kq8 *a = (hymt_kq8 *)act;
    for (int64_t b = 0; b < cols / 256; b++) hymt_prepare_kq8_group_scalar(x + 256 * b, a + b);
}

/* ---- Q4_K: row-lane layout -----------------------------------------------------------------------
 * Kernels that keep one int32 lane per OUTPUT ROW: a tile of 16 rows is decoded once per block into
 * 64 vectors v[kd] (lane r = the 4 codes of row r at inputs 4kd..4kd+3), and each token's activation
 * dword kd is broadcast against them (vpdpbusd / pmaddubsw / sdot by lane). The per-sub-block scales
 * are then applied in exact integer arithmetic per row lane, and only a couple of float operations per
 * (row, token, block) remain. The activations stay in natural order. */

/* One token's activations for one group of 256 inputs (REFERENCE.md §3.4 values), 576 bytes (a multiple of
 * 64: an array of groups keeps qs and qs4 64-byte aligned). */
typedef struct {
    int8_t qs[256];    /* natural order: qs[i] = q[i] (q = hymt_quantize_group_q8g) */
    int8_t qs4[256];   /* the order of Q4_K's rearranged code vectors V_k (fmt_q4_k.h): qs4[64k + 4L + e] =
                          q[64(L % 8 / 2) + 32(L / 8) + 8k + 4(L % 2) + e] for k < 4, L < 16, e < 4 */
    int32_t nb8[8];    /* −8 · bsum_j: chain starts that centre the Q4_K codes (fmt_q4_k.h) */
    int16_t bsum[8];   /* bsum_j = Σ q[32j .. 32j+32); dword i = (bsum[2i], bsum[2i+1]) as an int16 pair */
    float d;           /* activation scale s of the group */
    uint8_t pad[12];
} hymt_k8;
_Static_assert(sizeof(hymt_k8) == 576, "hymt_k8 keeps its members 64-byte aligned");

static size_t hymt_act_stride_k8(int64_t cols, int64_t n) {
    (void)n;
    return (size_t)(cols / 256) * sizeof(hymt_k8);
}

/* Quantization by hymt_quantize_group_q8g (its ISA variants are bit-identical), then the sums. */
static void hymt_prepare_k8(const float *x, int64_t cols, int64_t n, uint8_t *act) {
    (void)n;
    hymt_k8 *a = (hymt_k8 *)act;
    for (int64_t b = 0; b < cols / 256; b++) {
        hymt_q8g g;
        hymt_quantize_group_q8g(x + 256 * b, &g);
        memcpy(a[b].qs, g.qs, 256);
        for (int k = 0; k < 4; k++) /* lanes 2p, 2p + 1 of vector k: 8 consecutive inputs */
            for (int p = 0; p < 8; p++) memcpy(a[b].qs4 + 64 * k + 8 * p, g.qs + 64 * (p % 4) + 32 * (p / 4) + 8 * k, 8);
        for (int j = 0; j < 8; j++) {
            a[b].bsum[j] = (int16_t)(g.bsums[2 * j] + g.bsums[2 * j + 1]);
            a[b].nb8[j] = -8 * a[b].bsum[j];
        }
        a[b].d = g.d;
        memset(a[b].pad, 0, sizeof a[b].pad);
    }
}

HYMT_INLINE int32_t hymt_k8_dword(const hymt_k8 *a, int kd) {
    int32_t v;
    memcpy(&v, a->qs + 4 * kd, 4);
    return v;
}

HYMT_INLINE int32_t hymt_k8_bsum_pair(const hymt_k8 *a, int i) {
    int32_t v;
    memcpy(&v, a->bsum + 2 * i, 4);
    return v;
}

/* Up to HYMT_Q4_K_GEMV_MAX tokens the AVX-512 kernel on AMD cores (fmt_q4_k.h, hymt_q4_k_uses_gemv) reads
 * the weights one row at a time (one sequential stream, at memory speed) and computes each block's exact
 * integers with one lane per 16 inputs of a sub-block and a horizontal integer sum; above it (and on Intel
 * cores from one token), it decodes 16-row tiles (row lanes), which costs more per weight byte but less per
 * token. The integers are exact and the float steps identical: the same bits. */

#if defined(HYMT_X86)
/* Horizontal sums of 16 int32 vectors at once: lane i of the result = Σ of the lanes of v[i] (exact; a
 * pairwise tree of unpacks and 128-bit shuffles, 45 operations instead of ~10 per vector). */
HYMT_TARGET_AVX512 HYMT_INLINE __m512i hymt_kq_hsum16(const __m512i v[16]) {
    __m512i a[8], b[4], c[2];
    for (int i = 0; i < 8; i++) /* 128-bit lane l: [v2i.x, v2i+1.x, v2i.y, v2i+1.y] partial sums */
        a[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]),
                                _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) /* 128-bit lane l: partial sums of v4i .. v4i+3 */
        b[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(a[2 * i], a[2 * i + 1]),
                                _mm512_unpackhi_epi64(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 2; i++)
        c[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(b[2 * i], b[2 * i + 1], 0x44),
                                _mm512_shuffle_i32x4(b[2 * i], b[2 * i + 1], 0xEE));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(c[0], c[1], 0x88), _mm512_shuffle_i32x4(c[0], c[1], 0xDD));
}
#endif

#if defined(HYMT_X86)
/* Σ of the 8 int32 lanes (exact). */
HYMT_TARGET_AVX2 HYMT_INLINE int32_t hymt_kq_hsum8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}
#endif

/* Tokens per call of the row-lane kernels' inner tile, and per pass over the weights (a pass keeps one
 * float accumulator vector per token on the stack; more tokens take more passes). */
#define HYMT_K_TT 8
#define HYMT_K_PASS 64

#endif /* HYMT_KQUANT_COMMON_H */
