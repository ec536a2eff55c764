/* fmt_q6_k.h — Q6_K (REFERENCE.md §2.4): 256 weights in 210 bytes: ql[128] low nibbles, qh[64] high
 * 2-bit pairs, sc[16] signed int8 sub-scales, fp16 d at the END. Chunk j (weights 16j..16j+15) has
 * scale d × sc[j]; w = (d × f32(sc[j])) × f32(q − 32) with the 6-bit code q in 0..63.
 *
 * int8 path (§3.4, activation groups of 256 = one block; kq layout of kquant_common.h). For one row
 * and one token, with s the activation scale of block b's group and q the int8 activations:
 *
 *   acc = 0
 *   for each block b:
 *       A = Σ_{j<16} sc[j] · Σ_{i<16} (q6[16j+i] − 32) · q[16j+i]                   (exact int32)
 *       acc = fma(d × s, f32(A), acc)
 *   y = acc
 *
 * (|A| <= 16·128·16·32·127 < 2^31.) The sub-scales are applied in exact integer arithmetic, as Q4_K
 * does, so the kernels may form A however they like: the vector kernels keep one lane per chunk (a
 * chain of two dot instructions over 8 weights, started at −32·Σq of those 8 activations, ends at
 * Σ (q6 − 32)·q, |.| <= 8·32·127 = 32512: int16-sized, so vpdpwssd / pmaddwd by the pair (sc, 0)
 * scales it exactly) and sum the lanes; the AMX tiles (below) multiply the weights with sc folded in.
 * Every path forms the same A and runs the same two float operations, so the values cannot depend on n
 * or on the path.
 *
 * Float path: decode each block into 256 floats and dot it with its input slice (hymt_dot_f32). */
#ifndef HYMT_FMT_Q6_K_H
#define HYMT_FMT_Q6_K_H

#include "kquant_common.h"
#include "amx.h"

#define HYMT_Q6_K_BYTES 210

/* Codes q (0..63) of one block in natural weight order. */
static inline void hymt_q6_k_codes(const uint8_t *blk, uint8_t codes[256]) {
    for (int c = 0; c < 2; c++) {
        const uint8_t *ql = blk + 64 * c, *qh = blk + 128 + 32 * c;
        for (int p = 0; p < 4; p++)
            for (int l = 0; l < 32; l++) {
                uint8_t src = ql[l + 32 * (p & 1)];
                uint8_t nibble = p < 2 ? (src & 15) : (src >> 4);
                uint8_t high = (qh[l] >> (2 * p)) & 3;
                codes[128 * c + 32 * p + l] = (uint8_t)(nibble | (high << 4));
            }
    }
}

static void hymt_decode_q6_k(const uint8_t *src, float *dst, int64_t nblocks) {
    uint8_t codes[256];
    for (int64_t b = 0; b < nblocks; b++) {
        const uint8_t *blk = src + b * HYMT_Q6_K_BYTES;
        const int8_t *sc = (const int8_t *)(blk + 192);
        float d = hymt_fp16_to_f32(hymt_load_u16(blk + 208));
        hymt_q6_k_codes(blk, codes);
        for (int i = 0; i < 256; i++) {
            float s = d * (float)sc[i / 16];
            dst[256 * b + i] = s * (float)((int)codes[i] - 32);
        }
    }
}

static float hymt_row_dot_f32_q6_k(const uint8_t *row, const float *x, int64_t cols) {
    float block[256]; /* [256] decoded weights of one block */
    float total = 0.0f;
    for (int64_t b = 0; b < cols / 256; b++) {
        hymt_decode_q6_k(row + b * HYMT_Q6_K_BYTES, block, 1);
        total += hymt_dot_f32(block, x + 256 * b, 256);
    }
    return total;
}

/* int8 path, scalar reference: the definition above, row by row, tokens in tiles (the tiling does not
 * change any value: each (row, token) runs the same sequence over the blocks). */
static void hymt_gemm_q6_k_scalar(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                  const uint8_t *act, size_t act_stride, int64_t n, int64_t cols, float *y,
                                  int64_t y_stride) {
    const int64_t nb = cols / 256;
    uint8_t codes[256];
    float acc[HYMT_KQ_SCALAR_TILE]; /* [token] */
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = w + (size_t)r * row_bytes;
        for (int64_t t0 = 0; t0 < n; t0 += HYMT_KQ_SCALAR_TILE) {
            int64_t tt = n - t0 < HYMT_KQ_SCALAR_TILE ? n - t0 : HYMT_KQ_SCALAR_TILE;
            for (int64_t t = 0; t < tt; t++) acc[t] = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = row + b * HYMT_Q6_K_BYTES;
                const int8_t *sc = (const int8_t *)(blk + 192);
                float d = hymt_fp16_to_f32(hymt_load_u16(blk + 208));
                hymt_q6_k_codes(blk, codes);
                for (int64_t t = 0; t < tt; t++) {
                    const hymt_kq8 *g = (const hymt_kq8 *)(act + (size_t)(t0 + t) * act_stride) + b;
                    int32_t A = 0;
                    for (int j = 0; j < 16; j++) {
                        int32_t isum = 0;
                        for (int i = 16 * j; i < 16 * j + 16; i++)
                            isum += ((int32_t)codes[i] - 32) * hymt_kq_act(g->qs, i);
                        A += (int32_t)sc[j] * isum;
                    }
                    acc[t] = fmaf(d * g->d, (float)A, acc[t]);
                }
            }
            for (int64_t t = 0; t < tt; t++) y[(t0 + t) * y_stride + r] = acc[t];
        }
    }
}

#if defined(HYMT_X86)
/* The codes of one block in the kq layout (kquant_common.h): wq[v] byte 4j + e = code of weight 16j + 4v + e. */
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_q6_k_unpack_avx512(const uint8_t *blk, const __m512i s1[4],
                                                            const __m512i s2[2], __m512i wq[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    /* qh is shared by the two 32-byte halves of a ql vector: plane p needs its bits 2p..2p+1 at 4..5 */
    const __m512i shl_lo = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1); /* p=0|1 */
    const __m512i shr_hi = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1); /* p=2|3 */
    __m512i n[4];
    for (int c = 0; c < 2; c++) {
        __m512i ql = _mm512_loadu_si512((const void *)(blk + 64 * c));
        __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * c)));
        n[2 * c] = _mm512_ternarylogic_epi32(_mm512_and_si512(ql, m4), _mm512_sllv_epi16(qh, shl_lo), m30, 0xF8);
        n[2 * c + 1] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                                 _mm512_srlv_epi16(qh, shr_hi), m30, 0xF8);
    }
    hymt_kq_transpose_avx512(s1, s2, n[0], n[1], n[2], n[3], wq);
}

/* Lane j: the int16 pair (sc[j], 0) of the block, the multiplier of a chunk's int16-sized partial sums. */
HYMT_TARGET_AVX512 HYMT_INLINE __m512i hymt_q6_k_scales_avx512(const uint8_t *blk) {
    return _mm512_and_si512(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 192))),
                            _mm512_set1_epi32(0xffff));
}

/* One block of one (row, token): lane j = sc[j] · Σ (q6 − 32)·q over chunk j (two 8-weight chains). */
HYMT_TARGET_AVX512 HYMT_INLINE __m512i hymt_q6_k_lanes_avx512(const __m512i wq[4], __m512i sc, const hymt_kq8 *g) {
    __m512i lo = _mm512_loadu_si512((const void *)g->nb32[0]), hi = _mm512_loadu_si512((const void *)g->nb32[1]);
    lo = _mm512_dpbusd_epi32(lo, wq[0], _mm512_loadu_si512((const void *)g->qs));
    hi = _mm512_dpbusd_epi32(hi, wq[2], _mm512_loadu_si512((const void *)(g->qs + 128)));
    lo = _mm512_dpbusd_epi32(lo, wq[1], _mm512_loadu_si512((const void *)(g->qs + 64)));
    hi = _mm512_dpbusd_epi32(hi, wq[3], _mm512_loadu_si512((const void *)(g->qs + 192)));
    return _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(_mm512_setzero_si512(), lo, sc), hi, sc);
}

/* Horizontal sums of 8 int32 vectors: lane i (< 8) of the result = Σ of the lanes of v[i] (exact; the
 * first three stages of hymt_kq_hsum16's tree, for rows of up to 8 blocks). */
HYMT_TARGET_AVX512 HYMT_INLINE __m512i hymt_q6_k_hsum8(const __m512i v[8]) {
    __m512i a[4], b[2];
    for (int i = 0; i < 4; i++)
        a[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]),
                                _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 2; i++) /* 128-bit lane l: partial sums of v4i .. v4i+3 */
        b[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(a[2 * i], a[2 * i + 1]),
                                _mm512_unpackhi_epi64(a[2 * i], a[2 * i + 1]));
    const __m512i c = _mm512_add_epi32(_mm512_shuffle_i32x4(b[0], b[1], 0x44), _mm512_shuffle_i32x4(b[0], b[1], 0xEE));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(c, c, 0x88), _mm512_shuffle_i32x4(c, c, 0xDD));
}

/* A of blocks 0 .. kn − 1 from their lane vectors av[kb] (lane kb of the result). */
HYMT_TARGET_AVX512 HYMT_INLINE __m512i hymt_q6_k_block_sums(const __m512i av[16], int kn) {
    return kn <= 8 ? hymt_q6_k_hsum8(av) : hymt_kq_hsum16(av);
}

/* Few tokens: one row at a time (one sequential weight stream per thread), tokens [0, tt) of a token
 * tile; acc [tt]. Blocks go in groups of up to 16 whose lane vectors (av [tt][16]) are summed together. */
HYMT_TARGET_AVX512 static void hymt_q6_k_row_avx512(const uint8_t *row, const uint8_t *a0, size_t act_stride, int tt,
                                                    int64_t nb, const __m512i s1[4], const __m512i s2[2],
                                                    __m512i (*av)[16], float *acc) {
    float dd[16], af[16];
    for (int64_t b0 = 0; b0 < nb; b0 += 16) {
        const int kn = nb - b0 < 16 ? (int)(nb - b0) : 16;
        uint16_t dh[16] = {0}; /* fp16 d of the group's blocks */
        for (int kb = 0; kb < kn; kb++) {
            const uint8_t *blk = row + (b0 + kb) * HYMT_Q6_K_BYTES;
            hymt_kq_prefetch(blk);
            __m512i wq[4];
            hymt_q6_k_unpack_avx512(blk, s1, s2, wq);
            const __m512i sc = hymt_q6_k_scales_avx512(blk);
            dh[kb] = hymt_load_u16(blk + 208);
            const hymt_kq8 *g = (const hymt_kq8 *)a0 + b0 + kb;
            for (int t = 0; t < tt; t++, g = (const hymt_kq8 *)((const uint8_t *)g + act_stride))
                av[t][kb] = hymt_q6_k_lanes_avx512(wq, sc, g);
        }
        /* d and f32(A) with one lane per block (the same conversions), then the sequential steps */
        _mm512_storeu_ps(dd, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)dh)));
        for (int t = 0; t < tt; t++) {
            const hymt_kq8 *g = (const hymt_kq8 *)(a0 + (size_t)t * act_stride) + b0;
            _mm512_storeu_ps(af, _mm512_cvtepi32_ps(hymt_q6_k_block_sums(av[t], kn)));
            for (int kb = 0; kb < kn; kb++) acc[t] = fmaf(dd[kb] * g[kb].d, af[kb], acc[t]);
        }
    }
}

/* Up to HYMT_Q6_K_GEMV_MAX tokens: one row at a time (one sequential weight stream), blocks in groups of 8
 * whose lane vectors stay in registers, summed by hymt_q6_k_hsum8; the float steps of a group run with one
 * lane per block (d, d × s and f32(A) as vectors: the same operations), then the sequential fma. acc [T].
 * (Measured: n = 1 as fast as the old chunk-lane kernel, where lane vectors kept in memory were 40 %
 * slower; with 3-4 tokens, groups of 4 blocks in registers were slower than hymt_q6_k_row_avx512.) */
#define HYMT_Q6_K_GEMV_MAX 2
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_q6_k_gemv_avx512(const uint8_t *row, const uint8_t *a0, size_t act_stride,
                                                          int64_t nb, const __m512i s1[4], const __m512i s2[2],
                                                          float *acc, const int T) {
    float dd[8], af[HYMT_Q6_K_GEMV_MAX][8];
    for (int64_t b0 = 0; b0 < nb; b0 += 8) {
        const int kn = nb - b0 < 8 ? (int)(nb - b0) : 8;
        __m512i av[HYMT_Q6_K_GEMV_MAX][8];
        uint16_t dh[8] = {0}; /* fp16 d of the group's blocks */
#pragma GCC unroll 8
        for (int kb = 0; kb < 8; kb++) {
            if (kb < kn) {
                const uint8_t *blk = row + (b0 + kb) * HYMT_Q6_K_BYTES;
                hymt_kq_prefetch(blk);
                __m512i wq[4];
                hymt_q6_k_unpack_avx512(blk, s1, s2, wq);
                const __m512i sc = hymt_q6_k_scales_avx512(blk);
                dh[kb] = hymt_load_u16(blk + 208);
                for (int t = 0; t < T; t++)
                    av[t][kb] = hymt_q6_k_lanes_avx512(wq, sc, (const hymt_kq8 *)(a0 + (size_t)t * act_stride) + b0 + kb);
            } else {
                for (int t = 0; t < T; t++) av[t][kb] = _mm512_setzero_si512();
            }
        }
        _mm256_storeu_ps(dd, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh)));
        for (int t = 0; t < T; t++) {
            const hymt_kq8 *g = (const hymt_kq8 *)(a0 + (size_t)t * act_stride) + b0;
            _mm256_storeu_ps(af[t], _mm256_cvtepi32_ps(_mm512_castsi512_si256(hymt_q6_k_hsum8(av[t]))));
            for (int kb = 0; kb < kn; kb++) acc[t] = fmaf(dd[kb] * g[kb].d, af[t][kb], acc[t]);
        }
    }
}

HYMT_TARGET_AVX512 static void hymt_q6_k_gemv1_avx512(const uint8_t *row, const uint8_t *a0, size_t act_stride,
                                                      int64_t nb, const __m512i s1[4], const __m512i s2[2], float *acc) {
    hymt_q6_k_gemv_avx512(row, a0, act_stride, nb, s1, s2, acc, 1);
}

HYMT_TARGET_AVX512 static void hymt_q6_k_gemv2_avx512(const uint8_t *row, const uint8_t *a0, size_t act_stride,
                                                      int64_t nb, const __m512i s1[4], const __m512i s2[2], float *acc) {
    hymt_q6_k_gemv_avx512(row, a0, act_stride, nb, s1, s2, acc, 2);
}

/* Batched AVX-512 path without tiles (n >= HYMT_Q6_K_BATCH_MIN, AMX off or absent): each row is unpacked
 * ONCE into this form (a per-thread scratch of HYMT_Q6_K_PANEL rows), then register tiles of BR rows × BT
 * tokens run over it: per block and code vector v, BR weight loads and BT activation loads feed BR·BT
 * vpdpbusd. Each (row, token)'s lane vectors of up to 16 blocks wait in a scratch and are summed together. */
#define HYMT_Q6_K_BATCH_MIN 8
#define HYMT_Q6_K_BR 3
#define HYMT_Q6_K_BT 4
#define HYMT_Q6_K_PANEL (4 * HYMT_Q6_K_BR)

/* Loads are the scarce resource of the tile (about one 64-byte load per cycle here): keep a loaded
 * vector in a register for all its uses instead of letting the compiler fold one load into each. */
#define HYMT_Q6_K_IN_REGISTER(v) __asm__("" : "+v"(v))

typedef struct {
    __m512i wq[4]; /* codes, kq layout */
    __m512i sc;    /* lane j: the int16 pair (sc[j], 0) */
} hymt_q6_k_unpacked;

/* Rows [0, R) of u ([R][nb]; d [R][nb] their block scales) × tokens [0, T) from act; y points at (token 0,
 * row 0) of the tile. */
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_q6_k_tile_avx512(const hymt_q6_k_unpacked *u, const float *d, int64_t nb,
                                                          const uint8_t *act, size_t act_stride, float *y,
                                                          int64_t y_stride, const int R, const int T) {
    __m512i av[HYMT_Q6_K_BR][HYMT_Q6_K_BT][16]; /* [row][token][block of the group] lane vectors */
    int32_t as[16] __attribute__((aligned(64)));
    float acc[HYMT_Q6_K_BR][HYMT_Q6_K_BT];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = 0.0f;
    for (int64_t b0 = 0; b0 < nb; b0 += 16) {
        const int kn = nb - b0 < 16 ? (int)(nb - b0) : 16;
        for (int kb = 0; kb < kn; kb++) {
            const int64_t b = b0 + kb;
            const hymt_kq8 *g[HYMT_Q6_K_BT];
            for (int t = 0; t < T; t++) g[t] = (const hymt_kq8 *)(act + (size_t)t * act_stride) + b;
            __m512i A[HYMT_Q6_K_BR][HYMT_Q6_K_BT];
            for (int r = 0; r < R; r++)
                for (int t = 0; t < T; t++) A[r][t] = _mm512_setzero_si512();
            for (int h = 0; h < 2; h++) {
                __m512i ch[HYMT_Q6_K_BR][HYMT_Q6_K_BT];
                for (int t = 0; t < T; t++) {
                    __m512i start = _mm512_loadu_si512((const void *)g[t]->nb32[h]);
                    HYMT_Q6_K_IN_REGISTER(start);
                    for (int r = 0; r < R; r++) ch[r][t] = start;
                }
                for (int v = 2 * h; v < 2 * h + 2; v++) {
                    __m512i wv[HYMT_Q6_K_BR];
                    for (int r = 0; r < R; r++) wv[r] = _mm512_load_si512((const void *)&u[r * nb + b].wq[v]);
                    for (int t = 0; t < T; t++) {
                        __m512i a = _mm512_loadu_si512((const void *)(g[t]->qs + 64 * v));
                        HYMT_Q6_K_IN_REGISTER(a);
                        for (int r = 0; r < R; r++) ch[r][t] = _mm512_dpbusd_epi32(ch[r][t], wv[r], a);
                    }
                }
                for (int r = 0; r < R; r++) {
                    const __m512i sc = _mm512_load_si512((const void *)&u[r * nb + b].sc);
                    for (int t = 0; t < T; t++)
                        A[r][t] = _mm512_dpwssd_epi32(A[r][t], ch[r][t], sc);
                }
            }
            for (int r = 0; r < R; r++)
                for (int t = 0; t < T; t++) av[r][t][kb] = A[r][t];
        }
        for (int r = 0; r < R; r++)
            for (int t = 0; t < T; t++) {
                _mm512_store_si512((void *)as, hymt_q6_k_block_sums(av[r][t], kn));
                const hymt_kq8 *g = (const hymt_kq8 *)(act + (size_t)t * act_stride) + b0;
                const float *dr = d + r * nb + b0;
                for (int kb = 0; kb < kn; kb++) acc[r][t] = fmaf(dr[kb] * g[kb].d, (float)as[kb], acc[r][t]);
            }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) y[t * y_stride + r] = acc[r][t];
}

typedef void (*hymt_q6_k_tile_fn)(const hymt_q6_k_unpacked *u, const float *d, int64_t nb, const uint8_t *act,
                                  size_t act_stride, float *y, int64_t y_stride);

#define HYMT_Q6_K_TILE(R, T)                                                                                  \
    HYMT_TARGET_AVX512 static void hymt_q6_k_tile_##R##x##T(const hymt_q6_k_unpacked *u, const float *d,     \
                                                            int64_t nb, const uint8_t *act, size_t act_stride, \
                                                            float *y, int64_t y_stride) {                     \
        hymt_q6_k_tile_avx512(u, d, nb, act, act_stride, y, y_stride, R, T);                                  \
    }
HYMT_Q6_K_TILE(1, 1)
HYMT_Q6_K_TILE(1, 2)
HYMT_Q6_K_TILE(1, 3)
HYMT_Q6_K_TILE(1, 4)
HYMT_Q6_K_TILE(2, 1)
HYMT_Q6_K_TILE(2, 2)
HYMT_Q6_K_TILE(2, 3)
HYMT_Q6_K_TILE(2, 4)
HYMT_Q6_K_TILE(3, 1)
HYMT_Q6_K_TILE(3, 2)
HYMT_Q6_K_TILE(3, 3)
HYMT_Q6_K_TILE(3, 4)
#undef HYMT_Q6_K_TILE

/* [R - 1][T - 1] */
static const hymt_q6_k_tile_fn hymt_q6_k_tiles[HYMT_Q6_K_BR][HYMT_Q6_K_BT] = {
    {hymt_q6_k_tile_1x1, hymt_q6_k_tile_1x2, hymt_q6_k_tile_1x3, hymt_q6_k_tile_1x4},
    {hymt_q6_k_tile_2x1, hymt_q6_k_tile_2x2, hymt_q6_k_tile_2x3, hymt_q6_k_tile_2x4},
    {hymt_q6_k_tile_3x1, hymt_q6_k_tile_3x2, hymt_q6_k_tile_3x3, hymt_q6_k_tile_3x4},
};

HYMT_TARGET_AVX512 static void hymt_gemm_q6_k_avx512(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                     const uint8_t *act, size_t act_stride, int64_t n,
                                                     int64_t cols, float *y, int64_t y_stride) {
    __m512i s1[4], s2[2];
    hymt_kq_perms_avx512(s1, s2);
    const int64_t nb = cols / 256;
    if (n >= HYMT_Q6_K_BATCH_MIN) {
        /* u: [HYMT_Q6_K_PANEL][nb] rows unpacked once for all n tokens, d: [HYMT_Q6_K_PANEL][nb] */
        hymt_q6_k_unpacked *u =
            (hymt_q6_k_unpacked *)aligned_alloc(64, (size_t)HYMT_Q6_K_PANEL * nb * sizeof *u);
        float *d = (float *)malloc((size_t)HYMT_Q6_K_PANEL * nb * sizeof *d);
        if (u != NULL && d != NULL) {
            for (int64_t r = r0; r < r1; r += HYMT_Q6_K_PANEL) {
                const int R = r1 - r < HYMT_Q6_K_PANEL ? (int)(r1 - r) : HYMT_Q6_K_PANEL;
                for (int i = 0; i < R; i++)
                    for (int64_t b = 0; b < nb; b++) {
                        const uint8_t *blk = w + (size_t)(r + i) * row_bytes + b * HYMT_Q6_K_BYTES;
                        hymt_kq_prefetch(blk);
                        hymt_q6_k_unpack_avx512(blk, s1, s2, u[i * nb + b].wq);
                        u[i * nb + b].sc = hymt_q6_k_scales_avx512(blk);
                        d[i * nb + b] = _cvtsh_ss(hymt_load_u16(blk + 208));
                    }
                /* token tiles outside, row tiles inside: a tile's activations stay in L1 while every row
                 * tile of the panel uses them */
                for (int64_t t = 0; t < n; t += HYMT_Q6_K_BT) {
                    const int T = n - t < HYMT_Q6_K_BT ? (int)(n - t) : HYMT_Q6_K_BT;
                    for (int i = 0; i < R; i += HYMT_Q6_K_BR) {
                        const int Ri = R - i < HYMT_Q6_K_BR ? R - i : HYMT_Q6_K_BR;
                        hymt_q6_k_tiles[Ri - 1][T - 1](u + (size_t)i * nb, d + (size_t)i * nb, nb,
                                                       act + (size_t)t * act_stride, act_stride,
                                                       y + t * y_stride + r + i, y_stride);
                    }
                }
            }
            free(u);
            free(d);
            return;
        }
        free(u);
        free(d);
    }
    __m512i av[HYMT_KQ_TT][16]; /* [token][block of the group] */
    float acc[HYMT_KQ_TT];      /* [token] */
    if (n <= HYMT_Q6_K_GEMV_MAX) {
        for (int64_t r = r0; r < r1; r++) {
            acc[0] = acc[1] = 0.0f;
            if (n == 1)
                hymt_q6_k_gemv1_avx512(w + (size_t)r * row_bytes, act, act_stride, nb, s1, s2, acc);
            else
                hymt_q6_k_gemv2_avx512(w + (size_t)r * row_bytes, act, act_stride, nb, s1, s2, acc);
            for (int t = 0; t < n; t++) y[t * y_stride + r] = acc[t];
        }
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t t0 = 0; t0 < n; t0 += HYMT_KQ_TT) {
            const int tt = n - t0 < HYMT_KQ_TT ? (int)(n - t0) : HYMT_KQ_TT;
            for (int t = 0; t < tt; t++) acc[t] = 0.0f;
            hymt_q6_k_row_avx512(w + (size_t)r * row_bytes, act + (size_t)t0 * act_stride, act_stride, tt, nb, s1,
                                 s2, av, acc);
            for (int t = 0; t < tt; t++) y[(t0 + t) * y_stride + r] = acc[t];
        }
    }
}

/* AVX2 form of the codes (kq layout, wq[v][h] = lanes 8h..8h+7 of vector v). */
HYMT_TARGET_AVX2 HYMT_INLINE void hymt_q6_k_unpack_avx2(const uint8_t *blk, __m256i wq[4][2]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    __m256i nat[8]; /* chunk pairs (0,1), (2,3), ..., (14,15) */
    for (int c = 0; c < 2; c++) {
        __m256i qa = _mm256_loadu_si256((const __m256i *)(blk + 64 * c));      /* planes 0 | 2 */
        __m256i qb = _mm256_loadu_si256((const __m256i *)(blk + 64 * c + 32)); /* planes 1 | 3 */
        __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * c));
        nat[4 * c + 0] = _mm256_or_si256(_mm256_and_si256(qa, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
        nat[4 * c + 1] = _mm256_or_si256(_mm256_and_si256(qb, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
        nat[4 * c + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qa, 4), m4), _mm256_and_si256(qh, m30));
        nat[4 * c + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qb, 4), m4),
                                         _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
    }
    hymt_kq_transpose_avx2(nat, wq);
}

/* AVX2: row tiles of hymt_kq_row_tile(n) rows × HYMT_KQ_TT tokens share one pass over the blocks. Per
 * lane j (chunk j) and 8 weights, pmaddubsw of two code vectors gives words of 4 products (<= 4·63·127,
 * int16-sized), pmaddwd by (sc[j], sc[j]) scales them into int32; the −32 offset enters as
 * sc[j] × (−32·Σq of the chunk), an int32 product. */
HYMT_TARGET_AVX2 static void hymt_gemm_q6_k_avx2(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                 const uint8_t *act, size_t act_stride, int64_t n, int64_t cols,
                                                 float *y, int64_t y_stride) {
    const int64_t nb = cols / 256;
    const __m256i lo16 = _mm256_set1_epi32(0xffff);
    float acc[HYMT_KQ_RT][HYMT_KQ_TT]; /* [row][token] */
    const int rt_max = hymt_kq_row_tile(n);
    for (int64_t r = r0; r < r1; r += rt_max) {
        const int rt = r1 - r < rt_max ? (int)(r1 - r) : rt_max;
        for (int64_t t0 = 0; t0 < n; t0 += HYMT_KQ_TT) {
            const int tt = n - t0 < HYMT_KQ_TT ? (int)(n - t0) : HYMT_KQ_TT;
            for (int i = 0; i < rt; i++)
                for (int t = 0; t < tt; t++) acc[i][t] = 0.0f;
            const hymt_kq8 *a0 = (const hymt_kq8 *)(act + (size_t)t0 * act_stride);
            for (int64_t b = 0; b < nb; b++) {
                for (int i = 0; i < rt; i++) {
                    const uint8_t *blk = w + (size_t)(r + i) * row_bytes + b * HYMT_Q6_K_BYTES;
                    hymt_kq_prefetch(blk);
                    __m256i wq[4][2], sc32[2], scp[2]; /* [h]: sc[8h + k] in lane k, as int32 and as (sc, sc) */
                    hymt_q6_k_unpack_avx2(blk, wq);
                    const __m128i s8 = _mm_loadu_si128((const __m128i *)(blk + 192));
                    sc32[0] = _mm256_cvtepi8_epi32(s8);
                    sc32[1] = _mm256_cvtepi8_epi32(_mm_srli_si128(s8, 8));
                    for (int h = 0; h < 2; h++)
                        scp[h] = _mm256_or_si256(_mm256_and_si256(sc32[h], lo16), _mm256_slli_epi32(sc32[h], 16));
                    const float d = _cvtsh_ss(hymt_load_u16(blk + 208));
                    const hymt_kq8 *g = a0 + b;
                    for (int t = 0; t < tt; t++, g = (const hymt_kq8 *)((const uint8_t *)g + act_stride)) {
                        __m256i Av = _mm256_setzero_si256();
                        for (int h = 0; h < 2; h++) {
                            const __m256i offset = _mm256_add_epi32(
                                _mm256_loadu_si256((const __m256i *)(g->nb32[0] + 8 * h)),
                                _mm256_loadu_si256((const __m256i *)(g->nb32[1] + 8 * h)));
                            Av = _mm256_add_epi32(Av, _mm256_mullo_epi32(offset, sc32[h]));
                            for (int v = 0; v < 4; v += 2) {
                                __m256i q0 = _mm256_loadu_si256((const __m256i *)(g->qs + 64 * v + 32 * h));
                                __m256i q1 = _mm256_loadu_si256((const __m256i *)(g->qs + 64 * v + 64 + 32 * h));
                                __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(wq[v][h], q0),
                                                             _mm256_maddubs_epi16(wq[v + 1][h], q1));
                                Av = _mm256_add_epi32(Av, _mm256_madd_epi16(p, scp[h]));
                            }
                        }
                        acc[i][t] = fmaf(d * g->d, (float)hymt_kq_hsum8(Av), acc[i][t]);
                    }
                }
            }
            for (int i = 0; i < rt; i++)
                for (int t = 0; t < tt; t++) y[(t0 + t) * y_stride + r + i] = acc[i][t];
        }
    }
}
#endif /* HYMT_X86 */

#if defined(HYMT_ARM64)
/* NEON form of the codes (kq layout, wq[v][k] = lanes 4k..4k+3 of vector v) and sc[4k..4k+3] as int32. */
HYMT_TARGET_DOTPROD HYMT_INLINE void hymt_q6_k_unpack_neon(const uint8_t *blk, int8x16_t wq[4][4], int32x4_t sc32[4]) {
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m3 = vdupq_n_u8(3);
    int8x16_t chunk[16];
    for (int c = 0; c < 2; c++) {
        const uint8x16_t h[2] = {vld1q_u8(blk + 128 + 32 * c), vld1q_u8(blk + 128 + 32 * c + 16)};
        for (int i = 0; i < 4; i++) {
            uint8x16_t src = vld1q_u8(blk + 64 * c + 16 * i); /* chunk 8c+i low, 8c+4+i high nibbles */
            int p_lo = i / 2, p_hi = 2 + i / 2;
            uint8x16_t h_lo = vandq_u8(vshlq_u8(h[i % 2], vdupq_n_s8((int8_t)(-2 * p_lo))), m3);
            uint8x16_t h_hi = vandq_u8(vshlq_u8(h[i % 2], vdupq_n_s8((int8_t)(-2 * p_hi))), m3);
            chunk[8 * c + i] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(src, m4), vshlq_n_u8(h_lo, 4)));
            chunk[8 * c + 4 + i] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(src, 4), vshlq_n_u8(h_hi, 4)));
        }
    }
    hymt_kq_transpose_neon(chunk, wq);
    int8x16_t sc = vld1q_s8((const int8_t *)(blk + 192));
    const int16x8_t sc16[2] = {vmovl_s8(vget_low_s8(sc)), vmovl_s8(vget_high_s8(sc))};
    for (int k = 0; k < 4; k++)
        sc32[k] = (k & 1) ? vmovl_s16(vget_high_s16(sc16[k / 2])) : vmovl_s16(vget_low_s16(sc16[k / 2]));
}

/* Lane j: SDOT chain over chunk j's 16 weights started at −32·Σq (|.| <= 16·32·127), times sc[j] by an
 * exact int32 multiply-accumulate; A is the sum of the lanes. */
HYMT_TARGET_DOTPROD static void hymt_gemm_q6_k_dotprod(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                       const uint8_t *act, size_t act_stride, int64_t n,
                                                       int64_t cols, float *y, int64_t y_stride) {
    const int64_t nb = cols / 256;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = w + (size_t)r * row_bytes;
        for (int64_t t0 = 0; t0 < n; t0 += HYMT_KQ_TT) {
            const int tt = n - t0 < HYMT_KQ_TT ? (int)(n - t0) : HYMT_KQ_TT;
            float acc[HYMT_KQ_TT]; /* [token] */
            for (int t = 0; t < tt; t++) acc[t] = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                int8x16_t wq[4][4];
                int32x4_t sc32[4];
                hymt_kq_prefetch(row + b * HYMT_Q6_K_BYTES);
                hymt_q6_k_unpack_neon(row + b * HYMT_Q6_K_BYTES, wq, sc32);
                const float d = hymt_fp16_to_f32(hymt_load_u16(row + b * HYMT_Q6_K_BYTES + 208));
                for (int t = 0; t < tt; t++) {
                    const hymt_kq8 *g = (const hymt_kq8 *)(act + (size_t)(t0 + t) * act_stride) + b;
                    int32x4_t Av = vdupq_n_s32(0);
                    for (int k = 0; k < 4; k++) {
                        int32x4_t isum = vaddq_s32(vld1q_s32(g->nb32[0] + 4 * k), vld1q_s32(g->nb32[1] + 4 * k));
                        for (int v = 0; v < 4; v++) isum = vdotq_s32(isum, wq[v][k], vld1q_s8(g->qs + 64 * v + 16 * k));
                        Av = vmlaq_s32(Av, isum, sc32[k]);
                    }
                    acc[t] = fmaf(d * g->d, (float)vaddvq_s32(Av), acc[t]);
                }
            }
            for (int t = 0; t < tt; t++) y[(t0 + t) * y_stride + r] = acc[t];
        }
    }
}

/* SDOT only when the CPU has dotprod; otherwise the (bit-identical) scalar reference. */
static void hymt_gemm_q6_k_neon(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1, const uint8_t *act,
                                size_t act_stride, int64_t n, int64_t cols, float *y, int64_t y_stride) {
    if (hymt_cpu()->dotprod)
        hymt_gemm_q6_k_dotprod(w, row_bytes, r0, r1, act, act_stride, n, cols, y, y_stride);
    else
        hymt_gemm_q6_k_scalar(w, row_bytes, r0, r1, act, act_stride, n, cols, y, y_stride);
}
#endif /* HYMT_ARM64 */

#if defined(HYMT_HAVE_AMX)
/* ---- AMX tiles (amx.h) for batched products: n >= HYMT_Q6_K_AMX_MIN under the avx512 family ----------
 * The same exact A per (row, token, block) as the definition, then the same float step, so the same bits
 * as the scalar reference and the vector kernels. The weights are the A operand and the tokens the B
 * operand, C[16 rows][N tokens] += W[16 rows][64 k] · Q[16 k-quads][N tokens × 4], so a row of W is one
 * row's kq vector v as the vector kernels unpack it (no transposes of weight data):
 *
 *   W = sc[j] · (q6 − 32) per weight (|W| <= 4096, 13 bits), split into bytes W = 256·h + l with l in
 *       0..255 and h in −16..16; over the four vectors v (K = 256) tdpbusd sums C_l = Σ l·q and tdpbssd
 *       C_h = Σ h·q, and A = C_l + 256·C_h (exact int32: |C_l| <= 256·255·127, |A| < 2^31 as in the
 *       definition);
 *   acc[row][token] = fma(d × s, f32(A), acc), lane = token, in vector registers.
 *
 * A row's W bytes come from its codes with two vpmaddubsw against (sc, 0) / (0, sc) byte pairs (even / odd
 * weights as int16, exact: |q6·sc| <= 63·128), a subtraction of 32·sc and two vpermt2b that gather the low
 * and the high bytes. Each 16-row tile of a block is decoded once and serves every token of the pass. The
 * activations are put into the VNNI order of Q once per call (a 16×16 dword transpose per 16 tokens,
 * vector and block; zero columns past n, so nothing is read past the activations). Two token tiles share
 * each load of the W operands, which also gives the tile unit four independent accumulators (measured:
 * 2.1× faster at n = 64 than one token tile at a time with two alternating accumulator pairs). The
 * decode (~50 cycles per row and block here) sets a floor that does not depend on n: on one hot 1024×2048
 * matrix, one thread, tiles take ~170 µs for 6..16 tokens where the vector kernels take 160-200 µs at 5-6
 * tokens and 300+ µs from 8; hence tiles from HYMT_Q6_K_AMX_MIN tokens. */
#define HYMT_Q6_K_AMX_MIN 6
/* Tokens per pass over the weights (bounds the float accumulators on the stack: 16 KiB). */
#define HYMT_Q6_K_AMX_PASS 256

/* A operands of one block of a 16-row tile and the rows' d, 8256 bytes. Rows past the end of the range
 * repeat the last row (their outputs are never stored). */
typedef struct {
    uint8_t lo[4][16][64]; /* lo[v][r][4j + e] = l of row r, chunk j, weight 4v + e */
    int8_t hi[4][16][64];  /* hi[v][r][4j + e] = h */
    float d[16];           /* d of row r */
} hymt_q6_k_amx_tile;

/* Row r of the tile from block blk. sidx byte 4j + e = j; idx_lo / idx_hi gather the low / high bytes of
 * the even (first operand) and odd (second) weights' int16 values back into weight order. */
HYMT_TARGET_AMX HYMT_INLINE void hymt_q6_k_amx_row(const uint8_t *blk, const __m512i s1[4], const __m512i s2[2],
                                                   __m512i sidx, __m512i idx_lo, __m512i idx_hi,
                                                   hymt_q6_k_amx_tile *tl, int r) {
    __m512i wq[4];
    hymt_q6_k_unpack_avx512(blk, s1, s2, wq);
    const __m512i sc = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(blk + 192)));
    const __m512i se = _mm512_maskz_permutexvar_epi8(0x5555555555555555ull, sidx, sc); /* bytes (sc[j], 0) */
    const __m512i so = _mm512_slli_epi16(se, 8);                                        /* bytes (0, sc[j]) */
    const __m512i off = _mm512_srai_epi16(so, 3);                                       /* words 32·sc[j] */
    for (int v = 0; v < 4; v++) {
        const __m512i we = _mm512_sub_epi16(_mm512_maddubs_epi16(wq[v], se), off); /* W of weight 2i */
        const __m512i wo = _mm512_sub_epi16(_mm512_maddubs_epi16(wq[v], so), off); /* W of weight 2i + 1 */
        _mm512_store_si512((void *)tl->lo[v][r], _mm512_permutex2var_epi8(we, idx_lo, wo));
        _mm512_store_si512((void *)tl->hi[v][r], _mm512_permutex2var_epi8(we, idx_hi, wo));
    }
    tl->d[r] = _cvtsh_ss(hymt_load_u16(blk + 208));
}

/* Tiles: 0, 1 and 2, 3 the sums C_l, C_h [16 rows][N tokens] int32 of two token tiles; 4, 5 the W
 * operands [16 rows][64 bytes]; 6, 7 the two token tiles' Q operands [16 k-quads][N tokens × 4 bytes]. */
HYMT_TARGET_AMX static void hymt_gemm_q6_k_amx(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                               const uint8_t *act, size_t act_stride, int64_t n, int64_t cols,
                                               float *y, int64_t y_stride) {
    const int64_t nb = cols / 256, ntt = (n + 15) / 16;
    const int N = n < 16 ? (int)n : 16; /* tokens per tile */
    /* q: [ntt][nb][4][16][64] Q operands: q[k][b][v][jj][4t + e] = byte 4jj + e of vector v of token 16k + t
     * (0 past n); sv: [nb][16 ntt] the tokens' activation scales (0 past n) */
    int8_t *q = (int8_t *)aligned_alloc(64, (size_t)ntt * nb * 4096);
    float *sv = (float *)aligned_alloc(64, (size_t)nb * ntt * 16 * sizeof(float));
    if (q == NULL || sv == NULL) {
        free(q);
        free(sv);
        hymt_gemm_q6_k_avx512(w, row_bytes, r0, r1, act, act_stride, n, cols, y, y_stride);
        return;
    }
    for (int64_t k = 0; k < ntt; k++)
        for (int64_t b = 0; b < nb; b++) {
            for (int t = 0; t < 16; t++) {
                const int64_t tok = 16 * k + t;
                sv[b * 16 * ntt + tok] = tok < n ? ((const hymt_kq8 *)(act + (size_t)tok * act_stride) + b)->d : 0.0f;
            }
            for (int v = 0; v < 4; v++) {
                __m512i x[16], o[16];
                for (int t = 0; t < 16; t++) {
                    const int64_t tok = 16 * k + t;
                    x[t] = tok < n ? _mm512_load_si512(((const hymt_kq8 *)(act + (size_t)tok * act_stride) + b)->qs + 64 * v)
                                   : _mm512_setzero_si512();
                }
                hymt_transpose16_epi32(x, o);
                int8_t *dst = q + ((size_t)(k * nb + b) * 4 + v) * 1024;
                for (int jj = 0; jj < 16; jj++) _mm512_store_si512((void *)(dst + 64 * jj), o[jj]);
            }
        }

    __m512i s1[4], s2[2];
    hymt_kq_perms_avx512(s1, s2);
    uint8_t ib[3][64];
    for (int i = 0; i < 64; i++) {
        ib[0][i] = (uint8_t)(i / 4);
        ib[1][i] = (uint8_t)(i % 2 ? 64 + i - 1 : i); /* low bytes: word i/2 of the even / odd operand */
        ib[2][i] = (uint8_t)(i % 2 ? 64 + i : i + 1); /* high bytes */
    }
    const __m512i sidx = _mm512_loadu_si512((const void *)ib[0]), idx_lo = _mm512_loadu_si512((const void *)ib[1]),
                  idx_hi = _mm512_loadu_si512((const void *)ib[2]);
    const uint8_t tile_rows[8] = {16, 16, 16, 16, 16, 16, 16, 16};
    const uint16_t tile_colsb[8] = {(uint16_t)(4 * N), (uint16_t)(4 * N), (uint16_t)(4 * N), (uint16_t)(4 * N),
                                    64, 64, (uint16_t)(4 * N), (uint16_t)(4 * N)};
    hymt_q6_k_amx_tile tl __attribute__((aligned(64)));
    int32_t c[2][2][16][16] __attribute__((aligned(64))); /* C_l, C_h read back: [token tile][l|h][row][token] */
    float acc[16][HYMT_Q6_K_AMX_PASS] __attribute__((aligned(64))); /* [row of the tile][token of the pass] */
    memset(c, 0, sizeof c);
    hymt_amx_configure(tile_rows, tile_colsb);
    for (int64_t t0 = 0; t0 < n; t0 += HYMT_Q6_K_AMX_PASS) {
        const int np = n - t0 < HYMT_Q6_K_AMX_PASS ? (int)(n - t0) : HYMT_Q6_K_AMX_PASS;
        const int ntp = (np + 15) / 16;
        const int64_t k0 = t0 / 16;
        for (int64_t r = r0; r < r1; r += 16) {
            const int rows = r1 - r < 16 ? (int)(r1 - r) : 16;
            const uint8_t *base = w + (size_t)r * row_bytes;
            const size_t ahead = (size_t)rows * HYMT_Q6_K_BYTES; /* the next tile's bytes per block step */
            for (int i = 0; i < 16; i++)
                for (int t = 0; t < 16 * ntp; t += 16) _mm512_store_ps(&acc[i][t], _mm512_setzero_ps());
            for (int64_t b = 0; b < nb; b++) {
                /* the next row tile, read linearly into L2 while this one is computed */
                const uint8_t *next = base + (size_t)rows * row_bytes + (size_t)b * ahead;
                for (size_t k = 0; k < ahead; k += 64) __builtin_prefetch(next + k, 0, 2);
                for (int i = 0; i < 16; i++)
                    hymt_q6_k_amx_row(base + (size_t)(i < rows ? i : rows - 1) * row_bytes + b * HYMT_Q6_K_BYTES, s1,
                                      s2, sidx, idx_lo, idx_hi, &tl, i);
                for (int k = 0; k < ntp; k += 2) {
                    /* two token tiles share each W operand load: four independent accumulators */
                    const int two = k + 1 < ntp;
                    const int8_t *qk = q + (size_t)((k0 + k) * nb + b) * 4096;
                    _tile_zero(0);
                    _tile_zero(1);
                    if (two) {
                        _tile_zero(2);
                        _tile_zero(3);
                    }
                    for (int v = 0; v < 4; v++) {
                        _tile_loadd(4, tl.lo[v], 64);
                        _tile_loadd(5, tl.hi[v], 64);
                        _tile_loadd(6, qk + 1024 * v, 64);
                        _tile_dpbusd(0, 4, 6);
                        _tile_dpbssd(1, 5, 6);
                        if (two) {
                            _tile_loadd(7, qk + (size_t)nb * 4096 + 1024 * v, 64);
                            _tile_dpbusd(2, 4, 7);
                            _tile_dpbssd(3, 5, 7);
                        }
                    }
                    _tile_stored(0, c[0][0], 64);
                    _tile_stored(1, c[0][1], 64);
                    if (two) {
                        _tile_stored(2, c[1][0], 64);
                        _tile_stored(3, c[1][1], 64);
                    }
                    for (int kk = k; kk < k + 1 + two; kk++) {
                        int32_t(*cp)[16][16] = c[kk - k];
                        const __m512 s = _mm512_load_ps(sv + b * 16 * ntt + 16 * (k0 + kk));
                        for (int i = 0; i < rows; i++) {
                            const __m512i A = _mm512_add_epi32(_mm512_load_si512((const void *)cp[0][i]),
                                                               _mm512_slli_epi32(_mm512_load_si512((const void *)cp[1][i]), 8));
                            const __m512 ds = _mm512_mul_ps(_mm512_set1_ps(tl.d[i]), s);
                            float *a = &acc[i][16 * kk];
                            _mm512_store_ps(a, _mm512_fmadd_ps(ds, _mm512_cvtepi32_ps(A), _mm512_load_ps(a)));
                        }
                    }
                }
            }
            /* acc [row][token] -> y [token][row], 16 × 16 at a time */
            const __mmask16 keep = (__mmask16)((1u << rows) - 1);
            for (int t = 0; t < np; t += 16) {
                __m512i x[16], o[16];
                for (int i = 0; i < 16; i++) x[i] = _mm512_load_si512((const void *)&acc[i][t]);
                hymt_transpose16_epi32(x, o);
                const int T = np - t < 16 ? np - t : 16;
                for (int u = 0; u < T; u++)
                    _mm512_mask_storeu_ps(y + (t0 + t + u) * y_stride + r, keep, _mm512_castsi512_ps(o[u]));
            }
        }
    }
    hymt_amx_release();
    free(q);
    free(sv);
}

/* The avx512 entry of the format: tiles for batches when AMX is on, else the vector kernel (same bits). */
HYMT_TARGET_AVX512 static void hymt_gemm_q6_k_avx512_amx(const uint8_t *w, size_t row_bytes, int64_t r0,
                                                         int64_t r1, const uint8_t *act, size_t act_stride,
                                                         int64_t n, int64_t cols, float *y, int64_t y_stride) {
    if (n >= HYMT_Q6_K_AMX_MIN && hymt_amx_active())
        hymt_gemm_q6_k_amx(w, row_bytes, r0, r1, act, act_stride, n, cols, y, y_stride);
    else
        hymt_gemm_q6_k_avx512(w, row_bytes, r0, r1, act, act_stride, n, cols, y, y_stride);
}
#endif /* HYMT_HAVE_AMX */

static const hymt_format HYMT_FORMAT_Q6_K = {
    "Q6_K",
    256,
    HYMT_Q6_K_BYTES,
    hymt_decode_q6_k,
    hymt_row_dot_f32_q6_k,
    hymt_prepare_kq8,
    hymt_act_stride_kq8,
    {
        hymt_gemm_q6_k_scalar,
#if defined(HYMT_HAVE_AMX)
        hymt_gemm_q6_k_avx2,
        hymt_gemm_q6_k_avx512_amx,
#elif defined(HYMT_X86)
        hymt_gemm_q6_k_avx2,
        hymt_gemm_q6_k_avx512,
#else
        NULL,
        NULL,
#endif
#if defined(HYMT_ARM64)
        hymt_gemm_q6_k_neon,
#else
        NULL,
#endif
    },
};

#endif /* HYMT_FMT_Q6_K_H */
