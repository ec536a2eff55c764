/* hymt_common.h — types and contracts shared by every kernel header.
 *
 * Layout of the kernel sources (one header per format, each holding its scalar reference beside
 * its SIMD variants):
 *   hymt_common.h   this file: ISA ids, target attributes, fp16, int8 activation groups, the
 *                   format descriptor every format fills in
 *   cpu.h           CPU feature detection (cpuid / auxv) and the run-time ISA choice
 *   fmt_*.h         one per tensor format: decoder, float32 row dot, int8 GEMM per ISA
 *   matmul.h        the driver: activation preparation, OpenMP split over rows, dispatch
 *
 * Numerical contract (REFERENCE.md §3.4, §3.6): for a given format, every ISA variant of the int8
 * GEMM returns bit-identical results to that format's scalar reference. Integer sums are exact;
 * float32 accumulation must follow exactly the order the scalar reference defines, so each scalar
 * reference is written with the lane structure its SIMD siblings use (e.g. 16 float accumulators
 * reduced by a fixed tree). Builds use -ffp-contract=off: a*b+c is never silently fused; use an
 * explicit fma only where the scalar reference uses fmaf() too.
 *
 * Batch invariance (REFERENCE.md §0.5, §3.3): the value of Y[t, r] must not depend on n, on which
 * other tokens share the call, nor on the row range a thread was given.
 */
#ifndef HYMT_COMMON_H
#define HYMT_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

#if defined(__x86_64__) || defined(_M_X64)
#define HYMT_X86 1
#include <immintrin.h>
#define HYMT_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define HYMT_TARGET_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
/* Only used where cpu.h reports VBMI as well (vpermb); never required by the avx512 family. */
#define HYMT_TARGET_AVX512VBMI \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi")))
/* AMX tile instructions (amx.h): only where the compiler knows them; used only where cpu.h reports
 * amx_int8 and hymt_amx_enabled is set. */
#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#define HYMT_HAVE_AMX 1
#define HYMT_TARGET_AMX \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,amx-tile,amx-int8")))
#endif
#endif

#if defined(__aarch64__)
#define HYMT_ARM64 1
#include <arm_neon.h>
/* GCC 12 rejects the bare "+dotprod" for vdotq_s32 ("target specific option mismatch"). */
#define HYMT_TARGET_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#endif

#define HYMT_INLINE static inline __attribute__((always_inline))

/* The kernel family in use, set once by the Cython layer (best supported, or HYMT_ISA) and changed
 * only by hymt.kernels.use_isa() in tests. Kernels that dispatch internally (hymt_dot_f32 in vec.h)
 * read it; GEMMs are dispatched by matmul.h through hymt_format.gemm[]. */
static int hymt_active_isa __attribute__((unused)) = 0; /* unused where only the types are needed (ops.so) */

/* Kernel families, in the order of preference on x86 (best last). */
enum hymt_isa {
    HYMT_ISA_SCALAR = 0,
    HYMT_ISA_AVX2 = 1,
    HYMT_ISA_AVX512 = 2,
    HYMT_ISA_NEON = 3,
    HYMT_ISA_COUNT = 4
};

/* IEEE half -> float32, exact for every input (subnormals, infinities, NaN). */
static inline float hymt_fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                mant <<= 1;
            } while ((mant & 0x400u) == 0);
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

HYMT_INLINE uint16_t hymt_load_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* int8 activations of one group of 256 consecutive inputs (REFERENCE.md §3.4), 320 bytes so an
 * array of groups keeps every qs 64-byte aligned when the array is.
 *   qs[i]    = round_half_to_even(x[i] * 127 / max|x|), clamped to [-127, 127]  (all 0 if max == 0)
 *   d        = max|x| / 127                                                      (0 if max == 0)
 *   bsums[k] = sum of qs[16k .. 16k+16)   (exact: |bsums| <= 2032)
 *   sum      = sum of all 256 qs          (exact) */
typedef struct {
    int8_t qs[256];
    int16_t bsums[16];
    float d;
    int32_t sum;
    uint8_t pad[24];
} hymt_q8g;

#define HYMT_Q8G_SIZE 256

/* Y[t * y_stride + r] for t in [0, n), r in [r0, r1) of a packed weight matrix.
 *   w           start of row 0 of the weight (rows are row_bytes apart)
 *   act         prepared activations of token 0; token t starts at act + t * act_stride
 *   cols        inputs per row (a multiple of the format's block length, checked by the caller)
 * Must process weight blocks once per tile of tokens (batching), and give each (t, r) exactly the
 * value it would get with n == 1. */
/* Rows per lane S of the super panel (hymt_lane_rows_avx512) that starts with `left` rows still to do, for
 * `width` lanes (a kernel's panel rows) and at most `most` rows per lane: 1 (lanes of consecutive rows)
 * when fewer than two panels are left or when `strided` is 0 (a kernel's int32 gather offsets would not
 * reach the lanes), else as many as the range gives. */
static inline int64_t hymt_lane_rows(int64_t left, int64_t width, int64_t most, int strided) {
    if (!strided || left < 2 * width) return 1;
    return left >= width * most ? most : left / width;
}

/* Tokens of pass p when n tokens go through a kernel in `passes` passes, the earlier passes having taken
 * t0: the sizes differ by at most one (9 tokens in passes of up to 8: 5 + 4), so no pass runs a kernel
 * far below its best width. */
static inline int64_t hymt_pass_tokens(int64_t n, int64_t t0, int64_t passes, int64_t p) {
    return (n - t0 + passes - p - 1) / (passes - p);
}

#if defined(HYMT_X86)
/* 16×16 dword transpose: out[j] lane i = dword j of r[i] (unpack 32/64-bit, then two 128-bit lane
 * shuffles; r and out must not overlap). The batched kernels use it so that a vector holds 4 weights of
 * each of 16 rows (lane = row), the AMX kernels to move between row-major and tile layouts. */
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_transpose16_epi32(const __m512i *r, __m512i *out) {
    __m512i t[16], u[16];
    for (int k = 0; k < 8; k++) {
        t[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
    }
    for (int m = 0; m < 4; m++) { /* u[4m + e], quarter L: dword 4L + e of rows 4m..4m+3 */
        u[4 * m + 0] = _mm512_unpacklo_epi64(t[4 * m], t[4 * m + 2]);
        u[4 * m + 1] = _mm512_unpackhi_epi64(t[4 * m], t[4 * m + 2]);
        u[4 * m + 2] = _mm512_unpacklo_epi64(t[4 * m + 1], t[4 * m + 3]);
        u[4 * m + 3] = _mm512_unpackhi_epi64(t[4 * m + 1], t[4 * m + 3]);
    }
    for (int e = 0; e < 4; e++) {
        __m512i v0 = _mm512_shuffle_i32x4(u[e], u[4 + e], _MM_SHUFFLE(1, 0, 1, 0));
        __m512i v1 = _mm512_shuffle_i32x4(u[e], u[4 + e], _MM_SHUFFLE(3, 2, 3, 2));
        __m512i v2 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], _MM_SHUFFLE(1, 0, 1, 0));
        __m512i v3 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], _MM_SHUFFLE(3, 2, 3, 2));
        out[e] = _mm512_shuffle_i32x4(v0, v2, _MM_SHUFFLE(2, 0, 2, 0));
        out[4 + e] = _mm512_shuffle_i32x4(v0, v2, _MM_SHUFFLE(3, 1, 3, 1));
        out[8 + e] = _mm512_shuffle_i32x4(v1, v3, _MM_SHUFFLE(2, 0, 2, 0));
        out[12 + e] = _mm512_shuffle_i32x4(v1, v3, _MM_SHUFFLE(3, 1, 3, 1));
    }
}

/* Super panels of the few-token kernels (fmt_q8_0.h, fmt_q4_k.h, fmt_q2_0c.h): a range of 16·S rows is read
 * in S passes, lane j of pass i computing row r + jS + i, so that each lane streams S consecutive rows. 16
 * lanes of consecutive rows are 16 short streams (a 2048-column row is a few KiB) that the hardware
 * prefetchers follow badly; one long stream per lane they follow. The values are per row, so the lane
 * order cannot change them. Lane j's output row, counted from the pass's first row: j·S. */
HYMT_TARGET_AVX512 HYMT_INLINE __m512i hymt_lane_rows_avx512(int64_t S) {
    return _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                              _mm512_set1_epi32((int)S));
}

/* A pass's 16 row values v into y (the pass's first output row): lane j to row j·S when S > 1 (lanes from
 * hymt_lane_rows_avx512), else lanes 0.. to consecutive rows, those of mask live. */
HYMT_TARGET_AVX512 HYMT_INLINE void hymt_store_lane_rows_avx512(float *y, int64_t S, __m512i lanes, __mmask16 live,
                                                                __m512 v) {
    if (S > 1)
        _mm512_i32scatter_ps(y, lanes, v, 4);
    else
        _mm512_mask_storeu_ps(y, live, v);
}

#endif

typedef void (*hymt_gemm_fn)(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                             const uint8_t *act, size_t act_stride, int64_t n, int64_t cols,
                             float *y, int64_t y_stride);

/* Float-activation dot of one packed row with x[cols] (the float32 reference path, §3.3). */
typedef float (*hymt_row_dot_f32_fn)(const uint8_t *row, const float *x, int64_t cols);

/* One token's activations prepared for the format's int8 GEMM; act_stride(cols, n) bytes. n is the number
 * of tokens of the call (a format may prepare more for batches its batched kernel takes). */
typedef void (*hymt_prepare_fn)(const float *x, int64_t cols, int64_t n, uint8_t *act);
typedef size_t (*hymt_act_stride_fn)(int64_t cols, int64_t n);

/* Bit-exact block decoder (REFERENCE.md §2): nblocks whole blocks -> nblocks * block_len floats. */
typedef void (*hymt_decode_fn)(const uint8_t *src, float *dst, int64_t nblocks);

typedef struct {
    const char *name;         /* "Q6_K" */
    int block_len;            /* weights per block */
    int block_bytes;          /* bytes per block */
    hymt_decode_fn decode;
    hymt_row_dot_f32_fn row_dot_f32;
    hymt_prepare_fn prepare;  /* NULL: no int8 path (F32, F16) */
    hymt_act_stride_fn act_stride;
    hymt_gemm_fn gemm[HYMT_ISA_COUNT]; /* gemm[HYMT_ISA_SCALAR] is the reference; NULL entries fall
                                          back to the scalar reference */
} hymt_format;

#endif /* HYMT_COMMON_H */
