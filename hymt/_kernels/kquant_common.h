/* kquant_common.h — what the Q4_K and Q6_K kernels share: the activation layout of their int8 path and
 * the row-lane tile machinery.
 *
 * Both formats have 256-weight blocks (= one §3.4 activation group) with sub-block scales (Q4_K: 8 of 32
 * weights with a min; Q6_K: 16 of 16). Their int8 paths are defined (fmt_q4_k.h, fmt_q6_k.h) so that the
 * sub-scales are applied in exact integer arithmetic and only one or two float operations remain per
 * (row, token, block), sequential over the blocks. That lets the SIMD kernels choose the lane layout
 * freely, because integer sums are exact in any order:
 *   - few tokens (AVX-512, n <= 2 for Q4_K, <= 4 for Q6_K): one row at a time, one sequential stream, 4 inputs per
 *     int32 lane, the per-block integers gathered by a 16-vector horizontal-sum tree (hymt_kq_hsum16);
 *   - otherwise (and on AVX2 and NEON for every n): one lane per OUTPUT ROW: a tile of 16 rows is decoded
 *     once per block (hymt_kq_transpose16 turns 16 rows of code dwords into 16 vectors, lane = row) and
 *     every token broadcasts its activation dwords against it.
 * Each (row, token) gets the same integers and the same float operations in the same order on every
 * path, so every ISA and every n give the scalar reference's bits. */
#ifndef HYMT_KQUANT_COMMON_H
#define HYMT_KQUANT_COMMON_H

#include <stdlib.h>

#include "hymt_common.h"
#include "act_q8g.h"
#include "cpu.h"
#include "vec.h"

/* Token tiles of the scalar references (any size gives the same values; bounds the stack). */
#define HYMT_KQ_SCALAR_TILE 16

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

/* ---- Row-lane layout -----------------------------------------------------------------------------
 * Kernels that keep one int32 lane per OUTPUT ROW: a tile of 16 rows is decoded once per block into
 * 64 vectors v[kd] (lane r = the 4 codes of row r at inputs 4kd..4kd+3), and each token's activation
 * dword kd is broadcast against them (vpdpbusd / pmaddubsw / sdot by lane). The per-sub-block scales
 * are then applied in exact integer arithmetic per row lane, and only a couple of float operations per
 * (row, token, block) remain. The activations stay in natural order. */

/* One token's activations for one group of 256 inputs (REFERENCE.md §3.4 values), 1216 bytes (a multiple of
 * 64: an array of groups keeps qs, qs4, nq4 and nq2 64-byte aligned). */
typedef struct {
    int8_t qs[256];    /* natural order: qs[i] = q[i] (q = hymt_quantize_group_q8g) */
    int8_t qs4[256];   /* the order of Q4_K's nibbles in 64-byte loads (fmt_q4_k.h): qs4[64(2h + e) + 32u + i] =
                          q[128h + 64u + 32e + i] for h, e, u in {0, 1}, i < 32 */
    int32_t nq4[64];   /* −32 · Σ q[4l .. 4l+4): Q6_K GEMV chain starts, one per dword lane */
    int16_t nq2[128];  /* −32 · (q[2k] + q[2k+1]): the Q6_K offset per pmaddubsw word (AVX2) */
    int32_t nb32[32];  /* −32 · Σ q[8s .. 8s+8): chain starts that centre the Q6_K codes (fmt_q6_k.h) */
    int32_t nb8[8];    /* −8 · bsum_j: chain starts that centre the Q4_K codes (fmt_q4_k.h) */
    int16_t bsum[8];   /* bsum_j = Σ q[32j .. 32j+32); dword i = (bsum[2i], bsum[2i+1]) as an int16 pair */
    float d;           /* activation scale s of the group */
    uint8_t pad[12];
} hymt_k8;
_Static_assert(sizeof(hymt_k8) == 1216, "hymt_k8 keeps its members 64-byte aligned");

static size_t hymt_act_stride_k8(int64_t cols) { return (size_t)(cols / 256) * sizeof(hymt_k8); }

/* Quantization by hymt_quantize_group_q8g (its ISA variants are bit-identical), then the sums. */
static void hymt_prepare_k8(const float *x, int64_t cols, uint8_t *act) {
    hymt_k8 *a = (hymt_k8 *)act;
    for (int64_t b = 0; b < cols / 256; b++) {
        hymt_q8g g;
        hymt_quantize_group_q8g(x + 256 * b, &g);
        memcpy(a[b].qs, g.qs, 256);
        for (int h = 0; h < 2; h++)
            for (int e = 0; e < 2; e++)
                for (int u = 0; u < 2; u++)
                    memcpy(a[b].qs4 + 64 * (2 * h + e) + 32 * u, g.qs + 128 * h + 64 * u + 32 * e, 32);
        for (int j = 0; j < 8; j++) {
            a[b].bsum[j] = (int16_t)(g.bsums[2 * j] + g.bsums[2 * j + 1]);
            a[b].nb8[j] = -8 * a[b].bsum[j];
        }
        for (int l = 0; l < 64; l++) a[b].nq4[l] = -32 * (g.qs[4 * l] + g.qs[4 * l + 1] + g.qs[4 * l + 2] + g.qs[4 * l + 3]);
        for (int k = 0; k < 32; k++) a[b].nb32[k] = a[b].nq4[2 * k] + a[b].nq4[2 * k + 1];
        for (int k = 0; k < 128; k++) a[b].nq2[k] = (int16_t)(-32 * (g.qs[2 * k] + g.qs[2 * k + 1]));
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

/* Up to a format's threshold (HYMT_Q4_K_GEMV_MAX, HYMT_Q6_K_GEMV_MAX) the AVX-512 kernels read the weights
 * one row at a time (one sequential stream, at memory speed) and compute each block's exact integers with
 * one lane per 4 inputs and a horizontal integer sum; above it they decode 16-row tiles (row lanes), which
 * costs more per weight byte but far less per token. The integers are exact and the float steps
 * identical, so both give the same bits. */

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

#if defined(HYMT_X86)
/* 16×16 dword transpose: out[k] lane r = in[r] lane k. Unpacks within 128-bit lanes, then a 4×4
 * transpose of 128-bit lanes (64 shuffles). */
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_kq_transpose16(const __m512i in[16], __m512i out[16]) {
    __m512i a[16], b[16];
    for (int i = 0; i < 8; i++) {
        a[2 * i] = _mm512_unpacklo_epi32(in[2 * i], in[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_epi32(in[2 * i], in[2 * i + 1]);
    }
    /* b[4i + m], 128-bit lane L: rows 4i..4i+3 of dword 4L + m */
    for (int i = 0; i < 4; i++) {
        b[4 * i + 0] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
        b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
        b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
        b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
    }
    for (int m = 0; m < 4; m++) {
        __m512i e0 = _mm512_shuffle_i32x4(b[m], b[4 + m], 0x44), e1 = _mm512_shuffle_i32x4(b[m], b[4 + m], 0xEE);
        __m512i e2 = _mm512_shuffle_i32x4(b[8 + m], b[12 + m], 0x44);
        __m512i e3 = _mm512_shuffle_i32x4(b[8 + m], b[12 + m], 0xEE);
        out[m] = _mm512_shuffle_i32x4(e0, e2, 0x88);
        out[4 + m] = _mm512_shuffle_i32x4(e0, e2, 0xDD);
        out[8 + m] = _mm512_shuffle_i32x4(e1, e3, 0x88);
        out[12 + m] = _mm512_shuffle_i32x4(e1, e3, 0xDD);
    }
}
#endif

#endif /* HYMT_KQUANT_COMMON_H */
