/* fmt_f32.h — F32 tensors (REFERENCE.md §2.1): one little-endian float32 per block.
 *
 * Float path only (no int8 GEMM): a row dot is hymt_dot_f32 over the row. Rows are read in place when
 * 4-byte aligned, else copied through a 512-float scratch (GGUF alignment is a power of two that may
 * be below 4). */
#ifndef HYMT_FMT_F32_H
#define HYMT_FMT_F32_H

#include "hymt_common.h"
#include "vec.h"

#define HYMT_FLOAT_CHUNK 512

static void hymt_decode_f32(const uint8_t *src, float *dst, int64_t nblocks) {
    memcpy(dst, src, (size_t)nblocks * 4);
}

static float hymt_row_dot_f32_f32(const uint8_t *row, const float *x, int64_t cols) {
    if (((uintptr_t)row & 3u) == 0) return hymt_dot_f32((const float *)row, x, cols);
    float chunk[HYMT_FLOAT_CHUNK]; /* [≤ 512] */
    float total = 0.0f;
    for (int64_t c = 0; c < cols; c += HYMT_FLOAT_CHUNK) {
        int64_t len = cols - c < HYMT_FLOAT_CHUNK ? cols - c : HYMT_FLOAT_CHUNK;
        memcpy(chunk, row + 4 * c, (size_t)len * 4);
        total += hymt_dot_f32(chunk, x + c, len);
    }
    return total;
}

static const hymt_format HYMT_FORMAT_F32 = {
    .name = "F32",
    .block_len = 1,
    .block_bytes = 4,
    .decode = hymt_decode_f32,
    .row_dot_f32 = hymt_row_dot_f32_f32,
    .prepare = NULL,
    .act_stride = NULL,
    .gemm = {NULL, NULL, NULL, NULL},
};

#endif /* HYMT_FMT_F32_H */
