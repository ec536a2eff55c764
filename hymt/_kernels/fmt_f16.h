/* fmt_f16.h — F16 tensors (REFERENCE.md §2.1): one IEEE half per block, converted exactly.
 *
 * The decoder uses the exact scalar conversion of hymt_common.h (every bit pattern, NaN payloads
 * included). The float path converts 512-value chunks with F16C (exact for every finite value and
 * infinity) on x86 or vcvt on aarch64, then sums chunk dots: y = Σ_chunks dot(chunk, x_chunk). */
#ifndef HYMT_FMT_F16_H
#define HYMT_FMT_F16_H

#include "hymt_common.h"
#include "vec.h"
#include "fmt_f32.h"

static void hymt_decode_f16(const uint8_t *src, float *dst, int64_t nblocks) {
    for (int64_t i = 0; i < nblocks; i++) dst[i] = hymt_fp16_to_f32(hymt_load_u16(src + 2 * i));
}

#if defined(HYMT_X86)
HYMT_TARGET_AVX512 static void hymt_f16_chunk_avx512(const uint8_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + 2 * i))));
    for (; i < n; i++) dst[i] = hymt_fp16_to_f32(hymt_load_u16(src + 2 * i));
}

HYMT_TARGET_AVX2 static void hymt_f16_chunk_avx2(const uint8_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + 2 * i))));
    for (; i < n; i++) dst[i] = hymt_fp16_to_f32(hymt_load_u16(src + 2 * i));
}
#endif

#if defined(HYMT_ARM64)
static void hymt_f16_chunk_neon(const uint8_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        uint16x4_t h = vld1_u16((const uint16_t *)(const void *)(src + 2 * i));
        vst1q_f32(dst + i, vcvt_f32_f16(vreinterpret_f16_u16(h)));
    }
    for (; i < n; i++) dst[i] = hymt_fp16_to_f32(hymt_load_u16(src + 2 * i));
}
#endif

static void hymt_f16_chunk(const uint8_t *src, float *dst, int64_t n) {
    switch (hymt_active_isa) {
#if defined(HYMT_X86)
    case HYMT_ISA_AVX512:
        hymt_f16_chunk_avx512(src, dst, n);
        return;
    case HYMT_ISA_AVX2:
        hymt_f16_chunk_avx2(src, dst, n);
        return;
#endif
#if defined(HYMT_ARM64)
    case HYMT_ISA_NEON:
        hymt_f16_chunk_neon(src, dst, n);
        return;
#endif
    default:
        hymt_decode_f16(src, dst, n);
    }
}

static float hymt_row_dot_f32_f16(const uint8_t *row, const float *x, int64_t cols) {
    float chunk[HYMT_FLOAT_CHUNK]; /* [≤ 512] */
    float total = 0.0f;
    for (int64_t c = 0; c < cols; c += HYMT_FLOAT_CHUNK) {
        int64_t len = cols - c < HYMT_FLOAT_CHUNK ? cols - c : HYMT_FLOAT_CHUNK;
        hymt_f16_chunk(row + 2 * c, chunk, len);
        total += hymt_dot_f32(chunk, x + c, len);
    }
    return total;
}

static const hymt_format HYMT_FORMAT_F16 = {
    .name = "F16",
    .block_len = 1,
    .block_bytes = 2,
    .decode = hymt_decode_f16,
    .row_dot_f32 = hymt_row_dot_f32_f16,
    .prepare = NULL,
    .act_stride = NULL,
    .gemm = {NULL, NULL, NULL, NULL},
};

#endif /* HYMT_FMT_F16_H */
