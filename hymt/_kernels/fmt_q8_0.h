/* fmt_q8_0.h — Q8_0 (REFERENCE.md §2.2): blocks of 32 weights, fp16 d then 32 int8 q; w = d × q.
 *
 * int8 path (§3.4), activations in groups of 256 (eight Q8_0 blocks share one activation scale s).
 * The integer products are taken over 4 consecutive weights ("partials", what one 32-bit lane of
 * vpdpbusd / pmaddubsw+pmaddwd / sdot yields), and the float math is defined on 16 lanes so every
 * ISA can follow it exactly. For one row and one token:
 *
 *   acc[16] = 0
 *   for each group g (blocks j = 0..7 of 32 weights, activation scale s_g):
 *       inner[16] = 0
 *       for j in 0..7, k in 0..7:                      lane = 8·(j % 2) + k
 *           part = Σ_{i<4} q_w[j][4k+i] · q_a[32j+4k+i]           (exact int32, |part| < 2^24)
 *           inner[lane] = fma(d_j, f32(part), inner[lane])
 *       acc[lane] = fma(s_g, inner[lane], acc[lane])   for every lane
 *   y = tree16(acc): b[i] = acc[i] + acc[i+8]; c[i] = b[i] + b[i+4]; e[i] = c[i] + c[i+2]; e[0] + e[1]
 *
 * The VNNI kernel feeds vpdpbusd unsigned weights q_w + 128 (a xor) and starts each lane from
 * bias4 = 0x4B400000 − 128 · Σ of its 4 activations (prepared once per token): the result is then the
 * float32 bit pattern of 1.5·2^23 + part (exact, |part| ≤ 65024 < 2^22), so f32(part) is one exact
 * subtraction instead of a conversion on the busy port 0.
 * Float path: decode 8 blocks (256 floats) at a time and sum the chunk dots. */
#ifndef HYMT_FMT_Q8_0_H
#define HYMT_FMT_Q8_0_H

#include "hymt_common.h"
#include "act_q8g.h"
#include "vec.h"

#define HYMT_Q8_0_BYTES 34

/* One token's activations for one group of 256 inputs, 576 bytes (a multiple of 64 so every member
 * of every group stays 64-byte aligned in a 64-aligned buffer). */
typedef struct {
    int8_t qs[256];    /* quantized activations (§3.4, exactly hymt_quantize_group_q8g) */
    int32_t bias4[64]; /* 0x4B400000 − 128 × (qs[4k] + qs[4k+1] + qs[4k+2] + qs[4k+3]) */
    float d;           /* activation scale s */
    uint8_t pad[60];
} hymt_q8_0_act;

static void hymt_decode_q8_0(const uint8_t *src, float *dst, int64_t nblocks) {
    for (int64_t b = 0; b < nblocks; b++) {
        const uint8_t *blk = src + b * HYMT_Q8_0_BYTES;
        float d = hymt_fp16_to_f32(hymt_load_u16(blk));
        for (int i = 0; i < 32; i++) dst[32 * b + i] = d * (float)(int8_t)blk[2 + i];
    }
}

/* Float path: Σ over 256-weight chunks (the last may be shorter) of dot(decoded chunk, x chunk). */
static float hymt_row_dot_f32_q8_0(const uint8_t *row, const float *x, int64_t cols) {
    float chunk[256]; /* [≤ 256] decoded weights */
    float total = 0.0f;
    for (int64_t c = 0; c < cols; c += 256) {
        int64_t len = cols - c < 256 ? cols - c : 256;
        hymt_decode_q8_0(row + (c / 32) * HYMT_Q8_0_BYTES, chunk, len / 32);
        total += hymt_dot_f32(chunk, x + c, len);
    }
    return total;
}

static size_t hymt_act_stride_q8_0(int64_t cols) { return (size_t)(cols / 256) * sizeof(hymt_q8_0_act); }

static void hymt_prepare_q8_0(const float *x, int64_t cols, uint8_t *act) {
    hymt_q8_0_act *a = (hymt_q8_0_act *)act;
    hymt_q8g g;
    for (int64_t b = 0; b < cols / 256; b++) {
        hymt_quantize_group_q8g(x + 256 * b, &g);
        memcpy(a[b].qs, g.qs, 256);
        for (int k = 0; k < 64; k++)
            a[b].bias4[k] = 0x4B400000 - 128 * (g.qs[4 * k] + g.qs[4 * k + 1] + g.qs[4 * k + 2] + g.qs[4 * k + 3]);
        a[b].d = g.d;
        memset(a[b].pad, 0, sizeof a[b].pad);
    }
}

static inline float hymt_tree16(const float *acc) {
    float b[8], c[4];
    for (int i = 0; i < 8; i++) b[i] = acc[i] + acc[i + 8];
    for (int i = 0; i < 4; i++) c[i] = b[i] + b[i + 4];
    return (c[0] + c[2]) + (c[1] + c[3]);
}

/* Scalar reference of the int8 GEMM (the definition above, written out). */
static void hymt_gemm_q8_0_scalar(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                  const uint8_t *act, size_t act_stride, int64_t n, int64_t cols, float *y,
                                  int64_t y_stride) {
    int64_t groups = cols / 256;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = w + (size_t)r * row_bytes;
        for (int64_t t = 0; t < n; t++) {
            const hymt_q8_0_act *a = (const hymt_q8_0_act *)(act + (size_t)t * act_stride);
            float acc[16] = {0};
            for (int64_t g = 0; g < groups; g++) {
                float inner[16] = {0};
                for (int j = 0; j < 8; j++) {
                    const uint8_t *blk = row + (size_t)(8 * g + j) * HYMT_Q8_0_BYTES;
                    float dw = hymt_fp16_to_f32(hymt_load_u16(blk));
                    const int8_t *qw = (const int8_t *)(blk + 2);
                    const int8_t *qa = a[g].qs + 32 * j;
                    for (int k = 0; k < 8; k++) {
                        int32_t part = 0;
                        for (int i = 4 * k; i < 4 * k + 4; i++) part += (int32_t)qw[i] * (int32_t)qa[i];
                        int lane = 8 * (j & 1) + k;
                        inner[lane] = fmaf(dw, (float)part, inner[lane]);
                    }
                }
                for (int l = 0; l < 16; l++) acc[l] = fmaf(a[g].d, inner[l], acc[l]);
            }
            y[t * y_stride + r] = hymt_tree16(acc);
        }
    }
}

#if defined(HYMT_X86)
/* The 8 block scales of one row's group as float32, lanes 0..7 of a zmm (8 scalar loads, one convert). */
HYMT_TARGET_AVX512 HYMT_INLINE __m512 hymt_q8_0_group_scales(const uint8_t *group) {
    uint16_t d16[8];
    for (int j = 0; j < 8; j++) d16[j] = hymt_load_u16(group + j * HYMT_Q8_0_BYTES);
    return _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)d16)));
}

/* AVX-512 VNNI: a tile of RT rows × TT tokens; per pair of blocks one 64-byte vpdpbusd per (row,
 * token), lanes 0–7 the even block, 8–15 the odd one — exactly the 16 lanes of the definition. */
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_q8_0_tile_avx512(const uint8_t *w, size_t row_bytes, int64_t r,
                                                           const uint8_t *act, size_t act_stride, int64_t t,
                                                           int64_t groups, float *y, int64_t y_stride,
                                                           const int RT, const int TT) {
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    const __m512 magic = _mm512_set1_ps(12582912.0f); /* 1.5·2^23 */
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < RT; i++)
#pragma GCC unroll 4
        for (int k = 0; k < TT; k++) acc[i][k] = _mm512_setzero_ps();
    const uint8_t *rows[4];
#pragma GCC unroll 4
    for (int i = 0; i < RT; i++) rows[i] = w + (size_t)(r + i) * row_bytes;
    const hymt_q8_0_act *acts[4];
#pragma GCC unroll 4
    for (int k = 0; k < TT; k++) acts[k] = (const hymt_q8_0_act *)(act + (size_t)(t + k) * act_stride);

    for (int64_t g = 0; g < groups; g++) {
        __m512 inner[4][4], dg[4];
#pragma GCC unroll 4
        for (int i = 0; i < RT; i++) {
            dg[i] = hymt_q8_0_group_scales(rows[i] + (size_t)(8 * g) * HYMT_Q8_0_BYTES);
#pragma GCC unroll 4
            for (int k = 0; k < TT; k++) inner[i][k] = _mm512_setzero_ps();
        }
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            /* lanes 0–7 take the scale of block 2p, lanes 8–15 that of block 2p + 1 */
            const __m512i pick = _mm512_set_epi32(2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1,
                                                  2 * p + 1, 2 * p + 1, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p,
                                                  2 * p, 2 * p);
            __m512i wq[4];
            __m512 dw[4];
#pragma GCC unroll 4
            for (int i = 0; i < RT; i++) {
                const uint8_t *blk = rows[i] + (size_t)(8 * g + 2 * p) * HYMT_Q8_0_BYTES;
                __m512i v = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(blk + 2)));
                v = _mm512_inserti64x4(v, _mm256_loadu_si256((const __m256i *)(blk + 2 + HYMT_Q8_0_BYTES)), 1);
                wq[i] = _mm512_xor_si512(v, bias);
                dw[i] = _mm512_permutexvar_ps(pick, dg[i]);
            }
#pragma GCC unroll 4
            for (int k = 0; k < TT; k++) {
                const __m512i av = _mm512_load_si512((const void *)(acts[k][g].qs + 64 * p));
                const int32_t *b4 = acts[k][g].bias4 + 16 * p;
#pragma GCC unroll 4
                for (int i = 0; i < RT; i++) {
                    /* A fresh load of the accumulator start for every (row, token): a load port instead
                     * of a register copy on the vector ports (the barrier stops the compiler merging). */
                    __asm__ volatile("" ::: "memory");
                    __m512i part = _mm512_dpbusd_epi32(_mm512_load_si512((const void *)b4), wq[i], av);
                    __m512 f = _mm512_sub_ps(_mm512_castsi512_ps(part), magic);
                    inner[i][k] = _mm512_fmadd_ps(dw[i], f, inner[i][k]);
                }
            }
        }
#pragma GCC unroll 4
        for (int k = 0; k < TT; k++) {
            const __m512 s = _mm512_set1_ps(acts[k][g].d);
#pragma GCC unroll 4
            for (int i = 0; i < RT; i++) acc[i][k] = _mm512_fmadd_ps(s, inner[i][k], acc[i][k]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < RT; i++)
#pragma GCC unroll 4
        for (int k = 0; k < TT; k++) y[(t + k) * y_stride + r + i] = hymt_hsum512(acc[i][k]);
}

#define HYMT_Q8_0_TILE(RT, TT)                                                                             \
    HYMT_TARGET_AVX512 static void hymt_q8_0_tile_avx512_##RT##x##TT(                                      \
        const uint8_t *w, size_t row_bytes, int64_t r, const uint8_t *act, size_t act_stride, int64_t t,   \
        int64_t groups, float *y, int64_t y_stride) {                                                      \
        hymt_q8_0_tile_avx512(w, row_bytes, r, act, act_stride, t, groups, y, y_stride, RT, TT);           \
    }
HYMT_Q8_0_TILE(4, 1)
HYMT_Q8_0_TILE(2, 4)
HYMT_Q8_0_TILE(2, 1)
HYMT_Q8_0_TILE(1, 4)
HYMT_Q8_0_TILE(1, 1)
#undef HYMT_Q8_0_TILE

/* GEMV: 4 rows per tile (4 weight streams in flight). Batched: 2 rows × 4 tokens, so each weight pair
 * is loaded and prepared once per 4 tokens; the row pair stays in L1 across all token tiles. */
HYMT_TARGET_AVX512 static void hymt_gemm_q8_0_avx512(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                     const uint8_t *act, size_t act_stride, int64_t n,
                                                     int64_t cols, float *y, int64_t y_stride) {
    int64_t groups = cols / 256;
    int64_t r = r0;
    if (n == 1) {
        for (; r + 4 <= r1; r += 4) hymt_q8_0_tile_avx512_4x1(w, row_bytes, r, act, act_stride, 0, groups, y, y_stride);
        for (; r < r1; r++) hymt_q8_0_tile_avx512_1x1(w, row_bytes, r, act, act_stride, 0, groups, y, y_stride);
        return;
    }
    for (; r + 2 <= r1; r += 2) {
        int64_t t = 0;
        for (; t + 4 <= n; t += 4) hymt_q8_0_tile_avx512_2x4(w, row_bytes, r, act, act_stride, t, groups, y, y_stride);
        for (; t < n; t++) hymt_q8_0_tile_avx512_2x1(w, row_bytes, r, act, act_stride, t, groups, y, y_stride);
    }
    for (; r < r1; r++) {
        int64_t t = 0;
        for (; t + 4 <= n; t += 4) hymt_q8_0_tile_avx512_1x4(w, row_bytes, r, act, act_stride, t, groups, y, y_stride);
        for (; t < n; t++) hymt_q8_0_tile_avx512_1x1(w, row_bytes, r, act, act_stride, t, groups, y, y_stride);
    }
}

/* AVX2: |w| × sign(a, w) through pmaddubsw (pair sums ≤ 2·128·127, no saturation) and pmaddwd with
 * ones gives the 8 partials of a block; even blocks feed lanes 0–7 (lo), odd ones lanes 8–15 (hi). */
HYMT_TARGET_AVX2 HYMT_INLINE void hymt_q8_0_tile_avx2(const uint8_t *w, size_t row_bytes, int64_t r,
                                                       const uint8_t *act, size_t act_stride, int64_t t,
                                                       int64_t groups, float *y, int64_t y_stride, const int RT,
                                                       const int TT) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[2][2][2]; /* [RT][TT][lo, hi] */
#pragma GCC unroll 2
    for (int i = 0; i < RT; i++)
#pragma GCC unroll 2
        for (int k = 0; k < TT; k++) acc[i][k][0] = acc[i][k][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        __m256 inner[2][2][2];
#pragma GCC unroll 2
        for (int i = 0; i < RT; i++)
#pragma GCC unroll 2
            for (int k = 0; k < TT; k++) inner[i][k][0] = inner[i][k][1] = _mm256_setzero_ps();
        for (int j = 0; j < 8; j++) {
            __m256i wq[2], wabs[2];
            __m256 dw[2];
#pragma GCC unroll 2
            for (int i = 0; i < RT; i++) {
                const uint8_t *blk = w + (size_t)(r + i) * row_bytes + (size_t)(8 * g + j) * HYMT_Q8_0_BYTES;
                wq[i] = _mm256_loadu_si256((const __m256i *)(blk + 2));
                wabs[i] = _mm256_abs_epi8(wq[i]);
                dw[i] = _mm256_set1_ps(_cvtsh_ss(hymt_load_u16(blk)));
            }
#pragma GCC unroll 2
            for (int k = 0; k < TT; k++) {
                const hymt_q8_0_act *a = (const hymt_q8_0_act *)(act + (size_t)(t + k) * act_stride) + g;
                const __m256i av = _mm256_load_si256((const __m256i *)(a->qs + 32 * j));
#pragma GCC unroll 2
                for (int i = 0; i < RT; i++) {
                    __m256i p16 = _mm256_maddubs_epi16(wabs[i], _mm256_sign_epi8(av, wq[i]));
                    __m256i part = _mm256_madd_epi16(p16, ones);
                    inner[i][k][j & 1] = _mm256_fmadd_ps(dw[i], _mm256_cvtepi32_ps(part), inner[i][k][j & 1]);
                }
            }
        }
#pragma GCC unroll 2
        for (int k = 0; k < TT; k++) {
            const hymt_q8_0_act *a = (const hymt_q8_0_act *)(act + (size_t)(t + k) * act_stride) + g;
            const __m256 s = _mm256_set1_ps(a->d);
#pragma GCC unroll 2
            for (int i = 0; i < RT; i++) {
                acc[i][k][0] = _mm256_fmadd_ps(s, inner[i][k][0], acc[i][k][0]);
                acc[i][k][1] = _mm256_fmadd_ps(s, inner[i][k][1], acc[i][k][1]);
            }
        }
    }
#pragma GCC unroll 2
    for (int i = 0; i < RT; i++)
#pragma GCC unroll 2
        for (int k = 0; k < TT; k++)
            y[(t + k) * y_stride + r + i] = hymt_hsum256(_mm256_add_ps(acc[i][k][0], acc[i][k][1]));
}

HYMT_TARGET_AVX2 static void hymt_q8_0_tile_avx2_2x1(const uint8_t *w, size_t row_bytes, int64_t r,
                                                     const uint8_t *act, size_t act_stride, int64_t t,
                                                     int64_t groups, float *y, int64_t y_stride) {
    hymt_q8_0_tile_avx2(w, row_bytes, r, act, act_stride, t, groups, y, y_stride, 2, 1);
}
HYMT_TARGET_AVX2 static void hymt_q8_0_tile_avx2_1x2(const uint8_t *w, size_t row_bytes, int64_t r,
                                                     const uint8_t *act, size_t act_stride, int64_t t,
                                                     int64_t groups, float *y, int64_t y_stride) {
    hymt_q8_0_tile_avx2(w, row_bytes, r, act, act_stride, t, groups, y, y_stride, 1, 2);
}
HYMT_TARGET_AVX2 static void hymt_q8_0_tile_avx2_1x1(const uint8_t *w, size_t row_bytes, int64_t r,
                                                     const uint8_t *act, size_t act_stride, int64_t t,
                                                     int64_t groups, float *y, int64_t y_stride) {
    hymt_q8_0_tile_avx2(w, row_bytes, r, act, act_stride, t, groups, y, y_stride, 1, 1);
}

HYMT_TARGET_AVX2 static void hymt_gemm_q8_0_avx2(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                 const uint8_t *act, size_t act_stride, int64_t n, int64_t cols,
                                                 float *y, int64_t y_stride) {
    int64_t groups = cols / 256;
    if (n == 1) { /* GEMV: two rows at a time for more independent accumulator chains */
        int64_t r = r0;
        for (; r + 2 <= r1; r += 2) hymt_q8_0_tile_avx2_2x1(w, row_bytes, r, act, act_stride, 0, groups, y, y_stride);
        if (r < r1) hymt_q8_0_tile_avx2_1x1(w, row_bytes, r, act, act_stride, 0, groups, y, y_stride);
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        int64_t t = 0;
        for (; t + 2 <= n; t += 2) hymt_q8_0_tile_avx2_1x2(w, row_bytes, r, act, act_stride, t, groups, y, y_stride);
        if (t < n) hymt_q8_0_tile_avx2_1x1(w, row_bytes, r, act, act_stride, t, groups, y, y_stride);
    }
}
#endif /* HYMT_X86 */

#if defined(HYMT_ARM64)
/* NEON SDOT: vdotq_s32 on 16 bytes gives 4 partials; a block's halves feed lanes 8·(j%2) + 0..3 and
 * + 4..7. One row × one token per call (kept simple; aarch64 is not the tuned target). */
HYMT_TARGET_DOTPROD static void hymt_gemm_q8_0_neon(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                    const uint8_t *act, size_t act_stride, int64_t n,
                                                    int64_t cols, float *y, int64_t y_stride) {
    int64_t groups = cols / 256;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = w + (size_t)r * row_bytes;
        for (int64_t t = 0; t < n; t++) {
            const hymt_q8_0_act *a = (const hymt_q8_0_act *)(act + (size_t)t * act_stride);
            float32x4_t acc[4], zero = vdupq_n_f32(0.0f);
            for (int l = 0; l < 4; l++) acc[l] = zero;
            for (int64_t g = 0; g < groups; g++) {
                float32x4_t inner[4] = {zero, zero, zero, zero};
                for (int j = 0; j < 8; j++) {
                    const uint8_t *blk = row + (size_t)(8 * g + j) * HYMT_Q8_0_BYTES;
                    float32x4_t dw = vdupq_n_f32(hymt_fp16_to_f32(hymt_load_u16(blk)));
                    for (int h = 0; h < 2; h++) {
                        int8x16_t wq = vld1q_s8((const int8_t *)(blk + 2 + 16 * h));
                        int8x16_t aq = vld1q_s8(a[g].qs + 32 * j + 16 * h);
                        int32x4_t part = vdotq_s32(vdupq_n_s32(0), wq, aq);
                        int l = 2 * (j & 1) + h;
                        inner[l] = vfmaq_f32(inner[l], dw, vcvtq_f32_s32(part));
                    }
                }
                float32x4_t s = vdupq_n_f32(a[g].d);
                for (int l = 0; l < 4; l++) acc[l] = vfmaq_f32(acc[l], s, inner[l]);
            }
            float32x4_t c = vaddq_f32(vaddq_f32(acc[0], acc[2]), vaddq_f32(acc[1], acc[3]));
            float32x2_t e = vadd_f32(vget_low_f32(c), vget_high_f32(c));
            y[t * y_stride + r] = vget_lane_f32(e, 0) + vget_lane_f32(e, 1);
        }
    }
}
#endif /* HYMT_ARM64 */

static const hymt_format HYMT_FORMAT_Q8_0 = {
    .name = "Q8_0",
    .block_len = 32,
    .block_bytes = HYMT_Q8_0_BYTES,
    .decode = hymt_decode_q8_0,
    .row_dot_f32 = hymt_row_dot_f32_q8_0,
    .prepare = hymt_prepare_q8_0,
    .act_stride = hymt_act_stride_q8_0,
    .gemm =
        {
            [HYMT_ISA_SCALAR] = hymt_gemm_q8_0_scalar,
#if defined(HYMT_X86)
            [HYMT_ISA_AVX2] = hymt_gemm_q8_0_avx2,
            [HYMT_ISA_AVX512] = hymt_gemm_q8_0_avx512,
#endif
#if defined(HYMT_ARM64)
            [HYMT_ISA_NEON] = hymt_gemm_q8_0_neon,
#endif
        },
};

#endif /* HYMT_FMT_Q8_0_H */
