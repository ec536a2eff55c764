/* fmt_stq1_0.h — Tencent STQ1_0 ("1.25Bit"), REFERENCE.md §2.6: 256 ternary weights in 42 bytes.
 *
 * Block bytes: [0, 32) 64 four-bit codes (group g's nibble: byte g/2, low nibble for even g),
 * [32, 40) 64 sign bits (group g: bit g % 8 of byte 32 + g/8), [40, 42) fp16 scale d.
 * Group g (4 weights) looks up STQ1_CODEBOOK[(sign << 4) | nibble]; its 2-bit lane p (0..2) minus 1 is
 * the ternary digit of weight (g/16)·64 + (g%16) + 16p ("stride-16 placement").
 *
 * int8 path (§3.4, groups of 256 = one block). Activation layout ("plane order"): each group's 256
 * int8 values are stored as 4 planes of 64, plane p position b holding the activation that lane p of
 * group g(b) multiplies, where the positions list the even groups (low code nibbles) first, then
 * the odd ones (high nibbles): b = stq1_act_pos(g) = g/2 + 32·(g % 2), g(b) = 2·(b % 32) + b / 32,
 *     act.qs[64p + stq1_act_pos(g)] = q[64·(g/16) + 16p + (g%16)]
 * so one codebook lookup per group and byte gives a 64-byte plane of lanes {0, 1, 2} lined up with
 * 64 activations (vpdpbusd: unsigned lanes × signed activations), and
 *     Σ digit·q = Σ lane·q − Σ q.
 * The order is the one in which the 32 code bytes yield their nibbles with no byte shuffle: loaded into
 * both 256-bit halves (a broadcast load), the high half shifted right by 4 (stq1_codes512).
 * The integer block sum is exact, so every ISA computes it its own way; the float part is fixed:
 *     y[t, r] = Σ_b (d_b × s_t,b) × f32(isum_t,r,b),   added block by block from 0.0f (no fma).
 *
 * AVX-512, n = 1 (decode of one sequence): the call's rows as ONE sequential stream (stq1_seq_*):
 * groups of 16 consecutive row-blocks in memory order (lanes (row, block), spanning rows) take the
 * same per-row-block work as the row tiles below (3 index ops, 4 vpermb, 4 vpdpbusd, the same exact
 * int16 fold), the float terms (d × s) × f32(isum) are buffered for a 16-row tile and transposed to
 * lane = row at its end, then added block by block from 0.0f (the float sequence above, unchanged).
 * Software prefetch runs in the stream, 1 KiB ahead into L1 and 6 KiB ahead into L2, one line of each
 * per row-block. Why: the row tiles read 16 rows side by side in 42-byte pieces and left the memory
 * and decode rates (≈ 30 and ≈ 35 GB/s at 2 threads) badly overlapped (0.67–0.73 of the roofline); one
 * stream per thread keeps its misses in flight. Kernel benchmark, alternated with the row tiles in
 * one run, medians of 3: n = 1, 2 threads 50.1 → 47.5 µs per layer call (roofline 0.73 → 0.77; the 3
 * repetitions 0.73, 0.73, 0.73 → 0.77, 0.76, 0.77), 1 thread 79.5 → 78.5 (0.89 → 0.90); 1.25Bit model (synthetic 1.8B, 2
 * threads, alternated): decode step 19.6 → 18.8 ms at 1 session (4 sessions, the batched kernel:
 * unchanged), hymt.bench decode 50.4 → 51.3 tok/s. Where the weights sit in L2 it is slower (1
 * thread, 4096 × 2048: 67–69 → 69–71 µs), so it pays from memory only. Tried (C harness cycling the
 * layer's seven matrices through 1 GB, 2 threads, alternated): no L1 prefetch +5 %, no prefetch
 * +33 %, T0 only (6 KiB ahead, no L2 stage) +10 %, the prefetches left where GCC schedules them
 * (bunched at each group's start) +15 %, L2 3–12 KiB / L1 0.5–2 KiB ahead within noise; the
 * tile-end sum by strided gathers instead of the transpose (6 % in L2), a per-lane activation offset
 * table where nb is a multiple of 8 (3 % in L2). n = 2, 3 stay on the row tiles: the stream form
 * ran them 10-17 % slower (compute-bound there; the transpose and epilogue per token).
 * AVX-512 VBMI, n < HYMT_LOWBIT_BATCH_MIN (decode, GEMV; 1..3 tokens per pass): per (row, block) 3
 * ops build the 64 lookup indices in position order (the nibbles as above: one masked word shift;
 * the sign bits: one vpmultishiftqb of the broadcast sign qword puts sign g(b) at bit 4 of byte b; one
 * bit-select merges them), 4 vpermb give the lane planes, 4 vpdpbusd per token; a 16-row tile is
 * walked block by block with every row's sums in registers: two rows' 16-lane sums fold into one
 * vector right away (int16 pack + pairwise madd, exact), so per block and token 16 rows cost 24 fold
 * ops + 9 lane shuffles/adds and the result has lane = row. Ports (Golden Cove class: zmm ALU ops on
 * p0 and p5 only; shuffles p5; vpsrlw, gf2p8affineqb p0), per row-block at n = 1:
 *                               before (cvtepu8 index)   now
 *     index build               5 (2 p5: vpmovzxbw, kmovq)  3 (1 p5: vpmultishiftqb)
 *     vpermb / vpdpbusd         4 p5 / 4 p05             4 p5 / 4 p05
 *     fold + row shuffles       2.1 (1.1 p5)             2.1 (1.1 p5)
 *     scales, float epilogue    ~0.7                     ~0.7
 * (p5: ≈ 7.1 → 6.1 of ≈ 15.8 → 13.8; llvm-mca's Ice Lake model: 153 → 120 cycles per 16-row block;
 * the broadcast loads are pure loads.) Measured on one 2048-column matrix of 4096 rows (L2-resident),
 * old and new alternated in one process, fastest calls: 1 thread 16.3 → 18.3 GB/s at n = 1, 11.6 →
 * 12.5 at n = 2, 8.6 → 9.4 at n = 3; 2 threads 29.4 → 34.6 at n = 1. Tried without gain: two rows per
 * vector (row pairs in the 256-bit halves: half the fold and sign work, but an insert and a blend per
 * pair; equal at n = 1, 5-10 % slower at n = 2, 3), planes 2, 3 by gf2p8affineqb (p0) from one
 * codebook-byte vpermb (one op more per row-block: 5 % slower), the block's epilogue deferred into
 * the next block, L1 prefetch of the next block, GCC's pre-RA scheduling. The next tile (16 rows on)
 * is prefetched while this one is decoded.
 * AVX-512BW (no VBMI): the same nibbles, the sign bits as a byte mask (vpshufb spread + vptestmb),
 * two vpshufb per plane (sign-0 / sign-1 tables).
 * AVX-512 VBMI on AMD, n ≥ STQ1_LUT_MIN (prefill, batches of 8+ sequences): table lookup instead of
 * multiplies. A group's 4 weights take one of 32 digit patterns, so the activations of each call carry,
 * per group position, the 32 values Σ digit·q (int16); a 16×16 dword transpose of 16 rows' index bytes
 * gives, per position pair, 32 word indices, and one vpermt2w adds up 2 groups × 16 rows for one token
 * (128 multiply-adds where a vpdpbusd does 64). See "batched kernel by table lookup" below.
 * AVX-512, n ≥ HYMT_LOWBIT_BATCH_MIN (batches; with VBMI up to STQ1_LUT_MIN − 1): the index vectors of
 * 16 rows are transposed once per block (16×16 dwords) so each lookup yields 4 weights of 16 rows,
 * multiplied by a broadcast activation dword per token: one vpdpbusd per 4 weights × 16 rows × token,
 * each weight block decoded once per row tile for all tokens, no per-token reduction.
 * AVX2: per 32 positions (one nibble half of the code bytes), two pshufb lookups (sign 0 / sign 1
 * tables, bit 7 zeroes the other) per plane, maddubs + madd. NEON: one tbl (32 entries) per 16
 * positions, signed digits, SDOT. */
#ifndef HYMT_FMT_STQ1_0_H
#define HYMT_FMT_STQ1_0_H

#include "hymt_common.h"
#include "act_q8g.h"
#include "cpu.h"
#include "vec.h"
#include "lowbit_common.h"
#include "lowbit_amx.h"

#define STQ1_BLOCK 256
#define STQ1_BYTES 42

static const uint8_t STQ1_CODEBOOK[32] = {
    0xa9, 0x89, 0x29, 0x09, 0xa6, 0x86, 0x26, 0x06, 0x9a, 0x92, 0x1a, 0x12, 0x6a, 0x62, 0x4a, 0x42,
    0x01, 0x21, 0x81, 0xa1, 0x04, 0x24, 0x84, 0xa4, 0x10, 0x18, 0x90, 0x98, 0x40, 0x48, 0x60, 0x68,
};

/* Sign bit of the group at plane position b (stq1_act_pos): group g = 2·(b % 32) + b / 32 has its bit in
 * sign byte g / 8 = (b % 32) / 4 (STQ1_SIGN_SPREAD), bit g % 8 (STQ1_SIGN_BIT), i.e. at bit g of the sign
 * qword, which vpmultishiftqb moves to bit 4 of byte b from bit offset g − 4 mod 64 (STQ1_SIGN_SHIFT). */
static const uint8_t STQ1_SIGN_SHIFT[64] = {
    60, 62, 0,  2,  4,  6,  8,  10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 36, 38,
    40, 42, 44, 46, 48, 50, 52, 54, 56, 58, 61, 63, 1,  3,  5,  7,  9,  11, 13, 15, 17, 19,
    21, 23, 25, 27, 29, 31, 33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59,
};
static const uint8_t STQ1_SIGN_SPREAD[64] = {
    0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7,
    0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7,
};
static const uint8_t STQ1_SIGN_BIT[64] = {
    1, 4, 16, 64, 1, 4, 16, 64, 1, 4, 16, 64, 1, 4, 16, 64, 1, 4, 16, 64, 1, 4, 16, 64,
    1, 4, 16, 64, 1, 4, 16, 64, 2, 8, 32, 128, 2, 8, 32, 128, 2, 8, 32, 128, 2, 8, 32, 128,
    2, 8, 32, 128, 2, 8, 32, 128, 2, 8, 32, 128, 2, 8, 32, 128,
};

HYMT_INLINE int stq1_group_index(const uint8_t *blk, int g) {
    int nibble = (blk[g >> 1] >> (4 * (g & 1))) & 15;
    int sign = (blk[32 + (g >> 3)] >> (g & 7)) & 1;
    return (sign << 4) | nibble;
}

/* ---- decoder (§2.6, bit-exact: w = f32(digit) × d) ---- */

static void hymt_decode_stq1_0(const uint8_t *src, float *dst, int64_t nblocks) {
    for (int64_t b = 0; b < nblocks; b++) {
        const uint8_t *blk = src + b * STQ1_BYTES;
        float *out = dst + b * STQ1_BLOCK;
        float d = hymt_fp16_to_f32(hymt_load_u16(blk + 40));
        for (int g = 0; g < 64; g++) {
            int cb = STQ1_CODEBOOK[stq1_group_index(blk, g)];
            for (int p = 0; p < 4; p++) {
                int digit = ((cb >> (2 * p)) & 3) - 1;
                out[(g >> 4) * 64 + (g & 15) + 16 * p] = (float)digit * d;
            }
        }
    }
}

/* ---- float32 path (§3.3): Σ_blocks d × dot(unit digits, x_block) ---- */

static float hymt_row_dot_f32_stq1_0(const uint8_t *row, const float *x, int64_t cols) {
    float digits[STQ1_BLOCK]; /* [256] unit digits of one block, natural order */
    float total = 0.0f;
    for (int64_t b = 0; b < cols / STQ1_BLOCK; b++) {
        const uint8_t *blk = row + b * STQ1_BYTES;
        for (int g = 0; g < 64; g++) {
            int cb = STQ1_CODEBOOK[stq1_group_index(blk, g)];
            for (int p = 0; p < 4; p++) digits[(g >> 4) * 64 + (g & 15) + 16 * p] = (float)(((cb >> (2 * p)) & 3) - 1);
        }
        float d = hymt_fp16_to_f32(hymt_load_u16(blk + 40));
        total += d * hymt_dot_f32(digits, x + b * STQ1_BLOCK, STQ1_BLOCK);
    }
    return total;
}

/* ---- activations: §3.4 groups, qs permuted to plane order (bsums recomputed per 16 bytes) ---- */

/* The table-lookup kernel (below) runs on AMD cores only: measured on Zen 4, where a 512-bit vpdpbusd
 * issues once per cycle and a word permute as often; Intel cores issue two vpdpbusd per cycle (128
 * multiply-adds, what one lookup does at best) and there the vpdpbusd tiles stay (AMX from
 * STQ1_AMX_MIN tokens; session 16 measured the lookup from 4 tokens there at 1.4-1.6x their time).
 * In calls that kernel takes, each token's activations also carry
 * its lookup tables: [nb] hymt_q8g groups, then STQ1_LUT_BYTES per block, the whole padded to a multiple
 * of sizeof(hymt_q8g) because the other kernels step between tokens in whole groups. */
#define STQ1_LUT_BYTES 2048 /* per block: 32 position pairs × 32 int16 */
#define STQ1_LUT_MIN 8      /* tokens from which that kernel runs (measured: see there) */

HYMT_INLINE int stq1_lut_wanted(int64_t n) {
#if defined(HYMT_X86)
    const hymt_cpu_features *f = hymt_cpu();
    if (n < STQ1_LUT_MIN || hymt_active_isa != HYMT_ISA_AVX512 || !f->avx512vbmi || !f->amd) return 0;
#if defined(HYMT_HAVE_AMX)
    if (hymt_amx_active()) return 0; /* the AMX tiles run from STQ1_AMX_MIN (< STQ1_LUT_MIN) tokens */
#endif
    return 1;
#else
    (void)n;
    return 0;
#endif
}

HYMT_INLINE size_t stq1_lut_offset(int64_t cols) { return hymt_act_stride_q8g(cols); }

static size_t hymt_act_stride_stq1_0(int64_t cols, int64_t n) {
    size_t groups = stq1_lut_offset(cols), tables = (size_t)(cols / STQ1_BLOCK) * STQ1_LUT_BYTES;
    if (!stq1_lut_wanted(n)) return groups;
    return groups + (tables + sizeof(hymt_q8g) - 1) / sizeof(hymt_q8g) * sizeof(hymt_q8g);
}

/* Position of group g inside a 64-byte plane: even groups (low nibbles) first, then odd ones. */
HYMT_INLINE int stq1_act_pos(int g) { return (g >> 1) | ((g & 1) << 5); }

/* Natural chunk (k, p) = q[64k + 16p ..+16) holds lane p of groups 16k..16k+15: its even bytes go to
 * plane p positions 8k..8k+7, its odd bytes to 32 + 8k..; bsums of the new 16-byte chunks. */
static void stq1_permute_group_scalar(hymt_q8g *g) {
    int8_t natural[256];
    memcpy(natural, g->qs, sizeof natural);
    for (int k = 0; k < 4; k++)
        for (int p = 0; p < 4; p++)
            for (int i = 0; i < 8; i++) {
                g->qs[64 * p + 8 * k + i] = natural[64 * k + 16 * p + 2 * i];
                g->qs[64 * p + 32 + 8 * k + i] = natural[64 * k + 16 * p + 2 * i + 1];
            }
    for (int c = 0; c < 16; c++) {
        int sum = 0;
        for (int i = 16 * c; i < 16 * c + 16; i++) sum += g->qs[i];
        g->bsums[c] = (int16_t)sum;
    }
}

#if defined(HYMT_X86)
/* The same permutation: chunks de-interleaved in their lanes (qword 2p of vector k = even(k, p), 2p + 1
 * = odd(k, p)), then plane p = qwords [even(0..3, p), odd(0..3, p)] by three two-source permutes; the
 * bsums of the planes as quantization forms them (hymt_q8g_chunk_sums_avx512; the total is unchanged). */
HYMT_TARGET_AVX512 static void stq1_permute_group_avx512(hymt_q8g *g) {
    const __m512i deint = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
    const __m512i join = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
    __m512i v[4]; /* [k] quarter p: even(k, p), odd(k, p) */
    for (int k = 0; k < 4; k++) v[k] = _mm512_shuffle_epi8(_mm512_loadu_si512((const void *)(g->qs + 64 * k)), deint);
    __m512i planes[4];
    for (int p = 0; p < 4; p++) {
        const __m512i pick = _mm512_setr_epi64(2 * p, 8 + 2 * p, 2 * p + 1, 9 + 2 * p, 0, 0, 0, 0);
        planes[p] = _mm512_permutex2var_epi64(_mm512_permutex2var_epi64(v[0], pick, v[1]), join,
                                              _mm512_permutex2var_epi64(v[2], pick, v[3]));
        _mm512_storeu_si512((void *)(g->qs + 64 * p), planes[p]);
    }
    hymt_q8g_chunk_sums_avx512(planes, g->bsums);
}
#endif

#if defined(HYMT_X86)
/* Lookup tables of one activation group for the batched VBMI kernel. Position pair s = 2j + e (j < 16,
 * e < 2) is the plane positions A = 4j + e and B = A + 2; its table, 32 int16, is
 *     tab[16·side + c] = T(A or B, c),   T(b, c) = Σ_p digit_p(c) · q_p(b)
 * for codebook entry c < 16 (q_p(b) = qs[64p + b]). Entry c + 16 is the negation of entry c (the sign bit
 * of a group negates all its digits, §2.6), so with the negated table beside it (the kernel forms it)
 * an index nibble | side << 4 | sign << 5 looks up Σ digit·q of a group of 4 weights exactly
 * (|T| <= 3 · 127) in one vpermt2w.
 * Built with the unsigned form u = q + 128 (vpmaddubsw: u8 × s8): T = Σ_p digit_p · u_p − 128 Σ_p digit_p,
 * per pair two vpermt2b (the pair's (u_0, u_1) and (u_2, u_3) byte pairs in every word), two vpmaddubsw
 * (|Σ| <= 2 · 255: no saturation) and the bias. */
static const int8_t STQ1_LUT_DIG01[64] = { /* word c: digits 0, 1 of entry c % 16 (STQ1_CODEBOOK) */
    0, 1, 0, 1, 0, 1, 0, 1, 1, 0, 1, 0, 1, 0, 1, 0, 1, 1, 1, -1, 1, 1, 1, -1, 1, 1, 1, -1, 1, 1, 1, -1,
    0, 1, 0, 1, 0, 1, 0, 1, 1, 0, 1, 0, 1, 0, 1, 0, 1, 1, 1, -1, 1, 1, 1, -1, 1, 1, 1, -1, 1, 1, 1, -1,
};
static const int8_t STQ1_LUT_DIG23[64] = { /* word c: digits 2, 3 of entry c % 16 */
    1, 1, -1, 1, 1, -1, -1, -1, 1, 1, -1, 1, 1, -1, -1, -1, 0, 1, 0, 1, 0, -1, 0, -1, 1, 0, 1, 0, -1, 0, -1, 0,
    1, 1, -1, 1, 1, -1, -1, -1, 1, 1, -1, 1, 1, -1, -1, -1, 0, 1, 0, 1, 0, -1, 0, -1, 1, 0, 1, 0, -1, 0, -1, 0,
};
static const int16_t STQ1_LUT_BIAS[32] = { /* 128 · Σ_p digit_p of entry c % 16 */
    384, 128, 128, -128, 384, 128, 128, -128, 384, 128, 128, -128, 384, 128, 128, -128,
    384, 128, 128, -128, 384, 128, 128, -128, 384, 128, 128, -128, 384, 128, 128, -128,
};

HYMT_TARGET_AVX512VBMI static void stq1_lut_tables_vbmi(const hymt_q8g *g, int16_t *tab) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const __m512i u0 = _mm512_xor_si512(_mm512_load_si512((const void *)g->qs), flip), /* [64] q + 128 */
        u1 = _mm512_xor_si512(_mm512_load_si512((const void *)(g->qs + 64)), flip),
        u2 = _mm512_xor_si512(_mm512_load_si512((const void *)(g->qs + 128)), flip),
        u3 = _mm512_xor_si512(_mm512_load_si512((const void *)(g->qs + 192)), flip);
    const __m512i dig01 = _mm512_loadu_si512((const void *)STQ1_LUT_DIG01);
    const __m512i dig23 = _mm512_loadu_si512((const void *)STQ1_LUT_DIG23);
    const __m512i bias = _mm512_loadu_si512((const void *)STQ1_LUT_BIAS);
    /* vpermt2b bytes of word c, less A: the position (A or B = A + 2) in plane 0 (byte 0) and 1 (byte 1) */
    const __m512i pair =
        _mm512_mask_blend_epi16((__mmask32)0xffff0000u, _mm512_set1_epi16(0x4000), _mm512_set1_epi16(0x4202));
    for (int s = 0; s < 32; s++) {
        const __m512i at = _mm512_add_epi8(pair, _mm512_set1_epi8((char)(4 * (s >> 1) + (s & 1)))); /* A = 4j + e */
        __m512i t = _mm512_add_epi16(_mm512_maddubs_epi16(_mm512_permutex2var_epi8(u0, at, u1), dig01),
                                     _mm512_maddubs_epi16(_mm512_permutex2var_epi8(u2, at, u3), dig23));
        _mm512_store_si512((void *)(tab + 32 * s), _mm512_sub_epi16(t, bias));
    }
}
#endif

static void hymt_prepare_stq1_0(const float *x, int64_t cols, int64_t n, uint8_t *act) {
    hymt_q8g *groups = (hymt_q8g *)act;
    for (int64_t b = 0; b < cols / STQ1_BLOCK; b++) {
        hymt_q8g *g = groups + b;
        hymt_quantize_group_q8g(x + b * STQ1_BLOCK, g);
#if defined(HYMT_X86)
        if (hymt_active_isa == HYMT_ISA_AVX512) {
            stq1_permute_group_avx512(g);
            continue;
        }
#endif
        stq1_permute_group_scalar(g);
    }
#if defined(HYMT_X86)
    if (stq1_lut_wanted(n))
        for (int64_t b = 0; b < cols / STQ1_BLOCK; b++)
            stq1_lut_tables_vbmi(groups + b, (int16_t *)(act + stq1_lut_offset(cols) + b * STQ1_LUT_BYTES));
#endif
}

/* ---- int8 GEMM: scalar reference ---- */

/* Exact Σ digit·q of one block against plane-ordered activations. */
static inline int32_t stq1_block_isum_scalar(const uint8_t *blk, const hymt_q8g *a) {
    int32_t lanes = 0;
    for (int g = 0; g < 64; g++) {
        int cb = STQ1_CODEBOOK[stq1_group_index(blk, g)];
        for (int p = 0; p < 4; p++) lanes += ((cb >> (2 * p)) & 3) * a->qs[64 * p + stq1_act_pos(g)];
    }
    return lanes - a->sum;
}

static void hymt_gemm_stq1_0_scalar(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                    const uint8_t *act, size_t act_stride, int64_t n, int64_t cols, float *y,
                                    int64_t y_stride) {
    int64_t nb = cols / STQ1_BLOCK;
    for (int64_t t = 0; t < n; t++) {
        const hymt_q8g *a = (const hymt_q8g *)(act + t * act_stride);
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *row = w + r * row_bytes;
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = row + b * STQ1_BYTES;
                float d = hymt_fp16_to_f32(hymt_load_u16(blk + 40));
                acc += (d * a[b].d) * (float)stq1_block_isum_scalar(blk, a + b);
            }
            y[t * y_stride + r] = acc;
        }
    }
}

/* ---- AVX-512 ---- */
#if defined(HYMT_X86)

/* Lane-plane tables, derived from STQ1_CODEBOOK in registers: byte i of `entries` holds a codebook
 * byte, byte i of plane p its 2-bit lane p (the word shift brings no foreign bits into bits 0..1). */
HYMT_TARGET_AVX512 HYMT_INLINE __m512i stq1_lane_plane512(__m512i entries, int p) {
    return _mm512_and_si512(_mm512_srli_epi16(entries, 2 * p), _mm512_set1_epi8(3));
}

/* vpermb tables: tab[p] byte i = lane p of entry i & 31 (the index keeps 6 bits; entries repeat). */
HYMT_TARGET_AVX512 HYMT_INLINE void stq1_tables_vbmi(__m512i tab[4]) {
    __m512i entries = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)STQ1_CODEBOOK));
    for (int p = 0; p < 4; p++) tab[p] = stq1_lane_plane512(entries, p);
}

/* vpshufb tables: tab0[p] / tab1[p] byte i = lane p of entry (i & 15) / 16 + (i & 15), the sign-0 and
 * sign-1 halves of the codebook repeated in every 16-byte lane. */
HYMT_TARGET_AVX512 HYMT_INLINE void stq1_tables_bw(__m512i tab0[4], __m512i tab1[4]) {
    __m512i sign0 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)STQ1_CODEBOOK));
    __m512i sign1 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(STQ1_CODEBOOK + 16)));
    for (int p = 0; p < 4; p++) {
        tab0[p] = stq1_lane_plane512(sign0, p);
        tab1[p] = stq1_lane_plane512(sign1, p);
    }
}

/* The 32 code bytes of a block in both 256-bit halves (a broadcast load), the upper half shifted right
 * by 4 (as words): bits 0..3 of byte b are the nibble of the group at plane position b
 * (stq1_act_pos: low nibbles of bytes 0..31, then their high nibbles); bits 4..7 are foreign. */
HYMT_TARGET_AVX512 HYMT_INLINE __m512i stq1_codes512(const uint8_t *blk) {
    __m512i c = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)blk));
    return _mm512_mask_srli_epi16(c, (__mmask32)0xffff0000u, c, 4);
}

HYMT_INLINE uint64_t stq1_sign_bits(const uint8_t *blk) {
    uint64_t s;
    memcpy(&s, blk + 32, 8);
    return s;
}

/* VBMI lookup indices of a block in plane-position order: bits 0..3 the nibble, bit 4 the sign (one
 * vpmultishiftqb of the broadcast sign qword, `shifts` = STQ1_SIGN_SHIFT), merged by one bit-select.
 * Bits 5..7 are other sign bits: vpermb ignores bits 6..7 and the 64-entry tables repeat for bit 5. */
HYMT_TARGET_AVX512VBMI HYMT_INLINE __m512i stq1_index_vbmi(const uint8_t *blk, __m512i shifts) {
    __m512i sign = _mm512_multishift_epi64_epi8(shifts, _mm512_set1_epi64((long long)stq1_sign_bits(blk)));
    return _mm512_ternarylogic_epi32(stq1_codes512(blk), sign, _mm512_set1_epi8(15), 0xe4); /* c ? a : b */
}

/* AVX-512BW: the sign bits of a block in plane-position order as a byte mask (the broadcast sign qword
 * spread to one byte per position and tested against its bit; `spread`, `bit` = STQ1_SIGN_SPREAD,
 * STQ1_SIGN_BIT), and the clean 5-bit indices. */
HYMT_TARGET_AVX512 HYMT_INLINE __mmask64 stq1_signs_bw(const uint8_t *blk, __m512i spread, __m512i bit) {
    __m512i s = _mm512_shuffle_epi8(_mm512_set1_epi64((long long)stq1_sign_bits(blk)), spread);
    return _mm512_test_epi8_mask(s, bit);
}
HYMT_TARGET_AVX512 HYMT_INLINE __m512i stq1_index_bw(const uint8_t *blk, __m512i spread, __m512i bit) {
    __m512i nib = _mm512_and_si512(stq1_codes512(blk), _mm512_set1_epi8(15));
    return _mm512_mask_add_epi8(nib, stq1_signs_bw(blk, spread, bit), nib, _mm512_set1_epi8(16));
}

#define STQ1_LOAD64(table) _mm512_loadu_si512((const void *)(table))

/* Planes of one row-block: VBMI variant (sign as index bit 4, one vpermb per plane). */
#define STQ1_PLANES_VBMI(blk, pl)                                                                       \
    do {                                                                                                \
        __m512i idx_ = stq1_index_vbmi(blk, sign_shifts);                                               \
        for (int p_ = 0; p_ < 4; p_++) (pl)[p_] = _mm512_permutexvar_epi8(idx_, tab[p_]);              \
    } while (0)

/* Planes of one row-block: AVX-512BW variant (masked vpshufb selects the sign-1 table). */
#define STQ1_PLANES_BW(blk, pl)                                                                         \
    do {                                                                                                \
        __m512i nib_ = _mm512_and_si512(stq1_codes512(blk), _mm512_set1_epi8(15));                      \
        __mmask64 neg_ = stq1_signs_bw(blk, sign_spread, sign_bit);                                     \
        for (int p_ = 0; p_ < 4; p_++)                                                                  \
            (pl)[p_] = _mm512_mask_shuffle_epi8(_mm512_shuffle_epi8(tab0[p_], nib_), neg_, tab1[p_], nib_); \
    } while (0)

/* One row-block's lane planes against one token's plane-ordered activations q[256]: 16 exact partial
 * sums of Σ lane·q (vpdpbusd: unsigned lanes × signed activations). */
HYMT_TARGET_AVX512 HYMT_INLINE __m512i stq1_planes_dot(const __m512i pl[4], const int8_t *q) {
    __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), pl[0], _mm512_loadu_si512((const void *)q));
    s = _mm512_dpbusd_epi32(s, pl[1], _mm512_loadu_si512((const void *)(q + 64)));
    s = _mm512_dpbusd_epi32(s, pl[2], _mm512_loadu_si512((const void *)(q + 128)));
    return _mm512_dpbusd_epi32(s, pl[3], _mm512_loadu_si512((const void *)(q + 192)));
}

/* Exact 16-lane → quarter-lane folding of two rows' block sums (lanes |x| ≤ 16·2·127 = 4064, so the
 * int16 saturation of packs never triggers): per 128-bit quarter, dwords [a0+a1, a2+a3, b0+b1, b2+b3].
 * Applied twice it turns four rows into one vector holding, per quarter, the rows' quarter sums. */
HYMT_TARGET_AVX512 HYMT_INLINE __m512i stq1_fold2(__m512i a, __m512i b) {
    return _mm512_madd_epi16(_mm512_packs_epi32(a, b), _mm512_set1_epi16(1));
}

/* q[m] quarter L: dword k = rows 4m + k summed over quarter L → lane i = row i (exact). */
HYMT_TARGET_AVX512 HYMT_INLINE __m512i stq1_quarters_to_rows(const __m512i *q) {
    __m512i f0 = _mm512_add_epi32(_mm512_shuffle_i32x4(q[0], q[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_i32x4(q[0], q[1], _MM_SHUFFLE(3, 1, 3, 1)));
    __m512i f1 = _mm512_add_epi32(_mm512_shuffle_i32x4(q[2], q[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_i32x4(q[2], q[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(f0, f1, _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_i32x4(f0, f1, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* GEMV kernel: one 16-row tile × T ≤ 3 tokens, block by block (n = 2, 3; n = 1 where the stream kernel
 * below does not apply: rows wider than STQ1_SEQ_MAX_BLOCKS blocks or not contiguous). The 16 rows' planes of a block are
 * looked up one row at a time and each pair of rows' lane sums is folded right away (stq1_fold2), so
 * the 16 rows × T tokens stay in registers (no partial-sum buffer) and the reduction costs 12 packs
 * + 12 madds + 9 lane shuffles/adds per block and token (a transpose-add tree of 16 vectors costs 45
 * ops, 30 of them shuffles). The loops are unrolled so that every array lives in registers. The next
 * tile's block (16 rows further) is prefetched into L2 while this one is decoded, and the first tile of
 * a call on entry (STQ1_GEMV: no earlier tile ran ahead of it). Measured on the kernel benchmark's
 * layer from DRAM, 2 threads, alternated in one process: n = 1 20.1 → 21.2 GB/s, n = 2 +5 %, n = 3
 * +2 % (T0 instead of T1: within noise). Stopping the run-ahead at the end of the call's rows (as
 * Q2_0C does) was no better here and cost the 1.25Bit model's decode ~2 %: its gate/up product runs in
 * 64-row calls whose next rows are the same thread's. Two tiles ahead, or one contiguous range per
 * block step: no better.
 * At T = 1 the prefetch is placed like Q2_0C's: block step b owns the b-th share of 16 · STQ1_BYTES
 * contiguous bytes of the next tile (10–11 lines), each line once over the steps, one prefetch in each
 * of the step's first row iterations (the decode runs between them) instead of one per row at
 * blk + 16 · row_bytes (16 a step, row-strided, lines repeated). 16384×2048 from a 1 GB pool (DRAM),
 * alternated runs against the per-row placement, medians: n = 1, 1 thread 10.35 → 11.03 GB/s, 2 threads
 * 8.31 → 8.78 (machine shared); kernel benchmark layer n = 1, 1 thread 112 → 103 µs. At T = 2, 3 the
 * same share placement lost (n = 2 −1..3 %, n = 3 −2..5 %: more decode per row, the shares' last rows
 * arrive late), so those keep the per-row prefetch. Row-strided and deduplicated (the line starting in
 * the next tile's row-block, if any, a data-dependent branch per row): −8 % at n = 1..3. */

/* The lines block step b of nb prefetches of the next tile nx (16 · row_bytes contiguous bytes): those
 * starting in its b-th share of 16 · STQ1_BYTES bytes (the last share runs to the tile's end), so each
 * line once over the steps; 10 or 11 lines per step. */
HYMT_INLINE hymt_lines stq1_step_lines(const uint8_t *nx, int64_t b, int64_t nb, size_t row_bytes) {
    const uint8_t *tile_end = nx + 16 * row_bytes;
    return hymt_step_lines(nx + b * 16 * STQ1_BYTES, b + 1 < nb ? nx + (b + 1) * 16 * STQ1_BYTES : tile_end,
                           hymt_line_up(tile_end));
}
#define STQ1_GEMV_TILE(NAME, TARGET, TABLES, PLANES)                                                    \
    TARGET HYMT_INLINE void NAME(const uint8_t *wt, size_t row_bytes, int rows, const hymt_q8g *a0,    \
                                 size_t ts, int64_t nb, float *yt, int64_t y_stride, const int T) {     \
        TABLES;                                                                                         \
        const __m512i row_offsets = hymt_row_offsets(row_bytes);                                        \
        const __mmask16 row_mask = (__mmask16)((1u << rows) - 1u);                                      \
        __m512 acc[3] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()}; /* [token] */  \
        const uint8_t *nx = wt + 16 * row_bytes; /* the next tile: 16 rows, contiguous */              \
        for (int64_t b = 0; b < nb; b++) {                                                              \
            const hymt_lines pf = stq1_step_lines(nx, b, nb, row_bytes);                                \
            __m512i quarter[3][4]; /* [token][m]: rows 4m..4m+3 per quarter */                          \
            _Pragma("GCC unroll 4") for (int m = 0; m < 4; m++) {                                       \
                __m512i pair[3][2]; /* [token][h]: rows 4m+2h, 4m+2h+1 */                                \
                _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {                                   \
                    __m512i lanes[3][2]; /* [token][e]: row 4m+2h+e, 16 lanes */                        \
                    _Pragma("GCC unroll 2") for (int e = 0; e < 2; e++) {                               \
                        int i = 4 * m + 2 * h + e;                                                      \
                        /* rows past the tile's end repeat its last row (lanes masked at the store) */  \
                        const uint8_t *blk = wt + (i < rows ? i : rows - 1) * row_bytes + b * STQ1_BYTES; \
                        if (T == 1)                                                                     \
                            hymt_prefetch_line(pf, i);                                                  \
                        else                                                                            \
                            _mm_prefetch((const char *)blk + 16 * row_bytes, _MM_HINT_T1);              \
                        __m512i pl[4];                                                                  \
                        PLANES(blk, pl);                                                                \
                        for (int t = 0; t < T; t++) {                                                   \
                            lanes[t][e] = stq1_planes_dot(pl, a0[t * ts + b].qs);                       \
                        }                                                                               \
                    }                                                                                   \
                    for (int t = 0; t < T; t++) pair[t][h] = stq1_fold2(lanes[t][0], lanes[t][1]);      \
                }                                                                                       \
                for (int t = 0; t < T; t++) quarter[t][m] = stq1_fold2(pair[t][0], pair[t][1]);         \
            }                                                                                           \
            if (T == 1) hymt_prefetch_rest(pf);                                                         \
            __m512 d = hymt_gather_scales(wt, row_offsets, row_mask, b * STQ1_BYTES + 38, 1);           \
            for (int t = 0; t < T; t++) {                                                               \
                const hymt_q8g *g = a0 + t * ts + b;                                                    \
                __m512i isum = _mm512_sub_epi32(stq1_quarters_to_rows(quarter[t]), _mm512_set1_epi32(g->sum)); \
                acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(_mm512_mul_ps(d, _mm512_set1_ps(g->d)),   \
                                                             _mm512_cvtepi32_ps(isum)));               \
            }                                                                                           \
        }                                                                                               \
        for (int t = 0; t < T; t++) _mm512_mask_storeu_ps(yt + t * y_stride, row_mask, acc[t]);         \
    }

/* Row tiles of 16 × token tiles of up to STQ1_GEMV_TOKENS. */
#define STQ1_GEMV_TOKENS 3
#define STQ1_GEMV(NAME, TARGET, TILE)                                                                   \
    TARGET static void NAME(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1, const uint8_t *act, \
                            size_t act_stride, int64_t n, int64_t cols, float *y, int64_t y_stride) {  \
        int64_t nb = cols / STQ1_BLOCK;                                                                 \
        size_t ts = act_stride / sizeof(hymt_q8g); /* groups between tokens */                          \
        /* the first tile (no earlier tile's steps prefetched it) */                                    \
        const uint8_t *first_end = w + (r1 < r0 + 16 ? r1 : r0 + 16) * row_bytes;                       \
        for (const uint8_t *p = w + r0 * row_bytes; p < first_end; p += 64)                             \
            _mm_prefetch((const char *)p, _MM_HINT_T1);                                                 \
        for (int64_t r = r0; r < r1; r += 16) {                                                         \
            int rows = (int)(r1 - r < 16 ? r1 - r : 16);                                                \
            for (int64_t t0 = 0; t0 < n; t0 += STQ1_GEMV_TOKENS) {                                      \
                const hymt_q8g *a0 = (const hymt_q8g *)(act + t0 * act_stride);                         \
                const uint8_t *wt = w + r * row_bytes;                                                  \
                float *yt = y + t0 * y_stride + r;                                                      \
                switch (n - t0 < STQ1_GEMV_TOKENS ? n - t0 : STQ1_GEMV_TOKENS) {                        \
                case 3: TILE(wt, row_bytes, rows, a0, ts, nb, yt, y_stride, 3); break;                  \
                case 2: TILE(wt, row_bytes, rows, a0, ts, nb, yt, y_stride, 2); break;                  \
                default: TILE(wt, row_bytes, rows, a0, ts, nb, yt, y_stride, 1); break;                 \
                }                                                                                       \
            }                                                                                           \
        }                                                                                               \
    }

#define STQ1_TABLES_VBMI                                                                                \
    const __m512i sign_shifts = STQ1_LOAD64(STQ1_SIGN_SHIFT);                                           \
    __m512i tab[4];                                                                                     \
    stq1_tables_vbmi(tab)
#define STQ1_TABLES_BW                                                                                  \
    const __m512i sign_spread = STQ1_LOAD64(STQ1_SIGN_SPREAD), sign_bit = STQ1_LOAD64(STQ1_SIGN_BIT);   \
    __m512i tab0[4], tab1[4];                                                                           \
    stq1_tables_bw(tab0, tab1)
STQ1_GEMV_TILE(stq1_gemv_tile_vbmi, HYMT_TARGET_AVX512VBMI, STQ1_TABLES_VBMI, STQ1_PLANES_VBMI)
STQ1_GEMV_TILE(stq1_gemv_tile_bw, HYMT_TARGET_AVX512, STQ1_TABLES_BW, STQ1_PLANES_BW)
STQ1_GEMV(stq1_gemm_avx512vbmi, HYMT_TARGET_AVX512VBMI, stq1_gemv_tile_vbmi)
STQ1_GEMV(stq1_gemm_avx512bw, HYMT_TARGET_AVX512, stq1_gemv_tile_bw)

/* ---- AVX-512 GEMV at n = 1: the call's rows as one sequential stream ----
 * Rows are contiguous (row_bytes = nb · STQ1_BYTES), so a 16-row tile is 16 · nb blocks in stream
 * order k = row · nb + block. The kernel reads them in that order in groups of 16 consecutive
 * row-blocks (lanes (row, block); a group may span two or more rows): each row-block's planes are
 * looked up once (3 ops build the index, 4 vpermb) and dotted with its activation group (4 vpdpbusd),
 * and the group's 16 lane vectors fold exactly as the 16 rows of the row-strided tile above do
 * (stq1_fold2 twice, stq1_quarters_to_rows), giving lane i = Σ of row-block k0 + i. Per group then:
 * − Σq of each lane's activation group, int → float, × (d × s) (d gathered from the 16 blocks, s from
 * the periodically extended activation scales), and the 16 float terms are stored in stream order,
 * i.e. as the row-major [16][nb] terms of the tile. At the tile's end they are turned to lane = row
 * (per 8 blocks: two rows per vector, a 16 × 8 transpose of 24 permutes; nb not a multiple of 8: one
 * strided gather per block) and y = Σ_b term_b is added block by block from 0.0f: the float sequence
 * of the header, unchanged. (The gathers cost 6 % in L2 at 2048 columns, the transpose about 3 %; a
 * tile's terms are 16 · nb floats, so rows are limited to STQ1_SEQ_MAX_BLOCKS blocks.)
 * Prefetch: each group fetches the lines starting in its 16 · STQ1_BYTES bytes of the stream
 * shifted STQ1_SEQ_PF_L1 bytes ahead into L1 and STQ1_SEQ_PF_L2 ahead into L2 (10 or 11 lines each),
 * one line of each in each of its first row-block iterations, with a compiler barrier per iteration
 * (left free, GCC hoists all 22 to the group's start: DRAM layer 2 threads −15 %). The stream runs
 * on past the call's last row like the row tiles' (the 1.25Bit decode's gate/up products run in
 * 64-row calls whose next rows are the same thread's: stopping at the call's end made its step 2 %
 * slower, 7 alternated runs, although the kernel benchmark, whose consecutive chunks go to different
 * threads, gained 2 %); the call's first STQ1_SEQ_PF_L2 bytes are fetched on entry.
 * Zen 4 (EPYC, session 12): each group's 16 scales by 16 scalar loads into a buffer instead of the
 * vpgatherdd (~23 cycles of vector pipes here, of ~200 per group): one thread, 2048 × 2048 in L2,
 * fastest of 400 calls, alternated: 58.8 → 56.3 µs (−4 %), kernel benchmark from DRAM 1 thread −5 %,
 * 2 threads equal; but the 1.25Bit decode step at one session did not follow (4 alternations,
 * medians 19.1 / 20.8 / 19.5 / 20.0 ms with the gather, 21.6 / 21.2 / 20.5 / 20.1 with the loads), so
 * the gather stays. */
#define STQ1_SEQ_MAX_BLOCKS 256 /* per row (65536 columns); wider rows take the row-tile kernel */
#define STQ1_SEQ_PF_L1 1024     /* bytes ahead in the stream (multiples of 64) */
#define STQ1_SEQ_PF_L2 6144

/* The activation group of each block, entries j < nb + 15 standing for block j mod nb (a group whose
 * first row-block is block kb reads entries kb..kb+15). */
typedef struct {
    int32_t off[STQ1_SEQ_MAX_BLOCKS + 15]; /* byte offset of its hymt_q8g */
    int32_t sum[STQ1_SEQ_MAX_BLOCKS + 15]; /* its Σ q */
    float s[STQ1_SEQ_MAX_BLOCKS + 15];     /* its scale */
} stq1_seq_act;

/* Group k0 (16 row-blocks from g0; LIVE of them in the tile, the others repeat the last one and are
 * never summed) into terms[k0 .. k0 + 15]; AOFF: byte offset of lane li's activation group. */
#define STQ1_SEQ_GROUP(PLANES, LIVE, AOFF)                                                              \
    do {                                                                                                \
        const uint8_t *g0 = wt + k0 * STQ1_BYTES;                                                       \
        const uint8_t *p1 = hymt_line_up(g0 + STQ1_SEQ_PF_L1), *p2 = hymt_line_up(g0 + STQ1_SEQ_PF_L2); \
        const int line11 = p1 + 640 < g0 + STQ1_SEQ_PF_L1 + 16 * STQ1_BYTES; /* an 11th line starts */  \
        __m512i quarter[4]; /* [m]: lanes 4m..4m+3 per quarter */                                       \
        _Pragma("GCC unroll 4") for (int m = 0; m < 4; m++) {                                           \
            __m512i pair[2]; /* [h]: lanes 4m+2h, 4m+2h+1 */                                            \
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {                                       \
                __m512i lanes[2]; /* [e]: lane 4m+2h+e, 16 partial sums */                              \
                _Pragma("GCC unroll 2") for (int e = 0; e < 2; e++) {                                   \
                    const int i = 4 * m + 2 * h + e, li = i < (LIVE) ? i : (LIVE) - 1;                  \
                    if (i < 10 || (i == 10 && line11)) {                                                \
                        _mm_prefetch((const char *)p1 + 64 * i, _MM_HINT_T0);                           \
                        _mm_prefetch((const char *)p2 + 64 * i, _MM_HINT_T1);                           \
                    }                                                                                   \
                    __asm__ volatile("" ::: "memory"); /* keeps the prefetches where they are */        \
                    const uint8_t *blk = g0 + li * STQ1_BYTES;                                          \
                    const int8_t *q = ((const hymt_q8g *)(act + (AOFF)))->qs;                           \
                    __m512i pl[4];                                                                      \
                    PLANES(blk, pl);                                                                    \
                    lanes[e] = stq1_planes_dot(pl, q);                                                  \
                }                                                                                       \
                pair[h] = stq1_fold2(lanes[0], lanes[1]);                                               \
            }                                                                                           \
            quarter[m] = stq1_fold2(pair[0], pair[1]);                                                  \
        }                                                                                               \
        const __m512 d = hymt_gather_scales(g0, blk_offsets, (__mmask16)((1u << (LIVE)) - 1u), 38, 1);  \
        const __m512i isum = _mm512_sub_epi32(stq1_quarters_to_rows(quarter),                           \
                                              _mm512_loadu_si512((const void *)(sa->sum + kb)));        \
        _mm512_storeu_ps(terms + k0, _mm512_mul_ps(_mm512_mul_ps(d, _mm512_loadu_ps(sa->s + kb)),       \
                                                   _mm512_cvtepi32_ps(isum)));                          \
    } while (0)

/* v[p] lane 8h + j = (row 2p + h, block j) → v[j] lane 2p + h = the same value (a 16 × 8 float transpose
 * in three two-source permute stages, 24 ops; lane bits h j2 j1 j0 and vector bits p2 p1 p0 swap places
 * one pair per stage). */
static const int32_t STQ1_T16X8_IDX[2][2][16] = {
    {{0, 8, 16, 24, 2, 10, 18, 26, 4, 12, 20, 28, 6, 14, 22, 30}, {1, 9, 17, 25, 3, 11, 19, 27, 5, 13, 21, 29, 7, 15, 23, 31}},
    {{0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27}, {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31}},
};
HYMT_TARGET_AVX512 HYMT_INLINE void stq1_transpose16x8(__m512 v[8]) {
    const __m512i a0 = _mm512_loadu_si512((const void *)STQ1_T16X8_IDX[0][0]),
                  a1 = _mm512_loadu_si512((const void *)STQ1_T16X8_IDX[0][1]),
                  b0 = _mm512_loadu_si512((const void *)STQ1_T16X8_IDX[1][0]),
                  b1 = _mm512_loadu_si512((const void *)STQ1_T16X8_IDX[1][1]);
    __m512 w[8], x[8]; /* w[4 p2 + 2 p1 + j0] lanes (j2 j1 p0 h); x[4 p2 + 2 j1 + j0] lanes (j2 p1 p0 h) */
    for (int q = 0; q < 4; q++) {
        w[2 * q] = _mm512_permutex2var_ps(v[2 * q], a0, v[2 * q + 1]);
        w[2 * q + 1] = _mm512_permutex2var_ps(v[2 * q], a1, v[2 * q + 1]);
    }
    for (int p2 = 0; p2 < 2; p2++)
        for (int j0 = 0; j0 < 2; j0++) {
            x[4 * p2 + j0] = _mm512_permutex2var_ps(w[4 * p2 + j0], b0, w[4 * p2 + 2 + j0]);
            x[4 * p2 + 2 + j0] = _mm512_permutex2var_ps(w[4 * p2 + j0], b1, w[4 * p2 + 2 + j0]);
        }
    for (int j = 0; j < 4; j++) { /* v[4 j2 + j] lanes (p2 p1 p0 h) */
        v[j] = _mm512_shuffle_f32x4(x[j], x[4 + j], 0x44);
        v[4 + j] = _mm512_shuffle_f32x4(x[j], x[4 + j], 0xEE);
    }
}

/* One 16-row tile (rows ≤ 16 live); terms: [16 · nb] scratch. */
#define STQ1_SEQ_TILE(NAME, TARGET, TABLES, PLANES)                                                     \
    TARGET HYMT_INLINE void NAME(const uint8_t *wt, int rows, int64_t nb, const uint8_t *act,           \
                                 const stq1_seq_act *sa, float *terms, float *yt) {                    \
        TABLES;                                                                                         \
        const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);   \
        const __m512i blk_offsets = _mm512_mullo_epi32(lane, _mm512_set1_epi32(STQ1_BYTES));            \
        const int64_t live = rows * nb; /* row-blocks in the tile */                                    \
        int64_t k0 = 0, kb = 0;         /* the group's first row-block, its block */                    \
        if (nb % 8 == 0) { /* lanes 0..7 and 8..15: runs of 8 blocks from kb and kb + 8 (mod nb) */     \
            for (; k0 + 16 <= live; k0 += 16) {                                                         \
                const int64_t o0 = kb * (int64_t)sizeof(hymt_q8g),                                      \
                              o1 = (kb + 8 < nb ? kb + 8 : kb + 8 - nb) * (int64_t)sizeof(hymt_q8g);    \
                STQ1_SEQ_GROUP(PLANES, 16, (li < 8 ? o0 : o1) + (li & 7) * (int64_t)sizeof(hymt_q8g));  \
                for (kb += 16; kb >= nb;) kb -= nb;                                                     \
            }                                                                                           \
        } else { /* (an offset load per row-block: 3 % in L2) */                                        \
            for (; k0 + 16 <= live; k0 += 16) {                                                         \
                STQ1_SEQ_GROUP(PLANES, 16, sa->off[kb + li]);                                           \
                for (kb += 16; kb >= nb;) kb -= nb;                                                     \
            }                                                                                           \
        }                                                                                               \
        if (k0 < live) STQ1_SEQ_GROUP(PLANES, (int)(live - k0), sa->off[kb + li]);                      \
        const __mmask16 row_mask = (__mmask16)((1u << rows) - 1u);                                      \
        const __m512i col = _mm512_mullo_epi32(lane, _mm512_set1_epi32((int)nb)); /* lane = row */      \
        __m512 acc = _mm512_setzero_ps();                                                               \
        if (nb % 8 == 0) { /* 8 blocks of 16 rows at a time: two rows per vector, transposed */         \
            for (int64_t c = 0; c < nb; c += 8) {                                                       \
                __m512 v[8];                                                                            \
                for (int p = 0; p < 8; p++)                                                             \
                    v[p] = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(terms + 2 * p * nb + c)), \
                                              _mm256_loadu_ps(terms + (2 * p + 1) * nb + c), 1);       \
                stq1_transpose16x8(v);                                                                  \
                for (int j = 0; j < 8; j++) acc = _mm512_add_ps(acc, v[j]);                             \
            }                                                                                           \
        } else {                                                                                        \
            for (int64_t b = 0; b < nb; b++)                                                            \
                acc = _mm512_add_ps(acc, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), row_mask, col, terms + b, 4)); \
        }                                                                                               \
        _mm512_mask_storeu_ps(yt, row_mask, acc);                                                       \
    }

/* One token over rows [r0, r1); rows contiguous, 0 < nb ≤ STQ1_SEQ_MAX_BLOCKS. */
#define STQ1_SEQ_GEMV(NAME, TARGET, TILE)                                                               \
    TARGET static void NAME(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1, const uint8_t *act, \
                            int64_t cols, float *y) {                                                   \
        const int64_t nb = cols / STQ1_BLOCK;                                                           \
        stq1_seq_act sa;                                                                                \
        float terms[16 * STQ1_SEQ_MAX_BLOCKS]; /* [16 · nb] a tile's terms, row-major */                \
        memset(terms, 0, 16 * nb * sizeof(float)); /* (a partial tile's missing rows are read, not summed) */ \
        for (int64_t j = 0; j < nb; j++) {                                                              \
            const hymt_q8g *g = (const hymt_q8g *)act + j;                                              \
            sa.off[j] = (int32_t)(j * (int64_t)sizeof(hymt_q8g));                                       \
            sa.sum[j] = g->sum;                                                                         \
            sa.s[j] = g->d;                                                                             \
        }                                                                                               \
        for (int64_t j = nb; j < nb + 15; j++) { /* entries past nb repeat those nb before */           \
            sa.off[j] = sa.off[j - nb];                                                                 \
            sa.sum[j] = sa.sum[j - nb];                                                                 \
            sa.s[j] = sa.s[j - nb];                                                                     \
        }                                                                                               \
        const uint8_t *start = w + r0 * row_bytes, *end = w + r1 * row_bytes;                           \
        for (const uint8_t *p = start; p < start + STQ1_SEQ_PF_L2 && p < end; p += 64)                  \
            _mm_prefetch((const char *)p, _MM_HINT_T1);                                                 \
        for (int64_t r = r0; r < r1; r += 16)                                                           \
            TILE(w + r * row_bytes, (int)(r1 - r < 16 ? r1 - r : 16), nb, act, &sa, terms, y + r);      \
    }

STQ1_SEQ_TILE(stq1_seq_tile_vbmi, HYMT_TARGET_AVX512VBMI, STQ1_TABLES_VBMI, STQ1_PLANES_VBMI)
STQ1_SEQ_TILE(stq1_seq_tile_bw, HYMT_TARGET_AVX512, STQ1_TABLES_BW, STQ1_PLANES_BW)
STQ1_SEQ_GEMV(stq1_seq_gemv_vbmi, HYMT_TARGET_AVX512VBMI, stq1_seq_tile_vbmi)
STQ1_SEQ_GEMV(stq1_seq_gemv_bw, HYMT_TARGET_AVX512, stq1_seq_tile_bw)

/* ---- AVX-512 batched kernel (n ≥ HYMT_LOWBIT_BATCH_MIN) ----
 * Per block, the 64-byte index vectors of 16 rows are transposed (16×16 dwords) so vector j holds the
 * indices of groups 4j..4j+3 of every row; a lookup then gives, per plane p, the lanes of those 4
 * groups for 16 rows, multiplied with the broadcast activation dword qs[64p + 4j] of each token: one
 * vpdpbusd per 4 weights × 16 rows × token, no reduction. Two 16-row halves share each broadcast
 * load (32 rows × up to 8 tokens per step), which keeps the loads below the dot-product rate.
 * Indices are built once per 32-row tile and block chunk and reused by every token tile (min(n, 8)
 * tokens, so 5..7 tokens need one pass of lookups, not two or three). The next 32-row tile is
 * prefetched two rows per index vector j during the dot products, so its memory reads overlap the
 * arithmetic instead of arriving in one burst while the indices are built (≈10% at n = 4..16 from
 * DRAM).
 * Where n = 4 goes (one thread, 1024 × 2048 in L2, TSC ticks at 2.09 GHz per 16-row block): the GEMV
 * at n = 1 89, this kernel at n = 4 ~200: index build, transpose and scales ~66 (measured with the
 * token loop left out), the dot phase ~130 (256 vpdpbusd + 64 vpermb; 0.51 ticks per vpdpbusd against
 * 0.345 in a register-only vpdpbusd loop, the vpermb sharing p5), and the two phases do not overlap.
 * From DRAM at 2 threads n = 4 runs at its L2 rate (compute-bound; 1 thread +6 %). Tried for n = 4 and
 * not kept (session 7; alternated in one process, medians): a T = 4 pass of the GEMV (36 live vectors,
 * spills; L2 n = 4 +14 %); planes 0, 1 and 2, 3 into two accumulator sets (16 dependency chains) with
 * vpdpbusd in inline asm, which also removes the ~20 register copies per step GCC emits here: 204 → 201
 * ticks (the copies cost no port); each block's indices built one block ahead of its dot products
 * (n ≤ 8) so the build could overlap them: n = 4, 5, 8 equal in L2 (±3 %); the index vectors built
 * from transposed code bytes (8 loads, 24 vpermt2d, two sign-dword gathers, 16 vpmultishiftqb +
 * bit-selects instead of 16 index builds and the 64-shuffle transpose): that phase 68 → 57 ticks, but
 * the kernel from DRAM at 2 threads n = 4 +1.5 %, n = 5 −1.3 %, n = 6 0,
 * and as the AMX decode n = 8 +1 %, 16 +3 %, 64 +0.5 %; the AMX tiles from n = 2 (token tiles padded to
 * 16): ~127 µs per layer call for any n = 2..6 from DRAM, against 103 µs here at n = 4.
 * Zen 4 (AMD EPYC, 2 cores, session 12; other engineers' compiles shared the machine, so the figures
 * are the fastest calls). n = 3 stays on the GEMV: this kernel ran it faster alone (one thread,
 * 2048 × 2048 in L2, fastest of 400 calls, alternated: 109.0 → 99.0 µs; kernel benchmark from DRAM,
 * fastest calls: 1 thread 171.4 → 156-158 µs, 2 threads 87.2-87.5 → 81.6-82.6), but the 1.25Bit
 * model's decode step at 3 sessions (synthetic 1.8B, 2 threads, 4 alternations) went 33.0 → 34.7 ms
 * (medians; fastest steps 30.2-31.5 → 31.7-33.4); n = 2 on it: +5 % in L2.
 * Where n = 4 goes here (one thread, L2, 826 cycles per 32-row tile × block): the dot phase alone
 * (the build left out) 640 (512 vpdpbusd + 128 vpermb: 0.8 of the vpdpbusd rate), the build ~190.
 * Tried and not kept (alternated, one thread, L2): the index vectors built from transposed code bytes
 * in four units of 4 code dwords × 16 rows (16 masked 128-bit broadcast loads put rows 4L + k in
 * 128-bit lane L, two unpack stages finish the transpose; the sign qwords staged by scalar stores,
 * one vpermt2d per unit, 8 vpmultishiftqb + 8 bit-selects + 4 word shifts: 42 shuffle-class ops per
 * 16 rows against 96), each unit interleaved before 4 of the 16 dot steps of the previous block (so
 * that Zen 4's spare shuffle slots could take it), signs and scales staged two blocks ahead: n = 4
 * 116.7 → 117.2 µs, n = 9, 16, 64 +8, +5, +2 % (the build alone is not cheaper here; with vinserti32x4
 * from memory instead of the masked broadcasts slower again: n = 16 +10 %), n = 8 ×4.8 (the unrolled
 * 16 steps with the build in them spill). The scales by scalar loads (as tried in the stream
 * kernel) in these tiles: n = 3, 4 within ±2 %, so the gather stays. The vpdpbusd in inline asm
 * (no register copies by GCC): n = 4..64 equal (±0.8 %). The 16 steps unrolled by 4 or 16 for T =
 * 3..6: equal. Beware of code layout: builds differing only in unrelated code moved n = 8 by 4 %
 * (193.6 against 201.0).
 * Zen 5 (session 18, AMD EPYC family 26, 2 cores; two 512-bit vpdpbusd per cycle, latency 4; vpermb,
 * vpermt2d, vshufi32x4 and vpmultishiftqb take part of those pipes, vpternlogd, vpunpck*, vpsrlw,
 * vpaddd the other two): at n = 4 the dot phase alone (build left out, 2 MiB working set, 2 threads,
 * µs per 1.8B layer) took 293–298 and the build alone 100–160, the two together 385–390: they did
 * not overlap. So on AMD cores, for a single token pass (n <= 8; 8 and more take the table lookup
 * there), the tile walks the blocks one at a time and each block's 16 dot steps index two rows of the
 * next block (stq1_index_vbmi of rows j and 16 + j at step j), whose transposes and scales follow the
 * block (STQ1_PIPELINED): the out-of-order core runs the index work beside the vpdpbusd chains. Same
 * operations, same sums, same float sequence. Kernel benchmark from DRAM, 2 threads, 3 ABBA rounds, µs
 * per 1.8B layer (mean / fastest calls): n = 4 408–453 / 373–390 → 380–426 / 347–395 (a second
 * variant with the transposes also moved into the dot steps, two blocks ahead: equal to this one), n =
 * 6 489–551 / 455–489 → 487–547 / 441–498. Tried and not kept there: 16 accumulator chains at T <= 4
 * (planes 1, 3 apart; equal or slower), one vpermb of the codebook byte per index vector and the four
 * lane planes by shift + mask on the non-vpdpbusd pipes (equal), this kernel instead of the table
 * lookup at n = 8–16 (equal). Zen 4 (session 19, family 25), the same comparison (pipelined walk
 * switched off in a second build, 2 ABBA rounds, mean / fastest calls, µs per 1.8B layer): n = 4 811–833 /
 * 646–746 against 846–900 / 680–685, n = 5 995–1033 / 802–855 against 1172–1276 / 935–982, so it runs on
 * every AMD core. Intel keeps the block-chunked form (not measured there). */
#define STQ1_TILE_BLOCKS 16 /* transposed index blocks buffered per 32-row tile (32 KB) */

/* Row i of a 32-row tile with `rows` live rows: rows past the tile's end repeat its last row (masked at the
 * store). */
HYMT_INLINE int stq1_tile_row(int i, int rows) { return i < rows ? i : rows - 1; }

/* The store masks of a tile's two 16-row halves. */
HYMT_INLINE void stq1_tile_masks(int rows, __mmask16 mask[2]) {
    mask[0] = (__mmask16)((1u << (rows < 16 ? rows : 16)) - 1u);
    mask[1] = (__mmask16)((1u << (rows > 16 ? rows - 16 : 0)) - 1u);
}

/* One 16-row half of block b: its rows' index vectors rix transposed into ix, its scales into dv (wt: the
 * half's first row). */
HYMT_TARGET_AVX512 HYMT_INLINE void stq1_tile_half(const __m512i *rix, const uint8_t *wt, __m512i row_offsets,
                                                   __mmask16 mask, int64_t b, __m512i *ix, float *dv) {
    hymt_transpose16_epi32(rix, ix);
    _mm512_store_ps(dv, hymt_gather_scales(wt, row_offsets, mask, b * STQ1_BYTES + 38, 1));
}

/* One block of a 32-row tile for T tokens. With NEXT_INDEX (VBMI) and nblk set (the pipelined walk, see
 * above), step j also builds the index vectors of rows j and 16 + j of the block at nblk (rows past the
 * tile's `rows` repeat its last row) into rnext[half][row]. */
#define STQ1_TILE_TOKENS(NAME, TARGET, LOOKUP_PREP, LOOKUP, NEXT_INDEX)                                 \
    TARGET HYMT_INLINE void NAME(const int T, const __m512i (*ix)[16], const __m512i *tab0,             \
                                 const __m512i *tab1, const hymt_q8g *g0, size_t ts, const float (*dv)[16], \
                                 float (*facc)[8][16], const uint8_t *next, size_t row_bytes,           \
                                 const uint8_t *nblk, int rows, __m512i (*rnext)[16], __m512i sign_shifts) { \
        (void)tab1, (void)nblk, (void)rows, (void)rnext, (void)sign_shifts;                             \
        __m512i acc0[8], acc1[8]; /* [token] lane i: row i of each 16-row half */                       \
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) acc0[t] = acc1[t] =                        \
            _mm512_set1_epi32(-g0[t * ts].sum);                                                         \
        /* 8 tokens: the 16 steps unrolled (about 8% faster there, slower for fewer tokens) */           \
        const int J = T == 8 ? 16 : 1;                                                                  \
        for (int j0 = 0; j0 < 16; j0 += J)                                                              \
        _Pragma("GCC unroll 16") for (int j = j0; j < j0 + J; j++) {                                    \
            /* the next row tile's block, two rows per step: memory reads spread over the dot work */  \
            _mm_prefetch((const char *)next + 2 * j * row_bytes, _MM_HINT_T0);                          \
            _mm_prefetch((const char *)next + (2 * j + 1) * row_bytes, _MM_HINT_T0);                    \
            __m512i x0 = ix[0][j], x1 = ix[1][j];                                                       \
            LOOKUP_PREP;                                                                                \
            if (NEXT_INDEX && nblk) {                                                                   \
                rnext[0][j] = stq1_index_vbmi(nblk + stq1_tile_row(j, rows) * row_bytes, sign_shifts);  \
                rnext[1][j] = stq1_index_vbmi(nblk + stq1_tile_row(16 + j, rows) * row_bytes, sign_shifts); \
            }                                                                                           \
            _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {                                       \
                __m512i wk0 = LOOKUP(x0, neg0), wk1 = LOOKUP(x1, neg1);                                 \
                _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {                                   \
                    int32_t a4;                                                                         \
                    memcpy(&a4, g0[t * ts].qs + 64 * p + 4 * j, 4);                                     \
                    __m512i a = _mm512_set1_epi32(a4);                                                  \
                    acc0[t] = _mm512_dpbusd_epi32(acc0[t], wk0, a);                                     \
                    acc1[t] = _mm512_dpbusd_epi32(acc1[t], wk1, a);                                     \
                }                                                                                       \
            }                                                                                           \
        }                                                                                               \
        __m512 d0 = _mm512_load_ps(dv[0]), d1 = _mm512_load_ps(dv[1]);                                  \
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {                                           \
            __m512 s = _mm512_set1_ps(g0[t * ts].d);                                                    \
            _mm512_store_ps(facc[0][t], _mm512_add_ps(_mm512_load_ps(facc[0][t]),                       \
                                                      _mm512_mul_ps(_mm512_mul_ps(d0, s), _mm512_cvtepi32_ps(acc0[t])))); \
            _mm512_store_ps(facc[1][t], _mm512_add_ps(_mm512_load_ps(facc[1][t]),                       \
                                                      _mm512_mul_ps(_mm512_mul_ps(d1, s), _mm512_cvtepi32_ps(acc1[t])))); \
        }                                                                                               \
    }

#define STQ1_LOOKUP_VBMI(x, neg) _mm512_permutexvar_epi8(x, tab0[p])
#define STQ1_LOOKUP_BW(x, neg) _mm512_mask_shuffle_epi8(_mm512_shuffle_epi8(tab0[p], x), neg, tab1[p], x)
STQ1_TILE_TOKENS(stq1_tile_vbmi, HYMT_TARGET_AVX512VBMI, (void)0, STQ1_LOOKUP_VBMI, 1)
STQ1_TILE_TOKENS(stq1_tile_bw, HYMT_TARGET_AVX512,
                 __mmask64 neg0 = _mm512_test_epi8_mask(x0, _mm512_set1_epi8(16));
                 __mmask64 neg1 = _mm512_test_epi8_mask(x1, _mm512_set1_epi8(16)), STQ1_LOOKUP_BW, 0)

/* TILE(T, ...) with T = n (1..8) a compile-time constant, so that its loops over tokens unroll. */
#define STQ1_TILE_CALL(TILE, n, ...)                                                                    \
    switch (n) {                                                                                        \
    case 8: TILE(8, __VA_ARGS__); break;                                                                \
    case 7: TILE(7, __VA_ARGS__); break;                                                                \
    case 6: TILE(6, __VA_ARGS__); break;                                                                \
    case 5: TILE(5, __VA_ARGS__); break;                                                                \
    case 4: TILE(4, __VA_ARGS__); break;                                                                \
    case 3: TILE(3, __VA_ARGS__); break;                                                                \
    case 2: TILE(2, __VA_ARGS__); break;                                                                \
    default: TILE(1, __VA_ARGS__); break;                                                               \
    }

/* The pipelined walk of STQ1_GEMM_TILES (AMD, VBMI, one token pass: n <= 8): blocks one at a time, ix[b % 2]
 * and dv[b % 2] holding block b, rnext the next block's index vectors that block b's dot steps build. */
#define STQ1_PIPELINED(TILE, INDEX)                                                                     \
    HYMT_ALIGNED64 __m512i rnext[2][16]; /* [half][row] index vectors of the next block, before the transpose */ \
    for (int64_t r = r0; r < r1; r += 32) {                                                             \
        int rows = (int)(r1 - r < 32 ? r1 - r : 32);                                                    \
        __mmask16 mask[2];                                                                              \
        stq1_tile_masks(rows, mask);                                                                    \
        const uint8_t *wt = w + r * row_bytes;                                                          \
        for (int h = 0; h < 2; h++) {                                                                   \
            _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++)                                       \
                rnext[h][i] = INDEX(wt + stq1_tile_row(16 * h + i, rows) * row_bytes);                  \
            stq1_tile_half(rnext[h], wt + 16 * h * row_bytes, row_offsets, mask[h], 0, ix[0][h], dv[0][h]); \
            for (int t = 0; t < n; t++) _mm512_store_ps(facc[h][t], _mm512_setzero_ps());               \
        }                                                                                               \
        for (int64_t b = 0; b < nb; b++) {                                                              \
            const int cur = (int)(b & 1);                                                               \
            const uint8_t *next = wt + 32 * row_bytes + b * STQ1_BYTES;                                 \
            const uint8_t *nblk = b + 1 < nb ? wt + (b + 1) * STQ1_BYTES : NULL;                       \
            STQ1_TILE_CALL(TILE, n, ix[cur], tab0, tab1, groups + b, ts, dv[cur], facc, next, row_bytes, nblk, rows, \
                           rnext, sign_shifts);                                                         \
            if (nblk)                                                                                   \
                for (int h = 0; h < 2; h++)                                                             \
                    stq1_tile_half(rnext[h], wt + 16 * h * row_bytes, row_offsets, mask[h], b + 1, ix[cur ^ 1][h], \
                                   dv[cur ^ 1][h]);                                                     \
        }                                                                                               \
        for (int h = 0; h < 2; h++)                                                                     \
            for (int t = 0; t < n; t++)                                                                 \
                _mm512_mask_storeu_ps(y + t * y_stride + r + 16 * h, mask[h], _mm512_load_ps(facc[h][t])); \
    }

#define STQ1_GEMM_TILES(NAME, TARGET, TILE, VBMI, INDEX)                                                       \
    TARGET static void NAME(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1, const uint8_t *act, \
                            size_t act_stride, int64_t n, int64_t cols, float *y, int64_t y_stride) {  \
        int64_t nb = cols / STQ1_BLOCK;                                                                 \
        __m512i tab0[4], tab1[4]; /* VBMI: 32-entry plane tables; BW: sign-0 / sign-1 tables */        \
        stq1_tables_bw(tab0, tab1);                                                                     \
        if (VBMI) stq1_tables_vbmi(tab0);                                                               \
        const __m512i sign_shifts = STQ1_LOAD64(STQ1_SIGN_SHIFT), sign_spread = STQ1_LOAD64(STQ1_SIGN_SPREAD), \
                      sign_bit = STQ1_LOAD64(STQ1_SIGN_BIT);                                            \
        (void)sign_shifts, (void)sign_spread, (void)sign_bit;                                           \
        __m512i row_offsets = hymt_row_offsets(row_bytes);                                              \
        HYMT_ALIGNED64 __m512i ix[STQ1_TILE_BLOCKS][2][16]; /* [block][half][j] lane i: groups 4j.. */  \
        HYMT_ALIGNED64 float dv[STQ1_TILE_BLOCKS][2][16];   /* [block][half][row] scales */             \
        HYMT_ALIGNED64 float facc[2][8][16];                /* [half][token][row] running sums */       \
        const hymt_q8g *groups = (const hymt_q8g *)act;                                                 \
        size_t ts = act_stride / sizeof(hymt_q8g);                                                      \
        if (VBMI && n <= 8 && hymt_cpu()->amd) {                                                        \
            STQ1_PIPELINED(TILE, INDEX);                                                                \
            return;                                                                                     \
        }                                                                                               \
        for (int64_t r = r0; r < r1; r += 32) {                                                         \
            int rows = (int)(r1 - r < 32 ? r1 - r : 32);                                                \
            __mmask16 mask[2];                                                                          \
            stq1_tile_masks(rows, mask);                                                                \
            const uint8_t *wt = w + r * row_bytes;                                                      \
            for (int64_t b0 = 0; b0 < nb; b0 += STQ1_TILE_BLOCKS) {                                     \
                int nc = (int)(nb - b0 < STQ1_TILE_BLOCKS ? nb - b0 : STQ1_TILE_BLOCKS);                \
                for (int c = 0; c < nc; c++)                                                            \
                    for (int h = 0; h < 2; h++) {                                                       \
                        __m512i rix[16];                                                                \
                        _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++)                           \
                            rix[i] = INDEX(wt + stq1_tile_row(16 * h + i, rows) * row_bytes + (b0 + c) * STQ1_BYTES); \
                        stq1_tile_half(rix, wt + 16 * h * row_bytes, row_offsets, mask[h], b0 + c, ix[c][h], dv[c][h]); \
                    }                                                                                   \
                for (int64_t t0 = 0; t0 < n;) {                                                         \
                    int tt = (int)(n - t0 < 8 ? n - t0 : 8); /* n = 5..7 in one pass: lookups once */    \
                    for (int h = 0; h < 2; h++)                                                         \
                        for (int t = 0; t < tt; t++)                                                    \
                            _mm512_store_ps(facc[h][t], b0 == 0 ? _mm512_setzero_ps()                   \
                                                                : _mm512_maskz_loadu_ps(mask[h], y + (t0 + t) * y_stride + r + 16 * h)); \
                    const hymt_q8g *g0 = groups + t0 * ts + b0;                                         \
                    for (int c = 0; c < nc; c++) {                                                      \
                        /* one prefetch per block covers every line: blocks start in each line */       \
                        const uint8_t *next = wt + 32 * row_bytes + (b0 + c) * STQ1_BYTES;              \
                        STQ1_TILE_CALL(TILE, tt, ix[c], tab0, tab1, g0 + c, ts, dv[c], facc, next, row_bytes, NULL, 0, \
                                       NULL, sign_shifts);                                              \
                    }                                                                                   \
                    for (int h = 0; h < 2; h++)                                                         \
                        for (int t = 0; t < tt; t++)                                                    \
                            _mm512_mask_storeu_ps(y + (t0 + t) * y_stride + r + 16 * h, mask[h],        \
                                                  _mm512_load_ps(facc[h][t]));                          \
                    t0 += tt;                                                                           \
                }                                                                                       \
            }                                                                                           \
        }                                                                                               \
    }

#define STQ1_INDEX_VBMI(blk) stq1_index_vbmi(blk, sign_shifts)
#define STQ1_INDEX_BW(blk) stq1_index_bw(blk, sign_spread, sign_bit)
STQ1_GEMM_TILES(stq1_gemm_tiles_vbmi, HYMT_TARGET_AVX512VBMI, stq1_tile_vbmi, 1, STQ1_INDEX_VBMI)
STQ1_GEMM_TILES(stq1_gemm_tiles_bw, HYMT_TARGET_AVX512, stq1_tile_bw, 0, STQ1_INDEX_BW)

/* ---- AVX-512 VBMI batched kernel by table lookup (n ≥ STQ1_LUT_MIN) ----
 * A group's 4 weights take one of 32 digit patterns, so Σ digit·q over a group is one of 32 values per
 * token: the tables the activations carry (stq1_lut_tables_vbmi). A 64-row tile is walked block by
 * block. Per block each row's index bytes are built in plane-position order (nibble, side bit 4 =
 * (position / 2) % 2, sign bit 5: 4 operations) and each quarter's 16 rows are transposed (16×16
 * dwords), so index vector j holds positions 4j..4j+3 of 16 rows; its words are then the indices of
 * positions (4j, 4j + 2) for rows i (words 2i, 2i + 1), and, shifted right by 8 bits, of (4j + 1, 4j + 3).
 * One vpermt2w over a position pair's table and its negation gives Σ digit·q of 2 groups × 16 rows for
 * one token: 128 multiply-adds per lookup where a vpdpbusd does 64. The lookups add up in int16 (32 per
 * word and block, |Σ| <= 32 · 381: exact), one vpmaddwd per quarter and token makes the 16 rows' block
 * sums, and the float step is the header's. The index work is shared by the tokens; tokens run in passes
 * of STQ1_LUT_TOKENS with their sums in registers.
 * Zen 4 (EPYC, session 13): a table copy + vpermt2w + vpaddw costs 1.3 cycles in a register loop (tables
 * from L1 or L2 alike), against 1.0 per vpdpbusd. One thread, 2048 × 2048 in L2, cycles per 16 rows ×
 * block × token (fastest calls, including the tables' construction in the preparation): n = 64 73 →
 * 56-59, n = 8 86 → 74-75, n = 4 104 → 98-100; 2048 × 6144 (the down product's shape), n = 16 / 64 /
 * 132: 77 / 73 / 75 → 66 / 61-68 / 62-63. The index build costs ~26 per 16 rows × block × token at
 * n = 4 (the kernel with the lookups left out), ~1.5× the lookups' share, and the two do not overlap:
 * below 8 tokens the vpdpbusd tiles stay. From DRAM the gain is smaller: the tables of a call (2 KiB
 * per block and token, 6 MiB for 132 tokens of the down product) are read from L2 or L3 once per row
 * tile. The first token pass prefetches the tile's next block into L1 for its index build (its rows were
 * fetched into L2 one tile ahead), 4 rows per step. Kernel benchmark (the 1.8B layer shapes from DRAM,
 * 3 alternations, µs per call; a noisy phase of the host): 2 threads n = 64 tiles 1245 / 983 / 1228,
 * this kernel without that prefetch 1166 / 1192 / 1228, with it 1100 / 926 / 1052; n = 8 186 / 151 /
 * 190 → 160 / 194 / 171; 1 thread n = 8 328 / 273 / 305 → 279 / 283 / 288, n = 64 1947 / 1802 / 2445 →
 * 1936 / 1788 / 1938.
 * 1.25Bit model (synthetic 1.8B, 2 threads, 6 alternations): 132-token prefill 577 → 503 ms (medians;
 * fastest 564 → 486), 8-session decode step 66.5 → 67.4 ms (within noise). Tried and not kept: the
 * lookups in intrinsics (GCC, short of registers, reloaded a table or an index for every lookup: 68-77
 * against 56-59 in assembly); the negated tables stored beside the tables instead of formed by a vpsubw
 * (equal, twice the memory); passes of 2 tokens (equal); the next block's index build interleaved into
 * the first pass, a quarter every 4 steps, so the core could run it beside the lookups (it spills: n = 4
 * 99 → 133); blocks in sweeps over the rows so a sweep's tables stay in L2 (2 threads slower or within
 * noise); software prefetch of the next token pass's tables during a pass (within noise or slower);
 * (session 14) the lookup from 2 tokens (STQ1_LUT_MIN 2, in place of the one-row GEMV at 2-3 tokens and
 * the vpdpbusd tiles at 4-7): decode steps of 2 / 3 / 4 sessions, medians of 62 steps, 4 alternations:
 * 25.2, 24.4, 25.2, 26.9 → 26.6, 25.3, 31.2, 26.8 ms; 33.3, 32.5, 34.0, 33.2 → 30.2, 30.8, 38.8, 37.0;
 * 36.7, 34.8, 40.0, 34.4 → 35.2, 36.4, 43.0, 33.5 (no gain outside the noise). */
#define STQ1_LUT_ROWS 64  /* rows per tile: 4 quarters of 16 */
#define STQ1_LUT_TOKENS 4 /* tokens per pass */

/* One row-block's lookup indices in plane-position order (bits 0..5 as above; 6, 7 are ignored): the
 * VBMI index with the sign moved to bit 5 (`shifts` = STQ1_SIGN_SHIFT − 1) and bit 4 replaced by the
 * position's side (`side`: 16 where (position / 2) % 2). */
HYMT_TARGET_AVX512VBMI HYMT_INLINE __m512i stq1_lut_index(const uint8_t *blk, __m512i shifts, __m512i side) {
    const __m512i keep = _mm512_set1_epi8((char)~16);
    return _mm512_ternarylogic_epi32(stq1_index_vbmi(blk, shifts), keep, side, 0xea); /* a & b | c */
}

/* T tokens of one 64-row tile × block: sums from the index vectors ix and each token's tables, the float
 * step onto y (block 0 starts from 0.0f). */
HYMT_TARGET_AVX512VBMI HYMT_INLINE void stq1_lut_tokens(const __m512i (*ix)[16][2], const uint8_t *act, size_t act_stride,
                                                        size_t lut, int64_t b, const __m512 *d, const __mmask16 *mask,
                                                        float *y, int64_t y_stride, const uint8_t *next, size_t row_bytes,
                                                        const int T) {
    __m512i acc[4][STQ1_LUT_TOKENS]; /* [quarter][token] word 2i + k: row i's sums of one table side */
    const int16_t *tab[STQ1_LUT_TOKENS]; /* [token] the block's 32 tables */
    const __m512i zero = _mm512_setzero_si512();
    for (int t = 0; t < T; t++) {
        for (int q = 0; q < 4; q++) acc[q][t] = _mm512_setzero_si512();
        tab[t] = (const int16_t *)(act + t * act_stride + lut + b * STQ1_LUT_BYTES);
    }
    for (int j = 0; j < 16; j++) {
        if (next != NULL) /* 4 of the 64 rows' next block per step */
            for (int k = 0; k < 4; k++) _mm_prefetch((const char *)next + (4 * j + k) * row_bytes, _MM_HINT_T0);
        __m512i xe[4], xo[4];
        for (int q = 0; q < 4; q++) {
            xe[q] = ix[q][j][0], xo[q] = ix[q][j][1];
            /* opaque to GCC: kept in registers instead of reloaded for each lookup */
            __asm__("" : "+v"(xe[q]), "+v"(xo[q]));
        }
        for (int t = 0; t < T; t++) {
            /* acc[q][t] += the lookups of pair slots 2j (xe) and 2j + 1 (xo): each slot's table loaded once and
             * negated (the sign half), each lookup on a copy of the table (vpermt2w overwrites it). In
             * assembly because GCC, short of registers, reloaded a table or an index for every lookup. */
            __m512i e0, e1, o0, o1, v;
            __asm__("vmovdqa64 (%[tab]), %[e0]\n\tvmovdqa64 64(%[tab]), %[o0]\n\t"
                    "vpsubw %[e0], %[zero], %[e1]\n\tvpsubw %[o0], %[zero], %[o1]\n\t"
#define STQ1_LUT_Q(A, XE, XO)                                                                           \
    "vmovdqa64 %[e0], %[v]\n\tvpermt2w %[e1], %[" #XE "], %[v]\n\tvpaddw %[v], %[" #A "], %[" #A "]\n\t"       \
    "vmovdqa64 %[o0], %[v]\n\tvpermt2w %[o1], %[" #XO "], %[v]\n\tvpaddw %[v], %[" #A "], %[" #A "]\n\t"
                    STQ1_LUT_Q(a0, x0, y0) STQ1_LUT_Q(a1, x1, y1) STQ1_LUT_Q(a2, x2, y2) STQ1_LUT_Q(a3, x3, y3)
#undef STQ1_LUT_Q
                    : [a0] "+v"(acc[0][t]), [a1] "+v"(acc[1][t]), [a2] "+v"(acc[2][t]), [a3] "+v"(acc[3][t]),
                      [e0] "=&v"(e0), [e1] "=&v"(e1), [o0] "=&v"(o0), [o1] "=&v"(o1), [v] "=&v"(v)
                    : [tab] "r"(tab[t] + 64 * j), [zero] "v"(zero), [x0] "v"(xe[0]), [x1] "v"(xe[1]), [x2] "v"(xe[2]),
                      [x3] "v"(xe[3]), [y0] "v"(xo[0]), [y1] "v"(xo[1]), [y2] "v"(xo[2]), [y3] "v"(xo[3])
                    : "memory");
        }
    }
    for (int t = 0; t < T; t++) {
        const __m512 s = _mm512_set1_ps(((const hymt_q8g *)(act + t * act_stride))[b].d);
        for (int q = 0; q < 4; q++) {
            const __m512i isum = _mm512_madd_epi16(acc[q][t], _mm512_set1_epi16(1));
            const __m512 term = _mm512_mul_ps(_mm512_mul_ps(d[q], s), _mm512_cvtepi32_ps(isum));
            float *yq = y + t * y_stride + 16 * q;
            const __m512 prev = b == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask[q], yq);
            _mm512_mask_storeu_ps(yq, mask[q], _mm512_add_ps(prev, term));
        }
    }
}

HYMT_TARGET_AVX512VBMI static void stq1_gemm_lut_vbmi(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                      const uint8_t *act, size_t act_stride, int64_t n, int64_t cols,
                                                      float *y, int64_t y_stride) {
    const int64_t nb = cols / STQ1_BLOCK;
    const size_t lut = stq1_lut_offset(cols);
    /* vpmultishiftqb reads 6 bits of each shift, so − 1 wraps 0 to 63 */
    const __m512i shifts = _mm512_sub_epi8(STQ1_LOAD64(STQ1_SIGN_SHIFT), _mm512_set1_epi8(1));
    const __m512i side = _mm512_set1_epi32(0x10100000); /* bytes 0, 0, 16, 16 */
    const __m512i row_offsets = hymt_row_offsets(row_bytes);
    HYMT_ALIGNED64 __m512i ix[4][16][2]; /* [quarter][j][even, odd] lane i: row 16q + i, positions 4j.. */
    for (int64_t r = r0; r < r1; r += STQ1_LUT_ROWS) {
        const int rows = (int)(r1 - r < STQ1_LUT_ROWS ? r1 - r : STQ1_LUT_ROWS);
        const uint8_t *wt = w + r * row_bytes;
        __mmask16 mask[4];
        for (int q = 0; q < 4; q++) {
            int live = rows - 16 * q;
            mask[q] = (__mmask16)(live >= 16 ? 0xffffu : live > 0 ? (1u << live) - 1u : 0u);
        }
        for (int64_t b = 0; b < nb; b++) {
            __m512 d[4]; /* [quarter] row scales */
            for (int q = 0; q < 4; q++) {
                __m512i rix[16];
                _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) {
                    /* rows past the tile's end repeat its last row (masked at the store) */
                    const int row = 16 * q + i < rows ? 16 * q + i : rows - 1;
                    const uint8_t *blk = wt + row * row_bytes + b * STQ1_BYTES;
                    /* the next tile's block (every line holds a block start, so each is fetched once) */
                    _mm_prefetch((const char *)blk + STQ1_LUT_ROWS * row_bytes, _MM_HINT_T1);
                    rix[i] = stq1_lut_index(blk, shifts, side);
                }
                __m512i tr[16];
                hymt_transpose16_epi32(rix, tr);
                for (int j = 0; j < 16; j++) {
                    ix[q][j][0] = tr[j];
                    ix[q][j][1] = _mm512_srli_epi32(tr[j], 8);
                }
                d[q] = hymt_gather_scales(wt + 16 * q * row_bytes, row_offsets, mask[q], b * STQ1_BYTES + 38, 1);
            }
            for (int64_t t0 = 0; t0 < n; t0 += STQ1_LUT_TOKENS) {
                /* the first pass brings the tile's next block into L1 for its index build */
                const uint8_t *next = t0 == 0 && b + 1 < nb ? wt + (b + 1) * STQ1_BYTES : NULL;
                const uint8_t *a = act + t0 * act_stride;
                float *yt = y + t0 * y_stride + r;
                switch (n - t0 < STQ1_LUT_TOKENS ? n - t0 : STQ1_LUT_TOKENS) {
                case 4: stq1_lut_tokens(ix, a, act_stride, lut, b, d, mask, yt, y_stride, next, row_bytes, 4); break;
                case 3: stq1_lut_tokens(ix, a, act_stride, lut, b, d, mask, yt, y_stride, next, row_bytes, 3); break;
                case 2: stq1_lut_tokens(ix, a, act_stride, lut, b, d, mask, yt, y_stride, next, row_bytes, 2); break;
                default: stq1_lut_tokens(ix, a, act_stride, lut, b, d, mask, yt, y_stride, next, row_bytes, 1); break;
                }
            }
        }
    }
}

/* ---- AMX batched kernel (n ≥ STQ1_AMX_MIN where hymt_amx_active(); lowbit_amx.h) ----
 * A block is one activation group. Its B tiles: the transposed index vectors (as the batched vector
 * kernel builds them, vector j = groups 4j..4j+3 of 16 rows) looked up in signed digit tables (lane
 * − 1): plane p, row j, dword i = the digits of groups 4j..4j+3 of weight row i, which multiply
 * act.qs[64p + 4j .. 64p + 4j + 3]; tdpbssd then gives Σ digit·q directly (no − Σq correction). */
#if defined(HYMT_HAVE_AMX)
#define STQ1_AMX_MIN 5 /* measured (n-row tiles below 16 tokens): n = 4 ties, n = 5 0.93x, n = 7 0.79x */

/* vpermb tables: byte i = digit (lane p − 1) of entry i & 31. */
HYMT_TARGET_AMX HYMT_INLINE void stq1_amx_tables(__m512i tab[4]) {
    stq1_tables_vbmi(tab);
    for (int p = 0; p < 4; p++) tab[p] = _mm512_sub_epi8(tab[p], _mm512_set1_epi8(1));
}

/* Digit planes of block b of 16 rows, bt[plane][k/4][row·4 + k%4] (rows past `rows` repeat the last). */
HYMT_TARGET_AMX HYMT_INLINE void stq1_amx_decode(const uint8_t *wt, size_t row_bytes, int rows, int64_t b,
                                                 const __m512i *tab, int8_t (*bt)[16][64]) {
    const __m512i sign_shifts = STQ1_LOAD64(STQ1_SIGN_SHIFT);
    __m512i rix[16], ix[16]; /* [row] 64 group indices; [j] lane i: plane positions 4j..4j+3 of row i */
    _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) {
        const uint8_t *blk = wt + (i < rows ? i : rows - 1) * row_bytes + b * STQ1_BYTES;
        _mm_prefetch((const char *)blk + 32 * row_bytes, _MM_HINT_T0); /* the next 32-row tile */
        rix[i] = stq1_index_vbmi(blk, sign_shifts);
    }
    hymt_transpose16_epi32(rix, ix);
    for (int p = 0; p < 4; p++)
        _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++)
            _mm512_store_si512((void *)bt[p][j], _mm512_permutexvar_epi8(ix[j], tab[p]));
}

HYMT_TARGET_AMX HYMT_INLINE __m512 stq1_amx_scales(const uint8_t *wt, __m512i row_offsets, __mmask16 mask, int64_t b) {
    return hymt_gather_scales(wt, row_offsets, mask, b * STQ1_BYTES + 38, 1);
}

HYMT_LOWBIT_AMX_GEMM(stq1_gemm_amx, stq1_amx_tables, stq1_amx_decode, stq1_amx_scales, hymt_gemm_stq1_0_scalar)
#endif /* HYMT_HAVE_AMX */

static void hymt_gemm_stq1_0_avx512(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                    const uint8_t *act, size_t act_stride, int64_t n, int64_t cols, float *y,
                                    int64_t y_stride) {
#if defined(HYMT_HAVE_AMX)
    if (n >= STQ1_AMX_MIN && cols > 0 && hymt_amx_active()) {
        stq1_gemm_amx(w, row_bytes, r0, r1, act, act_stride, n, cols, y, y_stride);
        return;
    }
#endif
    int vbmi = hymt_cpu()->avx512vbmi;
    int64_t nb = cols / STQ1_BLOCK;
    if (n == 1 && nb > 0 && nb <= STQ1_SEQ_MAX_BLOCKS && row_bytes == (size_t)nb * STQ1_BYTES) {
        if (vbmi)
            stq1_seq_gemv_vbmi(w, row_bytes, r0, r1, act, cols, y);
        else
            stq1_seq_gemv_bw(w, row_bytes, r0, r1, act, cols, y);
    } else if (stq1_lut_wanted(n) && cols > 0) { /* (the tiles write y per block: none when cols = 0) */
        stq1_gemm_lut_vbmi(w, row_bytes, r0, r1, act, act_stride, n, cols, y, y_stride);
    } else if (n >= HYMT_LOWBIT_BATCH_MIN && cols > 0) {
        if (vbmi)
            stq1_gemm_tiles_vbmi(w, row_bytes, r0, r1, act, act_stride, n, cols, y, y_stride);
        else
            stq1_gemm_tiles_bw(w, row_bytes, r0, r1, act, act_stride, n, cols, y, y_stride);
    } else if (vbmi) {
        stq1_gemm_avx512vbmi(w, row_bytes, r0, r1, act, act_stride, n, cols, y, y_stride);
    } else {
        stq1_gemm_avx512bw(w, row_bytes, r0, r1, act, act_stride, n, cols, y, y_stride);
    }
}

/* ---- AVX2: per half-block of 32 groups (plane positions 32h..32h+31), pshufb lookups of the sign-0 / sign-1 tables (bit 7 of
 * the index zeroes the unused one), maddubs + madd, one horizontal sum per row-block. ---- */

HYMT_TARGET_AVX2 static void hymt_gemm_stq1_0_avx2(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                   const uint8_t *act, size_t act_stride, int64_t n,
                                                   int64_t cols, float *y, int64_t y_stride) {
    int64_t nb = cols / STQ1_BLOCK;
    __m256i tab0[4], tab1[4]; /* sign-0 / sign-1 vpshufb tables, as stq1_tables_bw */
    const __m256i sign0 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)STQ1_CODEBOOK));
    const __m256i sign1 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(STQ1_CODEBOOK + 16)));
    for (int p = 0; p < 4; p++) {
        tab0[p] = _mm256_and_si256(_mm256_srli_epi16(sign0, 2 * p), _mm256_set1_epi8(3));
        tab1[p] = _mm256_and_si256(_mm256_srli_epi16(sign1, 2 * p), _mm256_set1_epi8(3));
    }
    /* plane positions 32h..32h+31 (groups 2b + h): their sign byte and bit (STQ1_SIGN_SPREAD, _BIT) */
    const __m256i spread = _mm256_loadu_si256((const __m256i *)STQ1_SIGN_SPREAD);
    const __m256i bit[2] = {_mm256_loadu_si256((const __m256i *)STQ1_SIGN_BIT),
                            _mm256_loadu_si256((const __m256i *)(STQ1_SIGN_BIT + 32))};
    const __m256i hi = _mm256_set1_epi8((char)0x80);
    const __m256i ones16 = _mm256_set1_epi16(1);
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t t0 = 0; t0 < n; t0 += HYMT_LOWBIT_TOKEN_TILE) {
            int tt = (int)(n - t0 < HYMT_LOWBIT_TOKEN_TILE ? n - t0 : HYMT_LOWBIT_TOKEN_TILE);
            const uint8_t *row = w + r * row_bytes;
            float acc[HYMT_LOWBIT_TOKEN_TILE] = {0};
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = row + b * STQ1_BYTES;
                __m256i pl[2][4];
                const __m256i codes = _mm256_loadu_si256((const __m256i *)blk);
                const __m256i signs = _mm256_set1_epi64x((long long)stq1_sign_bits(blk));
                for (int h = 0; h < 2; h++) { /* h = 0: low nibbles (even groups), 1: high (odd) */
                    __m256i nib = _mm256_and_si256(h ? _mm256_srli_epi16(codes, 4) : codes, _mm256_set1_epi8(15));
                    __m256i neg = _mm256_shuffle_epi8(signs, spread);
                    neg = _mm256_cmpeq_epi8(_mm256_and_si256(neg, bit[h]), bit[h]);
                    __m256i idx0 = _mm256_or_si256(nib, _mm256_and_si256(neg, hi)); /* zero where sign 1 */
                    __m256i idx1 = _mm256_xor_si256(idx0, hi);                      /* zero where sign 0 */
                    for (int p = 0; p < 4; p++)
                        pl[h][p] = _mm256_or_si256(_mm256_shuffle_epi8(tab0[p], idx0), _mm256_shuffle_epi8(tab1[p], idx1));
                }
                float d = hymt_fp16_to_f32(hymt_load_u16(blk + 40));
                for (int t = 0; t < tt; t++) {
                    const hymt_q8g *g = (const hymt_q8g *)(act + (t0 + t) * act_stride) + b;
                    __m256i s16 = _mm256_setzero_si256();
                    for (int h = 0; h < 2; h++)
                        for (int p = 0; p < 4; p++)
                            s16 = _mm256_add_epi16(
                                s16, _mm256_maddubs_epi16(pl[h][p], _mm256_loadu_si256((const __m256i *)(g->qs + 64 * p + 32 * h))));
                    __m256i s32 = _mm256_madd_epi16(s16, ones16);
                    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
                    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
                    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
                    int32_t isum = _mm_cvtsi128_si32(s4) - g->sum;
                    acc[t] += (d * g->d) * (float)isum;
                }
            }
            for (int t = 0; t < tt; t++) y[(t0 + t) * y_stride + r] = acc[t];
        }
    }
}
#endif /* HYMT_X86 */

/* ---- NEON: 32-entry table lookup (tbl) per 16 groups, signed digits, SDOT ---- */
#if defined(HYMT_ARM64)
HYMT_TARGET_DOTPROD static void stq1_gemm_neon_dotprod(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                       const uint8_t *act, size_t act_stride, int64_t n,
                                                       int64_t cols, float *y, int64_t y_stride) {
    int64_t nb = cols / STQ1_BLOCK;
    const uint8x16x2_t book = {{vld1q_u8(STQ1_CODEBOOK), vld1q_u8(STQ1_CODEBOOK + 16)}};
    const uint8x16_t three = vdupq_n_u8(3);
    const int8x16_t one = vdupq_n_s8(1);
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t t0 = 0; t0 < n; t0 += HYMT_LOWBIT_TOKEN_TILE) {
            int tt = (int)(n - t0 < HYMT_LOWBIT_TOKEN_TILE ? n - t0 : HYMT_LOWBIT_TOKEN_TILE);
            const uint8_t *row = w + r * row_bytes;
            float acc[HYMT_LOWBIT_TOKEN_TILE] = {0};
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = row + b * STQ1_BYTES;
                int8x16_t dg[4][4]; /* [plane positions 16k..16k+15][plane]: digits −1..1 */
                const uint8x16_t signs = vcombine_u8(vld1_u8(blk + 32), vdup_n_u8(0));
                for (int k = 0; k < 4; k++) { /* groups 2·(16·(k % 2) + i) + k / 2 */
                    uint8x16_t v = vld1q_u8(blk + 16 * (k & 1));
                    uint8x16_t nib = k < 2 ? vandq_u8(v, vdupq_n_u8(15)) : vshrq_n_u8(v, 4);
                    uint8x16_t sb = vqtbl1q_u8(signs, vld1q_u8(STQ1_SIGN_SPREAD + 16 * k));
                    uint8x16_t neg = vtstq_u8(sb, vld1q_u8(STQ1_SIGN_BIT + 16 * k));
                    uint8x16_t cb = vqtbl2q_u8(book, vorrq_u8(nib, vandq_u8(neg, vdupq_n_u8(16))));
                    dg[k][0] = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(cb, three)), one);
                    dg[k][1] = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(cb, 2), three)), one);
                    dg[k][2] = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(cb, 4), three)), one);
                    dg[k][3] = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(cb, 6)), one);
                }
                float d = hymt_fp16_to_f32(hymt_load_u16(blk + 40));
                for (int t = 0; t < tt; t++) {
                    const hymt_q8g *g = (const hymt_q8g *)(act + (t0 + t) * act_stride) + b;
                    int32x4_t s = vdupq_n_s32(0);
                    for (int k = 0; k < 4; k++)
                        for (int p = 0; p < 4; p++) s = vdotq_s32(s, dg[k][p], vld1q_s8(g->qs + 64 * p + 16 * k));
                    acc[t] += (d * g->d) * (float)vaddvq_s32(s);
                }
            }
            for (int t = 0; t < tt; t++) y[(t0 + t) * y_stride + r] = acc[t];
        }
    }
}

static void hymt_gemm_stq1_0_neon(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1, const uint8_t *act,
                                  size_t act_stride, int64_t n, int64_t cols, float *y, int64_t y_stride) {
    if (hymt_cpu()->dotprod)
        stq1_gemm_neon_dotprod(w, row_bytes, r0, r1, act, act_stride, n, cols, y, y_stride);
    else
        hymt_gemm_stq1_0_scalar(w, row_bytes, r0, r1, act, act_stride, n, cols, y, y_stride);
}
#endif /* HYMT_ARM64 */

static const hymt_format HYMT_FORMAT_STQ1_0 = {
    .name = "STQ1_0",
    .block_len = STQ1_BLOCK,
    .block_bytes = STQ1_BYTES,
    .decode = hymt_decode_stq1_0,
    .row_dot_f32 = hymt_row_dot_f32_stq1_0,
    .prepare = hymt_prepare_stq1_0,
    .act_stride = hymt_act_stride_stq1_0,
    .gemm =
        {
            [HYMT_ISA_SCALAR] = hymt_gemm_stq1_0_scalar,
#if defined(HYMT_X86)
            [HYMT_ISA_AVX2] = hymt_gemm_stq1_0_avx2,
            [HYMT_ISA_AVX512] = hymt_gemm_stq1_0_avx512,
#endif
#if defined(HYMT_ARM64)
            [HYMT_ISA_NEON] = hymt_gemm_stq1_0_neon,
#endif
        },
};

#endif /* HYMT_FMT_STQ1_0_H */
