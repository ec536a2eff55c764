"""Decoders and matrix products of every registered format (REFERENCE.md §2, §3.3–3.6, §12.3–12.4).

Generic over ``hymt.quant.FORMATS``: a format registered in ``hymt/_kernels/formats.h`` is covered here
automatically. References are independent of the code under test: the ``gguf`` package's numpy decoders
for the standard formats, numpy decoders written from §2 for Q2_0C and STQ1_0, a numpy implementation of
the §3.4 activation quantization, and float64 products.
"""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import gguf
import numpy as np
import pytest

from hymt import kernels, quant
from hymt.errors import KernelError

FORMATS = sorted(quant.FORMATS)
INT8_FORMATS = [name for name in FORMATS if quant.FORMATS[name].int8_path]
ISAS = kernels.supported_isas()

# ---- independent decoders ----------------------------------------------------------------------------

GGUF_TYPES = {
    "F32": gguf.GGMLQuantizationType.F32,
    "F16": gguf.GGMLQuantizationType.F16,
    "Q8_0": gguf.GGMLQuantizationType.Q8_0,
    "Q4_K": gguf.GGMLQuantizationType.Q4_K,
    "Q6_K": gguf.GGMLQuantizationType.Q6_K,
}

STQ1_CODEBOOK = np.array(
    [0xA9, 0x89, 0x29, 0x09, 0xA6, 0x86, 0x26, 0x06, 0x9A, 0x92, 0x1A, 0x12, 0x6A, 0x62, 0x4A, 0x42]
    + [0x01, 0x21, 0x81, 0xA1, 0x04, 0x24, 0x84, 0xA4, 0x10, 0x18, 0x90, 0x98, 0x40, 0x48, 0x60, 0x68],
    dtype=np.uint8,
)


def decode_q2_0c(raw: np.ndarray) -> np.ndarray:
    """§2.5: fp16 d first, then 512 two-bit codes low bits first; w = f32(2·code − 3) × d."""
    blocks = raw.reshape(-1, 130)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)  # [B, 1]
    codes = (blocks[:, 2:, None] >> np.array([0, 2, 4, 6], dtype=np.uint8)) & 3  # [B, 128, 4]
    return ((2.0 * codes.reshape(-1, 512).astype(np.float32) - 3.0).astype(np.float32) * d).reshape(-1)


def decode_stq1_0(raw: np.ndarray) -> np.ndarray:
    """§2.6: 64 nibbles + 64 sign bits → codebook byte of 4 ternary lanes, stride-16 placement."""
    blocks = raw.reshape(-1, 42)
    d = blocks[:, 40:42].copy().view(np.float16).astype(np.float32)  # [B, 1]
    g = np.arange(64)
    nibble = (blocks[:, g // 2] >> (4 * (g % 2))) & 15  # [B, 64]
    sign = (blocks[:, 32 + g // 8] >> (g % 8)) & 1  # [B, 64]
    code = STQ1_CODEBOOK[(sign << 4) | nibble]  # [B, 64]
    out = np.empty((blocks.shape[0], 256), dtype=np.float32)
    for p in range(4):
        digit = ((code >> (2 * p)) & 3).astype(np.float32) - 1.0
        out[:, (g // 16) * 64 + (g % 16) + 16 * p] = digit * d
    return out.reshape(-1)


def reference_decode(dtype: str, raw: np.ndarray) -> np.ndarray:
    if dtype in GGUF_TYPES:
        return np.asarray(gguf.quants.dequantize(raw, GGUF_TYPES[dtype]), dtype=np.float32).reshape(-1)
    if dtype == "Q2_0C":
        return decode_q2_0c(raw)
    if dtype == "STQ1_0":
        return decode_stq1_0(raw)
    raise AssertionError(f"no independent decoder for {dtype}; add one to tests/test_quant.py")


# ---- random packed data -------------------------------------------------------------------------------

# Byte offsets of each format's fp16 scales within a block.
SCALE_OFFSETS = {"Q8_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,), "Q2_0C": (0,), "STQ1_0": (40,)}


def random_blocks(
    dtype: str, nblocks: int, rng: np.random.Generator, scales: np.ndarray | None = None
) -> np.ndarray:
    """nblocks random blocks of ``dtype`` with finite fp16 scales (``scales`` or uniform ±0.05)."""
    info = quant.FORMATS[dtype]
    if dtype == "F32":
        return rng.standard_normal(nblocks).astype(np.float32).view(np.uint8)
    if dtype == "F16":
        return rng.standard_normal(nblocks).astype(np.float16).view(np.uint8)
    blocks = rng.integers(0, 256, size=(nblocks, info.block_bytes), dtype=np.uint8)
    for offset in SCALE_OFFSETS[dtype]:
        values = scales if scales is not None else rng.uniform(-0.05, 0.05, nblocks)
        blocks[:, offset : offset + 2] = np.asarray(values, dtype=np.float16).reshape(-1, 1).view(np.uint8)
    return blocks.reshape(-1)


def make_weight(
    dtype: str, rows: int, cols: int, rng: np.random.Generator, name: str = "w"
) -> SimpleNamespace:
    info = quant.FORMATS[dtype]
    data = random_blocks(dtype, rows * cols // info.block_len, rng)
    data.flags.writeable = False
    return SimpleNamespace(name=name, dtype=dtype, dimensions=(cols, rows), data=data)


def decoded(weight: SimpleNamespace) -> np.ndarray:
    cols, rows = weight.dimensions
    return reference_decode(weight.dtype, weight.data).reshape(rows, cols).astype(np.float64)


def quantize_reference(x: np.ndarray) -> np.ndarray:
    """§3.4 in numpy: groups of 256, scale = max/127, q = round-half-even(x · 127/max) clamped; returns the
    dequantized activations q · scale in float64."""
    groups = x.astype(np.float32).reshape(x.shape[0], -1, 256)
    amax = np.abs(groups).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inverse = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
        q = np.clip(np.nan_to_num(np.rint(groups * inverse), nan=0.0, posinf=127, neginf=-127), -127, 127)
    scale = np.where(amax > 0, amax / np.float32(127), np.float32(0)).astype(np.float32)
    return (q.astype(np.float64) * scale.astype(np.float64)).reshape(x.shape)


def matmul_isa(isa: str, weight, x: np.ndarray, **kwargs) -> np.ndarray:
    with kernels.use_isa(isa):
        return quant.matmul(weight, x, **kwargs)


# ---- decoders ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FORMATS)
def test_decoder_matches_independent_reference_on_random_blocks(dtype: str) -> None:
    rng = np.random.default_rng(7)
    info = quant.FORMATS[dtype]
    nblocks = 4096 if info.block_len > 1 else 65536
    if dtype in SCALE_OFFSETS:
        # zero, negative, subnormal, tiny, huge and ordinary scales
        special = np.array([0.0, -0.0, 6e-8, -6e-8, 3e-5, 65504.0, -65504.0, 1.0, -1.5, 0.03125])
        scales = np.concatenate([special, rng.uniform(-2, 2, nblocks - special.size)])
        raw = random_blocks(dtype, nblocks, rng, scales)
    elif dtype == "F16":
        raw = rng.integers(0, 0x7C00, nblocks, dtype=np.uint16)  # every finite magnitude incl. subnormals
        raw[::2] |= 0x8000
        raw = raw.view(np.uint8)
    else:
        raw = rng.standard_normal(nblocks).astype(np.float32)
        raw[:4] = [0.0, -0.0, 1e-40, -3.4e38]
        raw = raw.view(np.uint8)
    ours = quant.dequantize(dtype, raw)
    ref = reference_decode(dtype, raw)
    assert ours.dtype == np.float32 and ours.shape == (nblocks * info.block_len,)
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))


# §12.3 decoder check values.
CHECK_VALUES = {
    "Q8_0": (
        "425ad5a1dab2faa83ae4f0eee023937830df85ebc7a0c180f5cea6f1148bd6d5",
        [2.65625, 3.8125, -3.03125, -1.875],
    ),
    "Q4_K": (
        "2a4b29f09eece87516748ea912b1909ed060d49d90b5b8b402856426d93428d4",
        [7.46875, -3.1875, 1.65625, 6.5],
    ),
    "Q6_K": (
        "a2dd2896bbccdda55d24aec3d7e62246f77cb87d1c20d885e315bdbeeb2c7a87",
        [-44.71875, 53.0, 18.21875, -16.5625],
    ),
    "Q2_0C": (
        "8feb90f3c58c9c1e4d836a95fa32c83bfd648126907a4e2c8c5c4fd5e83933c2",
        [-0.03125, -0.03125, -0.03125, -0.03125, 0.03125, 0.03125, 0.09375],
    ),
    "STQ1_0": (
        "fd7aafa5fce32e555e975e10e869d6b295d18f45c7bfebce9ed04116ba584928",
        [-0.03125, 0.0, 0.0, 0.0, 0.03125, -0.03125],
    ),
}


def check_value_input(dtype: str) -> bytes:
    """The §12.3 recipe: 3 blocks, byte i of block b = (37i + 79b + 11) % 256, then the fp16 scale."""
    info = quant.FORMATS[dtype]
    blocks = []
    for b in range(3):
        block = bytearray((i * 37 + b * 79 + 11) % 256 for i in range(info.block_bytes))
        offset = {"Q6_K": 208, "STQ1_0": 40}.get(dtype, 0)
        block[offset : offset + 2] = np.float16([0.03125, -1.5, 0.0][b]).tobytes()
        if dtype == "Q4_K":
            block[2:4] = np.float16(0.0625).tobytes()
        blocks.append(bytes(block))
    return b"".join(blocks)


@pytest.mark.parametrize("dtype", [name for name in FORMATS if name in CHECK_VALUES])
def test_decoder_check_values(dtype: str) -> None:
    digest, first = CHECK_VALUES[dtype]
    values = quant.dequantize(dtype, check_value_input(dtype))
    assert values.size == 3 * quant.FORMATS[dtype].block_len
    assert values[: len(first)].tolist() == first
    assert hashlib.sha256(values.astype("<f4").tobytes()).hexdigest() == digest


def test_decoder_errors() -> None:
    with pytest.raises(KernelError, match=r"^wrong Q8_0 byte count$"):
        quant.dequantize("Q8_0", bytes(35))
    with pytest.raises(KernelError, match=r"^partial Q8_0 output block$"):
        quant.decode("Q8_0", bytes(34), np.empty(33, np.float32))
    with pytest.raises(KernelError, match=r"^wrong Q8_0 byte count$"):
        quant.decode("Q8_0", bytes(34), np.empty(64, np.float32))
    with pytest.raises(KernelError, match="unsupported tensor type Q5_0"):
        quant.dequantize("Q5_0", bytes(22))
    assert quant.dequantize("Q8_0", b"").size == 0


def test_decode_rows() -> None:
    rng = np.random.default_rng(3)
    for dtype in FORMATS:
        cols = 512
        w = make_weight(dtype, 9, cols, rng, name="token_embd.weight")
        ref = decoded(w).astype(np.float32)
        got = quant.decode_rows(w, [8, 0, 3, 3])
        assert got.dtype == np.float32 and got.shape == (4, cols)
        assert np.array_equal(got, ref[[8, 0, 3, 3]])
        assert np.array_equal(quant.decode_rows(w, np.array([2, 5], dtype=np.int32)), ref[[2, 5]])
        assert quant.decode_rows(w, []).shape == (0, cols)
        for bad in (9, -1, 2**70):
            with pytest.raises(KernelError, match=rf"^token_embd\.weight: row {bad} out of range$"):
                quant.decode_rows(w, [0, bad])
        with pytest.raises(KernelError, match=r"^token_embd\.weight: row 9 out of range$"):
            quant.decode_rows(w, np.array([9]))


# ---- int8 activations (§3.4, §3.6) -----------------------------------------------------------------------


def test_activation_quantization_matches_reference_and_round_trips() -> None:
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(256 * 40) * rng.choice([1e-3, 1.0, 50.0], 256 * 40)).astype(np.float32)
    x[256:512] = 0.0  # an all-zero group
    x[512:768] = np.float32(1e-42)  # a subnormal group: 127/max overflows to inf
    x[600] = 0.0  # 0 × inf counts as 0
    x[768:1024] = np.linspace(-2.5, 2.5, 256, dtype=np.float32)  # exact .5 ties after scaling
    groups = x.size // 256
    qs = np.empty((groups, 256), np.int8)
    bsums = np.empty((groups, 16), np.int16)
    d = np.empty(groups, np.float32)
    sums = np.empty(groups, np.int32)
    quant._quant.quantize_q8g(x, qs, bsums, d, sums)

    xg = x.reshape(groups, 256)
    amax = np.abs(xg).max(axis=1)
    assert np.array_equal(d, np.where(amax > 0, amax / np.float32(127), 0).astype(np.float32))
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inverse = np.where(amax > 0, np.float32(127) / amax, 0).astype(np.float32)
        scaled = np.nan_to_num(np.rint(xg * inverse[:, None]), nan=0.0, posinf=127, neginf=-127)
    expected_q = np.clip(scaled, -127, 127).astype(np.int8)
    assert np.array_equal(qs, expected_q)
    assert np.array_equal(bsums, qs.reshape(groups, 16, 16).astype(np.int32).sum(axis=2))
    assert np.array_equal(sums, qs.astype(np.int32).sum(axis=1))
    # round trip |q·scale − x| ≤ scale/2 + 1e-6 for every element
    err = np.abs(qs.astype(np.float64) * d[:, None].astype(np.float64) - xg.astype(np.float64))
    assert np.all(err <= d[:, None].astype(np.float64) / 2 + 1e-6)
    assert d[1] == 0.0 and not qs[1].any()


# ---- products ---------------------------------------------------------------------------------------------

# (cols, rows, n): every value of §12.4's cols × rows × n grid appears, without the full cross product
# (2049 rows run with cols up to 2048 to keep the float64 references cheap).
SHAPES = [
    (256, 1, 1), (256, 7, 3), (256, 64, 17), (256, 2049, 2),
    (512, 7, 256), (512, 64, 7), (512, 1, 64), (512, 2049, 1),
    (2048, 64, 16), (2048, 7, 64), (2048, 2049, 1), (2048, 1, 2),
    (6144, 7, 17), (6144, 64, 3), (6144, 130, 1), (6144, 1, 256),
]  # fmt: skip


def shape_cases() -> list[tuple[str, int, int, int]]:
    return [
        (dtype, cols, rows, n)
        for dtype in FORMATS
        for cols, rows, n in SHAPES
        if cols % quant.FORMATS[dtype].block_len == 0
    ]


@pytest.mark.parametrize(("dtype", "cols", "rows", "n"), shape_cases())
def test_products_every_isa_and_references(dtype: str, cols: int, rows: int, n: int) -> None:
    rng = np.random.default_rng(cols * 7919 + rows * 31 + n)
    w = make_weight(dtype, rows, cols, rng)
    x = (rng.standard_normal((n, cols)) * rng.uniform(0.1, 3.0, (n, 1))).astype(np.float32)
    wd = decoded(w)

    if quant.FORMATS[dtype].int8_path:
        scalar = matmul_isa("scalar", w, x)
        for isa in ISAS:
            assert np.array_equal(matmul_isa(isa, w, x), scalar), f"{isa} differs from the scalar reference"
        # vs float64 from the same int8 activations: within 1e-5 of Σ|terms|
        xq = quantize_reference(x)
        ref = xq @ wd.T
        bound = 1e-5 * (np.abs(xq) @ np.abs(wd).T) + 1e-30
        assert np.all(np.abs(scalar - ref) <= bound)

    # float path (every ISA) vs float64 of the decoded weights
    ref = x.astype(np.float64) @ wd.T
    for isa in ISAS:
        got = matmul_isa(isa, w, x, float_path=True)
        assert got.dtype == np.float32 and got.shape == (n, rows)
        assert np.all(np.abs(got - ref) <= 1e-3 + 1e-4 * np.abs(ref) + 1e-5 * (np.abs(x) @ np.abs(wd).T))


@pytest.mark.parametrize("dtype", FORMATS)
def test_float_path_row_dot_sine_input(dtype: str) -> None:
    """§3.6: x[i] = sin(0.17·i), float path vs a float64 dot of the decoded weights, 1e-3 + 1e-4·|ref|."""
    rng = np.random.default_rng(5)
    cols = 2048
    w = make_weight(dtype, 16, cols, rng)
    x = np.sin(0.17 * np.arange(cols)).astype(np.float32)
    ref = decoded(w) @ x.astype(np.float64)
    for isa in ISAS:
        got = matmul_isa(isa, w, x, float_path=True)
        assert got.shape == (16,)
        assert np.all(np.abs(got - ref) <= 1e-3 + 1e-4 * np.abs(ref))


@pytest.mark.parametrize("dtype", INT8_FORMATS)
def test_thread_count_and_batch_composition_invariance(dtype: str) -> None:
    rng = np.random.default_rng(13)
    cols = 1024 if quant.FORMATS[dtype].block_len <= 512 else 2048
    w = make_weight(dtype, 2049, cols, rng)
    x = rng.standard_normal((19, cols)).astype(np.float32)
    previous = kernels.get_num_threads()
    try:
        for isa in ISAS:
            with kernels.use_isa(isa):
                results = []
                for threads in (1, 2, 4):
                    kernels.set_num_threads(threads)
                    results.append(quant.matmul(w, x))
                assert all(np.array_equal(results[0], r) for r in results[1:])
                full = results[0]
                # each token alone, a reversed batch, and a batch mixed with other tokens
                for t in (0, 7, 18):
                    assert np.array_equal(quant.matmul(w, x[t]), full[t])
                assert np.array_equal(quant.matmul(w, x[::-1].copy())[::-1], full)
                mixed = np.concatenate([rng.standard_normal((5, cols)).astype(np.float32), x[3:9]])
                assert np.array_equal(quant.matmul(w, mixed)[5:], full[3:9])
    finally:
        kernels.set_num_threads(previous)


@pytest.mark.skipif(
    "avx512" not in ISAS or not kernels.cpu_features()["amx_int8"],
    reason="no AMX tiles under the avx512 family",
)
@pytest.mark.parametrize("dtype", INT8_FORMATS)
def test_amx_tiles_equal_the_scalar_reference(dtype: str) -> None:
    """With AMX tiles allowed or not, the avx512 family returns the scalar reference's bits on both sides of
    any tile threshold, for partial token and row tiles and the fused projections."""
    rng = np.random.default_rng(37)
    cols = 1024
    w, up = make_weight(dtype, 37, cols, rng), make_weight(dtype, 37, cols, rng)
    for n in (1, 4, 8, 9, 15, 16, 17, 33, 64, 100, 272):
        x = rng.standard_normal((n, cols)).astype(np.float32)
        scalar = matmul_isa("scalar", w, x)
        for amx in (True, False):
            with kernels.use_amx(amx), kernels.use_isa("avx512"):
                assert np.array_equal(quant.matmul(w, x), scalar), f"AMX {amx}, n = {n}"
                q, k, _ = quant.qkv(w, up, w, x)
                assert np.array_equal(q, scalar) and np.array_equal(k, quant.matmul(up, x))


@pytest.mark.skipif(
    "avx512" not in ISAS or not kernels.cpu_features()["amx_int8"],
    reason="no AMX tiles under the avx512 family",
)
def test_q8_0_amx_products_of_the_same_shape_back_to_back() -> None:
    """The Q8_0 tile kernel keeps each thread's copy of the activations between the row chunks of one
    product; products of the same shape one after another (the activation buffer may come back at the same
    address) must each use their own tokens."""
    rng = np.random.default_rng(41)
    w = make_weight("Q8_0", 70, 512, rng)
    previous = kernels.get_num_threads()
    try:
        for threads in (1, 2):
            kernels.set_num_threads(threads)
            for _ in range(3):
                x = rng.standard_normal((24, 512)).astype(np.float32)
                with kernels.use_amx(True), kernels.use_isa("avx512"):
                    got = quant.matmul(w, x)
                assert np.array_equal(got, matmul_isa("scalar", w, x))
    finally:
        kernels.set_num_threads(previous)


@pytest.mark.parametrize("dtype", FORMATS)
def test_fused_kernels_equal_unfused(dtype: str) -> None:
    rng = np.random.default_rng(17)
    cols = 1024
    wq, wk, wv = (
        make_weight(dtype, rows, cols, rng, name) for rows, name in ((96, "q"), (32, "k"), (32, "v"))
    )
    gate, up = make_weight(dtype, 200, cols, rng, "gate"), make_weight(dtype, 200, cols, rng, "up")
    for n in (1, 5):
        x = rng.standard_normal((n, cols)).astype(np.float32)
        for float_path in (False, True):
            q, k, v = quant.qkv(wq, wk, wv, x, float_path=float_path)
            assert np.array_equal(q, quant.matmul(wq, x, float_path=float_path))
            assert np.array_equal(k, quant.matmul(wk, x, float_path=float_path))
            assert np.array_equal(v, quant.matmul(wv, x, float_path=float_path))
            g = quant.matmul(gate, x, float_path=float_path).astype(np.float64)
            u = quant.matmul(up, x, float_path=float_path).astype(np.float64)
            with np.errstate(over="ignore"):
                expected = g / (1.0 + np.exp(-g)) * u
            got = quant.gate_up_silu(gate, up, x, float_path=float_path)
            assert got.shape == (n, 200)
            assert np.allclose(got, expected, rtol=1e-5, atol=1e-6)
    single = quant.qkv(wq, wk, wv, x[0])
    assert [a.shape for a in single] == [(96,), (32,), (32,)]
    assert quant.gate_up_silu(gate, up, x[0]).shape == (200,)


def test_mixed_format_fusion_and_thread_invariance() -> None:
    """Q4_K_M-style layers mix formats inside one fused call."""
    if len(INT8_FORMATS) < 2:
        pytest.skip("needs two int8 formats")
    rng = np.random.default_rng(19)
    a, b = INT8_FORMATS[:2]
    cols = 1024
    wq, wk, wv = (
        make_weight(a, 64, cols, rng),
        make_weight(b, 16, cols, rng),
        make_weight("F32", 16, cols, rng),
    )
    x = rng.standard_normal((3, cols)).astype(np.float32)
    q, k, v = quant.qkv(wq, wk, wv, x)
    assert np.array_equal(q, quant.matmul(wq, x))
    assert np.array_equal(k, quant.matmul(wk, x))
    assert np.array_equal(v, quant.matmul(wv, x))


def test_q8_0_rows_that_are_not_whole_groups_use_the_float_path() -> None:
    rng = np.random.default_rng(23)
    w = make_weight("Q8_0", 33, 96, rng)
    x = rng.standard_normal((4, 96)).astype(np.float32)
    ref = x.astype(np.float64) @ decoded(w).T
    got = quant.matmul(w, x)
    assert np.array_equal(got, quant.matmul(w, x, float_path=True))
    assert np.all(np.abs(got - ref) <= 1e-3 + 1e-4 * np.abs(ref))


def q8_0_int8_sequence(weight: SimpleNamespace, x: np.ndarray) -> np.ndarray:
    """The float sequence documented in fmt_q8_0.h, in numpy: per (row, token), over 256-groups g,
    gacc = fma(d_b, f32(isum_b), gacc) for its 8 blocks in order, then total = fma(s_g, gacc, total). fma is
    emulated in float64 (the product is exact there) with one rounding to float32."""
    cols, rows = weight.dimensions
    blocks = weight.data.reshape(rows, cols // 32, 34)
    d = blocks[:, :, :2].copy().view(np.float16)[:, :, 0].astype(np.float64)  # [rows, blocks]
    qw = blocks[:, :, 2:].view(np.int8).astype(np.int64)  # [rows, blocks, 32]
    groups = x.astype(np.float32).reshape(x.shape[0], -1, 256)
    amax = np.abs(groups).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        inverse = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    qa = np.clip(np.rint(groups * inverse), -127, 127).astype(np.int64)
    qa = qa.reshape(x.shape[0], -1, 32)  # [n, blocks, 32]
    s = np.where(amax > 0, amax / np.float32(127), np.float32(0)).astype(np.float32)
    s = s[:, :, 0].astype(np.float64)  # [n, groups]
    isum = np.einsum("rbi,tbi->trb", qw, qa).astype(np.float64)  # [n, rows, blocks], exact
    total = np.zeros((x.shape[0], rows), np.float32)
    for g in range(cols // 256):
        gacc = np.zeros_like(total)
        for b in range(8 * g, 8 * g + 8):
            gacc = (d[None, :, b] * isum[:, :, b] + gacc.astype(np.float64)).astype(np.float32)
        total = (s[:, g, None] * gacc.astype(np.float64) + total.astype(np.float64)).astype(np.float32)
    return total


@pytest.mark.parametrize("n", [1, 3, 4, 5, 8, 9, 13, 70])
def test_q8_0_int8_path_is_the_documented_float_sequence(n: int) -> None:
    """Every family gives exactly the documented sequence: 37 rows (a 32-row panel and a partial one),
    three 256-groups, token counts on both sides of the small-batch path (up to 4 tokens a pass, up to 8
    tokens) and of a 64-token span."""
    rng = np.random.default_rng(31 + n)
    w = make_weight("Q8_0", 37, 768, rng)
    x = (rng.standard_normal((n, 768)) * rng.uniform(0.1, 3.0, (n, 1))).astype(np.float32)
    expected = q8_0_int8_sequence(w, x)
    for isa in ISAS:
        assert np.array_equal(matmul_isa(isa, w, x), expected), isa


def test_out_argument_and_dtype_coercion() -> None:
    rng = np.random.default_rng(29)
    w = make_weight("Q8_0", 8, 256, rng)
    x = rng.standard_normal((2, 256))
    out = np.empty((2, 8), np.float32)
    assert quant.matmul(w, x, out=out) is out
    assert np.array_equal(out, quant.matmul(w, x.astype(np.float32)))
    vec_out = np.empty(8, np.float32)
    assert quant.matmul(w, x[0], out=vec_out) is vec_out
    assert quant.matmul(w, np.empty((0, 256), np.float32)).shape == (0, 8)
    for bad in (np.empty((2, 9), np.float32), np.empty((2, 8), np.float64), np.empty((8, 2), np.float32).T):
        with pytest.raises(KernelError, match=r"^w: invalid output array"):
            quant.matmul(w, x, out=bad)


def test_gguf_file_tensors(tmp_path) -> None:
    """Through real GGUFFile tensors (read-only views of the mapping)."""
    from hymt.gguf import GGUFFile, GGUFWriter

    rng = np.random.default_rng(31)
    writer = GGUFWriter(tmp_path / "m.gguf")
    writer.add_string("general.architecture", "hunyuan-dense")
    weights = {
        dtype: random_blocks(dtype, 48 * 512 // quant.FORMATS[dtype].block_len, rng)
        for dtype in GGUF_TYPES
        if dtype in quant.FORMATS
    }
    for dtype, data in weights.items():
        writer.add_tensor(f"w_{dtype}", [512, 48], dtype, data)
    writer.write()
    x = rng.standard_normal((3, 512)).astype(np.float32)
    with GGUFFile(tmp_path / "m.gguf", profile="standard") as f:
        for dtype, data in weights.items():
            t = f.tensor(f"w_{dtype}")
            assert not t.data.flags.writeable
            fake = SimpleNamespace(name=t.name, dtype=dtype, dimensions=(512, 48), data=data)
            assert np.array_equal(quant.matmul(t, x), quant.matmul(fake, x))
            assert np.array_equal(quant.decode_rows(t, [47]), decoded(fake)[[47]].astype(np.float32))


# ---- argument errors (§2.7, §3.3) ---------------------------------------------------------------------------


def test_product_errors() -> None:
    rng = np.random.default_rng(37)
    w = make_weight("Q8_0", 8, 256, rng, name="blk.0.attn_q.weight")
    x = np.zeros((2, 256), np.float32)
    vector = SimpleNamespace(name="norm", dtype="F32", dimensions=(256,), data=np.zeros(1024, np.uint8))
    cube = SimpleNamespace(name="exps", dtype="F32", dimensions=(4, 4, 3), data=np.zeros(192, np.uint8))
    short = SimpleNamespace(name="short", dtype="Q8_0", dimensions=(256, 8), data=np.zeros(100, np.uint8))
    partial = SimpleNamespace(name="odd", dtype="Q8_0", dimensions=(48, 2), data=np.zeros(68, np.uint8))
    unknown = SimpleNamespace(name="iq", dtype="IQ2_XS", dimensions=(256, 1), data=np.zeros(66, np.uint8))
    with pytest.raises(KernelError, match=r"^norm is not a matrix$"):
        quant.matmul(vector, x)
    with pytest.raises(KernelError, match=r"^exps is not a matrix$"):
        quant.matmul(cube, x)
    with pytest.raises(KernelError, match=r"^short: wrong Q8_0 byte count$"):
        quant.matmul(short, x)
    # dims whose byte count overflows 64 bits must not pass the length check
    huge = SimpleNamespace(
        name="huge", dtype="Q8_0", dimensions=(256, 2**58 + 1), data=np.zeros(272, np.uint8)
    )
    with pytest.raises(KernelError, match=r"^huge: wrong Q8_0 byte count$"):
        quant.matmul(huge, x)
    for dims in ((0, 8), (256, 0), (256, 2**64)):
        bad_dims = SimpleNamespace(name="bad", dtype="Q8_0", dimensions=dims, data=np.zeros(272, np.uint8))
        with pytest.raises(KernelError, match=r"^bad is not a matrix$"):
            quant.matmul(bad_dims, x)
    with pytest.raises(KernelError, match=r"^tensor odd has a partial quantization block in its row$"):
        quant.matmul(partial, np.zeros(48, np.float32))
    with pytest.raises(KernelError, match=r"^iq: unsupported tensor type IQ2_XS$"):
        quant.matmul(unknown, x)
    for bad in (np.zeros((2, 255), np.float32), np.zeros((1, 2, 256), np.float32), np.zeros(512, np.float32)):
        with pytest.raises(KernelError, match=r"^blk\.0\.attn_q\.weight: invalid activation shape$"):
            quant.matmul(w, bad)
    other = make_weight("Q8_0", 8, 512, rng)
    shared = r"^query, key and value must be matrices that share an input width$"
    with pytest.raises(KernelError, match=shared):
        quant.qkv(w, w, other, x)
    with pytest.raises(KernelError, match=shared):
        quant.qkv(w, vector, w, x)
    with pytest.raises(KernelError, match=r"^invalid activation shape for qkv$"):
        quant.qkv(w, w, w, np.zeros((2, 512), np.float32))
    with pytest.raises(KernelError, match=r"^gate and up shape mismatch$"):
        quant.gate_up_silu(w, other, x)
    with pytest.raises(KernelError, match=r"^gate and up shape mismatch$"):
        quant.gate_up_silu(w, make_weight("Q8_0", 9, 256, rng), x)
    with pytest.raises(KernelError, match=r"^invalid activation shape for gate_up_silu$"):
        quant.gate_up_silu(w, w, np.zeros((2, 128), np.float32))
