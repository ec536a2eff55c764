/* fmt_q8_0.h — Q8_0 (REFERENCE.md §2.2): blocks of 32 weights, fp16 d then 32 int8 q; w = d × q.
 *
 * int8 path (§3.4): activations in groups of 256 (eight Q8_0 blocks share one activation scale s_g).
 * For one row and one token, with groups g = 0, 1, … along the row and blocks b = 8g … 8g + 7:
 *
 *   total = 0
 *   for each group g:
 *       gacc = 0
 *       for each block b of g, in order:
 *           isum = Σ_{i<32} q_w[b][i] · q_a[32b + i]          (exact int32, |isum| ≤ 520192 < 2^24)
 *           gacc = fma(d_b, f32(isum), gacc)                    (f32(isum) exact)
 *       total = fma(s_g, gacc, total)
 *   y = total
 *
 * Why this shape: it is a sequential chain per (row, token), so a SIMD lane can be an output row; the
 * float work is one conversion and one fma per 32 weights plus one fma per 256, and the rounding is
 * at most 8 terms deep inside a group and cols/256 deep across groups.
 *
 * AVX-512: rows are taken in panels of 16 or 32. Per group, each 16-row
 * panel is transposed once into 64 vectors W[b][j] with lane r = bytes 4j..4j+3 of row r's block b
 * (+128, unsigned for vpdpbusd), and its block scales into D[b] (lane r = d of row r's block b). Then
 * for tiles of tokens, vpdpbusd(W[b][j], broadcast activation dword 8b + j) accumulates 16 rows' block
 * sums at once, starting from −128·Σ_{32} q_a (the +128 cancelled exactly), 6 tokens × 1–2 row vectors
 * in registers; the float steps above run once per block on 16 rows. Up to 8 tokens (the GEMV and small
 * decode batches) skip the scratch: each block is transposed in registers and used at once by up to 4
 * tokens (more in passes over each panel, HYMT_Q8_0_ROWPASS_MAX). The
 * transpose costs shuffles, not memory traffic, so the weight stream stays the GEMV's bottleneck; the
 * small batches give each lane a run of consecutive rows (one long stream per lane) and prefetch it in
 * software into L1 and, further ahead, L2 (hymt_q8_0_small_avx512), the panel path prefetches its rows
 * (hymt_q8_0_prefetch).
 * Float path: decode 8 blocks (256 floats) at a time and sum the chunk dots. */
#ifndef HYMT_FMT_Q8_0_H
#define HYMT_FMT_Q8_0_H

#include "hymt_common.h"
#include "act_q8g.h"
#include "vec.h"
#include "amx.h"

#define HYMT_Q8_0_BYTES 34

/* One token's activations for one group of 256 inputs (eight blocks), 320 bytes. */
typedef struct {
    int8_t qs[256];   /* quantized activations in input order (§3.4, exactly hymt_quantize_group_q8g) */
    int32_t bias[8];  /* −128 × Σ of block k's 32 activations: cancels the +128 of unsigned weights */
    float s;          /* the group's activation scale */
    uint8_t pad[20];
    uint64_t stamp;   /* group 0: a number no other prepared token has (the AMX kernel's cache key), else 0 */
} hymt_q8_0_act;

/* Source of the stamps: every prepared token gets the next value (never 0). */
static uint64_t hymt_q8_0_stamps = 0;

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

static size_t hymt_act_stride_q8_0(int64_t cols, int64_t n) {
    (void)n;
    return (size_t)(cols / 256) * sizeof(hymt_q8_0_act);
}

static void hymt_prepare_q8_0(const float *x, int64_t cols, int64_t n, uint8_t *act) {
    (void)n;
    hymt_q8_0_act *a = (hymt_q8_0_act *)act;
    hymt_q8g g;
    for (int64_t j = 0; j < cols / 256; j++) {
        hymt_quantize_group_q8g(x + 256 * j, &g);
        memcpy(a[j].qs, g.qs, 256);
        for (int k = 0; k < 8; k++) a[j].bias[k] = -128 * (g.bsums[2 * k] + g.bsums[2 * k + 1]);
        a[j].s = g.d;
        memset(a[j].pad, 0, sizeof a[j].pad);
        a[j].stamp = j == 0 ? __atomic_add_fetch(&hymt_q8_0_stamps, 1, __ATOMIC_RELAXED) : 0;
    }
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
            float total = 0.0f;
            for (int64_t g = 0; g < groups; g++) {
                float gacc = 0.0f;
                for (int k = 0; k < 8; k++) {
                    const uint8_t *blk = row + (size_t)(8 * g + k) * HYMT_Q8_0_BYTES;
                    const int8_t *qw = (const int8_t *)(blk + 2);
                    const int8_t *qa = a[g].qs + 32 * k;
                    int32_t isum = 0;
                    for (int i = 0; i < 32; i++) isum += (int32_t)qw[i] * (int32_t)qa[i];
                    gacc = fmaf(hymt_fp16_to_f32(hymt_load_u16(blk)), (float)isum, gacc);
                }
                total = fmaf(a[g].s, gacc, total);
            }
            y[t * y_stride + r] = total;
        }
    }
}

#if defined(HYMT_X86)
/* Tokens per register tile of the AVX-512 kernel, and tokens whose group totals live in one scratch. */
#define HYMT_Q8_0_TILE_TOKENS 6
#define HYMT_Q8_0_SPAN_TOKENS 64
/* Batches up to this many tokens skip the panel scratch (hymt_q8_0_small_avx512). */
#define HYMT_Q8_0_SMALL 4
/* Up to this many tokens the small-batch kernel runs in passes of up to HYMT_Q8_0_SMALL over each super
 * panel (its rows in L1/L2 for the later passes); more take the panel path. Zen 5 (EPYC, family 26, 2
 * cores, session 15), kernel benchmark from DRAM, 2 threads, 2 alternations, µs per layer call, panel
 * path → passes: n = 5 271–273 → 211–216, 8 286–291 → 231–232, 12 315–319 → 320–321, 16 345–353 →
 * 413–417, 33 479–495 → 877–883. */
#define HYMT_Q8_0_ROWPASS_MAX 8
/* How far ahead (in 256-weight groups of a panel) the weight rows are prefetched. */
#define HYMT_Q8_0_PREFETCH_GROUPS 2
/* How far ahead the small-batch kernel also prefetches its lanes into L2 (hymt_q8_0_small_avx512). */
#define HYMT_Q8_0_PREFETCH_L2_GROUPS 4
/* Consecutive rows per lane of the small-batch kernel's super panels (hymt_q8_0_small_avx512). */
#define HYMT_Q8_0_LANE_ROWS 16
/* The panel path prefetches from this many tokens per span (see hymt_q8_0_prefetch). */
#define HYMT_Q8_0_PREFETCH_MIN_TOKENS 16

/* One block of a 16-row panel, lane = row: W[j] lane r = bytes 4j..4j+3 of row r's block (+128, unsigned);
 * *D lane r = d of row r's block. Rows ≥ nr are not read (W lanes 128, D lanes 0). offsets: lane r =
 * r × row_bytes; live: the first nr lanes. */
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_q8_0_block_avx512(const uint8_t *blk, size_t row_bytes, int nr,
                                                            __m512i offsets, __mmask16 live, __m512i *W,
                                                            __m512 *D) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    /* Z[r] = row r's 8 dwords | row r + 8's 8 dwords */
    __m512i Z[8];
    for (int r = 0; r < 8; r++) {
        __m256i a = r < nr ? _mm256_loadu_si256((const __m256i *)(blk + (size_t)r * row_bytes + 2))
                           : _mm256_setzero_si256();
        __m256i c = r + 8 < nr ? _mm256_loadu_si256((const __m256i *)(blk + (size_t)(r + 8) * row_bytes + 2))
                               : _mm256_setzero_si256();
        Z[r] = _mm512_inserti64x4(_mm512_castsi256_si512(a), c, 1);
    }
    /* 4×4 dword transposes per 128-bit lane: B[j] (j < 4) holds dword j (lanes 0, 2) and j + 4 (lanes
     * 1, 3) of rows 0–3 | 8–11, B[j + 4] the same of rows 4–7 | 12–15 */
    __m512i A[8], B[8];
    for (int m = 0; m < 4; m++) {
        A[2 * m] = _mm512_unpacklo_epi32(Z[2 * m], Z[2 * m + 1]);
        A[2 * m + 1] = _mm512_unpackhi_epi32(Z[2 * m], Z[2 * m + 1]);
    }
    for (int h = 0; h < 2; h++) {
        B[4 * h + 0] = _mm512_unpacklo_epi64(A[4 * h + 0], A[4 * h + 2]);
        B[4 * h + 1] = _mm512_unpackhi_epi64(A[4 * h + 0], A[4 * h + 2]);
        B[4 * h + 2] = _mm512_unpacklo_epi64(A[4 * h + 1], A[4 * h + 3]);
        B[4 * h + 3] = _mm512_unpackhi_epi64(A[4 * h + 1], A[4 * h + 3]);
    }
    for (int j = 0; j < 4; j++) {
        W[j] = _mm512_xor_si512(_mm512_permutex2var_epi64(B[j], lo, B[j + 4]), flip);
        W[j + 4] = _mm512_xor_si512(_mm512_permutex2var_epi64(B[j], hi, B[j + 4]), flip);
    }
    /* d sits in the low half of the dword at each row's block start */
    __m512i d32 = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, offsets, blk, 1);
    *D = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d32));
}

HYMT_TARGET_AVX512 HYMT_INLINE __m512i hymt_q8_0_row_offsets(size_t row_bytes) {
    return _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                              _mm512_set1_epi32((int)row_bytes));
}

/* Group g of a 16-row panel (row0 = its first row): W[8b + j], D[b] as hymt_q8_0_block_avx512. */
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_q8_0_panel_avx512(const uint8_t *row0, size_t row_bytes, int nr,
                                                            int64_t g, __m512i *W, __m512 *D) {
    const __m512i offsets = hymt_q8_0_row_offsets(row_bytes);
    const __mmask16 live = (__mmask16)((1u << nr) - 1);
    for (int b = 0; b < 8; b++)
        hymt_q8_0_block_avx512(row0 + (size_t)(8 * g + b) * HYMT_Q8_0_BYTES, row_bytes, nr, offsets, live, W + 8 * b,
                               D + b);
}

/* Prefetch group g + HYMT_Q8_0_PREFETCH_GROUPS of rows [r, r + span) (or, past the last group, of the
 * next span's rows, up to r1) into L2. Measured (2048×2048 from DRAM): the panel path
 * gains ~5% at n = 64 (L2) but loses at n = 8, where the fetches already overlap its shorter compute. */
HYMT_INLINE void hymt_q8_0_prefetch(const uint8_t *w, size_t row_bytes, int64_t r, int64_t span, int64_t r1,
                                    int64_t g, int64_t groups) {
    int64_t pg = g + HYMT_Q8_0_PREFETCH_GROUPS, pr = r;
    if (pg >= groups) pg -= groups, pr += span;
    int64_t end = pr + span < r1 ? pr + span : r1;
    for (int64_t q = pr; q < end; q++) {
        const char *p = (const char *)(w + (size_t)q * row_bytes + (size_t)pg * 8 * HYMT_Q8_0_BYTES);
        for (int off = 0; off < 8 * HYMT_Q8_0_BYTES; off += 64) _mm_prefetch(p + off, _MM_HINT_T1);
    }
}

/* RV row vectors (W: [RV][64], D: [RV][8]) × TT tokens (a[k]: token k's activations of this group):
 * total[k][i] (16 lanes) = fma(s, gacc, total) after the group's eight blocks. */
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_q8_0_tile_avx512(const __m512i *W, const __m512 *D,
                                                           const hymt_q8_0_act *const *a, float *total,
                                                           const int RV, const int TT) {
    __m512 gacc[2][HYMT_Q8_0_TILE_TOKENS];
#pragma GCC unroll 2
    for (int i = 0; i < RV; i++)
#pragma GCC unroll 8
        for (int k = 0; k < TT; k++) gacc[i][k] = _mm512_setzero_ps();
#pragma GCC unroll 1
    for (int b = 0; b < 8; b++) {
        __m512i acc[2][HYMT_Q8_0_TILE_TOKENS];
#pragma GCC unroll 8
        for (int k = 0; k < TT; k++) {
            const __m512i start = _mm512_set1_epi32(a[k]->bias[b]);
#pragma GCC unroll 2
            for (int i = 0; i < RV; i++) acc[i][k] = start;
        }
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m512i wv[2];
#pragma GCC unroll 2
            for (int i = 0; i < RV; i++) wv[i] = _mm512_load_si512((const void *)&W[64 * i + 8 * b + j]);
#pragma GCC unroll 8
            for (int k = 0; k < TT; k++) {
                int32_t q;
                memcpy(&q, a[k]->qs + 32 * b + 4 * j, 4);
                const __m512i qv = _mm512_set1_epi32(q);
#pragma GCC unroll 2
                for (int i = 0; i < RV; i++) acc[i][k] = _mm512_dpbusd_epi32(acc[i][k], wv[i], qv);
            }
        }
#pragma GCC unroll 2
        for (int i = 0; i < RV; i++) {
            const __m512 d = D[8 * i + b];
#pragma GCC unroll 8
            for (int k = 0; k < TT; k++) gacc[i][k] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(acc[i][k]), gacc[i][k]);
        }
    }
#pragma GCC unroll 8
    for (int k = 0; k < TT; k++) {
        const __m512 s = _mm512_set1_ps(a[k]->s);
#pragma GCC unroll 2
        for (int i = 0; i < RV; i++) {
            float *t = total + 16 * (RV * k + i);
            _mm512_store_ps(t, _mm512_fmadd_ps(s, gacc[i][k], _mm512_load_ps(t)));
        }
    }
}

/* Small batches (TT ≤ HYMT_Q8_0_SMALL tokens): each block of 16 rows is transposed in registers and used
 * at once by every token, with no scratch round trip; the float steps are the tile's.
 * Memory: the 16 lanes are 16 weight streams read side by side. Lanes of consecutive rows (a 2048-column
 * row is 2176 bytes) make each stream 8 groups long before it jumps to the next panel, and the hardware
 * prefetchers follow them badly: 0.72-0.76 of the streaming read rate at 2 threads for 2048 columns
 * against 0.89 for 6144 (size.py). So a range of 16·S rows is read as one super panel whose lane j takes
 * rows r + jS .. r + jS + S − 1 in S passes: each lane reads S consecutive rows, one contiguous stream of
 * S·row_bytes (S = 16: 34 KiB at 2048 columns), and lane j of pass i is output row r + jS + i (the values
 * are per row, so the lane assignment cannot change them). Each block step also prefetches two lanes'
 * group HYMT_Q8_0_PREFETCH_GROUPS ahead into L1 (along the lane: past a row's end that is the lane's next
 * row), so the 16 lanes' prefetches are spread over the group's 8 block steps. Measured (size.py, one
 * matrix shape cycled through 1 GiB, n = 1, ratio to the streaming read rate, 2 threads): 2048×2048
 * 0.72 → 0.94, 2048 rows × 6144 columns 0.89 → 0.98, 65536×2048 0.76 → 0.99; at 1 thread ≥ 1.0. Parts:
 * spreading the same prefetches over the block steps alone 0.72 → 0.77 (and 6144 columns 0.87 → 0.93);
 * S = 16 rows per lane without any software prefetch 0.88; S = 4 (the gate/up product's 64-row calls)
 * 0.89, S = 8 / 32 / 64 within noise of 16. Tried and not kept: prefetching the next panel linearly
 * into L2 (spread over the block steps, or a fixed byte distance ahead): 0.70–0.74 and 6144 columns
 * 0.76–0.79; L2 hints 4–10 groups ahead, as bursts per group (0.66–0.71) or spread (no gain with
 * S = 16); L1 distance 1 / 3 / 4 groups (−4 % / same / same).
 * AMD Zen 4 (EPYC, 2 cores, L2 1 MiB): the L1 prefetches alone leave one thread at ~16 GB/s of ~30 from
 * DRAM while the kernel runs at ~60 cycles per 16 × 32 block from L2 (33 GB/s, n = 1; ~95 at n = 4): a
 * core has few L1 miss buffers, so the same lines are also prefetched HYMT_Q8_0_PREFETCH_L2_GROUPS groups
 * ahead into L2 (the L1 prefetch two groups later then hits L2). Zen-4-driven: on the Intel box the
 * spread L2 hints gave no gain (above), and cost only the extra prefetch instructions. Measured on Zen 4
 * (kernelbench, Q8_0 layer shapes from DRAM, GB/s, medians of 3 alternated runs, 1 / 2 threads): n = 1
 * 18.3 / 25.4 → 24.6 / 34.5, n = 2 16.4 / 22.3 → 21.1 / 27.3, n = 4 15.6 / 22.1 → 18.8 / 26.0; L2
 * distance 3 / 6 / 8 groups and L1 distance 1 / 3 within noise of 4 and 2. Tried and not kept on Zen 4
 * (L2-resident 256 × 2048, cycles per block, n = 1 / 4): the d gather replaced by 16 scalar loads and
 * stores per block or 128 per group (62 / 95 → 63.5 / 97), two vpdpbusd chains per block (no change). */
/* One super panel (lane q's row at base + q·ls, q < nr) × TT tokens: lane = row. */
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_q8_0_small_panel(const uint8_t *base, size_t ls, int nr, __m512i offsets,
                                                          __mmask16 live, const uint8_t *act, size_t act_stride,
                                                          int64_t groups, float *y, int64_t y_stride, int64_t S,
                                                          __m512i lanes, const int TT) {
    __m512 total[HYMT_Q8_0_SMALL];
#pragma GCC unroll 8
    for (int k = 0; k < TT; k++) total[k] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        __m512 gacc[HYMT_Q8_0_SMALL];
#pragma GCC unroll 8
        for (int k = 0; k < TT; k++) gacc[k] = _mm512_setzero_ps();
#pragma GCC unroll 1
        for (int b = 0; b < 8; b++) {
            for (int q = 2 * b; q < 2 * b + 2 && q < nr; q++) {
                const char *p = (const char *)(base + (size_t)q * ls + (size_t)g * 8 * HYMT_Q8_0_BYTES);
                const char *p1 = p + HYMT_Q8_0_PREFETCH_GROUPS * 8 * HYMT_Q8_0_BYTES;
                const char *p2 = p + HYMT_Q8_0_PREFETCH_L2_GROUPS * 8 * HYMT_Q8_0_BYTES;
                for (int off = 0; off < 8 * HYMT_Q8_0_BYTES; off += 64) {
                    _mm_prefetch(p1 + off, _MM_HINT_T0);
                    _mm_prefetch(p2 + off, _MM_HINT_T1);
                }
            }
            __m512i W[8];
            __m512 D;
            hymt_q8_0_block_avx512(base + (size_t)(8 * g + b) * HYMT_Q8_0_BYTES, ls, nr, offsets, live, W, &D);
#pragma GCC unroll 8
            for (int k = 0; k < TT; k++) {
                const hymt_q8_0_act *a = (const hymt_q8_0_act *)(act + (size_t)k * act_stride) + g;
                __m512i acc = _mm512_set1_epi32(a->bias[b]);
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++) {
                    int32_t q;
                    memcpy(&q, a->qs + 32 * b + 4 * j, 4);
                    acc = _mm512_dpbusd_epi32(acc, W[j], _mm512_set1_epi32(q));
                }
                gacc[k] = _mm512_fmadd_ps(D, _mm512_cvtepi32_ps(acc), gacc[k]);
            }
        }
#pragma GCC unroll 8
        for (int k = 0; k < TT; k++) {
            const hymt_q8_0_act *a = (const hymt_q8_0_act *)(act + (size_t)k * act_stride) + g;
            total[k] = _mm512_fmadd_ps(_mm512_set1_ps(a->s), gacc[k], total[k]);
        }
    }
#pragma GCC unroll 8
    for (int k = 0; k < TT; k++) hymt_store_lane_rows_avx512(y + k * y_stride, S, lanes, live, total[k]);
}

typedef void (*hymt_q8_0_panel_fn)(const uint8_t *base, size_t ls, int nr, __m512i offsets, __mmask16 live,
                                   const uint8_t *act, size_t act_stride, int64_t groups, float *y, int64_t y_stride,
                                   int64_t S, __m512i lanes);
#define HYMT_Q8_0_PANEL_FN(TT)                                                                                 \
    HYMT_TARGET_AVX512 static void hymt_q8_0_panel_##TT(const uint8_t *base, size_t ls, int nr, __m512i offsets, \
                                                        __mmask16 live, const uint8_t *act, size_t act_stride,  \
                                                        int64_t groups, float *y, int64_t y_stride, int64_t S,  \
                                                        __m512i lanes) {                                        \
        hymt_q8_0_small_panel(base, ls, nr, offsets, live, act, act_stride, groups, y, y_stride, S, lanes, TT); \
    }
HYMT_Q8_0_PANEL_FN(1)
HYMT_Q8_0_PANEL_FN(2)
HYMT_Q8_0_PANEL_FN(3)
HYMT_Q8_0_PANEL_FN(4)
#undef HYMT_Q8_0_PANEL_FN
static const hymt_q8_0_panel_fn hymt_q8_0_panels[HYMT_Q8_0_SMALL] = {hymt_q8_0_panel_1, hymt_q8_0_panel_2,
                                                                     hymt_q8_0_panel_3, hymt_q8_0_panel_4};

/* Rows [r0, r1) × n tokens (n <= HYMT_Q8_0_ROWPASS_MAX) in super panels, the tokens in passes of up to
 * HYMT_Q8_0_SMALL over each panel (sizes balanced: 5 = 3 + 2) while its rows are in L1. */
HYMT_TARGET_AVX512 static void hymt_q8_0_small_avx512(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                      const uint8_t *act, size_t act_stride, int64_t n,
                                                      int64_t groups, float *y, int64_t y_stride) {
    /* the d gather's lane offsets (up to 15·16·row_bytes) must fit int32 for S > 1 */
    const int strided = (size_t)15 * HYMT_Q8_0_LANE_ROWS * row_bytes <= (size_t)INT32_MAX;
    const int64_t passes = (n + HYMT_Q8_0_SMALL - 1) / HYMT_Q8_0_SMALL;
    for (int64_t r = r0; r < r1;) {
        const int64_t left = r1 - r;
        const int64_t S = hymt_lane_rows(left, 16, HYMT_Q8_0_LANE_ROWS, strided);
        const size_t ls = (size_t)S * row_bytes; /* from one lane's row to the next lane's */
        const __m512i offsets = hymt_q8_0_row_offsets(ls);
        const __m512i lanes = hymt_lane_rows_avx512(S);
        const int nr = left >= 16 ? 16 : (int)left;
        const __mmask16 live = (__mmask16)((1u << nr) - 1);
        for (int64_t i = 0; i < S; i++) {
            const uint8_t *base = w + (size_t)(r + i) * row_bytes; /* lane 0's row of this pass */
            for (int64_t p = 0, t0 = 0; p < passes; p++) {
                const int64_t T = hymt_pass_tokens(n, t0, passes, p);
                hymt_q8_0_panels[T - 1](base, ls, nr, offsets, live, act + (size_t)t0 * act_stride, act_stride, groups,
                                        y + t0 * y_stride + r + i, y_stride, S, lanes);
                t0 += T;
            }
        }
        r += S > 1 ? 16 * S : nr;
    }
}

typedef void (*hymt_q8_0_tile_fn)(const __m512i *W, const __m512 *D, const hymt_q8_0_act *const *a, float *total);
#define HYMT_Q8_0_TILE(RV, TT)                                                                                 \
    HYMT_TARGET_AVX512 static void hymt_q8_0_tile_avx512_##RV##x##TT(const __m512i *W, const __m512 *D,        \
                                                                      const hymt_q8_0_act *const *a, float *total) { \
        hymt_q8_0_tile_avx512(W, D, a, total, RV, TT);                                                         \
    }
HYMT_Q8_0_TILE(1, 1)
HYMT_Q8_0_TILE(1, 2)
HYMT_Q8_0_TILE(1, 3)
HYMT_Q8_0_TILE(1, 4)
HYMT_Q8_0_TILE(1, 5)
HYMT_Q8_0_TILE(1, 6)
HYMT_Q8_0_TILE(2, 1)
HYMT_Q8_0_TILE(2, 2)
HYMT_Q8_0_TILE(2, 3)
HYMT_Q8_0_TILE(2, 4)
HYMT_Q8_0_TILE(2, 5)
HYMT_Q8_0_TILE(2, 6)
#undef HYMT_Q8_0_TILE
/* [row vectors − 1][tokens − 1] */
static const hymt_q8_0_tile_fn hymt_q8_0_tiles_avx512[2][HYMT_Q8_0_TILE_TOKENS] = {
    {hymt_q8_0_tile_avx512_1x1, hymt_q8_0_tile_avx512_1x2, hymt_q8_0_tile_avx512_1x3, hymt_q8_0_tile_avx512_1x4,
     hymt_q8_0_tile_avx512_1x5, hymt_q8_0_tile_avx512_1x6},
    {hymt_q8_0_tile_avx512_2x1, hymt_q8_0_tile_avx512_2x2, hymt_q8_0_tile_avx512_2x3, hymt_q8_0_tile_avx512_2x4,
     hymt_q8_0_tile_avx512_2x5, hymt_q8_0_tile_avx512_2x6},
};

/* Rows in panels of 32 (16 for a last odd panel); tokens in spans of HYMT_Q8_0_SPAN_TOKENS whose group
 * totals sit in a stack scratch. Per (panel, span, group): the panel's group is transposed once into W/D
 * (L1-resident, 8 KiB + 1 KiB) and run against every token of the span in near-equal register tiles.
 * Memory: as in hymt_q8_0_small_avx512, a range of 32·S rows (S = HYMT_Q8_0_LANE_ROWS, fewer for a short
 * range; ranges under 64 rows as panels of consecutive rows) is read in S passes whose panels take rows
 * r + p + jS (vector 0) and r + p + 16S + jS (vector 1), so each of the 32 lanes streams S consecutive
 * rows, every lane prefetched HYMT_Q8_0_PREFETCH_GROUPS groups ahead into L2. Measured (size.py, one
 * shape cycled through 1 GiB, n = 8, ratio to the streaming read rate, 2 / 1 threads): 2048×2048
 * 0.49 / 0.51 → 0.62 / 0.65, 2048 rows × 6144 columns 0.60 / 0.62 → 0.70 / 0.69, 65536×2048 0.52 / 0.53
 * → 0.66 / 0.65; without the prefetch 0.57–0.64, into L1 instead 0.59–0.65, S = 4 0.60–0.70. */
HYMT_TARGET_AVX512 static void hymt_gemm_q8_0_avx512(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                     const uint8_t *act, size_t act_stride, int64_t n,
                                                     int64_t cols, float *y, int64_t y_stride) {
    if (row_bytes > ((size_t)1 << 26)) { /* the d gather's row offsets must fit int32 */
        hymt_gemm_q8_0_scalar(w, row_bytes, r0, r1, act, act_stride, n, cols, y, y_stride);
        return;
    }
    int64_t groups = cols / 256;
    if (n <= HYMT_Q8_0_ROWPASS_MAX) {
        hymt_q8_0_small_avx512(w, row_bytes, r0, r1, act, act_stride, n, groups, y, y_stride);
        return;
    }
    __m512i W[2 * 64];                                              /* [row vector][8 blocks × 8 dwords] */
    __m512 D[2 * 8];                                                /* [row vector][block] */
    float total[HYMT_Q8_0_SPAN_TOKENS * 2 * 16] __attribute__((aligned(64))); /* [token][row vector][16] */
    const hymt_q8_0_act *a[HYMT_Q8_0_SPAN_TOKENS];                 /* [token] this group's activations */
    /* the d gather's lane offsets (up to 15·16·row_bytes) must fit int32 for S > 1 */
    const int strided = (size_t)15 * HYMT_Q8_0_LANE_ROWS * row_bytes <= (size_t)INT32_MAX;
    for (int64_t r = r0; r < r1;) {
        int64_t left = r1 - r;
        const int64_t S = hymt_lane_rows(left, 32, HYMT_Q8_0_LANE_ROWS, strided);
        int rv = S > 1 || left > 16 ? 2 : 1;
        int nr[2] = {left >= 16 ? 16 : (int)left, left >= 32 ? 16 : (int)(left - 16)};
        const size_t ls = (size_t)S * row_bytes;
        const int64_t vrows = 16 * S; /* rows from vector 0's lane 0 to vector 1's */
        const __m512i lanes = hymt_lane_rows_avx512(S);
        for (int64_t p = 0; p < S; p++) { /* pass p: lane j of vector i is row r + p + vrows·i + jS */
            for (int64_t t0 = 0; t0 < n; t0 += HYMT_Q8_0_SPAN_TOKENS) {
                int nt = n - t0 < HYMT_Q8_0_SPAN_TOKENS ? (int)(n - t0) : HYMT_Q8_0_SPAN_TOKENS;
                memset(total, 0, (size_t)nt * rv * 16 * sizeof(float));
                for (int64_t g = 0; g < groups; g++) {
                    if (S == 1 && nt >= HYMT_Q8_0_PREFETCH_MIN_TOKENS) {
                        hymt_q8_0_prefetch(w, row_bytes, r, 16 * rv, r1, g, groups);
                        if (g == groups - 1) /* the span's output lines, written after this group */
                            for (int k = 0; k < nt; k++)
                                for (int i = 0; i < rv; i++)
                                    _mm_prefetch((const char *)(y + (t0 + k) * y_stride + r + 16 * i), _MM_HINT_T0);
                    }
                    if (S > 1) /* each lane's group HYMT_Q8_0_PREFETCH_GROUPS ahead along the lane, into L2 */
                        for (int i = 0; i < 2; i++)
                            for (int q = 0; q < 16; q++) {
                                const char *pp =
                                    (const char *)(w + (size_t)(r + p + vrows * i) * row_bytes + (size_t)q * ls +
                                                   (size_t)(g + HYMT_Q8_0_PREFETCH_GROUPS) * 8 * HYMT_Q8_0_BYTES);
                                for (int off = 0; off < 8 * HYMT_Q8_0_BYTES; off += 64)
                                    _mm_prefetch(pp + off, _MM_HINT_T1);
                            }
                    for (int i = 0; i < rv; i++)
                        hymt_q8_0_panel_avx512(w + (size_t)(r + p + vrows * i) * row_bytes, ls, nr[i], g,
                                               W + 64 * i, D + 8 * i);
                    for (int k = 0; k < nt; k++)
                        a[k] = (const hymt_q8_0_act *)(act + (size_t)(t0 + k) * act_stride) + g;
                    /* the span's tokens in tiles of near-equal size (8 = 4 + 4, not 6 + 2) */
                    int tiles = (nt + HYMT_Q8_0_TILE_TOKENS - 1) / HYMT_Q8_0_TILE_TOKENS;
                    for (int i = 0, k = 0; i < tiles; i++) {
                        int tt = (nt - k) / (tiles - i);
                        hymt_q8_0_tiles_avx512[rv - 1][tt - 1](W, D, a + k, total + 16 * rv * k);
                        k += tt;
                    }
                }
                for (int k = 0; k < nt; k++)
                    for (int i = 0; i < rv; i++) /* with S = 1: vrows = 16, p = 0 */
                        hymt_store_lane_rows_avx512(y + (t0 + k) * y_stride + r + p + vrows * i, S, lanes,
                                                    (__mmask16)((1u << nr[i]) - 1),
                                                    _mm512_load_ps(total + 16 * (rv * k + i)));
            }
        }
        r += S > 1 ? 32 * S : 16 * rv;
    }
}

/* 8×8 transpose of v (float lanes; also used on int32 bit patterns, which shuffles leave untouched). */
HYMT_TARGET_AVX2 HYMT_INLINE void hymt_q8_0_transpose8_avx2(__m256 *v) {
    __m256 t[8], u[8];
    for (int m = 0; m < 4; m++) {
        t[2 * m] = _mm256_unpacklo_ps(v[2 * m], v[2 * m + 1]);
        t[2 * m + 1] = _mm256_unpackhi_ps(v[2 * m], v[2 * m + 1]);
    }
    for (int h = 0; h < 2; h++) {
        u[4 * h + 0] = _mm256_shuffle_ps(t[4 * h + 0], t[4 * h + 2], 0x44);
        u[4 * h + 1] = _mm256_shuffle_ps(t[4 * h + 0], t[4 * h + 2], 0xee);
        u[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
        u[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xee);
    }
    for (int j = 0; j < 4; j++) {
        v[j] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x20);
        v[j + 4] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x31);
    }
}

/* AVX2: per block |w| × sign(a, w) through pmaddubsw (pair sums ≤ 2·128·127, no saturation) and
 * pmaddwd with ones gives 8 partial sums; a horizontal-add tree turns the partials of a group's 8 blocks
 * into their 8 exact sums. Eight rows' sums and scales (lane = block) are transposed to lane = row, so
 * the float chain runs on 8 rows at once in the scalar order. */
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
    for (int64_t r = r0; r < r1; r += 8) {
        int nr = r1 - r < 8 ? (int)(r1 - r) : 8;
        for (int64_t t = 0; t < n; t++) {
            const hymt_q8_0_act *a = (const hymt_q8_0_act *)(act + (size_t)t * act_stride);
            __m256 total = _mm256_setzero_ps();
            for (int64_t g = 0; g < groups; g++) {
                __m256 isum[8], d[8]; /* [row] lane = block, then transposed: [block] lane = row */
                for (int i = 0; i < 8; i++) {
                    if (i >= nr) {
                        isum[i] = d[i] = _mm256_setzero_ps();
                        continue;
                    }
                    const uint8_t *blk = w + (size_t)(r + i) * row_bytes + (size_t)(8 * g) * HYMT_Q8_0_BYTES;
                    __m256i p[8];
                    for (int j = 0; j < 8; j++) p[j] = hymt_q8_0_partials_avx2(blk + j * HYMT_Q8_0_BYTES, a[g].qs + 32 * j);
                    __m256i h01 = _mm256_hadd_epi32(p[0], p[1]), h23 = _mm256_hadd_epi32(p[2], p[3]);
                    __m256i h45 = _mm256_hadd_epi32(p[4], p[5]), h67 = _mm256_hadd_epi32(p[6], p[7]);
                    __m256i h03 = _mm256_hadd_epi32(h01, h23), h47 = _mm256_hadd_epi32(h45, h67);
                    __m256i s = _mm256_add_epi32(_mm256_permute2x128_si256(h03, h47, 0x20),
                                                 _mm256_permute2x128_si256(h03, h47, 0x31));
                    isum[i] = _mm256_cvtepi32_ps(s); /* exact */
                    uint16_t d16[8];
                    for (int j = 0; j < 8; j++) d16[j] = hymt_load_u16(blk + j * HYMT_Q8_0_BYTES);
                    d[i] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)d16));
                }
                hymt_q8_0_transpose8_avx2(isum);
                hymt_q8_0_transpose8_avx2(d);
                __m256 gacc = _mm256_setzero_ps();
                for (int b = 0; b < 8; b++) gacc = _mm256_fmadd_ps(d[b], isum[b], gacc);
                total = _mm256_fmadd_ps(_mm256_set1_ps(a[g].s), gacc, total);
            }
            float out[8];
            _mm256_storeu_ps(out, total);
            for (int i = 0; i < nr; i++) y[t * y_stride + r + i] = out[i];
        }
    }
}
#endif /* HYMT_X86 */

#if defined(HYMT_HAVE_AMX)
/* ---- AMX tiles (amx.h) for batched products: n >= HYMT_Q8_0_AMX_MIN under the avx512 family ----------
 * The weights are the A tile: each block's exact isums for 16 rows × 16 tokens are one product
 * C[row][token] = A[16 rows][32 codes] · B[8 k-quads][16 tokens × 4] (tdpbssd, both signed, K = 32: every
 * block has its own d). A Q8_0 block's 32 codes are already int8, so A is tile-loaded straight from the
 * weight rows (stride row_bytes): no transposes, no copies. The activations are put into B's VNNI order
 * (hymt_q8_0_amx_vnni) once per thread and matrix product — the driver calls a kernel for each chunk of
 * rows (for the fused gate/up product every 64 rows), so the B tiles are kept per thread with the stamp
 * of the tokens they came from (every prepare gives a token a new stamp, so a stale copy never matches).
 * Then the definition's float steps run per row with lane = token: gacc[row] = fma(d of the row's block,
 * f32(C[row]), gacc[row]) over the group's eight blocks in order, total = fma(s, gacc, total) with s the
 * 16 tokens' group scales: the same operations in the same order per (row, token) as the scalar
 * reference, so the same bits.
 * Measured on this core (TSC ticks per block of 16 rows × 16 tokens, L1-resident): products with their
 * tile loads ≈ 20, tile stores ≈ 14, the float steps ≈ 15, and the tile unit and the vector units barely
 * overlap (all together ≈ 48), so the kernel spends one tile load of each operand, one product and one
 * store per block and nothing else per block; the store of block b is issued after the product of block
 * b + 1 and its float steps after the product of block b + 3, so no load waits for the store just before.
 * The B tiles come from L2 (64·cols bytes at n = 64): they are laid out group-major so one group's token
 * tiles are one contiguous stretch; the group's d are computed at its first token tile between products
 * rather than before them.
 * Token tiles run in pairs (the last one alone when their number is odd): a pair's step loads each weight
 * tile once for both products, which halves the A tile loads (16 rows of 32 bytes, half of them split
 * across two lines) per product. The first tile's float steps run between the products as above; the
 * second tile's isums go to their own eight buffers and its float steps run after the last product (the
 * vector work costs about the same bunched or interleaved, 16–19 ticks per block, so only the A loads
 * are saved). The pair's steps read their B tiles without the software prefetch the single steps use:
 * it cost more than it saved there. Measured (rdtsc, one thread, min of repeated calls, against the
 * single-tile steps): 57–58 → 55 ticks per block at n = 64 and 60 → 55 at n = 256 with the weights in L2;
 * a whole 1.8B layer's seven matrices from memory in the driver's row chunks, 28.2–30.5 → 26.8–28.7 M
 * ticks at n = 64 (−2 to −6 %), 108–122 → 93–113 M at n = 256 (−8 %), n = 16 unchanged (single steps).
 * Removing parts one at a time (weights in L2, n = 64) costs roughly: float steps 20–24 ticks per block,
 * tile stores 10–12, products 11, A loads 12, B loads 6 — they add up: the tile unit and the vector
 * units barely overlap. Tried and not kept: four token tiles per weight tile load (83 ticks: no C tile is
 * double buffered then), storing block b after the product of b + 2 instead of b + 1 (no change), the
 * magic-number int→float conversion (+4 ticks), the pair's weight prefetch spread over its blocks, or at
 * distance 1, 3, 4 groups or into L2 (no change), the pair's two B loads before both products (no
 * change). */
#define HYMT_Q8_0_AMX_MIN 10
/* Tokens per pass over the weights (bounds the float totals on the stack: 16 KiB). */
#define HYMT_Q8_0_AMX_PASS 256

/* The B tiles of n tokens: vb[g][k][b][j][4t + i] = activation 256g + 32b + 4j + i of token 16k + t, and
 * sv[g][k][t] = that token's scale of group g (both 0 for tokens ≥ n). Group-major, so the kernel's walk
 * over one group's token tiles (and on to the next group) reads one contiguous stretch. */
HYMT_TARGET_AVX512 static void hymt_q8_0_amx_vnni(const uint8_t *act, size_t act_stride, int64_t n, int64_t groups,
                                                   int8_t *vb, float *sv) {
    const int64_t tiles = (n + 15) / 16;
    for (int64_t k = 0; k < tiles; k++) {
        const hymt_q8_0_act *a[16]; /* [token of the tile] its group 0, NULL past n */
        for (int t = 0; t < 16; t++)
            a[t] = 16 * k + t < n ? (const hymt_q8_0_act *)(act + (size_t)(16 * k + t) * act_stride) : NULL;
        for (int64_t g = 0; g < groups; g++) {
            float *s = sv + ((size_t)g * tiles + k) * 16;
            for (int t = 0; t < 16; t++) s[t] = a[t] != NULL ? a[t][g].s : 0.0f;
            int8_t *dst = vb + ((size_t)g * tiles + k) * 8 * 512;
            for (int h = 0; h < 4; h++) { /* blocks 2h, 2h + 1 of the group: 64 bytes of each token */
                __m512i v[16], vt[16]; /* [token] 64 activations; [j] dword j of every token */
                for (int t = 0; t < 16; t++)
                    v[t] = a[t] != NULL ? _mm512_load_si512((const void *)(a[t][g].qs + 64 * h)) : _mm512_setzero_si512();
                hymt_transpose16_epi32(v, vt);
                for (int j = 0; j < 16; j++) _mm512_store_si512((void *)(dst + 1024 * h + 64 * j), vt[j]);
            }
        }
    }
}

/* One thread's B tiles (hymt_q8_0_amx_vnni) and the tokens they were made from. The buffer stays with the
 * thread (16·ceil(n/16)·cols + ceil(n/16)·cols/4 bytes of its largest product so far) and is reused. */
typedef struct {
    int8_t *vb;         /* [groups][ceil(n / 16)][8 blocks][8][64] */
    float *sv;          /* [groups][ceil(n / 16)][16] */
    size_t bytes;       /* allocated at vb (sv follows) */
    const uint8_t *act; /* the prepared tokens: first, stride, count, width, token 0's stamp */
    size_t act_stride;
    int64_t n, cols;
    uint64_t stamp;
} hymt_q8_0_amx_b;
static __thread hymt_q8_0_amx_b hymt_q8_0_amx_b_tls;

/* This thread's B tiles of the call's tokens, made now unless they are the last call's; NULL when out of
 * memory. */
HYMT_TARGET_AVX512 static hymt_q8_0_amx_b *hymt_q8_0_amx_b_tiles(const uint8_t *act, size_t act_stride, int64_t n,
                                                                 int64_t cols) {
    hymt_q8_0_amx_b *c = &hymt_q8_0_amx_b_tls;
    const uint64_t stamp = ((const hymt_q8_0_act *)act)->stamp;
    if (c->vb != NULL && c->act == act && c->act_stride == act_stride && c->n == n && c->cols == cols &&
        c->stamp == stamp)
        return c;
    const int64_t tiles = (n + 15) / 16, groups = cols / 256;
    const size_t vb_bytes = (size_t)tiles * 16 * (size_t)cols, bytes = vb_bytes + (size_t)tiles * groups * 64;
    if (bytes > c->bytes) {
        free(c->vb);
        c->vb = (int8_t *)aligned_alloc(64, bytes);
        c->bytes = c->vb != NULL ? bytes : 0;
        if (c->vb == NULL) return NULL;
    }
    c->sv = (float *)(c->vb + vb_bytes);
    hymt_q8_0_amx_vnni(act, act_stride, n, groups, c->vb, c->sv);
    c->act = act;
    c->act_stride = act_stride;
    c->n = n;
    c->cols = cols;
    c->stamp = stamp;
    return c;
}

/* The d of 16 rows' eight blocks of one group (grp: row 0's group, rows stride apart; rows ≥ nr give 0):
 * dv[row][block]. One row's eight d sit at bytes 34b of its 272-byte group: two byte permutes. */
HYMT_TARGET_AMX HYMT_INLINE void hymt_q8_0_amx_scales(const uint8_t *grp, size_t stride, int nr, float dv[16][8]) {
    const __m512i lo = _mm512_setr_epi64(0x6766454423220100LL, 0, 0, 0, 0, 0, 0, 0);
    const __m512i hi = _mm512_setr_epi64(0, 0x6f6e4d4c2b2a0908LL, 0, 0, 0, 0, 0, 0);
    for (int i = 0; i < 16; i++) {
        __m256 d = _mm256_setzero_ps();
        if (i < nr) {
            const uint8_t *p = grp + (size_t)i * stride;
            __m512i a = _mm512_permutex2var_epi8(_mm512_loadu_si512((const void *)p), lo,
                                                 _mm512_loadu_si512((const void *)(p + 64)));
            __m512i b = _mm512_permutex2var_epi8(_mm512_loadu_si512((const void *)(p + 128)), hi,
                                                 _mm512_loadu_si512((const void *)(p + 192)));
            d = _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_mask_blend_epi8(0xff00, a, b)));
        }
        _mm256_store_ps(dv[i], d);
    }
}

/* Prefetch rows i0 .. i1 − 1 of the 16-row tile at r, group g + HYMT_Q8_0_PREFETCH_GROUPS (past the last
 * group: of the next tile's rows, up to r1) into L1. The kernel asks for a few rows per token tile rather
 * than the whole group at once: a burst of 80 lines fills the miss buffers that the tile loads need. */
HYMT_INLINE void hymt_q8_0_amx_prefetch(const uint8_t *w, size_t row_bytes, int64_t r, int64_t r1, int64_t g,
                                        int64_t groups, int i0, int i1) {
    int64_t pg = g + HYMT_Q8_0_PREFETCH_GROUPS, pr = r;
    if (pg >= groups) pg -= groups, pr += 16;
    for (int64_t q = pr + i0; q < pr + i1 && q < r1; q++) {
        const uintptr_t p = (uintptr_t)(w + (size_t)q * row_bytes + (size_t)pg * 8 * HYMT_Q8_0_BYTES);
        for (uintptr_t a = p & ~(uintptr_t)63; a < p + 8 * HYMT_Q8_0_BYTES; a += 64) _mm_prefetch((const char *)a, _MM_HINT_T0);
    }
}

/* Tiles of a single token tile's step: 0..3 isums [16 rows][16 tokens] int32 (block b in tile b % 4);
 * 4, 5 weights [16 rows][32 codes]; 6, 7 activations [8 k-quads][16 tokens × 4]. */
#define HYMT_Q8_0_AMX_PRODUCT(b, C, A, B)                                                                     \
    do {                                                                                                     \
        _tile_zero(C);                                                                                       \
        _tile_loadd(A, src + (b) * HYMT_Q8_0_BYTES, stride);                                                  \
        _tile_loadd(B, vbk + (b) * 512, 64);                                                                 \
        _tile_dpbssd(C, A, B);                                                                               \
        for (int l = 0; l < 512; l += 64) _mm_prefetch((const char *)(vbn + (b) * 512 + l), _MM_HINT_T0);     \
    } while (0)
#define HYMT_Q8_0_AMX_STORE(b, C) _tile_stored(C, cbuf[(b) % 4], 64)
/* Tiles of a token-tile pair's step: block b's isums of the first tile in 2·(b % 2), of the second in
 * 2·(b % 2) + 1; its weights (loaded once for both products) in 4 + b % 2; the two tiles' activations in
 * 6 and 7. */
#define HYMT_Q8_0_AMX_PAIR(b, C0, C1, A)                                                                     \
    do {                                                                                                     \
        _tile_zero(C0);                                                                                      \
        _tile_zero(C1);                                                                                      \
        _tile_loadd(A, src + (b) * HYMT_Q8_0_BYTES, stride);                                                  \
        _tile_loadd(6, vbk + (b) * 512, 64);                                                                 \
        _tile_dpbssd(C0, A, 6);                                                                              \
        _tile_loadd(7, vbk + 8 * 512 + (b) * 512, 64);                                                       \
        _tile_dpbssd(C1, A, 7);                                                                              \
    } while (0)
#define HYMT_Q8_0_AMX_PAIR_STORE(b, C0, C1)                                                                  \
    do {                                                                                                     \
        _tile_stored(C0, cbuf[(b) % 4], 64);                                                                 \
        _tile_stored(C1, cbuf2[b], 64);                                                                      \
    } while (0)
#define HYMT_Q8_0_AMX_FLOAT_FROM(buf, b)                                                                     \
    do {                                                                                                     \
        _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) gacc[i] = _mm512_fmadd_ps(                    \
            _mm512_set1_ps(dv[i][b]), _mm512_cvtepi32_ps(_mm512_load_si512((const void *)(buf)[i])), gacc[i]); \
    } while (0)
#define HYMT_Q8_0_AMX_FLOAT(b) HYMT_Q8_0_AMX_FLOAT_FROM(cbuf[(b) % 4], b)
/* A step's eight blocks: the product of block b + 1 before the store of block b, block b's float steps after
 * the product of b + 3 (see above). PRODUCT(b, C, A, B, C0, C1) and STORE(b, C, C0, C1) of a single tile's
 * step (isums C, weights A, activations B) or a pair's (isums C0, C1, weights A); the tile numbers are
 * literals because the tile instructions take them as immediates. */
#define HYMT_Q8_0_AMX_SINGLE_PRODUCT(b, C, A, B, C0, C1) HYMT_Q8_0_AMX_PRODUCT(b, C, A, B)
#define HYMT_Q8_0_AMX_SINGLE_STORE(b, C, C0, C1) HYMT_Q8_0_AMX_STORE(b, C)
#define HYMT_Q8_0_AMX_PAIR_PRODUCT(b, C, A, B, C0, C1) HYMT_Q8_0_AMX_PAIR(b, C0, C1, A)
#define HYMT_Q8_0_AMX_PAIR_STORES(b, C, C0, C1) HYMT_Q8_0_AMX_PAIR_STORE(b, C0, C1)
#define HYMT_Q8_0_AMX_STEP(PRODUCT, STORE)                                                                   \
    do {                                                                                                     \
        PRODUCT(0, 0, 4, 6, 0, 1);                                                                           \
        PRODUCT(1, 1, 5, 7, 2, 3);                                                                           \
        /* the group's d while the tile unit works on its first products (first use: FLOAT(0)) */            \
        if (k == 0) hymt_q8_0_amx_scales(grp, stride, rows, dv);                                             \
        STORE(0, 0, 0, 1);                                                                                   \
        PRODUCT(2, 2, 4, 6, 0, 1);                                                                           \
        STORE(1, 1, 2, 3);                                                                                   \
        PRODUCT(3, 3, 5, 7, 2, 3);                                                                           \
        STORE(2, 2, 0, 1);                                                                                   \
        HYMT_Q8_0_AMX_FLOAT(0);                                                                              \
        PRODUCT(4, 0, 4, 6, 0, 1);                                                                           \
        STORE(3, 3, 2, 3);                                                                                   \
        HYMT_Q8_0_AMX_FLOAT(1);                                                                              \
        PRODUCT(5, 1, 5, 7, 2, 3);                                                                           \
        STORE(4, 0, 0, 1);                                                                                   \
        HYMT_Q8_0_AMX_FLOAT(2);                                                                              \
        PRODUCT(6, 2, 4, 6, 0, 1);                                                                           \
        STORE(5, 1, 2, 3);                                                                                   \
        HYMT_Q8_0_AMX_FLOAT(3);                                                                              \
        PRODUCT(7, 3, 5, 7, 2, 3);                                                                           \
        STORE(6, 2, 0, 1);                                                                                   \
        HYMT_Q8_0_AMX_FLOAT(4);                                                                              \
        STORE(7, 3, 2, 3);                                                                                   \
        HYMT_Q8_0_AMX_FLOAT(5);                                                                              \
        HYMT_Q8_0_AMX_FLOAT(6);                                                                              \
        HYMT_Q8_0_AMX_FLOAT(7);                                                                              \
    } while (0)

/* One token tile's group total into the pass totals: acc[i][col..col+16) += s × gacc[i] (fma), then
 * gacc cleared for the next tile. */
HYMT_TARGET_AMX HYMT_INLINE void hymt_q8_0_amx_accumulate(float (*acc)[HYMT_Q8_0_AMX_PASS], int col, const float *s16,
                                                          __m512 *gacc) {
    const __m512 s = _mm512_load_ps(s16);
    for (int i = 0; i < 16; i++) {
        _mm512_store_ps(acc[i] + col, _mm512_fmadd_ps(s, gacc[i], _mm512_load_ps(acc[i] + col)));
        gacc[i] = _mm512_setzero_ps();
    }
}

HYMT_TARGET_AMX static void hymt_gemm_q8_0_amx(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                               const uint8_t *act, size_t act_stride, int64_t n, int64_t cols,
                                               float *y, int64_t y_stride) {
    static const uint8_t tile_rows[8] = {16, 16, 16, 16, 16, 16, 8, 8};
    static const uint16_t tile_colsb[8] = {64, 64, 64, 64, 32, 32, 64, 64};
    const int64_t groups = cols / 256, tiles = (n + 15) / 16;
    const hymt_q8_0_amx_b *bt = hymt_q8_0_amx_b_tiles(act, act_stride, n, cols);
    if (bt == NULL) {
        hymt_gemm_q8_0_avx512(w, row_bytes, r0, r1, act, act_stride, n, cols, y, y_stride);
        return;
    }
    /* [block % 4][row][token] isums read back: block b's float steps run before block b + 4's store */
    int32_t cbuf[4][16][16] __attribute__((aligned(64)));
    int32_t cbuf2[8][16][16] __attribute__((aligned(64))); /* [block][row][token] a pair's second tile */
    float dv[16][8] __attribute__((aligned(64)));                  /* [row][block] d of the group */
    uint8_t part[16 * 8 * HYMT_Q8_0_BYTES] __attribute__((aligned(64))); /* [16 rows][8 blocks]: a partial tile's group, zero rows past the last */
    float acc[16][HYMT_Q8_0_AMX_PASS] __attribute__((aligned(64))); /* [row][token of the pass] totals */
    hymt_amx_configure(tile_rows, tile_colsb);
    for (int64_t t0 = 0; t0 < n; t0 += HYMT_Q8_0_AMX_PASS) {
        const int np = n - t0 < HYMT_Q8_0_AMX_PASS ? (int)(n - t0) : HYMT_Q8_0_AMX_PASS, nk = (np + 15) / 16;
        for (int64_t r = r0; r < r1; r += 16) {
            const int rows = r1 - r < 16 ? (int)(r1 - r) : 16;
            for (int i = 0; i < 16; i++)
                for (int k = 0; k < nk; k++) _mm512_store_ps(acc[i] + 16 * k, _mm512_setzero_ps());
            for (int64_t g = 0; g < groups; g++) {
                /* A rows: the weight rows themselves, or the partial tile's rows copied beside zero rows */
                const uint8_t *grp = w + (size_t)r * row_bytes + (size_t)(8 * g) * HYMT_Q8_0_BYTES;
                size_t stride = row_bytes;
                if (rows < 16) {
                    memset(part, 0, sizeof part);
                    for (int i = 0; i < rows; i++)
                        memcpy(part + i * 8 * HYMT_Q8_0_BYTES, grp + (size_t)i * row_bytes, 8 * HYMT_Q8_0_BYTES);
                    grp = part;
                    stride = 8 * HYMT_Q8_0_BYTES;
                }
                const uint8_t *src = grp + 2;
                for (int k = 0; k < nk;) {
                    const int pair = k + 1 < nk, kn = k + 1 + pair;
                    const int8_t *vbk = bt->vb + ((size_t)g * tiles + t0 / 16 + k) * 8 * 512;
                    hymt_q8_0_amx_prefetch(w, row_bytes, r, r1, g, groups, 16 * k / nk, 16 * kn / nk);
                    __m512 gacc[16];
                    for (int i = 0; i < 16; i++) gacc[i] = _mm512_setzero_ps();
                    if (pair) {
                        HYMT_Q8_0_AMX_STEP(HYMT_Q8_0_AMX_PAIR_PRODUCT, HYMT_Q8_0_AMX_PAIR_STORES);
                        hymt_q8_0_amx_accumulate(acc, 16 * k, bt->sv + ((size_t)g * tiles + t0 / 16 + k) * 16, gacc);
#pragma GCC unroll 8
                        for (int b = 0; b < 8; b++) HYMT_Q8_0_AMX_FLOAT_FROM(cbuf2[b], b);
                        hymt_q8_0_amx_accumulate(acc, 16 * (k + 1), bt->sv + ((size_t)g * tiles + t0 / 16 + k + 1) * 16, gacc);
                    } else {
                        /* the next step's B tiles: this group's next token tile, else the next group's first */
                        const int8_t *vbn = kn < nk ? bt->vb + ((size_t)g * tiles + t0 / 16 + kn) * 8 * 512
                                                    : bt->vb + ((size_t)(g + 1 < groups ? g + 1 : 0) * tiles + t0 / 16) * 8 * 512;
                        HYMT_Q8_0_AMX_STEP(HYMT_Q8_0_AMX_SINGLE_PRODUCT, HYMT_Q8_0_AMX_SINGLE_STORE);
                        hymt_q8_0_amx_accumulate(acc, 16 * k, bt->sv + ((size_t)g * tiles + t0 / 16 + k) * 16, gacc);
                    }
                    k = kn;
                }
            }
            /* [row][token] → y[token][row], 16 × 16 at a time */
            const __mmask16 live = (__mmask16)((1u << rows) - 1);
            for (int k = 0; k < nk; k++) {
                __m512i v[16], vt[16]; /* [row] 16 tokens' sums; [token] 16 rows' sums */
                for (int i = 0; i < 16; i++) v[i] = _mm512_castps_si512(_mm512_load_ps(acc[i] + 16 * k));
                hymt_transpose16_epi32(v, vt);
                const int live_t = np - 16 * k < 16 ? np - 16 * k : 16;
                for (int t = 0; t < live_t; t++)
                    _mm512_mask_storeu_ps(y + (t0 + 16 * k + t) * y_stride + r, live, _mm512_castsi512_ps(vt[t]));
            }
        }
    }
    hymt_amx_release();
}
#undef HYMT_Q8_0_AMX_PRODUCT
#undef HYMT_Q8_0_AMX_STORE
#undef HYMT_Q8_0_AMX_PAIR
#undef HYMT_Q8_0_AMX_PAIR_STORE
#undef HYMT_Q8_0_AMX_FLOAT_FROM
#undef HYMT_Q8_0_AMX_SINGLE_PRODUCT
#undef HYMT_Q8_0_AMX_SINGLE_STORE
#undef HYMT_Q8_0_AMX_PAIR_PRODUCT
#undef HYMT_Q8_0_AMX_PAIR_STORES
#undef HYMT_Q8_0_AMX_STEP
#undef HYMT_Q8_0_AMX_FLOAT

/* The avx512 entry of the format: tiles for batches when AMX is on (and the panel's int32 row offsets
 * fit), else the vector kernel (same bits). */
HYMT_TARGET_AVX512 static void hymt_gemm_q8_0_avx512_amx(const uint8_t *w, size_t row_bytes, int64_t r0,
                                                         int64_t r1, const uint8_t *act, size_t act_stride,
                                                         int64_t n, int64_t cols, float *y, int64_t y_stride) {
    if (n >= HYMT_Q8_0_AMX_MIN && row_bytes <= ((size_t)1 << 26) && hymt_amx_active())
        hymt_gemm_q8_0_amx(w, row_bytes, r0, r1, act, act_stride, n, cols, y, y_stride);
    else
        hymt_gemm_q8_0_avx512(w, row_bytes, r0, r1, act, act_stride, n, cols, y, y_stride);
}
#endif /* HYMT_HAVE_AMX */

#if defined(HYMT_ARM64)
/* NEON SDOT: two vdotq_s32 and a lane sum give a block's exact isum; the float steps are the scalar
 * definition's (fmaf is one fused instruction on aarch64). */
HYMT_TARGET_DOTPROD static void hymt_gemm_q8_0_neon(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                    const uint8_t *act, size_t act_stride, int64_t n,
                                                    int64_t cols, float *y, int64_t y_stride) {
    int64_t groups = cols / 256;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = w + (size_t)r * row_bytes;
        for (int64_t t = 0; t < n; t++) {
            const hymt_q8_0_act *a = (const hymt_q8_0_act *)(act + (size_t)t * act_stride);
            float total = 0.0f;
            for (int64_t g = 0; g < groups; g++) {
                float gacc = 0.0f;
                for (int k = 0; k < 8; k++) {
                    const uint8_t *blk = row + (size_t)(8 * g + k) * HYMT_Q8_0_BYTES;
                    const int8_t *qa = a[g].qs + 32 * k;
                    int32x4_t s = vdotq_s32(vdupq_n_s32(0), vld1q_s8((const int8_t *)(blk + 2)), vld1q_s8(qa));
                    s = vdotq_s32(s, vld1q_s8((const int8_t *)(blk + 18)), vld1q_s8(qa + 16));
                    gacc = fmaf(hymt_fp16_to_f32(hymt_load_u16(blk)), (float)vaddvq_s32(s), gacc);
                }
                total = fmaf(a[g].s, gacc, total);
            }
            y[t * y_stride + r] = total;
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
#if defined(HYMT_HAVE_AMX)
            [HYMT_ISA_AVX2] = hymt_gemm_q8_0_avx2,
            [HYMT_ISA_AVX512] = hymt_gemm_q8_0_avx512_amx,
#elif defined(HYMT_X86)
            [HYMT_ISA_AVX2] = hymt_gemm_q8_0_avx2,
            [HYMT_ISA_AVX512] = hymt_gemm_q8_0_avx512,
#endif
#if defined(HYMT_ARM64)
            [HYMT_ISA_NEON] = hymt_gemm_q8_0_neon,
#endif
        },
};

#endif /* HYMT_FMT_Q8_0_H */
