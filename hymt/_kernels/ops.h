/* ops.h — the non-matmul operations of a forward pass (REFERENCE.md §4.3, §4.4).
 *
 * RMSNorm over rows, NeoX split-half RoPE, causal grouped-query attention over a float32 KV cache and
 * the HyV3 sigmoid router. Every output element is computed by exactly one thread in a
 * fixed order, so results depend neither on the thread count nor on which other tokens share a call
 * (each token's values only read that token's inputs and the cache).
 *
 * Reductions use 8 float32 partial sums over i % 8 (attention: 16, see there), combined by a fixed tree:
 * deterministic, and cheaper than one sequential chain. Built with -ffp-contract=off (no silent fma).
 */
#ifndef HYMT_OPS_H
#define HYMT_OPS_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mm_api.h"
#include "vec16.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Below this many float operations a loop runs on the calling thread (a parallel region costs µs). */
#define HYMT_OPS_PARALLEL_WORK 32768
/* Attention work (multiply-adds of q·k, all segments of a call) below which one thread is faster than
 * waking the others: one decode token at ~64 positions (16 heads × 128 dims) is about this much. */
#define HYMT_OPS_ATTENTION_PARALLEL_WORK (1 << 17)
/* Key positions per online-softmax step of attention (a multiple of 16, the lane count of its exp). */
#define HYMT_OPS_ATTENTION_TILE 32

/* 8 float32 lanes; GCC/Clang lower the element-wise operations to whatever vector width the function is
 * compiled for, with IEEE results identical to the scalar operations (no contraction: -ffp-contract=off). */
typedef float hymt_v8f __attribute__((vector_size(32)));

static inline __attribute__((always_inline)) hymt_v8f hymt_load8(const float *p) {
    hymt_v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) void hymt_store8(float *p, hymt_v8f v) { memcpy(p, &v, sizeof v); }

/* ---- RMSNorm, the residual add and RoPE ----------------------------------------------------------------
 *
 * Each body below is inlined into one function per kernel family: the generic build (SSE2 on x86, NEON on
 * arm64: the reference) and on x86 the AVX2 and AVX-512 targets (this file is built without -march; the
 * generic build's residual add and norm ran as scalar adds and spilled their sums to the stack, 265 µs per
 * [160, 2048] call on one thread). The family is quant.so's active one, so hymt.kernels.use_isa() switches
 * these with the products. Every family gives the same bits: the element-wise operations are IEEE, and a
 * sum of squares is 8 lane chains over i % 8 whatever the register width. */

/* quant.so's active family (enum hymt_isa numbering: 0 generic, 1 avx2, 2 avx512): ops.pyx points this at
 * it (mm_api.h) at import. */
static const int hymt_ops_isa_generic = 0;
static const int *hymt_ops_isa __attribute__((unused)) = &hymt_ops_isa_generic; /* read on x86 only */

/* RMSNorm of R rows (R <= 4, a constant after inlining) of d floats: row r of x at x + r * stride, of out at
 * out + r * out_stride (out may be x). With add, x[r] += delta[r] first (delta rows stride apart). Then
 *   out[r][i] = x[r][i] * (1 / sqrt(s_r / d + eps)) * w[i],
 * s_r = Σ_i x[r][i]² as 8 lane chains (lane l adds the squares of i % 8 == l in i order; the d % 8 tail goes
 * to lanes 0..) combined as ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)). Each chain waits on its
 * previous add, so R rows run at once: their chains are independent and fill the adder's pipeline. */
static inline __attribute__((always_inline)) void hymt_rmsnorm_rows_body(float *x, const float *delta,
                                                                        int64_t stride, const float *w,
                                                                        float *out, int64_t out_stride,
                                                                        int64_t d, float eps, const int add,
                                                                        const int R) {
    hymt_v8f acc[4];
    for (int r = 0; r < R; r++) acc[r] = (hymt_v8f){0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= d; i += 8)
        for (int r = 0; r < R; r++) {
            hymt_v8f v = hymt_load8(x + r * stride + i);
            if (add) {
                v += hymt_load8(delta + r * stride + i);
                hymt_store8(x + r * stride + i, v);
            }
            acc[r] += v * v;
        }
    for (int r = 0; r < R; r++) {
        float *xr = x + r * stride, *o = out + r * out_stride, l[8];
        hymt_store8(l, acc[r]);
        for (int64_t j = i, k = 0; j < d; j++, k++) {
            if (add) xr[j] += delta[r * stride + j];
            l[k] += xr[j] * xr[j];
        }
        const float mean = (((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))) / (float)d;
        const float inv = 1.0f / sqrtf(mean + eps);
        const hymt_v16f iv = hymt_splat16(inv);
        int64_t j = 0;
        for (; j + 16 <= d; j += 16) hymt_store16(o + j, hymt_load16(xr + j) * iv * hymt_load16(w + j));
        for (; j < d; j++) o[j] = xr[j] * inv * w[j];
    }
}

/* Rows [r0, r1) of hidden[rows, d] += delta, out = RMSNorm(hidden, w). */
static inline __attribute__((always_inline)) void hymt_add_rmsnorm_body(float *hidden, const float *delta,
                                                                       const float *w, float *out, int64_t r0,
                                                                       int64_t r1, int64_t d, float eps) {
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4)
        hymt_rmsnorm_rows_body(hidden + r * d, delta + r * d, d, w, out + r * d, d, d, eps, 1, 4);
    for (; r < r1; r++) hymt_rmsnorm_rows_body(hidden + r * d, delta + r * d, d, w, out + r * d, d, d, eps, 1, 1);
}

/* RMSNorm (weights w[D]) of heads x[heads, D] in place. */
static inline __attribute__((always_inline)) void hymt_head_norms_body(float *x, int64_t heads, int64_t D,
                                                                      const float *w, float eps) {
    int64_t h = 0;
    for (; h + 4 <= heads; h += 4) hymt_rmsnorm_rows_body(x + h * D, NULL, D, w, x + h * D, D, D, eps, 0, 4);
    for (; h < heads; h++) hymt_rmsnorm_rows_body(x + h * D, NULL, D, w, x + h * D, D, D, eps, 0, 1);
}

/* Most rotation pairs per head whose cos/sin one token keeps on the stack (D <= 512); larger heads take
 * them in chunks of this many pairs. */
#define HYMT_ROPE_CHUNK 256

/* Pairs j < nj of one head's halves lo[j], hi[j] rotated by the angle with cos c[j], sin s[j]. */
static inline __attribute__((always_inline)) void hymt_rope_pairs(float *lo, float *hi, const float *c,
                                                                 const float *s, int64_t nj) {
    int64_t j = 0;
    for (; j + 16 <= nj; j += 16) {
        const hymt_v16f a = hymt_load16(lo + j), b = hymt_load16(hi + j);
        const hymt_v16f cj = hymt_load16(c + j), sj = hymt_load16(s + j);
        hymt_store16(lo + j, a * cj - b * sj);
        hymt_store16(hi + j, a * sj + b * cj);
    }
    for (; j < nj; j++) {
        const float a = lo[j], b = hi[j];
        lo[j] = a * c[j] - b * s[j];
        hi[j] = a * s[j] + b * c[j];
    }
}

/* NeoX split-half rotation of one token's heads x[nx, D] and y[ny, D] (y may be NULL with ny = 0): pairs
 * (j, j + D/2) rotate by pos * freqs[j]. cos/sin of each angle are taken once per token for both sets of
 * heads (libm's cosf/sinf, scalar in every family), and the rotation of a head is element-wise over
 * contiguous j; each element gets the same operations either way. */
static inline __attribute__((always_inline)) void hymt_rope_body(float *x, int64_t nx, float *y, int64_t ny,
                                                                int64_t D, float pos, const float *freqs) {
    const int64_t half = D / 2;
    float c[HYMT_ROPE_CHUNK], s[HYMT_ROPE_CHUNK];
    for (int64_t j0 = 0; j0 < half; j0 += HYMT_ROPE_CHUNK) {
        const int64_t nj = half - j0 < HYMT_ROPE_CHUNK ? half - j0 : HYMT_ROPE_CHUNK;
        for (int64_t j = 0; j < nj; j++) {
            const float angle = pos * freqs[j0 + j];
            c[j] = cosf(angle);
            s[j] = sinf(angle);
        }
        for (int64_t h = 0; h < nx; h++) hymt_rope_pairs(x + h * D + j0, x + h * D + j0 + half, c, s, nj);
        for (int64_t h = 0; h < ny; h++) hymt_rope_pairs(y + h * D + j0, y + h * D + j0 + half, c, s, nj);
    }
}

/* Per-head RMSNorm and RoPE of one token's heads q[H, D] (weights wq[D]) and k[K, D] (wk; k may be NULL
 * with K = 0) at position pos, in place, in the architecture's order: norm_first = 0 (hunyuan-dense): RoPE
 * then norm; 1 (hy_v3): norm then RoPE. */
static inline __attribute__((always_inline)) void hymt_norm_rope_body(float *q, int64_t H, float *k, int64_t K,
                                                                     int64_t D, float pos, const float *freqs,
                                                                     const float *wq, const float *wk,
                                                                     float eps, int norm_first) {
    if (!norm_first) hymt_rope_body(q, H, k, K, D, pos, freqs);
    hymt_head_norms_body(q, H, D, wq, eps);
    hymt_head_norms_body(k, K, D, wk, eps);
    if (norm_first) hymt_rope_body(q, H, k, K, D, pos, freqs);
}

typedef void (*hymt_add_rmsnorm_fn)(float *, const float *, const float *, float *, int64_t, int64_t, int64_t,
                                    float);
typedef void (*hymt_norm_rope_fn)(float *, int64_t, float *, int64_t, int64_t, float, const float *,
                                  const float *, const float *, float, int);
typedef void (*hymt_rope_fn)(float *, int64_t, int64_t, float, const float *);

/* One family's build of the three bodies. */
typedef struct {
    hymt_add_rmsnorm_fn add_rmsnorm;
    hymt_norm_rope_fn norm_rope;
    hymt_rope_fn rope;
} hymt_ops_kernels;

#define HYMT_OPS_KERNELS(name, target)                                                                         \
    target static void hymt_add_rmsnorm_##name(float *hidden, const float *delta, const float *w, float *out,   \
                                               int64_t r0, int64_t r1, int64_t d, float eps) {                 \
        hymt_add_rmsnorm_body(hidden, delta, w, out, r0, r1, d, eps);                                        \
    }                                                                                                          \
    target static void hymt_norm_rope_##name(float *q, int64_t H, float *k, int64_t K, int64_t D, float pos,    \
                                             const float *freqs, const float *wq, const float *wk, float eps,  \
                                             int norm_first) {                                                 \
        hymt_norm_rope_body(q, H, k, K, D, pos, freqs, wq, wk, eps, norm_first);                              \
    }                                                                                                          \
    target static void hymt_rope_##name(float *x, int64_t heads, int64_t D, float pos, const float *freqs) {   \
        hymt_rope_body(x, heads, NULL, 0, D, pos, freqs);                                                     \
    }                                                                                                          \
    static const hymt_ops_kernels hymt_ops_##name = {hymt_add_rmsnorm_##name, hymt_norm_rope_##name,           \
                                                     hymt_rope_##name};

HYMT_OPS_KERNELS(generic, )
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* No fma in either target: -ffp-contract=off keeps every multiply and add anyway. */
HYMT_OPS_KERNELS(avx2, __attribute__((target("avx2"))))
HYMT_OPS_KERNELS(avx512, __attribute__((target("avx2,avx512f,avx512vl,avx512dq"))))
#endif

/* The build of the active family. */
static inline const hymt_ops_kernels *hymt_ops_active(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (*hymt_ops_isa == 2) return &hymt_ops_avx512;
    if (*hymt_ops_isa == 1) return &hymt_ops_avx2;
#endif
    return &hymt_ops_generic;
}

/* hidden[r] += delta[r], then out[r] = RMSNorm(hidden[r], w): a residual add fused with the next norm. */
static void hymt_add_rmsnorm_rows(float *hidden, const float *delta, const float *w, float *out, int64_t rows,
                                  int64_t d, float eps, int threads) {
    const hymt_add_rmsnorm_fn fn = hymt_ops_active()->add_rmsnorm;
    const int64_t blocks = (rows + 3) / 4; /* of 4 rows, the unit of hymt_rmsnorm_rows_body */
#pragma omp parallel for schedule(static) num_threads(threads) if (rows * d >= HYMT_OPS_PARALLEL_WORK)
    for (int64_t b = 0; b < blocks; b++) fn(hidden, delta, w, out, 4 * b, 4 * b + 4 < rows ? 4 * b + 4 : rows, d, eps);
}

/* freqs[j] = base^(-2j/D) in float32, j < D/2. */
static void hymt_rope_freqs(float base, int64_t D, float *freqs) {
    for (int64_t j = 0; j < D / 2; j++) freqs[j] = powf(base, -(float)(2 * j) / (float)D);
}

/* x[n, heads, D] rotated in place; token t sits at absolute position pos[t]. */
static void hymt_rope(float *x, int64_t n, int64_t heads, int64_t D, const int64_t *pos, const float *freqs,
                      int threads) {
    const hymt_rope_fn fn = hymt_ops_active()->rope;
#pragma omp parallel for schedule(static) num_threads(threads) if (n * heads * D >= HYMT_OPS_PARALLEL_WORK)
    for (int64_t t = 0; t < n; t++) fn(x + t * heads * D, heads, D, (float)pos[t], freqs);
}

/* Per-head RMSNorm (weights w[D]) and RoPE of heads x[heads, D] of one token at position pos, in place,
 * in the architecture's order: norm_first = 0 (hunyuan-dense): RoPE then norm; 1 (hy_v3): norm then RoPE. */
static inline void hymt_norm_rope_heads(float *x, int64_t heads, int64_t D, float pos, const float *freqs,
                                        const float *w, float eps, int norm_first) {
    hymt_ops_active()->norm_rope(x, heads, NULL, 0, D, pos, freqs, w, NULL, eps, norm_first);
}

/* hymt_norm_rope_heads over every token of q[n, H, D] and k[n, K, D] (a token's query and key heads share
 * its cos/sin). */
static void hymt_qk_norm_rope(float *q, float *k, int64_t n, int64_t H, int64_t K, int64_t D, const int64_t *pos,
                              const float *freqs, const float *q_norm, const float *k_norm, float eps,
                              int norm_first, int threads) {
    const hymt_norm_rope_fn fn = hymt_ops_active()->norm_rope;
#pragma omp parallel for schedule(static) num_threads(threads) if (n * (H + K) * D >= HYMT_OPS_PARALLEL_WORK)
    for (int64_t t = 0; t < n; t++)
        fn(q + t * H * D, H, k + t * K * D, K, D, (float)pos[t], freqs, q_norm, k_norm, eps, norm_first);
}

/* ---- causal grouped-query attention ------------------------------------------------------------------
 *
 * Each query row (token t at absolute position start + t, query head h, kv head h / (H/K)) runs one fixed
 * sequence of float operations that depends only on its own inputs and position, so the result is the
 * same whatever tokens, sessions or threads share the call:
 *   score_p = hsum16(Σ_i q_i·k_pi over lanes i % 16) · (1/√D)   (lane l accumulates fma(q_i, k_pi, acc) in
 *             i order, from 0; hsum16 adds lanes l and l+8, then l and l+4, then (0+2)+(1+3))
 *   keys are taken in tiles of HYMT_OPS_ATTENTION_TILE positions at absolute positions 0, T, 2T, ...
 *   (the last tile ends at the row's own position); per tile, an online softmax:
 *     m' = max(m, max_p score_p)            (the first tile: m' = its max, no rescaling)
 *     c = e^(m − m');  sum16 = sum16·c;  out = out·c
 *     e_p = e^(score_p − m');  out = fma(e_p, v_p, out) in position order;
 *     sum16 += (E_0 + E_1 + ... in order), E_j the 16 lanes e_p of positions p0 + 16j + l (lane l), 0 for
 *     positions past the row's last key       (the first tile: sum16 = that chunk sum, no rescaling)
 *   finally out = out · (1/hsum16(sum16)).
 * The multiply-adds of q·k and p·v are fused (hymt_fma16: one rounding, exact in IEEE, so the same bits in
 * every family; with separate multiplies and adds they were twice the vector operations: 2048-token prefill
 * of the 1.8B 9.5 -> 8.1 s at 2 threads). The generic x86 build has no fma instruction (SSE2): it calls
 * libm's fmaf per lane, which makes that family's attention several times slower; it is the fallback for
 * pre-Haswell CPUs only (every avx2-family CPU has FMA, cpu.h). On arm64 the generic build uses fmla.
 * e^x is hymt_exp16 (vec16.h), element-wise, so its vector width does not matter. The 16-lane running sum
 * and the lane-wise max keep a tile's softmax in vector registers: a scalar running sum over the tile's
 * positions was a 32-add dependency chain per query head and tile, about a third of a decode's compute.
 * Why tiles: one pass over K and V instead of storing every score, and a tile of K/V rows stays in L1
 * while all the queries of a task (HYMT_OPS_ATTENTION_QUERIES consecutive tokens × the query heads of a
 * kv head) use it, so a prefill reads each key and value row once per block of tokens, not once per
 * token and head. The 16-lane sums fill an AVX-512 register; AVX2 and the generic build (the reference,
 * also the NEON build) lower the same element-wise vector code to narrower registers with the same bits. */

/* Consecutive tokens of one session per task: they share each K/V tile (prefill), so a prefill streams
 * every kv head's keys and values once per block of this many tokens (at 4, a 2048-token prompt read
 * ~70 GB of K/V over its 32 layers, mostly from L3). 16: 1024-token prefill of the 1.8B 3.1 -> 2.6 s,
 * 2048 8.1 -> 7.6 s at 2 threads (8: 2.64 / 8.14 s; 32: 2.89 / 8.22 s: fewer tasks to balance, and the
 * queries of a task no longer stay near L1). The results do not depend on it (see above). */
#define HYMT_OPS_ATTENTION_QUERIES 16

typedef float hymt_v4f __attribute__((vector_size(16)));

/* p[0] in every lane, as a 16-float load and a shuffle of lane 0 (one vbroadcastss): p must have 16
 * readable floats, hence the padding of the attention scratch. */
static inline __attribute__((always_inline)) hymt_v16f hymt_bcast16(const float *p) {
    const hymt_v16f v = hymt_load16(p);
    return __builtin_shufflevector(v, v, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
}

/* The lane tree of a score: (l + l+8), then (+4), then (0 + 2) + (1 + 3). */
static inline __attribute__((always_inline)) float hymt_hsum16(hymt_v16f a) {
    const hymt_v8f b = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7) +
                       __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
    const hymt_v4f c = __builtin_shufflevector(b, b, 0, 1, 2, 3) + __builtin_shufflevector(b, b, 4, 5, 6, 7);
    return (c[0] + c[2]) + (c[1] + c[3]);
}

/* The largest lane (exact: the order of a max does not change its value). */
static inline __attribute__((always_inline)) float hymt_hmax16(hymt_v16f a) {
    hymt_v16f b = __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    a = hymt_select16(b > a, b, a);
    b = __builtin_shufflevector(a, a, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
    a = hymt_select16(b > a, b, a);
    b = __builtin_shufflevector(a, a, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    a = hymt_select16(b > a, b, a);
    b = __builtin_shufflevector(a, a, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
    a = hymt_select16(b > a, b, a);
    return a[0];
}

/* a · b + c per lane, fused (one rounding): exact in IEEE, so every family gives the same bits. F: the
 * family (a constant after inlining): 2 one AVX-512 vfmadd; 0 the generic build: fmla on arm64 (FMA is
 * baseline there), libm's fmaf per lane on x86 (SSE2 has no fma: slow, see the attention comment); the
 * AVX2 family (1) runs on 8-lane halves instead (hymt_attention_scores_pairs). The x86 builtins sit in
 * dead branches of the other families' functions: GCC checks their ISA only when it emits them (an
 * intrinsic, always_inline with a target, would not build in the generic function). */
static inline __attribute__((always_inline)) hymt_v16f hymt_fma16(hymt_v16f a, hymt_v16f b, hymt_v16f c,
                                                                 const int F) {
#if defined(__clang__) && defined(__has_builtin)
#if __has_builtin(__builtin_elementwise_fma)
    (void)F;
    return __builtin_elementwise_fma(a, b, c);
#endif
#elif defined(__x86_64__) && defined(__GNUC__)
    if (F == 2) return __builtin_ia32_vfmaddps512_mask(a, b, c, (__mmask16)-1, _MM_FROUND_CUR_DIRECTION);
#elif defined(__aarch64__)
    (void)F; /* the lane loop below is fmla (FMA is baseline on arm64) */
#endif
    hymt_v16f r;
    for (int l = 0; l < 16; l++) r[l] = fmaf(a[l], b[l], c[l]);
    return r;
}

/* p[0] in every lane for family F (see hymt_fma16), from memory: one vbroadcastss load in the AVX-512
 * build (hymt_bcast16's load and register shuffle took a shuffle slot per broadcast from the
 * multiply-adds in the value loop; GCC 12 makes a splat of a loaded float 16 masked broadcasts). */
static inline __attribute__((always_inline)) hymt_v16f hymt_bcast_f16(const float *p, const int F) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    if (F == 2)
        return __builtin_ia32_broadcastss512((hymt_v4f){p[0], 0.0f, 0.0f, 0.0f}, hymt_splat16(0.0f), (__mmask16)-1);
#else
    (void)F;
#endif
    return hymt_bcast16(p);
}

/* Lane indices 0..15. */
static inline __attribute__((always_inline)) hymt_v16i hymt_iota16(void) {
    return (hymt_v16i){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
}

/* The AVX2 family's q·k and p·v on pairs of 8-lane halves (lanes 0..7, 8..15 of the 16-lane sequence):
 * GCC 12 keeps a 16-float vector in two ymm registers for element-wise operations, but splitting one into
 * halves for vfmadd goes element by element through the stack (the attention 3x slower than unfused).
 * The same operations per lane as the 16-lane code, so the same bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HYMT_OPS_FMA8_PAIRS 1
static inline __attribute__((always_inline)) hymt_v8f hymt_fma8(hymt_v8f a, hymt_v8f b, hymt_v8f c) {
    return __builtin_ia32_vfmaddps256(a, b, c);
}

/* hymt_attention_scores for F = 1. */
static inline __attribute__((always_inline)) void hymt_attention_scores_pairs(const float *q, const float *k,
                                                                             int64_t D, float scale,
                                                                             float *scores, const int gn) {
    hymt_v8f lo[4], hi[4];
    for (int g = 0; g < gn; g++) lo[g] = hi[g] = (hymt_v8f){0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 16 <= D; i += 16) {
        const hymt_v8f klo = hymt_load8(k + i), khi = hymt_load8(k + i + 8);
        for (int g = 0; g < gn; g++) {
            lo[g] = hymt_fma8(hymt_load8(q + g * D + i), klo, lo[g]);
            hi[g] = hymt_fma8(hymt_load8(q + g * D + i + 8), khi, hi[g]);
        }
    }
    for (int g = 0; g < gn; g++) {
        if (i < D) { /* D % 16 tail: products go to lanes 0.. in i order */
            float l[16];
            hymt_store8(l, lo[g]);
            hymt_store8(l + 8, hi[g]);
            for (int64_t j = i, m = 0; j < D; j++, m++) l[m] = fmaf(q[g * D + j], k[j], l[m]);
            lo[g] = hymt_load8(l);
            hi[g] = hymt_load8(l + 8);
        }
        const hymt_v8f b = lo[g] + hi[g]; /* hymt_hsum16's tree */
        const hymt_v4f c = __builtin_shufflevector(b, b, 0, 1, 2, 3) + __builtin_shufflevector(b, b, 4, 5, 6, 7);
        scores[g * HYMT_OPS_ATTENTION_TILE] = ((c[0] + c[2]) + (c[1] + c[3])) * scale;
    }
}

/* hymt_attention_values for F = 1 (16 dims at a time). */
static inline __attribute__((always_inline)) void hymt_attention_values_pairs(const float *v, int64_t stride,
                                                                             int64_t p0, int64_t p1, int64_t D,
                                                                             const float *scores, float *out,
                                                                             const int gn) {
    int64_t d = 0;
    for (; d + 16 <= D; d += 16) {
        hymt_v8f lo[4], hi[4];
        for (int g = 0; g < gn; g++) lo[g] = hymt_load8(out + g * D + d), hi[g] = hymt_load8(out + g * D + d + 8);
        for (int64_t p = p0; p < p1; p++) {
            const hymt_v8f vlo = hymt_load8(v + p * stride + d), vhi = hymt_load8(v + p * stride + d + 8);
            for (int g = 0; g < gn; g++) {
                const hymt_v8f e = __builtin_ia32_vbroadcastss256(scores + g * HYMT_OPS_ATTENTION_TILE + p - p0);
                lo[g] = hymt_fma8(e, vlo, lo[g]);
                hi[g] = hymt_fma8(e, vhi, hi[g]);
            }
        }
        for (int g = 0; g < gn; g++) hymt_store8(out + g * D + d, lo[g]), hymt_store8(out + g * D + d + 8, hi[g]);
    }
    for (; d < D; d++)
        for (int g = 0; g < gn; g++) {
            float acc = out[g * D + d];
            for (int64_t p = p0; p < p1; p++) acc = fmaf(scores[g * HYMT_OPS_ATTENTION_TILE + p - p0], v[p * stride + d], acc);
            out[g * D + d] = acc;
        }
}
#endif

/* scores[g * T] = score of query heads q[gn, D] (gn <= 4, a constant after inlining) against key k[D]:
 * one lane vector per head, so the key row is loaded once for gn independent chains. */
static inline __attribute__((always_inline)) void hymt_attention_scores(const float *q, const float *k, int64_t D,
                                                                       float scale, float *scores, const int gn,
                                                                       const int F) {
#ifdef HYMT_OPS_FMA8_PAIRS
    if (F == 1) {
        hymt_attention_scores_pairs(q, k, D, scale, scores, gn);
        return;
    }
#endif
    hymt_v16f acc[4];
    for (int g = 0; g < gn; g++) acc[g] = hymt_splat16(0.0f);
    int64_t i = 0;
    for (; i + 16 <= D; i += 16) {
        const hymt_v16f kk = hymt_load16(k + i);
        for (int g = 0; g < gn; g++) acc[g] = hymt_fma16(hymt_load16(q + g * D + i), kk, acc[g], F);
    }
    for (int g = 0; g < gn; g++) {
        if (i < D) { /* D % 16 tail: products go to lanes 0.. in i order */
            float l[16];
            hymt_store16(l, acc[g]);
            for (int64_t j = i, m = 0; j < D; j++, m++) l[m] = fmaf(q[g * D + j], k[j], l[m]);
            acc[g] = hymt_load16(l);
        }
        scores[g * HYMT_OPS_ATTENTION_TILE] = hymt_hsum16(acc[g]) * scale;
    }
}

/* scores[g * T + j] = score of query head g of q[4, D] against key row j of k (row j at k + j * stride),
 * for D % 16 == 0: the 16 lane vectors are reduced together, level by level of hymt_hsum16's tree (two
 * shuffles and an add per pair), so each score gets the same bits as hymt_attention_scores for about a
 * third of the reduction work. Needs 16 accumulators in registers: the AVX-512 build only. */
static inline __attribute__((always_inline)) void hymt_attention_scores4x4(const float *q, const float *k,
                                                                          int64_t stride, int64_t D, float scale,
                                                                          float *scores, const int F) {
    hymt_v16f acc[16]; /* acc[g * 4 + j] */
    for (int a = 0; a < 16; a++) acc[a] = hymt_splat16(0.0f);
    for (int64_t i = 0; i < D; i += 16) {
        hymt_v16f kk[4];
        for (int j = 0; j < 4; j++) kk[j] = hymt_load16(k + j * stride + i);
        for (int g = 0; g < 4; g++) {
            const hymt_v16f qq = hymt_load16(q + g * D + i);
            for (int j = 0; j < 4; j++) acc[g * 4 + j] = hymt_fma16(qq, kk[j], acc[g * 4 + j], F);
        }
    }
    hymt_v16f l1[8], l2[4], l3[2]; /* lane l + 8 added to l; then + 4; then + 2; then + 1 */
    for (int m = 0; m < 8; m++)
        l1[m] = __builtin_shufflevector(acc[2 * m], acc[2 * m + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21,
                                        22, 23) +
                __builtin_shufflevector(acc[2 * m], acc[2 * m + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27,
                                        28, 29, 30, 31);
    for (int m = 0; m < 4; m++)
        l2[m] = __builtin_shufflevector(l1[2 * m], l1[2 * m + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25,
                                        26, 27) +
                __builtin_shufflevector(l1[2 * m], l1[2 * m + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28,
                                        29, 30, 31);
    for (int m = 0; m < 2; m++)
        l3[m] = __builtin_shufflevector(l2[2 * m], l2[2 * m + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25,
                                        28, 29) +
                __builtin_shufflevector(l2[2 * m], l2[2 * m + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26,
                                        27, 30, 31);
    const hymt_v16f sums = __builtin_shufflevector(l3[0], l3[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24,
                                                   26, 28, 30) +
                           __builtin_shufflevector(l3[0], l3[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25,
                                                   27, 29, 31);
    float r[16]; /* r[g * 4 + j] */
    hymt_store16(r, sums);
    for (int g = 0; g < 4; g++)
        for (int j = 0; j < 4; j++) scores[g * HYMT_OPS_ATTENTION_TILE + j] = r[g * 4 + j] * scale;
}

/* out[g] += scores[g * T + p - p0] · v_p for positions p0 <= p < p1 in order, for gn query heads of one
 * token (gn <= 4) sharing the value rows (position p at v + p * stride); dims in chunks of CW lane
 * vectors (a constant per family: its accumulators, gn · CW vectors, stay in registers). */
static inline __attribute__((always_inline)) void hymt_attention_values(const float *v, int64_t stride, int64_t p0,
                                                                       int64_t p1, int64_t D,
                                                                       const float *scores, float *out,
                                                                       const int gn, const int CW, const int F) {
#ifdef HYMT_OPS_FMA8_PAIRS
    if (F == 1) {
        hymt_attention_values_pairs(v, stride, p0, p1, D, scores, out, gn);
        return;
    }
#endif
    int64_t d = 0;
    for (; d + 16 * CW <= D; d += 16 * CW) {
        hymt_v16f acc[4][4];
        for (int g = 0; g < gn; g++)
            for (int m = 0; m < CW; m++) acc[g][m] = hymt_load16(out + g * D + d + 16 * m);
        for (int64_t p = p0; p < p1; p++) {
            const float *row = v + p * stride + d;
            hymt_v16f vv[4];
            for (int m = 0; m < CW; m++) vv[m] = hymt_load16(row + 16 * m);
            for (int g = 0; g < gn; g++) {
                const hymt_v16f e = hymt_bcast_f16(scores + g * HYMT_OPS_ATTENTION_TILE + p - p0, F);
                for (int m = 0; m < CW; m++) acc[g][m] = hymt_fma16(e, vv[m], acc[g][m], F);
            }
        }
        for (int g = 0; g < gn; g++)
            for (int m = 0; m < CW; m++) hymt_store16(out + g * D + d + 16 * m, acc[g][m]);
    }
    for (; d < D; d++)
        for (int g = 0; g < gn; g++) {
            float acc = out[g * D + d];
            for (int64_t p = p0; p < p1; p++) acc = fmaf(scores[g * HYMT_OPS_ATTENTION_TILE + p - p0], v[p * stride + d], acc);
            out[g * D + d] = acc;
        }
}

/* One attention task: tokens [t0, t1) of one segment (absolute positions start + t) and kv heads
 * [kv0, kv1), each with the H/K query heads sharing it; q and out are the segment's [n, H, D] rows;
 * keys and values are the segment's [K, cap, D] caches, hs = cap · D floats from one kv head to the next
 * (a kv head's positions are consecutive rows of D floats, so a task streams contiguous memory).
 * scratch: rows · (T + 17) + 16 floats, rows = (t1 - t0) · (kv1 - kv0) · (H/K): scores [rows, T], the
 * running 16-lane sums [rows, 16] and max [rows], then 16 floats of padding (hymt_bcast16 loads 16 floats).
 * Row r = ((t - t0) · (kv1 - kv0) + kv - kv0) · group + g.
 * Keys and values are read only at positions < start + t + 1 of each token. CW: see
 * hymt_attention_values; PB = 4: scores of 4 key rows at a time (hymt_attention_scores4x4), else 1. */
static inline __attribute__((always_inline)) void hymt_attention_task_body(
    const float *q, const float *keys, const float *values, int64_t hs, int64_t start, int64_t t0, int64_t t1,
    int64_t kv0, int64_t kv1, int64_t H, int64_t K, int64_t D, float *scratch, float *out, const int CW,
    const int PB, const int F) {
    enum { T = HYMT_OPS_ATTENTION_TILE };
    const int64_t group = H / K, kvn = kv1 - kv0, rows = (t1 - t0) * kvn * group, end = start + t1;
    const float scale = 1.0f / sqrtf((float)D);
    float *scores = scratch, *sums = scratch + rows * T, *maxs = sums + rows * 16;
    for (int64_t t = t0; t < t1; t++)
        memset(out + (t * H + kv0 * group) * D, 0, (size_t)(kvn * group * D) * sizeof(float));
    /* the first tile's rows of every kv head of the task, a cache line at a time: the loop below
     * prefetches one tile ahead per kv head, so without this a decode meets each kv head's first tile
     * cold (the products between layers evict the cache), one demand miss after another */
    if (t1 - t0 == 1)
        for (int64_t kv = kv0; kv < kv1; kv++)
            for (int64_t d = 0; d < (T < end ? T : end) * D; d += 16) {
                __builtin_prefetch(keys + kv * hs + d);
                __builtin_prefetch(values + kv * hs + d);
            }
    for (int64_t p0 = 0; p0 < end; p0 += T) {
        const int64_t tile_end = p0 + T < end ? p0 + T : end;
        /* tokens whose position is below p0 see none of this tile: start from the first that does */
        const int64_t first = p0 - start > t0 ? p0 - start : t0;
        for (int64_t kv = kv0; kv < kv1; kv++) {
            const float *kh = keys + kv * hs, *vh = values + kv * hs; /* this kv head's [cap, D] rows */
            /* the next tile's rows of this kv head, a cache line at a time: a decode streams the whole
             * cache from memory, in two arrays, which the hardware prefetcher alone follows poorly (with
             * position-major rows, 4 kv heads at position 1500, cold: 0.61 -> 0.44 ms a layer; with this
             * layout's contiguous runs, 32 layers at 1024 positions, cold: 15.5 -> 10.6 ms). Decode blocks
             * only: a block of several tokens spends longer on each tile, and a 1024-token prefill measured
             * ~3 % slower with the hints */
            const int64_t next_end = t1 - t0 > 1 ? tile_end : tile_end + T < end ? tile_end + T : end;
            for (int64_t d = tile_end * D; d < next_end * D; d += 16) {
                __builtin_prefetch(kh + d);
                __builtin_prefetch(vh + d);
            }
            /* scores: token by token (the tile's key rows stay in L1 between tokens); with PB = 4, four
             * key rows at a time against four heads, reduced together */
            for (int64_t t = first; t < t1; t++) {
                const int64_t pe = start + t + 1 < tile_end ? start + t + 1 : tile_end; /* its keys */
                const float *qh = q + (t * H + kv * group) * D;
                float *s = scores + (((t - t0) * kvn + kv - kv0) * group) * T - p0;
                int64_t g = 0;
                if (PB == 4 && D % 16 == 0)
                    for (; g + 4 <= group; g += 4) {
                        int64_t p = p0;
                        for (; p + 4 <= pe; p += 4)
                            hymt_attention_scores4x4(qh + g * D, kh + p * D, D, D, scale, s + g * T + p, F);
                        for (; p < pe; p++)
                            hymt_attention_scores(qh + g * D, kh + p * D, D, scale, s + g * T + p, 4, F);
                    }
                for (; g + 4 <= group; g += 4)
                    for (int64_t p = p0; p < pe; p++)
                        hymt_attention_scores(qh + g * D, kh + p * D, D, scale, s + g * T + p, 4, F);
                for (; g < group; g++)
                    for (int64_t p = p0; p < pe; p++)
                        hymt_attention_scores(qh + g * D, kh + p * D, D, scale, s + g * T + p, 1, F);
            }
            for (int64_t t = first; t < t1; t++) {
                const int64_t p1 = start + t + 1 < tile_end ? start + t + 1 : tile_end; /* this token's keys */
                const int64_t r0 = ((t - t0) * kvn + kv - kv0) * group;
                float *o = out + (t * H + kv * group) * D;
                const int64_t keys_in = p1 - p0; /* 1..T */
                for (int64_t g = 0; g < group; g++) {
                    float *s = scores + (r0 + g) * T;
                    /* the lanes past a partial tile's last key hold stale values: make them a real score, so
                     * they leave the max alone and no lane leaves the exp's range (a clamp inside the exp
                     * cost a quarter of the prefill time); their e^x is masked to 0 below */
                    for (int64_t p = keys_in; p < T; p++) s[p] = s[0];
                    hymt_v16f mx = hymt_load16(s);
                    for (int64_t p = 16; p < T; p += 16) {
                        const hymt_v16f b = hymt_load16(s + p);
                        mx = hymt_select16(b > mx, b, mx);
                    }
                    float m = hymt_hmax16(mx);
                    float *sum16 = sums + (r0 + g) * 16;
                    float c = 0.0f;
                    if (p0 > 0) {
                        const float prev = maxs[r0 + g];
                        m = m > prev ? m : prev;
                        /* an unchanged max: hymt_exp16(0) is exactly 1 (n = 0, r = 0, p = 1, 2^0), and x · 1 is
                         * x, so the exp and the rescale of out are skipped with the same bits (most tiles of
                         * a long row leave the max where it is; 1024/2048-token prefill ~2 % faster) */
                        const float diff = prev - m;
                        c = diff == 0.0f ? 1.0f : hymt_exp16(hymt_splat16(diff))[0];
                    }
                    if (p0 > 0 && c != 1.0f) {
                        float *og = o + g * D;
                        const hymt_v16f cv = hymt_splat16(c);
                        int64_t d = 0;
                        for (; d + 16 <= D; d += 16) hymt_store16(og + d, hymt_load16(og + d) * cv);
                        for (; d < D; d++) og[d] *= c;
                    }
                    maxs[r0 + g] = m;
                    const hymt_v16f mv = hymt_splat16(m);
                    hymt_v16f tile_sum = hymt_splat16(0.0f);
                    for (int64_t p = 0; p < T; p += 16) {
                        const hymt_v16i live = hymt_iota16() < (int32_t)(keys_in - p);
                        const hymt_v16f e =
                            hymt_select16(live, hymt_exp16(hymt_load16(s + p) - mv), hymt_splat16(0.0f));
                        hymt_store16(s + p, e);
                        tile_sum = p == 0 ? e : tile_sum + e;
                    }
                    hymt_store16(sum16, p0 > 0 ? hymt_load16(sum16) * hymt_splat16(c) + tile_sum : tile_sum);
                }
                int64_t g = 0;
                for (; g + 4 <= group; g += 4)
                    hymt_attention_values(vh, D, p0, p1, D, scores + (r0 + g) * T, o + g * D, 4, CW, F);
                for (; g < group; g++)
                    hymt_attention_values(vh, D, p0, p1, D, scores + (r0 + g) * T, o + g * D, 1, CW, F);
            }
        }
    }
    for (int64_t t = t0; t < t1; t++)
        for (int64_t kv = kv0; kv < kv1; kv++)
            for (int64_t g = 0; g < group; g++) {
                const int64_t r = ((t - t0) * kvn + kv - kv0) * group + g;
                const float inv = 1.0f / hymt_hsum16(hymt_load16(sums + r * 16));
                float *o = out + (t * H + kv * group + g) * D;
                int64_t d = 0;
                for (; d + 16 <= D; d += 16) hymt_store16(o + d, hymt_load16(o + d) * hymt_splat16(inv));
                for (; d < D; d++) o[d] *= inv;
            }
}

typedef void (*hymt_attention_task_fn)(const float *, const float *, const float *, int64_t, int64_t, int64_t,
                                       int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float *, float *);

/* The reference: the element-wise vector code lowered to the baseline ISA (SSE2 on x86, NEON on arm64). */
static void hymt_attention_task_generic(const float *q, const float *keys, const float *values, int64_t hs,
                                        int64_t start, int64_t t0, int64_t t1, int64_t kv0, int64_t kv1,
                                        int64_t H, int64_t K, int64_t D, float *scratch, float *out) {
    hymt_attention_task_body(q, keys, values, hs, start, t0, t1, kv0, kv1, H, K, D, scratch, out, 1, 1, 0);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* The same operations on 256-bit registers (the fused multiply-adds as vfmadd on two registers). */
__attribute__((target("avx2,fma"))) static void hymt_attention_task_avx2(const float *q, const float *keys,
                                                                      const float *values, int64_t hs,
                                                                      int64_t start, int64_t t0, int64_t t1,
                                                                      int64_t kv0, int64_t kv1, int64_t H,
                                                                      int64_t K, int64_t D, float *scratch,
                                                                      float *out) {
    if (D == 128) /* every Hy-MT2 model: constant trip counts keep the sums in registers */
        hymt_attention_task_body(q, keys, values, hs, start, t0, t1, kv0, kv1, H, K, 128, scratch, out, 1, 1, 1);
    else
        hymt_attention_task_body(q, keys, values, hs, start, t0, t1, kv0, kv1, H, K, D, scratch, out, 1, 1, 1);
}

/* On 512-bit registers: one lane vector per 16 lanes, 4 heads × 64 dims of value sums in registers. */
__attribute__((target("avx2,fma,avx512f,avx512vl,avx512dq"))) static void hymt_attention_task_avx512(
    const float *q, const float *keys, const float *values, int64_t hs, int64_t start, int64_t t0, int64_t t1,
    int64_t kv0, int64_t kv1, int64_t H, int64_t K, int64_t D, float *scratch, float *out) {
    if (D == 128)
        hymt_attention_task_body(q, keys, values, hs, start, t0, t1, kv0, kv1, H, K, 128, scratch, out, 4, 4, 2);
    else
        hymt_attention_task_body(q, keys, values, hs, start, t0, t1, kv0, kv1, H, K, D, scratch, out, 4, 4, 2);
}
#endif

/* The work before attention that hymt_attention_segments can take over: per-head RMSNorm and RoPE of the
 * new tokens' query and key heads (hymt_qk_norm_rope) and the append of their keys and values to the
 * caches. q, k: [N, H, D] / [N, K, D] un-normed rows, prepared in place (q is the attention's q); v: [N, K, D];
 * positions: [N]; key_caches / value_caches: [S] writable caches (the attention's keys / values). The
 * segments' rows must be consecutive (row0[s + 1] = row0[s] + rows[s], row0[0] = 0). */
typedef struct {
    float *q;
    float *k;
    const float *v;
    float *const *key_caches;
    float *const *value_caches;
    const int64_t *positions;
    const float *freqs;  /* [D/2] */
    const float *q_norm; /* [D] */
    const float *k_norm; /* [D] */
    float eps;
    int norm_first;
} hymt_attention_prep;

/* Append rows [t0, t1) of segment s (batch rows row0 + t, cache rows start + t), kv heads [kv0, kv1), of
 * prep's k and v to the segment's [K, cap, D] caches (hs = cap · D floats per kv head). */
static inline void hymt_attention_append(const hymt_attention_prep *prep, int64_t s, int64_t hs, int64_t start,
                                         int64_t row0, int64_t t0, int64_t t1, int64_t kv0, int64_t kv1, int64_t K,
                                         int64_t D) {
    const size_t bytes = (size_t)D * sizeof(float);
    for (int64_t kv = kv0; kv < kv1; kv++)
        for (int64_t t = t0; t < t1; t++) {
            memcpy(prep->key_caches[s] + kv * hs + (start + t) * D, prep->k + ((row0 + t) * K + kv) * D, bytes);
            memcpy(prep->value_caches[s] + kv * hs + (start + t) * D, prep->v + ((row0 + t) * K + kv) * D, bytes);
        }
}

/* prep's work for tokens [t0, t1) of segment s (batch rows row0 + t, cache rows start + t) and kv heads
 * [kv0, kv1) with their query heads: the same operations per element as hymt_qk_norm_rope and a copy. */
static void hymt_attention_prepare(const hymt_attention_prep *prep, int64_t s, int64_t hs, int64_t start,
                                   int64_t row0, int64_t t0, int64_t t1, int64_t kv0, int64_t kv1, int64_t H,
                                   int64_t K, int64_t D) {
    const int64_t group = H / K;
    /* the cache rows about to be written, for writing: their read-for-ownership misses (the rows are new,
     * nothing has touched them) overlap the norms and rotations below instead of stalling the copies */
    for (int64_t kv = kv0; kv < kv1; kv++)
        for (int64_t d = start * D + t0 * D; d < start * D + t1 * D; d += 16) {
            __builtin_prefetch(prep->key_caches[s] + kv * hs + d, 1);
            __builtin_prefetch(prep->value_caches[s] + kv * hs + d, 1);
        }
    for (int64_t t = t0; t < t1; t++) {
        const int64_t r = row0 + t;
        const float pos = (float)prep->positions[r];
        hymt_norm_rope_heads(prep->q + (r * H + kv0 * group) * D, (kv1 - kv0) * group, D, pos, prep->freqs,
                             prep->q_norm, prep->eps, prep->norm_first);
        hymt_norm_rope_heads(prep->k + (r * K + kv0) * D, kv1 - kv0, D, pos, prep->freqs, prep->k_norm, prep->eps,
                             prep->norm_first);
        hymt_attention_append(prep, s, hs, start, row0, t, t + 1, kv0, kv1, K, D);
    }
}

/* Causal grouped-query attention for S segments (sessions) in one parallel region. Segment s has rows[s]
 * new tokens at positions starts[s].. whose keys and values are already in its cache; its queries and
 * outputs are rows row0[s].. of q[N, H, D] and out[N, H, D]; keys[s]/values[s] are [K, caps[s], D] (kv head
 * major; caps[s] >= starts[s] + rows[s]). Query head h reads kv head h / (H / K). Tasks are (block of up to
 * HYMT_OPS_ATTENTION_QUERIES consecutive tokens of a segment, run of kv heads) over all segments: a block's
 * kv heads are split into as few runs as still give every thread work (with the earlier position-major
 * cache, splitting 4 decoding sessions' kv heads over 2 threads, 8 tasks instead of 4, doubled the
 * attention's share of decode samples — each core's prefetchers also fetched the other half of every
 * row). One region for the whole batch matters when several sessions decode together: one token each is too little work to
 * share alone, together it is not. Each query row computes exactly as alone (see above), so results do not depend on
 * the batch, the blocks or the thread count. isa: the kernel family (enum hymt_isa numbering: 0 scalar,
 * 1 avx2, 2 avx512). prep (or NULL: done by the caller, the caches already hold the new keys and values):
 * when every segment is one block (decode, up to HYMT_OPS_ATTENTION_QUERIES tokens), each task prepares its
 * own tokens' heads and cache rows right before using them — the only new keys a task reads are its own —
 * so that work runs in the parallel region on rows still in cache, not in a serial pass before it;
 * otherwise it runs first, over all rows. Returns -1 if scratch allocation failed. */
static int hymt_attention_segments(const float *q, const float *const *keys, const float *const *values,
                                   const int64_t *starts, const int64_t *row0, const int64_t *rows,
                                   const int64_t *caps, int64_t S, int64_t H, int64_t K, int64_t D, float *out,
                                   int threads, int isa, const hymt_attention_prep *prep) {
    hymt_attention_task_fn task_fn = hymt_attention_task_generic;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (isa == 1) task_fn = hymt_attention_task_avx2;
    if (isa == 2) task_fn = hymt_attention_task_avx512;
#else
    (void)isa;
#endif
    const int64_t group = H / K, QB = HYMT_OPS_ATTENTION_QUERIES;
    int64_t blocks = 0;
    double work = 0.0;
    for (int64_t s = 0; s < S; s++) {
        blocks += (rows[s] + QB - 1) / QB;
        work += (double)rows[s] * (double)(H * (starts[s] + rows[s]) * D);
    }
    if (blocks == 0) return 0;
    if (prep != NULL && blocks > S) { /* a segment of several blocks: its tasks read each other's new keys */
        const int64_t n = row0[S - 1] + rows[S - 1];
        hymt_qk_norm_rope(prep->q, prep->k, n, H, K, D, prep->positions, prep->freqs, prep->q_norm, prep->k_norm,
                          prep->eps, prep->norm_first, threads);
        /* the new rows into the caches, 16 rows per item over the threads (serially this copy was ~2 % of a
         * 160-token prefill, the worker spinning meanwhile) */
        int64_t items = 0;
        for (int64_t s = 0; s < S; s++) items += (rows[s] + 15) / 16;
#pragma omp parallel for schedule(static) num_threads(threads) if (n * K * D >= HYMT_OPS_PARALLEL_WORK)
        for (int64_t item = 0; item < items; item++) {
            int64_t s = 0, first = item;
            while (first >= (rows[s] + 15) / 16) first -= (rows[s] + 15) / 16, s++;
            const int64_t t0 = 16 * first, t1 = t0 + 16 < rows[s] ? t0 + 16 : rows[s];
            hymt_attention_append(prep, s, caps[s] * D, starts[s], row0[s], t0, t1, 0, K, K, D);
        }
        prep = NULL;
    }
    int64_t *block = (int64_t *)malloc((size_t)(2 * blocks) * sizeof(int64_t)); /* [blocks, 2]: segment, t0 */
    if (block == NULL) return -1;
    for (int64_t s = 0, b = 0; s < S; s++)
        for (int64_t t = 0; t < rows[s]; t += QB, b++) block[2 * b] = s, block[2 * b + 1] = t;
    int failed = 0;
    const int parallel = threads > 1 && work >= (double)HYMT_OPS_ATTENTION_PARALLEL_WORK;
    int64_t runs = parallel && blocks < threads ? (threads + blocks - 1) / blocks : 1; /* kv-head runs per block */
    runs = runs < K ? runs : K;
    const int64_t per = (K + runs - 1) / runs; /* kv heads per run */
    runs = (K + per - 1) / per;
#pragma omp parallel num_threads(threads) if (parallel)
    {
        /* [QB · per · group, T + 17] and 16 floats for hymt_bcast16 past the last score; zeroed so the
         * unused lanes of a partial tile's exp are defined */
        float *scratch =
            (float *)calloc((size_t)(QB * per * group * (HYMT_OPS_ATTENTION_TILE + 17) + 16), sizeof(float));
        if (scratch == NULL) {
#pragma omp atomic write
            failed = 1;
        }
        /* dynamic: later blocks of a prompt see more keys, so equal task counts are not equal work */
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < blocks * runs; task++) {
            const int64_t b = task / runs, kv0 = task % runs * per, kv1 = kv0 + per < K ? kv0 + per : K;
            if (scratch == NULL) continue;
            const int64_t s = block[2 * b], t0 = block[2 * b + 1], t1 = t0 + QB < rows[s] ? t0 + QB : rows[s];
            if (prep != NULL)
                hymt_attention_prepare(prep, s, caps[s] * D, starts[s], row0[s], t0, t1, kv0, kv1, H, K, D);
            task_fn(q + row0[s] * H * D, keys[s], values[s], caps[s] * D, starts[s], t0, t1, kv0, kv1, H, K, D,
                    scratch, out + row0[s] * H * D);
        }
        free(scratch);
    }
    free(block);
    return failed ? -1 : 0;
}

/* One segment: n new tokens at positions start..start+n-1 (q[n, H, D], keys/values[K, cap, D], out[n, H, D]). */
static int hymt_attention(const float *q, const float *keys, const float *values, int64_t start, int64_t n,
                          int64_t cap, int64_t H, int64_t K, int64_t D, float *out, int threads, int isa) {
    const int64_t row0 = 0;
    return hymt_attention_segments(q, &keys, &values, &start, &row0, &n, &cap, 1, H, K, D, out, threads, isa,
                                   NULL);
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

/* ---- the HyV3 mixture-of-experts FFN (REFERENCE.md §4.4) ---------------------------------------------
 *
 * The whole MoE FFN of a block for n tokens in one call without the interpreter, its products through
 * quant.so's entry points (mm_api.h). Float sequence, the reference order of §4.4: delta = shared
 * expert's output; then for each selected expert in ascending index, for each of its tokens in ascending
 * order, delta[t] += (w[t, e] · y_e[t]) (the product rounded to float32, then the add). Each product is
 * batch- and thread-invariant, so an expert's output for a token does not depend on which other tokens
 * chose it or which thread ran it; the result is that of the per-operation calls, bit for bit.
 *
 * Two schedules, the same bits:
 *   tasks (n <= HYMT_MOE_TASK_TOKENS, with several threads): one parallel region whose tasks are whole
 *     experts (the shared one, then the selected ones ascending), each expert's gate/up and down run by one
 *     thread (the products' own regions are nested, hence inactive: one thread each), then the weighted
 *     sums split by token. Each thread streams whole matrices, and a layer has one fork/join instead of
 *     two per expert (each product split its rows over the threads, which then waited at its closing
 *     barrier). Synthetic 30B-A3B Q4_K, 2 threads, the two schedules alternated in one process (medians):
 *     decode one session 183 -> 158 ms per step, four sessions (different prompts) 486 -> 364 ms; a
 *     64-token prompt 26.8 -> 35.5 tok/s, 256 tokens 51.5 -> 64.8 tok/s.
 *   expert after expert (more tokens, several sessions' prompts in one call, or one thread): each product
 *     over all threads, buffers [n, ...] rather than [n · used, ...] (~155 KB per token on the 30B). */

/* Up to this many tokens per call, the experts run as whole-expert tasks: a session's 256-token prompt chunk
 * plus up to 64 sessions decoding beside it (the engine's step while any request decodes). */
#define HYMT_MOE_TASK_TOKENS 320
/* Most experts a token may use (a stack array per token; Hy-MT2 uses 8). */
#define HYMT_MOE_MAX_USED 64

/* One packed matrix: its format and row 0 (rows and columns are the block's; checked by the caller). */
typedef struct {
    const hymt_format *f;
    const uint8_t *w;
} hymt_moe_matrix;

/* A block's experts. Matrices are [rows, cols] in product terms: router [E, h] (F32, float path always),
 * shared gate/up [S, h] and down [h, S], expert gate/up [M, h] and down [h, M]. */
typedef struct {
    hymt_moe_matrix router;
    const float *bias;                 /* [E] exp_probs_b: selection only */
    hymt_moe_matrix shared[3];         /* gate, up, down */
    const hymt_moe_matrix *experts;    /* [E][3]: gate, up, down of each expert */
    int64_t h, E, used, M, S;
    int normalize;                     /* expert_weights_norm */
    float scale;                       /* expert_weights_scale */
    int float_path;
} hymt_moe;

/* Per-call buffers for n tokens (width >= max(M, S)); P = n · used when n <= HYMT_MOE_TASK_TOKENS (each
 * (token, expert) pair its own rows, as the experts run at once), else n (one expert at a time). */
typedef struct {
    float *logits;     /* [n, E] router logits */
    int32_t *selected; /* [n, used] experts of each token, in selection order */
    float *weights;    /* [n, used] their weights */
    float *route;      /* [2E] hymt_moe_route's scratch */
    int32_t *pairs;    /* [n · used] (token · used + slot), grouped by expert, tokens ascending */
    int32_t *where;    /* [n · used] index in pairs of pair (token · used + slot) */
    int32_t *chosen;   /* [E] the selected experts, ascending */
    int64_t *first;    /* [E + 1] start of each expert's run in pairs, then [E] fill cursors */
    float *gathered;   /* [P, h] the x rows of an expert's tokens */
    float *middle;     /* [n + P, width] silu(gate) × up: the shared expert's n rows, then the experts' */
    float *out;        /* [P, h] the experts' outputs */
} hymt_moe_scratch;

/* The ungated shared expert of all n tokens: delta[n, h] = down(silu(gate · x) × (up · x)), through the
 * first n rows of middle. */
static int hymt_moe_shared(const hymt_mm_api *mm, const hymt_moe *m, const hymt_moe_scratch *s, const float *x,
                           int64_t n, float *delta) {
    const int status = mm->gate_up_silu(m->shared[0].f, m->shared[0].w, m->shared[1].f, m->shared[1].w, m->S,
                                        m->h, x, n, s->middle, m->float_path);
    return status | mm->matmul(m->shared[2].f, m->shared[2].w, m->h, m->S, s->middle, n, delta, m->float_path);
}

/* Expert e's run of pairs [p0, p0 + r) (r > 0): its tokens' rows of x (x itself when every token chose it,
 * always at n = 1) through gate/up into middle and down into out, on buffer rows from p0 (task schedule)
 * or 0 (one expert at a time). */
static int hymt_moe_expert(const hymt_mm_api *mm, const hymt_moe *m, const hymt_moe_scratch *s, const float *x,
                           int64_t n, int64_t e, int64_t p0, int64_t r, int64_t row0) {
    const int64_t h = m->h, width = m->M > m->S ? m->M : m->S;
    const hymt_moe_matrix *w = m->experts + 3 * e;
    const float *xe = x;
    float *middle = s->middle + (n + row0) * width, *out = s->out + row0 * h;
    if (r < n) {
        for (int64_t j = 0; j < r; j++)
            memcpy(s->gathered + (row0 + j) * h, x + (int64_t)(s->pairs[p0 + j] / m->used) * h,
                   (size_t)h * sizeof(float));
        xe = s->gathered + row0 * h;
    }
    int status = mm->gate_up_silu(w[0].f, w[0].w, w[1].f, w[1].w, m->M, h, xe, r, middle, m->float_path);
    return status | mm->matmul(w[2].f, w[2].w, h, m->M, middle, r, out, m->float_path);
}

/* delta[n, h] = MoE(x[n, h]) with threads threads; returns 0, or nonzero when a product's scratch
 * allocation failed. */
static int hymt_moe_ffn(const hymt_mm_api *mm, const hymt_moe *m, const float *x, int64_t n, float *delta,
                        const hymt_moe_scratch *s, int threads) {
    const int64_t h = m->h, E = m->E, used = m->used, pairs = n * used;
    int status = mm->matmul(m->router.f, m->router.w, E, h, x, n, s->logits, 1);
    hymt_moe_route(s->logits, m->bias, n, E, used, m->normalize, m->scale, s->selected, s->weights, s->route);
    /* counting sort of the (token, slot) pairs by expert; a stable pass in pair order keeps each
     * expert's tokens ascending (a token selects an expert at most once) */
    int64_t *first = s->first, *cursor = s->first + E + 1;
    memset(first, 0, (size_t)(E + 1) * sizeof(int64_t));
    for (int64_t p = 0; p < pairs; p++) first[s->selected[p] + 1]++;
    for (int64_t e = 0; e < E; e++) first[e + 1] += first[e], cursor[e] = first[e];
    for (int64_t p = 0; p < pairs; p++) {
        s->where[p] = (int32_t)cursor[s->selected[p]];
        s->pairs[cursor[s->selected[p]]++] = (int32_t)p;
    }
#ifdef _OPENMP
    /* the tasks' products must run on one thread each: their regions nested inside an inactive level */
    const int tasks = threads > 1 && n <= HYMT_MOE_TASK_TOKENS && omp_get_max_active_levels() <= 1;
#else
    const int tasks = 0;
#endif
    if (!tasks) {
        status |= hymt_moe_shared(mm, m, s, x, n, delta);
        for (int64_t e = 0; e < E; e++) {
            const int64_t r = first[e + 1] - first[e];
            if (r == 0) continue;
            status |= hymt_moe_expert(mm, m, s, x, n, e, first[e], r, 0);
            for (int64_t j = 0; j < r; j++) {
                const float wt = s->weights[s->pairs[first[e] + j]];
                const float *y = s->out + j * h;
                float *d = delta + (int64_t)(s->pairs[first[e] + j] / used) * h;
                for (int64_t i = 0; i < h; i++) d[i] += wt * y[i];
            }
        }
        return status;
    }
    /* task k: 0 the shared expert, k >= 1 the k-th selected expert in ascending index (experts[k - 1]) */
    int64_t ntasks = 1;
    for (int64_t e = 0; e < E; e++)
        if (first[e + 1] > first[e]) s->chosen[ntasks++ - 1] = (int32_t)e;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(dynamic, 1) reduction(| : failed)
        for (int64_t k = 0; k < ntasks; k++) {
            if (k == 0) {
                failed |= hymt_moe_shared(mm, m, s, x, n, delta);
            } else {
                const int64_t e = s->chosen[k - 1];
                failed |= hymt_moe_expert(mm, m, s, x, n, e, first[e], first[e + 1] - first[e], first[e]);
            }
        }
        /* delta[t] += w · y over t's experts in ascending index (t's slots sorted by expert) */
#pragma omp for schedule(static)
        for (int64_t t = 0; t < n; t++) {
            int32_t slots[HYMT_MOE_MAX_USED];
            for (int64_t a = 0; a < used; a++) {
                int64_t b = a;
                for (; b > 0 && s->selected[t * used + slots[b - 1]] > s->selected[t * used + a]; b--)
                    slots[b] = slots[b - 1];
                slots[b] = (int32_t)a;
            }
            float *d = delta + t * h;
            for (int64_t a = 0; a < used; a++) {
                const int64_t p = t * used + slots[a];
                const float wt = s->weights[p], *y = s->out + (int64_t)s->where[p] * h;
                for (int64_t i = 0; i < h; i++) d[i] += wt * y[i];
            }
        }
    }
    return status | failed;
}

#endif /* HYMT_OPS_H */
