"""Q4_K and Q6_K: decoders and matrix products (REFERENCE.md §2.3, §2.4, §3.4, §3.6, §12.3, §12.4).

References are independent of the code under test: the ``gguf`` package's numpy decoders, float64
numpy products, and the activation quantization of §3.4 written out in numpy here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

import hymt.kernels as kernels
import hymt.quant as quant
from hymt._kernels import quant as _quant
from hymt.errors import KernelError
from hymt.gguf import GGUFFile, GGUFWriter

BLOCK_BYTES = {"Q4_K": 144, "Q6_K": 210}
GGML_TYPE = {"Q4_K": GGMLQuantizationType.Q4_K, "Q6_K": GGMLQuantizationType.Q6_K}
# byte offsets of the fp16 scales in a block: Q4_K d, dmin; Q6_K d (at the end)
SCALE_OFFSETS = {"Q4_K": (0, 2), "Q6_K": (208,)}
FORMATS = ("Q4_K", "Q6_K")
ISAS = kernels.supported_isas()
SIMD_ISAS = [isa for isa in ISAS if isa != "scalar"]


@pytest.fixture(params=[False, True], ids=["detected-vendor", "as-amd"])
def force_amd(request: pytest.FixtureRequest) -> Iterator[bool]:
    """A test run on this machine's kernel choices and again as on AMD cores, where some small-batch paths
    differ (the Q4_K GEMV, the Q6_K passes)."""
    previous = _quant._as_amd(request.param)
    try:
        yield request.param
    finally:
        _quant._as_amd(previous)


@dataclass(frozen=True)
class PackedMatrix:
    """The attributes ``hymt.quant`` reads from a GGUFTensor (dims ``[cols, rows]``)."""

    name: str
    dtype: str
    dimensions: tuple[int, int]
    data: np.ndarray


def fp16_bytes(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.float16).view(np.uint8).reshape(-1, 2)


def random_weight(dtype: str, rows: int, cols: int, rng: np.random.Generator) -> PackedMatrix:
    """Random codes and sub-scales with finite, realistic fp16 scales (signs of both kinds)."""
    blocks = rng.integers(0, 256, size=(rows * cols // 256, BLOCK_BYTES[dtype]), dtype=np.uint8)
    for offset in SCALE_OFFSETS[dtype]:
        scale = rng.uniform(1e-3, 2e-2, size=blocks.shape[0]) * rng.choice([-1.0, 1.0], size=blocks.shape[0])
        blocks[:, offset : offset + 2] = fp16_bytes(scale)
    return PackedMatrix(f"blk.0.{dtype.lower()}", dtype, (cols, rows), blocks.reshape(-1))


def reference_weights(w: PackedMatrix) -> np.ndarray:
    """(rows, cols) float64 of the gguf package's decoder."""
    cols, rows = w.dimensions
    blocks = w.data.reshape(-1, BLOCK_BYTES[w.dtype])
    return gguf_dequantize(blocks, GGML_TYPE[w.dtype]).reshape(rows, cols).astype(np.float64)


def activations(n: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal((n, cols)).astype(np.float32)
    x[:, ::97] *= 30.0  # outliers set the group scales
    if n > 1 and cols > 256:
        x[1, 256:512] = 0.0  # an all-zero group: scale 0, all q = 0
    return x


def quantize_int8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """§3.4 in numpy: per group of 256, q = round_half_even(x × 127/max) clamped, scale = max/127."""
    n, cols = x.shape
    groups = x.reshape(n, cols // 256, 256)
    amax = np.abs(groups).max(axis=2, keepdims=True)
    safe = np.where(amax > 0, amax, np.float32(1))
    with np.errstate(over="ignore"):  # 127 / max overflows to inf for subnormal groups, as in float32 C
        inverse = np.where(amax > 0, np.float32(127) / safe, np.float32(0)).astype(np.float32)
    scale = np.where(amax > 0, safe / np.float32(127), np.float32(0)).astype(np.float32)
    q = np.clip(np.rint(groups * inverse), -127, 127)
    return q.reshape(n, cols), scale[:, :, 0]


def int8_reference(wf: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(value, Σ|terms|) in float64 of Σ_i w_i · q_i · s_group(i), from the same int8 activations."""
    q, scale = quantize_int8(x)
    xq = q * np.repeat(scale.astype(np.float64), 256, axis=1)  # (n, cols) float64, exact products
    return xq @ wf.T, np.abs(xq) @ np.abs(wf).T


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def matmul_isa(isa: str, w: PackedMatrix, x: np.ndarray, **kwargs: bool) -> np.ndarray:
    with kernels.use_isa(isa):
        return quant.matmul(w, x, **kwargs)


# ---- decoders -------------------------------------------------------------------------------------

SPECIAL_HALVES = np.array(
    [
        0x0000,
        0x8000,
        0x3C00,
        0xBC00,
        0x0001,
        0x8001,
        0x0200,
        0x03FF,
        0x0400,
        0x7BFF,
        0xFBFF,
        0x7C00,
        0xFC00,
        0x7E00,
        0x7C01,
        0xFE00,
        0x2000,
        0xA000,
    ],
    dtype=np.uint16,
)  # ±0, ±1, subnormals, min normal, ±65504, ±inf, quiet/signalling NaN, ±2^-7


def assert_same_floats(ours: np.ndarray, ref: np.ndarray) -> None:
    """Bit-identical, NaN positions identical (NaN payloads are not part of the contract)."""
    assert ours.shape == ref.shape and ours.dtype == np.float32
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(ours), nan)
    mismatch = np.flatnonzero(bits(ours)[~nan] != bits(ref)[~nan])
    assert mismatch.size == 0, f"{mismatch.size} values differ, first at {mismatch[0]}"


@pytest.mark.parametrize("dtype", FORMATS)
def test_decoder_matches_gguf_on_random_and_special_blocks(dtype: str) -> None:
    rng = np.random.default_rng(12)
    nblocks = 4000
    blocks = rng.integers(0, 256, size=(nblocks, BLOCK_BYTES[dtype]), dtype=np.uint8)  # random halves too
    for k, offset in enumerate(SCALE_OFFSETS[dtype]):
        special = np.resize(np.roll(SPECIAL_HALVES, k), 1000)
        blocks[:1000, offset : offset + 2] = special.view(np.uint8).reshape(-1, 2)
        scaled = rng.uniform(-4.0, 4.0, size=1000) * 10.0 ** rng.integers(-7, 5, size=1000)
        blocks[1000:2000, offset : offset + 2] = fp16_bytes(scaled)  # zero, negative, subnormal, huge
    with np.errstate(all="ignore"):
        ref = gguf_dequantize(blocks, GGML_TYPE[dtype]).reshape(-1).astype(np.float32)
    ours = quant.dequantize(dtype, blocks.reshape(-1))
    assert_same_floats(ours, ref)
    assert np.isnan(ref).any() and np.isinf(ref).any()  # the special scales were exercised
    assert_same_floats(quant.dequantize(dtype, blocks.tobytes()), ref)


def check_value_input(dtype: str) -> np.ndarray:
    """§12.3 recipe: byte i of block b = (i·37 + b·79 + 11) % 256, then the fp16 scales."""
    i = np.arange(BLOCK_BYTES[dtype])
    blocks = np.stack([(i * 37 + b * 79 + 11) % 256 for b in range(3)]).astype(np.uint8)
    blocks[:, SCALE_OFFSETS[dtype][0] : SCALE_OFFSETS[dtype][0] + 2] = fp16_bytes(
        np.array([0.03125, -1.5, 0.0])
    )
    if dtype == "Q4_K":
        blocks[:, 2:4] = fp16_bytes(np.full(3, 0.0625))
    return blocks


@pytest.mark.parametrize(
    ("dtype", "sha256", "first"),
    [
        (
            "Q4_K",
            "2a4b29f09eece87516748ea912b1909ed060d49d90b5b8b402856426d93428d4",
            [7.46875, -3.1875, 1.65625, 6.5],
        ),
        (
            "Q6_K",
            "a2dd2896bbccdda55d24aec3d7e62246f77cb87d1c20d885e315bdbeeb2c7a87",
            [-44.71875, 53.0, 18.21875, -16.5625],
        ),
    ],
)
def test_decoder_check_values(dtype: str, sha256: str, first: list[float]) -> None:
    blocks = check_value_input(dtype)
    ours = quant.dequantize(dtype, blocks.reshape(-1))
    assert ours.size == 768
    assert ours[: len(first)].tolist() == first
    assert hashlib.sha256(ours.astype("<f4").tobytes()).hexdigest() == sha256
    assert_same_floats(ours, gguf_dequantize(blocks, GGML_TYPE[dtype]).reshape(-1))


@pytest.mark.parametrize("dtype", FORMATS)
def test_decoder_rejects_partial_blocks(dtype: str) -> None:
    with pytest.raises(KernelError, match=f"wrong {dtype} byte count"):
        quant.dequantize(dtype, np.zeros(BLOCK_BYTES[dtype] + 1, dtype=np.uint8))
    with pytest.raises(KernelError, match=f"partial {dtype} output block"):
        quant.decode(dtype, np.zeros(BLOCK_BYTES[dtype], dtype=np.uint8), np.empty(255, dtype=np.float32))


@pytest.mark.parametrize("dtype", FORMATS)
def test_decode_rows_matches_gguf(dtype: str) -> None:
    rng = np.random.default_rng(3)
    w = random_weight(dtype, 37, 512, rng)
    rows = [36, 0, 5, 5]
    ours = quant.decode_rows(w, rows)
    assert_same_floats(ours, reference_weights(w)[rows].astype(np.float32))
    with pytest.raises(KernelError, match=r"row 37 out of range"):
        quant.decode_rows(w, [37])


# ---- int8 products ----------------------------------------------------------------------------------

# (cols, rows, n): every value of issue 3's grid (cols 256/512/2048/6144, rows 1/7/64/2049,
# n 1/2/3/7/16/17/64/256) appears; the large combinations are sampled so the scalar reference stays cheap.
SHAPES = [
    (256, 1, 1),
    (256, 2049, 64),
    (256, 7, 256),
    (512, 64, 17),
    (512, 2049, 3),
    (512, 1, 256),
    (2048, 7, 16),
    (2048, 64, 7),
    (2048, 2049, 1),
    (2048, 1, 2),
    (6144, 64, 2),
    (6144, 64, 4),
    (6144, 7, 17),
    (6144, 2049, 1),
    (6144, 1, 64),
]


@pytest.mark.parametrize("dtype", FORMATS)
@pytest.mark.parametrize(("cols", "rows", "n"), SHAPES)
def test_int8_product_every_isa_equals_scalar_and_float64(dtype: str, cols: int, rows: int, n: int) -> None:
    rng = np.random.default_rng(cols * 7919 + rows * 31 + n)
    w = random_weight(dtype, rows, cols, rng)
    x = activations(n, cols, rng)
    reference = matmul_isa("scalar", w, x)
    assert reference.shape == (n, rows) and reference.dtype == np.float32
    value, magnitude = int8_reference(reference_weights(w), x)
    assert np.all(np.abs(reference - value) <= 1e-5 * magnitude)
    for isa in SIMD_ISAS:
        np.testing.assert_array_equal(bits(matmul_isa(isa, w, x)), bits(reference), err_msg=isa)


@pytest.mark.parametrize("dtype", FORMATS)
def test_int8_product_extreme_codes_and_scales(dtype: str) -> None:
    """All-max / all-min codes and sub-scales with full-range activations: integer sums stay exact."""
    rng = np.random.default_rng(5)
    rows, cols = 16, 2048
    blocks = np.empty((rows * cols // 256, BLOCK_BYTES[dtype]), dtype=np.uint8)
    blocks[: len(blocks) // 2] = 0xFF
    blocks[len(blocks) // 2 :] = rng.choice(
        np.array([0x00, 0x80, 0x7F], dtype=np.uint8), size=blocks[len(blocks) // 2 :].shape
    )
    for offset in SCALE_OFFSETS[dtype]:
        blocks[:, offset : offset + 2] = fp16_bytes(np.full(len(blocks), 0.5))
    w = PackedMatrix("extreme", dtype, (cols, rows), blocks.reshape(-1))
    x = np.where(rng.random((5, cols)) < 0.5, -1.0, 1.0).astype(np.float32)  # every q = ±127
    reference = matmul_isa("scalar", w, x)
    value, magnitude = int8_reference(reference_weights(w), x)
    assert np.all(np.abs(reference - value) <= 1e-5 * magnitude)
    for isa in SIMD_ISAS:
        np.testing.assert_array_equal(bits(matmul_isa(isa, w, x)), bits(reference), err_msg=isa)


@pytest.mark.parametrize("dtype", FORMATS)
def test_int8_product_special_activation_groups(dtype: str) -> None:
    """Subnormal-only groups (127 / max overflows), zero groups, ties, and non-finite values: every ISA's
    activation preparation gives the scalar reference's results (NaN where it has NaN)."""
    rng = np.random.default_rng(17)
    rows, cols = 33, 1536
    w = random_weight(dtype, rows, cols, rng)
    x = activations(9, cols, rng)
    x[0, 256:512] = np.where(np.arange(256) % 2 == 0, 1e-45, -3e-45)  # subnormal group
    x[1, :256] = np.arange(256) % 5 - 2.5  # exact .5 ties after scaling by 127 / 2.5
    x[2, 512:768] = 0.0
    x[3, 700] = np.inf
    x[4, 1000] = np.nan
    x[5, 1300:1302] = [3.4e38, -3.4e38]
    with np.errstate(all="ignore"):
        reference = matmul_isa("scalar", w, x)
        for isa in SIMD_ISAS:
            assert_same_floats(matmul_isa(isa, w, x), reference)
    assert np.isfinite(reference[[0, 1, 2, 6]]).all()
    value, magnitude = int8_reference(reference_weights(w), x[[0, 1, 2, 6]])
    assert np.all(np.abs(reference[[0, 1, 2, 6]] - value) <= 1e-5 * magnitude)


@pytest.mark.parametrize("dtype", FORMATS)
@pytest.mark.parametrize("isa", ISAS)
def test_batch_composition_and_threads_do_not_change_results(dtype: str, isa: str) -> None:
    rng = np.random.default_rng(11)
    rows, cols, n = 2049, 512, 40
    w = random_weight(dtype, rows, cols, rng)
    x = activations(n, cols, rng)
    previous = kernels.get_num_threads()
    try:
        with kernels.use_isa(isa):
            kernels.set_num_threads(2)
            full = quant.matmul(w, x)
            for t in (0, 1, 7, 18):
                np.testing.assert_array_equal(bits(quant.matmul(w, x[t])), bits(full[t]))
            # Q4_K on AVX-512: 1-2 tokens read row by row on AMD cores, up to 32 take the register row tiles
            # (up to 8 tokens a pass), more the L1 tiles; Q6_K: up to 4 row by row (on AMD up to 12 in passes),
            # more the row tiles
            for subset in (
                [18, 3, 1, 16, 17],
                [5, 9],
                [2, 11, 4, 6],
                [0, 12, 13, 14, 15, 7, 8, 10],
                list(range(19)),
            ):
                np.testing.assert_array_equal(bits(quant.matmul(w, x[subset])), bits(full[subset]))
            for threads in (1, 4):
                kernels.set_num_threads(threads)
                np.testing.assert_array_equal(bits(quant.matmul(w, x)), bits(full))
    finally:
        kernels.set_num_threads(previous)


AMX = "avx512" in ISAS and bool(kernels.cpu_features()["amx_int8"])
needs_amx = pytest.mark.skipif(not AMX, reason="no AMX tiles (amx_int8) under the avx512 family")


@needs_amx
@pytest.mark.parametrize("dtype", FORMATS)
def test_amx_tiles_equal_scalar_and_vector_kernels(dtype: str) -> None:
    """Batched calls on AMX tiles (n from the tile threshold up, partial token and row tiles) give the scalar
    reference's bits, as do the vector kernels with the tiles switched off; extreme codes and scales
    (all-max codes, sub-scales and mins with ±127 activations) keep the tile sums exact."""
    rng = np.random.default_rng(29)
    rows, cols = 37, 1280
    w = random_weight(dtype, rows, cols, rng)
    extreme = np.full((rows * cols // 256, BLOCK_BYTES[dtype]), 0xFF, dtype=np.uint8)
    extreme[1::2] = rng.choice(np.array([0x00, 0x80, 0x7F], dtype=np.uint8), size=extreme[1::2].shape)
    for offset in SCALE_OFFSETS[dtype]:
        extreme[:, offset : offset + 2] = fp16_bytes(np.full(len(extreme), 0.5))
    w_extreme = PackedMatrix("extreme", dtype, (cols, rows), extreme.reshape(-1))
    # Q4_K tiles from 13 tokens (n rows below 16), Q8_0 from 10, Q6_K from 9; 272: a second pass with a tail
    for n in (1, 8, 9, 12, 13, 15, 16, 17, 32, 33, 64, 100, 272):
        x = activations(n, cols, rng)
        x_sign = np.where(rng.random((n, cols)) < 0.5, -1.0, 1.0).astype(np.float32)  # every q = ±127
        for weight, inputs in ((w, x), (w_extreme, x_sign)):
            reference = matmul_isa("scalar", weight, inputs)
            with kernels.use_amx(True):
                tiles = matmul_isa("avx512", weight, inputs)
            with kernels.use_amx(False):
                vector = matmul_isa("avx512", weight, inputs)
            np.testing.assert_array_equal(bits(tiles), bits(reference), err_msg=f"AMX, n = {n}")
            np.testing.assert_array_equal(bits(vector), bits(reference), err_msg=f"no AMX, n = {n}")
    value, magnitude = int8_reference(reference_weights(w_extreme), x_sign)
    assert np.all(np.abs(reference - value) <= 1e-5 * magnitude)


@needs_amx
@pytest.mark.parametrize("dtype", FORMATS)
def test_amx_tiles_keep_batch_and_thread_invariance(dtype: str) -> None:
    """A token's row on tiles equals its GEMV row (vector kernels) whatever shares the call, for any
    thread count; the fused projections give the plain products' bits."""
    rng = np.random.default_rng(31)
    rows, cols, n = 2049, 512, 41
    w = random_weight(dtype, rows, cols, rng)
    x = activations(n, cols, rng)
    previous = kernels.get_num_threads()
    try:
        with kernels.use_isa("avx512"), kernels.use_amx(True):
            kernels.set_num_threads(2)
            full = quant.matmul(w, x)
            for t in (0, 16, 40):
                np.testing.assert_array_equal(bits(quant.matmul(w, x[t])), bits(full[t]))
            for subset in (list(range(40, 19, -1)), [3, 9, 27, 1, 0, 33, 12, 5, 8, 30], list(range(16))):
                np.testing.assert_array_equal(bits(quant.matmul(w, x[subset])), bits(full[subset]))
            for threads in (1, 3):
                kernels.set_num_threads(threads)
                np.testing.assert_array_equal(bits(quant.matmul(w, x)), bits(full))
            up = random_weight(dtype, rows, cols, rng)
            g = quant.matmul(w, x).astype(np.float64)
            u = quant.matmul(up, x).astype(np.float64)
            with np.errstate(over="ignore"):
                expected = g / (1.0 + np.exp(-g)) * u
            assert np.allclose(quant.gate_up_silu(w, up, x), expected, rtol=1e-5, atol=1e-6)
            q, k, v = quant.qkv(w, up, w, x)
            np.testing.assert_array_equal(bits(q), bits(full))
            np.testing.assert_array_equal(bits(k), bits(quant.matmul(up, x)))
    finally:
        kernels.set_num_threads(previous)


@pytest.mark.skipif("avx512" not in ISAS, reason="the Q4_K register row tiles are an AVX-512 kernel")
@pytest.mark.usefixtures("force_amd")
def test_q4_k_register_row_tiles_every_range_layout() -> None:
    """Q4_K with 1-32 tokens on AVX-512 (16-row tiles, up to 8 tokens a pass over each; on AMD cores 1-2
    tokens take the row-at-a-time GEMV instead) equals the scalar reference for every way a range splits
    into tiles: one partial tile (staged padded), whole tiles (the first read in place, the others staged a
    slice at a time, one block or several per row) and a partial last tile after whole ones; the fused
    projections (row ranges of 64) too."""
    rng = np.random.default_rng(37)
    previous = kernels.get_num_threads()
    try:
        kernels.set_num_threads(1)  # one range = the whole matrix
        for cols in (256, 768):
            for rows in (5, 16, 20, 32, 33, 55, 80):
                w = random_weight("Q4_K", rows, cols, rng)
                x = activations(20, cols, rng)
                reference = matmul_isa("scalar", w, x)
                for n in (1, 2, 3, 5, 8, 9, 20):
                    np.testing.assert_array_equal(
                        bits(matmul_isa("avx512", w, x[:n])),
                        bits(reference[:n]),
                        err_msg=f"{rows}x{cols}, n = {n}",
                    )
        w, up = (random_weight("Q4_K", 200, 512, rng) for _ in range(2))
        x = activations(3, 512, rng)
        with kernels.use_isa("avx512"):
            g = quant.matmul(w, x).astype(np.float64)
            u = quant.matmul(up, x).astype(np.float64)
            q, k, _ = quant.qkv(w, up, w, x)
            silu = quant.gate_up_silu(w, up, x)
        np.testing.assert_array_equal(bits(q), bits(matmul_isa("scalar", w, x)))
        np.testing.assert_array_equal(bits(k), bits(matmul_isa("scalar", up, x)))
        with np.errstate(over="ignore"):
            assert np.allclose(silu, g / (1.0 + np.exp(-g)) * u, rtol=1e-5, atol=1e-6)
    finally:
        kernels.set_num_threads(previous)


# ---- float32 path -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FORMATS)
@pytest.mark.parametrize("isa", ISAS)
def test_float_path_matches_float64(dtype: str, isa: str) -> None:
    rng = np.random.default_rng(21)
    rows, cols = 64, 2048  # 512 blocks
    w = random_weight(dtype, rows, cols, rng)
    wf = reference_weights(w)
    x = np.stack([np.sin(0.17 * np.arange(cols)), rng.standard_normal(cols)]).astype(np.float32)
    ours = matmul_isa(isa, w, x, float_path=True)
    ref = x.astype(np.float64) @ wf.T
    assert np.all(np.abs(ours - ref) <= 1e-3 + 1e-4 * np.abs(ref))


def test_kquant_tensors_from_a_gguf_file(tmp_path) -> None:
    """The same products through hymt.gguf's writer and reader (tensor views of the mapped file)."""
    rng = np.random.default_rng(8)
    weights = {dtype: random_weight(dtype, 9, 768, rng) for dtype in FORMATS}
    path = tmp_path / "kquant.gguf"
    writer = GGUFWriter(path)
    for dtype, w in weights.items():
        writer.add_tensor(w.name, list(w.dimensions), dtype, w.data)
    writer.write()
    x = activations(3, 768, rng)
    with GGUFFile(path) as f:
        for dtype, w in weights.items():
            tensor = f.tensor(w.name)
            assert tensor.dtype == dtype
            np.testing.assert_array_equal(bits(quant.matmul(tensor, x)), bits(quant.matmul(w, x)))


def test_head_shaped_q6_k_gemv() -> None:
    """The tied output head of the 1.8B models (120818 × 2048 Q6_K) at n = 1 vs float64."""
    rng = np.random.default_rng(120818)
    rows, cols = 120818, 2048
    w = random_weight("Q6_K", rows, cols, rng)
    x = activations(1, cols, rng)
    ours = quant.matmul(w, x[0])
    assert ours.shape == (rows,)
    assert np.isfinite(ours).all()
    # float64 reference on every 8th row and the last rows (decoding all 247M weights in numpy is slow)
    check = np.unique(np.concatenate([np.arange(0, rows, 8), np.arange(rows - 17, rows)]))
    blocks = w.data.reshape(rows, cols // 256 * BLOCK_BYTES["Q6_K"])[check].reshape(-1, BLOCK_BYTES["Q6_K"])
    wf = gguf_dequantize(blocks, GGMLQuantizationType.Q6_K).reshape(-1, cols).astype(np.float64)
    q, scale = quantize_int8(x)
    xq = (q * np.repeat(scale.astype(np.float64), 256, axis=1))[0]
    value, magnitude = wf @ xq, np.abs(wf) @ np.abs(xq)
    assert np.all(np.abs(ours[check] - value) <= 1e-5 * magnitude)


@pytest.mark.usefixtures("force_amd")
def test_q6_k_kernel_thresholds_equal_scalar() -> None:
    """Q6_K around every switch of its x86 kernels: the AVX-512 row-at-a-time GEMV (n <= 4; the float step with
    lane = token from n = 3), on AMD cores in passes of up to 4 tokens over each row up to n = 12, and 16-row
    tiles (from n = 5 on Intel, n >= 13 on AMD; token tiles of 16 and passes of 64 tokens), the AMX tiles
    (n >= 13) and the AVX2 8-row tiles, and rows wider than the GEMV's stack table;
    rows = 37 leaves partial row tiles of both widths. Every path gives the scalar reference's bits, also on
    extreme codes and sub-scales with ±127 activations."""
    rng = np.random.default_rng(66)
    rows, cols = 37, 768
    w = random_weight("Q6_K", rows, cols, rng)
    extreme = np.full((rows * cols // 256, BLOCK_BYTES["Q6_K"]), 0xFF, dtype=np.uint8)
    extreme[::3, :192] = 0x00  # all codes 0 (q6 − 32 = −32)
    extreme[1::3, 192:208] = 0x80  # sub-scales −128
    extreme[:, 208:210] = fp16_bytes(np.full(len(extreme), 0.25))
    w_extreme = PackedMatrix("extreme", "Q6_K", (cols, rows), extreme.reshape(-1))
    for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 16, 17, 64, 65, 81):
        x = activations(n, cols, rng)
        x_sign = np.where(rng.random((n, cols)) < 0.5, -1.0, 1.0).astype(np.float32)
        for weight, inputs in ((w, x), (w_extreme, x_sign)):
            reference = matmul_isa("scalar", weight, inputs)
            for isa in SIMD_ISAS:
                for amx in (True, False):
                    with kernels.use_amx(amx):
                        ours = matmul_isa(isa, weight, inputs)
                    np.testing.assert_array_equal(
                        bits(ours), bits(reference), err_msg=f"{isa}, AMX {amx}, n = {n}"
                    )
    value, magnitude = int8_reference(reference_weights(w_extreme), x_sign)
    assert np.all(np.abs(reference - value) <= 1e-5 * magnitude)
    # 300 rows: the row tiles' super panels (256 rows in lanes of 16 rows, then 32 in lanes of 2, then
    # a partial tile of 12), one thread so one range holds them all
    tall = random_weight("Q6_K", 300, cols, rng)
    previous = kernels.get_num_threads()
    kernels.set_num_threads(1)
    try:
        for n in (5, 13):
            x = activations(n, cols, rng)
            reference = matmul_isa("scalar", tall, x)
            for isa in SIMD_ISAS:
                with kernels.use_amx(False):
                    np.testing.assert_array_equal(
                        bits(matmul_isa(isa, tall, x)), bits(reference), err_msg=f"{isa}, n = {n}"
                    )
    finally:
        kernels.set_num_threads(previous)
    # Rows wider than the GEMV's stack table (256 blocks) take its heap table (3-4 tokens, and on AMD
    # cores 7 in two passes).
    wide = random_weight("Q6_K", 16, 257 * 256, rng)
    for n in (3, 4, 7):
        x = activations(n, 257 * 256, rng)
        reference = matmul_isa("scalar", wide, x)
        for isa in SIMD_ISAS:
            np.testing.assert_array_equal(
                bits(matmul_isa(isa, wide, x)), bits(reference), err_msg=f"{isa}, n = {n}"
            )
