"""Q2_0C and STQ1_0: decoders and matrix products (REFERENCE.md §2.5, §2.6, §3.3, §3.4, §3.6, §12.3, §12.4).

References are independent of the code under test: the block layouts of §2 written out in numpy here, the
codebook meaning of §2.6 derived from its rule (not from the table), float64 products, and the §3.4
activation quantization written out in numpy.
"""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest

import hymt.kernels as kernels
import hymt.quant as quant
from hymt._kernels import quant as _quant
from hymt.errors import KernelError
from hymt.gguf import GGUFFile, GGUFWriter

ISAS = kernels.supported_isas()
SIMD_ISAS = [isa for isa in ISAS if isa != "scalar"]
BLOCK_LEN = {"STQ1_0": 256, "Q2_0C": 512}
BLOCK_BYTES = {"STQ1_0": 42, "Q2_0C": 130}
SCALE_OFFSET = {"STQ1_0": 40, "Q2_0C": 0}
FORMATS = ("STQ1_0", "Q2_0C")

# §2.6, index = (sign << 4) | nibble
CODEBOOK = np.array(
    [0xA9, 0x89, 0x29, 0x09, 0xA6, 0x86, 0x26, 0x06, 0x9A, 0x92, 0x1A, 0x12, 0x6A, 0x62, 0x4A, 0x42,
     0x01, 0x21, 0x81, 0xA1, 0x04, 0x24, 0x84, 0xA4, 0x10, 0x18, 0x90, 0x98, 0x40, 0x48, 0x60, 0x68],
    dtype=np.uint8,
)  # fmt: skip


@dataclass(frozen=True)
class PackedMatrix:
    """The attributes ``hymt.quant`` reads from a GGUFTensor (dims ``[cols, rows]``)."""

    name: str
    dtype: str
    dimensions: tuple[int, int]
    data: np.ndarray


# ---- numpy references of §2 ---------------------------------------------------------------------------


def scales_of(blocks: np.ndarray, dtype: str) -> np.ndarray:
    at = SCALE_OFFSET[dtype]
    return blocks[:, at : at + 2].copy().view(np.float16).astype(np.float32).reshape(-1)  # exact fp16 -> f32


def stq1_digits(blocks: np.ndarray) -> np.ndarray:
    """(nblocks, 256) int ternary digits of STQ1_0 blocks, stride-16 placement."""
    g = np.arange(64)
    nibble = (blocks[:, g // 2] >> (4 * (g % 2))) & 15
    sign = (blocks[:, 32 + g // 8] >> (g % 8)) & 1
    book = CODEBOOK[(sign.astype(np.int64) << 4) | nibble]
    digits = np.empty((blocks.shape[0], 256), dtype=np.int64)
    for p in range(4):
        digits[:, (g // 16) * 64 + (g % 16) + 16 * p] = ((book >> (2 * p)) & 3).astype(np.int64) - 1
    return digits


def q2c_units(blocks: np.ndarray) -> np.ndarray:
    """(nblocks, 512) int values 2·code − 3 of Q2_0C blocks, low bits first."""
    i = np.arange(512)
    codes = (blocks[:, 2 + i // 4] >> (2 * (i % 4))) & 3
    return 2 * codes.astype(np.int64) - 3


def units_of(blocks: np.ndarray, dtype: str) -> np.ndarray:
    return stq1_digits(blocks) if dtype == "STQ1_0" else q2c_units(blocks)


def reference_decode(dtype: str, raw: np.ndarray) -> np.ndarray:
    """w = f32(unit) × d in float32 (so a zero digit times a negative d is −0.0)."""
    blocks = raw.reshape(-1, BLOCK_BYTES[dtype])
    d = scales_of(blocks, dtype)[:, None]
    with np.errstate(invalid="ignore"):  # 0 × inf = NaN, as in float32 C
        return (units_of(blocks, dtype).astype(np.float32) * d).reshape(-1)


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def assert_same_floats(ours: np.ndarray, ref: np.ndarray) -> None:
    """Bit-identical (sign of zero included), NaN positions identical."""
    assert ours.shape == ref.shape and ours.dtype == np.float32
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(ours), nan)
    mismatch = np.flatnonzero(bits(ours)[~nan] != bits(ref)[~nan])
    assert mismatch.size == 0, f"{mismatch.size} values differ, first at {mismatch[0]}"


def random_blocks(dtype: str, nblocks: int, rng: np.random.Generator, scale: float = 0.05) -> np.ndarray:
    blocks = rng.integers(0, 256, size=(nblocks, BLOCK_BYTES[dtype]), dtype=np.uint8)
    d = rng.uniform(scale / 10, scale, nblocks) * rng.choice([-1.0, 1.0], nblocks)
    at = SCALE_OFFSET[dtype]
    blocks[:, at : at + 2] = d.astype(np.float16).reshape(-1, 1).view(np.uint8)
    return blocks


def random_weight(dtype: str, rows: int, cols: int, rng: np.random.Generator) -> PackedMatrix:
    data = random_blocks(dtype, rows * cols // BLOCK_LEN[dtype], rng).reshape(-1)
    data.flags.writeable = False
    return PackedMatrix(f"blk.0.{dtype.lower()}", dtype, (cols, rows), data)


# ---- decoders -----------------------------------------------------------------------------------------

SPECIAL_HALVES = np.array(
    [0x0000, 0x8000, 0x3C00, 0xBC00, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00,
     0x7E00, 0x3555, 0xC8CD],
    dtype=np.uint16,
)  # ±0, ±1, subnormals, min normal, ±65504, ±inf, NaN, 1/3-ish, −9.6  # fmt: skip


@pytest.mark.parametrize("dtype", FORMATS)
def test_decoder_matches_numpy_reference_on_random_and_special_blocks(dtype: str) -> None:
    rng = np.random.default_rng(1)
    blocks = random_blocks(dtype, 2000, rng)
    at = SCALE_OFFSET[dtype]
    blocks[: SPECIAL_HALVES.size, at : at + 2] = SPECIAL_HALVES.reshape(-1, 1).view(np.uint8)
    blocks[SPECIAL_HALVES.size, :] = 0  # all-zero block
    blocks[SPECIAL_HALVES.size + 1, :] = 0xFF
    raw = blocks.reshape(-1)
    assert_same_floats(quant.dequantize(dtype, raw), reference_decode(dtype, raw))
    assert_same_floats(quant.dequantize(dtype, raw.tobytes()), reference_decode(dtype, raw))


def test_stq1_zero_digit_with_negative_scale_is_negative_zero() -> None:
    block = np.zeros((1, 42), dtype=np.uint8)  # nibble 0 / sign 0 everywhere: codebook 0xa9, lane 0 is zero
    block[0, 40:42] = np.array([-0.75], dtype=np.float16).view(np.uint8)
    values = quant.dequantize("STQ1_0", block.reshape(-1))
    zeros = values[values == 0]
    assert zeros.size == 64 and np.all(np.signbit(zeros))
    np.testing.assert_array_equal(np.flatnonzero(values == 0) % 64 // 16, np.zeros(64))


def codebook_rule(sign: int, nibble: int) -> list[int]:
    """§2.6's meaning: nibble = 4z + t; lane z is 0; the others, in order: +1, ±(t bit 0), ±(t bit 1); sign
    bit 1 negates all three."""
    z, t = divmod(nibble, 4)
    others = [1, -1 if t & 1 else 1, -1 if t & 2 else 1]
    lanes, k = [], 0
    for p in range(4):
        if p == z:
            lanes.append(0)
        else:
            lanes.append(-others[k] if sign else others[k])
            k += 1
    return lanes


def test_stq1_codebook_meaning_and_stride16_placement_for_all_patterns() -> None:
    # Block s gives group g the pattern (g + s) % 32 (with a distinct scale per block), so across the 32
    # blocks every group position holds every pattern.
    blocks = np.zeros((32, 42), dtype=np.uint8)
    expected = np.zeros((32, 256), dtype=np.float32)
    scales = np.array([0.5, -2.0, 1.25, -0.125] * 8, dtype=np.float16)
    for s in range(32):
        for g in range(64):
            pattern = (g + s) % 32
            sign, nibble = pattern >> 4, pattern & 15
            blocks[s, g // 2] |= nibble << (4 * (g % 2))
            blocks[s, 32 + g // 8] |= sign << (g % 8)
            for p, digit in enumerate(codebook_rule(sign, nibble)):
                expected[s, (g // 16) * 64 + (g % 16) + 16 * p] = np.float32(digit) * np.float32(scales[s])
        blocks[s, 40:42] = scales[s : s + 1].view(np.uint8)
    assert_same_floats(quant.dequantize("STQ1_0", blocks.reshape(-1)), expected.reshape(-1))
    for pattern in range(32):  # the rule reproduces the codebook table byte by byte
        lanes = codebook_rule(pattern >> 4, pattern & 15)
        assert sum((digit + 1) << (2 * p) for p, digit in enumerate(lanes)) == CODEBOOK[pattern]


def test_q2_0c_code_order_is_low_bits_first() -> None:
    block = np.full(130, 0b11100100, dtype=np.uint8)
    block[0:2] = np.array([0.5], dtype=np.float16).view(np.uint8)
    values = quant.dequantize("Q2_0C", block)
    np.testing.assert_array_equal(values, np.tile(np.array([-1.5, -0.5, 0.5, 1.5], dtype=np.float32), 128))


def check_value_input(dtype: str) -> np.ndarray:
    """§12.3 recipe: byte i of block b = (i·37 + b·79 + 11) % 256, then the fp16 scale of block b."""
    size, at = BLOCK_BYTES[dtype], SCALE_OFFSET[dtype]
    blocks = np.array([[(i * 37 + b * 79 + 11) % 256 for i in range(size)] for b in range(3)], dtype=np.uint8)
    blocks[:, at : at + 2] = np.array([0.03125, -1.5, 0.0], dtype=np.float16).reshape(-1, 1).view(np.uint8)
    return blocks.reshape(-1)


@pytest.mark.parametrize(
    ("dtype", "count", "sha256", "first"),
    [
        (
            "Q2_0C",
            1536,
            "8feb90f3c58c9c1e4d836a95fa32c83bfd648126907a4e2c8c5c4fd5e83933c2",
            [-0.03125, -0.03125, -0.03125, -0.03125, 0.03125, 0.03125, 0.09375],
        ),
        (
            "STQ1_0",
            768,
            "fd7aafa5fce32e555e975e10e869d6b295d18f45c7bfebce9ed04116ba584928",
            [-0.03125, 0.0, 0.0, 0.0, 0.03125, -0.03125],
        ),
    ],
)
def test_decoder_check_values(dtype: str, count: int, sha256: str, first: list[float]) -> None:
    raw = check_value_input(dtype)
    values = quant.dequantize(dtype, raw)
    assert values.size == count
    assert hashlib.sha256(values.astype("<f4").tobytes()).hexdigest() == sha256
    np.testing.assert_array_equal(values[: len(first)], np.array(first, dtype=np.float32))
    assert_same_floats(values, reference_decode(dtype, raw))


@pytest.mark.parametrize("dtype", FORMATS)
def test_decoder_rejects_partial_blocks(dtype: str) -> None:
    with pytest.raises(KernelError, match=f"wrong {dtype} byte count"):
        quant.dequantize(dtype, np.zeros(BLOCK_BYTES[dtype] + 1, dtype=np.uint8))
    out = np.empty(BLOCK_LEN[dtype] + 1, dtype=np.float32)
    with pytest.raises(KernelError, match=f"partial {dtype} output block"):
        quant.decode(dtype, np.zeros(BLOCK_BYTES[dtype], dtype=np.uint8), out)


@pytest.mark.parametrize("dtype", FORMATS)
def test_decode_rows_of_a_matrix(dtype: str) -> None:
    rng = np.random.default_rng(2)
    w = random_weight(dtype, 9, 2 * BLOCK_LEN[dtype], rng)
    full = reference_decode(dtype, w.data).reshape(9, -1)
    assert_same_floats(quant.decode_rows(w, [8, 0, 3, 3]), full[[8, 0, 3, 3]])
    with pytest.raises(KernelError, match="row 9 out of range"):
        quant.decode_rows(w, [9])


# ---- products -----------------------------------------------------------------------------------------


def quantize_int8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """§3.4 in numpy: per group of 256, inverse = 127/max and scale = max/127 (float32 divisions),
    q = round_half_even(x × inverse) clamped to ±127; all zero when max = 0."""
    n, cols = x.shape
    groups = x.astype(np.float32).reshape(n, cols // 256, 256)
    amax = np.abs(groups).max(axis=2, keepdims=True)
    safe = np.where(amax > 0, amax, np.float32(1))
    inverse = np.where(amax > 0, np.float32(127) / safe, np.float32(0)).astype(np.float32)
    scale = np.where(amax > 0, safe / np.float32(127), np.float32(0)).astype(np.float32)
    q = np.clip(np.rint(groups * inverse), -127, 127)
    return q.reshape(n, cols).astype(np.int64), scale[:, :, 0]


def int8_reference(w: PackedMatrix, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 Σ_blocks (d × s) × Σ unit·q over the same int8 activations, and Σ |terms| per output."""
    cols, rows = w.dimensions
    blocks = w.data.reshape(-1, BLOCK_BYTES[w.dtype])
    units = units_of(blocks, w.dtype).reshape(rows, cols).astype(np.float64)
    d = np.repeat(scales_of(blocks, w.dtype).astype(np.float64).reshape(rows, -1), BLOCK_LEN[w.dtype], axis=1)
    q, s = quantize_int8(x)
    xq = q.astype(np.float64) * np.repeat(s.astype(np.float64), 256, axis=1)  # (n, cols)
    wd = units * d  # (rows, cols), exact in float64
    return xq @ wd.T, np.abs(xq) @ np.abs(wd).T


def activations(n: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal((n, cols)).astype(np.float32)
    x[:, ::97] *= 25.0  # outliers set the group scales
    if n > 1 and cols >= 512:
        x[1, 256:512] = 0.0  # an all-zero group: scale 0, q = 0
    return x


def matmul_isa(isa: str, w: PackedMatrix, x: np.ndarray, **kwargs: bool) -> np.ndarray:
    with kernels.use_isa(isa):
        return quant.matmul(w, x, **kwargs)


# (cols, rows, n), sampled from cols {256, 512, 2048, 6144} × rows {1, 7, 64, 2049} × n {1, 2, 3, 7, 16,
# 17, 64, 256}; Q2_0C needs cols % 512 == 0.
SHAPES = [
    (256, 1, 1),
    (256, 7, 3),
    (512, 64, 17),
    (512, 2049, 2),
    (2048, 7, 16),
    (2048, 64, 64),
    (2048, 1, 256),
    (6144, 7, 1),
    (6144, 64, 7),
    (512, 17, 256),
    (2048, 2049, 1),
]


@pytest.mark.parametrize("dtype", FORMATS)
@pytest.mark.parametrize(("cols", "rows", "n"), SHAPES)
def test_int8_product_every_isa_equals_scalar_and_float64(dtype: str, cols: int, rows: int, n: int) -> None:
    if cols % BLOCK_LEN[dtype]:
        pytest.skip("Q2_0C rows are whole 512-weight blocks")
    rng = np.random.default_rng(cols * 7 + rows * 3 + n)
    w = random_weight(dtype, rows, cols, rng)
    x = activations(n, cols, rng)
    scalar = matmul_isa("scalar", w, x)
    for isa in SIMD_ISAS:
        assert_same_floats(matmul_isa(isa, w, x), scalar)
    ref, magnitude = int8_reference(w, x)
    assert np.all(np.abs(scalar.astype(np.float64) - ref) <= 1e-5 * magnitude + 1e-30)


@pytest.mark.parametrize("dtype", FORMATS)
def test_int8_product_extreme_codes_scales_and_activations(dtype: str) -> None:
    rng = np.random.default_rng(3)
    cols, rows = 2048, 48
    blocks = random_blocks(dtype, rows * cols // BLOCK_LEN[dtype], rng)
    per_row = cols // BLOCK_LEN[dtype]
    at = SCALE_OFFSET[dtype]
    blocks[0:per_row] = 0xFF  # row 0: all code bytes 0xff (scale 0xffff is a NaN: set a real one below)
    blocks[per_row : 2 * per_row] = 0  # row 1: all zero (scale +0)
    blocks[:per_row, at : at + 2] = np.array([65504.0], dtype=np.float16).view(np.uint8)
    halves = np.array([0x0001, 0x8001, 0x0400, 0x7BFF, 0xFBFF, 0x8000], dtype=np.uint16)  # subnormal, huge
    blocks[2 * per_row : 2 * per_row + halves.size, at : at + 2] = halves.reshape(-1, 1).view(np.uint8)
    w = PackedMatrix("w", dtype, (cols, rows), blocks.reshape(-1))
    x = activations(5, cols, rng)
    x[2] = 0.0
    x[3, :256] = 1e-30  # tiny group scale
    x[4] = np.where(np.arange(cols) % 2 == 0, 127.0, -127.0)  # every activation at ±127 exactly
    scalar = matmul_isa("scalar", w, x)
    for isa in SIMD_ISAS:
        assert_same_floats(matmul_isa(isa, w, x), scalar)
    ref, magnitude = int8_reference(w, x)
    finite = np.isfinite(ref)
    assert np.all(np.abs(scalar[finite].astype(np.float64) - ref[finite]) <= 1e-5 * magnitude[finite] + 1e-30)


@pytest.mark.skipif(
    "avx512" not in ISAS or not kernels.cpu_features()["avx512vbmi"], reason="needs AVX-512 with VBMI"
)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 6, 21])
def test_stq1_avx512_without_vbmi_equals_scalar(n: int) -> None:
    """The plain AVX-512BW lookups (what AVX-512 CPUs without VBMI run) against the scalar reference."""
    rng = np.random.default_rng(8)
    w = random_weight("STQ1_0", 37, 1536, rng)
    x = activations(n, 1536, rng)
    scalar = matmul_isa("scalar", w, x)
    _quant._allow_vbmi(False)
    try:
        assert not kernels.cpu_features()["avx512vbmi"]
        bw = matmul_isa("avx512", w, x)
    finally:
        _quant._allow_vbmi(True)
    assert_same_floats(bw, scalar)
    assert_same_floats(matmul_isa("avx512", w, x), scalar)


@pytest.mark.skipif("avx512" not in ISAS, reason="needs AVX-512")
@pytest.mark.parametrize(("cols", "rows"), [(2048, 165), (6144, 49), (1536, 33), (257 * 256, 17)])
def test_stq1_single_token_stream_edges_equal_scalar(cols: int, rows: int) -> None:
    """n = 1 on AVX-512 reads the rows as one stream in groups of 16 row-blocks that span rows: 8 and
    24 blocks per row (lanes in runs of 8, the 16 x 8 transpose), 6 (per-lane offsets, gathers), tiles
    and calls ending mid-group (odd row counts, a row range starting at row 3, two threads' chunks),
    and rows wider than its buffers (257 blocks: the row-tile kernel); with VBMI and without."""
    rng = np.random.default_rng(cols + rows)
    w = random_weight("STQ1_0", rows, cols, rng)
    x = activations(1, cols, rng)[0]
    scalar = matmul_isa("scalar", w, x)
    row_bytes = cols // 256 * 42
    part = PackedMatrix("part", "STQ1_0", (cols, rows - 3), w.data[3 * row_bytes :])
    threads = kernels.get_num_threads()
    try:
        for vbmi in (True, False):
            _quant._allow_vbmi(vbmi)
            for count in (1, 2):
                kernels.set_num_threads(count)
                assert_same_floats(matmul_isa("avx512", w, x), scalar)
                assert_same_floats(matmul_isa("avx512", part, x), scalar[3:])
    finally:
        _quant._allow_vbmi(True)
        kernels.set_num_threads(threads)


def test_q2_0c_every_small_batch_size_equals_scalar_and_each_token_alone() -> None:
    """n = 1..9 covers each token-tile width of the Q2_0C small-batch kernels and the switch to the
    batched kernel; 40 rows end in a partial 16-row tile."""
    rng = np.random.default_rng(12)
    w = random_weight("Q2_0C", 40, 1024, rng)
    x = activations(9, 1024, rng)
    alone = np.stack([matmul_isa("scalar", w, x[t]) for t in range(9)])
    for n in range(1, 10):
        for isa in ISAS:
            assert_same_floats(matmul_isa(isa, w, x[:n]), alone[:n])


def test_q2_0c_activation_groups_at_the_quantizer_edges() -> None:
    """Q2_0C quantizes its activations itself on AVX-512 (fused with the de-interleave): the same int8
    values as every other ISA for a subnormal group max (inverse = inf, 0 × inf counts as 0), exact
    halves (round half to even), NaN inputs (ignored by the max, quantized to 0) and infinities."""
    rng = np.random.default_rng(13)
    w = random_weight("Q2_0C", 24, 1536, rng)
    x = activations(2, 1536, rng)
    x[0, :256] = 0.0
    x[0, 3] = np.float32(1e-40)  # subnormal max
    x[0, 256:512] = (np.arange(256) % 9 - 4).astype(np.float32) + np.float32(0.5)  # ±k.5
    x[0, 300] = 127.0  # max 127: inverse 1, the halves stay halves
    x[1, 512 + 17] = np.nan
    x[1, 1024 + 5] = np.inf
    scalar = matmul_isa("scalar", w, x)
    for isa in SIMD_ISAS:
        assert_same_floats(matmul_isa(isa, w, x), scalar)


@pytest.mark.parametrize("isa", ISAS)
def test_stq1_every_token_tile_size_equals_the_tokens_alone(isa: str) -> None:
    """n = 1..9 runs every STQ1_0 token tile (row kernels: 1..3 tokens; batched: 4..8, then 8 + 1) on a
    partial 16-row tile; each token must equal its scalar product computed alone."""
    rng = np.random.default_rng(9)
    cols, rows = 768, 37
    w = random_weight("STQ1_0", rows, cols, rng)
    x = activations(9, cols, rng)
    alone = np.stack([matmul_isa("scalar", w, x[t]) for t in range(9)])
    for n in range(1, 10):
        assert_same_floats(matmul_isa(isa, w, x[:n]), alone[:n])


@pytest.mark.parametrize("isa", ISAS)
def test_stq1_full_token_passes_over_two_block_chunks_equal_the_tokens_alone(isa: str) -> None:
    """8 and 16 tokens (one and two full 8-token passes of the batched kernel, whose 8-token steps are
    unrolled) over 18 blocks per row (a 16-block chunk, then 2 more accumulated onto y) and 45 rows
    (a partial second 32-row tile); each token must equal its scalar product computed alone."""
    rng = np.random.default_rng(14)
    cols, rows = 18 * 256, 45
    w = random_weight("STQ1_0", rows, cols, rng)
    x = activations(16, cols, rng)
    alone = np.stack([matmul_isa("scalar", w, x[t]) for t in range(16)])
    for n in (8, 16):
        assert_same_floats(matmul_isa(isa, w, x[:n]), alone[:n])


@pytest.fixture
def as_amd() -> Iterator[None]:
    """The STQ1_0 table lookup runs on AMD cores only; this lets any VBMI machine run it."""
    previous = _quant._as_amd(True)
    try:
        yield
    finally:
        _quant._as_amd(previous)


@pytest.mark.parametrize("isa", ISAS)
def test_stq1_table_lookup_tiles_and_token_passes_equal_the_tokens_alone(isa: str, as_amd: None) -> None:
    """From 8 tokens the AVX-512 VBMI kernel (AMD) looks Σ digit·q up in tables the activations carry,
    on 64-row tiles in passes of 4 tokens: 8..11 tokens end on every pass size, 70 rows leave a second
    tile with 6 live rows (three of its quarters masked), 3 blocks per row; each token must equal its
    scalar product computed alone (other ISAs run their own kernels on the same cases)."""
    rng = np.random.default_rng(15)
    cols, rows = 3 * 256, 70
    w = random_weight("STQ1_0", rows, cols, rng)
    x = activations(13, cols, rng)
    alone = np.stack([matmul_isa("scalar", w, x[t]) for t in range(13)])
    for n in (8, 9, 10, 11, 13):
        assert_same_floats(matmul_isa(isa, w, x[:n]), alone[:n])
    part = PackedMatrix("part", "STQ1_0", (cols, rows - 5), w.data[5 * (cols // 256) * 42 :])
    assert_same_floats(matmul_isa(isa, part, x[:9]), alone[:9, 5:])


@pytest.mark.parametrize(("nblocks", "rows"), [(1, 37), (2, 45), (3, 9), (18, 70)])
def test_stq1_pipelined_tiles_equal_the_tokens_alone(nblocks: int, rows: int, as_amd: None) -> None:
    """On AMD cores 4..7 tokens walk each 32-row tile block by block, indexing the next block's rows
    during the current block's dot steps: one, two, three and 18 blocks per row, full and partial tiles
    (9 rows: a half with no live rows), and a row range that starts inside the matrix; each token must
    equal its scalar product computed alone."""
    rng = np.random.default_rng(17 + nblocks)
    cols = nblocks * 256
    w = random_weight("STQ1_0", rows, cols, rng)
    x = activations(7, cols, rng)
    alone = np.stack([matmul_isa("scalar", w, x[t]) for t in range(7)])
    for n in (4, 5, 6, 7):
        assert_same_floats(quant.matmul(w, x[:n]), alone[:n])
    part = PackedMatrix("part", "STQ1_0", (cols, rows - 3), w.data[3 * nblocks * 42 :])
    assert_same_floats(quant.matmul(part, x[:4]), alone[:4, 3:])


def test_stq1_batches_larger_than_one_activation_slab_equal_the_tokens_alone(as_amd: None) -> None:
    """A call whose prepared activations pass the driver's 8 MiB bound (STQ1_0 with lookup tables: ~19 KB
    per token at 2048 columns) runs its tokens in slabs; the results must not show it."""
    rng = np.random.default_rng(16)
    cols, rows, n = 2048, 20, 520
    w = random_weight("STQ1_0", rows, cols, rng)
    x = activations(n, cols, rng)
    whole = quant.matmul(w, x)
    for t in (0, 255, 443, 444, 519):
        assert_same_floats(whole[t], matmul_isa("scalar", w, x[t]))
    assert_same_floats(whole, matmul_isa("scalar", w, x))


@pytest.mark.parametrize("dtype", FORMATS)
@pytest.mark.parametrize("isa", ISAS)
def test_batch_composition_row_ranges_and_threads_do_not_change_results(dtype: str, isa: str) -> None:
    rng = np.random.default_rng(4)
    cols, rows, n = 1024, 333, 19
    w = random_weight(dtype, rows, cols, rng)
    x = activations(n, cols, rng)
    threads = kernels.get_num_threads()
    try:
        kernels.set_num_threads(1)
        whole = matmul_isa(isa, w, x)
        for count in (2, 4):
            kernels.set_num_threads(count)
            assert_same_floats(matmul_isa(isa, w, x), whole)
    finally:
        kernels.set_num_threads(threads)
    for t in (0, 1, 7, 18):  # each token alone (n = 1, a 1-D input)
        assert_same_floats(matmul_isa(isa, w, x[t]), whole[t])
    for subset in ([3, 1, 4], [18, 0], list(range(9, 19))):  # other batch compositions and orders
        assert_same_floats(matmul_isa(isa, w, x[subset]), whole[subset])
    # rows of a sub-matrix (another row range and row-tile alignment) give the same values
    row_bytes = cols // BLOCK_LEN[dtype] * BLOCK_BYTES[dtype]
    part = PackedMatrix("part", dtype, (cols, rows - 5), w.data[5 * row_bytes :])
    assert_same_floats(matmul_isa(isa, part, x), whole[:, 5:])


@pytest.mark.parametrize("dtype", FORMATS)
@pytest.mark.parametrize("isa", ISAS)
def test_float_path_matches_float64(dtype: str, isa: str) -> None:
    rng = np.random.default_rng(5)
    cols, rows = 2048, 70
    w = random_weight(dtype, rows, cols, rng)
    wf = reference_decode(dtype, w.data).reshape(rows, cols).astype(np.float64)
    x = np.sin(0.17 * np.arange(cols)).astype(np.float32)  # §3.6 row-dot input
    ref = wf @ x.astype(np.float64)
    y = matmul_isa(isa, w, x, float_path=True)
    assert np.all(np.abs(y - ref) <= 1e-3 + 1e-4 * np.abs(ref))
    xs = activations(3, cols, rng)
    ref = xs.astype(np.float64) @ wf.T
    y = matmul_isa(isa, w, xs, float_path=True)
    assert np.all(np.abs(y - ref) <= 1e-3 + 1e-4 * (np.abs(xs.astype(np.float64)) @ np.abs(wf).T))


@pytest.mark.parametrize(
    ("dtype", "profile", "file_type"), [("STQ1_0", "tencent-stq1", 41), ("Q2_0C", "tencent-q2-0c", 39)]
)
def test_products_of_tensors_read_from_a_tencent_gguf(
    tmp_path, dtype: str, profile: str, file_type: int
) -> None:
    rng = np.random.default_rng(6)
    cols, rows = 1024, 40
    w = random_weight(dtype, rows, cols, rng)
    writer = GGUFWriter(tmp_path / f"{dtype}.gguf")
    writer.add_string("general.architecture", "hunyuan-dense")
    writer.add_uint32("general.file_type", file_type)
    writer.add_tensor("blk.0.ffn_up.weight", [cols, rows], dtype, w.data)
    path = writer.write()
    with GGUFFile(path, profile=profile) as gguf:
        tensor = gguf.tensor("blk.0.ffn_up.weight")
        assert tensor.dtype == dtype
        x = activations(3, cols, rng)
        assert_same_floats(quant.matmul(tensor, x), quant.matmul(w, x))
        assert_same_floats(quant.dequantize(dtype, tensor.data), reference_decode(dtype, w.data))


def guarded_copy(data: np.ndarray) -> tuple[mmap.mmap, np.ndarray]:
    """``data`` copied so that its last byte is the last readable byte: the next page is PROT_NONE, so any
    read past the tensor faults instead of passing silently."""
    page = mmap.PAGESIZE
    pages = -(-data.size // page)
    region = mmap.mmap(-1, (pages + 1) * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(ctypes.c_void_p(base + pages * page), page, 0) == 0
    view = np.frombuffer(region, dtype=np.uint8, count=data.size, offset=pages * page - data.size)
    view[:] = data
    return region, view


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses mprotect through libc")
@pytest.mark.parametrize("dtype", FORMATS)
@pytest.mark.parametrize("rows", [1, 16, 37])
def test_kernels_never_read_past_the_tensor(dtype: str, rows: int, as_amd: None) -> None:
    rng = np.random.default_rng(rows)
    cols = 2 * BLOCK_LEN[dtype]
    w = random_weight(dtype, rows, cols, rng)
    region, data = guarded_copy(w.data)
    guarded = PackedMatrix(w.name, dtype, w.dimensions, data)
    x = activations(9, cols, rng)
    for isa in ISAS:
        # row kernels (n < 4), batched tiles, and from 8 tokens STQ1_0's table lookup (64-row tiles)
        for xs in (x[0], x[:2], x[:5], x):
            assert_same_floats(matmul_isa(isa, guarded, xs), matmul_isa("scalar", w, xs))
        matmul_isa(isa, guarded, x, float_path=True)
    assert_same_floats(quant.decode_rows(guarded, [rows - 1])[0], reference_decode(dtype, w.data)[-cols:])
    assert_same_floats(quant.dequantize(dtype, data), reference_decode(dtype, w.data))
    del guarded, data
    region.close()


@pytest.mark.parametrize("dtype", FORMATS)
def test_product_shape_errors(dtype: str) -> None:
    w = random_weight(dtype, 3, BLOCK_LEN[dtype], np.random.default_rng(7))
    with pytest.raises(KernelError, match="invalid activation shape"):
        quant.matmul(w, np.zeros(BLOCK_LEN[dtype] + 1, dtype=np.float32))
    short = PackedMatrix("short", dtype, w.dimensions, w.data[:-1])
    with pytest.raises(KernelError):
        quant.matmul(short, np.zeros(BLOCK_LEN[dtype], dtype=np.float32))


# ---- AMX tile kernels (batched products where the CPU has AMX-INT8) ------------------------------------

needs_amx = pytest.mark.skipif(
    "avx512" not in ISAS or not kernels.cpu_features()["amx_int8"], reason="needs AMX-INT8 tiles"
)
# the thresholds (STQ1_0 n = 5, Q2_0C n = 6), tiles of live rows only (n < 32), whole and zero-padded tiles
AMX_BATCHES = [1, 4, 5, 6, 7, 8, 15, 16, 17, 20, 31, 32, 33, 64, 100]


def matmul_amx(w: PackedMatrix, x: np.ndarray, enabled: bool) -> np.ndarray:
    with kernels.use_amx(enabled):
        return matmul_isa("avx512", w, x)


@needs_amx
@pytest.mark.parametrize("dtype", FORMATS)
@pytest.mark.parametrize(("cols", "rows"), [(1536, 37), (2048, 16), (1024, 81)])
def test_amx_products_equal_scalar_vector_and_each_token_alone(dtype: str, cols: int, rows: int) -> None:
    """Tile sums are exact: on both sides of the AMX thresholds, for calls of fewer than 32 tokens (token
    tiles of their live rows), zero-padded partial token tiles (n % 16 from 33 on) and partial 16- and
    32-row weight tiles, every token equals the scalar reference, the vector kernels (AMX off) and its own
    product computed alone."""
    rng = np.random.default_rng(cols + rows)
    w = random_weight(dtype, rows, cols, rng)
    x = activations(max(AMX_BATCHES), cols, rng)
    alone = np.stack([matmul_isa("scalar", w, x[t]) for t in range(x.shape[0])])
    for n in AMX_BATCHES:
        amx = matmul_amx(w, x[:n], True)
        assert_same_floats(amx, alone[:n])
        assert_same_floats(matmul_amx(w, x[:n], False), alone[:n])
        assert_same_floats(matmul_isa("scalar", w, x[:n]), alone[:n])


@needs_amx
@pytest.mark.parametrize("dtype", FORMATS)
def test_amx_threads_row_ranges_and_batch_composition(dtype: str) -> None:
    rng = np.random.default_rng(21)
    cols, rows, n = 1024, 333, 50
    w = random_weight(dtype, rows, cols, rng)
    x = activations(n, cols, rng)
    threads = kernels.get_num_threads()
    try:
        kernels.set_num_threads(1)
        whole = matmul_amx(w, x, True)
        for count in (2, 3, 4):
            kernels.set_num_threads(count)
            assert_same_floats(matmul_amx(w, x, True), whole)
    finally:
        kernels.set_num_threads(threads)
    assert_same_floats(whole, matmul_isa("scalar", w, x))
    perm = rng.permutation(n)
    assert_same_floats(matmul_amx(w, x[perm], True), whole[perm])
    for subset in (list(range(3, 20)), list(range(49, 15, -2))):  # 17 tokens in another order, 17 strided
        assert_same_floats(matmul_amx(w, x[subset], True), whole[subset])
    row_bytes = cols // BLOCK_LEN[dtype] * BLOCK_BYTES[dtype]
    part = PackedMatrix("part", dtype, (cols, rows - 21), w.data[21 * row_bytes :])
    assert_same_floats(matmul_amx(part, x[:40], True), whole[:40, 21:])


@needs_amx
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses mprotect through libc")
@pytest.mark.parametrize("dtype", FORMATS)
@pytest.mark.parametrize("rows", [1, 16, 37])
def test_amx_kernels_never_read_past_the_tensor(dtype: str, rows: int) -> None:
    rng = np.random.default_rng(40 + rows)
    cols = 2 * BLOCK_LEN[dtype]
    w = random_weight(dtype, rows, cols, rng)
    region, data = guarded_copy(w.data)
    guarded = PackedMatrix(w.name, dtype, w.dimensions, data)
    x = activations(33, cols, rng)
    for n in (5, 16, 20, 33):  # tiles of live rows, whole tiles, a zero-padded last tile
        assert_same_floats(matmul_amx(guarded, x[:n], True), matmul_isa("scalar", w, x[:n]))
    del guarded, data
    region.close()
