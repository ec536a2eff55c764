/* matmul.h — the matrix-product driver (REFERENCE.md §3.3–3.5).
 *
 * Y[t, r] = Σ_c X[t, c] · W[r, c] for packed W (dims [cols, rows]) and float32 X [n, cols]. The Cython
 * layer validates every shape and byte length before calling; nothing here checks again.
 *
 * One OpenMP parallel region per call (a decode step makes ~250 calls, so there is exactly one fork):
 *   1. each token's activations are prepared once per distinct activation layout (format.prepare),
 *      tokens split over the threads, then a barrier;
 *   2. output rows are cut into about four chunks per thread, each a multiple of HYMT_ROW_TILE so
 *      kernel row tiles never straddle threads. Thread t owns the run of chunks [t·C/nt, (t+1)·C/nt)
 *      and takes it in order from its front; a thread whose run is done takes chunks from the back of
 *      the others' runs (hymt_run_take), so a thread that runs slower (another process took its core,
 *      its pages were colder) does fewer chunks instead of holding the others at the closing barrier.
 *      For each chunk the format's GEMM runs over its rows for all n tokens (the kernel tiles tokens
 *      itself, loading each weight block once per token tile).
 *      Why runs: each thread's rows are one contiguous range, and the kernels' stream prefetch past the
 *      end of a chunk lands in the same thread's next chunk. With one counter for all (until session
 *      11) consecutive chunks alternated between the threads and every chunk started a cold stream.
 *      Kernel benchmark, 2 threads, alternated, 3 runs: STQ1_0 n = 1 0.72-0.76 -> 0.78-0.80 of the
 *      roofline, n = 4 0.39 -> 0.43, Q2_0C n = 4 0.52-0.57 -> 0.60, Q4_K, Q6_K and Q8_0 +0-4 %; 1.25Bit
 *      decode step 18.71 -> 18.33 ms at one session, 33.03 -> 31.94 at four (medians of 3), 64-token
 *      prefill 97-99 -> 91-96 ms; Q4_K steps and prefill unchanged. (One run per thread and no
 *      balancing measured 0.80 too, but then a slowed thread holds the other at the barrier. Eight
 *      chunks per thread, for a shorter tail at the closing barrier, on Zen 4 (session 13): 1.25Bit
 *      4-session decode step 37.7 -> 40.3 ms, medians of 5 alternations. Eight, in 64-row multiples, for
 *      prompts only (session 14): 1.25Bit prefill of 33 / 66 tokens 148.6 -> 144.1 / 286.8 -> 263.9 ms,
 *      Q4_K 238.8 -> 234.6 / 434.5 -> 436.9 (medians of 6 alternations, each pair's spread larger than
 *      that), kernel benchmark n = 16 / 64 every format within ±2 %: not kept.)
 * Up to HYMT_OVERLAP_TOKENS tokens (decode) there is no barrier between the two: the (layout, token)
 * items are taken from an atomic counter, and a thread that finds no item left waits only until the
 * items others took are done. Why: a worker that slept since the last region
 * (GOMP_SPINCOUNT, set in hymt/__init__.py, is a few µs; Python between two calls is longer) takes
 * tens of µs to wake on this VM. The calling thread enters the region at once; with a barrier it
 * waited for the sleeper, now it prepares the activations and streams its chunks alone until the
 * worker joins (and takes the worker's run from its back if the worker is late). This pays only in the
 * first product after such a gap: measured when every layer returned to
 * Python (a layer's qkv: the worker arrived 25-45 µs late there, 1-3 µs in the others); a decode step
 * now runs all its layers in one call (ops.run_layers), so the gaps left are between steps. Synthetic
 * 1.8B decode, 2 threads, old and new alternated in one process, µs per layer's qkv (medians): 1.25Bit
 * 1 session 67.5 → 62.3, 4 sessions 127.2 → 112.8 (the wake-up is slower when the machine is busier);
 * Q4_K within noise; o, gate/up, down and the whole step unchanged. (A longer GOMP_SPINCOUNT removes the
 * sleep itself — 30000: 1.25Bit step −5 % idle — but doubled the step beside one busy process: 49 →
 * 87-109 ms.) A prompt keeps the barrier: its
 * products take milliseconds, and the 64-token prefill measured 1-2 % slower without it in separate
 * processes (not reproduced alternating in one process; kept out rather than explained).
 * Each output element is computed by one thread with an order fixed by the kernel, so results do not
 * depend on the thread count, on the chunking, or on the other tokens of the batch.
 *
 * The thread count is a global passed explicitly to every region (num_threads clause): the engine
 * calls from its own thread, and omp_set_num_threads only affects the calling thread.
 *
 * Paths: the int8 path (§3.4) when the format has one and cols is a multiple of 256; otherwise (F32,
 * F16, float_path requested, or e.g. a Q8_0 tensor whose rows are not whole 256-groups) the float path:
 * y = format.row_dot_f32(row, x) per row and token. */
#ifndef HYMT_MATMUL_H
#define HYMT_MATMUL_H

#include <pthread.h>
#include <stdlib.h>

#include "hymt_common.h"
#include "cpu.h"
#include "vec.h"

#ifdef _OPENMP
#include <omp.h>
#else
static inline int omp_get_thread_num(void) { return 0; }
static inline int omp_get_num_threads(void) { return 1; }
#endif

#define HYMT_ROW_TILE 16
/* Below this many multiply-accumulates a call runs on the calling thread (a fork costs microseconds). */
#define HYMT_PARALLEL_MIN_WORK (1 << 18)
/* gate_up_silu computes gate and up over sub-chunks of this many rows (bounds the per-thread scratch). */
#define HYMT_SILU_ROWS 64
/* Up to this many tokens a call starts without a team barrier (decode: see the top of the file). */
#define HYMT_OVERLAP_TOKENS 8

static int hymt_num_threads = 1;

/* One step of a short spin-wait (lets the sibling hyperthread run; a no-op elsewhere). */
static inline void hymt_spin_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* The GEMM a format uses under an ISA family: NEON without dotprod, and missing entries, run the scalar
 * reference (bit-identical by contract). */
static hymt_gemm_fn hymt_gemm_for(const hymt_format *f, int isa) {
    if (f->prepare == NULL) return NULL;
    if (isa == HYMT_ISA_NEON && !hymt_cpu()->dotprod) isa = HYMT_ISA_SCALAR;
    hymt_gemm_fn fn = f->gemm[isa];
    return fn != NULL ? fn : f->gemm[HYMT_ISA_SCALAR];
}

static inline int hymt_int8_path(const hymt_format *f, int64_t cols, int float_path) {
    return !float_path && f->prepare != NULL && cols % HYMT_Q8G_SIZE == 0;
}

/* One weight matrix of a call. */
typedef struct {
    const hymt_format *f;
    const uint8_t *w;   /* row 0; rows are row_bytes apart */
    int64_t rows;
    size_t row_bytes;
    float *y;           /* [n, y_stride] output; row r of token t at y[t * y_stride + r] */
    int64_t y_stride;
    hymt_gemm_fn gemm;  /* NULL: float path */
    const uint8_t *act; /* int8 path: prepared activations of token 0, tokens act_stride apart */
    size_t act_stride;
} hymt_mm_weight;

/* Rows [r0, r1) of one weight for all n tokens, into y (indexed by absolute row). */
static void hymt_mm_rows(const hymt_mm_weight *m, int64_t r0, int64_t r1, const float *x, int64_t n,
                         int64_t cols, float *y, int64_t y_stride) {
    if (r1 <= r0) return;
    if (m->gemm != NULL) {
        m->gemm(m->w, m->row_bytes, r0, r1, m->act, m->act_stride, n, cols, y, y_stride);
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = m->w + (size_t)r * m->row_bytes;
        for (int64_t t = 0; t < n; t++) y[t * y_stride + r] = m->f->row_dot_f32(row, x + t * cols, cols);
    }
}

/* Rows per dynamically scheduled chunk: about four chunks per thread, a multiple of HYMT_ROW_TILE. */
static inline int64_t hymt_row_chunk(int64_t total, int nth) {
    int64_t chunk = (total + 4 * (int64_t)nth - 1) / (4 * (int64_t)nth);
    return (chunk + HYMT_ROW_TILE - 1) / HYMT_ROW_TILE * HYMT_ROW_TILE;
}

/* A thread's run of chunks [front, back), packed as front | back << 32: its owner takes chunks from the
 * front, threads whose own run is done take them from the back. Returns the chunk taken, or -1. */
static inline int64_t hymt_run_take(uint64_t *run, int from_back) {
    uint64_t s = __atomic_load_n(run, __ATOMIC_RELAXED);
    for (;;) {
        uint64_t front = s & 0xffffffffu, back = s >> 32;
        if (front >= back) return -1;
        uint64_t next = from_back ? front | (back - 1) << 32 : (front + 1) | back << 32;
        if (__atomic_compare_exchange_n(run, &s, next, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            return (int64_t)(from_back ? back - 1 : front);
    }
}

static inline int64_t hymt_chunk_end(int64_t ci, int64_t chunk, int64_t total) {
    return (ci + 1) * chunk < total ? (ci + 1) * chunk : total;
}

/* Rows [start, end) of a call's rows (the weights' rows laid end to end; silu: gate and up rows, y0 =
 * silu(gate) × up through tile [n][HYMT_SILU_ROWS], this thread's) for all n tokens. */
static void hymt_mm_chunk(const hymt_mm_weight *m, int nm, int silu, int64_t start, int64_t end,
                          const float *x, int64_t n, int64_t cols, float *tile) {
    if (!silu) {
        int64_t base = 0;
        for (int k = 0; k < nm; k++) {
            int64_t r0 = start - base, r1 = end - base;
            r0 = r0 < 0 ? 0 : r0;
            r1 = r1 > m[k].rows ? m[k].rows : r1;
            hymt_mm_rows(&m[k], r0, r1, x, n, cols, m[k].y, m[k].y_stride);
            base += m[k].rows;
        }
        return;
    }
    for (int64_t c = start; c < end; c += HYMT_SILU_ROWS) {
        int64_t len = end - c < HYMT_SILU_ROWS ? end - c : HYMT_SILU_ROWS;
        /* Row-shifted views so the kernels' absolute row indices start at c. */
        hymt_mm_weight gate = m[0], upw = m[1];
        gate.w += (size_t)c * gate.row_bytes;
        upw.w += (size_t)c * upw.row_bytes;
        hymt_mm_rows(&gate, 0, len, x, n, cols, m[0].y + c, m[0].y_stride);
        hymt_mm_rows(&upw, 0, len, x, n, cols, tile, HYMT_SILU_ROWS);
        hymt_silu_mul_rows_f32_isa(hymt_active_isa, m[0].y + c, m[0].y_stride, tile, HYMT_SILU_ROWS, len, n);
    }
}

/* The prepared activations of a call live in a buffer of the calling thread that only grows (freed
 * when the thread ends): allocated per call, a buffer of megabytes (STQ1_0 activations carry 2 KiB of
 * lookup tables per 256 inputs) came fresh from mmap every time, and its page faults took ~15 % of a
 * 64-token product. Calls keep it below HYMT_ACT_SLAB_BYTES by running their tokens in slabs. */
#define HYMT_ACT_SLAB_BYTES ((size_t)8 << 20)

static pthread_key_t hymt_act_key;
static pthread_once_t hymt_act_once = PTHREAD_ONCE_INIT;
typedef struct {
    uint8_t *data;
    size_t bytes;
} hymt_act_buffer;

static void hymt_act_buffer_free(void *p) {
    hymt_act_buffer *b = (hymt_act_buffer *)p;
    free(b->data);
    free(b);
}
static void hymt_act_key_create(void) { (void)pthread_key_create(&hymt_act_key, hymt_act_buffer_free); }

/* At least `bytes` (a multiple of 64) of 64-byte aligned scratch for this thread, or NULL. */
static uint8_t *hymt_act_scratch(size_t bytes) {
    pthread_once(&hymt_act_once, hymt_act_key_create);
    hymt_act_buffer *b = (hymt_act_buffer *)pthread_getspecific(hymt_act_key);
    if (b == NULL) {
        if ((b = (hymt_act_buffer *)calloc(1, sizeof *b)) == NULL) return NULL;
        if (pthread_setspecific(hymt_act_key, b) != 0) {
            free(b);
            return NULL;
        }
    }
    if (b->bytes < bytes) {
        free(b->data);
        b->bytes = 0;
        if ((b->data = (uint8_t *)aligned_alloc(64, bytes)) == NULL) return NULL;
        b->bytes = bytes;
    }
    return b->data;
}

/* hymt_mm_run for one slab of tokens. */
static int hymt_mm_run_tokens(hymt_mm_weight *m, int nm, int64_t cols, const float *x, int64_t n, int float_path,
                              int silu) {
    /* Distinct activation layouts (formats sharing a prepare function share the buffer). */
    hymt_prepare_fn prep[3] = {NULL, NULL, NULL};
    size_t strides[3] = {0, 0, 0}, offsets[3] = {0, 0, 0}, act_bytes = 0;
    int nprep = 0, slot_of[3] = {-1, -1, -1};
    for (int k = 0; k < nm; k++) {
        m[k].row_bytes = (size_t)(cols / m[k].f->block_len) * (size_t)m[k].f->block_bytes;
        if (!hymt_int8_path(m[k].f, cols, float_path)) continue;
        int s = 0;
        while (s < nprep && prep[s] != m[k].f->prepare) s++;
        if (s == nprep) {
            prep[s] = m[k].f->prepare;
            strides[s] = (m[k].f->act_stride(cols, n) + 63) / 64 * 64;
            offsets[s] = act_bytes;
            act_bytes += strides[s] * (size_t)n;
            nprep++;
        }
        slot_of[k] = s;
    }

    int64_t total_rows = silu ? m[0].rows : 0;
    for (int k = 0; k < nm && !silu; k++) total_rows += m[k].rows;
    int nt = hymt_num_threads;
    if ((double)total_rows * (double)cols * (double)n * (silu ? 2.0 : 1.0) < (double)HYMT_PARALLEL_MIN_WORK) nt = 1;

    /* act: [nprep][n][stride] prepared activations; up: [nt][n][HYMT_SILU_ROWS] up-projection tiles */
    uint8_t *act = NULL;
    float *up = NULL;
    uint64_t *runs = (uint64_t *)aligned_alloc(64, (size_t)nt * 64); /* [nt][8]: thread t's run at runs[8t] */
    size_t up_bytes = ((size_t)nt * (size_t)n * HYMT_SILU_ROWS * sizeof(float) + 63) / 64 * 64;
    if ((act_bytes > 0 && (act = hymt_act_scratch((act_bytes + 63) / 64 * 64)) == NULL) ||
        (silu && (up = (float *)aligned_alloc(64, up_bytes)) == NULL) || runs == NULL) {
        free(up);
        free(runs);
        return -1;
    }
    for (int k = 0; k < nm; k++) {
        int s = slot_of[k];
        m[k].gemm = s >= 0 ? hymt_gemm_for(m[k].f, hymt_active_isa) : NULL;
        m[k].act = s >= 0 ? act + offsets[s] : NULL;
        m[k].act_stride = s >= 0 ? strides[s] : 0;
    }

    const int64_t items = (int64_t)nprep * n, chunk = hymt_row_chunk(total_rows, nt);
    const int64_t nchunks = (total_rows + chunk - 1) / chunk;
    const int overlap = n <= HYMT_OVERLAP_TOKENS;
    int64_t item_next = 0, items_done = 0; /* shared counters (atomics), overlap only */
    for (int t = 0; t < nt; t++)
        runs[8 * t] = (uint64_t)(t * nchunks / nt) | (uint64_t)((t + 1) * nchunks / nt) << 32;

#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        /* [n][HYMT_SILU_ROWS] up-projection tile of this thread */
        float *tile = silu ? up + (size_t)omp_get_thread_num() * (size_t)n * HYMT_SILU_ROWS : NULL;
        if (overlap) {
            for (int64_t i; (i = __atomic_fetch_add(&item_next, 1, __ATOMIC_RELAXED)) < items;) {
                int64_t s = i / n, t = i % n;
                prep[s](x + t * cols, cols, n, act + offsets[s] + (size_t)t * strides[s]);
                __atomic_fetch_add(&items_done, 1, __ATOMIC_RELEASE);
            }
            /* the items others took (at n = 1, one, microseconds): their activations are read below */
            while (__atomic_load_n(&items_done, __ATOMIC_ACQUIRE) < items) hymt_spin_pause();
        } else if (nprep > 0) {
#pragma omp for schedule(static)
            for (int64_t i = 0; i < items; i++) {
                int64_t s = i / n, t = i % n;
                prep[s](x + t * cols, cols, n, act + offsets[s] + (size_t)t * strides[s]);
            }
        }
        /* its own run first, in order, then the others' from their back ends */
        const int me = omp_get_thread_num();
        for (int k = 0; k < nt; k++)
            for (int64_t ci; (ci = hymt_run_take(&runs[8 * ((me + k) % nt)], k > 0)) >= 0;)
                hymt_mm_chunk(m, nm, silu, ci * chunk, hymt_chunk_end(ci, chunk, total_rows), x, n, cols, tile);
    }
    free(up);
    free(runs);
    return 0;
}

/* Run nm weights sharing the input x [n, cols]. silu != 0 (nm == 2): y0 = silu(W0·x) × (W1·x), with
 * m[1].y unused. Tokens run in slabs whose prepared activations fit HYMT_ACT_SLAB_BYTES (each token's
 * results do not depend on the others). Returns 0, or -1 when scratch memory could not be allocated. */
static int hymt_mm_run(hymt_mm_weight *m, int nm, int64_t cols, const float *x, int64_t n, int float_path,
                       int silu) {
    size_t token_bytes = 0; /* prepared activations per token, over the distinct layouts (an upper bound) */
    for (int k = 0; k < nm; k++)
        if (hymt_int8_path(m[k].f, cols, float_path)) token_bytes += (m[k].f->act_stride(cols, n) + 63) / 64 * 64;
    int64_t slab = token_bytes > 0 ? (int64_t)(HYMT_ACT_SLAB_BYTES / token_bytes) : n;
    if (slab < 1) slab = 1;
    if (slab >= n) return hymt_mm_run_tokens(m, nm, cols, x, n, float_path, silu);
    for (int64_t t0 = 0; t0 < n; t0 += slab) {
        hymt_mm_weight part[3];
        for (int k = 0; k < nm; k++) {
            part[k] = m[k];
            if (part[k].y != NULL) part[k].y += t0 * part[k].y_stride;
        }
        if (hymt_mm_run_tokens(part, nm, cols, x + t0 * cols, n - t0 < slab ? n - t0 : slab, float_path, silu) != 0)
            return -1;
    }
    return 0;
}

/* y [n, rows] = x [n, cols] · Wᵀ. */
static int hymt_matmul(const hymt_format *f, const uint8_t *w, int64_t rows, int64_t cols, const float *x,
                       int64_t n, float *y, int float_path) {
    hymt_mm_weight m = {.f = f, .w = w, .rows = rows, .y = y, .y_stride = rows};
    return hymt_mm_run(&m, 1, cols, x, n, float_path, 0);
}

/* Three products sharing x (query, key, value): one preparation, one parallel region. */
static int hymt_matmul_qkv(const hymt_format *fq, const uint8_t *wq, int64_t rq, const hymt_format *fk,
                           const uint8_t *wk, int64_t rk, const hymt_format *fv, const uint8_t *wv, int64_t rv,
                           int64_t cols, const float *x, int64_t n, float *yq, float *yk, float *yv,
                           int float_path) {
    hymt_mm_weight m[3] = {
        {.f = fq, .w = wq, .rows = rq, .y = yq, .y_stride = rq},
        {.f = fk, .w = wk, .rows = rk, .y = yk, .y_stride = rk},
        {.f = fv, .w = wv, .rows = rv, .y = yv, .y_stride = rv},
    };
    return hymt_mm_run(m, 3, cols, x, n, float_path, 0);
}

/* y [n, F] = silu(x · Wgateᵀ) × (x · Wupᵀ). */
static int hymt_matmul_gate_up_silu(const hymt_format *fg, const uint8_t *wg, const hymt_format *fu,
                                    const uint8_t *wu, int64_t F, int64_t cols, const float *x, int64_t n,
                                    float *y, int float_path) {
    hymt_mm_weight m[2] = {
        {.f = fg, .w = wg, .rows = F, .y = y, .y_stride = F},
        {.f = fu, .w = wu, .rows = F, .y = NULL, .y_stride = 0},
    };
    return hymt_mm_run(m, 2, cols, x, n, float_path, 1);
}

#endif /* HYMT_MATMUL_H */
