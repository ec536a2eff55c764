/* act_q8g.h — int8 quantization of activations in groups of 256 (REFERENCE.md §3.4).
 *
 * The default activation layout of the int8 GEMMs: one hymt_q8g per 256 inputs. Formats whose
 * kernels want another layout (a permuted or de-interleaved copy) provide their own prepare
 * function, which must quantize with exactly these values. */
#ifndef HYMT_ACT_Q8G_H
#define HYMT_ACT_Q8G_H

#include "hymt_common.h"

/* Quantize one group of 256 floats. scale = max/127 and inverse = 127/max are each one float32
 * division; q = round-half-to-even(x * inverse) (nearbyintf under the default rounding mode). */
static inline void hymt_quantize_group_q8g(const float *x, hymt_q8g *g) {
    float amax = 0.0f;
    for (int i = 0; i < HYMT_Q8G_SIZE; i++) {
        float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
    g->d = amax > 0.0f ? amax / 127.0f : 0.0f;
    int32_t total = 0;
    for (int k = 0; k < 16; k++) {
        int32_t s = 0;
        for (int i = 16 * k; i < 16 * k + 16; i++) {
            float v = nearbyintf(x[i] * inverse);
            v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
            g->qs[i] = (int8_t)v;
            s += g->qs[i];
        }
        g->bsums[k] = (int16_t)s;
        total += s;
    }
    g->sum = total;
    memset(g->pad, 0, sizeof g->pad);
}

static inline size_t hymt_act_stride_q8g(int64_t cols) {
    return (size_t)(cols / HYMT_Q8G_SIZE) * sizeof(hymt_q8g);
}

/* cols must be a multiple of 256 (every int8-path format's rows are). */
static inline void hymt_prepare_q8g(const float *x, int64_t cols, uint8_t *act) {
    hymt_q8g *g = (hymt_q8g *)act;
    for (int64_t b = 0; b < cols / HYMT_Q8G_SIZE; b++) hymt_quantize_group_q8g(x + 256 * b, g + b);
}

#endif /* HYMT_ACT_Q8G_H */
