/* mm_api.h — the matrix-product entry points that hymt._kernels.quant hands to other extension modules.
 *
 * quant.so owns the one copy of the format kernels, the active ISA family and the thread count (static
 * globals of its translation unit). ops.so's layer driver calls the products through this table, taken
 * from the PyCapsule ``hymt._kernels.quant.mm_api()`` at import, so both run the same code and settings.
 * The callers validate shapes and byte lengths before calling, exactly as for the matmul.h functions. */
#ifndef HYMT_MM_API_H
#define HYMT_MM_API_H

#include "hymt_common.h"

#define HYMT_MM_API_CAPSULE "hymt._kernels.quant.mm_api"

typedef struct {
    /* hymt_format_by_name: NULL when the format is not registered */
    const hymt_format *(*format_by_name)(const char *name);
    /* hymt_matmul, hymt_matmul_qkv, hymt_matmul_gate_up_silu (matmul.h): 0, or -1 when scratch failed */
    int (*matmul)(const hymt_format *f, const uint8_t *w, int64_t rows, int64_t cols, const float *x,
                  int64_t n, float *y, int float_path);
    int (*qkv)(const hymt_format *fq, const uint8_t *wq, int64_t rq, const hymt_format *fk, const uint8_t *wk,
               int64_t rk, const hymt_format *fv, const uint8_t *wv, int64_t rv, int64_t cols, const float *x,
               int64_t n, float *yq, float *yk, float *yv, int float_path);
    int (*gate_up_silu)(const hymt_format *fg, const uint8_t *wg, const hymt_format *fu, const uint8_t *wu,
                        int64_t F, int64_t cols, const float *x, int64_t n, float *y, int float_path);
    /* hymt_active_isa (enum hymt_isa), so ops.so's element-wise kernels follow hymt.kernels.use_isa() */
    const int *isa;
} hymt_mm_api;

#endif /* HYMT_MM_API_H */
