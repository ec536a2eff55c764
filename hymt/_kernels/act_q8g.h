/* act_q8g.h — int8 quantization of activations in groups of 256 (REFERENCE.md §3.4).
 *
 * Every int8-path format quantizes its activations with exactly these values; each stores them in the
 * layout its kernels want (hymt_q8g in plane order for STQ1_0 and Q2_0C, wider records for Q8_0 and
 * the K-quants) through its own prepare function. */
#ifndef HYMT_ACT_Q8G_H
#define HYMT_ACT_Q8G_H

#include "hymt_common.h"

/* Quantize one group of 256 floats. scale = max/127 and inverse = 127/max are each one float32
 * division; q = round-half-to-even(x * inverse) (nearbyintf under the default rounding mode), NaN
 * products count as 0. Every step is exact or a single rounding, so the SIMD variants below give
 * bit-identical groups; hymt_quantize_group_q8g picks one by hymt_active_isa. */
static void hymt_quantize_group_q8g_scalar(const float *x, hymt_q8g *g) {
    float amax = 0.0f;
    for (int i = 0; i < HYMT_Q8G_SIZE; i++) {
        float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
    g->d = amax > 0.0f ? amax / 127.0f : 0.0f;
    int32_t total = 0;
    for (int k = 0; k < 16; k++) {
        int32_t s = 0;
        for (int i = 16 * k; i < 16 * k + 16; i++) {
            float v = nearbyintf(x[i] * inverse);
            /* A subnormal max makes inverse = inf: 0 × inf is NaN, which counts as 0. */
            v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : (v == v ? v : 0.0f));
            g->qs[i] = (int8_t)v;
            s += g->qs[i];
        }
        g->bsums[k] = (int16_t)s;
        total += s;
    }
    g->sum = total;
    memset(g->pad, 0, sizeof g->pad);
}

#if defined(HYMT_X86)
/* The 16 sums of 16 bytes of a group's qs, held as b[4] (qs[64j .. 64j + 64) in b[j]), into bsums[16]; returns
 * their total. No horizontal add per chunk (those were most of a group's quantization time): vpsadbw of
 * q + 128 against 0 sums each 8 bytes, adjacent pairs of those give Σ(q + 128) over a chunk, minus 16 · 128:
 * exact. Quantization and the STQ1_0 plane permutation both use it. */
HYMT_TARGET_AVX512 HYMT_INLINE int32_t hymt_q8g_chunk_sums_avx512(const __m512i b[4], int16_t bsums[16]) {
    const __m512i flip = _mm512_set1_epi8((char)0x80), zero = _mm512_setzero_si512();
    __m512i sad[4]; /* [j] chunks 4j .. 4j + 3: 8 sums of 8 bytes of q + 128 */
    for (int j = 0; j < 4; j++) sad[j] = _mm512_sad_epu8(_mm512_xor_si512(b[j], flip), zero);
    /* qwords 2c, 2c + 1 of sad[j]: the halves of chunk 4j + c; pairwise sums of two vectors come out as
     * [chunk c of the first, chunk c of the second] per 128-bit lane, the qword permute orders them */
    const __m512i pairs = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
    __m512i s07 = _mm512_add_epi64(_mm512_unpacklo_epi64(sad[0], sad[1]), _mm512_unpackhi_epi64(sad[0], sad[1]));
    __m512i s8f = _mm512_add_epi64(_mm512_unpacklo_epi64(sad[2], sad[3]), _mm512_unpackhi_epi64(sad[2], sad[3]));
    s07 = _mm512_permutexvar_epi64(pairs, s07);
    s8f = _mm512_permutexvar_epi64(pairs, s8f);
    const __m256i sums = _mm256_sub_epi16(
        _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtepi64_epi16(s07)), _mm512_cvtepi64_epi16(s8f), 1),
        _mm256_set1_epi16(16 * 128));
    _mm256_storeu_si256((__m256i *)bsums, sums);
    return (int32_t)_mm512_reduce_add_epi64(_mm512_add_epi64(s07, s8f)) - 256 * 128;
}

HYMT_TARGET_AVX512 static void hymt_quantize_group_q8g_avx512(const float *x, hymt_q8g *g) {
    const __m512 sign = _mm512_set1_ps(-0.0f);
    /* four running maxima, so the 16 maxes are not one chain of dependent instructions (the max of a set
     * does not depend on the order); max(a, m) keeps m when a is NaN, like the scalar */
    __m512 m[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int i = 0; i < HYMT_Q8G_SIZE; i += 64)
        for (int k = 0; k < 4; k++) m[k] = _mm512_max_ps(_mm512_andnot_ps(sign, _mm512_loadu_ps(x + i + 16 * k)), m[k]);
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m[0], m[1]), _mm512_max_ps(m[2], m[3])));
    float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
    g->d = amax > 0.0f ? amax / 127.0f : 0.0f;
    /* |x| <= amax, so with a finite inverse |x * inverse| <= 127 (1 + 2^-23)^2 rounds to at most 127: the
     * clamp to ±127 changes no q and is skipped; an infinite inverse (amax below 127 / FLT_MAX) needs it */
    const int clamp = !(inverse <= 3.40282347e+38f);
    const __m512 inv = _mm512_set1_ps(inverse), hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    __m512i b[4]; /* qs[64j .. 64j + 64) */
    for (int j = 0; j < 4; j++) {
        __m512i q[4]; /* chunks 4j .. 4j + 3 as int32 */
        for (int c = 0; c < 4; c++) {
            /* clamp, then vcvtps2dq rounds half to even like nearbyintf (both follow MXCSR): the bounds
             * are integers, so clamping before rounding gives the same q; NaN products become 0 */
            __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + 64 * j + 16 * c), inv);
            const __mmask16 ordered = _mm512_cmp_ps_mask(v, v, _CMP_ORD_Q);
            if (clamp) v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
            q[c] = _mm512_maskz_cvtps_epi32(ordered, v);
        }
        /* the packs never saturate (|q| <= 127); the dword permute undoes their 128-bit-lane interleave */
        b[j] = _mm512_permutexvar_epi32(
            order, _mm512_packs_epi16(_mm512_packs_epi32(q[0], q[1]), _mm512_packs_epi32(q[2], q[3])));
        _mm512_storeu_si512((void *)(g->qs + 64 * j), b[j]);
    }
    g->sum = hymt_q8g_chunk_sums_avx512(b, g->bsums);
    memset(g->pad, 0, sizeof g->pad);
}

HYMT_TARGET_AVX2 static void hymt_quantize_group_q8g_avx2(const float *x, hymt_q8g *g) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < HYMT_Q8G_SIZE; i += 8) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)), m);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float amax = _mm_cvtss_f32(m4);
    float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
    g->d = amax > 0.0f ? amax / 127.0f : 0.0f;
    const __m256 inv = _mm256_set1_ps(inverse), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    int32_t total = 0;
    for (int k = 0; k < 16; k++) {
        __m256i q[2];
        for (int h = 0; h < 2; h++) {
            __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + 16 * k + 8 * h), inv);
            v = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q)); /* NaN -> 0 */
            q[h] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, lo), hi));
        }
        /* 16 int32 -> 16 int8 in order: packs interleave 128-bit lanes, the permute undoes it */
        __m256i w16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xd8);
        __m128i b8 = _mm_packs_epi16(_mm256_castsi256_si128(w16), _mm256_extracti128_si256(w16, 1));
        _mm_storeu_si128((__m128i *)(g->qs + 16 * k), b8);
        __m256i s8 = _mm256_add_epi32(q[0], q[1]);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        int32_t s = _mm_cvtsi128_si32(s4);
        g->bsums[k] = (int16_t)s;
        total += s;
    }
    g->sum = total;
    memset(g->pad, 0, sizeof g->pad);
}
#endif

static inline void hymt_quantize_group_q8g(const float *x, hymt_q8g *g) {
#if defined(HYMT_X86)
    if (hymt_active_isa == HYMT_ISA_AVX512) {
        hymt_quantize_group_q8g_avx512(x, g);
        return;
    }
    if (hymt_active_isa == HYMT_ISA_AVX2) {
        hymt_quantize_group_q8g_avx2(x, g);
        return;
    }
#endif
    hymt_quantize_group_q8g_scalar(x, g);
}

static inline size_t hymt_act_stride_q8g(int64_t cols) {
    return (size_t)(cols / HYMT_Q8G_SIZE) * sizeof(hymt_q8g);
}

#endif /* HYMT_ACT_Q8G_H */
