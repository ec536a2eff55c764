/* fmt_q8_0.h — Q8_0 (REFERENCE.md §2.2): blocks of 32 weights, fp16 d then 32 int8 q; w = d × q.
 *
 * int8 path (§3.4): activations in groups of 256 (eight Q8_0 blocks share one activation scale s).
 * For one row and one token, with blocks b = 0, 1, … along the row:
 *
 *   acc[16] = 0
 *   for each block b:
 *       isum = Σ_{i<32} q_w[b][i] · q_a[32b + i]            (exact int32, |isum| ≤ 520192 < 2^22)
 *       v = d_b × f32(isum)                                    (one float32 rounding)
 *       acc[b % 16] = fma(s_{b/8}, v, acc[b % 16])
 *   y = tree16(acc): b[i] = acc[i] + acc[i+8]; c[i] = b[i] + b[i+4]; e[i] = c[i] + c[i+2]; e[0] + e[1]
 *
 * Why this shape: the float work is one mul + one fma per 32 weights, on 16 lanes at once. The AVX-512
 * kernel works on chunks of 16 blocks (512 weights): each row's chunk is transposed once (lane k of
 * vector i = bytes 4i..4i+3 of block k) so that 8 chained vpdpbusd leave every lane holding a whole
 * block's sum; the activations are stored transposed the same way once per token (qt below). The
 * weights enter vpdpbusd unsigned (q_w + 128, a xor) and the chain starts from bias = 0x4B400000 −
 * 128 · Σ_{32} q_a, so its result is the float32 bit pattern of 1.5·2^23 + isum and f32(isum) is one
 * exact subtraction. Batched calls transpose a tile of rows once and reuse it for every token.
 * Float path: decode 8 blocks (256 floats) at a time and sum the chunk dots. */
#ifndef HYMT_FMT_Q8_0_H
#define HYMT_FMT_Q8_0_H

#include <stdlib.h>

#include "hymt_common.h"
#include "act_q8g.h"
#include "vec.h"

#define HYMT_Q8_0_BYTES 34
#define HYMT_Q8_0_MAGIC 0x4B400000 /* float32 1.5·2^23 */

/* One token's activations for one chunk of 512 inputs (16 blocks, two groups), 1152 bytes (18 × 64).
 * A last chunk of 256 inputs leaves blocks 8..15 zero (q = 0, bias = MAGIC, s = 0). */
typedef struct {
    int8_t qs[512];    /* quantized activations in input order (§3.4, exactly hymt_quantize_group_q8g) */
    int8_t qt[512];    /* transposed: qt[64i + 4k + e] = qs[32k + 4i + e] */
    int32_t bias[16];  /* MAGIC − 128 × Σ of block k's 32 activations */
    float s[16];       /* activation scale of block k's group: the d of group k / 8 */
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

static inline int64_t hymt_q8_0_chunks(int64_t cols) { return (cols + 511) / 512; }

static size_t hymt_act_stride_q8_0(int64_t cols) { return (size_t)hymt_q8_0_chunks(cols) * sizeof(hymt_q8_0_act); }

/* qt and bias of a chunk from its qs (pure data movement and exact integer sums). */
static void hymt_q8_0_finish_chunk_scalar(hymt_q8_0_act *a) {
    for (int k = 0; k < 16; k++) {
        int32_t sum = 0;
        for (int i = 0; i < 32; i++) sum += a->qs[32 * k + i];
        a->bias[k] = HYMT_Q8_0_MAGIC - 128 * sum;
        for (int i = 0; i < 8; i++) memcpy(a->qt + 64 * i + 4 * k, a->qs + 32 * k + 4 * i, 4);
    }
}

#if defined(HYMT_X86)
/* The same with a 4×4 dword transpose per 128-bit lane, and the block sums as 8 chained vpdpbusd with
 * ones over the transposed vectors (lane k accumulates block k). */
HYMT_TARGET_AVX512 static void hymt_q8_0_finish_chunk_avx512(hymt_q8_0_act *a) {
    const __m512i ones = _mm512_set1_epi8(1);
    __m512i sum = _mm512_setzero_si512();
    for (int h = 0; h < 2; h++) {
        __m512i X[4];
        for (int m = 0; m < 4; m++) {
            const int8_t *p = a->qs + 32 * m + 16 * h; /* lane L <- dwords 4h..4h+3 of block 4L + m */
            __m512i v = _mm512_castsi128_si512(_mm_load_si128((const __m128i *)p));
            v = _mm512_inserti32x4(v, _mm_load_si128((const __m128i *)(p + 128)), 1);
            v = _mm512_inserti32x4(v, _mm_load_si128((const __m128i *)(p + 256)), 2);
            X[m] = _mm512_inserti32x4(v, _mm_load_si128((const __m128i *)(p + 384)), 3);
        }
        __m512i t0 = _mm512_unpacklo_epi32(X[0], X[1]), t1 = _mm512_unpackhi_epi32(X[0], X[1]);
        __m512i t2 = _mm512_unpacklo_epi32(X[2], X[3]), t3 = _mm512_unpackhi_epi32(X[2], X[3]);
        __m512i y[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2), _mm512_unpacklo_epi64(t1, t3),
                        _mm512_unpackhi_epi64(t1, t3)};
        for (int i = 0; i < 4; i++) {
            _mm512_store_si512((void *)(a->qt + 64 * (4 * h + i)), y[i]);
            sum = _mm512_dpbusd_epi32(sum, ones, y[i]);
        }
    }
    _mm512_store_si512((void *)a->bias, _mm512_sub_epi32(_mm512_set1_epi32(HYMT_Q8_0_MAGIC), _mm512_slli_epi32(sum, 7)));
}
#endif

static void hymt_prepare_q8_0(const float *x, int64_t cols, uint8_t *act) {
    hymt_q8_0_act *a = (hymt_q8_0_act *)act;
    int64_t groups = cols / 256;
    hymt_q8g g;
    for (int64_t c = 0; c < hymt_q8_0_chunks(cols); c++) {
        memset(&a[c], 0, sizeof a[c]);
        for (int h = 0; h < 2 && 2 * c + h < groups; h++) {
            hymt_quantize_group_q8g(x + 256 * (2 * c + h), &g);
            memcpy(a[c].qs + 256 * h, g.qs, 256);
            for (int k = 8 * h; k < 8 * h + 8; k++) a[c].s[k] = g.d;
        }
#if defined(HYMT_X86)
        if (hymt_active_isa == HYMT_ISA_AVX512) {
            hymt_q8_0_finish_chunk_avx512(&a[c]);
            continue;
        }
#endif
        hymt_q8_0_finish_chunk_scalar(&a[c]);
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
    int64_t blocks = cols / 32;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = w + (size_t)r * row_bytes;
        for (int64_t t = 0; t < n; t++) {
            const hymt_q8_0_act *a = (const hymt_q8_0_act *)(act + (size_t)t * act_stride);
            float acc[16] = {0};
            for (int64_t b = 0; b < blocks; b++) {
                const uint8_t *blk = row + (size_t)b * HYMT_Q8_0_BYTES;
                const int8_t *qw = (const int8_t *)(blk + 2);
                const int8_t *qa = a[b / 16].qs + 32 * (b % 16);
                int32_t isum = 0;
                for (int i = 0; i < 32; i++) isum += (int32_t)qw[i] * (int32_t)qa[i];
                float v = hymt_fp16_to_f32(hymt_load_u16(blk)) * (float)isum;
                acc[b % 16] = fmaf(a[b / 16].s[b % 16], v, acc[b % 16]);
            }
            y[t * y_stride + r] = hymt_tree16(acc);
        }
    }
}

#if defined(HYMT_X86)
/* Transposed, unsigned weights of one row's chunk of nb (16 or 8) blocks: W[i] lane k = bytes
 * 4i..4i+3 of block k (+128), zero for k ≥ nb; *dw = the 16 block scales (0 for k ≥ nb). */
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_q8_0_transpose_avx512(const uint8_t *blk0, int nb, __m512i *W,
                                                                __m512 *dw) {
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    for (int h = 0; h < 2; h++) {
        __m512i X[4];
        for (int m = 0; m < 4; m++) {
            /* 128-bit lane L <- dwords 4h..4h+3 of block 4L + m */
            const uint8_t *p = blk0 + (size_t)m * HYMT_Q8_0_BYTES + 2 + 16 * h;
            __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)p));
            v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + 4 * HYMT_Q8_0_BYTES)), 1);
            if (nb == 16) {
                v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + 8 * HYMT_Q8_0_BYTES)), 2);
                v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + 12 * HYMT_Q8_0_BYTES)), 3);
            } else {
                v = _mm512_maskz_mov_epi32(0x00ff, v);
            }
            X[m] = v;
        }
        __m512i t0 = _mm512_unpacklo_epi32(X[0], X[1]), t1 = _mm512_unpackhi_epi32(X[0], X[1]);
        __m512i t2 = _mm512_unpacklo_epi32(X[2], X[3]), t3 = _mm512_unpackhi_epi32(X[2], X[3]);
        __m512i y0 = _mm512_unpacklo_epi64(t0, t2), y1 = _mm512_unpackhi_epi64(t0, t2);
        __m512i y2 = _mm512_unpacklo_epi64(t1, t3), y3 = _mm512_unpackhi_epi64(t1, t3);
        /* blocks ≥ nb stay 0 (not 0x80): their lanes must add nothing */
        const __m512i flip = nb == 16 ? bias : _mm512_maskz_mov_epi8((__mmask64)0xffffffffu, bias);
        W[4 * h + 0] = _mm512_xor_si512(y0, flip);
        W[4 * h + 1] = _mm512_xor_si512(y1, flip);
        W[4 * h + 2] = _mm512_xor_si512(y2, flip);
        W[4 * h + 3] = _mm512_xor_si512(y3, flip);
    }
    uint16_t d16[16];
    for (int k = 0; k < 16; k++) d16[k] = k < nb ? hymt_load_u16(blk0 + (size_t)k * HYMT_Q8_0_BYTES) : 0;
    *dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)d16));
}

/* One tile: RT rows (transposed in wt/dwt: [RT][chunks][8] and [RT][chunks]) × TT tokens from t. */
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_q8_0_tile_avx512(const __m512i *wt, const __m512 *dwt, int64_t chunks,
                                                           int tail, int64_t r, const uint8_t *act,
                                                           size_t act_stride, int64_t t, float *y,
                                                           int64_t y_stride, const int RT, const int TT) {
    const __m512 magic = _mm512_castsi512_ps(_mm512_set1_epi32(HYMT_Q8_0_MAGIC));
    __m512 total[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < RT; i++)
#pragma GCC unroll 4
        for (int k = 0; k < TT; k++) total[i][k] = _mm512_setzero_ps();
    const hymt_q8_0_act *acts[4];
#pragma GCC unroll 4
    for (int k = 0; k < TT; k++) acts[k] = (const hymt_q8_0_act *)(act + (size_t)(t + k) * act_stride);
    for (int64_t c = 0; c < chunks; c++) {
        __m512i acc[4][4];
#pragma GCC unroll 4
        for (int k = 0; k < TT; k++)
#pragma GCC unroll 4
            for (int i = 0; i < RT; i++) acc[i][k] = _mm512_load_si512((const void *)acts[k][c].bias);
#pragma GCC unroll 8
        for (int s = 0; s < 8; s++) {
            __m512i wv[4];
#pragma GCC unroll 4
            for (int i = 0; i < RT; i++) wv[i] = _mm512_load_si512((const void *)&wt[((size_t)i * chunks + c) * 8 + s]);
#pragma GCC unroll 4
            for (int k = 0; k < TT; k++) {
                const __m512i av = _mm512_load_si512((const void *)(acts[k][c].qt + 64 * s));
#pragma GCC unroll 4
                for (int i = 0; i < RT; i++) acc[i][k] = _mm512_dpbusd_epi32(acc[i][k], wv[i], av);
            }
        }
        const __mmask16 live = (tail && c == chunks - 1) ? (__mmask16)0x00ff : (__mmask16)0xffff;
#pragma GCC unroll 4
        for (int k = 0; k < TT; k++) {
            const __m512 sv = _mm512_load_ps(acts[k][c].s);
#pragma GCC unroll 4
            for (int i = 0; i < RT; i++) {
                __m512 v = _mm512_mul_ps(_mm512_sub_ps(_mm512_castsi512_ps(acc[i][k]), magic), dwt[(size_t)i * chunks + c]);
                total[i][k] = _mm512_mask3_fmadd_ps(sv, v, total[i][k], live);
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < RT; i++)
#pragma GCC unroll 4
        for (int k = 0; k < TT; k++) y[(t + k) * y_stride + r + i] = hymt_hsum512(total[i][k]);
}

#define HYMT_Q8_0_TILE(RT, TT)                                                                                 \
    HYMT_TARGET_AVX512 static void hymt_q8_0_tile_avx512_##RT##x##TT(                                          \
        const __m512i *wt, const __m512 *dwt, int64_t chunks, int tail, int64_t r, const uint8_t *act,         \
        size_t act_stride, int64_t t, float *y, int64_t y_stride) {                                            \
        hymt_q8_0_tile_avx512(wt, dwt, chunks, tail, r, act, act_stride, t, y, y_stride, RT, TT);              \
    }
HYMT_Q8_0_TILE(4, 4)
HYMT_Q8_0_TILE(4, 1)
HYMT_Q8_0_TILE(1, 4)
HYMT_Q8_0_TILE(1, 1)
#undef HYMT_Q8_0_TILE

/* Rows are taken 4 at a time: their chunks are transposed once into a per-call scratch (4 × chunks ×
 * 576 bytes, L1/L2-resident) and then run against every token, 4 tokens per tile. */
HYMT_TARGET_AVX512 static void hymt_gemm_q8_0_avx512(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                     const uint8_t *act, size_t act_stride, int64_t n,
                                                     int64_t cols, float *y, int64_t y_stride) {
    int64_t chunks = hymt_q8_0_chunks(cols);
    int tail = cols % 512 != 0;
    if (n == 1) { /* GEMV: each row's chunks are transposed in registers and used at once */
        const __m512 magic = _mm512_castsi512_ps(_mm512_set1_epi32(HYMT_Q8_0_MAGIC));
        const hymt_q8_0_act *a = (const hymt_q8_0_act *)act;
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *row = w + (size_t)r * row_bytes;
            __m512 total = _mm512_setzero_ps();
            for (int64_t c = 0; c < chunks; c++) {
                int last = tail && c == chunks - 1;
                __m512i W[8];
                __m512 dw;
                hymt_q8_0_transpose_avx512(row + (size_t)c * 16 * HYMT_Q8_0_BYTES, last ? 8 : 16, W, &dw);
                __m512i acc = _mm512_load_si512((const void *)a[c].bias);
                for (int s = 0; s < 8; s++)
                    acc = _mm512_dpbusd_epi32(acc, W[s], _mm512_load_si512((const void *)(a[c].qt + 64 * s)));
                __m512 v = _mm512_mul_ps(_mm512_sub_ps(_mm512_castsi512_ps(acc), magic), dw);
                total = _mm512_mask3_fmadd_ps(_mm512_load_ps(a[c].s), v, total, last ? 0x00ff : 0xffff);
            }
            y[r] = hymt_hsum512(total);
        }
        return;
    }
    /* wt: [4][chunks][8] transposed weight vectors; dwt: [4][chunks] block scales */
    __m512i *wt = (__m512i *)aligned_alloc(64, (size_t)4 * chunks * 8 * sizeof(__m512i));
    __m512 *dwt = (__m512 *)aligned_alloc(64, (size_t)4 * chunks * sizeof(__m512));
    if (wt == NULL || dwt == NULL) { /* out of memory: the scalar reference needs no scratch */
        free(wt);
        free(dwt);
        hymt_gemm_q8_0_scalar(w, row_bytes, r0, r1, act, act_stride, n, cols, y, y_stride);
        return;
    }
    for (int64_t r = r0; r < r1;) {
        int rt = r1 - r >= 4 ? 4 : 1;
        for (int i = 0; i < rt; i++) {
            const uint8_t *row = w + (size_t)(r + i) * row_bytes;
            for (int64_t c = 0; c < chunks; c++)
                hymt_q8_0_transpose_avx512(row + (size_t)c * 16 * HYMT_Q8_0_BYTES, (tail && c == chunks - 1) ? 8 : 16,
                                           &wt[((size_t)i * chunks + c) * 8], &dwt[(size_t)i * chunks + c]);
        }
        int64_t t = 0;
        if (rt == 4) {
            for (; t + 4 <= n; t += 4) hymt_q8_0_tile_avx512_4x4(wt, dwt, chunks, tail, r, act, act_stride, t, y, y_stride);
            for (; t < n; t++) hymt_q8_0_tile_avx512_4x1(wt, dwt, chunks, tail, r, act, act_stride, t, y, y_stride);
        } else {
            for (; t + 4 <= n; t += 4) hymt_q8_0_tile_avx512_1x4(wt, dwt, chunks, tail, r, act, act_stride, t, y, y_stride);
            for (; t < n; t++) hymt_q8_0_tile_avx512_1x1(wt, dwt, chunks, tail, r, act, act_stride, t, y, y_stride);
        }
        r += rt;
    }
    free(wt);
    free(dwt);
}

/* AVX2: per block |w| × sign(a, w) through pmaddubsw (pair sums ≤ 2·128·127, no saturation) and
 * pmaddwd with ones gives 8 partial sums; a horizontal-add tree turns the partials of 8 blocks into
 * their 8 exact sums, then v = d × f32(isum) and one fma per 8 blocks (lanes 0–7 or 8–15 of acc). */
HYMT_TARGET_AVX2 HYMT_INLINE __m256i hymt_q8_0_partials_avx2(const uint8_t *blk, const int8_t *qa) {
    const __m256i wq = _mm256_loadu_si256((const __m256i *)(blk + 2));
    const __m256i av = _mm256_loadu_si256((const __m256i *)qa);
    __m256i p16 = _mm256_maddubs_epi16(_mm256_abs_epi8(wq), _mm256_sign_epi8(av, wq));
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

HYMT_TARGET_AVX2 static void hymt_gemm_q8_0_avx2(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                 const uint8_t *act, size_t act_stride, int64_t n, int64_t cols,
                                                 float *y, int64_t y_stride) {
    int64_t groups = cols / 256;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = w + (size_t)r * row_bytes;
        for (int64_t t = 0; t < n; t++) {
            const hymt_q8_0_act *a = (const hymt_q8_0_act *)(act + (size_t)t * act_stride);
            __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
            for (int64_t g = 0; g < groups; g++) {
                const uint8_t *blk = row + (size_t)(8 * g) * HYMT_Q8_0_BYTES;
                const int8_t *qa = a[g / 2].qs + 256 * (g % 2);
                __m256i p[8];
                for (int j = 0; j < 8; j++) p[j] = hymt_q8_0_partials_avx2(blk + j * HYMT_Q8_0_BYTES, qa + 32 * j);
                __m256i h01 = _mm256_hadd_epi32(p[0], p[1]), h23 = _mm256_hadd_epi32(p[2], p[3]);
                __m256i h45 = _mm256_hadd_epi32(p[4], p[5]), h67 = _mm256_hadd_epi32(p[6], p[7]);
                __m256i h03 = _mm256_hadd_epi32(h01, h23), h47 = _mm256_hadd_epi32(h45, h67);
                __m256i isum = _mm256_add_epi32(_mm256_permute2x128_si256(h03, h47, 0x20),
                                                _mm256_permute2x128_si256(h03, h47, 0x31));
                uint16_t d16[8];
                for (int j = 0; j < 8; j++) d16[j] = hymt_load_u16(blk + j * HYMT_Q8_0_BYTES);
                __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)d16));
                __m256 v = _mm256_mul_ps(d, _mm256_cvtepi32_ps(isum));
                acc[g % 2] = _mm256_fmadd_ps(_mm256_set1_ps(a[g / 2].s[8 * (g % 2)]), v, acc[g % 2]);
            }
            y[t * y_stride + r] = hymt_hsum256(_mm256_add_ps(acc[0], acc[1]));
        }
    }
}
#endif /* HYMT_X86 */

#if defined(HYMT_ARM64)
/* NEON SDOT: two vdotq_s32 and a lane sum give a block's exact isum; the float steps are the scalar
 * definition's (fmaf is one fused instruction on aarch64). */
HYMT_TARGET_DOTPROD static void hymt_gemm_q8_0_neon(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                    const uint8_t *act, size_t act_stride, int64_t n,
                                                    int64_t cols, float *y, int64_t y_stride) {
    int64_t blocks = cols / 32;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = w + (size_t)r * row_bytes;
        for (int64_t t = 0; t < n; t++) {
            const hymt_q8_0_act *a = (const hymt_q8_0_act *)(act + (size_t)t * act_stride);
            float acc[16] = {0};
            for (int64_t b = 0; b < blocks; b++) {
                const uint8_t *blk = row + (size_t)b * HYMT_Q8_0_BYTES;
                const int8_t *qa = a[b / 16].qs + 32 * (b % 16);
                int32x4_t s = vdotq_s32(vdupq_n_s32(0), vld1q_s8((const int8_t *)(blk + 2)), vld1q_s8(qa));
                s = vdotq_s32(s, vld1q_s8((const int8_t *)(blk + 18)), vld1q_s8(qa + 16));
                float v = hymt_fp16_to_f32(hymt_load_u16(blk)) * (float)vaddvq_s32(s);
                acc[b % 16] = fmaf(a[b / 16].s[b % 16], v, acc[b % 16]);
            }
            y[t * y_stride + r] = hymt_tree16(acc);
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
