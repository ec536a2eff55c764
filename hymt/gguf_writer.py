"""GGUF v3 writer: metadata of every value type and tensors of every supported format from raw block bytes.

It is what tests, benchmarks and the synthetic models use. It writes exactly what it is given (duplicate
keys or raw, unknown type ids included) so tests can also build malformed files; the reader validates.
Tensor payloads may be zero-argument callables, produced one at a time during ``write()``, so a
multi-gigabyte model never has to sit in memory at once. The file appears atomically (temp file + rename).
"""

from __future__ import annotations

import os
import struct
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hymt.errors import GGUFError
from hymt.gguf_format import (
    DEFAULT_ALIGNMENT,
    DTYPES,
    GGUF_MAGIC,
    GGUF_VERSION,
    MAX_ALIGNMENT,
    MAX_RANK,
    VALUE_NUMPY_DTYPES,
    GGUFValueType,
)

TensorData = bytes | bytearray | memoryview | np.ndarray
_SCALAR_FORMATS = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}


def _encode_string(value: str) -> bytes:
    raw = value.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def _encode_scalar(kind: int, value: Any) -> bytes:
    if kind == GGUFValueType.STRING:
        return _encode_string(value)
    try:
        return struct.pack(_SCALAR_FORMATS[kind], value)
    except (struct.error, KeyError) as exc:
        raise GGUFError(f"cannot encode {value!r} as GGUF value type {kind}: {exc}") from None


def _as_bytes(data: TensorData) -> memoryview:
    if isinstance(data, np.ndarray):
        return memoryview(np.ascontiguousarray(data)).cast("B")
    return memoryview(data).cast("B")


@dataclass
class _PendingTensor:
    name: str
    dimensions: tuple[int, ...]
    type_id: int
    byte_len: int
    data: TensorData | Callable[[], TensorData]
    offset: int = 0  # relative to the data section, aligned


class GGUFWriter:
    """Collects metadata and tensors, then ``write()`` lays them out as a GGUF v3 file.

    Layout: header, key/value pairs, tensor table, padding to ``alignment``, then each tensor's bytes
    starting at a multiple of ``alignment`` within the data section. An alignment other than 32 is
    recorded as ``general.alignment`` (u32) unless that key was added explicitly.
    """

    def __init__(self, path: str | os.PathLike[str], alignment: int = DEFAULT_ALIGNMENT) -> None:
        if alignment <= 0 or alignment & (alignment - 1) or alignment > MAX_ALIGNMENT:
            raise GGUFError(f"invalid GGUF alignment {alignment}")
        self.path = Path(path)
        self.alignment = alignment
        self._kvs: list[tuple[str, bytes]] = []  # (key, encoded value type + value)
        self._keys: set[str] = set()
        self._tensors: list[_PendingTensor] = []

    # -- metadata ---------------------------------------------------------------------------------------

    def add_value(self, key: str, value: Any, kind: int) -> None:
        """Add one scalar of GGUF value type ``kind`` (any type but ARRAY)."""
        self._add(key, struct.pack("<I", kind) + _encode_scalar(kind, value))

    def add_uint8(self, key: str, value: int) -> None:
        self.add_value(key, value, GGUFValueType.UINT8)

    def add_int8(self, key: str, value: int) -> None:
        self.add_value(key, value, GGUFValueType.INT8)

    def add_uint16(self, key: str, value: int) -> None:
        self.add_value(key, value, GGUFValueType.UINT16)

    def add_int16(self, key: str, value: int) -> None:
        self.add_value(key, value, GGUFValueType.INT16)

    def add_uint32(self, key: str, value: int) -> None:
        self.add_value(key, value, GGUFValueType.UINT32)

    def add_int32(self, key: str, value: int) -> None:
        self.add_value(key, value, GGUFValueType.INT32)

    def add_uint64(self, key: str, value: int) -> None:
        self.add_value(key, value, GGUFValueType.UINT64)

    def add_int64(self, key: str, value: int) -> None:
        self.add_value(key, value, GGUFValueType.INT64)

    def add_float32(self, key: str, value: float) -> None:
        self.add_value(key, value, GGUFValueType.FLOAT32)

    def add_float64(self, key: str, value: float) -> None:
        self.add_value(key, value, GGUFValueType.FLOAT64)

    def add_bool(self, key: str, value: bool) -> None:
        self.add_value(key, bool(value), GGUFValueType.BOOL)

    def add_string(self, key: str, value: str) -> None:
        self.add_value(key, value, GGUFValueType.STRING)

    def add_array(self, key: str, values: Iterable[Any] | np.ndarray, element_type: int) -> None:
        """Add an array of GGUF value type ``element_type`` (strings: any iterable of ``str``)."""
        if element_type == GGUFValueType.STRING:
            items = [_encode_string(v) for v in values]
            body = b"".join(items)
            count = len(items)
        elif element_type in VALUE_NUMPY_DTYPES:
            array = np.asarray(values if isinstance(values, np.ndarray) else list(values))
            if element_type == GGUFValueType.BOOL:
                array = array.astype(np.bool_)
            body = np.ascontiguousarray(array.reshape(-1), dtype=VALUE_NUMPY_DTYPES[element_type]).tobytes()
            count = array.size
        else:
            raise GGUFError(f"unsupported GGUF array element type {element_type}")
        self._add(key, struct.pack("<IIQ", GGUFValueType.ARRAY, element_type, count) + body)

    def _add(self, key: str, encoded: bytes) -> None:
        self._kvs.append((key, encoded))
        self._keys.add(key)

    # -- tensors ----------------------------------------------------------------------------------------

    def add_tensor(
        self,
        name: str,
        dimensions: Sequence[int],
        dtype: str | int,
        data: TensorData | Callable[[], TensorData],
    ) -> None:
        """Add a tensor of ``dimensions`` (GGUF order, fastest first) holding whole blocks of ``dtype``.

        ``dtype`` is a name of ``DTYPES``, or a raw type id (unknown ids take ``data`` as it is, for tests
        of unsupported types). ``data`` is the raw little-endian bytes (bytes, or any C-contiguous numpy
        array such as float32 for F32), or a zero-argument callable returning them during ``write()``.
        """
        dims = tuple(int(d) for d in dimensions)
        if isinstance(dtype, str):
            if dtype not in DTYPES:
                raise GGUFError(f"unknown tensor dtype {dtype}")
            fmt = DTYPES[dtype]
        else:
            fmt = next((d for d in DTYPES.values() if d.type_id == dtype), None)
        if fmt is not None:
            elements = 1
            for d in dims:
                elements *= d
            if not 1 <= len(dims) <= MAX_RANK:
                raise GGUFError(f"invalid rank for tensor {name}")
            if dims[0] % fmt.block_len:
                raise GGUFError(f"tensor {name} has a partial quantization block in its row")
            type_id, byte_len = fmt.type_id, fmt.byte_len(elements)
        else:
            if callable(data):
                raise GGUFError(f"tensor {name}: raw type id {dtype} needs its bytes up front")
            type_id, byte_len = int(dtype), len(_as_bytes(data))
        if not callable(data) and len(_as_bytes(data)) != byte_len:
            raise GGUFError(f"tensor {name}: expected {byte_len} bytes, got {len(_as_bytes(data))}")
        self._tensors.append(_PendingTensor(name, dims, type_id, byte_len, data))

    # -- output -----------------------------------------------------------------------------------------

    def write(self) -> Path:
        """Write the file (atomically: a temp file in the same directory, then a rename) and return its path."""
        kvs = list(self._kvs)
        if self.alignment != DEFAULT_ALIGNMENT and "general.alignment" not in self._keys:
            kvs.append(("general.alignment", struct.pack("<II", GGUFValueType.UINT32, self.alignment)))

        offset = 0
        for t in self._tensors:
            t.offset = offset
            offset = self._align(offset + t.byte_len)

        header = bytearray(struct.pack("<4sIQQ", GGUF_MAGIC, GGUF_VERSION, len(self._tensors), len(kvs)))
        for key, encoded in kvs:
            header += _encode_string(key) + encoded
        for t in self._tensors:
            header += _encode_string(t.name)
            header += struct.pack(
                f"<I{len(t.dimensions)}QIQ", len(t.dimensions), *t.dimensions, t.type_id, t.offset
            )
        header += bytes(self._align(len(header)) - len(header))

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(header)
                position = 0
                for t in self._tensors:
                    f.write(bytes(t.offset - position))
                    payload = _as_bytes(t.data() if callable(t.data) else t.data)
                    if len(payload) != t.byte_len:
                        raise GGUFError(f"tensor {t.name}: expected {t.byte_len} bytes, got {len(payload)}")
                    f.write(payload)
                    position = t.offset + t.byte_len
                f.write(bytes(self._align(position) - position))
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return self.path

    def _align(self, n: int) -> int:
        return (n + self.alignment - 1) // self.alignment * self.alignment
