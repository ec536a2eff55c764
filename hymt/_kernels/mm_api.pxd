# Declarations shared by quant.pyx (which fills the product table) and ops.pyx (which calls through it).
# Everything comes from mm_api.h (which includes hymt_common.h), so ops.pyx does not compile the format
# headers a second time.
from libc.stdint cimport int64_t, uint8_t


cdef extern from "mm_api.h" nogil:
    ctypedef void (*hymt_decode_fn)(const uint8_t *src, float *dst, int64_t nblocks)
    ctypedef void (*hymt_prepare_fn)(const float *x, int64_t cols, int64_t n, uint8_t *act)
    ctypedef struct hymt_format:
        const char *name
        int block_len
        int block_bytes
        hymt_decode_fn decode
        hymt_prepare_fn prepare

    const char *HYMT_MM_API_CAPSULE
    ctypedef struct hymt_mm_api:
        const hymt_format *(*format_by_name)(const char *name) nogil
        int (*matmul)(const hymt_format *f, const uint8_t *w, int64_t rows, int64_t cols, const float *x,
                      int64_t n, float *y, int float_path) nogil
        int (*qkv)(const hymt_format *fq, const uint8_t *wq, int64_t rq, const hymt_format *fk,
                   const uint8_t *wk, int64_t rk, const hymt_format *fv, const uint8_t *wv, int64_t rv,
                   int64_t cols, const float *x, int64_t n, float *yq, float *yk, float *yv,
                   int float_path) nogil
        int (*gate_up_silu)(const hymt_format *fg, const uint8_t *wg, const hymt_format *fu,
                            const uint8_t *wu, int64_t F, int64_t cols, const float *x, int64_t n, float *y,
                            int float_path) nogil
        const int *isa
