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
 * Σ (q6 − 32)·q, |.| <= 8·32·127 = 32512: int16-sized, so pmaddwd / vpdpwssd by sc scale it exactly)
 * and sum the lanes; the AMX tiles (below) multiply the weights with sc folded in. Every path forms the
 * same A and runs the same two float operations, so the values cannot depend on n or on the path.
 *
 * Kernels (x86): AVX-512 up to HYMT_Q6_K_GEMV_MAX tokens one row at a time (one sequential weight
 * stream; A summed per group of 8 blocks; from 3 tokens the float step with lane = token), on AMD cores
 * up to HYMT_Q6_K_ROWPASS_MAX in passes of that kernel over each row, from there
 * row tiles of 16 rows whose A lands with lane = row, so the float step runs once per 16 rows
 * (hymt_q6_k_rowtiles_avx512), from HYMT_Q6_K_AMX_MIN tokens AMX tiles when present; AVX2 row tiles of
 * 8 rows for every n.
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
/* The constants of the unpack: uc[0] = 0x0F bytes, uc[1] = 0x30 bytes, and the qh shifts: qh is shared by
 * the two 32-byte halves of a ql vector, plane p needs its bits 2p..2p+1 at 4..5: uc[2] (left, p = 0 | 1),
 * uc[3] (right, p = 2 | 3). */
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_q6_k_unpack_consts(__m512i uc[4]) {
    uc[0] = _mm512_set1_epi8(0x0F);
    uc[1] = _mm512_set1_epi8(0x30);
    uc[2] = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    uc[3] = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);
}

/* The codes of one block in the kq layout (kquant_common.h): wq[v] byte 4j + e = code of weight 16j + 4v + e. */
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_q6_k_unpack_uc_avx512(const uint8_t *blk, const __m512i s1[4],
                                                               const __m512i s2[2], const __m512i uc[4],
                                                               __m512i wq[4]) {
    __m512i n[4];
    for (int c = 0; c < 2; c++) {
        __m512i ql = _mm512_loadu_si512((const void *)(blk + 64 * c));
        __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * c)));
        n[2 * c] = _mm512_ternarylogic_epi32(_mm512_and_si512(ql, uc[0]), _mm512_sllv_epi16(qh, uc[2]), uc[1], 0xF8);
        n[2 * c + 1] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(ql, 4), uc[0]),
                                                 _mm512_srlv_epi16(qh, uc[3]), uc[1], 0xF8);
    }
    hymt_kq_transpose_avx512(s1, s2, n[0], n[1], n[2], n[3], wq);
}

/* As hymt_q6_k_unpack_uc_avx512, building the constants at each use. */
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_q6_k_unpack_avx512(const uint8_t *blk, const __m512i s1[4],
                                                            const __m512i s2[2], __m512i wq[4]) {
    __m512i uc[4];
    hymt_q6_k_unpack_consts(uc);
    hymt_q6_k_unpack_uc_avx512(blk, s1, s2, uc, wq);
}

/* Row tiles (lane = output row), for every n on the vector path: 16 rows share each block step, so the
 * block's integer sum A of (row, token) ends in lane row of one vector and the float step runs on 16 rows
 * at once. Per row pair (a, b), token and block, after the two int16-sized dot chains per row (lo: vectors
 * 0-1, hi: 2-3, lane j = chunk j), vpackssdw puts a's and b's lanes side by side as words (exact, no
 * saturation) and vpmaddwd / vpdpwssd by the pair's sub-scale words applies sc_j and folds two chunks in one
 * instruction each: 4 operations leave each row's A spread over 8 dwords of one vector (vs 2 per row and
 * 16 dwords without the pairing). A 16-row transpose-add (hymt_q6_k_rows16) then finishes A with lane =
 * row: 21 operations per 16 rows, token and block. */
/* Loads are the scarce resource of the tile (about one 64-byte load per cycle here): keep a loaded
 * vector in a register for all its uses instead of letting the compiler fold one load into each. */
#define HYMT_Q6_K_IN_REGISTER(v) __asm__("" : "+v"(v))
#define HYMT_Q6_K_RT_PASS 64 /* tokens per pass over a row tile (float accumulators on the stack: 4 KiB) */
#define HYMT_Q6_K_RT_TT 16   /* tokens per inner tile (pair vectors on the stack: 8 KiB) */

typedef struct {
    __m512i wq[16][4]; /* row i's codes, kq layout */
    __m512i scp[8];    /* rows 2k, 2k + 1: 128-bit lane L holds the words sc_2k[4L..4L+3], sc_2k+1[4L..4L+3] */
} hymt_q6_k_rowtile;

/* One lane chain: two vpdpbusd over 8 weights per lane, from start (−32·Σq of those activations) to the
 * int16-sized Σ (q6 − 32)·q. */
HYMT_TARGET_AVX512 HYMT_INLINE __m512i hymt_q6_k_chain(__m512i start, __m512i w0, __m512i q0, __m512i w1, __m512i q1) {
    return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(start, w0, q0), w1, q1);
}

/* Two blocks' (or rows') low and high chains packed side by side as words, scaled by their sub-scale words
 * scp and folded 2:1 (exact int32). */
HYMT_TARGET_AVX512 HYMT_INLINE __m512i hymt_q6_k_scale_pair(__m512i la, __m512i lb, __m512i ha, __m512i hb,
                                                            __m512i scp) {
    return _mm512_dpwssd_epi32(_mm512_madd_epi16(_mm512_packs_epi32(la, lb), scp), _mm512_packs_epi32(ha, hb), scp);
}

/* Chain h (0: weight vectors 0–1, 1: vectors 2–3) of one block w against one token's activation group g. */
HYMT_TARGET_AVX512 HYMT_INLINE __m512i hymt_q6_k_half(const hymt_kq8 *g, const __m512i w[4], int h) {
    const int8_t *q = g->qs + 128 * h;
    return hymt_q6_k_chain(_mm512_load_si512((const void *)g->nb32[h]), w[2 * h], _mm512_load_si512((const void *)q),
                           w[2 * h + 1], _mm512_load_si512((const void *)(q + 64)));
}

/* Rows a, b (codes wa, wb; sub-scale words scp) × one token's block g: dword 4L + m of the result holds
 * part of A of row a (m < 2) or b (m >= 2); the 8 dwords of a row sum to its A. */
HYMT_TARGET_AVX512 HYMT_INLINE __m512i hymt_q6_k_pair_avx512(const __m512i wa[4], const __m512i wb[4], __m512i scp,
                                                             const __m512i q[4], __m512i n0, __m512i n1) {
    const __m512i la = hymt_q6_k_chain(n0, wa[0], q[0], wa[1], q[1]), lb = hymt_q6_k_chain(n0, wb[0], q[0], wb[1], q[1]);
    const __m512i ha = hymt_q6_k_chain(n1, wa[2], q[2], wa[3], q[3]), hb = hymt_q6_k_chain(n1, wb[2], q[2], wb[3], q[3]);
    return hymt_q6_k_scale_pair(la, lb, ha, hb, scp);
}

/* A of 16 rows with lane = row from the 8 pair vectors p[0..3], p2[0..3] (exact int32). Stage 1 (vpermt2d
 * by ie / io, an add): q[i], 128-bit lane L, dword m = the L-th partial sum of row 4i + m; then the two
 * shuffle stages of hymt_kq_hsum16. (The GEMV feeds two tokens' pair vectors: lane 8t + block.) */
HYMT_TARGET_AVX512 HYMT_INLINE __m512i hymt_q6_k_rows16(const __m512i p[4], const __m512i p2[4], __m512i ie,
                                                       __m512i io) {
    __m512i q[4], c[2];
    for (int i = 0; i < 4; i++) {
        const __m512i *x = i < 2 ? p : p2;
        q[i] = _mm512_add_epi32(_mm512_permutex2var_epi32(x[2 * (i % 2)], ie, x[2 * (i % 2) + 1]),
                                _mm512_permutex2var_epi32(x[2 * (i % 2)], io, x[2 * (i % 2) + 1]));
    }
    for (int i = 0; i < 2; i++)
        c[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(q[2 * i], q[2 * i + 1], 0x44),
                                _mm512_shuffle_i32x4(q[2 * i], q[2 * i + 1], 0xEE));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(c[0], c[1], 0x88), _mm512_shuffle_i32x4(c[0], c[1], 0xDD));
}

/* Up to HYMT_Q6_K_GEMV_MAX tokens: one row at a time (one sequential weight stream), blocks in groups of
 * 8. Per block pair (a, b) and token, the pairing of the row tiles above runs along the row: the two
 * blocks' int16-sized chains (each with its own activations) are packed side by side as words
 * (vpackssdw, exact) and one vpmaddwd + one vpdpwssd by the pair's sub-scale words apply sc_j and fold two
 * chunks at once, leaving each block's A in 8 dwords of one vector; the group's 4 pair vectors are summed
 * by a 12-operation transpose-add into one lane per block (hymt_q6_k_blocks8). The float steps of the
 * group then run block by block (d × s and the fma, the definition's order). acc [T].
 * Measured (medians of alternated runs against main's per-chunk float kernel): hot (1024 head rows, one
 * thread) n = 1 0.95–1.0 of main's time, n = 2 1.0, n = 4 1.03; streaming the 120818-row head from DRAM
 * (two threads, the layer products evicting it between calls) n = 1–4 0.95–0.98. The previous
 * forms cost more there: two vpdpwssd per block and an 8-vector tree per group (n = 1–2 +3–5 %), 16-row
 * tiles for 3–4 tokens (+10 %: 16 strided row streams, 8 prefetches per row and block). Prefetch, from
 * DRAM: the L1 and L2 hints interleaved line by line in one loop (the same hints as two loops, as
 * hymt_kq_prefetch issues them, ran n = 1 5–6 % slower in that comparison; the cause is not isolated, code
 * placement may be part of it); L2 distance 6144 bytes (4096: n = 2 +2 %, 8192: +5 %); the L1 hint is
 * needed (without it +12 %; 512 or 2048 bytes ahead instead of 1024: +1–4 %). Tried for 2–4 tokens
 * (session 6, alternated in one process, head streamed from DRAM under a contended memory bus): the
 * rows loop inside the kernel with each group's float step deferred past the next group's integer part,
 * plus the unpack constants kept in registers (commit 02f282e, reverted): hot (512 rows in L2, one
 * thread) n = 1–4 −5..−18 %, but from DRAM n = 1 +3–5 %, n = 2 +2–7 %, n = 3–8 ±1 %; 4-row steps sharing
 * each activation load (K = 2 row pairs, hymt_q6_k_rt_pairs): hot n = 4 −8 %, n = 2 unchanged, from
 * DRAM n = 2 +12–16 %, n = 4 +6–13 % (four interleaved row streams); the float step with lane = token
 * (acc in one vector): hot n = 2–4 +30 % (its dependent chain went through the stack).
 *
 * From HYMT_Q6_K_GEMV_TOKEN_LANES (3) tokens (session 11): the float step with lane = token, its chain in a
 * register. Per group, the A of tokens 0, 1 (hymt_q6_k_rows16 on both tokens' pair vectors) and 2, 3 land
 * as lanes 8t + block, two vpermt2d turn them into [block][token] (fa), one vmulps per 4 blocks forms
 * d × s for 4 blocks × 4 tokens from the fp16 d of the group and a per-call table of the tokens' scales
 * (st: [block][token], built once per call), and 8 fma on one xmm run the blocks in order for all tokens;
 * before, per token and group: blocks8, a ymm store, 8 vmulss and 8 vfmadd231ss with loads. Same
 * operations per (row, token, block), same bits. Also the unpack constants (uc) are built once per row
 * instead of once per block pair. What the time at 3-4 tokens is made of: per block ~24 port 0/5
 * operations shared by the tokens (unpack 14, kq transpose 8, sub-scales) and per block and token ~8
 * (4 vpdpbusd, vpackssdw, vpmaddwd or vpdpwssd, ~1.3 for the 8-to-1 lane sum, the float step), so at 4
 * tokens ~56 against ~32 at 1. Measured (session 11, alternated runs): hot (1024 rows in L2, one thread,
 * best of 3) n = 3 −6..−12 %, n = 4 −10..−19 %, n = 1, 2 unchanged; python -m hymt.kernelbench (3
 * alternated runs, medians, load 1.3–1.6): head n = 4 0.97 of main's time at 2 threads (8207 → 7942
 * µs), 0.99 at 1; layer matrices n = 4 0.95 (252 → 239 µs); n = 1, 2, 3, 5, 8 1.00 ± 0.01 (n = 3 gains
 * hot, not from DRAM). Head n = 4 is still 1.20× n = 1 (target 1.15×). From DRAM a cut of the hot time
 * shows at ~0.35–0.4 of its size (removing the whole unpack, as a timing probe: hot n = 4 −20 %, head
 * from DRAM −7.5 %). Did not help: the lane = token step at n = 2 (hot −8..−10 %, from DRAM +1..+3 %:
 * n = 2 keeps the per-token step); the constants per row at n = 1 (hot −4 %, from DRAM +2..+5 %); GFNI
 * for the unpack (vgf2p8affineqb moves the qh bit pairs and the high nibble and clears the rest: 5
 * operations instead of 7 per 64 ql bytes): hot n = 1–4 +3..+9 % on this core; for 3–4 tokens other
 * prefetch distances (L2 4096 or 12288, L1 512 or 2048 bytes) or no L1 hint: 0..+9 %. Timing probes
 * without effect: the chain starts from zero (no nb32 loads), the pair scale step replaced by adds.
 * Zen 4 (session 12, AMD EPYC, 2 cores): hot (512×2048 in L2, one thread, best of calls) 30, 37, 50, 52
 * cycles per block at n = 1, 2, 3, 4, against ~43 per block that a core's share of the read rate allows
 * at two threads: n >= 3 is compute-bound here. The lane = token step still wins at 3-4 tokens (n = 3
 * 728 vs 758, n = 4 839 vs 877 cycles per 16 blocks without it). Tried for 5-8 tokens (session 14, Zen 4):
 * this kernel in passes of up to 4 tokens per row (the row's weights in L1 for the second pass) instead
 * of the row tiles; kernelbench head, 2 threads, 3 alternations, µs per call: n = 5 14225 / 13777 / 11649
 * → 12782 / 14015 / 13628, n = 8 17347 / 16069 / 16269 → 15414 / 18269 / 18103 (the second pass costs its
 * whole compute, ~30 cycles per block at one token). */
#define HYMT_Q6_K_GEMV_PF_L1 1024
#define HYMT_Q6_K_GEMV_PF_L2 6144
#define HYMT_Q6_K_GEMV_MAX 4
/* On AMD cores, up to this many tokens the GEMV runs in passes of HYMT_Q6_K_GEMV_MAX over each row (the row
 * in L1 for the later passes); more take the row tiles. Zen 5 (EPYC, family 26, 2 cores, session 15), kernel
 * benchmark from DRAM, 2 threads, 2 alternations, µs per call, row tiles → row passes: layer matrices
 * n = 5 341–358 → 169, 8 379 → 224, 12 408 → 328, 16 405–443 → 404–470, 20 466 → 611, 32 563 → 971;
 * the 120818-row head n = 5 12646–13016 → 5864–5890, 8 14055–14096 → 7184–7319, 12 15191–15403 →
 * 11119–11226, 16 16513–16566 → 15322–15358. The row tiles stall on their 16 strided row streams
 * there (perf: the code loads of the unpack hot); the passes read one sequential stream. On Zen 4
 * (session 14) passes of the head at 5–8 tokens were within noise of the tiles. On Intel the row tiles
 * win from 5 tokens (session 17, family 6 model 167, 2 threads from DRAM, 2 alternations, passes →
 * row tiles: 1.8B layer n = 5 2753–2784 → 2254–2405 µs, 8 3493–3618 → 2750–2756; the head n = 5 12.7–12.8
 * → 11.5–11.6 ms, 8 15.9–16.1 → 12.5–13.7), so there the GEMV's passes never run (hymt_q6_k_rowpass_max). */
#define HYMT_Q6_K_ROWPASS_MAX 12
#define HYMT_Q6_K_GEMV_TOKEN_LANES 3 /* from this many tokens the float step runs with lane = token */
#define HYMT_Q6_K_GEMV_NB 256 /* blocks of its scale table on the stack (4 KiB, cols <= 65536); more: heap */

/* A of the 8 blocks of a group (lane kb < 8) from its 4 pair vectors p[k] (blocks 2k, 2k + 1; dword 4L + m
 * holds part of block 2k (m < 2) or 2k + 1 (m >= 2)): stage 1 of hymt_q6_k_rows16, then two shuffle
 * stages of 128-bit lanes (exact int32). */
HYMT_TARGET_AVX512 HYMT_INLINE __m256i hymt_q6_k_blocks8(const __m512i p[4], __m512i ie, __m512i io) {
    const __m512i q0 = _mm512_add_epi32(_mm512_permutex2var_epi32(p[0], ie, p[1]), _mm512_permutex2var_epi32(p[0], io, p[1]));
    const __m512i q1 = _mm512_add_epi32(_mm512_permutex2var_epi32(p[2], ie, p[3]), _mm512_permutex2var_epi32(p[2], io, p[3]));
    /* 128-bit lanes: q0 L0+L2, q0 L1+L3, q1 L0+L2, q1 L1+L3 */
    const __m512i c = _mm512_add_epi32(_mm512_shuffle_i32x4(q0, q1, 0x44), _mm512_shuffle_i32x4(q0, q1, 0xEE));
    return _mm512_castsi512_si256(_mm512_add_epi32(_mm512_shuffle_i32x4(c, c, 0x88), _mm512_shuffle_i32x4(c, c, 0xDD)));
}

/* The vpermt2d indices of stage 1 (hymt_q6_k_rows16, hymt_q6_k_blocks8): ie / io pick the even / odd
 * dword of each half-pair. */
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_q6_k_pair_idx(__m512i *ie, __m512i *io) {
    int32_t ix[2][16];
    for (int L = 0; L < 4; L++)
        for (int m = 0; m < 4; m++) {
            ix[0][4 * L + m] = 16 * (m / 2) + 4 * L + 2 * (m % 2);
            ix[1][4 * L + m] = ix[0][4 * L + m] + 1;
        }
    *ie = _mm512_loadu_si512((const void *)ix[0]);
    *io = _mm512_loadu_si512((const void *)ix[1]);
}

/* The vpermt2d index that takes hymt_q6_k_rows16's lanes 8t + kb of tokens 0, 1 (first operand) and 2, 3
 * (second) to lane 4(kb − kb0) + t for blocks kb0..kb0 + 3. */
HYMT_TARGET_AVX512 HYMT_INLINE __m512i hymt_q6_k_tok_idx(int kb0) {
    int32_t ix[16];
    for (int i = 0; i < 16; i++) ix[i] = (i % 4 < 2 ? 0 : 16) + 8 * (i % 2) + kb0 + i / 4;
    return _mm512_loadu_si512((const void *)ix);
}

HYMT_TARGET_AVX512 HYMT_INLINE void hymt_q6_k_gemv_avx512(const uint8_t *row, const uint8_t *a0, size_t act_stride,
                                                          int64_t nb, const __m512i s1[4], const __m512i s2[2],
                                                          __m512i ie, __m512i io, const float *st, float *acc,
                                                          const int T) {
    const int V = T >= HYMT_Q6_K_GEMV_TOKEN_LANES; /* the float step with lane = token */
    float dd[8], af[HYMT_Q6_K_GEMV_MAX][8]; /* (!V) the group's d; [token][block] its A */
    uint16_t dh[8];                          /* (V) the group's fp16 d */
    /* (V) [block][token] of the group: A as float, d × s */
    float fa[32] __attribute__((aligned(64))), fd[32] __attribute__((aligned(64)));
    __m128 va = _mm_setzero_ps(); /* (V) lane t = acc of token t */
    const __m512i tb_lo = hymt_q6_k_tok_idx(0), tb_hi = hymt_q6_k_tok_idx(4);
    const __m512i dsel = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0); /* d of lanes 4kb + t */
    __m512i uc[4]; /* (V) the unpack's constants, built once per row instead of once per block pair */
    hymt_q6_k_unpack_consts(uc);
    for (int64_t b0 = 0; b0 < nb; b0 += 8) {
        const int kn = nb - b0 < 8 ? (int)(nb - b0) : 8;
        __m512i pv[HYMT_Q6_K_GEMV_MAX][4]; /* [token][block pair] */
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            __m512i wq[2][4], sc32[2];
            for (int e = 0; e < 2; e++) {
                const int kb = 2 * k + e;
                if (kb < kn) {
                    const uint8_t *blk = row + (b0 + kb) * HYMT_Q6_K_BYTES;
                    for (int i = 0; i < 256; i += 64) {
                        __builtin_prefetch(blk + HYMT_Q6_K_GEMV_PF_L1 + i, 0, 3);
                        __builtin_prefetch(blk + HYMT_Q6_K_GEMV_PF_L2 + i, 0, 2);
                    }
                    if (V)
                        hymt_q6_k_unpack_uc_avx512(blk, s1, s2, uc, wq[e]);
                    else
                        hymt_q6_k_unpack_avx512(blk, s1, s2, wq[e]);
                    sc32[e] = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 192)));
                    if (V)
                        dh[kb] = hymt_load_u16(blk + 208);
                    else
                        dd[kb] = _cvtsh_ss(hymt_load_u16(blk + 208));
                } else { /* past the row: zero codes and scales, so the block's A is 0 (never used) */
                    for (int v = 0; v < 4; v++) wq[e][v] = _mm512_setzero_si512();
                    sc32[e] = _mm512_setzero_si512();
                    dh[kb] = 0;
                }
            }
            const __m512i scp = _mm512_packs_epi32(sc32[0], sc32[1]); /* 128-bit lane L: sc_a[4L..], sc_b[4L..] */
            const int kb = 2 * k + 1 < kn ? 2 * k + 1 : 2 * k; /* block b's activations (in range) */
            for (int t = 0; t < T; t++) {
                const hymt_kq8 *ga = (const hymt_kq8 *)(a0 + (size_t)t * act_stride) + b0 + 2 * k;
                const hymt_kq8 *gb = (const hymt_kq8 *)(a0 + (size_t)t * act_stride) + b0 + kb;
                pv[t][k] = hymt_q6_k_scale_pair(hymt_q6_k_half(ga, wq[0], 0), hymt_q6_k_half(gb, wq[1], 0),
                                                hymt_q6_k_half(ga, wq[0], 1), hymt_q6_k_half(gb, wq[1], 1), scp);
            }
        }
        if (!V) {
            for (int t = 0; t < T; t++) {
                const hymt_kq8 *g = (const hymt_kq8 *)(a0 + (size_t)t * act_stride) + b0;
                _mm256_storeu_ps(af[t], _mm256_cvtepi32_ps(hymt_q6_k_blocks8(pv[t], ie, io)));
                for (int kb = 0; kb < kn; kb++) acc[t] = fmaf(dd[kb] * g[kb].d, af[t][kb], acc[t]);
            }
            continue;
        }
        /* lane 8t + kb: A of token t (0, 1 | 2, 3; token 3 of three: 0), block kb */
        const __m512i r01 = hymt_q6_k_rows16(pv[0], pv[1], ie, io);
        const __m512i r23 = T == 3 ? _mm512_zextsi256_si512(hymt_q6_k_blocks8(pv[2], ie, io))
                                   : hymt_q6_k_rows16(pv[2], pv[T - 1], ie, io);
        const __m512 d8 = _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh)));
        const __m512i dsel4 = _mm512_add_epi32(dsel, _mm512_set1_epi32(4));
        /* fa, fd: lane 4kb + t; d × s (st holds 0 for tokens past T: those lanes are never stored) */
        _mm512_store_ps(fa, _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(r01, tb_lo, r23)));
        _mm512_store_ps(fa + 16, _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(r01, tb_hi, r23)));
        _mm512_store_ps(fd, _mm512_mul_ps(_mm512_permutexvar_ps(dsel, d8), _mm512_load_ps(st + 4 * b0)));
        _mm512_store_ps(fd + 16, _mm512_mul_ps(_mm512_permutexvar_ps(dsel4, d8), _mm512_load_ps(st + 4 * b0 + 16)));
        /* the fma chain in a register (through the stack it costs a store-to-load round trip per block) */
        if (kn == 8) {
#pragma GCC unroll 8
            for (int kb = 0; kb < 8; kb++) {
                va = _mm_fmadd_ps(_mm_load_ps(fd + 4 * kb), _mm_load_ps(fa + 4 * kb), va);
                HYMT_Q6_K_IN_REGISTER(va);
            }
        } else {
            for (int kb = 0; kb < kn; kb++) {
                va = _mm_fmadd_ps(_mm_load_ps(fd + 4 * kb), _mm_load_ps(fa + 4 * kb), va);
                HYMT_Q6_K_IN_REGISTER(va);
            }
        }
    }
    if (V) _mm_storeu_ps(acc, va);
}

/* One function per token count, so that every loop over tokens is unrolled. Not inlined: inlined, the four
 * of them went into the passes loop of hymt_gemm_q6_k_avx512 (7355c44), whose frame grew from 18.9 to 23 KB
 * with more spills, and on Zen 4 (session 19, AMD EPYC family 25, kernel benchmark from DRAM, 2 threads) the
 * head at 4 tokens (means of calls, alternated builds) went 8.4–9.0 ms before 7355c44 → 9.0–11.0 ms after;
 * out of line 8.5–8.8 ms again, and in 4 ABBA pairs against the inlined build, fastest calls 7.7–8.6
 * against 8.7–9.3 ms (one outlier pair left out); n = 1–3 and the layer shapes within noise. */
#define HYMT_Q6_K_GEMV_FN(T)                                                                                    \
    HYMT_TARGET_AVX512 __attribute__((noinline)) static void hymt_q6_k_gemv##T##_avx512(                        \
        const uint8_t *row, const uint8_t *a0, size_t act_stride, int64_t nb, const __m512i s1[4],              \
        const __m512i s2[2], __m512i ie, __m512i io, const float *st, float *acc) {                             \
        hymt_q6_k_gemv_avx512(row, a0, act_stride, nb, s1, s2, ie, io, st, acc, T);                             \
    }
HYMT_Q6_K_GEMV_FN(1)
HYMT_Q6_K_GEMV_FN(2)
HYMT_Q6_K_GEMV_FN(3)
HYMT_Q6_K_GEMV_FN(4)

/* K (1 or 2) row pairs k.. of the tile × tokens [0, T) of one block: p[t][k + i] for i < K. unpack: the
 * first token tile, which unpacks the rows (and keeps them in u when keep: more tiles follow); else u. */
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_q6_k_rt_pairs(const uint8_t *const rp[16], int64_t b, const __m512i s1[4],
                                                       const __m512i s2[2], hymt_q6_k_rowtile *u, int k, int unpack,
                                                       int keep, const hymt_kq8 *g0, size_t act_stride, int T,
                                                       __m512i (*p)[8]) {
    enum { K = 2 };
    __m512i wq[4][4], sc[2];
    if (unpack) {
        __m512i sc32[4];
        for (int i = 0; i < 2 * K; i++) {
            const uint8_t *blk = rp[2 * k + i] + b * HYMT_Q6_K_BYTES;
            hymt_q6_k_unpack_avx512(blk, s1, s2, wq[i]);
            sc32[i] = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 192)));
        }
        for (int i = 0; i < K; i++) sc[i] = _mm512_packs_epi32(sc32[2 * i], sc32[2 * i + 1]);
        if (keep) {
            for (int i = 0; i < 2 * K; i++)
                for (int v = 0; v < 4; v++) u->wq[2 * k + i][v] = wq[i][v];
            for (int i = 0; i < K; i++) u->scp[k + i] = sc[i];
        }
    } else {
        for (int i = 0; i < 2 * K; i++)
            for (int v = 0; v < 4; v++) wq[i][v] = u->wq[2 * k + i][v];
        for (int i = 0; i < K; i++) sc[i] = u->scp[k + i];
    }
    for (int t = 0; t < T; t++) {
        const hymt_kq8 *g = (const hymt_kq8 *)((const uint8_t *)g0 + (size_t)t * act_stride);
        __m512i q[4];
        for (int v = 0; v < 4; v++) {
            q[v] = _mm512_load_si512((const void *)(g->qs + 64 * v));
            HYMT_Q6_K_IN_REGISTER(q[v]);
        }
        __m512i n0 = _mm512_load_si512((const void *)g->nb32[0]);
        __m512i n1 = _mm512_load_si512((const void *)g->nb32[1]);
        HYMT_Q6_K_IN_REGISTER(n0);
        HYMT_Q6_K_IN_REGISTER(n1);
        for (int i = 0; i < K; i++) p[t][k + i] = hymt_q6_k_pair_avx512(wq[2 * i], wq[2 * i + 1], sc[i], q, n0, n1);
    }
}

/* Rows [r0, r1) × n tokens in row tiles of 16 (a partial tile repeats its last row, whose outputs are not
 * stored). Per block step the tile's 16 blocks are unpacked once into u for all tokens of the pass.
 * Super panels, as the Q4_K register tiles read them (fmt_q4_k.h): a range of 16·S rows (S up to
 * HYMT_Q6_K_LANE_ROWS) is read in S passes, lane j of pass i taking row r + jS + i, so each lane streams S
 * consecutive rows instead of jumping to the next tile after one row (16 strided streams, which the
 * hardware prefetchers follow badly); the next row of each lane is prefetched into L2. Session 17 (Intel,
 * 2 threads from DRAM, 2 alternations, consecutive-row tiles → super panels): 1.8B layer n = 5 2273–2402
 * → 1985–2054 µs, 8 2643–2660 → 2537–2568, 12 3413–3465 → 3325–3388; the head n = 5 10.8–11.1 → 9.5–10.2
 * ms, 8 14.0–14.5 → 12.0–12.7, 12 17.0–17.5 → 16.6–16.9. */
#define HYMT_Q6_K_LANE_ROWS 16

/* Block b of one pass over the 16 lane rows rp, for np tokens (activations of the first at a0, act_stride
 * apart): acc[t] (lane = row) += the block's float step. `ahead`: from a row to the lane's next one. */
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_q6_k_rowtile_block(const uint8_t *const rp[16], size_t ahead, int64_t b,
                                                            const uint8_t *a0, size_t act_stride, int np,
                                                            const __m512i s1[4], const __m512i s2[2], __m512i ie,
                                                            __m512i io, hymt_q6_k_rowtile *u, __m512i (*p)[8],
                                                            __m512 *acc) {
    /* the next block of each row into L1, the same block of the lane's next row into L2 */
    for (int i = 0; i < 16; i++)
        for (int k = 0; k < 256; k += 64) {
            __builtin_prefetch(rp[i] + (b + 1) * HYMT_Q6_K_BYTES + k, 0, 3);
            __builtin_prefetch(rp[i] + ahead + b * HYMT_Q6_K_BYTES + k, 0, 2);
        }
    uint16_t dh[16]; /* the rows' fp16 d */
    for (int i = 0; i < 16; i++) dh[i] = hymt_load_u16(rp[i] + b * HYMT_Q6_K_BYTES + 208);
    const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)dh));
    for (int tt = 0; tt < np; tt += HYMT_Q6_K_RT_TT) {
        const int T = np - tt < HYMT_Q6_K_RT_TT ? np - tt : HYMT_Q6_K_RT_TT;
        const hymt_kq8 *g0 = (const hymt_kq8 *)(a0 + (size_t)tt * act_stride) + b;
        for (int k = 0; k < 8; k += 2)
            hymt_q6_k_rt_pairs(rp, b, s1, s2, u, k, tt == 0, np > HYMT_Q6_K_RT_TT, g0, act_stride, T, p);
        for (int t = 0; t < T; t++) {
            const hymt_kq8 *g = (const hymt_kq8 *)((const uint8_t *)g0 + (size_t)t * act_stride);
            const __m512 ds = _mm512_mul_ps(dv, _mm512_set1_ps(g->d));
            const __m512i A = hymt_q6_k_rows16(p[t], p[t] + 4, ie, io);
            acc[tt + t] = _mm512_fmadd_ps(ds, _mm512_cvtepi32_ps(A), acc[tt + t]);
        }
    }
}

HYMT_TARGET_AVX512 static void hymt_q6_k_rowtiles_avx512(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                         const uint8_t *act, size_t act_stride, int64_t n, int64_t nb,
                                                         float *y, int64_t y_stride) {
    __m512i s1[4], s2[2];
    hymt_kq_perms_avx512(s1, s2);
    __m512i ie, io;
    hymt_q6_k_pair_idx(&ie, &io);
    hymt_q6_k_rowtile u __attribute__((aligned(64)));
    __m512i p[HYMT_Q6_K_RT_TT][8]; /* [token of the tile][row pair] */
    __m512 acc[HYMT_Q6_K_RT_PASS]; /* [token of the pass], lane = row */
    for (int64_t r = r0; r < r1;) {
        const int64_t left = r1 - r, S = hymt_lane_rows(left, 16, HYMT_Q6_K_LANE_ROWS, 1);
        const int rows = left < 16 ? (int)left : 16;
        const size_t ls = (size_t)S * row_bytes;                 /* from one lane's row to the next lane's */
        const size_t ahead = S > 1 ? row_bytes : 16 * row_bytes; /* a lane's next row */
        const __m512i lanes = hymt_lane_rows_avx512(S);
        const __mmask16 keep = (__mmask16)((1u << rows) - 1);
        for (int64_t pass = 0; pass < S; pass++) {
            const uint8_t *rp[16]; /* lane i's row */
            for (int i = 0; i < 16; i++)
                rp[i] = w + (size_t)(r + pass) * row_bytes + (size_t)(i < rows ? i : rows - 1) * ls;
            for (int64_t t0 = 0; t0 < n; t0 += HYMT_Q6_K_RT_PASS) {
                const int np = n - t0 < HYMT_Q6_K_RT_PASS ? (int)(n - t0) : HYMT_Q6_K_RT_PASS;
                for (int t = 0; t < np; t++) acc[t] = _mm512_setzero_ps();
                for (int64_t b = 0; b < nb; b++)
                    hymt_q6_k_rowtile_block(rp, ahead, b, act + (size_t)t0 * act_stride, act_stride, np, s1, s2, ie,
                                            io, &u, p, acc);
                for (int t = 0; t < np; t++)
                    hymt_store_lane_rows_avx512(y + (t0 + t) * y_stride + r + pass, S, lanes, keep, acc[t]);
            }
        }
        r += S > 1 ? 16 * S : rows;
    }
}

/* The most tokens the AVX-512 GEMV takes (in passes over each row): HYMT_Q6_K_ROWPASS_MAX on AMD cores,
 * one pass (HYMT_Q6_K_GEMV_MAX) elsewhere; more take the row tiles. */
HYMT_INLINE int64_t hymt_q6_k_rowpass_max(void) { return hymt_cpu()->amd ? HYMT_Q6_K_ROWPASS_MAX : HYMT_Q6_K_GEMV_MAX; }

HYMT_TARGET_AVX512 static void hymt_gemm_q6_k_avx512(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                     const uint8_t *act, size_t act_stride, int64_t n,
                                                     int64_t cols, float *y, int64_t y_stride) {
    const int64_t nb = cols / 256;
    if (n > hymt_q6_k_rowpass_max()) {
        hymt_q6_k_rowtiles_avx512(w, row_bytes, r0, r1, act, act_stride, n, nb, y, y_stride);
        return;
    }
    /* Passes of up to HYMT_Q6_K_GEMV_MAX tokens over each row while it is in L1. st: [pass][nb rounded up
     * to 8][4] the tokens' activation scales, block-major (0 past n and nb) */
    const int passes = (int)((n + HYMT_Q6_K_GEMV_MAX - 1) / HYMT_Q6_K_GEMV_MAX);
    float st_stack[(HYMT_Q6_K_ROWPASS_MAX + HYMT_Q6_K_GEMV_MAX - 1) / HYMT_Q6_K_GEMV_MAX * 4 * HYMT_Q6_K_GEMV_NB]
        __attribute__((aligned(64)));
    const int64_t nb8 = (nb + 7) / 8 * 8;
    float *st = st_stack;
    const int lanes = n >= HYMT_Q6_K_GEMV_TOKEN_LANES;
    if (lanes && nb8 > HYMT_Q6_K_GEMV_NB && (st = (float *)aligned_alloc(64, (size_t)passes * nb8 * 16)) == NULL) {
        for (int64_t t = 0; t < n; t++) /* one token at a time: the same values */
            hymt_gemm_q6_k_avx512(w, row_bytes, r0, r1, act + (size_t)t * act_stride, act_stride, 1, cols,
                                  y + t * y_stride, y_stride);
        return;
    }
    if (lanes)
        for (int p = 0; p < passes; p++)
            for (int64_t b = 0; b < nb8; b++)
                for (int t = 0; t < 4; t++) {
                    const int64_t tok = 4 * p + t;
                    st[(p * nb8 + b) * 4 + t] =
                        tok < n && b < nb ? ((const hymt_kq8 *)(act + (size_t)tok * act_stride) + b)->d : 0.0f;
                }
    __m512i s1[4], s2[2], ie, io;
    hymt_kq_perms_avx512(s1, s2);
    hymt_q6_k_pair_idx(&ie, &io);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = w + (size_t)r * row_bytes;
        for (int p = 0; p < passes; p++) {
            const int T = n - 4 * p < HYMT_Q6_K_GEMV_MAX ? (int)(n - 4 * p) : HYMT_Q6_K_GEMV_MAX;
            const uint8_t *a = act + (size_t)(4 * p) * act_stride;
            const float *sp = st + p * nb8 * 4;
            float acc[HYMT_Q6_K_GEMV_MAX] = {0.0f, 0.0f, 0.0f, 0.0f}; /* [token] */
            if (T == 1)
                hymt_q6_k_gemv1_avx512(row, a, act_stride, nb, s1, s2, ie, io, sp, acc);
            else if (T == 2)
                hymt_q6_k_gemv2_avx512(row, a, act_stride, nb, s1, s2, ie, io, sp, acc);
            else if (T == 3)
                hymt_q6_k_gemv3_avx512(row, a, act_stride, nb, s1, s2, ie, io, sp, acc);
            else
                hymt_q6_k_gemv4_avx512(row, a, act_stride, nb, s1, s2, ie, io, sp, acc);
            for (int t = 0; t < T; t++) y[(4 * p + t) * y_stride + r] = acc[t];
        }
    }
    if (st != st_stack) free(st);
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

/* AVX2: row tiles of 8 rows (lane = output row of the float step, as the AVX-512 row tiles). Per row,
 * token and block: pmaddubsw of two code vectors gives words of 4 products (<= 4·63·127, int16-sized),
 * pmaddwd by (sc_j, sc_j) scales them into int32 lanes (lane k of half h: chunk 8h + k), and the −32 code
 * offset enters as one pmaddwd of the words −32·sc_j with the token's bsum_j (|.| <= 4096 and 2032); the
 * 8 rows' lane vectors are then summed by one transpose-add (hymt_q6_k_rows8_avx2). */
typedef struct {
    __m256i wq[8][4][2]; /* row i's codes, kq layout (hymt_q6_k_unpack_avx2) */
    __m256i scp[8][2];   /* row i, half h: lane k = the words (sc[8h + k], sc[8h + k]) */
    __m256i scm[8];      /* row i: words −32·sc[j], j = 0..15 */
} hymt_q6_k_rowtile_avx2;

HYMT_TARGET_AVX2 HYMT_INLINE void hymt_q6_k_scales_avx2(const uint8_t *blk, __m256i scp[2], __m256i *scm) {
    const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
    const __m256i x = _mm256_permute4x64_epi64(s16, 0xD8); /* sc 0-3, 8-11 | 4-7, 12-15 */
    scp[0] = _mm256_unpacklo_epi16(x, x);
    scp[1] = _mm256_unpackhi_epi16(x, x);
    *scm = _mm256_mullo_epi16(s16, _mm256_set1_epi16(-32));
}

/* A of one row and token for one block, spread over the 8 int32 lanes. */
HYMT_TARGET_AVX2 HYMT_INLINE __m256i hymt_q6_k_row_avx2(const __m256i wq[4][2], const __m256i scp[2], __m256i scm,
                                                        const hymt_kq8 *g) {
    __m256i a = _mm256_madd_epi16(scm, _mm256_loadu_si256((const __m256i *)g->bsum));
    for (int h = 0; h < 2; h++)
        for (int v = 0; v < 4; v += 2) {
            const __m256i q0 = _mm256_loadu_si256((const __m256i *)(g->qs + 64 * v + 32 * h));
            const __m256i q1 = _mm256_loadu_si256((const __m256i *)(g->qs + 64 * v + 64 + 32 * h));
            const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(wq[v][h], q0), _mm256_maddubs_epi16(wq[v + 1][h], q1));
            a = _mm256_add_epi32(a, _mm256_madd_epi16(p, scp[h]));
        }
    return a;
}

/* Lane i = Σ of the lanes of v[i] (exact). */
HYMT_TARGET_AVX2 HYMT_INLINE __m256i hymt_q6_k_rows8_avx2(const __m256i v[8]) {
    __m256i a[4], b[2];
    for (int i = 0; i < 4; i++)
        a[i] = _mm256_add_epi32(_mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]),
                                _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 2; i++)
        b[i] = _mm256_add_epi32(_mm256_unpacklo_epi64(a[2 * i], a[2 * i + 1]),
                                _mm256_unpackhi_epi64(a[2 * i], a[2 * i + 1]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(b[0], b[1], 0x20), _mm256_permute2x128_si256(b[0], b[1], 0x31));
}

HYMT_TARGET_AVX2 static void hymt_gemm_q6_k_avx2(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                 const uint8_t *act, size_t act_stride, int64_t n, int64_t cols,
                                                 float *y, int64_t y_stride) {
    const int64_t nb = cols / 256;
    hymt_q6_k_rowtile_avx2 u __attribute__((aligned(32)));
    __m256i p[HYMT_Q6_K_RT_TT][8]; /* [token of the tile][row] */
    __m256 acc[HYMT_Q6_K_RT_PASS]; /* [token of the pass], lane = row */
    float out[8];
    for (int64_t r = r0; r < r1; r += 8) {
        const int rows = r1 - r < 8 ? (int)(r1 - r) : 8;
        const uint8_t *rp[8]; /* a partial tile repeats its last row (outputs not stored) */
        for (int i = 0; i < 8; i++) rp[i] = w + (size_t)(r + (i < rows ? i : rows - 1)) * row_bytes;
        for (int64_t t0 = 0; t0 < n; t0 += HYMT_Q6_K_RT_PASS) {
            const int np = n - t0 < HYMT_Q6_K_RT_PASS ? (int)(n - t0) : HYMT_Q6_K_RT_PASS;
            for (int t = 0; t < np; t++) acc[t] = _mm256_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                uint16_t dh[8];
                for (int i = 0; i < 8; i++) {
                    const uint8_t *blk = rp[i] + b * HYMT_Q6_K_BYTES;
                    for (int k = 0; k < 256; k += 64) {
                        __builtin_prefetch(blk + HYMT_Q6_K_BYTES + k, 0, 3);
                        __builtin_prefetch(blk + 8 * row_bytes + k, 0, 2);
                    }
                    dh[i] = hymt_load_u16(blk + 208);
                }
                const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh));
                for (int tt = 0; tt < np; tt += HYMT_Q6_K_RT_TT) {
                    const int T = np - tt < HYMT_Q6_K_RT_TT ? np - tt : HYMT_Q6_K_RT_TT;
                    const hymt_kq8 *g0 = (const hymt_kq8 *)(act + (size_t)(t0 + tt) * act_stride) + b;
                    for (int i = 0; i < 8; i++) {
                        if (np <= HYMT_Q6_K_RT_TT) { /* one token tile: the row's codes stay in registers */
                            const uint8_t *blk = rp[i] + b * HYMT_Q6_K_BYTES;
                            __m256i wq[4][2], scp[2], scm;
                            hymt_q6_k_unpack_avx2(blk, wq);
                            hymt_q6_k_scales_avx2(blk, scp, &scm);
                            for (int t = 0; t < T; t++)
                                p[t][i] = hymt_q6_k_row_avx2(wq, scp, scm,
                                                             (const hymt_kq8 *)((const uint8_t *)g0 + (size_t)t * act_stride));
                            continue;
                        }
                        if (tt == 0) { /* the first token tile unpacks the rows for the others */
                            const uint8_t *blk = rp[i] + b * HYMT_Q6_K_BYTES;
                            hymt_q6_k_unpack_avx2(blk, u.wq[i]);
                            hymt_q6_k_scales_avx2(blk, u.scp[i], &u.scm[i]);
                        }
                        for (int t = 0; t < T; t++)
                            p[t][i] = hymt_q6_k_row_avx2(u.wq[i], u.scp[i], u.scm[i],
                                                         (const hymt_kq8 *)((const uint8_t *)g0 + (size_t)t * act_stride));
                    }
                    for (int t = 0; t < T; t++) {
                        const hymt_kq8 *g = (const hymt_kq8 *)((const uint8_t *)g0 + (size_t)t * act_stride);
                        const __m256 ds = _mm256_mul_ps(dv, _mm256_set1_ps(g->d));
                        acc[tt + t] = _mm256_fmadd_ps(ds, _mm256_cvtepi32_ps(hymt_q6_k_rows8_avx2(p[t])), acc[tt + t]);
                    }
                }
            }
            for (int t = 0; t < np; t++) {
                _mm256_storeu_ps(out, acc[t]);
                for (int i = 0; i < rows; i++) y[(t0 + t) * y_stride + r + i] = out[i];
            }
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
 * matrix, one thread, tiles take ~200 µs for 3..16 tokens, the vector row tiles 173 µs at 8 tokens and
 * 219 µs at 12; hence tiles from HYMT_Q6_K_AMX_MIN tokens. The vector work runs beside the tile unit:
 * block b + 1 is decoded while the last products of block b run, the float step of a pair of token tiles
 * while the next pair's products run; the Q operands of one block's token tiles lie in a row (sequential
 * L2 reads). Together, 1.8B layer: −3..8 % at n = 64 (1 and 2 threads), 0..−4 % at 256, n = 16 unchanged.
 * Since the 5-12 token passes of the row-at-a-time GEMV (HYMT_Q6_K_ROWPASS_MAX), which cost a pass per 4
 * tokens, the tiles win from 9 tokens: 1.8B shapes at 2 threads from DRAM (session 16, Intel), µs per
 * call passes → tiles: layer n = 8 496 → 528, 9 607 → 531, 11 666 → 536; the 120818-row head n = 8
 * 15.9 → 17.8 ms, 9 19.8 → 17.8, 11 22.2 → 18.0. Against the vector row tiles, which Intel takes from 5
 * tokens since session 17 (same setup, 2 alternations, row tiles / AMX tiles): 1.8B layer n = 9 2834–2850
 * / 3581–3758 µs, 12 3312–3398 / 3637–3743, 16 4038–4134 / 3589–3618, 24 5400–5527 / 3992–4324; the head
 * n = 9 14.3–14.6 / 16.5–17.6 ms, 12 17.1–17.5 / 16.5–17.5, 16 20.7–20.8 / 17.1–17.7: tiles from 13. */
#define HYMT_Q6_K_AMX_MIN 13
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

/* The float step of token tiles k, k + 1 (cnt of them) of one block: acc[i][16 (k + u) + t] =
 * fma(d_i × s_t, f32(C_l + 256 C_h), acc), from the read-back sums c[u][l|h][row][token]. */
HYMT_TARGET_AMX HYMT_INLINE void hymt_q6_k_amx_float(const int32_t c[2][2][16][16], int cnt, const float *s16,
                                                     const float *d, int rows, float (*acc)[HYMT_Q6_K_AMX_PASS],
                                                     int k) {
    for (int u = 0; u < cnt; u++) {
        const __m512 s = _mm512_load_ps(s16 + 16 * u);
        for (int i = 0; i < rows; i++) {
            const __m512i A = _mm512_add_epi32(_mm512_load_si512((const void *)c[u][0][i]),
                                               _mm512_slli_epi32(_mm512_load_si512((const void *)c[u][1][i]), 8));
            const __m512 ds = _mm512_mul_ps(_mm512_set1_ps(d[i]), s);
            float *a = &acc[i][16 * (k + u)];
            _mm512_store_ps(a, _mm512_fmadd_ps(ds, _mm512_cvtepi32_ps(A), _mm512_load_ps(a)));
        }
    }
}

/* Tiles: 0, 1 and 2, 3 the sums C_l, C_h [16 rows][N tokens] int32 of two token tiles; 4, 5 the W
 * operands [16 rows][64 bytes]; 6, 7 the two token tiles' Q operands [16 k-quads][N tokens × 4 bytes]. */
HYMT_TARGET_AMX static void hymt_gemm_q6_k_amx(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                               const uint8_t *act, size_t act_stride, int64_t n, int64_t cols,
                                               float *y, int64_t y_stride) {
    const int64_t nb = cols / 256, ntt = (n + 15) / 16;
    const int N = n < 16 ? (int)n : 16; /* tokens per tile */
    /* q: [nb][ntt][4][16][64] Q operands: q[b][k][v][jj][4t + e] = byte 4jj + e of vector v of token 16k + t
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
                int8_t *dst = q + ((size_t)(b * ntt + k) * 4 + v) * 1024;
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
    /* tl[b % 2]: block b of the row tile; block b + 1 is decoded into the other while the tile unit runs the
     * last token tiles' products of block b */
    hymt_q6_k_amx_tile tl[2] __attribute__((aligned(64)));
    /* C_l, C_h read back, pairs of token tiles in turn: [pair % 2][token tile][l|h][row][token] */
    int32_t c[2][2][2][16][16] __attribute__((aligned(64)));
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
            for (int i = 0; i < 16; i++)
                hymt_q6_k_amx_row(base + (size_t)(i < rows ? i : rows - 1) * row_bytes, s1, s2, sidx, idx_lo, idx_hi,
                                  &tl[0], i);
            for (int64_t b = 0; b < nb; b++) {
                /* the next row tile, read linearly into L2 while this one is computed */
                const uint8_t *next = base + (size_t)rows * row_bytes + (size_t)b * ahead;
                for (size_t k = 0; k < ahead; k += 64) __builtin_prefetch(next + k, 0, 2);
                const hymt_q6_k_amx_tile *tb = &tl[b % 2];
                for (int k = 0; k < ntp; k += 2) {
                    /* two token tiles share each W operand load: four independent accumulators */
                    const int two = k + 1 < ntp;
                    const int8_t *qk = q + (size_t)(b * ntt + k0 + k) * 4096; /* token tiles of a block in a row */
                    _tile_zero(0);
                    _tile_zero(1);
                    if (two) {
                        _tile_zero(2);
                        _tile_zero(3);
                    }
                    for (int v = 0; v < 4; v++) {
                        _tile_loadd(4, tb->lo[v], 64);
                        _tile_loadd(5, tb->hi[v], 64);
                        _tile_loadd(6, qk + 1024 * v, 64);
                        _tile_dpbusd(0, 4, 6);
                        _tile_dpbssd(1, 5, 6);
                        if (two) {
                            _tile_loadd(7, qk + 4096 + 1024 * v, 64);
                            _tile_dpbusd(2, 4, 7);
                            _tile_dpbssd(3, 5, 7);
                        }
                    }
                    /* the next block's decode before the stores that wait for the last products */
                    if (k + 2 >= ntp && b + 1 < nb)
                        for (int i = 0; i < 16; i++)
                            hymt_q6_k_amx_row(base + (size_t)(i < rows ? i : rows - 1) * row_bytes +
                                                  (b + 1) * HYMT_Q6_K_BYTES,
                                              s1, s2, sidx, idx_lo, idx_hi, &tl[(b + 1) % 2], i);
                    /* the float step of the previous pair while the tile unit runs this one's products */
                    if (k > 0)
                        hymt_q6_k_amx_float(c[(k / 2 - 1) % 2], 2, sv + b * 16 * ntt + 16 * (k0 + k - 2), tb->d, rows, acc,
                                            k - 2);
                    int32_t(*cp)[2][16][16] = c[(k / 2) % 2];
                    _tile_stored(0, cp[0][0], 64);
                    _tile_stored(1, cp[0][1], 64);
                    if (two) {
                        _tile_stored(2, cp[1][0], 64);
                        _tile_stored(3, cp[1][1], 64);
                    }
                    if (k + 2 >= ntp)
                        hymt_q6_k_amx_float(cp, 1 + two, sv + b * 16 * ntt + 16 * (k0 + k), tb->d, rows, acc, k);
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
