"""hymt's quantizers, decoded by the `gguf` package (an independent decoder)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from gguf.quants import quantize as gguf_quantize

from hymt.errors import GGUFError
from hymt.quantize import quantize

TYPES = {
    "Q8_0": GGMLQuantizationType.Q8_0,
    "Q4_K": GGMLQuantizationType.Q4_K,
    "Q6_K": GGMLQuantizationType.Q6_K,
}
BLOCK = {"Q8_0": (32, 34), "Q4_K": (256, 144), "Q6_K": (256, 210)}
# Relative RMS error bounds for Gaussian data (4-, 6- and 8-bit codes).
RELATIVE_RMS = {"Q8_0": 0.01, "Q4_K": 0.1, "Q6_K": 0.03}


def _relative_rms(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.sqrt(np.mean((x.astype(np.float64) - y) ** 2) / np.mean(x.astype(np.float64) ** 2)))


@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.parametrize("scale", [1e-3, 0.02, 1.0, 40.0])
def test_round_trip_through_gguf_decoder(dtype, scale):
    x = (np.random.default_rng(3).standard_normal((16, 512)) * scale).astype(np.float32)
    raw = quantize(dtype, x)
    block_len, block_bytes = BLOCK[dtype]
    assert raw.dtype == np.uint8 and raw.size == x.size // block_len * block_bytes
    y = dequantize(raw, TYPES[dtype]).reshape(-1)
    assert _relative_rms(x.reshape(-1), y) < RELATIVE_RMS[dtype]


@pytest.mark.parametrize("dtype", list(TYPES))
def test_special_blocks(dtype):
    """Zero blocks decode to zero; constants, outliers and all-positive blocks stay close."""
    rng = np.random.default_rng(4)
    zero = np.zeros(256, dtype=np.float32)
    constant = np.full(256, 0.5, dtype=np.float32)
    positive = rng.uniform(1.0, 2.0, 256).astype(np.float32)
    outlier = (rng.standard_normal(256) * 0.01).astype(np.float32)
    outlier[17] = 3.0
    x = np.concatenate([zero, constant, positive, outlier])
    y = dequantize(quantize(dtype, x), TYPES[dtype]).reshape(-1)
    assert np.array_equal(y[:256], zero)
    np.testing.assert_allclose(y[256:512], constant, atol=0.02)
    assert _relative_rms(positive, y[512:768]) < RELATIVE_RMS[dtype]
    assert abs(y[768 + 17] - 3.0) < 0.05


def test_q8_0_codes_match_gguf_quantizer():
    """gguf's own Q8_0 quantizer makes the same choice except at exact rounding ties."""
    x = (np.random.default_rng(5).standard_normal((32, 256))).astype(np.float32)
    ours = quantize("Q8_0", x)
    theirs = gguf_quantize(x, GGMLQuantizationType.Q8_0).reshape(-1)
    assert np.mean(ours != theirs) < 0.01
    y_ours = dequantize(ours, GGMLQuantizationType.Q8_0).reshape(-1)
    y_theirs = dequantize(theirs, GGMLQuantizationType.Q8_0).reshape(-1)
    step = np.abs(x).reshape(-1, 32).max(axis=1).repeat(32) / 127
    assert np.all(np.abs(y_ours - y_theirs) <= step * 1.01)


def test_per_element_error_bounded_by_half_a_step():
    x = (np.random.default_rng(6).standard_normal(4096) * 0.05).astype(np.float32)
    y = dequantize(quantize("Q8_0", x), GGMLQuantizationType.Q8_0).reshape(-1)
    d = np.abs(x).reshape(-1, 32).max(axis=1) / 127
    assert np.all(np.abs(x - y).reshape(-1, 32) <= (d * 0.5 * 1.01 + 1e-9)[:, None])


def test_float_formats_and_errors():
    x = np.array([1.0, -2.5, 3.25, 0.0], dtype=np.float32)
    assert np.array_equal(quantize("F32", x).view("<f4"), x)
    assert np.array_equal(quantize("F16", x).view("<f2").astype(np.float32), x)
    with pytest.raises(GGUFError, match="^partial Q4_K output block$"):
        quantize("Q4_K", np.zeros(128, dtype=np.float32))
    with pytest.raises(GGUFError):
        quantize("Q8_0", np.full(32, np.nan, dtype=np.float32))
    with pytest.raises(GGUFError, match="^no quantizer for Q5_K$"):
        quantize("Q5_K", np.zeros(256, dtype=np.float32))


# -- Tencent low-bit formats, decoded by REFERENCE §2.5 / §2.6 written out here ------------------------

STQ1_CODEBOOK = bytes(
    [0xA9, 0x89, 0x29, 0x09, 0xA6, 0x86, 0x26, 0x06, 0x9A, 0x92, 0x1A, 0x12, 0x6A, 0x62, 0x4A, 0x42,
     0x01, 0x21, 0x81, 0xA1, 0x04, 0x24, 0x84, 0xA4, 0x10, 0x18, 0x90, 0x98, 0x40, 0x48, 0x60, 0x68]
)  # fmt: skip


def decode_q2_0c(raw: np.ndarray) -> np.ndarray:
    out = []
    for block in raw.reshape(-1, 130):
        d = float(block[:2].copy().view("<f2")[0])
        for i in range(512):
            code = (int(block[2 + i // 4]) >> (2 * (i % 4))) & 3
            out.append((2 * code - 3) * d)
    return np.array(out, dtype=np.float32)


def decode_stq1_0(raw: np.ndarray) -> np.ndarray:
    out = np.zeros(raw.size // 42 * 256, dtype=np.float32)
    for b, block in enumerate(raw.reshape(-1, 42)):
        d = np.float32(block[40:42].copy().view("<f2")[0])
        for g in range(64):
            nibble = (int(block[g // 2]) >> (4 * (g % 2))) & 15
            sign = (int(block[32 + g // 8]) >> (g % 8)) & 1
            pattern = STQ1_CODEBOOK[(sign << 4) | nibble]
            for p in range(4):
                digit = ((pattern >> (2 * p)) & 3) - 1
                out[b * 256 + (g // 16) * 64 + (g % 16) + 16 * p] = np.float32(digit) * d
    return out


def test_q2_0c_round_trip():
    x = (np.random.default_rng(8).standard_normal(512 * 6) * 0.03).astype(np.float32)
    x[:512] = 0.0
    raw = quantize("Q2_0C", x)
    assert raw.size == 6 * 130
    y = decode_q2_0c(raw)
    assert np.array_equal(y[:512], np.zeros(512, dtype=np.float32))
    # A 4-level quantizer of Gaussian data cannot beat ≈ 0.345 relative RMS; stay close to that optimum.
    assert _relative_rms(x[512:], y[512:]) < 0.37


def test_stq1_0_round_trip_and_patterns():
    x = (np.random.default_rng(9).standard_normal(256 * 4) * 0.05).astype(np.float32)
    raw = quantize("STQ1_0", x)
    assert raw.size == 4 * 42
    y = decode_stq1_0(raw)
    # Groups (stride-16 lanes): exactly one zero, at the smallest magnitude; the others keep their signs.
    groups_x = x.reshape(-1, 4, 4, 16).transpose(0, 1, 3, 2).reshape(-1, 4)
    groups_y = y.reshape(-1, 4, 4, 16).transpose(0, 1, 3, 2).reshape(-1, 4)
    assert np.all((groups_y == 0).sum(axis=1) == 1)
    assert np.array_equal(np.argmin(np.abs(groups_x), axis=1), np.argmax(groups_y == 0, axis=1))
    nonzero = groups_y != 0
    assert np.array_equal(np.sign(groups_y[nonzero]), np.sign(groups_x[nonzero]))
    # d is the least-squares scale for those patterns: the mean magnitude of the kept weights.
    d = np.abs(y.reshape(-1, 256)).max(axis=1)
    kept = np.abs(x.reshape(-1, 256)) * (y.reshape(-1, 256) != 0)
    np.testing.assert_allclose(d, kept.sum(axis=1) / 192, rtol=1e-3)
    assert np.corrcoef(x, y)[0, 1] > 0.8
