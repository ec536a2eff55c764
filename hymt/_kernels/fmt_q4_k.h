/* fmt_q4_k.h — Q4_K (REFERENCE.md §2.3): 256 weights in 144 bytes: fp16 d, fp16 dmin, 12 bytes of
 * packed 6-bit scales/mins for 8 sub-blocks of 32, 128 bytes of 4-bit codes. Sub-block j has
 * w = (d × f32(sc(j))) × f32(q) − dmin × f32(m(j)), q in 0..15.
 *
 * int8 path (§3.4, activation groups of 256 = one block; kq layout of kquant_common.h). Lanes are the
 * sixteen 16-weight chunks L; chunk L lies in sub-block L/2. For one row and one token, with s the
 * activation scale of block b's group, q the int8 activations and bsum_L = Σ q over chunk L:
 *
 *   acc[16] = 0
 *   for each block b, chunk L = 0..15 (j = L / 2):
 *       isum_L = Σ_{i<16} q4[16L+i] · q[16L+i]                                    (exact int32)
 *       acc[L] = fma((d × f32(sc(j))) × s, f32(isum_L), acc[L])
 *       acc[L] = fma(−(dmin × f32(m(j))), f32(bsum_L) × s, acc[L])          (the min term)
 *   y = hymt_kq_tree16(acc)
 *
 * f32(bsum_L) × s is prepared once per token (hymt_kq8.bsd), d × sc and dmin × m once per block.
 * The 4-bit codes are the unsigned operand of vpdpbusd / pmaddubsw / sdot.
 *
 * Float path: decode each block into 256 floats and dot it with its input slice (hymt_dot_f32). */
#ifndef HYMT_FMT_Q4_K_H
#define HYMT_FMT_Q4_K_H

#include "kquant_common.h"

#define HYMT_Q4_K_BYTES 144

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

/* The same 16 bytes with 32-bit word operations (byte lanes of each word follow the rules above). */
HYMT_INLINE void hymt_q4_k_scale_min_words(const uint8_t *S, uint32_t out[4]) {
    uint32_t a, b, c;
    memcpy(&a, S, 4);     /* S[0..4)  */
    memcpy(&b, S + 4, 4); /* S[4..8)  */
    memcpy(&c, S + 8, 4); /* S[8..12) */
    out[0] = a & 0x3f3f3f3fu;                                               /* sc(0..3) */
    out[1] = (c & 0x0f0f0f0fu) | (((a >> 6) & 0x03030303u) << 4);          /* sc(4..7) */
    out[2] = b & 0x3f3f3f3fu;                                               /* m(0..3)  */
    out[3] = ((c >> 4) & 0x0f0f0f0fu) | (((b >> 6) & 0x03030303u) << 4);   /* m(4..7)  */
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

static void hymt_gemm_q4_k_scalar(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                  const uint8_t *act, size_t act_stride, int64_t n, int64_t cols, float *y,
                                  int64_t y_stride) {
    const int64_t nb = cols / 256;
    uint8_t codes[256], sm[16];
    float acc[HYMT_KQ_SCALAR_TILE][16]; /* [token][chunk lane] */
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = w + (size_t)r * row_bytes;
        for (int64_t t0 = 0; t0 < n; t0 += HYMT_KQ_SCALAR_TILE) {
            int64_t tt = n - t0 < HYMT_KQ_SCALAR_TILE ? n - t0 : HYMT_KQ_SCALAR_TILE;
            memset(acc, 0, sizeof acc);
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = row + b * HYMT_Q4_K_BYTES;
                float d = hymt_fp16_to_f32(hymt_load_u16(blk));
                float dmin = hymt_fp16_to_f32(hymt_load_u16(blk + 2));
                hymt_q4_k_scale_min(blk + 4, sm);
                hymt_q4_k_codes(blk, codes);
                for (int64_t t = 0; t < tt; t++) {
                    const hymt_kq8 *g = (const hymt_kq8 *)(act + (size_t)(t0 + t) * act_stride) + b;
                    for (int L = 0; L < 16; L++) {
                        int32_t isum = 0;
                        for (int i = 16 * L; i < 16 * L + 16; i++) isum += (int32_t)codes[i] * hymt_kq_act(g->qs, i);
                        float scale = (d * (float)sm[L / 2]) * g->d;
                        float mn = dmin * (float)sm[8 + L / 2];
                        acc[t][L] = fmaf(scale, (float)isum, acc[t][L]);
                        acc[t][L] = fmaf(-mn, g->bsd[L], acc[t][L]);
                    }
                }
            }
            for (int64_t t = 0; t < tt; t++) y[(t0 + t) * y_stride + r] = hymt_kq_tree16(acc[t]);
        }
    }
}

#if defined(HYMT_X86)
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_q4_k_unpack_avx512(const uint8_t *blk, const __m512i s1[4],
                                                            const __m512i s2[2], __m512i wq[4], __m512 *dsc,
                                                            __m512 *dmn) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i z0 = _mm512_loadu_si512((const void *)(blk + 16)); /* sub-blocks 0-1 | 2-3 (low | high) */
    __m512i z1 = _mm512_loadu_si512((const void *)(blk + 80));
    hymt_kq_transpose_avx512(s1, s2, _mm512_and_si512(z0, m4), _mm512_and_si512(_mm512_srli_epi16(z0, 4), m4),
                             _mm512_and_si512(z1, m4), _mm512_and_si512(_mm512_srli_epi16(z1, 4), m4), wq);
    uint32_t sm[4];
    hymt_q4_k_scale_min_words(blk + 4, sm);
    __m128i v = _mm_set_epi32((int)sm[3], (int)sm[2], (int)sm[1], (int)sm[0]);
    __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(v, v))); /* sc(L/2) */
    __m512 mn = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(v, v))); /* m(L/2) */
    *dsc = _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(hymt_load_u16(blk))), sc);
    *dmn = _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(hymt_load_u16(blk + 2))), mn);
}

/* One row × the tokens [0, tt) of a token tile, over all blocks; acc [tt]. The path for few tokens
 * (n < HYMT_KQ_BATCH_MIN), where streaming the weights dominates: one sequential stream per thread. */
HYMT_TARGET_AVX512 static void hymt_q4_k_row_avx512(const uint8_t *row, const hymt_kq8 *a0, size_t act_stride, int tt,
                                                    int64_t nb, const __m512i s1[4], const __m512i s2[2],
                                                    __m512 *acc) {
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * HYMT_Q4_K_BYTES;
        hymt_kq_prefetch(blk);
        __m512i wq[4];
        __m512 dsc, dmn;
        hymt_q4_k_unpack_avx512(blk, s1, s2, wq, &dsc, &dmn);
        const hymt_kq8 *g = a0 + b;
        for (int t = 0; t < tt; t++, g = (const hymt_kq8 *)((const uint8_t *)g + act_stride)) {
            __m512i isum = _mm512_setzero_si512();
            for (int v = 0; v < 4; v++)
                isum = _mm512_dpbusd_epi32(isum, wq[v], _mm512_loadu_si512((const void *)(g->qs + 64 * v)));
            __m512 scale = _mm512_mul_ps(dsc, _mm512_set1_ps(g->d));
            __m512 a = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(isum), acc[t]);
            acc[t] = _mm512_fnmadd_ps(dmn, _mm512_loadu_ps(g->bsd), a);
        }
    }
}

HYMT_TARGET_AVX512 static void hymt_gemm_q4_k_avx512(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                     const uint8_t *act, size_t act_stride, int64_t n,
                                                     int64_t cols, float *y, int64_t y_stride) {
    /* chunks of (codes & 15) and (codes >> 4) of each 64-byte half of qs, in dword order */
    static const int chunks[4][4] = {{0, 1, 4, 5}, {2, 3, 6, 7}, {8, 9, 12, 13}, {10, 11, 14, 15}};
    int32_t t1[4][16], t2[2][16];
    hymt_kq_perm_build(chunks, t1, t2);
    __m512i s1[4], s2[2];
    for (int i = 0; i < 4; i++) s1[i] = _mm512_loadu_si512((const void *)t1[i]);
    for (int i = 0; i < 2; i++) s2[i] = _mm512_loadu_si512((const void *)t2[i]);

    const int64_t nb = cols / 256;
    if (n >= HYMT_KQ_BATCH_MIN) {
        /* u: [HYMT_KQ_PANEL][nb] rows unpacked once for all n tokens */
        hymt_kq_unpacked *u = (hymt_kq_unpacked *)aligned_alloc(64, (size_t)HYMT_KQ_PANEL * nb * sizeof *u);
        if (u != NULL) {
            for (int64_t r = r0; r < r1; r += HYMT_KQ_PANEL) {
                const int R = r1 - r < HYMT_KQ_PANEL ? (int)(r1 - r) : HYMT_KQ_PANEL;
                for (int i = 0; i < R; i++)
                    for (int64_t b = 0; b < nb; b++) {
                        const uint8_t *blk = w + (size_t)(r + i) * row_bytes + b * HYMT_Q4_K_BYTES;
                        hymt_kq_prefetch(blk);
                        hymt_kq_unpacked *ub = &u[i * nb + b];
                        hymt_q4_k_unpack_avx512(blk, s1, s2, ub->wq, &ub->dsc, &ub->dmn);
                    }
                hymt_kq_panel_avx512(u, R, nb, act, act_stride, n, y + r, y_stride, 1);
            }
            free(u);
            return;
        }
    }
    __m512 acc[HYMT_KQ_TT]; /* [token] 16 chunk lanes */
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t t0 = 0; t0 < n; t0 += HYMT_KQ_TT) {
            const int tt = n - t0 < HYMT_KQ_TT ? (int)(n - t0) : HYMT_KQ_TT;
            for (int t = 0; t < tt; t++) acc[t] = _mm512_setzero_ps();
            const hymt_kq8 *a0 = (const hymt_kq8 *)(act + (size_t)t0 * act_stride);
            hymt_q4_k_row_avx512(w + (size_t)r * row_bytes, a0, act_stride, tt, nb, s1, s2, acc);
            for (int t = 0; t < tt; t++) y[(t0 + t) * y_stride + r] = hymt_hsum512(acc[t]);
        }
    }
}

HYMT_TARGET_AVX2 HYMT_INLINE void hymt_q4_k_unpack_avx2(const uint8_t *blk, __m256i wq[4][2], __m256 dsc[2],
                                                        __m256 dmn[2]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i nat[8]; /* chunk pairs (0,1), (2,3), ..., (14,15) */
    for (int k = 0; k < 4; k++) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * k)); /* sub-blocks 2k | 2k+1 */
        nat[2 * k] = _mm256_and_si256(q, m4);
        nat[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    }
    hymt_kq_transpose_avx2(nat, wq);
    uint32_t sm[4];
    hymt_q4_k_scale_min_words(blk + 4, sm);
    __m128i v = _mm_set_epi32((int)sm[3], (int)sm[2], (int)sm[1], (int)sm[0]);
    __m128i sc = _mm_unpacklo_epi8(v, v), mn = _mm_unpackhi_epi8(v, v);
    __m256 d = _mm256_set1_ps(_cvtsh_ss(hymt_load_u16(blk)));
    __m256 dmin = _mm256_set1_ps(_cvtsh_ss(hymt_load_u16(blk + 2)));
    dsc[0] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc)));
    dsc[1] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sc, 8))));
    dmn[0] = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mn)));
    dmn[1] = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(mn, 8))));
}

HYMT_TARGET_AVX2 static void hymt_gemm_q4_k_avx2(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                 const uint8_t *act, size_t act_stride, int64_t n, int64_t cols,
                                                 float *y, int64_t y_stride) {
    const int64_t nb = cols / 256;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[HYMT_KQ_RT][HYMT_KQ_TT][2]; /* [row][token][lanes 0-7 | 8-15] */
    const int rt_max = hymt_kq_row_tile(n);
    for (int64_t r = r0; r < r1; r += rt_max) {
        const int rt = r1 - r < rt_max ? (int)(r1 - r) : rt_max;
        for (int64_t t0 = 0; t0 < n; t0 += HYMT_KQ_TT) {
            const int tt = n - t0 < HYMT_KQ_TT ? (int)(n - t0) : HYMT_KQ_TT;
            for (int i = 0; i < rt; i++)
                for (int t = 0; t < tt; t++) acc[i][t][0] = acc[i][t][1] = _mm256_setzero_ps();
            const hymt_kq8 *a0 = (const hymt_kq8 *)(act + (size_t)t0 * act_stride);
            for (int64_t b = 0; b < nb; b++) {
                for (int i = 0; i < rt; i++) {
                    const uint8_t *blk = w + (size_t)(r + i) * row_bytes + b * HYMT_Q4_K_BYTES;
                    hymt_kq_prefetch(blk);
                    __m256i wq[4][2];
                    __m256 dsc[2], dmn[2];
                    hymt_q4_k_unpack_avx2(blk, wq, dsc, dmn);
                    const hymt_kq8 *g = a0 + b;
                    for (int t = 0; t < tt; t++, g = (const hymt_kq8 *)((const uint8_t *)g + act_stride)) {
                        const __m256 s = _mm256_set1_ps(g->d);
                        for (int h = 0; h < 2; h++) {
                            /* |Σ of 8 code·q products| <= 8·15·127 = 15240: one int16 sum of all four */
                            __m256i p = _mm256_setzero_si256();
                            for (int v = 0; v < 4; v++) {
                                __m256i q = _mm256_loadu_si256((const __m256i *)(g->qs + 64 * v + 32 * h));
                                p = _mm256_add_epi16(p, _mm256_maddubs_epi16(wq[v][h], q));
                            }
                            __m256i isum = _mm256_madd_epi16(p, ones);
                            __m256 scale = _mm256_mul_ps(dsc[h], s);
                            __m256 a = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(isum), acc[i][t][h]);
                            acc[i][t][h] = _mm256_fnmadd_ps(dmn[h], _mm256_loadu_ps(g->bsd + 8 * h), a);
                        }
                    }
                }
            }
            for (int i = 0; i < rt; i++)
                for (int t = 0; t < tt; t++)
                    y[(t0 + t) * y_stride + r + i] = hymt_kq_tree16_avx2(acc[i][t][0], acc[i][t][1]);
        }
    }
}
#endif /* HYMT_X86 */

#if defined(HYMT_ARM64)
HYMT_TARGET_DOTPROD HYMT_INLINE void hymt_q4_k_unpack_neon(const uint8_t *blk, int8x16_t wq[4][4],
                                                          float32x4_t dsc[4], float32x4_t dmn[4]) {
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    int8x16_t chunk[16];
    for (int i = 0; i < 8; i++) {
        uint8x16_t q = vld1q_u8(blk + 16 + 16 * i); /* sub-block i/2 bytes 16(i%2).. */
        chunk[4 * (i / 2) + (i % 2)] = vreinterpretq_s8_u8(vandq_u8(q, m4));
        chunk[4 * (i / 2) + 2 + (i % 2)] = vreinterpretq_s8_u8(vshrq_n_u8(q, 4));
    }
    hymt_kq_transpose_neon(chunk, wq);
    uint8_t sm[16];
    hymt_q4_k_scale_min(blk + 4, sm);
    float32x4_t d = vdupq_n_f32(hymt_fp16_to_f32(hymt_load_u16(blk)));
    float32x4_t dmin = vdupq_n_f32(hymt_fp16_to_f32(hymt_load_u16(blk + 2)));
    for (int k = 0; k < 4; k++) {
        /* lanes 4k..4k+3 are chunks of sub-blocks 2k, 2k, 2k+1, 2k+1 */
        float sc[4] = {(float)sm[2 * k], (float)sm[2 * k], (float)sm[2 * k + 1], (float)sm[2 * k + 1]};
        float mn[4] = {(float)sm[8 + 2 * k], (float)sm[8 + 2 * k], (float)sm[9 + 2 * k], (float)sm[9 + 2 * k]};
        dsc[k] = vmulq_f32(d, vld1q_f32(sc));
        dmn[k] = vmulq_f32(dmin, vld1q_f32(mn));
    }
}

HYMT_TARGET_DOTPROD static void hymt_gemm_q4_k_dotprod(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                       const uint8_t *act, size_t act_stride, int64_t n,
                                                       int64_t cols, float *y, int64_t y_stride) {
    const int64_t nb = cols / 256;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = w + (size_t)r * row_bytes;
        for (int64_t t0 = 0; t0 < n; t0 += HYMT_KQ_TT) {
            const int tt = n - t0 < HYMT_KQ_TT ? (int)(n - t0) : HYMT_KQ_TT;
            float32x4_t acc[HYMT_KQ_TT][4]; /* [token][lanes 4k..4k+3] */
            for (int t = 0; t < tt; t++)
                for (int k = 0; k < 4; k++) acc[t][k] = vdupq_n_f32(0.0f);
            for (int64_t b = 0; b < nb; b++) {
                int8x16_t wq[4][4];
                float32x4_t dsc[4], dmn[4];
                hymt_kq_prefetch(row + b * HYMT_Q4_K_BYTES);
                hymt_q4_k_unpack_neon(row + b * HYMT_Q4_K_BYTES, wq, dsc, dmn);
                for (int t = 0; t < tt; t++) {
                    const hymt_kq8 *g = (const hymt_kq8 *)(act + (size_t)(t0 + t) * act_stride) + b;
                    const float32x4_t s = vdupq_n_f32(g->d);
                    for (int k = 0; k < 4; k++) {
                        int32x4_t isum = vdupq_n_s32(0);
                        for (int v = 0; v < 4; v++) isum = vdotq_s32(isum, wq[v][k], vld1q_s8(g->qs + 64 * v + 16 * k));
                        float32x4_t a = vfmaq_f32(acc[t][k], vmulq_f32(dsc[k], s), vcvtq_f32_s32(isum));
                        acc[t][k] = vfmsq_f32(a, dmn[k], vld1q_f32(g->bsd + 4 * k));
                    }
                }
            }
            for (int t = 0; t < tt; t++)
                y[(t0 + t) * y_stride + r] = hymt_kq_tree16_neon(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
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

static const hymt_format HYMT_FORMAT_Q4_K = {
    "Q4_K",
    256,
    HYMT_Q4_K_BYTES,
    hymt_decode_q4_k,
    hymt_row_dot_f32_q4_k,
    hymt_prepare_kq8,
    hymt_act_stride_kq8,
    {
        hymt_gemm_q4_k_scalar,
#if defined(HYMT_X86)
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
