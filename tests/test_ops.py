"""hymt._kernels.ops against float64 numpy written here, plus the §12.5 graph scenarios."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hymt import kernels
from hymt._kernels import ops
from hymt.errors import KernelError

RNG = np.random.default_rng(1234)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def ref_rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    return x64 / np.sqrt((x64**2).mean(axis=-1, keepdims=True) + eps) * w


def ref_rope(x: np.ndarray, positions: np.ndarray, freqs: np.ndarray) -> np.ndarray:
    """x[n, heads, D] NeoX split-half rotation in float64."""
    half = x.shape[-1] // 2
    angle = positions.astype(np.float64)[:, None, None] * freqs.astype(np.float64)[None, None, :]
    a, b = x[..., :half].astype(np.float64), x[..., half:].astype(np.float64)
    return np.concatenate([a * np.cos(angle) - b * np.sin(angle), a * np.sin(angle) + b * np.cos(angle)], -1)


def ref_attention(q, keys, values, start, heads, kv_heads):
    """q[n, H, D], keys/values[start + n, K, D] → [n, H, D] causal GQA in float64 (position-major rows: pass
    a kernel cache [K, cap, D] as ``by_position(cache)``)."""
    n, _, D = q.shape
    out = np.zeros(q.shape)
    for t in range(n):
        for h in range(heads):
            kv = h // (heads // kv_heads)
            s = keys[: start + t + 1, kv].astype(np.float64) @ q[t, h].astype(np.float64) / math.sqrt(D)
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ values[: start + t + 1, kv].astype(np.float64)
    return out


def by_position(cache: np.ndarray) -> np.ndarray:
    """A kv-head-major cache [K, cap, D] viewed as position rows [cap, K, D]."""
    return cache.transpose(1, 0, 2)


def test_add_rmsnorm_matches_float64():
    hidden, delta, w = rand(5, 300), rand(5, 300), rand(300)
    expected_hidden = hidden + delta  # float32 add, as specified
    out = np.empty_like(hidden)
    ops.add_rmsnorm(hidden, delta, w, 1e-5, out)
    np.testing.assert_array_equal(hidden, expected_hidden)
    np.testing.assert_allclose(out, ref_rmsnorm(expected_hidden, w, 1e-5), rtol=2e-6, atol=2e-6)


def f32_rmsnorm_sequence(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """ops.h's float32 RMSNorm sequence, step by step in numpy float32: 8 lane sums of squares (lane l
    adds i % 8 == l in i order, the d % 8 tail into lanes 0..), combined ((0+4)+(2+6))+((1+5)+(3+7))."""
    x = x.astype(np.float32)
    d = x.shape[-1]
    lanes = np.zeros(x.shape[:-1] + (8,), np.float32)
    for i0 in range(0, d - d % 8, 8):
        lanes += x[..., i0 : i0 + 8] * x[..., i0 : i0 + 8]
    tail = d % 8
    if tail:
        lanes[..., :tail] += x[..., d - tail :] * x[..., d - tail :]
    s = [lanes[..., k] for k in range(8)]
    total = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]))
    inv = np.float32(1) / np.sqrt(total / np.float32(d) + np.float32(eps))
    return x * inv[..., None] * w


@pytest.mark.parametrize("rows, d", [(1, 2048), (7, 300), (9, 13), (4, 8)])
def test_add_rmsnorm_is_the_documented_float32_sequence_in_every_family(rows, d):
    """Bit for bit the sequence written in ops.h (residual add, 8-lane sum of squares, scale) on every
    kernel family and thread count: row blocks of 4 and a tail, d with and without a tail past 8 lanes."""
    hidden, delta, w = 4 * rand(rows, d), rand(rows, d), rand(d)
    expected_hidden = hidden + delta
    expected = f32_rmsnorm_sequence(expected_hidden, w, 1e-6)
    for family in kernels.supported_isas():
        with kernels.use_isa(family):
            for threads in (1, 2):
                h, out = hidden.copy(), np.empty_like(hidden)
                ops.add_rmsnorm(h, delta, w, 1e-6, out, threads)
                np.testing.assert_array_equal(h, expected_hidden)
                np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("n, H, K, D", [(5, 16, 4, 128), (3, 5, 1, 40), (2, 3, 3, 12), (2, 2, 1, 600)])
def test_qk_norm_rope_and_rope_same_bits_in_every_family(n, H, K, D):
    """Per-head norms (blocks of 4 heads and a tail) and RoPE (16-lane steps, a tail, chunks of 256 pairs
    for D = 600) give the same bits on every kernel family and thread count as on the reference (accuracy
    against float64: the tests above)."""
    q, k = rand(n, H * D), rand(n, K * D)
    qw, kw = rand(D), rand(D)
    positions = np.array([3, 70000, 12, 5, 900][:n], np.int64)
    freqs = ops.rope_freqs(10000.0, D)
    results = []
    for family in kernels.supported_isas():
        with kernels.use_isa(family):
            for norm_first in (False, True):
                for threads in (1, 2):
                    qq, kk = q.copy(), k.copy()
                    ops.qk_norm_rope(qq, kk, H, K, positions, freqs, qw, kw, 1e-6, norm_first, threads)
                    x = q.reshape(n, H, D).copy()
                    ops.rope(x, positions, freqs, threads)
                    results.append((family, norm_first, qq, kk, x))
    for family, norm_first, qq, kk, x in results:
        first = next(r for r in results if r[1] == norm_first)
        np.testing.assert_array_equal(qq, first[2], err_msg=family)
        np.testing.assert_array_equal(kk, first[3], err_msg=family)
        np.testing.assert_array_equal(x, first[4], err_msg=family)


def test_add_rmsnorm_rejects_bad_shapes():
    with pytest.raises(KernelError):
        ops.add_rmsnorm(rand(2, 4), rand(2, 4), rand(3), 1e-5, np.empty((2, 4), np.float32))


def test_rope_freqs_are_float32_powers():
    freqs = ops.rope_freqs(11158840.0, 128)
    expected = np.float32(11158840.0) ** (-(2.0 * np.arange(64)) / 128)
    np.testing.assert_allclose(freqs, expected, rtol=3e-7)
    with pytest.raises(KernelError):
        ops.rope_freqs(10000.0, 3)


def test_rotary_pairs_halves_not_neighbors():
    x = np.array([[[1, 0, 0, 0]]], np.float32)
    ops.rope(x, np.array([1], np.int64), np.array([math.pi / 2, 1], np.float32))
    assert abs(x[0, 0, 0]) < 1e-6
    assert x[0, 0, 1] == 0
    assert abs(x[0, 0, 2] - 1) < 1e-6


def test_rope_matches_float64():
    x = rand(3, 4, 16)
    positions = np.array([0, 7, 300], np.int64)
    freqs = ops.rope_freqs(10000.0, 16)
    expected = ref_rope(x, positions, freqs)
    ops.rope(x, positions, freqs)
    np.testing.assert_allclose(x, expected, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_qk_norm_rope_order(norm_first):
    n, H, K, D = 3, 4, 2, 8
    q, k = rand(n, H * D), rand(n, K * D)
    qw, kw = rand(D), rand(D)
    positions = np.array([2, 3, 4], np.int64)
    freqs = ops.rope_freqs(10000.0, D)

    def ref(x, heads, w):
        x = x.reshape(n, heads, D)
        if norm_first:
            return ref_rope(ref_rmsnorm(x, w, 1e-5), positions, freqs)
        return ref_rmsnorm(ref_rope(x, positions, freqs), w, 1e-5)

    eq, ek = ref(q, H, qw), ref(k, K, kw)
    ops.qk_norm_rope(q, k, H, K, positions, freqs, qw, kw, 1e-5, norm_first)
    np.testing.assert_allclose(q.reshape(n, H, D), eq, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(k.reshape(n, K, D), ek, rtol=1e-5, atol=1e-5)


def test_qk_orders_differ():
    """With a non-uniform norm weight RoPE and per-head RMSNorm do not commute: the order is observable."""
    n, H, D = 2, 2, 8
    q0, w = rand(n, H * D), rand(D)
    positions, freqs = np.array([3, 4], np.int64), ops.rope_freqs(10000.0, D)
    results = []
    for norm_first in (False, True):
        q, k = q0.copy(), rand(n, D)
        ops.qk_norm_rope(q, k, H, 1, positions, freqs, w, w, 1e-5, norm_first)
        results.append(q)
    assert np.abs(results[0] - results[1]).max() > 1e-2


def test_causal_attention_does_not_see_future_values():
    H, K, D = 2, 1, 2
    q = np.ones((2, H * D), np.float32)
    k = np.zeros((2, K * D), np.float32)
    v = np.array([[2, 4], [100, 200]], np.float32)
    keys, values = np.zeros((K, 4, D), np.float32), np.zeros((K, 4, D), np.float32)
    out = np.empty((2, H * D), np.float32)
    ops.attention(q, k, v, keys, values, 0, H, K, out)
    np.testing.assert_array_equal(out[0], [2, 4, 2, 4])
    np.testing.assert_array_equal(out[1], [51, 102, 51, 102])
    # one token at a time over the cache gives the same
    keys[:] = values[:] = 0
    for t in range(2):
        one = np.empty((1, H * D), np.float32)
        ops.attention(q[t : t + 1], k[t : t + 1], v[t : t + 1], keys, values, t, H, K, one)
        np.testing.assert_array_equal(one[0], out[t])


def test_attention_matches_float64_gqa():
    n, start, H, K, D = 5, 6, 8, 2, 16
    cache_k, cache_v = rand(K, 16, D), rand(K, 16, D)
    q, k, v = rand(n, H * D), rand(n, K * D), rand(n, K * D)
    out = np.empty((n, H * D), np.float32)
    ops.attention(q, k, v, cache_k, cache_v, start, H, K, out)
    np.testing.assert_array_equal(by_position(cache_k)[start : start + n], k.reshape(n, K, D))
    np.testing.assert_array_equal(by_position(cache_v)[start : start + n], v.reshape(n, K, D))
    expected = ref_attention(q.reshape(n, H, D), by_position(cache_k), by_position(cache_v), start, H, K)
    np.testing.assert_allclose(out.reshape(n, H, D), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("D", [128, 40])
def test_attention_online_softmax_every_family_and_any_split(D):
    """Prompts longer than a key tile and a query block (online softmax over tiles, tokens sharing tiles),
    D with and without a tail past the 16 lanes: within 1e-5 of float64 on every kernel family, the same
    bits on all of them, and a token gets the same bits whether its prompt runs in one call, in uneven
    chunks or one token at a time (a score scale of 4 makes later tiles raise the running max)."""
    n, start, H, K = 45, 30, 8, 2
    cache_k, cache_v = rand(K, 96, D), rand(K, 96, D)
    q, k, v = 4 * rand(n, H * D), rand(n, K * D), rand(n, K * D)
    expected = ref_attention(
        q.reshape(n, H, D), np.concatenate([by_position(cache_k)[:start], k.reshape(n, K, D)]),
        np.concatenate([by_position(cache_v)[:start], v.reshape(n, K, D)]), start, H, K,
    )  # fmt: skip
    results = []
    for family in kernels.supported_isas():
        with kernels.use_isa(family):
            for chunks, threads in (([n], 2), ([1] * n, 1), ([5, 3, 17, 1, 19], 2)):
                keys, values = cache_k.copy(), cache_v.copy()
                out = np.empty((n, H * D), np.float32)
                t = 0
                for c in chunks:
                    ops.attention(q[t : t + c], k[t : t + c], v[t : t + c], keys, values, start + t, H, K,
                                  out[t : t + c], threads)  # fmt: skip
                    t += c
                results.append(out)
    np.testing.assert_allclose(results[0].reshape(n, H, D), expected, rtol=1e-5, atol=1e-5)
    for other in results[1:]:
        np.testing.assert_array_equal(other, results[0])


def test_attention_rejects_overflowing_cache():
    """Caches are [K, capacity, D] and C-contiguous (the kernel steps capacity·D floats from one kv head to
    the next): a write past the capacity, a cache of another shape or a strided view never reaches C."""
    q, k = rand(2, 4), rand(2, 2)
    out = np.empty((2, 4), np.float32)
    keys = np.zeros((1, 2, 2), np.float32)
    with pytest.raises(KernelError):
        ops.attention(q, k, k, keys, keys.copy(), 1, 2, 1, out)
    fits = np.zeros((1, 3, 2), np.float32)
    ops.attention(q, k, k, fits, fits.copy(), 1, 2, 1, out)
    for wrong in ((2, 3, 1), (1, 4, 2), (1, 3, 4)):  # kv heads, capacity, head size unlike the keys'
        with pytest.raises(KernelError):
            ops.attention(q, k, k, fits, np.zeros(wrong, np.float32), 1, 2, 1, out)
    with pytest.raises(KernelError):  # two kv heads of one dim: k says one head of two
        ops.attention(q, k, k, np.zeros((2, 3, 1), np.float32), np.zeros((2, 3, 1), np.float32), 1, 2, 1, out)
    big = np.zeros((2, 8, 1), np.float32)
    with pytest.raises(ValueError):  # a view whose two kv heads lie 8 positions apart, not its capacity 3
        ops.attention(q, k, k, big[:, :3], big[:, :3].copy(), 1, 2, 2, out)
    with pytest.raises(ValueError):  # the old position-major [capacity, K*D] layout
        ops.attention(q, k, k, np.zeros((3, 2), np.float32), np.zeros((3, 2), np.float32), 1, 2, 1, out)


def test_ops_independent_of_thread_count():
    n, start, H, K, D = 7, 300, 16, 4, 128
    cache = rand(K, 512, D), rand(K, 512, D)
    q, k, v = rand(n, H * D), rand(n, K * D), rand(n, K * D)
    freqs = ops.rope_freqs(11158840.0, D)
    positions = np.arange(start, start + n, dtype=np.int64)
    norm_w, out_w = rand(D), rand(H * D)
    results = []
    for threads in (1, 2, 4):
        keys, values = cache[0].copy(), cache[1].copy()
        qq, kk = q.copy(), k.copy()
        ops.qk_norm_rope(qq, kk, H, K, positions, freqs, norm_w, norm_w, 1e-5, False, threads)
        out = np.empty((n, H * D), np.float32)
        ops.attention(qq, kk, v, keys, values, start, H, K, out, threads)
        norm = np.empty((n, H * D), np.float32)
        ops.add_rmsnorm(out, np.zeros_like(out), out_w, 1e-5, norm, threads)
        results.append(norm)
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], results[2])


def ref_route(logits, bias, used, normalize, scale):
    sig = 1 / (1 + np.exp(-logits.astype(np.float64)))
    score = sig + bias
    order = sorted(range(len(score)), key=lambda e: (-score[e], e))[:used]
    w = sig[order]
    w = w / max(w.sum(), 6.103515625e-5) * scale if normalize else w * scale
    return order, w


def test_routing_bias_changes_selection_not_weights():
    logits = np.array([[0, 2, -2]], np.float32)
    selected, weights = ops.moe_route(logits, np.array([0, 0, 10], np.float32), 2, True, 2.826)
    assert selected[0].tolist() == [2, 1]
    assert abs(float(weights[0].sum()) - 2.826) < 1e-5
    assert weights[0, 0] < weights[0, 1]
    sig = 1 / (1 + np.exp(-np.array([-2.0, 2.0])))
    np.testing.assert_allclose(weights[0], sig / sig.sum() * 2.826, rtol=1e-6)


def test_routing_matches_float64_with_ties_and_flags():
    logits = rand(6, 16) * 3
    logits[0] = -1.0
    logits[0, 3] = logits[0, 9] = 2.0  # tie: lower index first
    bias = rand(16) * 0.1
    bias[3] = bias[9] = 0.0
    for normalize in (True, False):
        selected, weights = ops.moe_route(logits, bias, 4, normalize, 2.5)
        for t in range(6):
            order, w = ref_route(logits[t], bias.astype(np.float64), 4, normalize, 2.5)
            assert selected[t].tolist() == order
            np.testing.assert_allclose(weights[t], w, rtol=1e-6)
    assert selected[0].tolist()[:2] == [3, 9]


def test_routing_floor_and_non_finite_logits_stay_valid():
    logits = np.full((1, 4), -12.0, np.float32)  # tiny sigmoids: the fp16 floor applies
    _, weights = ops.moe_route(logits, np.zeros(4, np.float32), 2, True, 1.0)
    sig = 1 / (1 + math.exp(12.0))
    np.testing.assert_allclose(weights[0], [sig / 6.103515625e-5] * 2, rtol=1e-5)
    nan = np.full((1, 4), np.nan, np.float32)
    selected, _ = ops.moe_route(nan, np.zeros(4, np.float32), 3, True, 1.0)
    assert sorted(selected[0].tolist()) == [0, 1, 2]


# ---- ops.Layer: a whole dense block in two calls ------------------------------------------------------


class _F32Weight:
    """A [cols, rows] F32 matrix in the shape hymt.quant.packed reads."""

    def __init__(self, name: str, matrix: np.ndarray) -> None:
        self.name, self.dtype = name, "F32"
        self.dimensions = (matrix.shape[1], matrix.shape[0])
        self.data = np.ascontiguousarray(matrix, dtype=np.float32).view(np.uint8).reshape(-1)


def _dense_layer(h=64, H=4, K=2, D=16, F=96):
    from hymt import quant

    w = {n: rand(*shape) * 0.2 for n, shape in
         (("q", (H * D, h)), ("k", (K * D, h)), ("v", (K * D, h)), ("o", (h, H * D)), ("gate", (F, h)),
          ("up", (F, h)), ("down", (h, F)))}  # fmt: skip
    norms = {n: 1.0 + 0.1 * rand(size) for n, size in (("attn", h), ("ffn", h), ("q", D), ("k", D))}
    freqs = ops.rope_freqs(10000.0, D)
    packed = {n: quant.packed(_F32Weight(n, m)) for n, m in w.items()}
    layer = ops.Layer(
        (packed["q"], packed["k"], packed["v"]), packed["o"], (packed["gate"], packed["up"], packed["down"]),
        norms["attn"], norms["ffn"], norms["q"], norms["k"], freqs, H, K, 1e-5, False, True,
    )  # fmt: skip
    return layer, w, norms, freqs


def test_layer_matches_float64_dense_block():
    h, H, K, D, F, eps = 64, 4, 2, 16, 96, 1e-5
    layer, w, norms, freqs = _dense_layer(h, H, K, D, F)
    past, n = 5, 3  # one session: 5 cached positions, then 3 new tokens
    keys, values = np.zeros((K, 16, D), np.float32), np.zeros((K, 16, D), np.float32)
    keys[:, :past], values[:, :past] = rand(K, past, D), rand(K, past, D)
    hidden, delta = rand(n, h), rand(n, h)
    residual = (hidden.astype(np.float64) + delta).astype(np.float32)
    x, q, k, v, attended = (np.empty((n, c), np.float32) for c in (h, H * D, K * D, K * D, H * D))
    positions = np.arange(past, past + n, dtype=np.int64)
    layer.attention(hidden, delta, x, q, k, v, attended, positions, np.array([0, n], np.int64), [keys],
                    [values], 2)  # fmt: skip
    # float64 reference: norm, projections, RoPE then per-head norm, causal GQA, output projection
    xr = ref_rmsnorm(residual, norms["attn"], eps)
    qr = ref_rope((xr @ w["q"].T).reshape(n, H, D), positions, freqs)
    kr = ref_rope((xr @ w["k"].T).reshape(n, K, D), positions, freqs)
    qr, kr = ref_rmsnorm(qr, norms["q"], eps), ref_rmsnorm(kr, norms["k"], eps)
    vr = (xr @ w["v"].T).reshape(n, K, D)
    kc = np.concatenate([by_position(keys)[:past], kr])
    vc = np.concatenate([by_position(values)[:past], vr])
    ar = ref_attention(qr, kc, vc, past, H, K).reshape(n, H * D)
    np.testing.assert_array_equal(hidden, residual)
    np.testing.assert_allclose(by_position(keys)[past : past + n], kr, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(by_position(values)[past : past + n], vr, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(delta, ar @ w["o"].T, rtol=1e-3, atol=1e-3)
    after = (hidden.astype(np.float64) + delta).astype(np.float32)
    ffn = np.empty((n, F), np.float32)
    layer.dense_ffn(hidden, delta, x, ffn, 2)
    xf = ref_rmsnorm(after, norms["ffn"], eps)
    g, u = xf @ w["gate"].T, xf @ w["up"].T
    np.testing.assert_allclose(delta, (g / (1 + np.exp(-g)) * u) @ w["down"].T, rtol=1e-3, atol=1e-3)


def test_layer_rejects_bad_segments_and_shapes():
    h, H, K, D = 64, 4, 2, 16
    layer, *_ = _dense_layer(h, H, K, D)
    n = 2
    bufs = [np.zeros((n, c), np.float32) for c in (h, h, h, H * D, K * D, K * D, H * D)]
    positions = np.arange(6, 8, dtype=np.int64)
    small = np.zeros((K, 7, D), np.float32)  # positions 6..7 do not fit
    with pytest.raises(KernelError):
        layer.attention(*bufs, positions, np.array([0, n], np.int64), [small], [small.copy()])
    fits = np.zeros((K, 8, D), np.float32)
    for wrong in ((K + 1, 8, D), (K, 9, D), (K, 8, D + 1)):  # values unlike the keys
        with pytest.raises(KernelError):
            layer.attention(
                *bufs, positions, np.array([0, n], np.int64), [fits], [np.zeros(wrong, np.float32)]
            )
    for wrong in ((K + 1, 8, D), (K - 1, 8, D), (K, 8, D + 1)):  # both unlike the layer's kv heads
        with pytest.raises(KernelError):
            layer.attention(*bufs, positions, np.array([0, n], np.int64), [np.zeros(wrong, np.float32)],
                            [np.zeros(wrong, np.float32)])  # fmt: skip
    big = np.zeros((K, 16, D), np.float32)
    with pytest.raises(ValueError):  # a strided view: its kv heads lie 16 positions apart, not 8
        layer.attention(*bufs, positions, np.array([0, n], np.int64), [big[:, :8]], [big[:, :8].copy()])
    with pytest.raises(ValueError):  # the old position-major [capacity, K*D] layout
        layer.attention(*bufs, positions, np.array([0, n], np.int64), [np.zeros((8, K * D), np.float32)],
                        [np.zeros((8, K * D), np.float32)])  # fmt: skip
    for bounds in ([0, 1], [0, 3], [1, 2], [0, 2, 2]):
        with pytest.raises(KernelError):
            layer.attention(*bufs, positions, np.array(bounds, np.int64), [fits] * (len(bounds) - 1),
                            [fits.copy()] * (len(bounds) - 1))  # fmt: skip
    with pytest.raises(KernelError):
        layer.attention(*bufs[:3], np.zeros((n, H * D + 1), np.float32), *bufs[4:], positions,
                        np.array([0, n], np.int64), [fits], [fits.copy()])  # fmt: skip
    with pytest.raises(KernelError):
        layer.dense_ffn(*bufs[:3], np.zeros((n, 5), np.float32))


def test_layer_attention_of_several_sessions_equals_each_alone():
    """Several sessions' attention runs in one parallel region (tasks over every segment's tokens); each
    token must get exactly what it gets alone, on one thread."""
    h, H, K, D = 64, 16, 4, 128
    layer, *_ = _dense_layer(h, H, K, D, 96)
    sessions = [(100, 1), (37, 3), (260, 1), (5, 2)]  # (cached positions, new tokens): work crosses 2^17
    caches = [(rand(K, 300, D), rand(K, 300, D)) for _ in sessions]
    n = sum(rows for _, rows in sessions)
    hidden, delta = rand(n, h), rand(n, h)
    bounds = np.cumsum([0] + [rows for _, rows in sessions]).astype(np.int64)
    positions = np.concatenate([np.arange(p, p + rows) for p, rows in sessions]).astype(np.int64)

    def run(rows: slice, segs: list[int], threads: int) -> tuple[np.ndarray, np.ndarray]:
        m = rows.stop - rows.start
        hid, dl = hidden[rows].copy(), delta[rows].copy()
        x, q, k, v, att = (np.empty((m, c), np.float32) for c in (h, H * D, K * D, K * D, H * D))
        keys = [caches[s][0].copy() for s in segs]
        values = [caches[s][1].copy() for s in segs]
        b = (bounds[segs[0] : segs[-1] + 2] - bounds[segs[0]]).astype(np.int64)
        layer.attention(hid, dl, x, q, k, v, att, positions[rows], b, keys, values, threads)
        return att, dl

    together, together_delta = run(slice(0, n), list(range(len(sessions))), 2)
    for s in range(len(sessions)):
        alone, alone_delta = run(slice(int(bounds[s]), int(bounds[s + 1])), [s], 1)
        np.testing.assert_array_equal(together[bounds[s] : bounds[s + 1]], alone)
        np.testing.assert_array_equal(together_delta[bounds[s] : bounds[s + 1]], alone_delta)


def test_layer_prepares_decode_heads_in_tasks_as_in_one_pass():
    """Segments of at most 4 tokens have their q/k heads normed, rotated and appended inside the attention
    tasks; a batch with a longer segment does that in one pass first. Both must give the same bits and
    the same cache rows (test_layer_matches_float64_dense_block checks the values against float64)."""
    h, H, K, D = 64, 16, 4, 128
    layer, _, norms, freqs = _dense_layer(h, H, K, D, 96)
    sessions = [(100, 1), (37, 3), (260, 1), (5, 9)]  # the last one (9 tokens) forces the one-pass path
    caches = [(rand(K, 300, D), rand(K, 300, D)) for _ in sessions]
    bounds = np.cumsum([0] + [rows for _, rows in sessions]).astype(np.int64)
    positions = np.concatenate([np.arange(p, p + rows) for p, rows in sessions]).astype(np.int64)
    hidden, delta = rand(int(bounds[-1]), h), rand(int(bounds[-1]), h)

    def run(segs: list[int], threads: int):
        rows = np.concatenate([np.arange(bounds[s], bounds[s + 1]) for s in segs])
        m = len(rows)
        hid, dl = hidden[rows], delta[rows]
        x, q, k, v, att = (np.empty((m, c), np.float32) for c in (h, H * D, K * D, K * D, H * D))
        keys = [caches[s][0].copy() for s in segs]
        values = [caches[s][1].copy() for s in segs]
        b = np.cumsum([0] + [sessions[s][1] for s in segs]).astype(np.int64)
        layer.attention(hid, dl, x, q, k, v, att, positions[rows], b, keys, values, threads)
        return att, q, keys, values

    short = [0, 1, 2]
    in_tasks = run(short, 2)
    in_one_pass = run(short + [3], 2)
    n = int(bounds[3])
    np.testing.assert_array_equal(in_tasks[0], in_one_pass[0][:n])
    np.testing.assert_array_equal(in_tasks[1], in_one_pass[1][:n])
    for s in short:
        np.testing.assert_array_equal(in_tasks[2][s], in_one_pass[2][s])
        np.testing.assert_array_equal(in_tasks[3][s], in_one_pass[3][s])


def test_layer_attention_with_ffn_equals_two_calls():
    h, H, K, D, F = 64, 4, 2, 16, 96
    layer, *_ = _dense_layer(h, H, K, D, F)
    past, n = 7, 2
    keys, values = rand(K, 16, D), rand(K, 16, D)
    hidden, delta = rand(n, h), rand(n, h)
    positions = np.arange(past, past + n, dtype=np.int64)
    bounds = np.array([0, n], np.int64)
    results = []
    for merged in (False, True):
        hid, dl, kc, vc = hidden.copy(), delta.copy(), keys.copy(), values.copy()
        x, q, k, v, att = (np.empty((n, c), np.float32) for c in (h, H * D, K * D, K * D, H * D))
        ffn = np.empty((n, F), np.float32)
        if merged:
            layer.attention(hid, dl, x, q, k, v, att, positions, bounds, [kc], [vc], 2, ffn)
        else:
            layer.attention(hid, dl, x, q, k, v, att, positions, bounds, [kc], [vc], 2)
            layer.dense_ffn(hid, dl, x, ffn, 2)
        results.append((hid, dl, kc, vc))
    for a, b in zip(*results, strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(KernelError, match="ffn must be"):
        layer.attention(hidden.copy(), delta.copy(), *(np.empty((n, c), np.float32) for c in (h, H * D, K * D,
                        K * D, H * D)), positions, bounds, [keys.copy()], [values.copy()], 1,
                        np.empty((n, F + 1), np.float32))  # fmt: skip


def test_run_layers_equals_one_call_per_layer():
    """ops.run_layers runs a stack of blocks in one call without the GIL: the same bits as Layer.attention
    block by block, for several sessions, and every argument checked before anything runs."""
    h, H, K, D, F = 64, 4, 2, 16, 96
    layers = [_dense_layer(h, H, K, D, F)[0] for _ in range(3)]
    sessions = [(7, 1), (20, 1), (3, 1)]  # (cached positions, new tokens): a decode step of three sessions
    n = len(sessions)
    caches = [[(rand(K, 32, D), rand(K, 32, D)) for _ in sessions] for _ in layers]  # [layer][session]
    hidden, delta = rand(n, h), rand(n, h)
    positions = np.array([p for p, _ in sessions], np.int64)
    bounds = np.arange(n + 1, dtype=np.int64)
    results = []
    for stacked in (False, True):
        hid, dl = hidden.copy(), delta.copy()
        keys = [[k.copy() for k, _ in layer] for layer in caches]
        values = [[v.copy() for _, v in layer] for layer in caches]
        x, q, k, v, att, ffn = (np.empty((n, c), np.float32) for c in (h, H * D, K * D, K * D, H * D, F))
        if stacked:
            ops.run_layers(layers, hid, dl, x, q, k, v, att, positions, bounds, keys, values, 2, ffn)
        else:
            for i, layer in enumerate(layers):
                layer.attention(hid, dl, x, q, k, v, att, positions, bounds, keys[i], values[i], 2, ffn)
        results.append((hid, dl, keys, values))
    for a, b in zip(results[0][:2], results[1][:2], strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(results[0][2] + results[0][3], results[1][2] + results[1][3], strict=True):
        for x_, y_ in zip(a, b, strict=True):
            np.testing.assert_array_equal(x_, y_)
    bufs = [np.empty((n, c), np.float32) for c in (h, h, h, H * D, K * D, K * D, H * D)]
    keys = [[k for k, _ in layer] for layer in caches]
    values = [[v for _, v in layer] for layer in caches]
    with pytest.raises(KernelError, match="one key and one value cache list per layer"):
        ops.run_layers(layers, *bufs, positions, bounds, keys[:2], values[:2])
    with pytest.raises(KernelError, match="invalid segments"):
        ops.run_layers(layers, *bufs, positions, bounds, keys[:2] + [keys[2][:2]], values)
    with pytest.raises(TypeError):
        ops.run_layers(layers[:2] + [object()], *bufs, positions, bounds, keys, values)


def test_run_layers_with_head_equals_add_rmsnorm_and_matmul():
    """run_layers' head (hidden += delta, RMSNorm, output product, finiteness): the bits of ops.add_rmsnorm
    and quant.matmul after the layers; False when a logit is not finite; shapes checked first."""
    from hymt import quant

    h, H, K, D, F, V = 64, 4, 2, 16, 96, 80
    layers = [_dense_layer(h, H, K, D, F)[0] for _ in range(2)]
    n = 2
    caches = [[(rand(K, 16, D), rand(K, 16, D)) for _ in range(n)] for _ in layers]
    hidden, delta, norm = rand(n, h), rand(n, h), 1.0 + 0.1 * rand(h)
    weight = rand(V, h) * 0.2
    positions, bounds = np.array([5, 9], np.int64), np.arange(n + 1, dtype=np.int64)

    def run(w: np.ndarray, head: bool):
        hid, dl = hidden.copy(), delta.copy()
        keys = [[k.copy() for k, _ in layer] for layer in caches]
        values = [[v.copy() for _, v in layer] for layer in caches]
        x, q, k, v, att, ffn = (np.empty((n, c), np.float32) for c in (h, H * D, K * D, K * D, H * D, F))
        packed = quant.packed(_F32Weight("output", w))
        logits = np.empty((n, V), np.float32)
        extra = (packed, norm, logits) if head else None
        finite = ops.run_layers(layers, hid, dl, x, q, k, v, att, positions, bounds, keys, values, 2, ffn,
                                None, extra)  # fmt: skip
        if head:
            return logits, finite
        out = np.empty((n, h), np.float32)
        ops.add_rmsnorm(hid.copy(), dl, norm, 1e-5, out, 2)
        return quant.matmul(_F32Weight("output", w), out, float_path=True), finite

    fused, finite = run(weight, True)
    expected, none = run(weight, False)
    assert finite is True and none is None
    np.testing.assert_array_equal(fused, expected)
    bad = weight.copy()
    bad[V - 1, 3] = np.inf
    assert run(bad, True)[1] is False
    bufs = [np.empty((n, c), np.float32) for c in (h, h, h, H * D, K * D, K * D, H * D)]
    keys = [[k for k, _ in layer] for layer in caches]
    values = [[v for _, v in layer] for layer in caches]
    packed = quant.packed(_F32Weight("output", weight))
    with pytest.raises(KernelError, match="logits must be"):
        ops.run_layers(layers, *bufs, positions, bounds, keys, values, 1, np.empty((n, F), np.float32), None,
                       (packed, norm, np.empty((n, V + 1), np.float32)))  # fmt: skip
    with pytest.raises(KernelError, match="output norm"):
        ops.run_layers(layers, *bufs, positions, bounds, keys, values, 1, np.empty((n, F), np.float32), None,
                       (packed, norm[1:], np.empty((n, V), np.float32)))  # fmt: skip


# ---- the HyV3 MoE FFN in one call ----------------------------------------------------------------------


def _moe_layer(h=64, E=8, used=3, M=48, S=40, normalize=True, scale=2.5):
    """An F32 MoE block (attention weights as _dense_layer's): ops.Layer and its float32 weights."""
    from hymt import quant

    _, w, norms, freqs = _dense_layer(h)
    H, K = 4, 2
    moe = {"router": rand(E, h), "bias": rand(E) * 0.3}
    moe.update({f"shared_{n}": rand(*shape) * 0.2 for n, shape in (("gate", (S, h)), ("up", (S, h)),
                                                                    ("down", (h, S)))})  # fmt: skip
    moe["experts"] = [(rand(M, h) * 0.2, rand(M, h) * 0.2, rand(h, M) * 0.2) for _ in range(E)]

    def pk(name, m):
        return quant.packed(_F32Weight(name, m))

    spec = (
        pk("router", moe["router"]), moe["bias"],
        tuple(pk(f"shared_{n}", moe[f"shared_{n}"]) for n in ("gate", "up", "down")),
        [tuple(pk(f"expert{e}_{i}", m) for i, m in enumerate(mats)) for e, mats in enumerate(moe["experts"])],
        used, normalize, scale,
    )  # fmt: skip
    layer = ops.Layer(
        tuple(pk(n, w[n]) for n in ("q", "k", "v")), pk("o", w["o"]), None, norms["attn"], norms["ffn"],
        norms["q"], norms["k"], freqs, H, K, 1e-5, True, True, spec,
    )  # fmt: skip
    return layer, moe, norms, (E, used, max(M, S))


def _per_token_moe(moe: dict, x: np.ndarray, used: int, normalize: bool, scale: float) -> np.ndarray:
    """§4.4 one token at a time with hymt.quant's products (each thread- and batch-invariant) and float32
    numpy: the shared expert, then each selected expert in ascending index, w · y rounded, then added."""
    from hymt.quant import gate_up_silu, matmul

    def swiglu(gate, up, down, row):
        middle = gate_up_silu(_F32Weight("g", gate), _F32Weight("u", up), row, float_path=True)
        return matmul(_F32Weight("d", down), middle, float_path=True)[0]

    out = np.empty_like(x)
    for t in range(len(x)):
        row = x[t : t + 1]
        logits = matmul(_F32Weight("r", moe["router"]), row, float_path=True)
        selected, weights = ops.moe_route(logits, moe["bias"], used, normalize, scale)
        acc = swiglu(moe["shared_gate"], moe["shared_up"], moe["shared_down"], row)
        for slot in np.argsort(selected[0]):
            y = swiglu(*moe["experts"][selected[0, slot]], row)
            acc = acc + weights[0, slot] * y
        out[t] = acc
    return out


@pytest.mark.parametrize(("normalize", "n"), [(True, 1), (True, 2), (True, 7), (False, 7), (True, 321)])
def test_moe_ffn_equals_per_token_moe_bit_for_bit(normalize, n):
    """Tokens grouped by expert (some experts chosen by all tokens, some by a few, some by none) give each
    token exactly the bits of running it alone through §4.4's order; any thread count, both schedules
    (whole-expert tasks up to 320 tokens with several threads, else expert after expert). Threads 3 and 5
    leave threads without a task at a layer's end (where a tail split by rows would run; measured and not
    kept, docs/model.md)."""
    layer, moe, norms, (E, used, width) = _moe_layer(normalize=normalize)
    h = 64
    hidden, delta = rand(n, h), rand(n, h)
    x_expected = np.empty_like(hidden)
    residual = hidden.copy()
    ops.add_rmsnorm(residual, delta.copy(), norms["ffn"], 1e-5, x_expected)
    expected = _per_token_moe(moe, x_expected, used, normalize, 2.5)
    previous = kernels.get_num_threads()
    try:
        for threads in (1, 2, 3, 5):
            kernels.set_num_threads(threads)
            hid, dl, x = hidden.copy(), delta.copy(), np.empty_like(hidden)
            layer.moe_ffn(hid, dl, x, ops.MoEScratch(n, h, E, used, width), threads)
            np.testing.assert_array_equal(hid, residual)
            np.testing.assert_array_equal(x, x_expected)
            np.testing.assert_array_equal(dl, expected)
    finally:
        kernels.set_num_threads(previous)


def test_moe_ffn_matches_float64():
    """Against a float64 §4.4 MoE written here (own sigmoid, selection and weights)."""
    layer, moe, norms, (E, used, width) = _moe_layer()
    n, h = 5, 64
    hidden, delta = rand(n, h), rand(n, h)
    hid, dl, x = hidden.copy(), delta.copy(), np.empty_like(hidden)
    layer.moe_ffn(hid, dl, x, ops.MoEScratch(n, h, E, used, width), 2)
    x64 = ref_rmsnorm((hidden.astype(np.float64) + delta).astype(np.float32), norms["ffn"], 1e-5)

    def swiglu(gate, up, down, v):
        g = gate.astype(np.float64) @ v
        return (g / (1 + np.exp(-g)) * (up.astype(np.float64) @ v)) @ down.T.astype(np.float64)

    for t in range(n):
        logits = moe["router"].astype(np.float64) @ x64[t]
        order, w = ref_route(logits, moe["bias"].astype(np.float64), used, True, 2.5)
        terms = [swiglu(moe["shared_gate"], moe["shared_up"], moe["shared_down"], x64[t])]
        terms += [wi * swiglu(*moe["experts"][e], x64[t]) for e, wi in zip(order, w, strict=True)]
        scale = np.abs(np.array(terms)).sum(axis=0).max()
        np.testing.assert_allclose(dl[t], np.sum(terms, axis=0), rtol=0, atol=1e-5 * scale)


def test_run_layers_with_moe_blocks_equals_one_call_per_layer():
    """A HyV3-like stack (a dense block, then MoE blocks) in one run_layers call: the bits of Layer.attention
    block by block, which equal attention then moe_ffn; MoE scratch is checked against every MoE block."""
    h, H, K, D = 64, 4, 2, 16
    dense = _dense_layer(h, H, K, D, 96)[0]
    moe_layers = [_moe_layer(h)[0] for _ in range(2)]
    E, used, width = 8, 3, 48
    layers = [dense, *moe_layers]
    n = 3  # a decode step of three sessions
    caches = [[(rand(K, 32, D), rand(K, 32, D)) for _ in range(n)] for _ in layers]
    hidden, delta = rand(n, h), rand(n, h)
    positions, bounds = np.array([7, 20, 3], np.int64), np.arange(n + 1, dtype=np.int64)
    results = []
    for mode in ("stacked", "per layer", "split"):
        hid, dl = hidden.copy(), delta.copy()
        keys = [[k.copy() for k, _ in layer] for layer in caches]
        values = [[v.copy() for _, v in layer] for layer in caches]
        x, q, k, v, att, ffn = (np.empty((n, c), np.float32) for c in (h, H * D, K * D, K * D, H * D, 96))
        scratch = ops.MoEScratch(n, h, E, used, width)
        if mode == "stacked":
            ops.run_layers(layers, hid, dl, x, q, k, v, att, positions, bounds, keys, values, 2, ffn, scratch)
        for i, layer in enumerate(layers):
            if mode == "per layer":
                layer.attention(
                    hid, dl, x, q, k, v, att, positions, bounds, keys[i], values[i], 2, ffn, scratch
                )
            elif mode == "split":
                layer.attention(hid, dl, x, q, k, v, att, positions, bounds, keys[i], values[i], 2)
                if i == 0:
                    layer.dense_ffn(hid, dl, x, ffn, 2)
                else:
                    layer.moe_ffn(hid, dl, x, scratch, 2)
        results.append((hid, dl, keys, values))
    for other in results[1:]:
        for a, b in zip(results[0][:2], other[:2], strict=True):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(results[0][2] + results[0][3], other[2] + other[3], strict=True):
            for x_, y_ in zip(a, b, strict=True):
                np.testing.assert_array_equal(x_, y_)
    bufs = [np.empty((n, c), np.float32) for c in (h, h, h, H * D, K * D, K * D, H * D)]
    keys = [[k for k, _ in layer] for layer in caches]
    values = [[v for _, v in layer] for layer in caches]
    ffn = np.empty((n, 96), np.float32)
    with pytest.raises(KernelError, match="needs MoE scratch"):
        ops.run_layers(layers, *bufs, positions, bounds, keys, values, 1, ffn)
    with pytest.raises(KernelError, match="needs ffn scratch"):
        ops.run_layers(
            layers, *bufs, positions, bounds, keys, values, 1, None, ops.MoEScratch(n, h, E, used, 48)
        )
    for wrong in (
        (n + 1, h, E, used, 48),
        (n, h, E, used - 1, 48),
        (n, h, E, used, 47),
        (n, h, E - 1, 2, 48),
    ):
        with pytest.raises(KernelError, match="MoE scratch must be"):
            ops.run_layers(layers, *bufs, positions, bounds, keys, values, 1, ffn, ops.MoEScratch(*wrong))
    with pytest.raises(KernelError, match="no experts"):
        dense.moe_ffn(bufs[0], bufs[1], bufs[2], ops.MoEScratch(n, h, E, used, 48))
    with pytest.raises(KernelError, match="invalid shape"):
        ops.MoEScratch(n, h, E, E + 1, 48)
