/* lowbit_common.h — pieces shared by the STQ1_0 and Q2_0C int8 GEMMs (fmt_stq1_0.h, fmt_q2_0c.h). */
#ifndef HYMT_LOWBIT_COMMON_H
#define HYMT_LOWBIT_COMMON_H

#include "hymt_common.h"

#define HYMT_ALIGNED64 __attribute__((aligned(64)))

/* Tokens sharing one decoded weight block in the per-row kernels. */
#define HYMT_LOWBIT_TOKEN_TILE 8
/* Batched (transposed) kernels run from this many tokens per call. */
#define HYMT_LOWBIT_BATCH_MIN 4

#if defined(HYMT_X86)
/* fp16 values at byte offset `at` of block b of up to 16 consecutive rows, as float32 lanes.
 * hi16: the value is the high half of the gathered dword (so the dword ends inside the block). */
HYMT_TARGET_AVX512 HYMT_INLINE __m512 hymt_gather_scales(const uint8_t *w, __m512i row_offsets, __mmask16 rows,
                                                         int64_t at, int hi16) {
    __m512i idx = _mm512_add_epi32(row_offsets, _mm512_set1_epi32((int)at));
    __m512i dw = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), rows, idx, w, 1);
    if (hi16) dw = _mm512_srli_epi32(dw, 16);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dw));
}

/* Token sub-tile sizes of the batched kernels: n is covered greedily by 16, 8, 4, 2, 1 so each
 * sub-tile's accumulators are a compile-time count of registers. */
HYMT_INLINE int hymt_token_subtile(int64_t left) {
    return left >= 16 ? 16 : left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
}

HYMT_TARGET_AVX512 HYMT_INLINE __m512i hymt_row_offsets(size_t row_bytes) {
    return _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                              _mm512_set1_epi32((int)row_bytes));
}

/* The lines one GEMV step prefetches, [lo, hi) in 64-byte steps: the steps of a row tile split the next
 * tile's bytes between them so each line is fetched once, one prefetch per inner iteration with the
 * compute between them (where the prefetches sit mattered as much as their distance: fmt_q2_0c.h). */
typedef struct {
    const uint8_t *lo, *hi;
} hymt_lines;

HYMT_INLINE const uint8_t *hymt_line_up(const uint8_t *p) {
    return (const uint8_t *)(((uintptr_t)p + 63) & ~(uintptr_t)63);
}

/* The lines starting in [from, to), clamped to end (bytes past the call's rows are not fetched). */
HYMT_INLINE hymt_lines hymt_step_lines(const uint8_t *from, const uint8_t *to, const uint8_t *end) {
    hymt_lines l = {hymt_line_up(from), hymt_line_up(to)};
    if (l.hi > end) l.hi = end;
    return l;
}

/* Line i of a step, issued in the step's inner iteration i. */
HYMT_INLINE void hymt_prefetch_line(hymt_lines l, int i) {
    if (l.lo + 64 * i < l.hi) _mm_prefetch((const char *)(l.lo + 64 * i), _MM_HINT_T1);
}

/* The step's lines past the 16 of its inner iterations. */
HYMT_INLINE void hymt_prefetch_rest(hymt_lines l) {
    for (const uint8_t *p = l.lo + 64 * 16; p < l.hi; p += 64) _mm_prefetch((const char *)p, _MM_HINT_T1);
}
#endif

#endif /* HYMT_LOWBIT_COMMON_H */
