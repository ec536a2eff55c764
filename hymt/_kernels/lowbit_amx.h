/* lowbit_amx.h — the AMX tile driver shared by the batched int8 GEMMs of STQ1_0 and Q2_0C (amx.h).
 *
 * Both formats' int8 paths sum, per 256-weight activation group g, Σ unit·q exactly, where q is the
 * group's plane-ordered int8 activations (act.qs, 4 planes of 64) and unit the signed weight value
 * (STQ1_0 digit −1..1, Q2_0C 2·code − 3), then run the float epilogue
 *     y[t, r] = Σ_g (d_r,g × s_t,g) × f32(isum_t,r,g),   added group by group from 0.0f (no fma),
 * which is the fixed sequence of both formats (fmt_stq1_0.h, fmt_q2_0c.h). This driver forms those
 * sums on tiles and runs that epilogue, so it returns the same bits as the formats' other kernels.
 *
 * Tile products C[16 tokens][16 rows] += A[16 tokens][64 k] · B[16][16 rows × 4 k] (tdpbssd, s8 × s8):
 * the A tile of plane p is act.qs[64p .. 64p + 64) of 16 tokens, read in place (tokens act_stride
 * apart; from 32 tokens on the last partial token tile from a zero-padded copy, so tile loads stay in
 * bounds; a smaller call's token tiles have only their live rows, hymt_amx_configure_tokens), and the
 * format's DECODE writes, for 16 weight rows and one group, the 4 plane B tiles in VNNI order (row j,
 * dword i = the units of weight row i that multiply qs[64p + 4j .. 64p + 4j + 3]). 4 products per
 * group. Tiles: C 0..3 = [token tile u][row half h] at 2u + h, A 4 + u, B 6 + h (2 × 2 blocking: one
 * tile load per product). A 32-row tile is walked group by group; each decoded group (8 KiB of B
 * tiles) serves every token of the call, and the running float sums of all tokens stay in a contiguous
 * scratch buffer until the last group (y rows are a row-length apart: touching them per group
 * thrashes a few cache sets). The steps (group, pair of token tiles) are software-pipelined: the next
 * step's tile products, and the next group's decoding, run while this step's sums go through the
 * float epilogue.
 *
 * Where the time goes (one core, TSC ticks per step of 32 rows × 32 tokens × one group, STQ1_0, n = 64,
 * 256 rows × 2048 in L2, each part measured by leaving the others out): ~780 in all; the tile
 * instructions alone (16 products, 16 tile loads, 4 tile stores) ~460, of which the products are ~210
 * (13 ticks each: the tdpbusd peak) and the activation tile loads from L2 ~120 (~340 with the A tiles
 * read from one 4 KiB buffer); the decode ~160 and the epilogue ~235 (n = 256: tiles ~500, decode ~80,
 * epilogue ~240, all ~730). The parts add up almost in full: the vector work does not run beside the
 * tile unit, although a register-only test overlaps ALU work with products completely (256 vpermb or
 * 512 vpaddd between 16 products cost nothing) — vector stores do not overlap (64 epilogue vectors
 * after 16 products: +150 ticks with their stores, +20 without). Measured against this driver
 * (1 thread, alternated in one run, its speed ×) and left out: the epilogue and decode spread between
 * the single products (0.67–0.70); 16 × 16 tiles group-inner with the sums in registers and the next
 * row tile decoded meanwhile (0.68–0.89); 2 × 2 tiles group-inner, every group's sums stored and
 * chained per vector in registers one unit behind (0.74–0.80); decoding two groups ahead with the
 * epilogue a step behind (0.89–0.92); the activations copied per call into contiguous tiles
 * (0.87–0.93); 2 or 4 row tiles side by side reusing each activation tile from L1 (0.89–0.96); all row
 * tiles group by group, activations L1-resident and the sums in L2 (0.86–0.96); software prefetch of
 * the next step's activation tiles (0.86–0.95); the epilogue unrolled (0.91–1.01); two groups per pass
 * over the float sums (0.99–1.05); decode and epilogue between the tile stores and the next products
 * (0.98–1.07). */
#ifndef HYMT_LOWBIT_AMX_H
#define HYMT_LOWBIT_AMX_H

#include "hymt_common.h"
#include "amx.h"
#include "lowbit_common.h"

#if defined(HYMT_HAVE_AMX)

/* Start the sums of U token tiles × H row halves of one group (C tile 2u + h): zero, then 4 planes. */
HYMT_TARGET_AMX HYMT_INLINE void hymt_lowbit_amx_issue(const int8_t *const a[2], const size_t as[2],
                                                       const int8_t *b0, const int8_t *b1, const int U,
                                                       const int H) {
    _tile_zero(0);
    if (H == 2) _tile_zero(1);
    if (U == 2) _tile_zero(2);
    if (U == 2 && H == 2) _tile_zero(3);
    for (int p = 0; p < 4; p++) {
        _tile_loadd(4, a[0] + 64 * p, as[0]);
        _tile_loadd(6, b0 + 1024 * p, 64);
        _tile_dpbssd(0, 4, 6);
        if (H == 2) {
            _tile_loadd(7, b1 + 1024 * p, 64);
            _tile_dpbssd(1, 4, 7);
        }
        if (U == 2) {
            _tile_loadd(5, a[1] + 64 * p, as[1]);
            _tile_dpbssd(2, 5, 6);
            if (H == 2) _tile_dpbssd(3, 5, 7);
        }
    }
}

/* The sums started by hymt_lowbit_amx_issue, into ct[2u + h][token][row]. */
HYMT_TARGET_AMX HYMT_INLINE void hymt_lowbit_amx_store(int32_t (*ct)[16][16], const int U, const int H) {
    _tile_stored(0, ct[0], 64);
    if (H == 2) _tile_stored(1, ct[1], 64);
    if (U == 2) _tile_stored(2, ct[2], 64);
    if (U == 2 && H == 2) _tile_stored(3, ct[3], 64);
}

/* Dispatch on the (run-time) tile counts to the compile-time variants. */
#define HYMT_LOWBIT_AMX_VARIANTS(CALL, U, H)                                                            \
    do {                                                                                                \
        if ((U) == 2 && (H) == 2) CALL(2, 2);                                                           \
        else if ((U) == 2) CALL(2, 1);                                                                  \
        else if ((H) == 2) CALL(1, 2);                                                                  \
        else CALL(1, 1);                                                                                \
    } while (0)

/* The GEMM NAME (the hymt_gemm_fn signature) of a format given
 *   TABLES(__m512i tab[4])                  per-call constants of DECODE;
 *   DECODE(wt, row_bytes, rows, g, tab, bt) the 4 plane B tiles bt[p][16][64] of group g for the 16
 *                                           rows at wt (rows ≤ 16 of them exist; read no others);
 *   SCALES(wt, row_offsets, mask, g)        the weight scales of group g for those rows (__m512);
 *   FALLBACK                                a GEMM of the same bits (the format's scalar reference),
 *                                           run when the scratch buffer cannot be allocated. */
#define HYMT_LOWBIT_AMX_GEMM(NAME, TABLES, DECODE, SCALES, FALLBACK)                                    \
    HYMT_TARGET_AMX static void NAME(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,        \
                                     const uint8_t *act, size_t act_stride, int64_t n, int64_t cols, float *y, \
                                     int64_t y_stride) {                                                \
        /* tokens read in place and in the zero-padded last tile (amx.h) */                            \
        int64_t ng = cols / HYMT_Q8G_SIZE, full = hymt_amx_tokens_in_place(n), m = n - full;            \
        int64_t pairs = (n + 31) / 32, steps = ng * pairs; /* token-tile pairs per group; all steps */  \
        size_t ts = act_stride / sizeof(hymt_q8g);         /* groups between tokens */                   \
        const hymt_q8g *groups = (const hymt_q8g *)act;                                                 \
        /* scratch: facc [n][32] running sums of a 32-row tile, sv [ng][n] token scales, tail          \
         * [ng][16][256] the last partial token tile's activations, zero-padded to 16 tokens */         \
        size_t facc_bytes = (size_t)n * 32 * sizeof(float);                                             \
        size_t sv_bytes = ((size_t)(ng * n) * sizeof(float) + 63) / 64 * 64;                            \
        size_t tail_bytes = m > 0 ? (size_t)ng * 16 * 256 : 0;                                          \
        uint8_t *scratch = (uint8_t *)aligned_alloc(64, facc_bytes + sv_bytes + tail_bytes);            \
        if (scratch == NULL) {                                                                          \
            FALLBACK(w, row_bytes, r0, r1, act, act_stride, n, cols, y, y_stride);                      \
            return;                                                                                     \
        }                                                                                               \
        float(*facc)[32] = (float(*)[32])scratch;                                                       \
        float *sv = (float *)(scratch + facc_bytes);                                                    \
        int8_t(*tail)[16][256] = (int8_t(*)[16][256])(scratch + facc_bytes + sv_bytes);                 \
        for (int64_t g = 0; g < ng; g++)                                                                \
            for (int64_t t = 0; t < n; t++) sv[g * n + t] = groups[t * ts + g].d;                       \
        for (int64_t g = 0; g < ng && m > 0; g++) { /* (the padding rows' sums are never read) */       \
            for (int64_t t = 0; t < m; t++) memcpy(tail[g][t], groups[(full + t) * ts + g].qs, 256);    \
            memset(tail[g][m], 0, (size_t)(16 - m) * 256);                                              \
        }                                                                                               \
        __m512i tab[4];                                                                                 \
        TABLES(tab);                                                                                    \
        const __m512i row_offsets = hymt_row_offsets(row_bytes);                                        \
        HYMT_ALIGNED64 int8_t bt[2][2][4][16][64]; /* [group & 1][row half][plane] B tiles */           \
        HYMT_ALIGNED64 int32_t ct[2][4][16][16];   /* [step & 1][2u + h][token][row] group sums */      \
        __m512 dv[2][2];                           /* [group & 1][row half] weight scales */            \
        hymt_amx_configure_tokens(n);                                                                   \
        for (int64_t r = r0; r < r1; r += 32) {                                                         \
            int rows = (int)(r1 - r < 32 ? r1 - r : 32), H = rows > 16 ? 2 : 1;                         \
            int half_rows[2] = {rows < 16 ? rows : 16, rows - 16};                                      \
            __mmask16 mask[2] = {(__mmask16)((1u << half_rows[0]) - 1u),                                \
                                 (__mmask16)((1u << (H == 2 ? half_rows[1] : 0)) - 1u)};                \
            const uint8_t *wt = w + r * row_bytes;                                                      \
            /* step s: group g, token tiles t0 and t0 + 16 (U of them); s1 the next step (s = −1 only  \
             * decodes group 0 and starts step 0) */                                                    \
            for (int64_t s = -1; s < steps; s++) {                                                      \
                int64_t g = s / pairs, t0 = s % pairs * 32, s1 = s + 1, g1 = s1 / pairs, t1 = s1 % pairs * 32; \
                int U = n - t0 > 16 ? 2 : 1, U1 = n - t1 > 16 ? 2 : 1;                                  \
                if (s1 < steps && (s < 0 || g1 != g))                                                   \
                    for (int h = 0; h < H; h++) {                                                       \
                        DECODE(wt + 16 * h * row_bytes, row_bytes, half_rows[h], g1, tab, bt[g1 & 1][h]); \
                        dv[g1 & 1][h] = SCALES(wt + 16 * h * row_bytes, row_offsets, mask[h], g1);      \
                    }                                                                                   \
                int32_t(*cs)[16][16] = ct[s & 1];                                                       \
                if (s >= 0) HYMT_LOWBIT_AMX_VARIANTS(HYMT_LOWBIT_AMX_STORE, U, H);                       \
                if (s1 < steps) {                                                                       \
                    const int8_t *a[2];                                                                 \
                    size_t as[2];                                                                       \
                    for (int u = 0; u < U1; u++) {                                                      \
                        int in_tail = t1 + 16 * u >= full;                                              \
                        a[u] = in_tail ? tail[g1][0] : groups[(t1 + 16 * u) * ts + g1].qs;              \
                        as[u] = in_tail ? 256 : act_stride;                                             \
                    }                                                                                   \
                    const int8_t *b0 = bt[g1 & 1][0][0][0], *b1 = bt[g1 & 1][1][0][0];                  \
                    HYMT_LOWBIT_AMX_VARIANTS(HYMT_LOWBIT_AMX_ISSUE, U1, H);                             \
                }                                                                                       \
                if (s < 0) continue;                                                                    \
                /* facc[t] = facc[t] + (d × s) × f32(isum), from 0 at group 0 */                        \
                for (int u = 0; u < U; u++) {                                                           \
                    int64_t tu = t0 + 16 * u, tokens = n - tu < 16 ? n - tu : 16;                       \
                    for (int h = 0; h < H; h++)                                                         \
                        for (int64_t t = 0; t < tokens; t++) {                                          \
                            float *f = facc[tu + t] + 16 * h;                                           \
                            __m512 prev = g == 0 ? _mm512_setzero_ps() : _mm512_load_ps(f);             \
                            __m512 isum = _mm512_cvtepi32_ps(_mm512_load_si512((const void *)cs[2 * u + h][t])); \
                            __m512 ds = _mm512_mul_ps(dv[g & 1][h], _mm512_set1_ps(sv[g * n + tu + t]));    \
                            _mm512_store_ps(f, _mm512_add_ps(prev, _mm512_mul_ps(ds, isum)));           \
                        }                                                                               \
                }                                                                                       \
            }                                                                                           \
            for (int64_t t = 0; t < n; t++)                                                             \
                for (int h = 0; h < H; h++)                                                             \
                    _mm512_mask_storeu_ps(y + t * y_stride + r + 16 * h, mask[h], _mm512_load_ps(facc[t] + 16 * h)); \
        }                                                                                               \
        hymt_amx_release();                                                                             \
        free(scratch);                                                                                  \
    }
#define HYMT_LOWBIT_AMX_STORE(U, H) hymt_lowbit_amx_store(cs, U, H)
#define HYMT_LOWBIT_AMX_ISSUE(U, H) hymt_lowbit_amx_issue(a, as, b0, b1, U, H)

#endif /* HYMT_HAVE_AMX */
#endif /* HYMT_LOWBIT_AMX_H */
