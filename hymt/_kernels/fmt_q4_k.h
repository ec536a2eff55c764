/* fmt_q4_k.h — Q4_K (REFERENCE.md §2.3): 256 weights in 144 bytes: fp16 d, fp16 dmin, 12 bytes of
 * packed 6-bit scales/mins for 8 sub-blocks of 32, 128 bytes of 4-bit codes. Sub-block j has
 * w = (d × f32(sc(j))) × f32(q) − dmin × f32(m(j)), q in 0..15.
 *
 * int8 path (§3.4, activation groups of 256 = one block, natural order: hymt_k8 of kquant_common.h).
 * For one row and one token, with s the activation scale of block b's group, q the int8 activations and
 * bsum_j = Σ q over sub-block j (32 inputs):
 *
 *   acc = 0
 *   for each block b:
 *       A = Σ_{j<8} sc(j) · Σ_{i<32} q4[32j+i] · q[32j+i]                          (exact int32)
 *       B = Σ_{j<8} m(j) · bsum_j                                                     (exact int32)
 *       v = fma(−dmin, f32(B), d × f32(A))
 *       acc = fma(s, v, acc)
 *   y = acc
 *
 * (|A| <= 8·63·32·15·127 < 2^31.) Two float operations per (row, token, block) beyond the conversions,
 * so the SIMD kernels keep one lane per OUTPUT ROW (kquant_common.h, row-lane layout): a tile of 16 rows
 * is decoded once per block and serves every token of the call; the sub-block scales are applied to
 * int16-sized chunk sums with vpdpwssd / pmaddwd / an int32 multiply-accumulate, all exact. Calls of
 * one or two tokens on AVX-512 read one row at a time instead (one lane per block for the float steps);
 * every path computes the same integers and the same float sequence, so the values cannot depend on n.
 *
 * Float path: decode each block into 256 floats and dot it with its input slice (hymt_dot_f32). */
#ifndef HYMT_FMT_Q4_K_H
#define HYMT_FMT_Q4_K_H

#include "kquant_common.h"
#include "amx.h"

#define HYMT_Q4_K_BYTES 144
/* AVX-512 paths by tokens per call: on AMD cores up to HYMT_Q4_K_GEMV_MAX one row at a time (two sequential
 * weight streams), up to HYMT_Q4_K_ROWPASS_MAX 16-row tiles decoded in registers, up to HYMT_Q4_K_ROWS_MAX
 * tokens at a time (hymt_q4_k_rows_avx512; on Intel cores from one token), above that 32-row tiles through
 * an L1 buffer (or AMX tiles from HYMT_Q4_K_AMX_MIN). Measured from DRAM at 2 threads when the register
 * tiles still staged each tile through a copy: they took 1.08x the row-at-a-time kernel's time at 2
 * tokens, 0.98x at 3, 0.88x at 4 (per token a vpdpbusd chain, no horizontal sums), and 0.75x the L1-buffer
 * tiles' at 6-8; the super panels that replaced the copy lose to the GEMV at 1-2 tokens on Zen 4 but win
 * on the Intel core of session 17 (hymt_q4_k_uses_gemv). */
#define HYMT_Q4_K_GEMV_MAX 2
#define HYMT_Q4_K_ROWS_MAX 8
/* Up to this many tokens the register tiles run in passes of up to HYMT_Q4_K_ROWS_MAX over each super
 * panel (its rows in L1 for the later passes); more take the L1-buffer tiles. Zen 5 (EPYC, family 26,
 * 2 cores, session 15), kernel benchmark from DRAM, 2 threads, 2 alternations, µs per layer call, L1
 * tiles → passes: n = 9 278–280 → 174–176, 16 328–333 → 257–262, 24 415 → 374–382, 33 532–533 →
 * 512–515, 64 824–836 → 953–955, 132 1686–1720 → 2019–2024. The L1 tiles cost ~130 µs more than the
 * register tiles at 8 → 9 tokens there (their 32 row streams stall); from ~40 tokens their cheaper
 * per-token dots win. */
#define HYMT_Q4_K_ROWPASS_MAX 32

/* 6-bit scales and mins of the 8 sub-blocks: out[0..8) = sc(j), out[8..16) = m(j). */
static inline void hymt_q4_k_scale_min(const uint8_t *S, uint8_t out[16]) {
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            out[j] = S[j] & 63;
            out[8 + j] = S[j + 4] & 63;
        } else {
            out[j] = (uint8_t)((S[j + 4] & 15) | ((S[j - 4] >> 6) << 4));
            out[8 + j] = (uint8_t)((S[j + 4] >> 4) | ((S[j] >> 6) << 4));
        }
    }
}

/* The same 16 bytes with 32-bit word operations, kept in registers: byte j of *sc = sc(j), of *mn = m(j). */
HYMT_INLINE void hymt_q4_k_scale_min_u64(const uint8_t *S, uint64_t *sc, uint64_t *mn) {
    uint32_t a, b, c;
    memcpy(&a, S, 4);
    memcpy(&b, S + 4, 4);
    memcpy(&c, S + 8, 4);
    *sc = (a & 0x3f3f3f3fu) | (uint64_t)((c & 0x0f0f0f0fu) | (((a >> 6) & 0x03030303u) << 4)) << 32;
    *mn = (b & 0x3f3f3f3fu) | (uint64_t)(((c >> 4) & 0x0f0f0f0fu) | (((b >> 6) & 0x03030303u) << 4)) << 32;
}

/* Codes (0..15) of one block in natural weight order. */
static inline void hymt_q4_k_codes(const uint8_t *blk, uint8_t codes[256]) {
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++) {
            uint8_t q = blk[16 + 32 * g + l];
            codes[64 * g + l] = q & 15;
            codes[64 * g + 32 + l] = q >> 4;
        }
}

static void hymt_decode_q4_k(const uint8_t *src, float *dst, int64_t nblocks) {
    uint8_t sm[16];
    for (int64_t b = 0; b < nblocks; b++) {
        const uint8_t *blk = src + b * HYMT_Q4_K_BYTES;
        float d = hymt_fp16_to_f32(hymt_load_u16(blk));
        float dmin = hymt_fp16_to_f32(hymt_load_u16(blk + 2));
        hymt_q4_k_scale_min(blk + 4, sm);
        float *out = dst + 256 * b;
        for (int g = 0; g < 4; g++) {
            float d1 = d * (float)sm[2 * g], m1 = dmin * (float)sm[8 + 2 * g];
            float d2 = d * (float)sm[2 * g + 1], m2 = dmin * (float)sm[8 + 2 * g + 1];
            for (int l = 0; l < 32; l++) {
                uint8_t q = blk[16 + 32 * g + l];
                out[64 * g + l] = (d1 * (float)(q & 15)) - m1;
                out[64 * g + 32 + l] = (d2 * (float)(q >> 4)) - m2;
            }
        }
    }
}

static float hymt_row_dot_f32_q4_k(const uint8_t *row, const float *x, int64_t cols) {
    float block[256]; /* [256] decoded weights of one block */
    float total = 0.0f;
    for (int64_t b = 0; b < cols / 256; b++) {
        hymt_decode_q4_k(row + b * HYMT_Q4_K_BYTES, block, 1);
        total += hymt_dot_f32(block, x + 256 * b, 256);
    }
    return total;
}

/* int8 path, scalar reference: the definition above, row by row, tokens in tiles (the tiling does not
 * change any value: each (row, token) runs the same sequence over the blocks). */
static void hymt_gemm_q4_k_scalar(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                  const uint8_t *act, size_t act_stride, int64_t n, int64_t cols, float *y,
                                  int64_t y_stride) {
    const int64_t nb = cols / 256;
    uint8_t codes[256], sm[16];
    float acc[HYMT_KQ_SCALAR_TILE]; /* [token] */
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = w + (size_t)r * row_bytes;
        for (int64_t t0 = 0; t0 < n; t0 += HYMT_KQ_SCALAR_TILE) {
            int64_t tt = n - t0 < HYMT_KQ_SCALAR_TILE ? n - t0 : HYMT_KQ_SCALAR_TILE;
            for (int64_t t = 0; t < tt; t++) acc[t] = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = row + b * HYMT_Q4_K_BYTES;
                float d = hymt_fp16_to_f32(hymt_load_u16(blk));
                float dmin = hymt_fp16_to_f32(hymt_load_u16(blk + 2));
                hymt_q4_k_scale_min(blk + 4, sm);
                hymt_q4_k_codes(blk, codes);
                for (int64_t t = 0; t < tt; t++) {
                    const hymt_k8 *g = (const hymt_k8 *)(act + (size_t)(t0 + t) * act_stride) + b;
                    int32_t A = 0, B = 0;
                    for (int j = 0; j < 8; j++) {
                        int32_t isum = 0;
                        for (int i = 32 * j; i < 32 * j + 32; i++) isum += (int32_t)codes[i] * g->qs[i];
                        A += (int32_t)sm[j] * isum;
                        B += (int32_t)sm[8 + j] * g->bsum[j];
                    }
                    float v = fmaf(-dmin, (float)B, d * (float)A);
                    acc[t] = fmaf(g->d, v, acc[t]);
                }
            }
            for (int64_t t = 0; t < tt; t++) y[(t0 + t) * y_stride + r] = acc[t];
        }
    }
}

/* One block of a tile of 16 rows in the row-lane layout (kquant_common.h), 4992 bytes. Row r of the tile
 * is lane r; rows past the end of the range repeat the last row (their lanes are never stored). */
typedef struct {
    uint8_t v[64][64];  /* v[kd][4r + e] = code of row r at input 4kd + e (0..15) */
    int32_t sc[8][16];  /* sc[j][r] = sc(j) of row r: the int16 pair (sc, 0) */
    int32_t sc8[4][16]; /* sc8[i][r] = 8·sc(2i) | 8·sc(2i+1) << 16 of row r: an int16 pair */
    int32_t mn[4][16];  /* mn[i][r] = m(2i) | m(2i+1) << 16 of row r: an int16 pair */
    float d[16];        /* d of row r */
    float ndmin[16];    /* −dmin of row r */
} hymt_q4_k_tile;

/* The tile of block blk0 (row 0 of the tile) .. blk0 + (rows − 1) · row_bytes, portable form. */
static void hymt_q4_k_tile_decode(const uint8_t *blk0, size_t row_bytes, int rows, hymt_q4_k_tile *tl) {
    uint8_t sm[16];
    for (int r = 0; r < 16; r++) {
        const uint8_t *p = blk0 + (size_t)(r < rows ? r : rows - 1) * row_bytes;
        __builtin_prefetch(p + 4 * HYMT_Q4_K_BYTES, 0, 3);
        __builtin_prefetch(p + 4 * HYMT_Q4_K_BYTES + 64, 0, 3);
        __builtin_prefetch(p + 4 * HYMT_Q4_K_BYTES + 128, 0, 3);
        tl->d[r] = hymt_fp16_to_f32(hymt_load_u16(p));
        tl->ndmin[r] = -hymt_fp16_to_f32(hymt_load_u16(p + 2));
        hymt_q4_k_scale_min(p + 4, sm);
        for (int j = 0; j < 8; j++) tl->sc[j][r] = sm[j];
        for (int i = 0; i < 4; i++) {
            tl->sc8[i][r] = 8 * ((int32_t)sm[2 * i] | ((int32_t)sm[2 * i + 1] << 16));
            tl->mn[i][r] = (int32_t)sm[8 + 2 * i] | ((int32_t)sm[9 + 2 * i] << 16);
        }
        /* byte l of 32-byte group g: low nibble = input 64g + l, high nibble = input 64g + 32 + l */
        for (int g = 0; g < 4; g++)
            for (int k = 0; k < 8; k++) {
                uint32_t q;
                memcpy(&q, p + 16 + 32 * g + 4 * k, 4);
                uint32_t lo = q & 0x0f0f0f0fu, hi = (q >> 4) & 0x0f0f0f0fu;
                memcpy(&tl->v[16 * g + k][4 * r], &lo, 4);
                memcpy(&tl->v[16 * g + 8 + k][4 * r], &hi, 4);
            }
    }
}

#if defined(HYMT_X86)
/* The header words of one block of 16 rows (lane r = row r at blk0 + offs[r]): *g0 = d | dmin << 16, and
 * hymt_q4_k_scale_min on 32-bit words: byte j of *sc03 | *sc47 is sc(j), of *m03 | *m47 is m(j). */
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_q4_k_scales16(const uint8_t *blk0, __m512i offs, __m512i *g0, __m512i *sc03,
                                                       __m512i *sc47, __m512i *m03, __m512i *m47) {
    *g0 = _mm512_i32gather_epi32(offs, (const void *)blk0, 1);
    const __m512i ga = _mm512_i32gather_epi32(offs, (const void *)(blk0 + 4), 1); /* scale bytes 0..3 */
    const __m512i gb = _mm512_i32gather_epi32(offs, (const void *)(blk0 + 8), 1);
    const __m512i gc = _mm512_i32gather_epi32(offs, (const void *)(blk0 + 12), 1);
    const __m512i k3f = _mm512_set1_epi8(0x3f), k0f = _mm512_set1_epi8(0x0f), k03 = _mm512_set1_epi8(0x03);
    *sc03 = _mm512_and_si512(ga, k3f);
    *sc47 = _mm512_or_si512(_mm512_and_si512(gc, k0f),
                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(ga, 6), k03), 4));
    *m03 = _mm512_and_si512(gb, k3f);
    *m47 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(gc, 4), k0f),
                           _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(gb, 6), k03), 4));
}

/* The per-row values of the two float steps and B, from hymt_q4_k_scales16's words: mn[i][r] = the int16
 * pair m(2i) | m(2i+1) << 16 of row r, d[r], ndmin[r] = −dmin. */
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_q4_k_store_mins_d(__m512i m03, __m512i m47, __m512i g0, int32_t mn[4][16],
                                                           float d[16], float ndmin[16]) {
    const __m512i ff = _mm512_set1_epi32(0xff), ff16 = _mm512_set1_epi32(0xff0000);
    _mm512_store_si512((void *)mn[0], _mm512_or_si512(_mm512_and_si512(m03, ff),
                                                      _mm512_and_si512(_mm512_slli_epi32(m03, 8), ff16)));
    _mm512_store_si512((void *)mn[1], _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(m03, 16), ff),
                                                      _mm512_and_si512(_mm512_srli_epi32(m03, 8), ff16)));
    _mm512_store_si512((void *)mn[2], _mm512_or_si512(_mm512_and_si512(m47, ff),
                                                      _mm512_and_si512(_mm512_slli_epi32(m47, 8), ff16)));
    _mm512_store_si512((void *)mn[3], _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(m47, 16), ff),
                                                      _mm512_and_si512(_mm512_srli_epi32(m47, 8), ff16)));
    _mm512_store_ps(d, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g0)));
    const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g0, 16)));
    _mm512_store_ps(ndmin, _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(dmin),
                                                               _mm512_set1_epi32((int)0x80000000u))));
}

/* hymt_q4_k_tile_decode with two 16×16 dword transposes of the codes and gathers of the scale words. */
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_q4_k_tile_avx512(const uint8_t *blk0, size_t row_bytes, int rows,
                                                          hymt_q4_k_tile *tl) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i lane = _mm512_min_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32(rows - 1));
    const __m512i offs = _mm512_mullo_epi32(lane, _mm512_set1_epi32((int)row_bytes));
    int32_t off[16];
    _mm512_storeu_si512((void *)off, offs);
    for (int h = 0; h < 2; h++) {
        __m512i x[16], t[16]; /* x[r]: bytes 64h..64h+63 of row r's codes = groups 2h, 2h+1 */
        for (int r = 0; r < 16; r++) x[r] = _mm512_loadu_si512((const void *)(blk0 + off[r] + 16 + 64 * h));
        hymt_transpose16_epi32(x, t);
        for (int k = 0; k < 16; k++) {
            const int g = 2 * h + k / 8, kk = k % 8;
            _mm512_store_si512((void *)tl->v[16 * g + kk], _mm512_and_si512(t[k], m4));
            _mm512_store_si512((void *)tl->v[16 * g + 8 + kk], _mm512_and_si512(_mm512_srli_epi16(t[k], 4), m4));
        }
    }
    __m512i g0, sc03, sc47, m03, m47;
    hymt_q4_k_scales16(blk0, offs, &g0, &sc03, &sc47, &m03, &m47);
    const __m512i ff = _mm512_set1_epi32(0xff);
    __m512i sc[8];
    for (int j = 0; j < 4; j++) {
        sc[j] = _mm512_and_si512(_mm512_srli_epi32(sc03, 8 * j), ff);
        sc[4 + j] = _mm512_and_si512(_mm512_srli_epi32(sc47, 8 * j), ff);
    }
    for (int j = 0; j < 8; j++) _mm512_store_si512((void *)tl->sc[j], sc[j]);
    for (int i = 0; i < 4; i++)
        _mm512_store_si512((void *)tl->sc8[i],
                           _mm512_slli_epi32(_mm512_or_si512(sc[2 * i], _mm512_slli_epi32(sc[2 * i + 1], 16)), 3));
    hymt_q4_k_store_mins_d(m03, m47, g0, tl->mn, tl->d, tl->ndmin);
}

/* T tokens (activations of block b at a0, a0 + act_stride, ...) × the 16 rows of a decoded tile: one block
 * step of the definition for each (row lane, token). A per sub-block: a vpdpbusd chain over its 8 code
 * dwords that starts at −8·bsum_j ends at Σ (q4 − 8)·q, whose magnitude <= 32·8·127 = 32512 fits int16,
 * so vpdpwssd with the pair (sc, 0) multiplies it by sc exactly; the 8·sc·bsum_j put back and B are
 * pair products (8·sc(2i), 8·sc(2i+1)) · (bsum_2i, bsum_2i+1) and (m(2i), m(2i+1)) · (the same pair). */
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_q4_k_dots_avx512(const hymt_q4_k_tile *tl, const uint8_t *a0,
                                                          size_t act_stride, __m512 *acc, const int R, const int T) {
    const hymt_k8 *g[HYMT_K_TT];
    __m512i A[2][HYMT_K_TT], B[2][HYMT_K_TT];
    for (int t = 0; t < T; t++) {
        g[t] = (const hymt_k8 *)(a0 + (size_t)t * act_stride);
        for (int i = 0; i < R; i++) A[i][t] = B[i][t] = _mm512_setzero_si512();
    }
#pragma GCC unroll 8 /* a rolled loop rotates the accumulators through register copies */
    for (int j = 0; j < 8; j++) {
        __m512i ch[2][HYMT_K_TT];
        for (int t = 0; t < T; t++) {
            __m512i start = _mm512_set1_epi32(g[t]->nb8[j]);
            for (int i = 0; i < R; i++) ch[i][t] = start;
        }
        for (int e = 0; e < 8; e++) {
            const int kd = 8 * j + e;
            __m512i wv[2];
            for (int i = 0; i < R; i++) wv[i] = _mm512_load_si512((const void *)tl[i].v[kd]);
            for (int t = 0; t < T; t++) {
                const __m512i a = _mm512_set1_epi32(hymt_k8_dword(g[t], kd));
                for (int i = 0; i < R; i++) ch[i][t] = _mm512_dpbusd_epi32(ch[i][t], wv[i], a);
            }
        }
        for (int i = 0; i < R; i++) {
            const __m512i sc = _mm512_load_si512((const void *)tl[i].sc[j]);
            for (int t = 0; t < T; t++) A[i][t] = _mm512_dpwssd_epi32(A[i][t], ch[i][t], sc);
        }
    }
    for (int k = 0; k < 4; k++)
        for (int t = 0; t < T; t++) {
            const __m512i pair = _mm512_set1_epi32(hymt_k8_bsum_pair(g[t], k));
            for (int i = 0; i < R; i++) {
                A[i][t] = _mm512_dpwssd_epi32(A[i][t], _mm512_load_si512((const void *)tl[i].sc8[k]), pair);
                B[i][t] = _mm512_dpwssd_epi32(B[i][t], _mm512_load_si512((const void *)tl[i].mn[k]), pair);
            }
        }
    for (int i = 0; i < R; i++) {
        const __m512 d = _mm512_load_ps(tl[i].d), ndmin = _mm512_load_ps(tl[i].ndmin);
        for (int t = 0; t < T; t++) {
            const __m512 da = _mm512_mul_ps(d, _mm512_cvtepi32_ps(A[i][t]));
            const __m512 v = _mm512_fmadd_ps(ndmin, _mm512_cvtepi32_ps(B[i][t]), da);
            acc[2 * t + i] = _mm512_fmadd_ps(_mm512_set1_ps(g[t]->d), v, acc[2 * t + i]);
        }
    }
}

/* [R − 1][T − 1]: R tiles of 16 rows × T tokens. R = 2 reuses each broadcast activation dword for two
 * vpdpbusd (loads are the other scarce resource); its accumulators fill the registers at T = 4. */
typedef void (*hymt_q4_k_dots_fn)(const hymt_q4_k_tile *tl, const uint8_t *a0, size_t act_stride, __m512 *acc);
#define HYMT_Q4_K_DOTS(R, T)                                                                                \
    HYMT_TARGET_AVX512 static void hymt_q4_k_dots_##R##x##T(const hymt_q4_k_tile *tl, const uint8_t *a0,   \
                                                            size_t act_stride, __m512 *acc) {               \
        hymt_q4_k_dots_avx512(tl, a0, act_stride, acc, R, T);                                               \
    }
HYMT_Q4_K_DOTS(1, 1)
HYMT_Q4_K_DOTS(1, 2)
HYMT_Q4_K_DOTS(1, 3)
HYMT_Q4_K_DOTS(1, 4)
HYMT_Q4_K_DOTS(1, 5)
HYMT_Q4_K_DOTS(1, 6)
HYMT_Q4_K_DOTS(1, 7)
HYMT_Q4_K_DOTS(1, 8)
HYMT_Q4_K_DOTS(2, 1)
HYMT_Q4_K_DOTS(2, 2)
HYMT_Q4_K_DOTS(2, 3)
HYMT_Q4_K_DOTS(2, 4)
#undef HYMT_Q4_K_DOTS
#define HYMT_Q4_K_R2_TT 4
static const hymt_q4_k_dots_fn hymt_q4_k_dots[2][HYMT_K_TT] = {
    {hymt_q4_k_dots_1x1, hymt_q4_k_dots_1x2, hymt_q4_k_dots_1x3, hymt_q4_k_dots_1x4, hymt_q4_k_dots_1x5,
     hymt_q4_k_dots_1x6, hymt_q4_k_dots_1x7, hymt_q4_k_dots_1x8},
    {hymt_q4_k_dots_2x1, hymt_q4_k_dots_2x2, hymt_q4_k_dots_2x3, hymt_q4_k_dots_2x4, NULL, NULL, NULL, NULL},
};

/* One or two tokens (n <= HYMT_Q4_K_GEMV_MAX): one row at a time (one sequential weight stream). A block's 128
 * code bytes are rearranged once per row into four vectors V_k with one sub-block per lane across all
 * four: qword m of the permuted Q_k is qword k of 32-byte group m % 4, and lane L of V_k takes the low
 * nibbles of Q_k for L < 8 (sub-block 2(L/2)) and the high ones for L >= 8 (sub-block 2((L-8)/2) + 1);
 * hymt_k8.qs4 holds the activations in that order. Per token a vpdpbusd chain over the four vectors
 * leaves 16 inputs of one sub-block per lane (<= 16·15·127, int16-sized), one vpdpwssd by the lane's
 * (sc, 0) scales them, and a horizontal sum (hymt_kq_hsum16, 16 blocks at once) gives A. B of 16 blocks
 * is four vpdpwssd with one lane per block: the mins of the row's blocks (gathered in registers) times
 * the token's bsum pairs (arranged the same way once per call).
 * Memory: the rows are taken from HYMT_Q4_K_GEMV_STREAMS equal sub-ranges in turn (row r0 + i, then
 * r0 + H + i, ...), so the kernel reads that many sequential streams instead of one; each row's values
 * are its own, so the order cannot change them. The kernel computes at ~17 GB/s per thread from L2
 * (2048 columns), not far above one thread's share of the read rate (~14 GB/s), and one stream left
 * fetches exposed: measured (size.py, one matrix shape cycled through 1 GiB, n = 1, ratio to the
 * streaming read rate, 2 / 1 threads) 2048×2048 0.66 / 0.78 → 0.74 / 0.86, 6144×2048 0.74 / 0.81 →
 * 0.80 / 0.90, 2048 rows × 6144 columns 0.72 / 0.82 → 0.75 / 0.83, 65536×2048 0.81 / 0.86 → 0.87 / 0.91.
 * Four streams measured the same as two; the prefetch distances (hymt_kq_prefetch: L1 768–1536, L2
 * 4096–6144 bytes ahead) within noise of each other; prefetching exactly the lines of one block instead
 * of four lines from each block's offset −3 to −6 %. */
#define HYMT_Q4_K_GEMV_STREAMS 2
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_q4_k_gemv_avx512(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                          const uint8_t *act, size_t act_stride, const int n,
                                                          int64_t nb, float *y, int64_t y_stride) {
    const int64_t ng = (nb + 15) / 16; /* groups of up to 16 blocks */
    /* per (token, group): bsp[i][kb] = bsum pair i of block 16·group + kb, sv[kb] its activation scale
     * (zero past the last block) */
    int32_t(*bsp)[4][16] = (int32_t(*)[4][16])__builtin_alloca((size_t)(n * ng) * sizeof *bsp + 64);
    bsp = (int32_t(*)[4][16])(((uintptr_t)bsp + 63) & ~(uintptr_t)63);
    float(*sv)[16] = (float(*)[16])__builtin_alloca((size_t)(n * ng) * sizeof *sv);
    for (int t = 0; t < n; t++)
        for (int64_t gi = 0; gi < ng; gi++)
            for (int kb = 0; kb < 16; kb++) {
                const int64_t b = 16 * gi + kb;
                const hymt_k8 *g = (const hymt_k8 *)(act + (size_t)t * act_stride) + b;
                for (int i = 0; i < 4; i++) bsp[t * ng + gi][i][kb] = b < nb ? hymt_k8_bsum_pair(g, i) : 0;
                sv[t * ng + gi][kb] = b < nb ? g->d : 0.0f;
            }
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i nibble = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4);
    const __m512i sigma = _mm512_setr_epi32(0, 0, 2, 2, 4, 4, 6, 6, 1, 1, 3, 3, 5, 5, 7, 7); /* lane -> sub-block */
    __m512i qidx[4], midx[4];
    for (int k = 0; k < 4; k++) /* qword m of Q_k: qword k of group m % 4 (groups 0, 1 in z0, 2, 3 in z1) */
        qidx[k] = _mm512_add_epi64(_mm512_setr_epi64(0, 4, 8, 12, 0, 4, 8, 12), _mm512_set1_epi64(k));
    for (int i = 0; i < 4; i++) /* lane kb of M_i: dword 4kb + i of the group's mins table (mod 32) */
        midx[i] = _mm512_add_epi32(_mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28),
                                   _mm512_set1_epi32(i));
    __m512i av[HYMT_Q4_K_GEMV_MAX][16]; /* [token][block of the group]: A by lane, summed by hymt_kq_hsum16 */
    int32_t mt[16][4] __attribute__((aligned(64))); /* mt[kb][i] = the int16 pair (m(2i), m(2i+1)) of block kb */
    uint32_t dm[16] __attribute__((aligned(64))); /* d | dmin << 16 (fp16) of block kb */
    float vs[16];
    for (int t = 0; t < n; t++)
        for (int k = 0; k < 16; k++) av[t][k] = _mm512_setzero_si512();
    memset(mt, 0, sizeof mt);
    memset(dm, 0, sizeof dm);
    const int64_t H = (r1 - r0 + HYMT_Q4_K_GEMV_STREAMS - 1) / HYMT_Q4_K_GEMV_STREAMS; /* rows per stream */
    for (int64_t i = 0; i < HYMT_Q4_K_GEMV_STREAMS * H; i++) {
        const int64_t r = r0 + (i % HYMT_Q4_K_GEMV_STREAMS) * H + i / HYMT_Q4_K_GEMV_STREAMS;
        if (r >= r1) continue; /* the last stream is short */
        const uint8_t *row = w + (size_t)r * row_bytes;
        float acc[HYMT_Q4_K_GEMV_MAX];
        for (int t = 0; t < n; t++) acc[t] = 0.0f;
        for (int64_t gi = 0; gi < ng; gi++) {
            const int64_t b0 = 16 * gi;
            const int kn = nb - b0 < 16 ? (int)(nb - b0) : 16;
            for (int kb = 0; kb < kn; kb++) {
                const int64_t b = b0 + kb;
                const uint8_t *blk = row + b * HYMT_Q4_K_BYTES;
                hymt_kq_prefetch(blk);
                const __m512i z0 = _mm512_loadu_si512((const void *)(blk + 16));
                const __m512i z1 = _mm512_loadu_si512((const void *)(blk + 80));
                __m512i v[4];
                for (int k = 0; k < 4; k++)
                    v[k] = _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutex2var_epi64(z0, qidx[k], z1), nibble), m4);
                uint64_t scs, mns;
                hymt_q4_k_scale_min_u64(blk + 4, &scs, &mns);
                const __m512i sc = _mm512_permutexvar_epi32(sigma, _mm512_cvtepu8_epi32(_mm_cvtsi64_si128((long long)scs)));
                _mm_store_si128((__m128i *)mt[kb], _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mns)));
                memcpy(&dm[kb], blk, 4);
                for (int t = 0; t < n; t++) {
                    const int8_t *q = ((const hymt_k8 *)(act + (size_t)t * act_stride) + b)->qs4;
                    __m512i ch = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v[0], _mm512_load_si512((const void *)q));
                    ch = _mm512_dpbusd_epi32(ch, v[1], _mm512_load_si512((const void *)(q + 64)));
                    ch = _mm512_dpbusd_epi32(ch, v[2], _mm512_load_si512((const void *)(q + 128)));
                    ch = _mm512_dpbusd_epi32(ch, v[3], _mm512_load_si512((const void *)(q + 192)));
                    av[t][kb] = _mm512_dpwssd_epi32(_mm512_setzero_si512(), ch, sc);
                }
            }
            /* v of the group's blocks with one lane per block (the same float operations per lane), then
             * the sequential accumulation (lanes past the group's end are unused) */
            const __m512i dmv = _mm512_load_si512((const void *)dm);
            const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dmv));
            const __m512 ndmin = _mm512_castsi512_ps(_mm512_xor_si512(
                _mm512_castps_si512(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dmv, 16)))),
                _mm512_set1_epi32((int)0x80000000u)));
            __m512i mq[4], mn[4]; /* mq[u]: mt[4u .. 4u+4); mn[i] lane kb: mt[kb][i] */
            for (int u = 0; u < 4; u++) mq[u] = _mm512_load_si512((const void *)mt[4 * u]);
            for (int i = 0; i < 4; i++)
                mn[i] = _mm512_mask_blend_epi32(0xFF00, _mm512_permutex2var_epi32(mq[0], midx[i], mq[1]),
                                                _mm512_permutex2var_epi32(mq[2], midx[i], mq[3]));
            for (int t = 0; t < n; t++) {
                const int32_t(*bp)[16] = bsp[t * ng + gi];
                __m512i Bv = _mm512_dpwssd_epi32(_mm512_setzero_si512(), mn[0], _mm512_load_si512((const void *)bp[0]));
                for (int i = 1; i < 4; i++) Bv = _mm512_dpwssd_epi32(Bv, mn[i], _mm512_load_si512((const void *)bp[i]));
                const __m512 A = _mm512_cvtepi32_ps(hymt_kq_hsum16(av[t]));
                _mm512_storeu_ps(vs, _mm512_fmadd_ps(ndmin, _mm512_cvtepi32_ps(Bv), _mm512_mul_ps(d, A)));
                const float *s = sv[t * ng + gi];
                for (int kb = 0; kb < kn; kb++) acc[t] = fmaf(s[kb], vs[kb], acc[t]);
            }
        }
        for (int t = 0; t < n; t++) y[t * y_stride + r] = acc[t];
    }
}

#define HYMT_Q4_K_GEMV(N)                                                                                   \
    HYMT_TARGET_AVX512 static void hymt_q4_k_gemv_##N(const uint8_t *w, size_t row_bytes, int64_t r0,           \
                                                      int64_t r1, const uint8_t *act, size_t act_stride,        \
                                                      int64_t nb, float *y, int64_t y_stride) {                 \
        hymt_q4_k_gemv_avx512(w, row_bytes, r0, r1, act, act_stride, N, nb, y, y_stride);                       \
    }
HYMT_Q4_K_GEMV(1)
HYMT_Q4_K_GEMV(2)
#undef HYMT_Q4_K_GEMV
typedef void (*hymt_q4_k_gemv_fn)(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1, const uint8_t *act,
                                  size_t act_stride, int64_t nb, float *y, int64_t y_stride);
static const hymt_q4_k_gemv_fn hymt_q4_k_gemvs[HYMT_Q4_K_GEMV_MAX] = {hymt_q4_k_gemv_1, hymt_q4_k_gemv_2};

/* Whether an n-token call reads one row at a time (the GEMV above) rather than the super panels below:
 * AMD cores only. Session 17, Intel (family 6 model 167, AMX), 2 threads, 2 alternations: kernelbench
 * from DRAM, µs per 1.8B layer, GEMV → panels n = 1 1042 / 1079 → 988 / 1006, n = 2 1225 / 1287 → 1015 /
 * 1038 (n = 2 had been slower than n = 3, 1102); the Q4_K decode step (synthetic, 2 threads, medians of
 * 40) 1.8B one sequence 49.1 / 48.4 → 46.5 / 45.1 ms, two 55.4 / 55.1 → 50.3 / 48.9; 7B one 198 / 193 →
 * 184 / 182 ms, two 236 / 231 → 207 / 199. Zen 4 (session 12, below): the GEMV wins from DRAM. Zen 5
 * (session 18, family 26, kernelbench from DRAM, 2 threads, 4 ABBA pairs, µs per 1.8B layer): n = 1 GEMV
 * 637–792 against the panels' 716–919, n = 2 equal; the GEMV stays on every AMD core. */
HYMT_INLINE int hymt_q4_k_uses_gemv(int64_t n) { return n <= HYMT_Q4_K_GEMV_MAX && hymt_cpu()->amd; }

/* Few tokens (HYMT_Q4_K_GEMV_MAX < n <= HYMT_Q4_K_ROWPASS_MAX): tiles of 16 rows, one lane per row, decoded
 * once per block for every token of the call, the code vectors made in registers as they are used (no
 * 4 KiB tile buffer, no horizontal sums). Per block: the 16 row headers (16 bytes each) become four
 * lane = row vectors by 128-bit inserts and a 4×4 transpose (d|dmin,
 * scale bytes 0..3, 4..7, 8..11); the codes, 64 bytes per row at a time, by a 16×16 dword transpose
 * (vector k, lane r = code bytes 4k..4k+3 of row r; stored to L1 between the transposes and their
 * use), whose low / high nibbles are the code vectors of one sub-block each. Per token and sub-block j a
 * vpdpbusd chain over its 8 code vectors (activation dwords broadcast from memory) starts at −8·bsum_j
 * and scales by sc(j) with one vpdpwssd, as in hymt_q4_k_dots_avx512 (the chains of the two sub-blocks
 * of a 32-byte group run interleaved, so that even one token has two independent chains); then the same
 * pair products for the 8·sc·bsum put back and B, and the two float steps.
 * Memory: a tile of 16 consecutive rows read block by block is 16 streams that each jump to the next
 * tile after one row (1152 bytes at 2048 columns), which the hardware prefetchers follow badly. So a
 * range of 16·S rows (S = HYMT_Q4_K_LANE_ROWS, fewer for a short range) is read as a super panel whose
 * lane j takes rows r + jS .. r + jS + S − 1 in S passes: each lane is one contiguous stream of S rows,
 * prefetched into L1 HYMT_Q4_K_ROWS_AHEAD blocks ahead along the lane (past a row's end that is the
 * lane's next row), and lane j of pass i is output row r + jS + i (the values are per row, so the lane
 * assignment cannot change them). A range shorter than 32 rows is read as tiles of consecutive rows, a
 * partial one with its missing lanes repeating its last row (never stored). Measured against the
 * previous form, which copied each next tile of consecutive rows into a staging buffer during the
 * current one (size.py, one shape cycled through 1 GiB, n = 4, ratio to the streaming read rate, 2 / 1
 * threads): 2048×2048 0.54 / 0.62 → 0.75 / 0.87, 2048 rows × 6144 columns 0.56 / 0.62 → 0.84 / 0.94,
 * 65536×2048 0.62 / 0.65 → 0.83 / 0.87; without the software prefetch 0.64–0.80, 1 or 3 blocks ahead
 * within noise of 2, S = 4 (the gate/up product's 64-row calls) 0.67–0.79. The same kernel at one or two
 * tokens beat the row-at-a-time GEMV at one thread then (n = 2: 0.75 → 0.91 at 2048×2048) but lost at two
 * threads (n = 1: 0.82 → 0.71–0.75, n = 2: 0.68 → 0.63), so the GEMV kept n <= 2; on the Intel core of
 * session 17 the panels win at both (hymt_q4_k_uses_gemv), on Zen 4 they lose (below).
 * Zen 4 (session 12, AMD EPYC, 2 cores; one zmm vpdpbusd per cycle, vpdpwssd / vpmulld / vpmaddwd on the
 * same pipes, shuffles and logic on others). Hot (256×2048 in L2, one thread, cycles per 16 rows ×
 * block, best of calls): this kernel T = 1 280, 2 340, 3 415, 4 490, 8 900 (~70–100 per token on ~210
 * fixed); the GEMV n = 1 415, n = 2 555. From DRAM the GEMV still wins at 1–2 tokens (kernelbench,
 * 3 alternated runs, medians, µs per call: n = 1 212 vs 250 at one thread, 136 vs 158 at two; n = 2
 * 287 vs 282 at one, 161 vs 187 at two), so the thresholds stay. The kernel's DRAM time at 4 tokens is
 * ~1.5× its hot time (one thread ~740 vs 490 cycles per 16 rows × block; two ~780), so memory overlap
 * is as large a loss here as the instruction count. Timing probes at T = 4, hot (each part removed, so
 * wrong values): the code transposes −70 cycles, the header vectors −45, the 8 sc vpdpwssd per token
 * −15, the put back and B −50, the prefetches −20; all of them removed: 330 (the 256 vpdpbusd).
 * Tried and not kept: (1) the put back folded into the scale step (chains started at 65528·bsum_j so
 * that the high word carries bsum_j, pairs (sc, 8·sc)): wrong, the high word is bsum_j − 1 whenever
 * the chain's low word is negative (the word split is not a signed decomposition), and no centring
 * keeps a 32-input chain in 0..32767; (2) vpmulld by sc on uncentred chains instead of vpdpwssd + put
 * back: one op fewer per sub-block here, but vpmulld is two uops on Intel; not measured; (3) the
 * transposes' cross-lane stages done by 128-bit loads (vinserti32x4 from memory, then 8 unpacks per
 * 4 vectors): T = 3 415 → 430, T = 4 490 → 510 (masked vbroadcasti32x4 instead of the inserts: worse,
 * +0.6 cycle each against vpdpbusd); (4) software pipelining, each half block's transpose placed among
 * the previous half's chains (the header of the next block computed in between): T = 1 280 → 370–450,
 * T = 4 490 → 560–650 (spills: GCC keeps the transpose state in memory); (5) lane rows S = 4, 8, 32
 * instead of 16 (DRAM, one thread, n = 4): 1.12–1.33× the time of 16; (6) prefetch distances (L1 1–4
 * blocks ahead, an L2 hint 4–16 ahead): within noise (±10 %) at two threads; huge pages (THP) for
 * the weights: best calls −10 %, means within noise. */
#define HYMT_Q4_K_LANE_ROWS 16
#define HYMT_Q4_K_ROWS_AHEAD 2
typedef struct {
    __m512i sc[8];  /* lane r: the int16 pair (sc(j), 0) of row r */
    __m512i sc8[4]; /* lane r: 8·sc(2i) | 8·sc(2i+1) << 16 */
    __m512i mn[4];  /* lane r: m(2i) | m(2i+1) << 16 */
    __m512 d, ndmin;
} hymt_q4_k_rowscales;

/* The header vectors of one block of a tile (lane r = row at blk + ro[r]). */
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_q4_k_rowscales_avx512(const uint8_t *blk, const size_t ro[16],
                                                               hymt_q4_k_rowscales *hs) {
    const __m512i k3f = _mm512_set1_epi8(0x3f), k0f = _mm512_set1_epi8(0x0f), k03 = _mm512_set1_epi8(0x03);
    const __m512i ff = _mm512_set1_epi32(0xff), ff16 = _mm512_set1_epi32(0xff0000);
    /* Z[q] 128-bit lane l = row q + 4l; after the 4×4 transpose lane 4l + q = row 4l + q */
    __m512i Z[4];
    for (int q = 0; q < 4; q++) {
        Z[q] = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(blk + ro[q])));
        for (int l = 1; l < 4; l++)
            Z[q] = _mm512_inserti32x4(Z[q], _mm_loadu_si128((const __m128i *)(blk + ro[q + 4 * l])), l);
    }
    const __m512i t0 = _mm512_unpacklo_epi32(Z[0], Z[1]), t1 = _mm512_unpackhi_epi32(Z[0], Z[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(Z[2], Z[3]), t3 = _mm512_unpackhi_epi32(Z[2], Z[3]);
    const __m512i g0 = _mm512_unpacklo_epi64(t0, t2), ga = _mm512_unpackhi_epi64(t0, t2);
    const __m512i gb = _mm512_unpacklo_epi64(t1, t3), gc = _mm512_unpackhi_epi64(t1, t3);
    const __m512i sc03 = _mm512_and_si512(ga, k3f);
    const __m512i sc47 = _mm512_or_si512(_mm512_and_si512(gc, k0f),
                                         _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(ga, 6), k03), 4));
    const __m512i m03 = _mm512_and_si512(gb, k3f);
    const __m512i m47 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(gc, 4), k0f),
                                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(gb, 6), k03), 4));
    for (int j = 0; j < 4; j++) {
        hs->sc[j] = _mm512_and_si512(_mm512_srli_epi32(sc03, 8 * j), ff);
        hs->sc[4 + j] = _mm512_and_si512(_mm512_srli_epi32(sc47, 8 * j), ff);
    }
    for (int i = 0; i < 4; i++)
        hs->sc8[i] = _mm512_slli_epi32(_mm512_or_si512(hs->sc[2 * i], _mm512_slli_epi32(hs->sc[2 * i + 1], 16)), 3);
    hs->mn[0] = _mm512_or_si512(_mm512_and_si512(m03, ff), _mm512_and_si512(_mm512_slli_epi32(m03, 8), ff16));
    hs->mn[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(m03, 16), ff),
                                _mm512_and_si512(_mm512_srli_epi32(m03, 8), ff16));
    hs->mn[2] = _mm512_or_si512(_mm512_and_si512(m47, ff), _mm512_and_si512(_mm512_slli_epi32(m47, 8), ff16));
    hs->mn[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(m47, 16), ff),
                                _mm512_and_si512(_mm512_srli_epi32(m47, 8), ff16));
    hs->d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g0));
    hs->ndmin = _mm512_castsi512_ps(
        _mm512_xor_si512(_mm512_castps_si512(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g0, 16)))),
                         _mm512_set1_epi32((int)0x80000000u)));
}

/* vpdpbusd with the activation dword broadcast from memory ({1to16}): one fused load+dot instead of a
 * broadcast and a dot (GCC does not fold the broadcast into this instruction by itself). */
#define HYMT_Q4_K_DPBUSD_BCST(acc, w, p) \
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)(p)))

/* One block step of a tile for T tokens: lane i < nr reads the block at blk + i·lane_bytes, lanes ≥ nr
 * repeat lane nr − 1; acc[t] (lane = row) += the block's float steps. */
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_q4_k_rows_block(const uint8_t *blk, size_t lane_bytes, int nr,
                                                         const uint8_t *a0, size_t act_stride, const int T,
                                                         __m512 *acc) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    size_t ro[16];
    for (int i = 0; i < 16; i++) ro[i] = (size_t)(i < nr ? i : nr - 1) * lane_bytes;
    hymt_q4_k_rowscales hs __attribute__((aligned(64)));
    __m512i tv[16] __attribute__((aligned(64))); /* the transposed codes of one half block, through L1 */
    hymt_q4_k_rowscales_avx512(blk, ro, &hs);
    __m512i A[HYMT_Q4_K_ROWS_MAX];
    for (int t = 0; t < T; t++) A[t] = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        __m512i x[16]; /* x[i]: code bytes 64h..64h+63 of row i = groups 2h, 2h+1 */
        for (int i = 0; i < 16; i++) x[i] = _mm512_loadu_si512((const void *)(blk + ro[i] + 16 + 64 * h));
        hymt_transpose16_epi32(x, tv);
#pragma GCC unroll 2
        for (int gg = 0; gg < 2; gg++) { /* group 2h + gg: sub-blocks jl (low nibbles), jl + 1 (high) */
            const int jl = 4 * h + 2 * gg;
            __m512i cl[HYMT_Q4_K_ROWS_MAX], chh[HYMT_Q4_K_ROWS_MAX]; /* the two chains of each token */
            for (int t = 0; t < T; t++) {
                const hymt_k8 *a = (const hymt_k8 *)(a0 + (size_t)t * act_stride);
                cl[t] = _mm512_set1_epi32(a->nb8[jl]);
                chh[t] = _mm512_set1_epi32(a->nb8[jl + 1]);
            }
#pragma GCC unroll 8
            for (int e = 0; e < 8; e++) {
                const __m512i v = _mm512_load_si512((const void *)&tv[8 * gg + e]);
                const __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                for (int t = 0; t < T; t++) {
                    const hymt_k8 *a = (const hymt_k8 *)(a0 + (size_t)t * act_stride);
                    HYMT_Q4_K_DPBUSD_BCST(cl[t], lo, a->qs + 4 * (8 * jl + e));
                    HYMT_Q4_K_DPBUSD_BCST(chh[t], hi, a->qs + 4 * (8 * jl + 8 + e));
                }
            }
            for (int t = 0; t < T; t++) {
                A[t] = _mm512_dpwssd_epi32(A[t], cl[t], hs.sc[jl]);
                A[t] = _mm512_dpwssd_epi32(A[t], chh[t], hs.sc[jl + 1]);
            }
        }
    }
    for (int t = 0; t < T; t++) {
        const hymt_k8 *a = (const hymt_k8 *)(a0 + (size_t)t * act_stride);
        __m512i B = _mm512_setzero_si512();
        for (int i = 0; i < 4; i++) {
            const __m512i pair = _mm512_set1_epi32(hymt_k8_bsum_pair(a, i));
            A[t] = _mm512_dpwssd_epi32(A[t], hs.sc8[i], pair);
            B = _mm512_dpwssd_epi32(B, hs.mn[i], pair);
        }
        const __m512 da = _mm512_mul_ps(hs.d, _mm512_cvtepi32_ps(A[t]));
        const __m512 v = _mm512_fmadd_ps(hs.ndmin, _mm512_cvtepi32_ps(B), da);
        acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(a->d), v, acc[t]);
    }
}

/* One super panel (lane q's row at base + q·ls, q < nr) × T tokens: acc lane = row. */
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_q4_k_panel_avx512(const uint8_t *base, size_t ls, int nr, int64_t nb,
                                                           const uint8_t *act, size_t act_stride, const int T,
                                                           float *y, int64_t y_stride, int64_t S, __m512i lanes,
                                                           __mmask16 keep) {
    __m512 acc[HYMT_Q4_K_ROWS_MAX];
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        for (int q = 0; q < nr; q++)
            for (int k = 0; k < HYMT_Q4_K_BYTES; k += 64)
                __builtin_prefetch(base + (size_t)q * ls + (size_t)(b + HYMT_Q4_K_ROWS_AHEAD) * HYMT_Q4_K_BYTES + k, 0, 3);
        hymt_q4_k_rows_block(base + (size_t)b * HYMT_Q4_K_BYTES, ls, nr, act + (size_t)b * sizeof(hymt_k8), act_stride,
                             T, acc);
    }
    for (int t = 0; t < T; t++) hymt_store_lane_rows_avx512(y + t * y_stride, S, lanes, keep, acc[t]);
}

typedef void (*hymt_q4_k_panel_fn)(const uint8_t *base, size_t ls, int nr, int64_t nb, const uint8_t *act,
                                   size_t act_stride, float *y, int64_t y_stride, int64_t S, __m512i lanes,
                                   __mmask16 keep);
#define HYMT_Q4_K_PANEL(N)                                                                                  \
    HYMT_TARGET_AVX512 static void hymt_q4_k_panel_##N(const uint8_t *base, size_t ls, int nr, int64_t nb,   \
                                                       const uint8_t *act, size_t act_stride, float *y,     \
                                                       int64_t y_stride, int64_t S, __m512i lanes,          \
                                                       __mmask16 keep) {                                    \
        hymt_q4_k_panel_avx512(base, ls, nr, nb, act, act_stride, N, y, y_stride, S, lanes, keep);          \
    }
HYMT_Q4_K_PANEL(1)
HYMT_Q4_K_PANEL(2)
HYMT_Q4_K_PANEL(3)
HYMT_Q4_K_PANEL(4)
HYMT_Q4_K_PANEL(5)
HYMT_Q4_K_PANEL(6)
HYMT_Q4_K_PANEL(7)
HYMT_Q4_K_PANEL(8)
#undef HYMT_Q4_K_PANEL
static const hymt_q4_k_panel_fn hymt_q4_k_panels[HYMT_Q4_K_ROWS_MAX] = {
    hymt_q4_k_panel_1, hymt_q4_k_panel_2, hymt_q4_k_panel_3, hymt_q4_k_panel_4,
    hymt_q4_k_panel_5, hymt_q4_k_panel_6, hymt_q4_k_panel_7, hymt_q4_k_panel_8};

/* Rows [r0, r1) × n tokens in super panels (see above), the tokens in passes of up to HYMT_Q4_K_ROWS_MAX
 * over each panel (sizes balanced: 9 = 5 + 4) while its rows are in L1. */
HYMT_TARGET_AVX512 static void hymt_q4_k_rows_avx512(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                     const uint8_t *act, size_t act_stride, int64_t n, int64_t nb,
                                                     float *y, int64_t y_stride) {
    const int64_t passes = (n + HYMT_Q4_K_ROWS_MAX - 1) / HYMT_Q4_K_ROWS_MAX;
    for (int64_t r = r0; r < r1;) {
        const int64_t left = r1 - r;
        const int64_t S = hymt_lane_rows(left, 16, HYMT_Q4_K_LANE_ROWS, 1);
        const int nr = left >= 16 ? 16 : (int)left;
        const size_t ls = (size_t)S * row_bytes; /* from one lane's row to the next lane's */
        const __m512i lanes = hymt_lane_rows_avx512(S);
        const __mmask16 keep = (__mmask16)((1u << nr) - 1);
        for (int64_t i = 0; i < S; i++) {
            const uint8_t *base = w + (size_t)(r + i) * row_bytes; /* lane 0's row of this pass */
            for (int64_t p = 0, t0 = 0; p < passes; p++) {
                const int64_t T = hymt_pass_tokens(n, t0, passes, p);
                hymt_q4_k_panels[T - 1](base, ls, nr, nb, act + (size_t)t0 * act_stride, act_stride,
                                        y + t0 * y_stride + r + i, y_stride, S, lanes, keep);
                t0 += T;
            }
        }
        r += S > 1 ? 16 * S : nr;
    }
}

/* Tiles of 32 rows (two 16-row tiles; 16 at the end of an odd range); per block the tiles are decoded
 * once into L1 and every token of the pass runs over them. While a tile is read, the next one
 * (contiguous: consecutive rows) is prefetched linearly into L2. */
HYMT_TARGET_AVX512 static void hymt_gemm_q4_k_avx512(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                     const uint8_t *act, size_t act_stride, int64_t n,
                                                     int64_t cols, float *y, int64_t y_stride) {
    const int64_t nb = cols / 256;
    if (hymt_q4_k_uses_gemv(n)) {
        hymt_q4_k_gemvs[n - 1](w, row_bytes, r0, r1, act, act_stride, nb, y, y_stride);
        return;
    }
    if (n <= HYMT_Q4_K_ROWPASS_MAX) {
        hymt_q4_k_rows_avx512(w, row_bytes, r0, r1, act, act_stride, n, nb, y, y_stride);
        return;
    }
    hymt_q4_k_tile tl[2] __attribute__((aligned(64)));
    __m512 acc[2 * HYMT_K_PASS]; /* [token of the pass][tile] lane r = row r of the tile */
    for (int64_t t0 = 0; t0 < n; t0 += HYMT_K_PASS) {
        const int np = n - t0 < HYMT_K_PASS ? (int)(n - t0) : HYMT_K_PASS;
        for (int64_t r = r0; r < r1; r += 32) {
            const int rows = r1 - r < 32 ? (int)(r1 - r) : 32, R = rows > 16 ? 2 : 1;
            const int tt = R == 2 ? HYMT_Q4_K_R2_TT : HYMT_K_TT;
            const uint8_t *base = w + (size_t)r * row_bytes;
            const size_t ahead = (size_t)rows * HYMT_Q4_K_BYTES; /* next tile's bytes per block step */
            for (int t = 0; t < 2 * np; t++) acc[t] = _mm512_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *next = base + (size_t)rows * row_bytes + (size_t)b * ahead;
                for (size_t k = 0; k < ahead; k += 64) __builtin_prefetch(next + k, 0, 2);
                for (int i = 0; i < R; i++)
                    hymt_q4_k_tile_avx512(base + (size_t)(16 * i) * row_bytes + b * HYMT_Q4_K_BYTES, row_bytes,
                                          i == 0 ? (rows < 16 ? rows : 16) : rows - 16, &tl[i]);
                const uint8_t *a0 = act + (size_t)t0 * act_stride + (size_t)b * sizeof(hymt_k8);
                for (int t = 0; t < np; t += tt) {
                    const int T = np - t < tt ? np - t : tt;
                    hymt_q4_k_dots[R - 1][T - 1](tl, a0 + (size_t)t * act_stride, act_stride, acc + 2 * t);
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
 * unpacked block. Vector j holds sub-block j's 32 codes in natural order (a 32-byte group's low or high
 * nibbles); pmaddubsw pairs (<= 2·15·127) times (sc, sc) by pmaddwd give sc × 4-input sums in int32. */
HYMT_TARGET_AVX2 static void hymt_gemm_q4_k_avx2(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                 const uint8_t *act, size_t act_stride, int64_t n, int64_t cols,
                                                 float *y, int64_t y_stride) {
    const int64_t nb = cols / 256;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    float acc[HYMT_KQ_SCALAR_TILE]; /* [token of the tile] */
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = w + (size_t)r * row_bytes;
        for (int64_t t0 = 0; t0 < n; t0 += HYMT_KQ_SCALAR_TILE) {
            const int tt = n - t0 < HYMT_KQ_SCALAR_TILE ? (int)(n - t0) : HYMT_KQ_SCALAR_TILE;
            for (int t = 0; t < tt; t++) acc[t] = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = row + b * HYMT_Q4_K_BYTES;
                hymt_kq_prefetch(blk);
                __m256i wv[8], sc[8];
                for (int g = 0; g < 4; g++) {
                    const __m256i q = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * g));
                    wv[2 * g] = _mm256_and_si256(q, m4);
                    wv[2 * g + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                }
                uint64_t scs, mns;
                hymt_q4_k_scale_min_u64(blk + 4, &scs, &mns);
                for (int j = 0; j < 8; j++) sc[j] = _mm256_set1_epi16((short)((scs >> (8 * j)) & 0xff));
                const __m128i mn = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mns));
                const float d = _cvtsh_ss(hymt_load_u16(blk)), dmin = _cvtsh_ss(hymt_load_u16(blk + 2));
                for (int t = 0; t < tt; t++) {
                    const hymt_k8 *g = (const hymt_k8 *)(act + (size_t)(t0 + t) * act_stride) + b;
                    __m256i Av = _mm256_setzero_si256();
                    for (int j = 0; j < 8; j++) {
                        const __m256i q = _mm256_load_si256((const __m256i *)(g->qs + 32 * j));
                        Av = _mm256_add_epi32(Av, _mm256_madd_epi16(_mm256_maddubs_epi16(wv[j], q), sc[j]));
                    }
                    __m128i bm = _mm_madd_epi16(mn, _mm_loadu_si128((const __m128i *)g->bsum));
                    bm = _mm_add_epi32(bm, _mm_shuffle_epi32(bm, 0x4e));
                    bm = _mm_add_epi32(bm, _mm_shuffle_epi32(bm, 0xb1));
                    const int32_t A = hymt_kq_hsum8(Av), B = _mm_cvtsi128_si32(bm);
                    const float v = fmaf(-dmin, (float)B, d * (float)A);
                    acc[t] = fmaf(g->d, v, acc[t]);
                }
            }
            for (int t = 0; t < tt; t++) y[(t0 + t) * y_stride + r] = acc[t];
        }
    }
}
#endif /* HYMT_X86 */

#if defined(HYMT_ARM64)
/* SDOT by lane: one q register of activations holds a chunk's 4 dwords, broadcast lane by lane against
 * 4 rows × 4 codes; the chunk sum is multiplied by sc with an exact int32 multiply-accumulate. */
HYMT_TARGET_DOTPROD static void hymt_gemm_q4_k_dotprod(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                       const uint8_t *act, size_t act_stride, int64_t n,
                                                       int64_t cols, float *y, int64_t y_stride) {
    const int64_t nb = cols / 256;
    hymt_q4_k_tile tl __attribute__((aligned(64)));
    float32x4_t acc[HYMT_K_PASS][4]; /* [token of the pass][rows 4q..4q+3] */
    for (int64_t t0 = 0; t0 < n; t0 += HYMT_K_PASS) {
        const int np = n - t0 < HYMT_K_PASS ? (int)(n - t0) : HYMT_K_PASS;
        for (int64_t r = r0; r < r1; r += 16) {
            const int rows = r1 - r < 16 ? (int)(r1 - r) : 16;
            for (int t = 0; t < np; t++)
                for (int q = 0; q < 4; q++) acc[t][q] = vdupq_n_f32(0.0f);
            for (int64_t b = 0; b < nb; b++) {
                hymt_q4_k_tile_decode(w + (size_t)r * row_bytes + b * HYMT_Q4_K_BYTES, row_bytes, rows, &tl);
                for (int t = 0; t < np; t++) {
                    const hymt_k8 *g = (const hymt_k8 *)(act + (size_t)(t0 + t) * act_stride) + b;
                    const float32x4_t s = vdupq_n_f32(g->d);
                    for (int q = 0; q < 4; q++) {
                        int32x4_t A = vdupq_n_s32(0), B = vdupq_n_s32(0);
                        for (int j = 0; j < 8; j++) {
                            const int32x4_t sc = vld1q_s32(tl.sc[j] + 4 * q);
                            for (int c = 0; c < 2; c++) {
                                const int kd = 8 * j + 4 * c;
                                const int8x16_t a = vld1q_s8(g->qs + 4 * kd);
                                int32x4_t ch = vdupq_n_s32(0);
                                ch = vdotq_laneq_s32(ch, vld1q_s8((const int8_t *)tl.v[kd] + 16 * q), a, 0);
                                ch = vdotq_laneq_s32(ch, vld1q_s8((const int8_t *)tl.v[kd + 1] + 16 * q), a, 1);
                                ch = vdotq_laneq_s32(ch, vld1q_s8((const int8_t *)tl.v[kd + 2] + 16 * q), a, 2);
                                ch = vdotq_laneq_s32(ch, vld1q_s8((const int8_t *)tl.v[kd + 3] + 16 * q), a, 3);
                                A = vmlaq_s32(A, ch, sc);
                            }
                        }
                        for (int i = 0; i < 4; i++) {
                            const int32x4_t m = vld1q_s32(tl.mn[i] + 4 * q);
                            B = vmlaq_n_s32(B, vandq_s32(m, vdupq_n_s32(0xffff)), g->bsum[2 * i]);
                            B = vmlaq_n_s32(B, vshrq_n_s32(m, 16), g->bsum[2 * i + 1]);
                        }
                        float32x4_t v = vfmaq_f32(vmulq_f32(vld1q_f32(tl.d + 4 * q), vcvtq_f32_s32(A)),
                                                  vld1q_f32(tl.ndmin + 4 * q), vcvtq_f32_s32(B));
                        acc[t][q] = vfmaq_f32(acc[t][q], s, v);
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
static void hymt_gemm_q4_k_neon(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1, const uint8_t *act,
                                size_t act_stride, int64_t n, int64_t cols, float *y, int64_t y_stride) {
    if (hymt_cpu()->dotprod)
        hymt_gemm_q4_k_dotprod(w, row_bytes, r0, r1, act, act_stride, n, cols, y, y_stride);
    else
        hymt_gemm_q4_k_scalar(w, row_bytes, r0, r1, act, act_stride, n, cols, y, y_stride);
}
#endif /* HYMT_ARM64 */

#if defined(HYMT_HAVE_AMX)
/* ---- AMX tiles (amx.h) for batched products: n >= HYMT_Q4_K_AMX_MIN under the avx512 family ----------
 * The same exact A and B per (row, token, block) as the definition, then the same two float steps, so
 * the same bits as the scalar reference and the vector kernels. A is formed on tiles as
 * C[token][row] += act[token][k] · W[k][row] over the whole block (K = 256):
 *
 *   A = Σ_k q[k] · q4[k] · sc(j(k)), split as sc = (sc & 7) + 8 · (sc >> 3) because q4 · sc (<= 945) does
 *       not fit a byte: C0 against q4 × (sc & 7), C1 against q4 × (sc >> 3) (both <= 105), A = C0 + 8 C1
 *       (exact int32, |A| < 2^31 as in the definition);
 *   B = Σ_j m(j) · bsum_j in vector registers (lane = row), as the vector kernel does: four vpdpwssd of
 *       int16 pairs (m(2i), m(2i+1)) · (bsum_2i, bsum_2i+1).
 * Each 16-row tile of a block is decoded once (hymt_q4_k_amx_tile) and serves every token of the pass.
 * Tokens go in tiles of 16, activations tile-loaded straight from the prepared buffer (act_stride apart);
 * from 32 tokens on the last n % 16 tokens are copied once per call into a zero-padded buffer (nothing
 * is read past n); a smaller call's token tiles have only their live rows (hymt_amx_configure_tokens). Two
 * pairs of accumulator tiles alternate so that the tile products of token tile k + 1 can run while the
 * vector units finish token tile k. Below HYMT_Q4_K_AMX_MIN tokens the per-block decode (a 16-row
 * transpose and the scaled copies) costs more than the tiles save: on the 1.8B shapes at 2 threads from
 * DRAM, µs per call, vector (register row tiles in passes of up to 8 tokens) against n-row tiles: n = 8
 * 247 / 347, 9 317 / 354, 12 374 / 374, 15 449 / 392, 16 447 / 406 (with 16-row tiles for every n
 * below 16, tiles won only from 16 tokens: n = 9 394, 12 421, 15 440).
 * Tried and not kept: two token tiles per load of the B tiles (tiles 0..3 the two tiles' C0, C1, eight B
 * loads per two token tiles instead of sixteen): 392–410 vs 403–411 ticks per 16 × 16 × 256 at n = 64
 * with the weights in L2, 496–565 vs 535–544 from L3, 346–377 vs 367–381 at n = 256 (rdtsc, one thread,
 * min of repeated calls): a tie. Removing parts one at a time (n = 64, L2) costs roughly: float steps 110
 * ticks, the decode 90 (a quarter of it per token tile), products 85, tile loads 120, stores 30. */
#define HYMT_Q4_K_AMX_MIN 13
/* Tokens per pass over the weights (bounds the float accumulators on the stack: 16 KiB). */
#define HYMT_Q4_K_AMX_PASS 256

/* B operands of one block of a 16-row tile ("VNNI" order: 4 consecutive k of one row per dword) and the
 * per-row values of the vector steps, 8576 bytes. Rows past the end of the range repeat the last row
 * (their lanes are never stored). */
typedef struct {
    uint8_t w1[64][64]; /* w1[kd][4r + e] = q4 × (sc & 7) of row r at input 4kd + e */
    uint8_t w2[64][64]; /* w2[kd][4r + e] = q4 × (sc >> 3) */
    int32_t mn[4][16];  /* mn[i][r] = m(2i) | m(2i+1) << 16 of row r: an int16 pair */
    float d[16];        /* d of row r */
    float ndmin[16];    /* −dmin of row r */
} hymt_q4_k_amx_tile;

/* Decode block blk0 (row 0 of the tile) .. blk0 + (rows − 1) · row_bytes into tl. */
HYMT_TARGET_AMX HYMT_INLINE void hymt_q4_k_amx_decode(const uint8_t *blk0, size_t row_bytes, int rows,
                                                      hymt_q4_k_amx_tile *tl) {
    const __m512i lane = _mm512_min_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32(rows - 1));
    const __m512i offs = _mm512_mullo_epi32(lane, _mm512_set1_epi32((int)row_bytes));
    __m512i g0, sc03, sc47, m03, m47;
    hymt_q4_k_scales16(blk0, offs, &g0, &sc03, &sc47, &m03, &m47);
    /* per sub-block j, lane r: (sc & 7) and (sc >> 3) in both int16 halves, the multipliers of the codes
     * (a code byte times <= 7 stays below 256, so one vpmullw multiplies both bytes of a word exactly) */
    const __m512i ff = _mm512_set1_epi32(0xff), k7 = _mm512_set1_epi32(7), pair = _mm512_set1_epi32(0x00010001);
    __m512i lo[8], hi[8];
    for (int j = 0; j < 8; j++) {
        const __m512i sc = _mm512_and_si512(_mm512_srli_epi32(j < 4 ? sc03 : sc47, 8 * (j % 4)), ff);
        lo[j] = _mm512_mullo_epi32(_mm512_and_si512(sc, k7), pair);
        hi[j] = _mm512_mullo_epi32(_mm512_srli_epi32(sc, 3), pair);
    }
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int h = 0; h < 2; h++) {
        __m512i x[16], t[16]; /* x[r]: bytes 64h..64h+63 of row r's codes = groups 2h, 2h+1 */
        for (int r = 0; r < 16; r++) {
            const uint8_t *p = blk0 + (size_t)(r < rows ? r : rows - 1) * row_bytes;
            x[r] = _mm512_loadu_si512((const void *)(p + 16 + 64 * h));
        }
        hymt_transpose16_epi32(x, t);
        /* byte l of 32-byte group g: low nibble = input 64g + l (sub-block 2g), high = 64g + 32 + l (2g + 1) */
        for (int k = 0; k < 16; k++) {
            const int g = 2 * h + k / 8, kd = 16 * g + k % 8;
            const __m512i cl = _mm512_and_si512(t[k], m4), ch = _mm512_and_si512(_mm512_srli_epi16(t[k], 4), m4);
            _mm512_store_si512((void *)tl->w1[kd], _mm512_mullo_epi16(cl, lo[2 * g]));
            _mm512_store_si512((void *)tl->w2[kd], _mm512_mullo_epi16(cl, hi[2 * g]));
            _mm512_store_si512((void *)tl->w1[kd + 8], _mm512_mullo_epi16(ch, lo[2 * g + 1]));
            _mm512_store_si512((void *)tl->w2[kd + 8], _mm512_mullo_epi16(ch, hi[2 * g + 1]));
        }
    }
    hymt_q4_k_store_mins_d(m03, m47, g0, tl->mn, tl->d, tl->ndmin);
}

/* C0, C1 of one token tile (16 activation rows at `at`, `stride` apart) against tl into accumulator tiles
 * TC0, TC1 (activations in tile TA, B operands in 6, 7). Tile numbers are literals: the intrinsics paste
 * them into the instruction. */
#define HYMT_Q4_K_AMX_PRODUCTS(TC0, TC1, TA, tl, at, stride)                                                \
    do {                                                                                                    \
        _tile_zero(TC0);                                                                                    \
        _tile_zero(TC1);                                                                                    \
        for (int q_ = 0; q_ < 4; q_++) { /* inputs 64q .. 64q + 63 */                                       \
            _tile_loadd(6, (tl)->w1[16 * q_], 64);                                                          \
            _tile_loadd(7, (tl)->w2[16 * q_], 64);                                                          \
            _tile_loadd(TA, (at) + 64 * q_, (stride));                                                      \
            _tile_dpbssd(TC0, TA, 6);                                                                       \
            _tile_dpbssd(TC1, TA, 7);                                                                       \
        }                                                                                                   \
    } while (0)

/* Tiles: 0, 1 and 2, 3 the sums C0, C1 [16 tokens][16 rows] int32 of two token tiles in turn; 4, 5 their
 * activations [16 tokens][64 bytes]; 6, 7 the B operands [16 k-quads][64 bytes]. */
HYMT_TARGET_AMX static void hymt_gemm_q4_k_amx(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                               const uint8_t *act, size_t act_stride, int64_t n, int64_t cols,
                                               float *y, int64_t y_stride) {
    const int64_t nb = cols / 256;
    hymt_q4_k_amx_tile tl __attribute__((aligned(64)));
    int32_t c[2][2][16][16] __attribute__((aligned(64))); /* C0, C1 read back: [pair][C][token][row] */
    float acc[HYMT_Q4_K_AMX_PASS][16] __attribute__((aligned(64))); /* [token of the pass][row of the tile] */
    /* tail: [nb][16][256] the activations of the last n % 16 tokens, zero-padded to a whole token tile */
    const int tail_tokens = (int)(n - hymt_amx_tokens_in_place(n));
    int8_t *tail = NULL;
    if (tail_tokens > 0) {
        if ((tail = (int8_t *)aligned_alloc(64, (size_t)nb * 16 * 256)) == NULL) {
            hymt_gemm_q4_k_avx512(w, row_bytes, r0, r1, act, act_stride, n, cols, y, y_stride);
            return;
        }
        memset(tail, 0, (size_t)nb * 16 * 256);
        for (int i = 0; i < tail_tokens; i++)
            for (int64_t b = 0; b < nb; b++)
                memcpy(tail + ((size_t)b * 16 + i) * 256,
                       ((const hymt_k8 *)(act + (size_t)(n - tail_tokens + i) * act_stride) + b)->qs, 256);
    }
    hymt_amx_configure_tokens(n);
    for (int64_t t0 = 0; t0 < n; t0 += HYMT_Q4_K_AMX_PASS) {
        const int np = n - t0 < HYMT_Q4_K_AMX_PASS ? (int)(n - t0) : HYMT_Q4_K_AMX_PASS;
        const int ntt = (np + 15) / 16;
        for (int64_t r = r0; r < r1; r += 16) {
            const int rows = r1 - r < 16 ? (int)(r1 - r) : 16;
            const uint8_t *base = w + (size_t)r * row_bytes;
            const size_t ahead = (size_t)rows * HYMT_Q4_K_BYTES; /* the next tile's bytes per block step */
            for (int t = 0; t < np; t++) _mm512_store_ps(acc[t], _mm512_setzero_ps());
            for (int64_t b = 0; b < nb; b++) {
                /* the next row tile, read linearly into L2 while this one is computed */
                const uint8_t *next = base + (size_t)rows * row_bytes + (size_t)b * ahead;
                for (size_t k = 0; k < ahead; k += 64) __builtin_prefetch(next + k, 0, 2);
                hymt_q4_k_amx_decode(base + (size_t)b * HYMT_Q4_K_BYTES, row_bytes, rows, &tl);
                const __m512 d = _mm512_load_ps(tl.d), ndmin = _mm512_load_ps(tl.ndmin);
                __m512i mn[4];
                for (int i = 0; i < 4; i++) mn[i] = _mm512_load_si512((const void *)tl.mn[i]);
                const uint8_t *a0 = act + (size_t)t0 * act_stride + (size_t)b * sizeof(hymt_k8);
                for (int k = 0; k <= ntt; k++) {
                    /* products of token tile k, the vector steps of token tile k − 1 (read back before), then
                     * the store of k: the tile unit and the vector units work side by side */
                    if (k < ntt) {
                        const int whole = tail_tokens == 0 || 16 * k + 16 <= np;
                        const uint8_t *at = whole ? a0 + (size_t)(16 * k) * act_stride
                                                  : (const uint8_t *)tail + (size_t)b * 16 * 256;
                        const size_t stride = whole ? act_stride : 256;
                        if (k % 2 == 0)
                            HYMT_Q4_K_AMX_PRODUCTS(0, 1, 4, &tl, at, stride);
                        else
                            HYMT_Q4_K_AMX_PRODUCTS(2, 3, 5, &tl, at, stride);
                    }
                    if (k > 0) {
                        const int t = 16 * (k - 1), T = np - t < 16 ? np - t : 16;
                        int32_t(*cp)[16][16] = c[(k - 1) % 2];
                        for (int i = 0; i < T; i++) {
                            const hymt_k8 *g = (const hymt_k8 *)(a0 + (size_t)(t + i) * act_stride);
                            const __m512i A = _mm512_add_epi32(_mm512_load_si512((const void *)cp[0][i]),
                                                               _mm512_slli_epi32(_mm512_load_si512((const void *)cp[1][i]), 3));
                            __m512i B = _mm512_setzero_si512();
                            for (int j = 0; j < 4; j++)
                                B = _mm512_dpwssd_epi32(B, mn[j], _mm512_set1_epi32(hymt_k8_bsum_pair(g, j)));
                            const __m512 v = _mm512_fmadd_ps(ndmin, _mm512_cvtepi32_ps(B), _mm512_mul_ps(d, _mm512_cvtepi32_ps(A)));
                            _mm512_store_ps(acc[t + i], _mm512_fmadd_ps(_mm512_set1_ps(g->d), v, _mm512_load_ps(acc[t + i])));
                        }
                    }
                    if (k < ntt && k % 2 == 0) {
                        _tile_stored(0, c[0][0], 64);
                        _tile_stored(1, c[0][1], 64);
                    } else if (k < ntt) {
                        _tile_stored(2, c[1][0], 64);
                        _tile_stored(3, c[1][1], 64);
                    }
                }
            }
            const __mmask16 keep = (__mmask16)((1u << rows) - 1);
            for (int t = 0; t < np; t++) _mm512_mask_storeu_ps(y + (t0 + t) * y_stride + r, keep, _mm512_load_ps(acc[t]));
        }
    }
    hymt_amx_release();
    free(tail);
}
#undef HYMT_Q4_K_AMX_PRODUCTS

/* The avx512 entry of the format: tiles for batches when AMX is on, else the vector kernel (same bits). */
HYMT_TARGET_AVX512 static void hymt_gemm_q4_k_avx512_amx(const uint8_t *w, size_t row_bytes, int64_t r0,
                                                         int64_t r1, const uint8_t *act, size_t act_stride,
                                                         int64_t n, int64_t cols, float *y, int64_t y_stride) {
    if (n >= HYMT_Q4_K_AMX_MIN && hymt_amx_active())
        hymt_gemm_q4_k_amx(w, row_bytes, r0, r1, act, act_stride, n, cols, y, y_stride);
    else
        hymt_gemm_q4_k_avx512(w, row_bytes, r0, r1, act, act_stride, n, cols, y, y_stride);
}
#endif /* HYMT_HAVE_AMX */

static const hymt_format HYMT_FORMAT_Q4_K = {
    "Q4_K",
    256,
    HYMT_Q4_K_BYTES,
    hymt_decode_q4_k,
    hymt_row_dot_f32_q4_k,
    hymt_prepare_k8,
    hymt_act_stride_k8,
    {
        hymt_gemm_q4_k_scalar,
#if defined(HYMT_HAVE_AMX)
        hymt_gemm_q4_k_avx2,
        hymt_gemm_q4_k_avx512_amx,
#elif defined(HYMT_X86)
        hymt_gemm_q4_k_avx2,
        hymt_gemm_q4_k_avx512,
#else
        NULL,
        NULL,
#endif
#if defined(HYMT_ARM64)
        hymt_gemm_q4_k_neon,
#else
        NULL,
#endif
    },
};

#endif /* HYMT_FMT_Q4_K_H */
