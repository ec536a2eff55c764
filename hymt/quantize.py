"""float32 → GGUF block quantizers (Q8_0, Q4_K, Q6_K, Q2_0C, STQ1_0), vectorized over blocks with numpy.

Used to write synthetic models whose quantized weights decode close to known float weights. The scale
searches follow the formats' usual recipes (absolute maximum for Q8_0 and Q6_K, min/max for Q4_K, then
6- or 8-bit quantized sub-scales under one fp16 super-scale) without llama.cpp's iterative refinements:
enough for well-behaved weights, and every produced block decodes exactly as REFERENCE §2 specifies.
"""

from __future__ import annotations

import numpy as np

from hymt.errors import GGUFError

QK8_0 = 32
QK_K = 256


def _blocks(values: np.ndarray, block: int, dtype: str) -> np.ndarray:
    """Flat float32 values as (n_blocks, block); the count must be whole blocks."""
    flat = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    if flat.size % block:
        raise GGUFError(f"partial {dtype} output block")
    if not np.isfinite(flat).all():
        raise GGUFError(f"cannot quantize non-finite values to {dtype}")
    return flat.reshape(-1, block)


def _fp16(values: np.ndarray) -> np.ndarray:
    """Round to fp16 and back, so later steps use the scale a decoder will see."""
    return values.astype(np.float16).astype(np.float32)


def _inverse(scale: np.ndarray) -> np.ndarray:
    """1/scale where scale != 0, else 0 (an all-zero block quantizes to zero codes)."""
    out = np.zeros_like(scale)
    np.divide(1.0, scale, out=out, where=scale != 0)
    return out


def quantize_q8_0(values: np.ndarray) -> np.ndarray:
    """Q8_0: per 32 weights an fp16 scale d = max|x|/127 and int8 codes round(x/d). Returns uint8 bytes."""
    x = _blocks(values, QK8_0, "Q8_0")  # (nb, 32)
    d = _fp16(np.abs(x).max(axis=1) / 127.0)  # (nb,)
    q = np.clip(np.rint(x * _inverse(d)[:, None]), -127, 127).astype(np.int8)
    out = np.empty((x.shape[0], 34), dtype=np.uint8)
    out[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.reshape(-1)


def quantize_q6_k(values: np.ndarray) -> np.ndarray:
    """Q6_K: 16 sub-blocks of 16 with int8 scales under one fp16 d; 6-bit codes q − 32 ∈ [−32, 31]."""
    x = _blocks(values, QK_K, "Q6_K").reshape(-1, 16, 16)  # (nb, sub-block, 16)
    nb = x.shape[0]
    # Signed extreme of each sub-block maps to −32 (the wider side of the 6-bit range).
    idx = np.abs(x).argmax(axis=2)
    extreme = np.take_along_axis(x, idx[:, :, None], axis=2)[:, :, 0]  # (nb, 16)
    sub_scale = -extreme / 32.0
    max_scale = np.abs(sub_scale).max(axis=1)  # (nb,)
    d = _fp16(max_scale / 127.0)
    sc = np.clip(np.rint(sub_scale * _inverse(d)[:, None]), -128, 127).astype(np.int8)  # (nb, 16)
    step = d[:, None] * sc.astype(np.float32)  # (nb, 16) the decoder's per-sub-block scale
    q = np.clip(np.rint(x * _inverse(step)[:, :, None]), -32, 31).astype(np.int16) + 32  # 0..63
    q = q.reshape(nb, 2, 4, 32).astype(np.uint8)  # weight 128c + 32p + l
    ql = np.empty((nb, 2, 64), dtype=np.uint8)
    ql[:, :, :32] = (q[:, :, 0] & 15) | ((q[:, :, 2] & 15) << 4)
    ql[:, :, 32:] = (q[:, :, 1] & 15) | ((q[:, :, 3] & 15) << 4)
    qh = (q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6)
    out = np.empty((nb, 210), dtype=np.uint8)
    out[:, 0:128] = ql.reshape(nb, 128)
    out[:, 128:192] = qh.reshape(nb, 64)
    out[:, 192:208] = sc.view(np.uint8)
    out[:, 208:210] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return out.reshape(-1)


def pack_q4_k_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """The 12 packed bytes of eight 6-bit scales and mins per block (inverse of REFERENCE §2.3)."""
    sc = sc.astype(np.uint8)
    m = m.astype(np.uint8)
    packed = np.empty((sc.shape[0], 12), dtype=np.uint8)
    packed[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    packed[:, 4:8] = (m[:, 0:4] & 63) | ((m[:, 4:8] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
    return packed


def quantize_q4_k(values: np.ndarray) -> np.ndarray:
    """Q4_K: 8 sub-blocks of 32 as w = d·sc·q − dmin·m, q ∈ [0, 15], 6-bit sc and m, fp16 d and dmin."""
    x = _blocks(values, QK_K, "Q4_K").reshape(-1, 8, 32)  # (nb, sub-block, 32)
    nb = x.shape[0]
    low = np.minimum(x.min(axis=2), 0.0)  # (nb, 8) a negative offset only: m ≥ 0
    sub_scale = (x.max(axis=2) - low) / 15.0
    sub_min = -low
    d = _fp16(sub_scale.max(axis=1) / 63.0)  # (nb,)
    dmin = _fp16(sub_min.max(axis=1) / 63.0)
    sc = np.clip(np.rint(sub_scale * _inverse(d)[:, None]), 0, 63)
    m = np.clip(np.rint(sub_min * _inverse(dmin)[:, None]), 0, 63)
    step = d[:, None] * sc  # (nb, 8)
    offset = dmin[:, None] * m
    q = np.clip(np.rint((x + offset[:, :, None]) * _inverse(step)[:, :, None]), 0, 15).astype(np.uint8)
    q = q.reshape(nb, 4, 2, 32)  # group g holds sub-blocks 2g (low nibbles) and 2g + 1 (high nibbles)
    out = np.empty((nb, 144), dtype=np.uint8)
    out[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:4] = dmin.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 4:16] = pack_q4_k_scales(sc, m)
    out[:, 16:144] = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(nb, 128)
    return out.reshape(-1)


def _q2_0c_codes(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    return np.clip(np.rint((x * _inverse(d)[:, None] + 3.0) / 2.0), 0, 3).astype(np.uint8)


def quantize_q2_0c(values: np.ndarray) -> np.ndarray:
    """Q2_0C (Tencent 2Bit): per 512 weights an fp16 d (first) and 2-bit codes c, w = (2c − 3)·d, four
    codes per byte, low bits first. d is the best of a grid between max|x|/10 and max|x|/3 (mapping the
    extreme to ±3·d clips nothing but wastes the inner levels on Gaussian-like weights)."""
    x = _blocks(values, 512, "Q2_0C")  # (nb, 512)
    extreme = np.abs(x).max(axis=1)
    best_d, best_err = np.zeros_like(extreme), np.full(extreme.shape, np.inf, dtype=np.float32)
    for factor in np.linspace(0.1, 1.0 / 3.0, 12, dtype=np.float32):
        d = _fp16(extreme * factor)
        decoded = (2.0 * _q2_0c_codes(x, d).astype(np.float32) - 3.0) * d[:, None]
        err = ((decoded - x) ** 2).sum(axis=1)
        better = err < best_err
        best_d[better], best_err[better] = d[better], err[better]
    codes = _q2_0c_codes(x, best_d).reshape(-1, 128, 4)  # (nb, byte, position in byte)
    out = np.empty((x.shape[0], 130), dtype=np.uint8)
    out[:, 0:2] = best_d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = codes[:, :, 0] | (codes[:, :, 1] << 2) | (codes[:, :, 2] << 4) | (codes[:, :, 3] << 6)
    return out.reshape(-1)


def quantize_stq1_0(values: np.ndarray) -> np.ndarray:
    """STQ1_0 (Tencent 1.25Bit, stride-16): each group of four weights becomes one of the 32 ternary
    patterns with exactly one zero (REFERENCE §2.6), times the block's fp16 d.

    The zero goes to the smallest magnitude, the other lanes keep their signs, and d is the least-squares
    scale Σ|x| / count over the non-zero lanes. Pattern index = (sign << 4) | (4·z + t): the sign bit is
    the first non-zero lane's sign; t bit 0 / bit 1 flip the second / third lane relative to the first.
    """
    x = _blocks(values, 256, "STQ1_0")
    nb = x.shape[0]
    # Weight (g / 16)·64 + (g % 16) + 16·p is lane p of group g: (chunk, lane, group-in-chunk) → (group, lane).
    lanes = x.reshape(nb, 4, 4, 16).transpose(0, 1, 3, 2).reshape(nb, 64, 4)
    zero = np.abs(lanes).argmin(axis=2)  # (nb, 64)
    others = np.array([[p for p in range(4) if p != z] for z in range(4)])[zero]  # (nb, 64, 3) ascending
    kept = np.take_along_axis(lanes, others, axis=2)  # (nb, 64, 3)
    negative = kept < 0
    sign = negative[:, :, 0]
    flip = negative[:, :, 1:] != sign[:, :, None]  # relative to the first non-zero lane
    nibble = (4 * zero + flip[:, :, 0] + 2 * flip[:, :, 1]).astype(np.uint8)
    d = _fp16(np.abs(kept).sum(axis=(1, 2)) / (3 * 64))
    out = np.empty((nb, 42), dtype=np.uint8)
    out[:, 0:32] = nibble[:, 0::2] | (nibble[:, 1::2] << 4)
    out[:, 32:40] = np.packbits(sign.astype(np.uint8), axis=1, bitorder="little")
    out[:, 40:42] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return out.reshape(-1)


def quantize(dtype: str, values: np.ndarray) -> np.ndarray:
    """Raw GGUF bytes (uint8) of ``values`` in ``dtype`` (F32, F16, Q8_0, Q4_K, Q6_K, Q2_0C or STQ1_0)."""
    if dtype == "F32":
        return np.ascontiguousarray(values, dtype="<f4").reshape(-1).view(np.uint8)
    if dtype == "F16":
        return np.ascontiguousarray(values, dtype="<f2").reshape(-1).view(np.uint8)
    if dtype == "Q8_0":
        return quantize_q8_0(values)
    if dtype == "Q4_K":
        return quantize_q4_k(values)
    if dtype == "Q6_K":
        return quantize_q6_k(values)
    if dtype == "Q2_0C":
        return quantize_q2_0c(values)
    if dtype == "STQ1_0":
        return quantize_stq1_0(values)
    raise GGUFError(f"no quantizer for {dtype}")
