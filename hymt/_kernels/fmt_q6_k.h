/* fmt_q6_k.h — Q6_K (REFERENCE.md §2.4): 256 weights in 210 bytes: ql[128] low nibbles, qh[64] high
 * 2-bit pairs, sc[16] signed int8 sub-scales, fp16 d at the END. Chunk j (weights 16j..16j+15) has
 * scale d × sc[j]; w = (d × f32(sc[j])) × f32(q − 32) with the 6-bit code q in 0..63.
 *
 * int8 path (§3.4, activation groups of 256 = one block, natural order: hymt_k8 of kquant_common.h).
 * For one row and one token, with s the activation scale of block b's group and q the int8 activations:
 *
 *   acc = 0
 *   for each block b:
 *       A = Σ_{j<16} sc[j] · Σ_{i<16} (q6[16j+i] − 32) · q[16j+i]                    (exact int32)
 *       acc = fma(d × s, f32(A), acc)
 *   y = acc
 *
 * (|A| <= 16·128·16·32·127 < 2^31.) One rounding product and one fma per (row, token, block), so the
 * SIMD kernels keep one lane per OUTPUT ROW like Q4_K (kquant_common.h, row-lane layout): a tile of 16
 * rows is decoded once per block and serves every token of the call. The codes 0..63 are the unsigned
 * operand of vpdpbusd / pmaddubsw and the signed one of sdot; the −32 offset enters through chain starts
 * −32·Σq prepared per token (hymt_k8.nb32), and the sub-scales multiply exact partial sums. GEMV and
 * batched calls run the same kernel, so the values cannot depend on n.
 *
 * Float path: decode each block into 256 floats and dot it with its input slice (hymt_dot_f32). */
#ifndef HYMT_FMT_Q6_K_H
#define HYMT_FMT_Q6_K_H

#include "kquant_common.h"

#define HYMT_Q6_K_BYTES 210
/* Row-at-a-time AVX-512 path up to this many tokens (measured: the Q6_K tile decode is dearer, so the
 * row tiles only pay off from 5 tokens) */
#define HYMT_Q6_K_GEMV_MAX 4

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
                    const hymt_k8 *g = (const hymt_k8 *)(act + (size_t)(t0 + t) * act_stride) + b;
                    int32_t A = 0;
                    for (int j = 0; j < 16; j++) {
                        int32_t isum = 0;
                        for (int i = 16 * j; i < 16 * j + 16; i++) isum += ((int32_t)codes[i] - 32) * g->qs[i];
                        A += (int32_t)sc[j] * isum;
                    }
                    acc[t] = fmaf(d * g->d, (float)A, acc[t]);
                }
            }
            for (int64_t t = 0; t < tt; t++) y[(t0 + t) * y_stride + r] = acc[t];
        }
    }
}

/* One block of a tile of 16 rows in the row-lane layout (kquant_common.h), 5184 bytes. Row r of the tile
 * is lane r; rows past the end of the range repeat the last row (their lanes are never stored). */
typedef struct {
    uint8_t v[64][64];  /* v[kd][4r + e] = code of row r at input 4kd + e (0..63) */
    int32_t sc[16][16]; /* sc[j][r] = sc[j] of row r as the int16 pair (sc, 0) */
    float d[16];        /* d of row r */
} hymt_q6_k_tile;

/* The tile of block blk0 (row 0 of the tile) .. blk0 + (rows − 1) · row_bytes, portable form. */
static void hymt_q6_k_tile_decode(const uint8_t *blk0, size_t row_bytes, int rows, hymt_q6_k_tile *tl) {
    uint8_t codes[256];
    for (int r = 0; r < 16; r++) {
        const uint8_t *p = blk0 + (size_t)(r < rows ? r : rows - 1) * row_bytes;
        for (int k = 0; k < HYMT_Q6_K_BYTES; k += 64) __builtin_prefetch(p + 4 * HYMT_Q6_K_BYTES + k, 0, 3);
        tl->d[r] = hymt_fp16_to_f32(hymt_load_u16(p + 208));
        for (int j = 0; j < 16; j++) tl->sc[j][r] = (int32_t)(uint16_t)(int16_t)(int8_t)p[192 + j];
        hymt_q6_k_codes(p, codes);
        for (int kd = 0; kd < 64; kd++) memcpy(&tl->v[kd][4 * r], codes + 4 * kd, 4);
    }
}

#if defined(HYMT_X86)
/* hymt_q6_k_tile_decode with three 16×16 dword transposes (ql halves, qh) and gathers of the scales. */
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_q6_k_tile_avx512(const uint8_t *blk0, size_t row_bytes, int rows,
                                                          hymt_q6_k_tile *tl) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m512i lane = _mm512_min_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32(rows - 1));
    const __m512i offs = _mm512_mullo_epi32(lane, _mm512_set1_epi32((int)row_bytes));
    int32_t off[16];
    _mm512_storeu_si512((void *)off, offs);
    __m512i x[16], qh[16], t[16];
    for (int r = 0; r < 16; r++) x[r] = _mm512_loadu_si512((const void *)(blk0 + off[r] + 128));
    hymt_kq_transpose16(x, qh); /* qh[8c + k] lane r: qh byte 4k.. of half c, bits 2p..2p+1 = plane p */
    for (int c = 0; c < 2; c++) {
        for (int r = 0; r < 16; r++) x[r] = _mm512_loadu_si512((const void *)(blk0 + off[r] + 64 * c));
        hymt_kq_transpose16(x, t); /* t[8m + k] lane r: ql bytes 32m + 4k.. of half c */
        for (int k = 0; k < 8; k++) {
            /* code of plane p at kd = 32c + 8p + k: nibble (p < 2: low of ql row m = p; else high of
             * m = p − 2) | bits 2p..2p+1 of qh at 4..5 */
            const __m512i h = qh[8 * c + k];
            const __m512i hp[4] = {_mm512_slli_epi16(h, 4), _mm512_slli_epi16(h, 2), h, _mm512_srli_epi16(h, 2)};
            for (int p = 0; p < 4; p++) {
                const __m512i q = t[8 * (p & 1) + k];
                const __m512i nib = p < 2 ? _mm512_and_si512(q, m4) : _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
                _mm512_store_si512((void *)tl->v[32 * c + 8 * p + k], _mm512_ternarylogic_epi32(nib, hp[p], m30, 0xF8));
            }
        }
    }
    const __m512i ff = _mm512_set1_epi32(0xffff);
    for (int k = 0; k < 4; k++) {
        const __m512i gk = _mm512_i32gather_epi32(offs, (const void *)(blk0 + 192 + 4 * k), 1);
        for (int e = 0; e < 4; e++) /* byte e, sign-extended, as an int16 */
            _mm512_store_si512((void *)tl->sc[4 * k + e],
                               _mm512_and_si512(_mm512_srai_epi32(_mm512_slli_epi32(gk, 24 - 8 * e), 24), ff));
    }
    /* bytes 206..209: d is the high half (a word at 208 would read past the block) */
    const __m512i gd = _mm512_i32gather_epi32(offs, (const void *)(blk0 + 206), 1);
    _mm512_store_ps(tl->d, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(gd, 16))));
}

/* T tokens × R tiles of 16 rows, one block step of the definition for each (row lane, token). A chain of
 * two vpdpbusd over 8 codes that starts at −32·Σq of those 8 inputs ends at Σ (q6 − 32)·q, whose
 * magnitude <= 8·32·127 = 32512 fits int16, so vpdpwssd with the pair (sc, 0) multiplies it by sc
 * exactly. */
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_q6_k_dots_avx512(const hymt_q6_k_tile *tl, const uint8_t *a0,
                                                          size_t act_stride, __m512 *acc, const int R, const int T) {
    const hymt_k8 *g[HYMT_K_TT];
    __m512i A[2][HYMT_K_TT];
    for (int t = 0; t < T; t++) {
        g[t] = (const hymt_k8 *)(a0 + (size_t)t * act_stride);
        for (int i = 0; i < R; i++) A[i][t] = _mm512_setzero_si512();
    }
#pragma GCC unroll 32 /* a rolled loop rotates the accumulators through register copies */
    for (int k = 0; k < 32; k++) {
        __m512i ch[2][HYMT_K_TT];
        for (int t = 0; t < T; t++) {
            __m512i start = _mm512_set1_epi32(g[t]->nb32[k]);
            for (int i = 0; i < R; i++) ch[i][t] = start;
        }
        for (int e = 0; e < 2; e++) {
            const int kd = 2 * k + e;
            __m512i wv[2];
            for (int i = 0; i < R; i++) wv[i] = _mm512_load_si512((const void *)tl[i].v[kd]);
            for (int t = 0; t < T; t++) {
                const __m512i a = _mm512_set1_epi32(hymt_k8_dword(g[t], kd));
                for (int i = 0; i < R; i++) ch[i][t] = _mm512_dpbusd_epi32(ch[i][t], wv[i], a);
            }
        }
        for (int i = 0; i < R; i++) {
            const __m512i sc = _mm512_load_si512((const void *)tl[i].sc[k / 2]);
            for (int t = 0; t < T; t++) A[i][t] = _mm512_dpwssd_epi32(A[i][t], ch[i][t], sc);
        }
    }
    for (int i = 0; i < R; i++) {
        const __m512 d = _mm512_load_ps(tl[i].d);
        for (int t = 0; t < T; t++)
            acc[2 * t + i] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(g[t]->d)), _mm512_cvtepi32_ps(A[i][t]),
                                             acc[2 * t + i]);
    }
}

/* [R − 1][T − 1], as for Q4_K. */
typedef void (*hymt_q6_k_dots_fn)(const hymt_q6_k_tile *tl, const uint8_t *a0, size_t act_stride, __m512 *acc);
#define HYMT_Q6_K_DOTS(R, T)                                                                                \
    HYMT_TARGET_AVX512 static void hymt_q6_k_dots_##R##x##T(const hymt_q6_k_tile *tl, const uint8_t *a0,   \
                                                            size_t act_stride, __m512 *acc) {               \
        hymt_q6_k_dots_avx512(tl, a0, act_stride, acc, R, T);                                               \
    }
HYMT_Q6_K_DOTS(1, 1)
HYMT_Q6_K_DOTS(1, 2)
HYMT_Q6_K_DOTS(1, 3)
HYMT_Q6_K_DOTS(1, 4)
HYMT_Q6_K_DOTS(1, 5)
HYMT_Q6_K_DOTS(1, 6)
HYMT_Q6_K_DOTS(1, 7)
HYMT_Q6_K_DOTS(1, 8)
HYMT_Q6_K_DOTS(2, 1)
HYMT_Q6_K_DOTS(2, 2)
HYMT_Q6_K_DOTS(2, 3)
HYMT_Q6_K_DOTS(2, 4)
#undef HYMT_Q6_K_DOTS
#define HYMT_Q6_K_R2_TT 4
static const hymt_q6_k_dots_fn hymt_q6_k_dots[2][HYMT_K_TT] = {
    {hymt_q6_k_dots_1x1, hymt_q6_k_dots_1x2, hymt_q6_k_dots_1x3, hymt_q6_k_dots_1x4, hymt_q6_k_dots_1x5,
     hymt_q6_k_dots_1x6, hymt_q6_k_dots_1x7, hymt_q6_k_dots_1x8},
    {hymt_q6_k_dots_2x1, hymt_q6_k_dots_2x2, hymt_q6_k_dots_2x3, hymt_q6_k_dots_2x4, NULL, NULL, NULL, NULL},
};

/* Few tokens (n <= HYMT_Q6_K_GEMV_MAX): one row at a time. Vector k of a block holds the codes of inputs
 * 64k .. 64k+63 in natural order; lane L of a vpdpbusd started at −32·Σq of its 4 inputs ends at their
 * Σ (q6 − 32)·q (<= 4·32·127, int16-sized), vpdpwssd by (sc, 0) of chunk 4k + L/4 scales it, and a
 * horizontal sum gives A. */
HYMT_TARGET_AVX512 static void hymt_q6_k_gemv_avx512(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                     const uint8_t *act, size_t act_stride, int n, int64_t nb,
                                                     float *y, int64_t y_stride) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30), ff = _mm512_set1_epi32(0xffff);
    /* qh is shared by the two 32-byte halves of a ql vector: plane p needs its bits 2p..2p+1 at 4..5 */
    const __m512i shl_lo = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1); /* p=0|1 */
    const __m512i shr_hi = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1); /* p=2|3 */
    __m512i chunk[4]; /* lane L of vector k: chunk 4k + L/4 */
    for (int k = 0; k < 4; k++)
        chunk[k] = _mm512_add_epi32(_mm512_set1_epi32(4 * k),
                                    _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), 2));
    /* per group of up to 16 blocks of a row: av[t][k] the lane vector of block k, its A as lane k after
     * hymt_kq_hsum16; d per block */
    __m512i av[HYMT_Q6_K_GEMV_MAX][16];
    float as[16], dd[16];
    for (int t = 0; t < n; t++)
        for (int k = 0; k < 16; k++) av[t][k] = _mm512_setzero_si512();
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = w + (size_t)r * row_bytes;
        float acc[HYMT_Q6_K_GEMV_MAX] = {0.0f};
        for (int64_t b0 = 0; b0 < nb; b0 += 16) {
            const int kn = nb - b0 < 16 ? (int)(nb - b0) : 16;
            for (int kb = 0; kb < kn; kb++) {
                const int64_t b = b0 + kb;
                const uint8_t *blk = row + b * HYMT_Q6_K_BYTES;
                hymt_kq_prefetch(blk);
                __m512i wv[4], sc[4];
                for (int c = 0; c < 2; c++) {
                    __m512i ql = _mm512_loadu_si512((const void *)(blk + 64 * c));
                    __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * c)));
                    wv[2 * c] = _mm512_ternarylogic_epi32(_mm512_and_si512(ql, m4), _mm512_sllv_epi16(qh, shl_lo), m30, 0xF8);
                    wv[2 * c + 1] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                                              _mm512_srlv_epi16(qh, shr_hi), m30, 0xF8);
                }
                const __m512i sc32 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 192)));
                for (int k = 0; k < 4; k++) sc[k] = _mm512_and_si512(_mm512_permutexvar_epi32(chunk[k], sc32), ff);
                dd[kb] = _cvtsh_ss(hymt_load_u16(blk + 208));
                for (int t = 0; t < n; t++) {
                    const hymt_k8 *g = (const hymt_k8 *)(act + (size_t)t * act_stride) + b;
                    __m512i p[4];
                    for (int k = 0; k < 4; k++)
                        p[k] = _mm512_dpbusd_epi32(_mm512_load_si512((const void *)(g->nq4 + 16 * k)), wv[k],
                                                   _mm512_load_si512((const void *)(g->qs + 64 * k)));
                    av[t][kb] = _mm512_add_epi32(_mm512_dpwssd_epi32(_mm512_dpwssd_epi32(_mm512_setzero_si512(), p[0], sc[0]), p[1], sc[1]),
                                                 _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(_mm512_setzero_si512(), p[2], sc[2]), p[3], sc[3]));
                }
            }
            for (int t = 0; t < n; t++) {
                /* f32(A) of the group's blocks with one lane per block, then the sequential accumulation */
                _mm512_storeu_ps(as, _mm512_cvtepi32_ps(hymt_kq_hsum16(av[t])));
                const hymt_k8 *g = (const hymt_k8 *)(act + (size_t)t * act_stride) + b0;
                for (int kb = 0; kb < kn; kb++) acc[t] = fmaf(dd[kb] * g[kb].d, as[kb], acc[t]);
            }
        }
        for (int t = 0; t < n; t++) y[t * y_stride + r] = acc[t];
    }
}

/* Tiles of 32 rows (two 16-row tiles; 16 at the end of an odd range), as for Q4_K. */
HYMT_TARGET_AVX512 static void hymt_gemm_q6_k_avx512(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                     const uint8_t *act, size_t act_stride, int64_t n,
                                                     int64_t cols, float *y, int64_t y_stride) {
    const int64_t nb = cols / 256;
    if (n <= HYMT_Q6_K_GEMV_MAX) {
        hymt_q6_k_gemv_avx512(w, row_bytes, r0, r1, act, act_stride, (int)n, nb, y, y_stride);
        return;
    }
    hymt_q6_k_tile tl[2] __attribute__((aligned(64)));
    __m512 acc[2 * HYMT_K_PASS]; /* [token of the pass][tile] lane r = row r of the tile */
    for (int64_t t0 = 0; t0 < n; t0 += HYMT_K_PASS) {
        const int np = n - t0 < HYMT_K_PASS ? (int)(n - t0) : HYMT_K_PASS;
        for (int64_t r = r0; r < r1; r += 32) {
            const int rows = r1 - r < 32 ? (int)(r1 - r) : 32, R = rows > 16 ? 2 : 1;
            const int tt = R == 2 ? HYMT_Q6_K_R2_TT : HYMT_K_TT;
            const uint8_t *base = w + (size_t)r * row_bytes;
            const size_t ahead = (size_t)rows * HYMT_Q6_K_BYTES; /* next tile's bytes per block step */
            for (int t = 0; t < 2 * np; t++) acc[t] = _mm512_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *next = base + (size_t)rows * row_bytes + (size_t)b * ahead;
                for (size_t k = 0; k < ahead; k += 64) __builtin_prefetch(next + k, 0, 2);
                for (int i = 0; i < R; i++)
                    hymt_q6_k_tile_avx512(base + (size_t)(16 * i) * row_bytes + b * HYMT_Q6_K_BYTES, row_bytes,
                                          i == 0 ? (rows < 16 ? rows : 16) : rows - 16, &tl[i]);
                const uint8_t *a0 = act + (size_t)t0 * act_stride + (size_t)b * sizeof(hymt_k8);
                for (int t = 0; t < np; t += tt) {
                    const int T = np - t < tt ? np - t : tt;
                    hymt_q6_k_dots[R - 1][T - 1](tl, a0 + (size_t)t * act_stride, act_stride, acc + 2 * t);
                }
            }
            for (int i = 0; i < R; i++) {
                const int ri = i == 0 ? (rows < 16 ? rows : 16) : rows - 16;
                const __mmask16 keep = (__mmask16)((1u << ri) - 1);
                for (int t = 0; t < np; t++)
                    _mm512_mask_storeu_ps(y + (t0 + t) * y_stride + r + 16 * i, keep, acc[2 * t + i]);
            }
        }
    }
}

/* AVX2: one row at a time (one sequential stream), tokens in tiles of HYMT_KQ_SCALAR_TILE sharing each
 * unpacked block. Vector i holds the codes of inputs 32i .. 32i+31 in natural order (chunks 2i, 2i+1);
 * each pmaddubsw word (<= 2·63·127) plus −32·Σ of its two inputs (hymt_k8.nq2) is Σ (q6 − 32)·q over 2
 * inputs, and pmaddwd by (sc, sc) of the lane's chunk gives sc × 4-input sums in int32. */
HYMT_TARGET_AVX2 static void hymt_gemm_q6_k_avx2(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                 const uint8_t *act, size_t act_stride, int64_t n, int64_t cols,
                                                 float *y, int64_t y_stride) {
    const int64_t nb = cols / 256;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    float acc[HYMT_KQ_SCALAR_TILE]; /* [token of the tile] */
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = w + (size_t)r * row_bytes;
        for (int64_t t0 = 0; t0 < n; t0 += HYMT_KQ_SCALAR_TILE) {
            const int tt = n - t0 < HYMT_KQ_SCALAR_TILE ? (int)(n - t0) : HYMT_KQ_SCALAR_TILE;
            for (int t = 0; t < tt; t++) acc[t] = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = row + b * HYMT_Q6_K_BYTES;
                hymt_kq_prefetch(blk);
                __m256i wv[8], sc[8];
                for (int c = 0; c < 2; c++) {
                    __m256i qa = _mm256_loadu_si256((const __m256i *)(blk + 64 * c));      /* planes 0 | 2 */
                    __m256i qb = _mm256_loadu_si256((const __m256i *)(blk + 64 * c + 32)); /* planes 1 | 3 */
                    __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * c));
                    wv[4 * c + 0] = _mm256_or_si256(_mm256_and_si256(qa, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
                    wv[4 * c + 1] = _mm256_or_si256(_mm256_and_si256(qb, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
                    wv[4 * c + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qa, 4), m4), _mm256_and_si256(qh, m30));
                    wv[4 * c + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qb, 4), m4),
                                                    _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
                }
                const int8_t *s8 = (const int8_t *)(blk + 192);
                for (int i = 0; i < 8; i++)
                    sc[i] = _mm256_set_m128i(_mm_set1_epi16(s8[2 * i + 1]), _mm_set1_epi16(s8[2 * i]));
                const float d = _cvtsh_ss(hymt_load_u16(blk + 208));
                for (int t = 0; t < tt; t++) {
                    const hymt_k8 *g = (const hymt_k8 *)(act + (size_t)(t0 + t) * act_stride) + b;
                    __m256i Av = _mm256_setzero_si256();
                    for (int i = 0; i < 8; i++) {
                        __m256i p = _mm256_maddubs_epi16(wv[i], _mm256_load_si256((const __m256i *)(g->qs + 32 * i)));
                        p = _mm256_add_epi16(p, _mm256_load_si256((const __m256i *)(g->nq2 + 16 * i)));
                        Av = _mm256_add_epi32(Av, _mm256_madd_epi16(p, sc[i]));
                    }
                    acc[t] = fmaf(d * g->d, (float)hymt_kq_hsum8(Av), acc[t]);
                }
            }
            for (int t = 0; t < tt; t++) y[(t0 + t) * y_stride + r] = acc[t];
        }
    }
}
#endif /* HYMT_X86 */

#if defined(HYMT_ARM64)
/* SDOT by lane over a chunk's 4 activation dwords; the chain starts at −32·Σq of the chunk and the
 * chunk sum is multiplied by sc with an exact int32 multiply-accumulate. */
HYMT_TARGET_DOTPROD static void hymt_gemm_q6_k_dotprod(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                       const uint8_t *act, size_t act_stride, int64_t n,
                                                       int64_t cols, float *y, int64_t y_stride) {
    const int64_t nb = cols / 256;
    hymt_q6_k_tile tl __attribute__((aligned(64)));
    float32x4_t acc[HYMT_K_PASS][4]; /* [token of the pass][rows 4q..4q+3] */
    for (int64_t t0 = 0; t0 < n; t0 += HYMT_K_PASS) {
        const int np = n - t0 < HYMT_K_PASS ? (int)(n - t0) : HYMT_K_PASS;
        for (int64_t r = r0; r < r1; r += 16) {
            const int rows = r1 - r < 16 ? (int)(r1 - r) : 16;
            for (int t = 0; t < np; t++)
                for (int q = 0; q < 4; q++) acc[t][q] = vdupq_n_f32(0.0f);
            for (int64_t b = 0; b < nb; b++) {
                hymt_q6_k_tile_decode(w + (size_t)r * row_bytes + b * HYMT_Q6_K_BYTES, row_bytes, rows, &tl);
                for (int t = 0; t < np; t++) {
                    const hymt_k8 *g = (const hymt_k8 *)(act + (size_t)(t0 + t) * act_stride) + b;
                    const float32x4_t s = vdupq_n_f32(g->d);
                    for (int q = 0; q < 4; q++) {
                        int32x4_t A = vdupq_n_s32(0);
                        for (int j = 0; j < 16; j++) {
                            /* the int16 pair (sc, 0) back to a signed int32 */
                            const int32x4_t sc = vshrq_n_s32(vshlq_n_s32(vld1q_s32(tl.sc[j] + 4 * q), 16), 16);
                            const int kd = 4 * j;
                            const int8x16_t a = vld1q_s8(g->qs + 4 * kd);
                            int32x4_t ch = vdupq_n_s32(g->nb32[2 * j] + g->nb32[2 * j + 1]);
                            ch = vdotq_laneq_s32(ch, vld1q_s8((const int8_t *)tl.v[kd] + 16 * q), a, 0);
                            ch = vdotq_laneq_s32(ch, vld1q_s8((const int8_t *)tl.v[kd + 1] + 16 * q), a, 1);
                            ch = vdotq_laneq_s32(ch, vld1q_s8((const int8_t *)tl.v[kd + 2] + 16 * q), a, 2);
                            ch = vdotq_laneq_s32(ch, vld1q_s8((const int8_t *)tl.v[kd + 3] + 16 * q), a, 3);
                            A = vmlaq_s32(A, ch, sc);
                        }
                        acc[t][q] = vfmaq_f32(acc[t][q], vmulq_f32(vld1q_f32(tl.d + 4 * q), s), vcvtq_f32_s32(A));
                    }
                }
            }
            for (int t = 0; t < np; t++) {
                float out[16];
                for (int q = 0; q < 4; q++) vst1q_f32(out + 4 * q, acc[t][q]);
                memcpy(y + (t0 + t) * y_stride + r, out, sizeof(float) * rows);
            }
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

static const hymt_format HYMT_FORMAT_Q6_K = {
    "Q6_K",
    256,
    HYMT_Q6_K_BYTES,
    hymt_decode_q6_k,
    hymt_row_dot_f32_q6_k,
    hymt_prepare_k8,
    hymt_act_stride_k8,
    {
        hymt_gemm_q6_k_scalar,
#if defined(HYMT_X86)
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
