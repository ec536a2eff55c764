"""Decoders and matrix products over packed GGUF tensors (REFERENCE.md §2, §3.3–3.4).

``weight`` arguments are ``hymt.gguf.GGUFTensor`` objects (or anything with ``.name``, ``.dtype``,
``.dimensions`` ``[cols, rows]`` and ``.data``, a 1-D uint8 array of exactly the tensor's bytes). The C
layer checks every shape and byte length before touching memory and runs without the GIL.

Paths: quantized formats use the int8 activation path (§3.4) by default; F32/F16, ``float_path=True``,
and rows that are not whole 256-activation groups (e.g. a Q8_0 tensor with 96 columns) use the float32
path (decode ≤ 512 weights at a time and ``dot``).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

import hymt.kernels  # noqa: F401  (applies HYMT_ISA and the default thread count before any kernel runs)
from hymt._kernels import quant as _quant
from hymt.errors import KernelError


class FormatInfo(NamedTuple):
    name: str
    type_id: int
    block_len: int
    block_bytes: int
    int8_path: bool


FORMATS: dict[str, FormatInfo] = {entry[0]: FormatInfo(*entry) for entry in _quant.formats()}


def format_info(dtype: str) -> FormatInfo:
    try:
        return FORMATS[dtype]
    except KeyError:
        raise KernelError(f"unsupported tensor type {dtype}") from None


def _as_bytes(raw: Any) -> np.ndarray:
    """A 1-D uint8 view of bytes-like data or a uint8 array (no copy when already contiguous)."""
    if isinstance(raw, np.ndarray):
        if raw.dtype != np.uint8:
            raise KernelError(f"packed tensor data must be uint8, got {raw.dtype}")
        if raw.ndim == 1 and raw.flags.c_contiguous:
            return raw
        return np.ascontiguousarray(raw).reshape(-1)
    try:
        return np.frombuffer(raw, dtype=np.uint8)
    except TypeError:
        raise KernelError(
            f"packed tensor data must be bytes or a uint8 array, got {type(raw).__name__}"
        ) from None


def _matrix(weight: Any, message: str | None = None) -> tuple[str, str, np.ndarray, int, int]:
    """(dtype, name, data, rows, cols) of a 2-D weight."""
    dims = weight.dimensions
    name, dtype = weight.name, weight.dtype
    if len(dims) != 2 or not all(0 < int(d) < 1 << 62 for d in dims):
        raise KernelError(message or f"{name} is not a matrix")
    cols, rows = int(dims[0]), int(dims[1])
    info = FORMATS.get(dtype)
    if info is None:
        raise KernelError(f"{name}: unsupported tensor type {dtype}")
    if cols % info.block_len != 0:
        raise KernelError(f"tensor {name} has a partial quantization block in its row")
    data = _as_bytes(weight.data)
    if data.size != rows * (cols // info.block_len) * info.block_bytes:
        raise KernelError(f"{name}: wrong {dtype} byte count")
    return dtype, name, data, rows, cols


# A weight checked once, in the argument order of the ``hymt._kernels.quant`` products:
# (dtype, name, data [bytes] uint8, rows, cols).
PackedMatrix = tuple[str, str, np.ndarray, int, int]


def packed(weight: Any) -> PackedMatrix:
    """Check a 2-D weight once, for a hot loop that calls ``hymt._kernels.quant`` products directly."""
    return _matrix(weight)


def _activations(x: Any, cols: int, message: str) -> tuple[np.ndarray, bool]:
    """x as C-contiguous float32 [n, cols], and whether it was a single vector."""
    xa = x if isinstance(x, np.ndarray) else np.asarray(x)
    if xa.ndim not in (1, 2) or xa.shape[-1] != cols:
        raise KernelError(message)
    single = xa.ndim == 1
    if single:
        xa = xa.reshape(1, cols)
    if xa.dtype != np.float32 or not xa.flags.c_contiguous:
        xa = np.ascontiguousarray(xa, dtype=np.float32)
    return xa, single


def _output(
    out: np.ndarray | None, name: str, n: int, rows: int, single: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(array returned to the caller, its [n, rows] view the kernel writes)."""
    if out is None:
        full = np.empty((n, rows), dtype=np.float32)
        return (full[0] if single else full), full
    shape = (rows,) if single else (n, rows)
    if (
        not isinstance(out, np.ndarray)
        or out.dtype != np.float32
        or out.shape != shape
        or not out.flags.c_contiguous
    ):
        raise KernelError(
            f"{name}: invalid output array (expected C-contiguous float32 of shape {list(shape)})"
        )
    if not out.flags.writeable:
        raise KernelError(f"{name}: invalid output array (read-only)")
    return out, out.reshape(n, rows)


def dequantize(dtype: str, raw: Any) -> np.ndarray:
    """Decode whole blocks of ``dtype`` (bytes or a uint8 array) into float32 values (§2)."""
    info = format_info(dtype)
    data = _as_bytes(raw)
    if data.size % info.block_bytes != 0:
        raise KernelError(f"wrong {dtype} byte count")
    out = np.empty(data.size // info.block_bytes * info.block_len, dtype=np.float32)
    _quant.decode(dtype, data, out)
    return out


def decode(dtype: str, raw: Any, out: np.ndarray) -> None:
    """Decode into ``out`` (float32 vector): the §2.7 entry point with both length checks."""
    format_info(dtype)
    if (
        not isinstance(out, np.ndarray)
        or out.dtype != np.float32
        or out.ndim != 1
        or not out.flags.c_contiguous
    ):
        raise KernelError("decode output must be a C-contiguous float32 vector")
    _quant.decode(dtype, _as_bytes(raw), out)


def decode_rows(weight: Any, rows: Sequence[int] | np.ndarray) -> np.ndarray:
    """Rows ``rows`` of a [cols, R] tensor decoded to float32 ``(len(rows), cols)`` (embedding lookup)."""
    dtype, name, data, nrows, cols = _matrix(weight)
    if isinstance(rows, np.ndarray) and rows.dtype.kind in "iu":
        flat = rows.reshape(-1)
        bad = (flat < 0) | (flat >= nrows)
        if bad.any():
            raise KernelError(f"{name}: row {int(flat[np.argmax(bad)])} out of range")
        indices = np.ascontiguousarray(flat, dtype=np.int64)
    else:
        values = [operator.index(r) for r in rows]
        for r in values:
            if not 0 <= r < nrows:
                raise KernelError(f"{name}: row {r} out of range")
        indices = np.asarray(values, dtype=np.int64).reshape(-1)
    out = np.empty((indices.size, cols), dtype=np.float32)
    _quant.decode_rows(dtype, name, data, nrows, cols, indices, out)
    return out


def matmul(weight: Any, x: Any, *, out: np.ndarray | None = None, float_path: bool = False) -> np.ndarray:
    """``x (n, cols) · Wᵀ -> (n, rows)`` (or ``(cols,) -> (rows,)``) for a packed ``[cols, rows]`` weight."""
    dtype, name, data, rows, cols = _matrix(weight)
    xs, single = _activations(x, cols, f"{name}: invalid activation shape")
    result, view = _output(out, name, xs.shape[0], rows, single)
    _quant.matmul(dtype, name, data, rows, cols, xs, view, bool(float_path))
    return result


def qkv(
    wq: Any, wk: Any, wv: Any, x: Any, *, float_path: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x·Wqᵀ, x·Wkᵀ, x·Wvᵀ)`` with one activation preparation and one parallel region."""
    shared = "query, key and value must be matrices that share an input width"
    mats = [_matrix(w, shared) for w in (wq, wk, wv)]
    cols = mats[0][4]
    if any(m[4] != cols for m in mats):
        raise KernelError(shared)
    xs, single = _activations(x, cols, "invalid activation shape for qkv")
    n = xs.shape[0]
    outs = [np.empty((n, m[3]), dtype=np.float32) for m in mats]
    _quant.qkv(tuple(mats), xs, outs[0], outs[1], outs[2], bool(float_path))
    if single:
        return outs[0][0], outs[1][0], outs[2][0]
    return outs[0], outs[1], outs[2]


def gate_up_silu(wgate: Any, wup: Any, x: Any, *, float_path: bool = False) -> np.ndarray:
    """``silu(x·Wgateᵀ) × (x·Wupᵀ)``, ``silu(g) = g / (1 + exp(−g))``: (n, F) or (F,)."""
    mismatch = "gate and up shape mismatch"
    gate, up = _matrix(wgate, mismatch), _matrix(wup, mismatch)
    if gate[3:] != up[3:]:
        raise KernelError(mismatch)
    xs, single = _activations(x, gate[4], "invalid activation shape for gate_up_silu")
    out = np.empty((xs.shape[0], gate[3]), dtype=np.float32)
    _quant.gate_up_silu(gate, up, xs, out, bool(float_path))
    return out[0] if single else out
