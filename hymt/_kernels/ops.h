/* ops.h — the non-matmul operations of a forward pass (REFERENCE.md §4.3, §4.4).
 *
 * RMSNorm over rows, NeoX split-half RoPE, causal grouped-query attention over a float32 KV cache and
 * the HyV3 sigmoid router. Every output element is computed by exactly one thread in a
 * fixed order, so results depend neither on the thread count nor on which other tokens share a call
 * (each token's values only read that token's inputs and the cache).
 *
 * Reductions use 8 float32 partial sums over i % 8, combined by a fixed tree: deterministic, and
 * cheaper than one sequential chain. Built with -ffp-contract=off (no silent fma).
 */
#ifndef HYMT_OPS_H
#define HYMT_OPS_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* Below this many float operations a loop runs on the calling thread (a parallel region costs µs). */
#define HYMT_OPS_PARALLEL_WORK 32768

static inline float hymt_ops_dot(const float *a, const float *b, int64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[i + l] * b[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

/* out[i] = x[i] * (1 / sqrt(dot(x, x) / d + eps)) * w[i]; out may alias x. */
static inline void hymt_rmsnorm_row(const float *x, const float *w, float *out, int64_t d, float eps) {
    float mean = hymt_ops_dot(x, x, d) / (float)d;
    float inv = 1.0f / sqrtf(mean + eps);
    for (int64_t i = 0; i < d; i++) out[i] = x[i] * inv * w[i];
}

/* x[rows, d] -> out[rows, d] (out may be x). */
static void hymt_rmsnorm_rows(const float *x, const float *w, float *out, int64_t rows, int64_t d, float eps,
                              int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (rows * d >= HYMT_OPS_PARALLEL_WORK)
    for (int64_t r = 0; r < rows; r++) hymt_rmsnorm_row(x + r * d, w, out + r * d, d, eps);
}

/* freqs[j] = base^(-2j/D) in float32, j < D/2. */
static void hymt_rope_freqs(float base, int64_t D, float *freqs) {
    for (int64_t j = 0; j < D / 2; j++) freqs[j] = powf(base, -(float)(2 * j) / (float)D);
}

/* NeoX split-half rotation of the heads of one token: pairs (j, j + D/2) rotate by pos * freqs[j]. */
static inline void hymt_rope_token(float *x, int64_t heads, int64_t D, float pos, const float *freqs) {
    int64_t half = D / 2;
    for (int64_t j = 0; j < half; j++) {
        float angle = pos * freqs[j];
        float c = cosf(angle), s = sinf(angle);
        for (int64_t h = 0; h < heads; h++) {
            float *row = x + h * D;
            float a = row[j], b = row[j + half];
            row[j] = a * c - b * s;
            row[j + half] = a * s + b * c;
        }
    }
}

/* x[n, heads, D] rotated in place; token t sits at absolute position pos[t]. */
static void hymt_rope(float *x, int64_t n, int64_t heads, int64_t D, const int64_t *pos, const float *freqs,
                      int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (n * heads * D >= HYMT_OPS_PARALLEL_WORK)
    for (int64_t t = 0; t < n; t++) hymt_rope_token(x + t * heads * D, heads, D, (float)pos[t], freqs);
}

/* Per-head RMSNorm and RoPE of q[n, H, D] and k[n, K, D] in place, in the architecture's order:
 * norm_first = 0 (hunyuan-dense): RoPE then norm; norm_first = 1 (hy_v3): norm then RoPE. */
static void hymt_qk_norm_rope(float *q, float *k, int64_t n, int64_t H, int64_t K, int64_t D, const int64_t *pos,
                              const float *freqs, const float *q_norm, const float *k_norm, float eps,
                              int norm_first, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (n * (H + K) * D >= HYMT_OPS_PARALLEL_WORK)
    for (int64_t t = 0; t < n; t++) {
        float *qt = q + t * H * D, *kt = k + t * K * D;
        float p = (float)pos[t];
        if (!norm_first) {
            hymt_rope_token(qt, H, D, p, freqs);
            hymt_rope_token(kt, K, D, p, freqs);
        }
        for (int64_t h = 0; h < H; h++) hymt_rmsnorm_row(qt + h * D, q_norm, qt + h * D, D, eps);
        for (int64_t h = 0; h < K; h++) hymt_rmsnorm_row(kt + h * D, k_norm, kt + h * D, D, eps);
        if (norm_first) {
            hymt_rope_token(qt, H, D, p, freqs);
            hymt_rope_token(kt, K, D, p, freqs);
        }
    }
}

/* Causal grouped-query attention of n new tokens at positions start..start+n-1 whose keys and values
 * are already in the cache. q[n, H, D]; keys/values[cap, K, D] (cap >= start + n); out[n, H, D].
 * Query head h reads kv head h / (H / K). One (token, head) pair per task: scores, softmax and the
 * position-ordered sum of prob * v all run on one thread. Returns -1 if scratch allocation failed. */
static int hymt_attention(const float *q, const float *keys, const float *values, int64_t start, int64_t n,
                          int64_t H, int64_t K, int64_t D, float *out, int threads) {
    int failed = 0;
    const int64_t group = H / K, span = start + n;
    const float scale = 1.0f / sqrtf((float)D);
#pragma omp parallel num_threads(threads) if (n * H * span * D >= HYMT_OPS_PARALLEL_WORK)
    {
        float *scores = (float *)malloc((size_t)span * sizeof(float));
        if (scores == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t task = 0; task < n * H; task++) {
            if (scores == NULL) continue;
            const int64_t t = task / H, h = task % H, kv = h / group, len = start + t + 1;
            const float *qh = q + (t * H + h) * D;
            float *o = out + (t * H + h) * D;
            float max = -INFINITY;
            for (int64_t p = 0; p < len; p++) {
                float s = hymt_ops_dot(qh, keys + (p * K + kv) * D, D) * scale;
                scores[p] = s;
                max = s > max ? s : max;
            }
            float sum = 0.0f;
            for (int64_t p = 0; p < len; p++) {
                scores[p] = expf(scores[p] - max);
                sum += scores[p];
            }
            const float inv = 1.0f / sum;
            for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
            for (int64_t p = 0; p < len; p++) {
                const float prob = scores[p] * inv;
                const float *v = values + (p * K + kv) * D;
                for (int64_t d = 0; d < D; d++) o[d] += prob * v[d];
            }
        }
        free(scores);
    }
    return failed ? -1 : 0;
}

static inline float hymt_sigmoid(float x) {
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

/* HyV3 router (REFERENCE.md §4.4) for n tokens: logits[n, E] -> selected[n, used] (by sigmoid + bias
 * descending, ties to the lower index) and weights[n, used] (sigmoid only; normalized by the selected
 * sum floored at the smallest normal fp16 when normalize, times scale). Non-finite scores never win a
 * comparison, so a slot always names a distinct valid expert. */
static void hymt_moe_route(const float *logits, const float *bias, int64_t n, int64_t E, int64_t used,
                           int normalize, float scale, int32_t *selected, float *weights, float *scratch) {
    /* scratch: 2 * E floats (sigmoids, then scores with taken experts set to -inf) */
    float *sig = scratch, *score = scratch + E;
    for (int64_t t = 0; t < n; t++) {
        const float *lt = logits + t * E;
        int32_t *sel = selected + t * used;
        float *w = weights + t * used;
        for (int64_t e = 0; e < E; e++) {
            sig[e] = hymt_sigmoid(lt[e]);
            score[e] = sig[e] + bias[e];
        }
        float sum = 0.0f;
        for (int64_t slot = 0; slot < used; slot++) {
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++) {
                if (score[e] == -INFINITY) continue; /* taken */
                if (best < 0 || score[e] > score[best] || (score[best] != score[best] && score[e] == score[e]))
                    best = e;
            }
            sel[slot] = (int32_t)best;
            score[best] = -INFINITY;
            sum += sig[best];
        }
        float denom = sum > 6.103515625e-5f ? sum : 6.103515625e-5f;
        for (int64_t slot = 0; slot < used; slot++)
            w[slot] = normalize ? sig[sel[slot]] / denom * scale : sig[sel[slot]] * scale;
    }
}

#endif /* HYMT_OPS_H */
