/* isa_check.c — every registered format's int8 GEMM under one ISA family vs its scalar reference,
 * bit for bit, plus dot and the activation quantization. Built and run by tests/test_kernels.py for
 * families the test machine cannot run natively (aarch64 NEON under qemu-user).
 *
 * usage: isa_check <isa id> ; prints one line per check, exits 1 on any mismatch. */
#include <stdio.h>
#include <stdlib.h>

#include "formats.h"
#include "matmul.h"
#include "vec.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t next_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float next_float(void) { return (float)(next_u32() % 2000001) / 1000000.0f - 1.0f; }

/* A finite fp16 between 2^-10 and 2^-1 in magnitude, either sign. */
static uint16_t random_scale(void) {
    uint32_t sign = next_u32() & 1, exponent = 5 + next_u32() % 10, mantissa = next_u32() & 0x3ff;
    return (uint16_t)((sign << 15) | (exponent << 10) | mantissa);
}

static int scale_offsets(const char *name, int *offsets) {
    if (!strcmp(name, "Q8_0") || !strcmp(name, "Q2_0C")) return offsets[0] = 0, 1;
    if (!strcmp(name, "Q4_K")) return offsets[0] = 0, offsets[1] = 2, 2;
    if (!strcmp(name, "Q6_K")) return offsets[0] = 208, 1;
    if (!strcmp(name, "STQ1_0")) return offsets[0] = 40, 1;
    return -1;
}

static int check_format(const hymt_format *f, int isa, int64_t rows, int64_t cols, int64_t n) {
    int offsets[2], count = scale_offsets(f->name, offsets);
    if (count < 0) {
        printf("SKIP %s: no scale layout known\n", f->name);
        return 0;
    }
    size_t row_bytes = (size_t)(cols / f->block_len) * f->block_bytes, total = row_bytes * rows;
    uint8_t *w = malloc(total);
    for (size_t i = 0; i < total; i++) w[i] = (uint8_t)next_u32();
    for (size_t b = 0; b < total / f->block_bytes; b++)
        for (int k = 0; k < count; k++) {
            uint16_t s = random_scale();
            memcpy(w + b * f->block_bytes + offsets[k], &s, 2);
        }
    float *x = malloc(sizeof(float) * n * cols);
    for (int64_t i = 0; i < n * cols; i++) x[i] = next_float() * (1 + (i % 7));
    float *y0 = malloc(sizeof(float) * n * rows), *y1 = malloc(sizeof(float) * n * rows);
    hymt_active_isa = HYMT_ISA_SCALAR;
    hymt_matmul(f, w, rows, cols, x, n, y0, 0);
    hymt_active_isa = isa;
    hymt_matmul(f, w, rows, cols, x, n, y1, 0);
    int bad = memcmp(y0, y1, sizeof(float) * n * rows) != 0;
    printf("%s %s rows=%lld cols=%lld n=%lld\n", bad ? "FAIL" : "OK", f->name, (long long)rows, (long long)cols,
           (long long)n);
    free(w);
    free(x);
    free(y0);
    free(y1);
    return bad;
}

int main(int argc, char **argv) {
    int isa = argc > 1 ? atoi(argv[1]) : hymt_best_isa();
    if (!hymt_isa_supported(isa)) {
        printf("FAIL isa %d not supported here\n", isa);
        return 1;
    }
    printf("INFO isa %d, dotprod %d\n", isa, hymt_cpu()->dotprod);
    int failures = 0;
    static const int64_t shapes[][3] = {{7, 512, 1}, {64, 1024, 3}, {33, 2048, 17}, {5, 6144, 2}};
    for (int i = 0; i < HYMT_FORMAT_COUNT; i++) {
        const hymt_format *f = hymt_formats[i].format;
        if (f->prepare == NULL) continue;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            if (shapes[s][1] % f->block_len == 0) failures += check_format(f, isa, shapes[s][0], shapes[s][1], shapes[s][2]);
    }
    /* dot: every length of §3.6 vs the scalar reference, within 1e-4 */
    static const int lengths[] = {0, 1, 3, 7, 16, 32, 127, 256, 512, 2049};
    float a[2049], b[2049];
    for (int i = 0; i < 2049; i++) a[i] = next_float(), b[i] = next_float();
    for (size_t k = 0; k < sizeof lengths / sizeof lengths[0]; k++) {
        float ref = hymt_dot_f32_scalar(a, b, lengths[k]), got = hymt_dot_f32_isa(isa, a, b, lengths[k]);
        int bad = fabsf(ref - got) > 1e-4f;
        failures += bad;
        printf("%s dot n=%d\n", bad ? "FAIL" : "OK", lengths[k]);
    }
    /* SiLU gate: the same bits as the scalar sequence, over the clamp edges and a wide range */
    static float g0[1003], g1[1003], u[1003];
    for (int i = 0; i < 1003; i++) {
        g0[i] = g1[i] = (i < 6) ? (float[]){-88.5f, -88.0f, -87.0f, 87.0f, 88.0f, 0.0f}[i] : next_float() * 40.0f;
        u[i] = next_float();
    }
    hymt_silu_mul_f32_scalar(g0, u, 1003);
    hymt_silu_mul_f32_isa(isa, g1, u, 1003);
    int silu_bad = memcmp(g0, g1, sizeof g0) != 0;
    failures += silu_bad;
    printf("%s silu gate\n", silu_bad ? "FAIL" : "OK");
    /* float path of F16 (SIMD conversion) vs scalar decode */
    uint16_t h[1000];
    for (int i = 0; i < 1000; i++) h[i] = random_scale();
    float hs[1000], hv[1000];
    hymt_decode_f16((const uint8_t *)h, hs, 1000);
    hymt_active_isa = isa;
    hymt_f16_chunk((const uint8_t *)h, hv, 1000);
    int bad = memcmp(hs, hv, sizeof hs) != 0;
    failures += bad;
    printf("%s f16 conversion\n", bad ? "FAIL" : "OK");
    return failures ? 1 : 0;
}
