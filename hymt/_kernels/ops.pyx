# cython: language_level=3
"""Thin wrappers over ops.h: validate shapes once, then run the C loop without the GIL.

Arrays are float32 (positions int64, selections int32) and C-contiguous; every wrapper checks the shapes
it relies on, so a wrong call raises ``KernelError`` instead of reading outside a buffer.
"""

from libc.stdint cimport int32_t, int64_t
from libc.string cimport memcpy

from hymt.errors import KernelError

cdef extern from "ops.h" nogil:
    void hymt_add_rmsnorm_rows(float *hidden, const float *delta, const float *w, float *out, int64_t rows,
                               int64_t d, float eps, int threads)
    void hymt_rope_freqs(float base, int64_t D, float *freqs)
    void hymt_rope(float *x, int64_t n, int64_t heads, int64_t D, const int64_t *pos, const float *freqs, int threads)
    void hymt_qk_norm_rope(float *q, float *k, int64_t n, int64_t H, int64_t K, int64_t D, const int64_t *pos,
                           const float *freqs, const float *q_norm, const float *k_norm, float eps,
                           int norm_first, int threads)
    int hymt_attention(const float *q, const float *keys, const float *values, int64_t start, int64_t n, int64_t H,
                       int64_t K, int64_t D, float *out, int threads)
    void hymt_moe_route(const float *logits, const float *bias, int64_t n, int64_t E, int64_t used, int normalize,
                        float scale, int32_t *selected, float *weights, float *scratch)

import numpy as np


def add_rmsnorm(float[:, ::1] hidden, const float[:, ::1] delta, const float[::1] weight, float eps,
                float[:, ::1] out, int threads=1):
    """hidden += delta, then out[r] = RMSNorm(hidden[r], weight) (a residual add fused with the next norm)."""
    if (hidden.shape[1] != weight.shape[0] or delta.shape[0] != hidden.shape[0]
            or delta.shape[1] != hidden.shape[1] or out.shape[0] != hidden.shape[0]
            or out.shape[1] != hidden.shape[1]):
        raise KernelError("add_rmsnorm: shape mismatch")
    if hidden.shape[0] == 0:
        return
    with nogil:
        hymt_add_rmsnorm_rows(&hidden[0, 0], &delta[0, 0], &weight[0], &out[0, 0], hidden.shape[0],
                              hidden.shape[1], eps, threads)


def rope_freqs(float base, int head_dim):
    """float32 freq_j = base^(-2j/D) for j < D/2 (head_dim must be even and positive)."""
    if head_dim <= 0 or head_dim % 2:
        raise KernelError("rope_freqs: head_dim must be positive and even")
    freqs = np.empty(head_dim // 2, dtype=np.float32)
    cdef float[::1] f = freqs
    hymt_rope_freqs(base, head_dim, &f[0])
    return freqs


def rope(float[:, :, ::1] x, const int64_t[::1] positions, const float[::1] freqs, int threads=1):
    """NeoX split-half RoPE of x[n, heads, D] in place; token t at positions[t]."""
    if x.shape[0] != positions.shape[0] or x.shape[2] != 2 * freqs.shape[0]:
        raise KernelError("rope: shape mismatch")
    if x.shape[0] == 0 or x.shape[1] == 0 or x.shape[2] == 0:
        return
    with nogil:
        hymt_rope(&x[0, 0, 0], x.shape[0], x.shape[1], x.shape[2], &positions[0], &freqs[0], threads)


def qk_norm_rope(float[:, ::1] q, float[:, ::1] k, int heads, int kv_heads, const int64_t[::1] positions,
                 const float[::1] freqs, const float[::1] q_norm, const float[::1] k_norm, float eps,
                 bint norm_first, int threads=1):
    """Per-head RMSNorm and RoPE of q[n, heads*D] and k[n, kv_heads*D] in place.

    norm_first False: RoPE then norm (hunyuan-dense); True: norm then RoPE (hy_v3).
    """
    cdef int64_t n = q.shape[0], D = 2 * freqs.shape[0]
    if (heads <= 0 or kv_heads <= 0 or D == 0 or k.shape[0] != n or positions.shape[0] != n
            or q.shape[1] != heads * D or k.shape[1] != kv_heads * D
            or q_norm.shape[0] != D or k_norm.shape[0] != D):
        raise KernelError("qk_norm_rope: shape mismatch")
    if n == 0:
        return
    with nogil:
        hymt_qk_norm_rope(&q[0, 0], &k[0, 0], n, heads, kv_heads, D, &positions[0], &freqs[0], &q_norm[0],
                          &k_norm[0], eps, norm_first, threads)


def attention(const float[:, ::1] q, const float[:, ::1] k, const float[:, ::1] v, float[:, ::1] keys,
              float[:, ::1] values, int64_t start, int heads, int kv_heads, float[:, ::1] out, int threads=1):
    """Append k/v[n, K*D] to the cache at rows start..start+n-1, then causal GQA attention of q[n, H*D].

    keys/values: [capacity, K*D] float32 caches; out: [n, H*D]. Query head t uses kv head t // (H/K).
    """
    cdef int64_t n = q.shape[0], kvw = keys.shape[1], D
    if heads <= 0 or kv_heads <= 0 or heads % kv_heads or kvw % kv_heads:
        raise KernelError("attention: invalid head counts")
    D = kvw // kv_heads
    if (D == 0 or q.shape[1] != heads * D or k.shape[0] != n or v.shape[0] != n or k.shape[1] != kvw
            or v.shape[1] != kvw or values.shape[0] != keys.shape[0] or values.shape[1] != kvw
            or out.shape[0] != n or out.shape[1] != heads * D or start < 0 or start + n > keys.shape[0]):
        raise KernelError("attention: shape mismatch")
    if n == 0:
        return
    cdef int status
    with nogil:
        memcpy(&keys[start, 0], &k[0, 0], n * kvw * sizeof(float))
        memcpy(&values[start, 0], &v[0, 0], n * kvw * sizeof(float))
        status = hymt_attention(&q[0, 0], &keys[0, 0], &values[0, 0], start, n, heads, kv_heads, D,
                                &out[0, 0], threads)
    if status:
        raise MemoryError("attention scratch")


def moe_route(const float[:, ::1] logits, const float[::1] bias, int used, bint normalize, float scale):
    """HyV3 routing of logits[n, E] -> (selected int32[n, used], weights float32[n, used]).

    Selection by sigmoid + bias descending (ties to the lower index); weights from the sigmoid alone.
    """
    cdef int64_t n = logits.shape[0], E = logits.shape[1]
    if bias.shape[0] != E or used <= 0 or used > E:
        raise KernelError("moe_route: shape mismatch")
    selected = np.empty((n, used), dtype=np.int32)
    weights = np.empty((n, used), dtype=np.float32)
    scratch = np.empty(2 * E, dtype=np.float32)
    cdef int32_t[:, ::1] s = selected
    cdef float[:, ::1] w = weights
    cdef float[::1] tmp = scratch
    if n == 0:
        return selected, weights
    with nogil:
        hymt_moe_route(&logits[0, 0], &bias[0], n, E, used, normalize, scale, &s[0, 0], &w[0, 0], &tmp[0])
    return selected, weights
