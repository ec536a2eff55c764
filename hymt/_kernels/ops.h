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
/* Attention work (multiply-adds of q·k, all segments of a call) below which one thread is faster than
 * waking the others: one decode token at ~64 positions (16 heads × 128 dims) is about this much. */
#define HYMT_OPS_ATTENTION_PARALLEL_WORK (1 << 17)
/* Positions per tile of the attention value sum (a task's rows of a tile fit in L1). */
#define HYMT_OPS_ATTENTION_TILE 32

#if defined(__GNUC__) && !defined(__clang__)
/* The vector helpers below are always inlined, so the vector-return ABI note does not apply. */
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

/* 8 float32 lanes; GCC/Clang lower the element-wise operations to whatever vector width the function is
 * compiled for, with IEEE results identical to the scalar operations (no contraction: -ffp-contract=off). */
typedef float hymt_v8f __attribute__((vector_size(32)));

static inline __attribute__((always_inline)) hymt_v8f hymt_load8(const float *p) {
    hymt_v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) void hymt_store8(float *p, hymt_v8f v) { memcpy(p, &v, sizeof v); }

/* Lane l accumulates a[i] * b[i] for i % 8 == l, then a fixed tree combines the lanes. */
static inline __attribute__((always_inline)) float hymt_ops_dot(const float *a, const float *b, int64_t n) {
    hymt_v8f acc = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc += hymt_load8(a + i) * hymt_load8(b + i);
    float l[8];
    hymt_store8(l, acc);
    for (int k = 0; i < n; i++, k++) l[k] += a[i] * b[i];
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

/* out[i] = x[i] * (1 / sqrt(dot(x, x) / d + eps)) * w[i]; out may alias x. */
static inline void hymt_rmsnorm_row(const float *x, const float *w, float *out, int64_t d, float eps) {
    float mean = hymt_ops_dot(x, x, d) / (float)d;
    float inv = 1.0f / sqrtf(mean + eps);
    for (int64_t i = 0; i < d; i++) out[i] = x[i] * inv * w[i];
}

/* hidden[r] += delta[r], then out[r] = RMSNorm(hidden[r], w): a residual add fused with the next norm. */
static void hymt_add_rmsnorm_rows(float *hidden, const float *delta, const float *w, float *out, int64_t rows,
                                  int64_t d, float eps, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (rows * d >= HYMT_OPS_PARALLEL_WORK)
    for (int64_t r = 0; r < rows; r++) {
        float *h = hidden + r * d;
        const float *dr = delta + r * d;
        for (int64_t i = 0; i < d; i++) h[i] += dr[i];
        hymt_rmsnorm_row(h, w, out + r * d, d, eps);
    }
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

/* scores[g * span + p] = dot(q_g, key_p) * scale for gn consecutive query heads q[gn, D] (gn <= 8, a
 * constant after inlining) and positions p < len of kv head kv. */
static inline __attribute__((always_inline)) void hymt_scores_heads(const float *q, const float *keys, int64_t K,
                                                                   int64_t kv, int64_t D, int64_t len,
                                                                   float scale, float *scores, int64_t span,
                                                                   const int gn) {
    for (int64_t p = 0; p < len; p++) {
        const float *k = keys + (p * K + kv) * D;
        hymt_v8f acc[8];
        for (int g = 0; g < gn; g++) acc[g] = (hymt_v8f){0, 0, 0, 0, 0, 0, 0, 0};
        int64_t i = 0;
        for (; i + 8 <= D; i += 8) {
            const hymt_v8f kk = hymt_load8(k + i);
            for (int g = 0; g < gn; g++) acc[g] += hymt_load8(q + g * D + i) * kk;
        }
        for (int g = 0; g < gn; g++) {
            float l[8];
            hymt_store8(l, acc[g]);
            for (int64_t j = i, m = 0; j < D; j++, m++) l[m] += q[g * D + j] * k[j];
            const float dot = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
            scores[g * span + p] = dot * scale;
        }
    }
}

/* One attention task: token t (absolute position start + t) and kv heads [kv0, kv1), each with the
 * H/K query heads sharing it. Positions are the outer loop, so each key and value row is read once, as
 * one contiguous run of (kv1 - kv0) * D floats (a kv head at a time would revisit the rows once per head
 * and 64-dim chunk). Every output element still gets exactly the operations of a per-head loop: its score
 * is hymt_ops_dot's lane order and tree, its softmax the same, and its weighted sum adds prob * v over
 * positions in order, starting from 0.
 * scores: (kv1 - kv0) * group * span floats of scratch (span = start + n). */
static inline __attribute__((always_inline)) void hymt_attention_task_body(
    const float *q, const float *keys, const float *values, int64_t start, int64_t t, int64_t kv0, int64_t kv1,
    int64_t H, int64_t K, int64_t D, int64_t span, float *scores, float *out) {
    const int64_t group = H / K, len = start + t + 1, heads = (kv1 - kv0) * group;
    const float scale = 1.0f / sqrtf((float)D);
    const float *qt = q + (t * H + kv0 * group) * D; /* the task's query heads, contiguous */
    float *ot = out + (t * H + kv0 * group) * D;
    /* scores: GN query heads at a time against each key row, one lane vector per head (independent
     * chains, kept in registers because GN is a constant); scores[j * span + p] for task head j. */
    for (int64_t p = 0; p < len; p++) {
        const float *row = keys + p * K * D; /* position p, kv head 0 */
        for (int64_t kv = kv0; kv < kv1; kv++) {
            const float *qg = qt + (kv - kv0) * group * D;
            float *sg = scores + (kv - kv0) * group * span + p;
            int64_t g = 0;
            for (; g + 8 <= group; g += 8) hymt_scores_heads(qg + g * D, row, K, kv, D, 1, scale, sg + g * span, span, 8);
            for (; g + 4 <= group; g += 4) hymt_scores_heads(qg + g * D, row, K, kv, D, 1, scale, sg + g * span, span, 4);
            for (; g < group; g++) hymt_scores_heads(qg + g * D, row, K, kv, D, 1, scale, sg + g * span, span, 1);
        }
    }
    for (int64_t j = 0; j < heads; j++) {
        float *s = scores + j * span;
        float max = -INFINITY;
        for (int64_t p = 0; p < len; p++) max = s[p] > max ? s[p] : max;
        float sum = 0.0f;
        for (int64_t p = 0; p < len; p++) {
            s[p] = expf(s[p] - max);
            sum += s[p];
        }
        const float inv = 1.0f / sum;
        for (int64_t p = 0; p < len; p++) s[p] *= inv;
    }
    /* weighted value sums, a tile of positions at a time: within a tile each head keeps its sums for 64
     * output dims in registers (the tile's rows stay in L1 across the heads); between tiles the sums
     * wait in out */
    memset(ot, 0, (size_t)(heads * D) * sizeof(float));
    for (int64_t p0 = 0; p0 < len; p0 += HYMT_OPS_ATTENTION_TILE) {
        const int64_t p1 = p0 + HYMT_OPS_ATTENTION_TILE < len ? p0 + HYMT_OPS_ATTENTION_TILE : len;
        for (int64_t j = 0; j < heads; j++) {
            const float *s = scores + j * span;
            const float *vj = values + (kv0 + j / group) * D; /* position p at vj + p * K * D */
            float *o = ot + j * D;
            int64_t d = 0;
            for (; d + 64 <= D; d += 64) {
                hymt_v8f acc[8];
                for (int m = 0; m < 8; m++) acc[m] = hymt_load8(o + d + 8 * m);
                for (int64_t p = p0; p < p1; p++) {
                    const float *v = vj + p * K * D + d;
                    const float prob = s[p];
                    for (int m = 0; m < 8; m++) acc[m] += prob * hymt_load8(v + 8 * m);
                }
                for (int m = 0; m < 8; m++) hymt_store8(o + d + 8 * m, acc[m]);
            }
            for (; d + 8 <= D; d += 8) {
                hymt_v8f acc = hymt_load8(o + d);
                for (int64_t p = p0; p < p1; p++) acc += s[p] * hymt_load8(vj + p * K * D + d);
                hymt_store8(o + d, acc);
            }
            for (; d < D; d++) {
                float acc = o[d];
                for (int64_t p = p0; p < p1; p++) acc += s[p] * vj[p * K * D + d];
                o[d] = acc;
            }
        }
    }
}

typedef void (*hymt_attention_task_fn)(const float *, const float *, const float *, int64_t, int64_t, int64_t,
                                       int64_t, int64_t, int64_t, int64_t, int64_t, float *, float *);

static void hymt_attention_task_generic(const float *q, const float *keys, const float *values, int64_t start,
                                        int64_t t, int64_t kv0, int64_t kv1, int64_t H, int64_t K, int64_t D,
                                        int64_t span, float *scores, float *out) {
    hymt_attention_task_body(q, keys, values, start, t, kv0, kv1, H, K, D, span, scores, out);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* The same operations on 256-bit registers: bit-identical to the generic build (no fma, same order). */
__attribute__((target("avx2"))) static void hymt_attention_task_avx2(const float *q, const float *keys,
                                                                      const float *values, int64_t start,
                                                                      int64_t t, int64_t kv0, int64_t kv1,
                                                                      int64_t H, int64_t K, int64_t D,
                                                                      int64_t span, float *scores, float *out) {
    hymt_attention_task_body(q, keys, values, start, t, kv0, kv1, H, K, D, span, scores, out);
}
#endif

/* Causal grouped-query attention for S segments (sessions) in one parallel region. Segment s has rows[s]
 * new tokens at positions starts[s].. whose keys and values are already in its cache; its queries and
 * outputs are rows row0[s].. of q[N, H, D] and out[N, H, D]; keys[s]/values[s] are [cap, K, D] (cap >=
 * starts[s] + rows[s]). Query head h reads kv head h / (H / K). Tasks are (token, run of kv heads) over all
 * segments: a token's kv heads are split into as few runs as still give every thread work. One region for
 * the whole batch matters when several sessions decode together: one token each is too little work to
 * share alone, together it is not. Each task computes its outputs exactly as alone, so results do not
 * depend on the batch or the thread count. Returns -1 if scratch allocation failed. */
static int hymt_attention_segments(const float *q, const float *const *keys, const float *const *values,
                                   const int64_t *starts, const int64_t *row0, const int64_t *rows, int64_t S,
                                   int64_t H, int64_t K, int64_t D, float *out, int threads) {
    hymt_attention_task_fn task_fn = hymt_attention_task_generic;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (__builtin_cpu_supports("avx2")) task_fn = hymt_attention_task_avx2;
#endif
    const int64_t group = H / K;
    int64_t n = 0, max_span = 0;
    double work = 0.0;
    for (int64_t s = 0; s < S; s++) {
        const int64_t span = starts[s] + rows[s];
        n += rows[s];
        max_span = span > max_span ? span : max_span;
        work += (double)rows[s] * (double)(H * span * D);
    }
    if (n == 0) return 0;
    int64_t *segment_of = (int64_t *)malloc((size_t)n * sizeof(int64_t)); /* [n] segment of each token */
    if (segment_of == NULL) return -1;
    for (int64_t s = 0, i = 0; s < S; s++)
        for (int64_t t = 0; t < rows[s]; t++) segment_of[i++] = s;
    int failed = 0;
    const int parallel = threads > 1 && work >= (double)HYMT_OPS_ATTENTION_PARALLEL_WORK;
    int64_t runs = parallel && n < threads ? (threads + n - 1) / n : 1; /* kv-head runs per token */
    runs = runs < K ? runs : K;
    const int64_t per = (K + runs - 1) / runs; /* kv heads per run */
    runs = (K + per - 1) / per;
#pragma omp parallel num_threads(threads) if (parallel)
    {
        float *scores = (float *)malloc((size_t)(per * group * max_span) * sizeof(float));
        if (scores == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t task = 0; task < n * runs; task++) {
            const int64_t i = task / runs, kv0 = task % runs * per, kv1 = kv0 + per < K ? kv0 + per : K;
            if (scores == NULL) continue;
            const int64_t s = segment_of[i], r = row0[s];
            task_fn(q + r * H * D, keys[s], values[s], starts[s], i - r, kv0, kv1, H, K, D, starts[s] + rows[s],
                    scores, out + r * H * D);
        }
        free(scores);
    }
    free(segment_of);
    return failed ? -1 : 0;
}

/* One segment: n new tokens at positions start..start+n-1 (q[n, H, D], keys/values[cap, K, D], out[n, H, D]). */
static int hymt_attention(const float *q, const float *keys, const float *values, int64_t start, int64_t n,
                          int64_t H, int64_t K, int64_t D, float *out, int threads) {
    const int64_t row0 = 0;
    return hymt_attention_segments(q, &keys, &values, &start, &row0, &n, 1, H, K, D, out, threads);
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
