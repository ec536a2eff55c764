/* fmt_q6_k.h — Q6_K (REFERENCE.md §2.4): 256 weights in 210 bytes: ql[128] low nibbles, qh[64] high
 * 2-bit pairs, sc[16] signed int8 sub-scales, fp16 d at the END. Chunk j (weights 16j..16j+15) has
 * scale d × sc[j]; w = (d × f32(sc[j])) × f32(q − 32) with the 6-bit code q in 0..63.
 *
 * int8 path (§3.4, activation groups of 256 = one block; kq layout of kquant_common.h). For one row
 * and one token, with s the activation scale of block b's group and q the int8 activations:
 *
 *   acc[16] = 0
 *   for each block b, chunk j = 0..15:
 *       isum_j = Σ_{i<16} q6[16j+i] · q[16j+i]  −  32 · Σ_{i<16} q[16j+i]          (exact int32)
 *       acc[j] = fma((d × f32(sc[j])) × s, f32(isum_j), acc[j])
 *   y = hymt_kq_tree16(acc)
 *
 * (The scale is rounded as (d × sc) × s rather than (d × s) × sc: d × sc is computed once per block
 * and shared by every token of a tile.) The codes 0..63 are the unsigned operand of vpdpbusd /
 * pmaddubsw; each lane starts from −32 · Σq (prepared once per token), so the lane ends at isum_j.
 *
 * Float path: decode each block into 256 floats and dot it with its input slice (hymt_dot_f32). */
#ifndef HYMT_FMT_Q6_K_H
#define HYMT_FMT_Q6_K_H

#include "kquant_common.h"

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

static void hymt_gemm_q6_k_scalar(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                  const uint8_t *act, size_t act_stride, int64_t n, int64_t cols, float *y,
                                  int64_t y_stride) {
    const int64_t nb = cols / 256;
    uint8_t codes[256];
    float acc[HYMT_KQ_SCALAR_TILE][16]; /* [token][chunk lane] */
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = w + (size_t)r * row_bytes;
        for (int64_t t0 = 0; t0 < n; t0 += HYMT_KQ_SCALAR_TILE) {
            int64_t tt = n - t0 < HYMT_KQ_SCALAR_TILE ? n - t0 : HYMT_KQ_SCALAR_TILE;
            memset(acc, 0, sizeof acc);
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = row + b * HYMT_Q6_K_BYTES;
                const int8_t *sc = (const int8_t *)(blk + 192);
                float d = hymt_fp16_to_f32(hymt_load_u16(blk + 208));
                hymt_q6_k_codes(blk, codes);
                for (int64_t t = 0; t < tt; t++) {
                    const hymt_kq8 *g = (const hymt_kq8 *)(act + (size_t)(t0 + t) * act_stride) + b;
                    for (int j = 0; j < 16; j++) {
                        int32_t isum = g->nb32[j];
                        for (int i = 16 * j; i < 16 * j + 16; i++) isum += (int32_t)codes[i] * hymt_kq_act(g->qs, i);
                        float scale = (d * (float)sc[j]) * g->d;
                        acc[t][j] = fmaf(scale, (float)isum, acc[t][j]);
                    }
                }
            }
            for (int64_t t = 0; t < tt; t++) y[(t0 + t) * y_stride + r] = hymt_kq_tree16(acc[t]);
        }
    }
}

#if defined(HYMT_X86)
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_q6_k_unpack_avx512(const uint8_t *blk, const __m512i s1[4],
                                                            const __m512i s2[2], __m512i wq[4], __m512 *dsc) {
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
    __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 192))));
    *dsc = _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(hymt_load_u16(blk + 208))), sc);
}

/* One row × the tokens [0, tt) of a token tile, over all blocks; acc [tt]. The path for few tokens
 * (n < HYMT_KQ_BATCH_MIN), where streaming the weights dominates: one sequential stream per thread. */
HYMT_TARGET_AVX512 static void hymt_q6_k_row_avx512(const uint8_t *row, const hymt_kq8 *a0, size_t act_stride, int tt,
                                                    int64_t nb, const __m512i s1[4], const __m512i s2[2],
                                                    __m512 *acc) {
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * HYMT_Q6_K_BYTES;
        hymt_kq_prefetch(blk);
        __m512i wq[4];
        __m512 dsc;
        hymt_q6_k_unpack_avx512(blk, s1, s2, wq, &dsc);
        const hymt_kq8 *g = a0 + b;
        for (int t = 0; t < tt; t++, g = (const hymt_kq8 *)((const uint8_t *)g + act_stride)) {
            __m512i isum = _mm512_loadu_si512((const void *)g->nb32);
            for (int v = 0; v < 4; v++)
                isum = _mm512_dpbusd_epi32(isum, wq[v], _mm512_loadu_si512((const void *)(g->qs + 64 * v)));
            __m512 scale = _mm512_mul_ps(dsc, _mm512_set1_ps(g->d));
            acc[t] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(isum), acc[t]);
        }
    }
}

HYMT_TARGET_AVX512 static void hymt_gemm_q6_k_avx512(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                     const uint8_t *act, size_t act_stride, int64_t n,
                                                     int64_t cols, float *y, int64_t y_stride) {
    __m512i s1[4], s2[2];
    hymt_kq_perms_avx512(s1, s2);

    const int64_t nb = cols / 256;
    if (n >= HYMT_KQ_BATCH_MIN) {
        /* u: [HYMT_KQ_PANEL][nb] rows unpacked once for all n tokens */
        hymt_kq_unpacked *u = (hymt_kq_unpacked *)aligned_alloc(64, (size_t)HYMT_KQ_PANEL * nb * sizeof *u);
        if (u != NULL) {
            for (int64_t r = r0; r < r1; r += HYMT_KQ_PANEL) {
                const int R = r1 - r < HYMT_KQ_PANEL ? (int)(r1 - r) : HYMT_KQ_PANEL;
                for (int i = 0; i < R; i++)
                    for (int64_t b = 0; b < nb; b++) {
                        const uint8_t *blk = w + (size_t)(r + i) * row_bytes + b * HYMT_Q6_K_BYTES;
                        hymt_kq_prefetch(blk);
                        hymt_q6_k_unpack_avx512(blk, s1, s2, u[i * nb + b].wq, &u[i * nb + b].dsc);
                    }
                hymt_kq_panel_avx512(u, R, nb, act, act_stride, n, y + r, y_stride);
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
            hymt_q6_k_row_avx512(w + (size_t)r * row_bytes, a0, act_stride, tt, nb, s1, s2, acc);
            for (int t = 0; t < tt; t++) y[(t0 + t) * y_stride + r] = hymt_hsum512(acc[t]);
        }
    }
}

HYMT_TARGET_AVX2 HYMT_INLINE void hymt_q6_k_unpack_avx2(const uint8_t *blk, __m256i wq[4][2], __m256 dsc[2]) {
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
    __m256 d = _mm256_set1_ps(_cvtsh_ss(hymt_load_u16(blk + 208)));
    __m128i sc = _mm_loadu_si128((const __m128i *)(blk + 192));
    dsc[0] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
    dsc[1] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))));
}

HYMT_TARGET_AVX2 static void hymt_gemm_q6_k_avx2(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
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
                    const uint8_t *blk = w + (size_t)(r + i) * row_bytes + b * HYMT_Q6_K_BYTES;
                    hymt_kq_prefetch(blk);
                    __m256i wq[4][2];
                    __m256 dsc[2];
                    hymt_q6_k_unpack_avx2(blk, wq, dsc);
                    const hymt_kq8 *g = a0 + b;
                    for (int t = 0; t < tt; t++, g = (const hymt_kq8 *)((const uint8_t *)g + act_stride)) {
                        const __m256 s = _mm256_set1_ps(g->d);
                        for (int h = 0; h < 2; h++) {
                            /* |code·q + code·q| <= 2·63·127 = 16002: the sum of two vectors still fits int16 */
                            __m256i isum = _mm256_loadu_si256((const __m256i *)(g->nb32 + 8 * h));
                            for (int v = 0; v < 4; v += 2) {
                                __m256i q0 = _mm256_loadu_si256((const __m256i *)(g->qs + 64 * v + 32 * h));
                                __m256i q1 = _mm256_loadu_si256((const __m256i *)(g->qs + 64 * v + 64 + 32 * h));
                                __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(wq[v][h], q0),
                                                             _mm256_maddubs_epi16(wq[v + 1][h], q1));
                                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, ones));
                            }
                            __m256 scale = _mm256_mul_ps(dsc[h], s);
                            acc[i][t][h] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(isum), acc[i][t][h]);
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
HYMT_TARGET_DOTPROD HYMT_INLINE void hymt_q6_k_unpack_neon(const uint8_t *blk, int8x16_t wq[4][4],
                                                          float32x4_t dsc[4]) {
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
    float32x4_t d = vdupq_n_f32(hymt_fp16_to_f32(hymt_load_u16(blk + 208)));
    int16x8_t sc16[2];
    int8x16_t sc = vld1q_s8((const int8_t *)(blk + 192));
    sc16[0] = vmovl_s8(vget_low_s8(sc));
    sc16[1] = vmovl_s8(vget_high_s8(sc));
    for (int k = 0; k < 4; k++) {
        int32x4_t s32 = (k & 1) ? vmovl_s16(vget_high_s16(sc16[k / 2])) : vmovl_s16(vget_low_s16(sc16[k / 2]));
        dsc[k] = vmulq_f32(d, vcvtq_f32_s32(s32));
    }
}

HYMT_TARGET_DOTPROD static void hymt_gemm_q6_k_dotprod(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
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
                float32x4_t dsc[4];
                hymt_kq_prefetch(row + b * HYMT_Q6_K_BYTES);
                hymt_q6_k_unpack_neon(row + b * HYMT_Q6_K_BYTES, wq, dsc);
                for (int t = 0; t < tt; t++) {
                    const hymt_kq8 *g = (const hymt_kq8 *)(act + (size_t)(t0 + t) * act_stride) + b;
                    const float32x4_t s = vdupq_n_f32(g->d);
                    for (int k = 0; k < 4; k++) {
                        int32x4_t isum = vld1q_s32(g->nb32 + 4 * k);
                        for (int v = 0; v < 4; v++) isum = vdotq_s32(isum, wq[v][k], vld1q_s8(g->qs + 64 * v + 16 * k));
                        acc[t][k] = vfmaq_f32(acc[t][k], vmulq_f32(dsc[k], s), vcvtq_f32_s32(isum));
                    }
                }
            }
            for (int t = 0; t < tt; t++)
                y[(t0 + t) * y_stride + r] = hymt_kq_tree16_neon(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
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
    hymt_prepare_kq8,
    hymt_act_stride_kq8,
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
