/* vec16.h — 16-lane float32 vectors in GCC/Clang vector extensions, for the element-wise code whose float
 * sequence must be the same in every kernel family (attention's softmax in ops.h, the FFN's SiLU gate in
 * vec.h). The compiler lowers the same source to the registers of each function's target (SSE2 or NEON for
 * the reference build, AVX2, AVX-512) with IEEE results identical to the scalar operations: builds use
 * -ffp-contract=off and nothing here asks for an fma, so one source gives the same bits everywhere. */
#ifndef HYMT_VEC16_H
#define HYMT_VEC16_H

#include <stdint.h>
#include <string.h>

#if defined(__GNUC__) && !defined(__clang__)
/* The helpers below are always inlined, so the vector-return ABI note does not apply. */
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

typedef float hymt_v16f __attribute__((vector_size(64)));
typedef int32_t hymt_v16i __attribute__((vector_size(64)));

static inline __attribute__((always_inline)) hymt_v16f hymt_load16(const float *p) {
    hymt_v16f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) void hymt_store16(float *p, hymt_v16f v) { memcpy(p, &v, sizeof v); }

/* x in every lane, as one broadcast: lane 0 shuffled to every lane (GCC 12 builds the literal
 * {x, x, ..., x} through the stack or as 16 masked broadcasts in the AVX-512 build). */
static inline __attribute__((always_inline)) hymt_v16f hymt_splat16(float x) {
    const hymt_v16f v = {x};
    return __builtin_shufflevector(v, v, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
}

/* Lane-wise: where take[l], a[l], else b[l]. */
static inline __attribute__((always_inline)) hymt_v16f hymt_select16(hymt_v16i take, hymt_v16f a, hymt_v16f b) {
    return (hymt_v16f)((take & (hymt_v16i)a) | (~take & (hymt_v16i)b));
}

/* e^x element-wise, x clamped to [-87, 88] (2^n stays a normal float and the result finite; e^-87 is ~1e-38).
 * Cody-Waite reduction x = n·ln2 + r (n rounded to nearest by the 1.5·2^23 trick, ln2 split so n·ln2_hi is
 * exact); e^r by the Cephes expf polynomial in plain multiply-add Horner form; times 2^n built in the
 * exponent bits. Within 1 ulp of e^x for every float in [-87, 0]. */
static inline __attribute__((always_inline)) hymt_v16f hymt_exp16(hymt_v16f x) {
    const hymt_v16f lo = hymt_splat16(-87.0f), hi = hymt_splat16(88.0f);
    x = hymt_select16(x < lo, lo, x);
    x = hymt_select16(x > hi, hi, x);
    const hymt_v16f round = hymt_splat16(12582912.0f); /* 1.5 · 2^23 */
    const hymt_v16f n = (x * hymt_splat16(1.44269504088896341f) + round) - round;
    hymt_v16f r = x - n * hymt_splat16(0.693359375f);
    r = r - n * hymt_splat16(-2.12194440e-4f);
    hymt_v16f p = hymt_splat16(1.9875691500e-4f);
    p = p * r + hymt_splat16(1.3981999507e-3f);
    p = p * r + hymt_splat16(8.3334519073e-3f);
    p = p * r + hymt_splat16(4.1665795894e-2f);
    p = p * r + hymt_splat16(1.6666665459e-1f);
    p = p * r + hymt_splat16(5.0000001201e-1f);
    p = p * (r * r) + r + hymt_splat16(1.0f);
    const hymt_v16i e = (__builtin_convertvector(n, hymt_v16i) + 127) << 23;
    return p * (hymt_v16f)e;
}

#endif /* HYMT_VEC16_H */
