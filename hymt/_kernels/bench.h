/* bench.h — the two machine ceilings of the kernel roofline (hymt.kernelbench, issue 3):
 *   hymt_bench_read      streaming read bandwidth: every thread sums its slice of a buffer far larger
 *                        than the last-level cache with the widest loads of the active ISA;
 *   hymt_bench_int8_peak register-only loop of the ISA's best int8 dot instruction (vpdpbusd zmm,
 *                        pmaddubsw+pmaddwd+paddd ymm, sdot) on every thread, 12 independent chains.
 *   hymt_bench_amx_peak  the same with AMX tdpbusd (4 accumulator tiles) where the CPU has AMX.
 * Both return elapsed seconds measured around one parallel region; the work is folded into *sink so
 * the compiler cannot drop it. */
#ifndef HYMT_BENCH_H
#define HYMT_BENCH_H

#include "hymt_common.h"
#include "matmul.h"
#include "amx.h"

#ifdef _OPENMP
static inline double hymt_now(void) { return omp_get_wtime(); }
#else
#include <time.h>
static inline double hymt_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
#endif

#if defined(HYMT_X86)
HYMT_TARGET_AVX512 static uint64_t hymt_read_avx512(const uint8_t *p, size_t bytes) {
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 256 <= bytes; i += 256) {
        s0 = _mm512_add_epi64(s0, _mm512_loadu_si512((const void *)(p + i)));
        s1 = _mm512_add_epi64(s1, _mm512_loadu_si512((const void *)(p + i + 64)));
        s2 = _mm512_add_epi64(s2, _mm512_loadu_si512((const void *)(p + i + 128)));
        s3 = _mm512_add_epi64(s3, _mm512_loadu_si512((const void *)(p + i + 192)));
    }
    return (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3)));
}

HYMT_TARGET_AVX2 static uint64_t hymt_read_avx2(const uint8_t *p, size_t bytes) {
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 128 <= bytes; i += 128) {
        s0 = _mm256_add_epi64(s0, _mm256_loadu_si256((const __m256i *)(p + i)));
        s1 = _mm256_add_epi64(s1, _mm256_loadu_si256((const __m256i *)(p + i + 32)));
        s2 = _mm256_add_epi64(s2, _mm256_loadu_si256((const __m256i *)(p + i + 64)));
        s3 = _mm256_add_epi64(s3, _mm256_loadu_si256((const __m256i *)(p + i + 96)));
    }
    __m256i s = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, s);
    return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

/* 12 chains × iters vpdpbusd zmm: 64 MACs each. */
HYMT_TARGET_AVX512 static uint64_t hymt_int8_loop_avx512(int64_t iters) {
    __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
    __m512i c[12];
    for (int k = 0; k < 12; k++) c[k] = _mm512_set1_epi32(k);
    for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int k = 0; k < 12; k++) c[k] = _mm512_dpbusd_epi32(c[k], a, b);
        __asm__ volatile("" : "+v"(a), "+v"(b)); /* keep the operands opaque */
    }
    __m512i s = c[0];
    for (int k = 1; k < 12; k++) s = _mm512_add_epi32(s, c[k]);
    return (uint64_t)(uint32_t)_mm512_reduce_add_epi32(s);
}

/* 12 chains × iters of pmaddubsw + pmaddwd + paddd on ymm: 32 MACs each. */
HYMT_TARGET_AVX2 static uint64_t hymt_int8_loop_avx2(int64_t iters) {
    __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
    __m256i c[12];
    for (int k = 0; k < 12; k++) c[k] = _mm256_set1_epi32(k);
    for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int k = 0; k < 12; k++)
            c[k] = _mm256_add_epi32(c[k], _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), ones));
        __asm__ volatile("" : "+x"(a), "+x"(b));
    }
    __m256i s = c[0];
    for (int k = 1; k < 12; k++) s = _mm256_add_epi32(s, c[k]);
    uint32_t lanes[8];
    _mm256_storeu_si256((__m256i *)lanes, s);
    return lanes[0] + lanes[7];
}
#endif

#if defined(HYMT_ARM64)
/* 12 chains × iters sdot on 16 bytes: 16 MACs each. */
HYMT_TARGET_DOTPROD static uint64_t hymt_int8_loop_neon(int64_t iters) {
    int8x16_t a = vdupq_n_s8(3), b = vdupq_n_s8(-2);
    int32x4_t c[12];
    for (int k = 0; k < 12; k++) c[k] = vdupq_n_s32(k);
    for (int64_t i = 0; i < iters; i++) {
        for (int k = 0; k < 12; k++) c[k] = vdotq_s32(c[k], a, b);
        __asm__ volatile("" : "+w"(a), "+w"(b));
    }
    int32x4_t s = c[0];
    for (int k = 1; k < 12; k++) s = vaddq_s32(s, c[k]);
    return (uint64_t)(uint32_t)vaddvq_s32(s);
}
#endif

static uint64_t hymt_read_scalar(const uint8_t *p, size_t bytes) {
    uint64_t s = 0, v;
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        memcpy(&v, p + i, 8);
        s += v;
    }
    return s;
}

/* MACs per call of the active ISA's int8 loop with `iters` iterations (0: no int8 loop). */
static int64_t hymt_int8_loop_macs(int isa, int64_t iters) {
    switch (isa) {
    case HYMT_ISA_AVX512:
        return 12 * 64 * iters;
    case HYMT_ISA_AVX2:
        return 12 * 32 * iters;
    case HYMT_ISA_NEON:
        return hymt_cpu()->dotprod ? 12 * 16 * iters : 0;
    default:
        return 0;
    }
}

static uint64_t hymt_int8_loop(int isa, int64_t iters) {
    switch (isa) {
#if defined(HYMT_X86)
    case HYMT_ISA_AVX512:
        return hymt_int8_loop_avx512(iters);
    case HYMT_ISA_AVX2:
        return hymt_int8_loop_avx2(iters);
#endif
#if defined(HYMT_ARM64)
    case HYMT_ISA_NEON:
        return hymt_cpu()->dotprod ? hymt_int8_loop_neon(iters) : 0;
#endif
    default:
        return 0;
    }
}

/* Seconds for `reps` passes over buf[bytes] split between nt threads. */
static double hymt_bench_read(const uint8_t *buf, size_t bytes, int reps, int nt, uint64_t *sink) {
    uint64_t total = 0;
#if defined(HYMT_X86)
    int isa = hymt_active_isa;
#endif
    double t0 = hymt_now();
#pragma omp parallel num_threads(nt) reduction(+ : total)
    {
        int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        size_t chunk = (bytes / (size_t)nth) / 256 * 256;
        const uint8_t *p = buf + (size_t)tid * chunk;
        for (int r = 0; r < reps; r++) {
#if defined(HYMT_X86)
            if (isa == HYMT_ISA_AVX512)
                total += hymt_read_avx512(p, chunk);
            else if (isa == HYMT_ISA_AVX2)
                total += hymt_read_avx2(p, chunk);
            else
#endif
                total += hymt_read_scalar(p, chunk);
        }
    }
    double elapsed = hymt_now() - t0;
    *sink = total;
    return elapsed;
}

/* Seconds for `iters` iterations of the int8 loop on each of nt threads; *macs gets the total. */
static double hymt_bench_int8_peak(int64_t iters, int nt, int64_t *macs, uint64_t *sink) {
    uint64_t total = 0;
    int isa = hymt_active_isa, used = 1;
    double t0 = hymt_now();
#pragma omp parallel num_threads(nt) reduction(+ : total)
    {
#pragma omp single
        used = omp_get_num_threads();
        total += hymt_int8_loop(isa, iters);
    }
    double elapsed = hymt_now() - t0;
    *macs = hymt_int8_loop_macs(isa, iters) * used;
    *sink = total;
    return elapsed;
}

/* As hymt_bench_int8_peak with the AMX loop; returns -1 (nothing run) where AMX is not usable. */
static double hymt_bench_amx_peak(int64_t iters, int nt, int64_t *macs, uint64_t *sink) {
    *macs = 0;
#if defined(HYMT_HAVE_AMX)
    if (!hymt_cpu()->amx_int8) return -1.0;
    uint64_t total = 0;
    int used = 1;
    double t0 = hymt_now();
#pragma omp parallel num_threads(nt) reduction(+ : total)
    {
#pragma omp single
        used = omp_get_num_threads();
        total += hymt_amx_int8_loop(iters);
    }
    double elapsed = hymt_now() - t0;
    *macs = HYMT_AMX_LOOP_MACS * iters * used;
    *sink = total;
    return elapsed;
#else
    (void)iters, (void)nt, (void)sink;
    return -1.0;
#endif
}

#endif /* HYMT_BENCH_H */
