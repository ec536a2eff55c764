/* fmt_q2_0c.h — Tencent Q2_0C ("2Bit"), REFERENCE.md §2.5: 512 weights in 130 bytes.
 *
 * Block bytes: [0, 2) fp16 scale d (first), [2, 130) four 2-bit codes per byte, low bits first:
 * code(i) = (byte[2 + i/4] >> 2·(i % 4)) & 3, w[i] = f32(2·code − 3) × d.
 *
 * int8 path (§3.4): a block spans two activation groups of 256 (halves h = 0, 1, code bytes
 * [2 + 64h, 66 + 64h)). Activation layout: each group is de-interleaved into 4 planes of 64,
 *     act.qs[64p + j] = q[4j + p],
 * so bits 2p..2p+1 of code byte j (a "plane" after one shift and mask) line up with plane p, and
 *     Σ (2·code − 3)·q = 2·Σ code·q − 3·Σ q   (exact int32).
 * Float part, fixed for every ISA: y[t, r] = Σ_b Σ_h (d_b × s_t,2b+h) × f32(isum_t,r,b,h), added in
 * (b, h) order from 0.0f (no fma).
 *
 * AVX-512, n < Q2C_BATCH_MIN: the code bytes of 16 rows are transposed per half (lane = row; up to 5
 * tokens lane j reads rows r + jS .. r + jS + S − 1 of a super panel, see Q2C_LANE_ROWS), one
 * AND per plane (scaled planes, one accumulator each), one vpdpbusd with a broadcast activation dword
 * per 4 weights × 16 rows × token; no horizontal sums. AVX-512, n ≥ Q2C_BATCH_MIN: the same
 * transposed planes buffered per 32-row tile and chunk, one vpdpbusd per 4 weights × 16 rows
 * × token. AVX2: shift/mask planes, maddubs + madd. NEON: signed digits 2·code − 3, SDOT. */
#ifndef HYMT_FMT_Q2_0C_H
#define HYMT_FMT_Q2_0C_H

#include "hymt_common.h"
#include "act_q8g.h"
#include "cpu.h"
#include "vec.h"
#include "lowbit_common.h"
#include "lowbit_amx.h"

#define Q2C_BLOCK 512
#define Q2C_BYTES 130

HYMT_INLINE int q2c_code(const uint8_t *blk, int i) { return (blk[2 + (i >> 2)] >> (2 * (i & 3))) & 3; }

/* ---- decoder (§2.5, bit-exact: w = f32(2·code − 3) × d) ---- */

static void hymt_decode_q2_0c(const uint8_t *src, float *dst, int64_t nblocks) {
    for (int64_t b = 0; b < nblocks; b++) {
        const uint8_t *blk = src + b * Q2C_BYTES;
        float d = hymt_fp16_to_f32(hymt_load_u16(blk));
        for (int i = 0; i < Q2C_BLOCK; i++) dst[b * Q2C_BLOCK + i] = (float)(2 * q2c_code(blk, i) - 3) * d;
    }
}

/* ---- float32 path (§3.3): Σ_blocks d × dot(2·code − 3, x_block) ---- */

static float hymt_row_dot_f32_q2_0c(const uint8_t *row, const float *x, int64_t cols) {
    float units[Q2C_BLOCK]; /* [512] 2·code − 3 of one block */
    float total = 0.0f;
    for (int64_t b = 0; b < cols / Q2C_BLOCK; b++) {
        const uint8_t *blk = row + b * Q2C_BYTES;
        for (int i = 0; i < Q2C_BLOCK; i++) units[i] = (float)(2 * q2c_code(blk, i) - 3);
        float d = hymt_fp16_to_f32(hymt_load_u16(blk));
        total += d * hymt_dot_f32(units, x + b * Q2C_BLOCK, Q2C_BLOCK);
    }
    return total;
}

/* ---- activations: §3.4 groups, qs de-interleaved into planes (bsums recomputed per 16 bytes) ---- */

static size_t hymt_act_stride_q2_0c(int64_t cols, int64_t n) {
    (void)n;
    return hymt_act_stride_q8g(cols);
}

/* qs[64p + j] = natural[4j + p]; bsums of the new 16-byte chunks. */
static void q2c_deinterleave_scalar(hymt_q8g *g) {
    int8_t natural[256];
    memcpy(natural, g->qs, sizeof natural);
    for (int j = 0; j < 64; j++)
        for (int p = 0; p < 4; p++) g->qs[64 * p + j] = natural[4 * j + p];
    for (int c = 0; c < 16; c++) {
        int s = 0;
        for (int i = 16 * c; i < 16 * c + 16; i++) s += g->qs[i];
        g->bsums[c] = (int16_t)s;
    }
}

#if defined(HYMT_X86)
/* One group quantized to the values of hymt_quantize_group_q8g (act_q8g.h: the same max, scale and
 * inverse; NaN products to 0, the clamp to ±127, then one conversion rounding half to even — clamping
 * before rounding is the same at integer bounds), stored de-interleaved without a pass through memory:
 * the 64 bytes of each quarter are shuffled inside their 128-bit lanes (plane p of 4 j's per dword),
 * dword-permuted (plane p of 16 j's per lane), and the four quarters' lanes transposed (4×4); bsums and
 * sum by hymt_q8g_chunk_sums_avx512. */
HYMT_TARGET_AVX512 static void q2c_quantize_group_avx512(const float *x, hymt_q8g *g) {
    const __m512 sign = _mm512_set1_ps(-0.0f);
    __m512 m[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int i = 0; i < HYMT_Q8G_SIZE; i += 16) /* max(a, m) keeps m when a is NaN: m is never NaN */
        m[i / 16 % 4] = _mm512_max_ps(_mm512_andnot_ps(sign, _mm512_loadu_ps(x + i)), m[i / 16 % 4]);
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m[0], m[1]), _mm512_max_ps(m[2], m[3])));
    float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
    g->d = amax > 0.0f ? amax / 127.0f : 0.0f;
    const __m512 inv = _mm512_set1_ps(inverse), hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
    const __m512i in_lane = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
    const __m512i lanes = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    __m512i quarter[4]; /* quarter m, 128-bit lane p: plane p of j = 16m..16m+15 */
    for (int qm = 0; qm < 4; qm++) {
        __m128i b8[4]; /* q[64qm + 16k ..] as bytes */
        for (int k = 0; k < 4; k++) {
            __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + 64 * qm + 16 * k), inv);
            v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v); /* NaN -> 0 */
            __m512 clamped = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
            b8[k] = _mm512_cvtepi32_epi8(_mm512_cvt_roundps_epi32(clamped, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        }
        __m512i natural = _mm512_inserti32x4(_mm512_castsi128_si512(b8[0]), b8[1], 1);
        natural = _mm512_inserti32x4(_mm512_inserti32x4(natural, b8[2], 2), b8[3], 3);
        quarter[qm] = _mm512_permutexvar_epi32(lanes, _mm512_shuffle_epi8(natural, in_lane));
    }
    __m512i pair[4] = {_mm512_shuffle_i64x2(quarter[0], quarter[1], _MM_SHUFFLE(1, 0, 1, 0)),  /* q0p0 q0p1 q1p0 q1p1 */
                       _mm512_shuffle_i64x2(quarter[0], quarter[1], _MM_SHUFFLE(3, 2, 3, 2)),  /* q0p2 q0p3 q1p2 q1p3 */
                       _mm512_shuffle_i64x2(quarter[2], quarter[3], _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm512_shuffle_i64x2(quarter[2], quarter[3], _MM_SHUFFLE(3, 2, 3, 2))};
    __m512i plane[4] = {_mm512_shuffle_i64x2(pair[0], pair[2], _MM_SHUFFLE(2, 0, 2, 0)),
                        _mm512_shuffle_i64x2(pair[0], pair[2], _MM_SHUFFLE(3, 1, 3, 1)),
                        _mm512_shuffle_i64x2(pair[1], pair[3], _MM_SHUFFLE(2, 0, 2, 0)),
                        _mm512_shuffle_i64x2(pair[1], pair[3], _MM_SHUFFLE(3, 1, 3, 1))};
    for (int p = 0; p < 4; p++) _mm512_storeu_si512((void *)(g->qs + 64 * p), plane[p]);
    g->sum = hymt_q8g_chunk_sums_avx512(plane, g->bsums);
    memset(g->pad, 0, sizeof g->pad);
}
#endif

static void hymt_prepare_q2_0c(const float *x, int64_t cols, int64_t n, uint8_t *act) {
    (void)n;
    hymt_q8g *groups = (hymt_q8g *)act;
    for (int64_t k = 0; k < cols / HYMT_Q8G_SIZE; k++) {
        hymt_q8g *g = groups + k;
#if defined(HYMT_X86)
        if (hymt_active_isa == HYMT_ISA_AVX512) {
            q2c_quantize_group_avx512(x + k * HYMT_Q8G_SIZE, g);
            continue;
        }
#endif
        hymt_quantize_group_q8g(x + k * HYMT_Q8G_SIZE, g);
        q2c_deinterleave_scalar(g);
    }
}

/* ---- int8 GEMM: scalar reference ---- */

/* Exact Σ (2·code − 3)·q of half h of a block against its de-interleaved activation group. */
static inline int32_t q2c_half_isum_scalar(const uint8_t *blk, int h, const hymt_q8g *a) {
    int32_t codes = 0;
    for (int j = 0; j < 64; j++) {
        int byte = blk[2 + 64 * h + j];
        for (int p = 0; p < 4; p++) codes += ((byte >> (2 * p)) & 3) * a->qs[64 * p + j];
    }
    return 2 * codes - 3 * a->sum;
}

static void hymt_gemm_q2_0c_scalar(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1, const uint8_t *act,
                                   size_t act_stride, int64_t n, int64_t cols, float *y, int64_t y_stride) {
    int64_t nb = cols / Q2C_BLOCK;
    for (int64_t t = 0; t < n; t++) {
        const hymt_q8g *a = (const hymt_q8g *)(act + t * act_stride);
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *row = w + r * row_bytes;
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = row + b * Q2C_BYTES;
                float d = hymt_fp16_to_f32(hymt_load_u16(blk));
                for (int h = 0; h < 2; h++)
                    acc += (d * a[2 * b + h].d) * (float)q2c_half_isum_scalar(blk, h, a + 2 * b + h);
            }
            y[t * y_stride + r] = acc;
        }
    }
}

/* ---- AVX-512 ---- */
#if defined(HYMT_X86)

/* Calls with fewer tokens run the small-batch kernel (decode pass per 4 tokens), more the batched one
 * (planes buffered once for every token tile). */
#define Q2C_BATCH_MIN 9
/* The small-batch kernel reads 16 rows side by side, a pattern the hardware streamers do not follow:
 * it prefetches the row tile this many tiles ahead, in memory order, into L2. The prefetches stop at the
 * end of the rows the kernel was given (past it lie the rows of the other thread's chunk: fetching them
 * here read them twice) and the first tiles of a call's rows are prefetched on entry (nothing ran ahead
 * of them). Measured, 2048×2048 from DRAM at 2 threads, n = 1: 17.4 → 23.1 GB/s (4 tiles ahead,
 * unclamped → 2, clamped, with the entry prefetch); 1 or 3 tiles: 22.2–22.6; _MM_HINT_T0: 21.1.
 * (That is the S = 1 path: 6..8 tokens, or rows too far apart for the gather offsets.)
 * Each half-block step prefetches its 16–17 lines (1040 bytes) one per line, each line once, one in each
 * of the 16 iterations of the step's j loop (the compute runs between them) and the rest after it. The
 * position of the prefetches in the step matters as much as the distance (same lines, layer cycle from
 * a 1 GB pool, n = 1, one thread, medians of alternated runs): main's burst of 18 prefetches after the
 * step's loads (a line repeated per step) 11.0–11.5 GB/s; one per line, burst after the loads 10.8–11.1,
 * before the loads 9.3, after the j loop 9.3, in the middle of it 10.0; one per j iteration 12.7–12.8
 * (n = 2 +8–12 %, n = 4 +2–4 %, n = 8 same; cache-resident within noise). Two threads (a shared machine,
 * few undisturbed runs): 20.5 → 22.0 GB/s. Tried, worse at one thread: T0 −15 %, NTA −60 %, every 2nd or
 * 4th line only (the hardware prefetchers do not fill in: no prefetch at all runs at 5.4) −25 to −35 %,
 * a whole tile in one burst −25 %, T0 of the next step's 16 rows −10 %, a T0 run-ahead 2–4 KB besides
 * −17 to −25 % (8 KB: same); not stopping at the call's end +2 % at one thread, −2 % at two. */
#define Q2C_PREFETCH_TILES 2
/* Super panels (q2c_gemm_lanes, up to Q2C_LANE_TOKENS tokens): 16 side-by-side rows are 16 short
 * streams (a 2048-column row is 520 bytes) that the hardware prefetchers follow badly, so a range of
 * 16·S rows (S = Q2C_LANE_ROWS, fewer for a short range) is read in S passes, lane j of pass i computing
 * row r + jS + i: each lane streams S consecutive rows (S = 64: 33 KB at 2048 columns) and its result is
 * scattered to its row (values are per row: bit-identical). In iteration j of each half-block step lane
 * j's line Q2C_LANE_PREFETCH bytes ahead along the lane is prefetched into L1. Measured (size.py, one
 * shape cycled through 1 GiB, n = 1, ratio to the read rate, 2 threads, 2048×2048 / 12288×2048 /
 * 2048×6144 / 131072×2048): linear tile prefetch (S = 1) 0.69 / 0.85 / 0.76 / 0.92; S = 64 with 512
 * bytes 0.80 / 0.98 / 0.96 / 1.01 (1 thread 0.90 → 1.00 for 2048×2048); S = 16: 0.78 / 0.85 / 0.89 /
 * 0.87 (lanes of 8 KB); S = 32 0.80 / 0.91 / 0.89 / 0.95; distance 128 −15 to −20 %, 256 −2 to −8 %,
 * 1024 and 2048 −10 to −25 %; _MM_HINT_T1 same as T0. kernelbench n = 1..4, 2 threads: 80 / 92 / 103 /
 * 118 → 70 / 74 / 87 / 116 µs; n = 5 (q2c_lanes8_tile) 142 → 126; n = 6, 7 are compute-bound (same or
 * up to −9 % with super panels): they keep S = 1. */
#define Q2C_LANE_TOKENS 5
#define Q2C_LANE_ROWS 64
#define Q2C_LANE_PREFETCH 512

/* The 4 int8 activations at q in every dword lane. */
HYMT_TARGET_AVX512 HYMT_INLINE __m512i q2c_bcast4(const int8_t *q) {
    int32_t v;
    memcpy(&v, q, 4);
    return _mm512_set1_epi32(v);
}

/* The 64 code bytes of half h of block b for a tile's rows (rows past `rows` read as 0), transposed so
 * that c[j] lane i holds bytes 4j..4j+3 of row i. */
HYMT_TARGET_AVX512 HYMT_INLINE void q2c_half_codes(const uint8_t *wt, size_t row_bytes, int rows, int64_t b, int h,
                                                   __m512i c[16]) {
    __m512i rc[16];
    for (int i = 0; i < 16; i++)
        rc[i] = i < rows ? _mm512_loadu_si512((const void *)(wt + i * row_bytes + b * Q2C_BYTES + 2 + 64 * h))
                         : _mm512_setzero_si512();
    hymt_transpose16_epi32(rc, c);
}

/* The float step of one half for 16 rows: s = Σ code·q (exact), isum = 2s − 3·Σq, and
 * facc + (d × s_group) × f32(isum), the fixed sequence of the header comment. */
HYMT_TARGET_AVX512 HYMT_INLINE __m512 q2c_half_epilogue(__m512 facc, __m512i s, __m512 d, const hymt_q8g *g) {
    __m512i isum = _mm512_sub_epi32(_mm512_add_epi32(s, s), _mm512_set1_epi32(3 * g->sum));
    return _mm512_add_ps(facc, _mm512_mul_ps(_mm512_mul_ps(d, _mm512_set1_ps(g->d)), _mm512_cvtepi32_ps(isum)));
}

/* ---- AVX-512 small-batch kernel (n < Q2C_BATCH_MIN): lane = row, codes transposed per half ----
 * The 64 code bytes of 16 rows are loaded side by side and transposed (16×16 dwords): vector j
 * holds code bytes 4j..4j+3 of every row. A mask gives plane p scaled, 4^p · code, so each plane
 * costs one AND and has its own accumulator: one vpdpbusd per plane with the broadcast activation
 * dword qs[64p + 4j] (4 weights × 16 rows × token). Per half the planes are combined exactly
 * (acc_p is a multiple of 4^p) and the float epilogue runs once per 16 rows: no horizontal sums. */
HYMT_TARGET_AVX512 HYMT_INLINE void q2c_lanes_tile(const uint8_t *wt, size_t row_bytes, int rows, int64_t nb,
                                                   __m512i row_offsets, const hymt_q8g *g0, size_t ts, float *y,
                                                   int64_t y_stride, const uint8_t *pf_end, int64_t S,
                                                   __m512i lanes, const int T) {
    const __m512i m0 = _mm512_set1_epi8(0x03), m1 = _mm512_set1_epi8(0x0c), m2 = _mm512_set1_epi8(0x30),
                  m3 = _mm512_set1_epi8((char)0xc0);
    __mmask16 row_mask = (__mmask16)((1u << rows) - 1u);
    const uint8_t *pf = wt + (size_t)Q2C_PREFETCH_TILES * 16 * row_bytes;
    size_t pf_step = 8 * row_bytes / (size_t)nb; /* bytes of a tile per half-block step */
    __m512 facc[4]; /* [token] lane i: y of row i */
    _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) facc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512 d = hymt_gather_scales(wt, row_offsets, row_mask, b * Q2C_BYTES, 0);
        for (int h = 0; h < 2; h++) {
            __m512i c[16];
            q2c_half_codes(wt, row_bytes, rows, b, h, c);
            const hymt_lines pl = hymt_step_lines(pf, pf + pf_step, pf_end); /* 16 or 17 lines */
            pf += pf_step;
            const uint8_t *lpf = wt + b * Q2C_BYTES + 64 * h + Q2C_LANE_PREFETCH; /* S > 1: lane 0's */
            __m512i acc[4][4]; /* [token][plane] */
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] =
                _mm512_setzero_si512();
            const hymt_q8g *g = g0 + 2 * b + h;
            _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++) {
                if (S > 1)
                    _mm_prefetch((const char *)(lpf + j * row_bytes), _MM_HINT_T0);
                else
                    hymt_prefetch_line(pl, j);
                __m512i p0 = _mm512_and_si512(c[j], m0), p1 = _mm512_and_si512(c[j], m1),
                        p2 = _mm512_and_si512(c[j], m2), p3 = _mm512_and_si512(c[j], m3);
                _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
                    const int8_t *q = g[t * ts].qs + 4 * j;
                    acc[t][0] = _mm512_dpbusd_epi32(acc[t][0], p0, q2c_bcast4(q));
                    acc[t][1] = _mm512_dpbusd_epi32(acc[t][1], p1, q2c_bcast4(q + 64));
                    acc[t][2] = _mm512_dpbusd_epi32(acc[t][2], p2, q2c_bcast4(q + 128));
                    acc[t][3] = _mm512_dpbusd_epi32(acc[t][3], p3, q2c_bcast4(q + 192));
                }
            }
            if (S == 1) hymt_prefetch_rest(pl);
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
                __m512i s = _mm512_add_epi32(_mm512_add_epi32(acc[t][0], _mm512_srai_epi32(acc[t][1], 2)),
                                             _mm512_add_epi32(_mm512_srai_epi32(acc[t][2], 4), _mm512_srai_epi32(acc[t][3], 6)));
                facc[t] = q2c_half_epilogue(facc[t], s, d, g + t * ts);
            }
        }
    }
    _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)
        hymt_store_lane_rows_avx512(y + t * y_stride, S, lanes, row_mask, facc[t]);
}

/* 5..8 tokens: four accumulators per token do not fit the registers, so planes pair up by scale:
 * code bits 0–1 and 4–5 (masks 0x03 after shifts of 0 and 4) in one accumulator, bits 2–3 and 6–7
 * (masks 0x0c: 4 · code) in the other, combined per half as acc_1 + acc_4 / 4. */
HYMT_TARGET_AVX512 HYMT_INLINE void q2c_lanes8_tile(const uint8_t *wt, size_t row_bytes, int rows, int64_t nb,
                                                    __m512i row_offsets, const hymt_q8g *g0, size_t ts, float *y,
                                                    int64_t y_stride, const uint8_t *pf_end, int64_t S,
                                                    __m512i lanes, const int T) {
    const __m512i m0 = _mm512_set1_epi8(0x03), m1 = _mm512_set1_epi8(0x0c);
    __mmask16 row_mask = (__mmask16)((1u << rows) - 1u);
    const uint8_t *pf = wt + (size_t)Q2C_PREFETCH_TILES * 16 * row_bytes;
    size_t pf_step = 8 * row_bytes / (size_t)nb; /* bytes of a tile per half-block step */
    __m512 facc[8]; /* [token] lane i: y of row i */
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) facc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512 d = hymt_gather_scales(wt, row_offsets, row_mask, b * Q2C_BYTES, 0);
        for (int h = 0; h < 2; h++) {
            __m512i c[16];
            q2c_half_codes(wt, row_bytes, rows, b, h, c);
            const hymt_lines pl = hymt_step_lines(pf, pf + pf_step, pf_end); /* 16 or 17 lines */
            pf += pf_step;
            const uint8_t *lpf = wt + b * Q2C_BYTES + 64 * h + Q2C_LANE_PREFETCH; /* S > 1: lane 0's */
            __m512i acc1[8], acc4[8]; /* [token]: planes 0, 2 (unit scale); planes 1, 3 (scale 4) */
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) acc1[t] = acc4[t] = _mm512_setzero_si512();
            const hymt_q8g *g = g0 + 2 * b + h;
            _Pragma("GCC unroll 2") for (int j = 0; j < 16; j++) {
                if (S > 1)
                    _mm_prefetch((const char *)(lpf + j * row_bytes), _MM_HINT_T0);
                else
                    hymt_prefetch_line(pl, j);
                __m512i hi = _mm512_srli_epi16(c[j], 4);
                __m512i p0 = _mm512_and_si512(c[j], m0), p1 = _mm512_and_si512(c[j], m1),
                        p2 = _mm512_and_si512(hi, m0), p3 = _mm512_and_si512(hi, m1);
                _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
                    const int8_t *q = g[t * ts].qs + 4 * j;
                    acc1[t] = _mm512_dpbusd_epi32(acc1[t], p0, q2c_bcast4(q));
                    acc4[t] = _mm512_dpbusd_epi32(acc4[t], p1, q2c_bcast4(q + 64));
                    acc1[t] = _mm512_dpbusd_epi32(acc1[t], p2, q2c_bcast4(q + 128));
                    acc4[t] = _mm512_dpbusd_epi32(acc4[t], p3, q2c_bcast4(q + 192));
                }
            }
            if (S == 1) hymt_prefetch_rest(pl);
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
                __m512i s = _mm512_add_epi32(acc1[t], _mm512_srai_epi32(acc4[t], 2));
                facc[t] = q2c_half_epilogue(facc[t], s, d, g + t * ts);
            }
        }
    }
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++)
        hymt_store_lane_rows_avx512(y + t * y_stride, S, lanes, row_mask, facc[t]);
}

HYMT_TARGET_AVX512 static void q2c_gemm_lanes(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                              const uint8_t *act, size_t act_stride, int64_t n, int64_t cols,
                                              float *y, int64_t y_stride) {
    int64_t nb = cols / Q2C_BLOCK;
    size_t ts = act_stride / sizeof(hymt_q8g); /* groups between tokens */
    const uint8_t *pf_end = w + r1 * row_bytes;
    /* the scale gather's lane offsets (up to 15·S·row_bytes) must fit int32 for S > 1 */
    const int strided = n <= Q2C_LANE_TOKENS && (size_t)15 * Q2C_LANE_ROWS * row_bytes <= (size_t)INT32_MAX;
    if (!strided) {
        const uint8_t *start = w + r0 * row_bytes; /* the tiles the first steps' prefetches skipped */
        hymt_lines first = hymt_step_lines(start, start + (size_t)Q2C_PREFETCH_TILES * 16 * row_bytes, pf_end);
        first.lo = (const uint8_t *)((uintptr_t)start & ~(uintptr_t)63); /* with the line start is in */
        for (const uint8_t *p = first.lo; p < first.hi; p += 64) _mm_prefetch((const char *)p, _MM_HINT_T1);
    }
    for (int64_t r = r0; r < r1;) {
        const int64_t left = r1 - r;
        const int64_t S = hymt_lane_rows(left, 16, Q2C_LANE_ROWS, strided);
        const size_t ls = (size_t)S * row_bytes; /* from one lane's row to the next lane's */
        const __m512i row_offsets = hymt_row_offsets(ls), lanes = hymt_lane_rows_avx512(S);
        int rows = (int)(left < 16 ? left : 16);
        for (int64_t i = 0; i < S; i++) {
            const uint8_t *wt = w + (r + i) * row_bytes; /* lane 0's row of this pass */
            for (int64_t t0 = 0; t0 < n;) {
                int tt = (int)(n - t0 < 8 ? n - t0 : 8);
                const hymt_q8g *g0 = (const hymt_q8g *)(act + t0 * act_stride);
                float *yt = y + t0 * y_stride + r + i;
                switch (tt) {
                case 8: q2c_lanes8_tile(wt, ls, rows, nb, row_offsets, g0, ts, yt, y_stride, pf_end, S, lanes, 8); break;
                case 7: q2c_lanes8_tile(wt, ls, rows, nb, row_offsets, g0, ts, yt, y_stride, pf_end, S, lanes, 7); break;
                case 6: q2c_lanes8_tile(wt, ls, rows, nb, row_offsets, g0, ts, yt, y_stride, pf_end, S, lanes, 6); break;
                case 5: q2c_lanes8_tile(wt, ls, rows, nb, row_offsets, g0, ts, yt, y_stride, pf_end, S, lanes, 5); break;
                case 4: q2c_lanes_tile(wt, ls, rows, nb, row_offsets, g0, ts, yt, y_stride, pf_end, S, lanes, 4); break;
                case 3: q2c_lanes_tile(wt, ls, rows, nb, row_offsets, g0, ts, yt, y_stride, pf_end, S, lanes, 3); break;
                case 2: q2c_lanes_tile(wt, ls, rows, nb, row_offsets, g0, ts, yt, y_stride, pf_end, S, lanes, 2); break;
                default: q2c_lanes_tile(wt, ls, rows, nb, row_offsets, g0, ts, yt, y_stride, pf_end, S, lanes, 1); break;
                }
                t0 += tt;
            }
        }
        r += S > 1 ? 16 * S : rows;
    }
}

/* ---- AVX-512 batched kernel (n ≥ Q2C_BATCH_MIN) ----
 * Per half-block, the 64 code bytes of 16 rows are transposed (16×16 dwords) so vector j holds code
 * bytes 4j..4j+3 of every row; its 4 planes are buffered as 2·code (shift, mask), and each token's
 * activation dword qs[64p + 4j] is broadcast into one vpdpbusd per plane: 4 weights × 16 rows × token
 * per instruction, no reduction. The accumulators start at −3·Σq, so they end at isum exactly. Two
 * 16-row halves share each broadcast load (32 rows × up to 8 tokens per step). Planes are built once
 * per 32-row tile and chunk and reused by every token sub-tile. */
#define Q2C_TILE_HALVES 4 /* half-blocks of transposed planes buffered per 32-row tile (32 KB) */

HYMT_TARGET_AVX512 HYMT_INLINE void q2c_tile(const __m512i (*pl)[4][16], const hymt_q8g *g0, size_t ts,
                                             const float (*dv)[16], float (*facc)[8][16], const int T) {
    __m512i acc0[8], acc1[8]; /* [token] lane i: row i of each 16-row half; start at −3·Σq, end at isum */
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) acc0[t] = acc1[t] = _mm512_set1_epi32(-3 * g0[t * ts].sum);
    for (int j = 0; j < 16; j++) {
        _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
            __m512i wk0 = _mm512_load_si512((const void *)&pl[0][p][j]);
            __m512i wk1 = _mm512_load_si512((const void *)&pl[1][p][j]);
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
                int32_t a4;
                memcpy(&a4, g0[t * ts].qs + 64 * p + 4 * j, 4);
                __m512i a = _mm512_set1_epi32(a4);
                acc0[t] = _mm512_dpbusd_epi32(acc0[t], wk0, a);
                acc1[t] = _mm512_dpbusd_epi32(acc1[t], wk1, a);
            }
        }
    }
    __m512 d0 = _mm512_load_ps(dv[0]), d1 = _mm512_load_ps(dv[1]);
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
        __m512 s = _mm512_set1_ps(g0[t * ts].d);
        _mm512_store_ps(facc[0][t], _mm512_add_ps(_mm512_load_ps(facc[0][t]),
                                                  _mm512_mul_ps(_mm512_mul_ps(d0, s), _mm512_cvtepi32_ps(acc0[t]))));
        _mm512_store_ps(facc[1][t], _mm512_add_ps(_mm512_load_ps(facc[1][t]),
                                                  _mm512_mul_ps(_mm512_mul_ps(d1, s), _mm512_cvtepi32_ps(acc1[t]))));
    }
}

HYMT_TARGET_AVX512 static void q2c_gemm_tiles(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                              const uint8_t *act, size_t act_stride, int64_t n, int64_t cols,
                                              float *y, int64_t y_stride) {
    int64_t nh = 2 * (cols / Q2C_BLOCK); /* half-blocks per row = activation groups */
    const __m512i six = _mm512_set1_epi8(6);
    __m512i row_offsets = hymt_row_offsets(row_bytes);
    HYMT_ALIGNED64 __m512i pl[Q2C_TILE_HALVES][2][4][16]; /* [half-block][row half][plane][j] 2·code */
    HYMT_ALIGNED64 float dv[Q2C_TILE_HALVES / 2][2][16];  /* [block][row half][row] scales */
    HYMT_ALIGNED64 float facc[2][8][16];                  /* [row half][token][row] running sums */
    const hymt_q8g *groups = (const hymt_q8g *)act;
    size_t ts = act_stride / sizeof(hymt_q8g);
    for (int64_t r = r0; r < r1; r += 32) {
        int rows = (int)(r1 - r < 32 ? r1 - r : 32);
        __mmask16 mask[2] = {(__mmask16)((1u << (rows < 16 ? rows : 16)) - 1u),
                             (__mmask16)((1u << (rows > 16 ? rows - 16 : 0)) - 1u)};
        const uint8_t *wt = w + r * row_bytes;
        for (int64_t h0 = 0; h0 < nh; h0 += Q2C_TILE_HALVES) {
            int nc = (int)(nh - h0 < Q2C_TILE_HALVES ? nh - h0 : Q2C_TILE_HALVES);
            for (int c = 0; c < nc; c++) {
                int64_t b = (h0 + c) / 2, half = (h0 + c) % 2;
                for (int rh = 0; rh < 2; rh++) {
                    __m512i rows_codes[16], codes[16];
                    for (int i = 0; i < 16; i++) {
                        if (16 * rh + i >= rows) {
                            rows_codes[i] = _mm512_setzero_si512();
                            continue;
                        }
                        const uint8_t *src = wt + (16 * rh + i) * row_bytes + b * Q2C_BYTES + 2 + 64 * half;
                        _mm_prefetch((const char *)src + 32 * row_bytes, _MM_HINT_T0);
                        _mm_prefetch((const char *)src + 32 * row_bytes + 63, _MM_HINT_T0);
                        rows_codes[i] = _mm512_loadu_si512((const void *)src);
                    }
                    hymt_transpose16_epi32(rows_codes, codes);
                    for (int j = 0; j < 16; j++) {
                        pl[c][rh][0][j] = _mm512_and_si512(_mm512_add_epi8(codes[j], codes[j]), six);
                        pl[c][rh][1][j] = _mm512_and_si512(_mm512_srli_epi16(codes[j], 1), six);
                        pl[c][rh][2][j] = _mm512_and_si512(_mm512_srli_epi16(codes[j], 3), six);
                        pl[c][rh][3][j] = _mm512_and_si512(_mm512_srli_epi16(codes[j], 5), six);
                    }
                    if (half == 0)
                        _mm512_store_ps(dv[c / 2][rh], hymt_gather_scales(wt + 16 * rh * row_bytes, row_offsets,
                                                                          mask[rh], b * Q2C_BYTES, 0));
                }
            }
            for (int64_t t0 = 0; t0 < n;) {
                int tt = hymt_token_subtile(n - t0 < 8 ? n - t0 : 8);
                for (int rh = 0; rh < 2; rh++)
                    for (int t = 0; t < tt; t++)
                        _mm512_store_ps(facc[rh][t], h0 == 0 ? _mm512_setzero_ps()
                                                             : _mm512_maskz_loadu_ps(mask[rh], y + (t0 + t) * y_stride + r + 16 * rh));
                const hymt_q8g *g0 = groups + t0 * ts + h0;
                for (int c = 0; c < nc; c++) {
                    switch (tt) {
                    case 8: q2c_tile(pl[c], g0 + c, ts, dv[c / 2], facc, 8); break;
                    case 4: q2c_tile(pl[c], g0 + c, ts, dv[c / 2], facc, 4); break;
                    case 2: q2c_tile(pl[c], g0 + c, ts, dv[c / 2], facc, 2); break;
                    default: q2c_tile(pl[c], g0 + c, ts, dv[c / 2], facc, 1); break;
                    }
                }
                for (int rh = 0; rh < 2; rh++)
                    for (int t = 0; t < tt; t++)
                        _mm512_mask_storeu_ps(y + (t0 + t) * y_stride + r + 16 * rh, mask[rh], _mm512_load_ps(facc[rh][t]));
                t0 += tt;
            }
        }
    }
}

/* ---- AMX batched kernel (n ≥ Q2C_AMX_MIN where hymt_amx_active(); lowbit_amx.h) ----
 * Half h of block b is activation group 2b + h. Its B tiles: the 64 code bytes of 16 rows transposed
 * (as the batched vector kernel does, vector j lane i = code bytes 4j..4j+3 of row i), then per plane
 * p one shift and one vpermb mapping the code in bits 2p..2p+1 to the signed unit 2·code − 3: plane p,
 * row j, dword i = the units that multiply act.qs[64p + 4j .. 64p + 4j + 3]; tdpbssd then gives
 * Σ (2·code − 3)·q directly (no − 3·Σq correction). */
#if defined(HYMT_HAVE_AMX)
#define Q2C_AMX_MIN 6 /* measured (n-row tiles below 16 tokens): n = 5 1.06x the vector kernels, n = 6 0.90x */

/* vpermb table: byte v = 2·(v & 3) − 3 (the index's low 2 bits are the code). */
HYMT_TARGET_AMX HYMT_INLINE void q2c_amx_tables(__m512i tab[4]) {
    static const int8_t units[4] = {-3, -1, 1, 3};
    int32_t four;
    memcpy(&four, units, 4);
    tab[0] = tab[1] = tab[2] = tab[3] = _mm512_set1_epi32(four);
}

/* Unit planes of group g of 16 rows, bt[plane][k/4][row·4 + k%4] (rows past `rows` read as code 0). */
HYMT_TARGET_AMX HYMT_INLINE void q2c_amx_decode(const uint8_t *wt, size_t row_bytes, int rows, int64_t g,
                                                const __m512i *tab, int8_t (*bt)[16][64]) {
    int64_t at = (g >> 1) * Q2C_BYTES + 2 + 64 * (g & 1); /* the group's code bytes in a row */
    __m512i rc[16], c[16]; /* [row] 64 code bytes; [j] lane i: code bytes 4j..4j+3 of row i */
    _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) {
        if (i >= rows) {
            rc[i] = _mm512_setzero_si512();
            continue;
        }
        const uint8_t *src = wt + i * row_bytes + at;
        _mm_prefetch((const char *)src + 32 * row_bytes, _MM_HINT_T0); /* the next 32-row tile */
        _mm_prefetch((const char *)src + 32 * row_bytes + 63, _MM_HINT_T0);
        rc[i] = _mm512_loadu_si512((const void *)src);
    }
    hymt_transpose16_epi32(rc, c);
    _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++) {
        _mm512_store_si512((void *)bt[0][j], _mm512_permutexvar_epi8(c[j], tab[0]));
        _mm512_store_si512((void *)bt[1][j], _mm512_permutexvar_epi8(_mm512_srli_epi16(c[j], 2), tab[0]));
        _mm512_store_si512((void *)bt[2][j], _mm512_permutexvar_epi8(_mm512_srli_epi16(c[j], 4), tab[0]));
        _mm512_store_si512((void *)bt[3][j], _mm512_permutexvar_epi8(_mm512_srli_epi16(c[j], 6), tab[0]));
    }
}

HYMT_TARGET_AMX HYMT_INLINE __m512 q2c_amx_scales(const uint8_t *wt, __m512i row_offsets, __mmask16 mask, int64_t g) {
    return hymt_gather_scales(wt, row_offsets, mask, (g >> 1) * Q2C_BYTES, 0);
}

HYMT_LOWBIT_AMX_GEMM(q2c_gemm_amx, q2c_amx_tables, q2c_amx_decode, q2c_amx_scales, hymt_gemm_q2_0c_scalar)
#endif /* HYMT_HAVE_AMX */

static void hymt_gemm_q2_0c_avx512(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1, const uint8_t *act,
                                   size_t act_stride, int64_t n, int64_t cols, float *y, int64_t y_stride) {
#if defined(HYMT_HAVE_AMX)
    if (n >= Q2C_AMX_MIN && cols > 0 && hymt_amx_active()) {
        q2c_gemm_amx(w, row_bytes, r0, r1, act, act_stride, n, cols, y, y_stride);
        return;
    }
#endif
    if (n >= Q2C_BATCH_MIN && cols > 0) /* (the tiles write y per block: none when cols = 0) */
        q2c_gemm_tiles(w, row_bytes, r0, r1, act, act_stride, n, cols, y, y_stride);
    else
        q2c_gemm_lanes(w, row_bytes, r0, r1, act, act_stride, n, cols, y, y_stride);
}

/* ---- AVX2: per half, two 32-byte code vectors, shift/mask planes, maddubs + madd ---- */

HYMT_TARGET_AVX2 static void hymt_gemm_q2_0c_avx2(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                  const uint8_t *act, size_t act_stride, int64_t n, int64_t cols,
                                                  float *y, int64_t y_stride) {
    int64_t nb = cols / Q2C_BLOCK;
    const __m256i three = _mm256_set1_epi8(3);
    const __m256i ones16 = _mm256_set1_epi16(1);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = w + r * row_bytes;
        for (int64_t t0 = 0; t0 < n; t0 += HYMT_LOWBIT_TOKEN_TILE) {
            int tt = (int)(n - t0 < HYMT_LOWBIT_TOKEN_TILE ? n - t0 : HYMT_LOWBIT_TOKEN_TILE);
            float acc[HYMT_LOWBIT_TOKEN_TILE] = {0};
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = row + b * Q2C_BYTES;
                float d = hymt_fp16_to_f32(hymt_load_u16(blk));
                for (int h = 0; h < 2; h++) {
                    __m256i pl[2][4]; /* [32-byte part][plane] */
                    for (int u = 0; u < 2; u++) {
                        __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 2 + 64 * h + 32 * u));
                        pl[u][0] = _mm256_and_si256(v, three);
                        pl[u][1] = _mm256_and_si256(_mm256_srli_epi16(v, 2), three);
                        pl[u][2] = _mm256_and_si256(_mm256_srli_epi16(v, 4), three);
                        pl[u][3] = _mm256_and_si256(_mm256_srli_epi16(v, 6), three);
                    }
                    for (int t = 0; t < tt; t++) {
                        const hymt_q8g *g = (const hymt_q8g *)(act + (t0 + t) * act_stride) + 2 * b + h;
                        __m256i s16 = _mm256_setzero_si256(); /* |lane| ≤ 8 · 2 · 3 · 127 */
                        for (int u = 0; u < 2; u++)
                            for (int p = 0; p < 4; p++)
                                s16 = _mm256_add_epi16(
                                    s16, _mm256_maddubs_epi16(pl[u][p], _mm256_loadu_si256((const __m256i *)(g->qs + 64 * p + 32 * u))));
                        __m256i s32 = _mm256_madd_epi16(s16, ones16);
                        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
                        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
                        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
                        int32_t isum = 2 * _mm_cvtsi128_si32(s4) - 3 * g->sum;
                        acc[t] += (d * g->d) * (float)isum;
                    }
                }
            }
            for (int t = 0; t < tt; t++) y[(t0 + t) * y_stride + r] = acc[t];
        }
    }
}
#endif /* HYMT_X86 */

/* ---- NEON: signed digits 2·code − 3 per 16-byte plane, SDOT ---- */
#if defined(HYMT_ARM64)
HYMT_TARGET_DOTPROD static void q2c_gemm_neon_dotprod(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                      const uint8_t *act, size_t act_stride, int64_t n,
                                                      int64_t cols, float *y, int64_t y_stride) {
    int64_t nb = cols / Q2C_BLOCK;
    const uint8x16_t three = vdupq_n_u8(3);
    const int8x16_t minus3 = vdupq_n_s8(3);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = w + r * row_bytes;
        for (int64_t t0 = 0; t0 < n; t0 += HYMT_LOWBIT_TOKEN_TILE) {
            int tt = (int)(n - t0 < HYMT_LOWBIT_TOKEN_TILE ? n - t0 : HYMT_LOWBIT_TOKEN_TILE);
            float acc[HYMT_LOWBIT_TOKEN_TILE] = {0};
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = row + b * Q2C_BYTES;
                float d = hymt_fp16_to_f32(hymt_load_u16(blk));
                for (int h = 0; h < 2; h++) {
                    int8x16_t dg[4][4]; /* [16-byte part c][plane p]: 2·code − 3 of weights 4(16c + j) + p */
                    for (int c = 0; c < 4; c++) {
                        uint8x16_t v = vld1q_u8(blk + 2 + 64 * h + 16 * c);
                        uint8x16_t codes[4] = {vandq_u8(v, three), vandq_u8(vshrq_n_u8(v, 2), three),
                                               vandq_u8(vshrq_n_u8(v, 4), three), vshrq_n_u8(v, 6)};
                        for (int p = 0; p < 4; p++)
                            dg[c][p] = vsubq_s8(vreinterpretq_s8_u8(vshlq_n_u8(codes[p], 1)), minus3);
                    }
                    for (int t = 0; t < tt; t++) {
                        const hymt_q8g *g = (const hymt_q8g *)(act + (t0 + t) * act_stride) + 2 * b + h;
                        int32x4_t s = vdupq_n_s32(0);
                        for (int c = 0; c < 4; c++)
                            for (int p = 0; p < 4; p++) s = vdotq_s32(s, dg[c][p], vld1q_s8(g->qs + 64 * p + 16 * c));
                        acc[t] += (d * g->d) * (float)vaddvq_s32(s);
                    }
                }
            }
            for (int t = 0; t < tt; t++) y[(t0 + t) * y_stride + r] = acc[t];
        }
    }
}

static void hymt_gemm_q2_0c_neon(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1, const uint8_t *act,
                                 size_t act_stride, int64_t n, int64_t cols, float *y, int64_t y_stride) {
    if (hymt_cpu()->dotprod)
        q2c_gemm_neon_dotprod(w, row_bytes, r0, r1, act, act_stride, n, cols, y, y_stride);
    else
        hymt_gemm_q2_0c_scalar(w, row_bytes, r0, r1, act, act_stride, n, cols, y, y_stride);
}
#endif /* HYMT_ARM64 */

static const hymt_format HYMT_FORMAT_Q2_0C = {
    .name = "Q2_0C",
    .block_len = Q2C_BLOCK,
    .block_bytes = Q2C_BYTES,
    .decode = hymt_decode_q2_0c,
    .row_dot_f32 = hymt_row_dot_f32_q2_0c,
    .prepare = hymt_prepare_q2_0c,
    .act_stride = hymt_act_stride_q2_0c,
    .gemm =
        {
            [HYMT_ISA_SCALAR] = hymt_gemm_q2_0c_scalar,
#if defined(HYMT_X86)
            [HYMT_ISA_AVX2] = hymt_gemm_q2_0c_avx2,
            [HYMT_ISA_AVX512] = hymt_gemm_q2_0c_avx512,
#endif
#if defined(HYMT_ARM64)
            [HYMT_ISA_NEON] = hymt_gemm_q2_0c_neon,
#endif
        },
};

#endif /* HYMT_FMT_Q2_0C_H */
