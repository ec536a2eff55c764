# cython: language_level=3
"""Thin wrappers over ops.h: validate shapes once, then run the C loop without the GIL.

Arrays are float32 (positions int64, selections int32) and C-contiguous; every wrapper checks the shapes
it relies on, so a wrong call raises ``KernelError`` instead of reading outside a buffer.
"""

from cpython.pycapsule cimport PyCapsule_GetPointer
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

from hymt._kernels.mm_api cimport HYMT_MM_API_CAPSULE, hymt_format, hymt_mm_api

from hymt.errors import KernelError

cdef extern from "ops.h" nogil:
    const int *hymt_ops_isa
    void hymt_add_rmsnorm_rows(float *hidden, const float *delta, const float *w, float *out, int64_t rows,
                               int64_t d, float eps, int threads)
    void hymt_rope_freqs(float base, int64_t D, float *freqs)
    void hymt_rope(float *x, int64_t n, int64_t heads, int64_t D, const int64_t *pos, const float *freqs, int threads)
    void hymt_qk_norm_rope(float *q, float *k, int64_t n, int64_t H, int64_t K, int64_t D, const int64_t *pos,
                           const float *freqs, const float *q_norm, const float *k_norm, float eps,
                           int norm_first, int threads)
    int hymt_attention(const float *q, const float *keys, const float *values, int64_t start, int64_t n,
                       int64_t cap, int64_t H, int64_t K, int64_t D, float *out, int threads, int isa)
    ctypedef struct hymt_attention_prep:
        float *q
        float *k
        const float *v
        float *const *key_caches
        float *const *value_caches
        const int64_t *positions
        const float *freqs
        const float *q_norm
        const float *k_norm
        float eps
        int norm_first
    int hymt_attention_segments(const float *q, const float *const *keys, const float *const *values,
                                const int64_t *starts, const int64_t *row0, const int64_t *rows,
                                const int64_t *caps, int64_t S, int64_t H, int64_t K, int64_t D, float *out,
                                int threads, int isa, const hymt_attention_prep *prep)
    void hymt_moe_route(const float *logits, const float *bias, int64_t n, int64_t E, int64_t used, int normalize,
                        float scale, int32_t *selected, float *weights, float *scratch)
    ctypedef struct hymt_moe_matrix:
        const hymt_format *f
        const uint8_t *w
    ctypedef struct hymt_moe:
        hymt_moe_matrix router
        const float *bias
        hymt_moe_matrix shared[3]
        const hymt_moe_matrix *experts
        int64_t h, E, used, M, S
        int normalize
        float scale
        int float_path
    ctypedef struct hymt_moe_scratch:
        float *logits
        int32_t *selected
        float *weights
        float *route
        int32_t *pairs
        int32_t *where
        int32_t *chosen
        int64_t *first
        float *gathered
        float *middle
        float *out
    enum: HYMT_MOE_TASK_TOKENS
    enum: HYMT_MOE_MAX_USED
    int hymt_moe_ffn(const hymt_mm_api *mm, const hymt_moe *m, const float *x, int64_t n, float *delta,
                     const hymt_moe_scratch *s, int threads)

import numpy as np

from hymt._kernels import quant as _quant

# The products of quant.so (its kernels, ISA family and thread count), for the Layer driver below.
cdef const hymt_mm_api *_mm = <const hymt_mm_api *>PyCapsule_GetPointer(_quant.mm_api(), HYMT_MM_API_CAPSULE)
# The norms and RoPE run in quant.so's active ISA family too.
hymt_ops_isa = _mm.isa


cdef int _active_isa():
    """The family quant.so has active (enum hymt_isa numbering), so hymt.kernels.use_isa() selects the
    attention variant too."""
    return _quant.ISA_NAMES.index(_quant.get_isa())


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


def attention(const float[:, ::1] q, const float[:, ::1] k, const float[:, ::1] v, float[:, :, ::1] keys,
              float[:, :, ::1] values, int64_t start, int heads, int kv_heads, float[:, ::1] out, int threads=1):
    """Append k/v[n, K*D] to the cache at positions start..start+n-1, then causal GQA attention of q[n, H*D].

    keys/values: [K, capacity, D] float32 caches (kv head major); out: [n, H*D]. Query head t uses kv head
    t // (H/K).
    """
    cdef int64_t n = q.shape[0], cap = keys.shape[1], D = keys.shape[2], t, kv
    if heads <= 0 or kv_heads <= 0 or heads % kv_heads or keys.shape[0] != kv_heads:
        raise KernelError("attention: invalid head counts")
    if (D == 0 or q.shape[1] != heads * D or k.shape[0] != n or v.shape[0] != n or k.shape[1] != kv_heads * D
            or v.shape[1] != kv_heads * D or values.shape[0] != kv_heads or values.shape[1] != cap
            or values.shape[2] != D or out.shape[0] != n or out.shape[1] != heads * D or start < 0
            or start + n > cap):
        raise KernelError("attention: shape mismatch")
    if n == 0:
        return
    cdef int status, isa = _active_isa()
    with nogil:
        for kv in range(kv_heads):
            for t in range(n):
                memcpy(&keys[kv, start + t, 0], &k[t, kv * D], D * sizeof(float))
                memcpy(&values[kv, start + t, 0], &v[t, kv * D], D * sizeof(float))
        status = hymt_attention(&q[0, 0], &keys[0, 0, 0], &values[0, 0, 0], start, n, cap, heads, kv_heads, D,
                                &out[0, 0], threads, isa)
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


# ---- one transformer block per call ----------------------------------------------------------------

cdef struct _Weight:
    const hymt_format *f
    const uint8_t *w  # row 0 of the packed [cols, rows] tensor
    int64_t rows
    int64_t cols


cdef int _weight(tuple packed, int64_t rows, int64_t cols, _Weight *out) except -1:
    """out = packed (dtype, name, data, rows, cols) from hymt.quant.packed, which checked the bytes."""
    dtype, name, data, prows, pcols = packed
    cdef const uint8_t[::1] raw = data
    if prows != rows or pcols != cols:
        raise KernelError(f"{name}: expected {cols} columns and {rows} rows, got {pcols} and {prows}")
    out.f = _mm.format_by_name(dtype.encode())
    if out.f == NULL:
        raise KernelError(f"{name}: unsupported tensor type {dtype}")
    out.w = &raw[0]
    out.rows = rows
    out.cols = cols
    return 0


cdef int _check_rows(const float[:, ::1] a, int64_t n, int64_t width, str what) except -1:
    if a.shape[0] != n or a.shape[1] != width:
        raise KernelError(f"layer: {what} must be [{n}, {width}]")
    return 0


cdef class MoEScratch:
    """The per-call buffers of the MoE FFN (``ops.h``'s hymt_moe_scratch) for a forward call over ``rows``
    tokens, allocated once and reused by every MoE block of the call. P = rows × used pair rows when the
    experts run as tasks at once (rows <= HYMT_MOE_TASK_TOKENS), else rows."""

    cdef hymt_moe_scratch s
    cdef readonly int64_t rows, hidden, experts, used, width
    cdef tuple _arrays  # owners of every pointer in s

    def __init__(self, int64_t rows, int64_t hidden, int64_t experts, int64_t used, int64_t width):
        if (rows < 1 or hidden < 1 or experts < 1 or used < 1 or used > min(experts, HYMT_MOE_MAX_USED)
                or width < 1):
            raise KernelError("moe scratch: invalid shape")
        self.rows, self.hidden, self.experts, self.used, self.width = rows, hidden, experts, used, width
        logits = np.empty((rows, experts), np.float32)  # router logits
        selected = np.empty((rows, used), np.int32)  # experts of each token, in selection order
        weights = np.empty((rows, used), np.float32)  # their weights
        route = np.empty(2 * experts, np.float32)  # moe_route's sigmoids and scores
        pairs = np.empty(rows * used, np.int32)  # (token · used + slot), grouped by expert
        where = np.empty(rows * used, np.int32)  # index in pairs of each (token, slot)
        chosen = np.empty(experts, np.int32)  # the selected experts, ascending
        first = np.empty(2 * experts + 1, np.int64)  # [E + 1] run starts, [E] fill cursors
        P = rows * used if rows <= HYMT_MOE_TASK_TOKENS else rows
        gathered = np.empty((P, hidden), np.float32)  # x rows of the experts' tokens
        middle = np.empty((rows + P, width), np.float32)  # silu(gate) × up: shared expert, then experts
        out = np.empty((P, hidden), np.float32)  # the experts' outputs
        cdef float[:, ::1] lg = logits, wt = weights, ga = gathered, mi = middle, ou = out
        cdef int32_t[:, ::1] se = selected
        cdef float[::1] ro = route
        cdef int32_t[::1] pa = pairs, wh = where, ch = chosen
        cdef int64_t[::1] fi = first
        self.s.logits, self.s.selected, self.s.weights, self.s.route = &lg[0, 0], &se[0, 0], &wt[0, 0], &ro[0]
        self.s.pairs, self.s.where, self.s.chosen, self.s.first = &pa[0], &wh[0], &ch[0], &fi[0]
        self.s.gathered, self.s.middle, self.s.out = &ga[0, 0], &mi[0, 0], &ou[0, 0]
        self._arrays = (logits, selected, weights, route, pairs, where, chosen, first, gathered, middle, out)

    cdef int check(self, const hymt_moe *m, int64_t n) except -1:
        """The buffers fit block m's experts for a call over n tokens."""
        if (self.rows != n or self.hidden != m.h or self.experts != m.E or self.used != m.used
                or self.width < m.M or self.width < m.S):
            raise KernelError(f"layer: MoE scratch must be for {n} rows, hidden {m.h}, {m.E} experts, "
                              f"{m.used} used, width >= {max(m.M, m.S)}")
        return 0


cdef struct _Block:
    # One block's kernels and vectors: what ``_block_forward`` reads, so a stack of them runs without the GIL.
    _Weight wq, wk, wv, wo, gate, up, down
    const float *attn_norm  # [h]
    const float *ffn_norm  # [h]
    const float *q_norm  # [D]
    const float *k_norm  # [D]
    const float *freqs  # [D/2]
    const hymt_moe *moe  # a HyV3 MoE block's experts (owned by its Layer), or NULL
    int64_t h, H, K, D, F
    float eps
    bint norm_first, float_path, dense


cdef int _block_ffn(const _Block *b, float *hidden, float *delta, float *x, float *ffn,
                    const hymt_moe_scratch *moe, int64_t n, int threads) noexcept nogil:
    """hidden += delta, x = RMSNorm(hidden), delta = the block's FFN of x, on checked buffers (a dense FFN's
    middle in ffn [n, F], a MoE's buffers in moe); nonzero if a kernel's scratch failed."""
    hymt_add_rmsnorm_rows(hidden, delta, b.ffn_norm, x, n, b.h, b.eps, threads)
    if b.moe != NULL:
        return hymt_moe_ffn(_mm, b.moe, x, n, delta, moe, threads)
    cdef int status = _mm.gate_up_silu(b.gate.f, b.gate.w, b.up.f, b.up.w, b.F, b.h, x, n, ffn, b.float_path)
    status |= _mm.matmul(b.down.f, b.down.w, b.h, b.F, ffn, n, delta, b.float_path)
    return status


cdef int _block_forward(const _Block *b, float *hidden, float *delta, float *x, float *q, float *k, float *v,
                        float *attended, float *ffn, const hymt_moe_scratch *moe, int64_t n,
                        const int64_t *positions, float **caches, const int64_t *segs, int64_t S, int threads,
                        int isa) noexcept nogil:
    """Layer.attention on checked buffers (ffn and moe NULL: no FFN); nonzero if a kernel's scratch failed.
    caches: [S] key then [S] value cache pointers; segs: [S] starts, [S] first rows, [S] row counts,
    [S] capacities."""
    cdef hymt_attention_prep prep
    hymt_add_rmsnorm_rows(hidden, delta, b.attn_norm, x, n, b.h, b.eps, threads)
    cdef int status = _mm.qkv(b.wq.f, b.wq.w, b.wq.rows, b.wk.f, b.wk.w, b.wk.rows, b.wv.f, b.wv.w, b.wv.rows,
                              b.h, x, n, q, k, v, b.float_path)
    prep.q, prep.k, prep.v = q, k, v
    prep.key_caches, prep.value_caches = caches, caches + S
    prep.positions, prep.freqs = positions, b.freqs
    prep.q_norm, prep.k_norm = b.q_norm, b.k_norm
    prep.eps, prep.norm_first = b.eps, b.norm_first
    status |= hymt_attention_segments(q, <const float *const *>caches, <const float *const *>(caches + S), segs,
                                      segs + S, segs + 2 * S, segs + 3 * S, S, b.H, b.K, b.D, attended, threads,
                                      isa, &prep)
    status |= _mm.matmul(b.wo.f, b.wo.w, b.h, b.H * b.D, attended, n, delta, b.float_path)
    if ffn != NULL or moe != NULL:
        status |= _block_ffn(b, hidden, delta, x, ffn, moe, n, threads)
    return status


cdef int _check_buffers(const _Block *b, float[:, ::1] hidden, float[:, ::1] delta, float[:, ::1] x,
                        float[:, ::1] q, float[:, ::1] k, float[:, ::1] v, float[:, ::1] attended,
                        const int64_t[::1] positions, const int64_t[::1] bounds, float[:, ::1] ffn,
                        MoEScratch moe) except -1:
    """The shapes ``_block_forward`` relies on (ffn and moe None: no FFN)."""
    cdef int64_t n = hidden.shape[0], S = bounds.shape[0] - 1
    _check_rows(hidden, n, b.h, "hidden")
    _check_rows(delta, n, b.h, "delta")
    _check_rows(x, n, b.h, "x")
    _check_rows(q, n, b.H * b.D, "q")
    _check_rows(k, n, b.K * b.D, "k")
    _check_rows(v, n, b.K * b.D, "v")
    _check_rows(attended, n, b.H * b.D, "attended")
    if n == 0 or S < 1 or positions.shape[0] != n or bounds[0] != 0 or bounds[S] != n:
        raise KernelError("layer: invalid segments")
    if ffn is None and moe is None:
        return 0
    if b.moe != NULL:
        if moe is None:
            raise KernelError("layer: a MoE block needs MoE scratch")
        moe.check(b.moe, n)
    elif not b.dense:
        raise KernelError("layer: no dense FFN")
    else:
        if ffn is None:
            raise KernelError("layer: a dense block needs ffn scratch")
        _check_rows(ffn, n, b.F, "ffn")
    return 0


cdef int _segment_caches(const int64_t[::1] positions, const int64_t[::1] bounds, list keys, list values,
                         int64_t K, int64_t D, float **caches, int64_t *segs) except -1:
    """caches ([S] key then [S] value cache pointers) and segs ([S] starts, first rows, row counts,
    capacities) of one layer's segments, each cache [K, capacity, D] float32 (kv head major) with room for
    its segment's rows."""
    cdef int64_t S = bounds.shape[0] - 1, s, r0, rows, start, cap
    cdef float[:, :, ::1] kc, vc
    if len(keys) != S or len(values) != S:
        raise KernelError("layer: invalid segments")
    for s in range(S):
        r0, rows = bounds[s], bounds[s + 1] - bounds[s]
        kc, vc = keys[s], values[s]
        start = positions[r0] if rows > 0 else -1
        cap = kc.shape[1]
        if (rows < 1 or start < 0 or kc.shape[0] != K or kc.shape[2] != D or vc.shape[0] != K
                or vc.shape[1] != cap or vc.shape[2] != D or start + rows > cap):
            raise KernelError("layer: invalid segments")
        caches[s], caches[S + s] = &kc[0, 0, 0], &vc[0, 0, 0]
        segs[s], segs[S + s], segs[2 * S + s], segs[3 * S + s] = start, r0, rows, cap
    return 0


cdef int _moe_matrix(tuple packed, int64_t rows, int64_t cols, hymt_moe_matrix *out) except -1:
    """out = a checked packed matrix (as ``_weight``) of an MoE block."""
    cdef _Weight w
    _weight(packed, rows, cols, &w)
    out.f, out.w = w.f, w.w
    return 0


cdef class Layer:
    """One block's weights as kernel pointers, so its attention and FFN are one call each.

    Every product goes through quant.so's entry points (the same kernels as ``hymt.quant``), in the
    order of the per-operation wrappers above, so results are bit-identical to calling them one by one.
    Weights are the tuples of ``hymt.quant.packed`` (checked once at load). ``ffn`` is a dense block's
    (gate, up, down); ``moe`` a HyV3 MoE block's (router [E, h] F32, bias [E] float32, shared (gate, up,
    down), experts [(gate, up, down)] × E, experts used, normalize, scale), the experts the slices of the
    packed 3-D tensors; with neither the block has attention only.
    """

    cdef _Block b
    cdef hymt_moe moe
    cdef hymt_moe_matrix *experts  # [E][3] gate, up, down (moe.experts)
    cdef tuple _keep  # owners of every pointer in b and moe

    def __init__(self, tuple qkv, tuple wo, tuple ffn, const float[::1] attn_norm, const float[::1] ffn_norm,
                 const float[::1] q_norm, const float[::1] k_norm, const float[::1] freqs, int heads,
                 int kv_heads, float eps, bint norm_first, bint float_path, tuple moe=None):
        cdef int64_t D = 2 * freqs.shape[0], h = attn_norm.shape[0]
        if (heads <= 0 or kv_heads <= 0 or heads % kv_heads or D == 0 or h == 0 or ffn_norm.shape[0] != h
                or q_norm.shape[0] != D or k_norm.shape[0] != D or (ffn is not None and moe is not None)):
            raise KernelError("layer: shape mismatch")
        cdef _Block *b = &self.b
        b.h, b.H, b.K, b.D, b.F = h, heads, kv_heads, D, 0
        _weight(qkv[0], heads * D, h, &b.wq)
        _weight(qkv[1], kv_heads * D, h, &b.wk)
        _weight(qkv[2], kv_heads * D, h, &b.wv)
        _weight(wo, h, heads * D, &b.wo)
        b.dense = ffn is not None
        if b.dense:
            b.F = ffn[0][3]
            _weight(ffn[0], b.F, h, &b.gate)
            _weight(ffn[1], b.F, h, &b.up)
            _weight(ffn[2], h, b.F, &b.down)
        b.attn_norm, b.ffn_norm = &attn_norm[0], &ffn_norm[0]
        b.q_norm, b.k_norm, b.freqs = &q_norm[0], &k_norm[0], &freqs[0]
        b.eps, b.norm_first, b.float_path = eps, norm_first, float_path
        b.moe = NULL
        if moe is not None:
            self._set_moe(moe, h, float_path)
            b.moe = &self.moe
        self._keep = (qkv, wo, ffn, attn_norm, ffn_norm, q_norm, k_norm, freqs, moe)

    cdef int _set_moe(self, tuple moe, int64_t h, bint float_path) except -1:
        router, bias, shared, experts, used, normalize, scale = moe
        cdef const float[::1] bias_v = bias
        cdef int64_t E = len(experts), e, M, S
        cdef hymt_moe *m = &self.moe
        if (E < 1 or bias_v.shape[0] != E or not 0 < used <= min(E, HYMT_MOE_MAX_USED) or not scale > 0
                or len(shared) != 3):
            raise KernelError("layer: invalid experts")
        S, M = shared[0][3], experts[0][0][3]
        _moe_matrix(router, E, h, &m.router)
        _moe_matrix(shared[0], S, h, &m.shared[0])
        _moe_matrix(shared[1], S, h, &m.shared[1])
        _moe_matrix(shared[2], h, S, &m.shared[2])
        free(self.experts)
        self.experts = <hymt_moe_matrix *>malloc(3 * E * sizeof(hymt_moe_matrix))
        if self.experts == NULL:
            raise MemoryError("layer experts")
        for e in range(E):
            if len(experts[e]) != 3:
                raise KernelError("layer: invalid experts")
            _moe_matrix(experts[e][0], M, h, &self.experts[3 * e])
            _moe_matrix(experts[e][1], M, h, &self.experts[3 * e + 1])
            _moe_matrix(experts[e][2], h, M, &self.experts[3 * e + 2])
        m.bias, m.experts = &bias_v[0], self.experts
        m.h, m.E, m.used, m.M, m.S = h, E, used, M, S
        m.normalize, m.scale, m.float_path = normalize, scale, float_path
        return 0

    def __dealloc__(self):
        free(self.experts)

    def attention(self, float[:, ::1] hidden, float[:, ::1] delta, float[:, ::1] x, float[:, ::1] q,
                  float[:, ::1] k, float[:, ::1] v, float[:, ::1] attended, const int64_t[::1] positions,
                  const int64_t[::1] bounds, list keys, list values, int threads=1, float[:, ::1] ffn=None,
                  MoEScratch moe=None):
        """hidden += delta; x = RMSNorm(hidden); delta = W_o · attention(x) over N batch rows.

        hidden, delta, x: [N, h]; scratch q, attended: [N, H*D]; k, v: [N, K*D]; positions: [N].
        Segment s (one session) holds rows bounds[s]..bounds[s+1]-1 (bounds: [S+1] from 0 to N); its rows
        are appended to keys[s] / values[s] ([K, capacity, D] float32, kv head major) from position
        positions[bounds[s]] on.
        With ffn ([N, F] scratch) or moe (an N-row MoEScratch) the block's FFN follows in the same call (as
        ``dense_ffn`` / ``moe_ffn``; a dense block needs ffn, a MoE block moe): one call per layer.
        """
        run_layers([self], hidden, delta, x, q, k, v, attended, positions, bounds, [keys], [values], threads,
                   ffn, moe)

    def dense_ffn(self, float[:, ::1] hidden, float[:, ::1] delta, float[:, ::1] x, float[:, ::1] ffn,
                  int threads=1):
        """hidden += delta; x = RMSNorm(hidden); delta = down(silu(gate·x) × (up·x)).

        ffn: [N, F] scratch for the middle activations.
        """
        cdef int64_t n = hidden.shape[0]
        if not self.b.dense:
            raise KernelError("layer: no dense FFN")
        _check_rows(hidden, n, self.b.h, "hidden")
        _check_rows(delta, n, self.b.h, "delta")
        _check_rows(x, n, self.b.h, "x")
        _check_rows(ffn, n, self.b.F, "ffn")
        if n == 0:
            return
        cdef int status
        with nogil:
            status = _block_ffn(&self.b, &hidden[0, 0], &delta[0, 0], &x[0, 0], &ffn[0, 0], NULL, n, threads)
        if status:
            raise MemoryError("kernel scratch allocation failed")

    def moe_ffn(self, float[:, ::1] hidden, float[:, ::1] delta, float[:, ::1] x, MoEScratch moe,
                int threads=1):
        """hidden += delta; x = RMSNorm(hidden); delta = shared expert(x) + Σ_e w_e · expert_e(x) (§4.4).

        Experts ascending, each over its tokens (ascending) gathered from x; moe: an N-row MoEScratch.
        """
        cdef int64_t n = hidden.shape[0]
        if self.b.moe == NULL:
            raise KernelError("layer: no experts")
        _check_rows(hidden, n, self.b.h, "hidden")
        _check_rows(delta, n, self.b.h, "delta")
        _check_rows(x, n, self.b.h, "x")
        moe.check(self.b.moe, n)
        cdef int status
        with nogil:
            status = _block_ffn(&self.b, &hidden[0, 0], &delta[0, 0], &x[0, 0], NULL, &moe.s, n, threads)
        if status:
            raise MemoryError("kernel scratch allocation failed")


cdef bint _all_finite(const float *a, int64_t count) noexcept nogil:
    """No NaN or infinity among a[0..count): the largest |a| bit pattern below the infinity's (a max
    reduction the compiler vectorizes; ~10 µs over a 120k-entry logit row)."""
    cdef const uint32_t *bits = <const uint32_t *>a
    cdef uint32_t top = 0, m
    cdef int64_t i
    for i in range(count):
        m = bits[i] & 0x7fffffff
        top = m if m > top else top
    return top < 0x7f800000


def run_layers(list layers, float[:, ::1] hidden, float[:, ::1] delta, float[:, ::1] x, float[:, ::1] q,
               float[:, ::1] k, float[:, ::1] v, float[:, ::1] attended, const int64_t[::1] positions,
               const int64_t[::1] bounds, list keys, list values, int threads=1, float[:, ::1] ffn=None,
               MoEScratch moe=None, tuple head=None):
    """``Layer.attention`` of each of ``layers`` in order, in one call without the GIL.

    keys[l] / values[l] are layer l's per-segment caches (as ``Layer.attention``'s keys / values); with ffn
    or moe every layer runs its FFN too (dense layers need ffn, MoE layers moe). Nothing returns to Python
    between layers, so the kernels' threads go from one layer to the next without idling through
    interpreter work (an OpenMP worker that waits longer than its spin falls asleep, and waking it costs
    tens of µs on this kind of VM); the results are those of the per-layer calls, bit for bit.

    head (output weight as ``hymt.quant.packed``, output norm [h], logits [N, vocab]): then the output head
    of every row follows in the same call — hidden += delta, x = RMSNorm(hidden) (the last layer's eps),
    logits = x · Wᵀ (its float_path) — the same kernels as ``add_rmsnorm`` and ``quant.matmul``, so the
    same bits; returns whether every logit is finite (else None). Why: a decode step spent ~0.2 ms of
    cold-cache Python between the layers and the head and in np.isfinite after it (1.8B 1.25Bit,
    one session, 2 threads: row gather + add_rmsnorm 94 µs, isfinite 125 µs of a 19 ms step).
    """
    cdef int64_t L = len(layers), S = bounds.shape[0] - 1, n = hidden.shape[0], l
    cdef Layer layer
    cdef _Weight out_w
    cdef const float[::1] out_norm
    cdef float[:, ::1] logits
    cdef bint finite = True, has_head = head is not None
    if L == 0 or len(keys) != L or len(values) != L:
        raise KernelError("layers: one key and one value cache list per layer")
    if has_head:
        if len(head) != 3:
            raise KernelError("layers: head must be (weight, norm, logits)")
        layer = layers[L - 1]
        out_norm, logits = head[1], head[2]
        _weight(head[0], head[0][3], layer.b.h, &out_w)
        if out_norm.shape[0] != layer.b.h:
            raise KernelError("layers: output norm shape mismatch")
        _check_rows(logits, n, out_w.rows, "logits")
    # blocks: [L] block pointers (the Layer objects stay alive in ``layers``); caches: [L][2S] cache pointers;
    # segs: [L][4S] starts, first rows, row counts, capacities (checked per layer's caches)
    cdef const _Block **blocks = <const _Block **>malloc(L * sizeof(_Block *))
    cdef float **caches = <float **>malloc(L * 2 * S * sizeof(float *))
    cdef int64_t *segs = <int64_t *>malloc(L * 4 * S * sizeof(int64_t))
    cdef int status = 0, isa = _active_isa()
    cdef float *ffn_ptr = NULL
    cdef const hymt_moe_scratch *moe_ptr = NULL
    try:
        if blocks == NULL or caches == NULL or segs == NULL:
            raise MemoryError("layer cache pointers")
        for l in range(L):
            layer = layers[l]
            _check_buffers(&layer.b, hidden, delta, x, q, k, v, attended, positions, bounds, ffn, moe)
            _segment_caches(positions, bounds, keys[l], values[l], layer.b.K, layer.b.D, caches + 2 * S * l,
                            segs + 4 * S * l)
            blocks[l] = &layer.b
        if ffn is not None:
            ffn_ptr = &ffn[0, 0]
        if moe is not None:
            moe_ptr = &moe.s
        with nogil:
            for l in range(L):
                status |= _block_forward(blocks[l], &hidden[0, 0], &delta[0, 0], &x[0, 0], &q[0, 0], &k[0, 0],
                                         &v[0, 0], &attended[0, 0], ffn_ptr, moe_ptr, n, &positions[0],
                                         caches + 2 * S * l, segs + 4 * S * l, S, threads, isa)
            if has_head and status == 0:
                hymt_add_rmsnorm_rows(&hidden[0, 0], &delta[0, 0], &out_norm[0], &x[0, 0], n, out_w.cols,
                                      blocks[L - 1].eps, threads)
                status = _mm.matmul(out_w.f, out_w.w, out_w.rows, out_w.cols, &x[0, 0], n, &logits[0, 0],
                                    blocks[L - 1].float_path)
                finite = _all_finite(&logits[0, 0], n * out_w.rows)
    finally:
        free(blocks)
        free(caches)
        free(segs)
    if status:
        raise MemoryError("kernel scratch allocation failed")
    if has_head:
        return finite
