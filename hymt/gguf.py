"""GGUF v3 files: a memory-mapped, fully validated reader (REFERENCE.md §1); re-exports the writer and formats.

The reader maps the whole file read-only, parses the metadata once and exposes each tensor as a read-only
uint8 numpy view of the mapping (never a copy). Every count and length is checked against the bytes that
remain before anything is allocated, and all size arithmetic uses Python ints, so no file can make the
reader allocate without bound, overflow, or hand a kernel bytes outside the file.

Type ids 40 and 42 mean different things in different llama.cpp forks; Tencent's low-bit exports are
recognised by the SHA-256 of the whole file (§1.6). Hashing 460 MB costs about a second, so digests are
cached (see ``_DigestCache``) under keys that change whenever the file is renamed or modified.
"""

from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hymt import hugepages
from hymt.errors import GGUFError
from hymt.gguf_format import (
    ARRAY_MIN_ELEMENT_BYTES,
    DEFAULT_ALIGNMENT,
    DTYPES,
    FLOAT_VALUE_TYPES,
    GGUF_MAGIC,
    GGUF_VERSION,
    INTEGER_VALUE_TYPES,
    LEGACY_TYPE_IDS,
    MAX_ALIGNMENT,
    MAX_ARRAY_COUNT,
    MAX_RANK,
    MAX_STRING_BYTES,
    MIN_KV_BYTES,
    MIN_TENSOR_INFO_BYTES,
    PROFILES,
    Q2C_SHA256,
    STQ_SHA256,
    TENCENT_ARCHITECTURE,
    TENCENT_PROFILES,
    VALUE_NUMPY_DTYPES,
    DType,
    GGUFValueType,
    dtype_for,
)
from hymt.gguf_writer import GGUFWriter

__all__ = [
    "DTYPES",
    "PROFILES",
    "Q2C_SHA256",
    "STQ_SHA256",
    "DType",
    "GGUFFile",
    "GGUFTensor",
    "GGUFValueType",
    "GGUFWriter",
    "TensorInfo",
    "dtype_for",
    "file_sha256",
    "remember_file_sha256",
]


@dataclass(frozen=True)
class TensorInfo:
    """One tensor-table entry, validated: its bytes are ``[offset, offset + byte_len)`` of the file."""

    name: str
    dimensions: tuple[int, ...]  # GGUF order: dimensions[0] is the contiguous row
    type_id: int  # the raw id in the file
    dtype: str
    offset: int  # absolute file offset
    byte_len: int

    def as_dict(self) -> dict[str, Any]:
        """The §1.8 tensor record."""
        return {
            "name": self.name,
            "dimensions": list(self.dimensions),
            "type_id": self.type_id,
            "dtype": self.dtype,
            "offset": self.offset,
            "byte_len": self.byte_len,
        }


class GGUFTensor:
    """A tensor's validated record and a read-only uint8 view of exactly its bytes in the mapping."""

    __slots__ = ("info", "data")

    def __init__(self, info: TensorInfo, data: np.ndarray) -> None:
        self.info = info
        self.data = data  # uint8 [byte_len], read-only, a view of the file mapping

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def dimensions(self) -> tuple[int, ...]:
        return self.info.dimensions

    @property
    def dtype(self) -> str:
        return self.info.dtype

    @property
    def type_id(self) -> int:
        return self.info.type_id

    def check_shape(self, expected: tuple[int, ...] | list[int]) -> None:
        """Raise ``{name}: expected GGUF shape {shape}, got {actual}`` unless the dims equal ``expected``."""
        if tuple(expected) != self.dimensions:
            raise GGUFError(f"{self.name}: expected GGUF shape {list(expected)}, got {list(self.dimensions)}")

    def expert(self, i: int) -> GGUFTensor:
        """Expert ``i`` of a 3-D ``[a, b, experts]`` tensor, as a 2-D ``[a, b]`` tensor (a view, no copy)."""
        dims = self.dimensions
        if len(dims) != 3 or not 0 <= i < dims[2]:
            raise GGUFError(f"{self.name}: invalid expert {i}")
        per_expert = self.info.byte_len // dims[2]
        info = TensorInfo(
            name=self.name,
            dimensions=dims[:2],
            type_id=self.type_id,
            dtype=self.dtype,
            offset=self.info.offset + i * per_expert,
            byte_len=per_expert,
        )
        return GGUFTensor(info, self.data[i * per_expert : (i + 1) * per_expert])

    def __repr__(self) -> str:
        return f"GGUFTensor({self.name!r}, {list(self.dimensions)}, {self.dtype})"


_MISSING = object()
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


class _Parser:
    """Bounds-checked little-endian reads from the mapped header region."""

    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf: Any, end: int) -> None:
        self.buf = buf
        self.pos = 0
        self.end = end

    def need(self, n: int) -> int:
        """Start of the next ``n`` bytes, advancing past them; `truncated GGUF header` past the end."""
        start = self.pos
        if n > self.end - start:
            raise GGUFError("truncated GGUF header")
        self.pos = start + n
        return start

    def u32(self) -> int:
        return _U32.unpack_from(self.buf, self.need(4))[0]

    def u64(self) -> int:
        return _U64.unpack_from(self.buf, self.need(8))[0]

    def check_count(self, count: int, minimum_bytes: int) -> None:
        if count > (self.end - self.pos) // minimum_bytes:
            raise GGUFError("GGUF count exceeds file bounds")

    def string(self) -> str:
        length = self.u64()
        self.check_count(length, 1)
        if length > MAX_STRING_BYTES:
            raise GGUFError("GGUF string exceeds 64 MiB limit")
        start = self.need(length)
        try:
            return str(self.buf[start : start + length], "utf-8")
        except UnicodeDecodeError:
            raise GGUFError("invalid GGUF UTF-8") from None

    def scalar(self, kind: int) -> Any:
        if kind == GGUFValueType.STRING:
            return self.string()
        dtype = VALUE_NUMPY_DTYPES.get(kind)
        if dtype is None:
            raise GGUFError(f"unsupported GGUF metadata type {kind}")
        start = self.need(dtype.itemsize)
        value = np.frombuffer(self.buf, dtype, 1, start)[0]
        if kind == GGUFValueType.BOOL:
            if value > 1:
                raise GGUFError("invalid GGUF boolean")
            return bool(value)
        if kind in FLOAT_VALUE_TYPES:
            if not math.isfinite(value):
                raise GGUFError("non-finite GGUF metadata")
            return float(value)
        return int(value)

    def array(self) -> list[str] | np.ndarray:
        element_type = self.u32()
        if element_type not in ARRAY_MIN_ELEMENT_BYTES:
            raise GGUFError(f"unsupported GGUF array element type {element_type}")
        count = self.u64()
        self.check_count(count, ARRAY_MIN_ELEMENT_BYTES[element_type])
        if count > MAX_ARRAY_COUNT:
            raise GGUFError("GGUF array is too large")
        if element_type == GGUFValueType.STRING:
            return self.string_array(count)
        dtype = VALUE_NUMPY_DTYPES[element_type]
        start = self.need(count * dtype.itemsize)
        # A copy, so the mapping can be closed while metadata lives on; metadata arrays are small.
        values = np.frombuffer(self.buf, dtype, count, start).copy()
        if element_type == GGUFValueType.BOOL:
            if count and values.max() > 1:
                raise GGUFError("invalid GGUF boolean")
            values = values.view(np.bool_)
        elif element_type in FLOAT_VALUE_TYPES and not np.isfinite(values).all():
            raise GGUFError("non-finite GGUF metadata")
        values.flags.writeable = False
        return values

    def string_array(self, count: int) -> list[str]:
        # The hot loop of metadata parsing (a vocabulary holds ~128k tokens and ~128k merges): locals only.
        buf, end, pos = self.buf, self.end, self.pos
        unpack = _U64.unpack_from
        out: list[str] = []
        append = out.append
        try:
            for _ in range(count):
                if end - pos < 8:
                    raise GGUFError("truncated GGUF header")
                length = unpack(buf, pos)[0]
                pos += 8
                if length > end - pos:
                    raise GGUFError("GGUF count exceeds file bounds")
                if length > MAX_STRING_BYTES:
                    raise GGUFError("GGUF string exceeds 64 MiB limit")
                append(str(buf[pos : pos + length], "utf-8"))
                pos += length
        except UnicodeDecodeError:
            raise GGUFError("invalid GGUF UTF-8") from None
        self.pos = pos
        return out


def _align(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


class GGUFFile:
    """A validated, memory-mapped GGUF v3 file (§1).

    ``profile`` is one of ``PROFILES``; after loading, ``.profile`` holds the resolved profile
    (``standard``, ``tencent-q2-0c`` or ``tencent-stq1``).
    """

    def __init__(self, path: str | os.PathLike[str], profile: str = "auto") -> None:
        if profile not in PROFILES:
            raise GGUFError(f"unknown GGUF profile {profile}; expected one of {', '.join(PROFILES)}")
        self.path = Path(path)
        self.metadata: dict[str, Any] = {}
        self.metadata_types: dict[str, int] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self.alignment = DEFAULT_ALIGNMENT
        self.data_offset = 0
        self._mmap: mmap.mmap | None = None
        with open(self.path, "rb") as f:
            stat = os.fstat(f.fileno())
            self.file_bytes = stat.st_size
            # mmap cannot map an empty file; an empty file is simply not a GGUF file.
            buf: Any = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if stat.st_size else b""
        if isinstance(buf, mmap.mmap):
            self._mmap = buf
            hugepages.map_in_huge_pages(buf, self.path)  # before hashing or the weights touch every page
        self._buf = buf
        try:
            raw_tensors = self._parse_header(buf)
            self.profile = self._resolve_profile(profile, raw_tensors, stat)
            self._validate_tensors(raw_tensors)
            if self.profile in TENCENT_PROFILES:
                self._check_tencent()
        except BaseException:
            self.close()
            raise

    # -- parsing ----------------------------------------------------------------------------------------

    def _parse_header(self, buf: Any) -> list[tuple[str, tuple[int, ...], int, int]]:
        size = self.file_bytes
        if bytes(buf[:4]) != GGUF_MAGIC:  # also a file shorter than the magic
            raise GGUFError("not a GGUF file")
        p = _Parser(buf, size)
        p.need(4)
        if p.u32() != GGUF_VERSION:
            raise GGUFError("only GGUF v3 is supported")
        tensor_count = p.u64()
        kv_count = p.u64()
        p.check_count(tensor_count, MIN_TENSOR_INFO_BYTES)
        p.check_count(kv_count, MIN_KV_BYTES)

        metadata, types = self.metadata, self.metadata_types
        for _ in range(kv_count):
            key = p.string()
            kind = p.u32()
            value = p.array() if kind == GGUFValueType.ARRAY else p.scalar(kind)
            if key in metadata:
                raise GGUFError(f"duplicate metadata key {key}")
            metadata[key] = value
            types[key] = kind

        self.alignment = self._read_alignment()
        if "split.count" in metadata and (
            types["split.count"] not in INTEGER_VALUE_TYPES or metadata["split.count"] != 1
        ):
            raise GGUFError("split GGUF files are not supported; supply a merged file")

        raw: list[tuple[str, tuple[int, ...], int, int]] = []
        names: set[str] = set()
        for _ in range(tensor_count):
            name = p.string()
            rank = p.u32()
            if not 1 <= rank <= MAX_RANK:
                raise GGUFError(f"invalid rank for tensor {name}")
            dims = struct.unpack_from(f"<{rank}Q", buf, p.need(8 * rank))
            if 0 in dims:
                raise GGUFError(f"zero dimension in tensor {name}")
            type_id = p.u32()
            offset = p.u64()
            if offset % self.alignment:
                raise GGUFError(f"unaligned tensor {name}")
            if name in names:
                raise GGUFError(f"duplicate tensor {name}")
            names.add(name)
            raw.append((name, dims, type_id, offset))

        self.data_offset = _align(p.pos, self.alignment)
        if raw and self.data_offset > size:
            raise GGUFError("missing tensor data")
        return raw

    def _read_alignment(self) -> int:
        if "general.alignment" not in self.metadata:
            return DEFAULT_ALIGNMENT
        if self.metadata_types["general.alignment"] not in INTEGER_VALUE_TYPES:
            raise GGUFError("invalid GGUF alignment")
        alignment = self.metadata["general.alignment"]
        if alignment <= 0 or alignment & (alignment - 1) or alignment > MAX_ALIGNMENT:
            raise GGUFError(f"invalid GGUF alignment {alignment}")
        return alignment

    def _resolve_profile(
        self, profile: str, raw: list[tuple[str, tuple[int, ...], int, int]], stat: os.stat_result
    ) -> str:
        if profile != "auto":
            return profile
        if not any(type_id in LEGACY_TYPE_IDS for _, _, type_id, _ in raw):
            return "standard"
        digest = file_sha256(self.path, self._buf, stat)
        if digest == Q2C_SHA256:
            return "tencent-q2-0c"
        if digest == STQ_SHA256:
            return "tencent-stq1"
        raise GGUFError(
            f"ambiguous GGUF type 40/42 in an unrecognized file (SHA256 {digest}); use --gguf-profile "
            "tencent-q2-0c or tencent-stq1 only for a known Tencent legacy export"
        )

    def _validate_tensors(self, raw: list[tuple[str, tuple[int, ...], int, int]]) -> None:
        size = self.file_bytes
        for name, dims, type_id, relative in raw:
            dtype = dtype_for(type_id, self.profile)
            if dtype is None:
                raise GGUFError(
                    f"tensor {name}: unsupported GGUF tensor type {type_id} for profile {self.profile}"
                )
            if dims[0] % dtype.block_len:
                raise GGUFError(f"tensor {name} has a partial quantization block in its row")
            byte_len = dtype.byte_len(math.prod(dims))
            offset = self.data_offset + relative
            end = offset + byte_len
            if end > size:
                raise GGUFError(f"truncated tensor {name}: end {end}, file length {size}")
            self.tensors[name] = TensorInfo(name, dims, type_id, dtype.name, offset, byte_len)
        extents = sorted(self.tensors.values(), key=lambda t: (t.offset, t.offset + t.byte_len))
        for a, b in zip(extents, extents[1:], strict=False):
            if b.offset < a.offset + a.byte_len:
                raise GGUFError(f"overlapping tensors {a.name} and {b.name}")

    def _check_tencent(self) -> None:
        type_id, file_type = TENCENT_PROFILES[self.profile]
        if self.metadata.get("general.architecture") != TENCENT_ARCHITECTURE:
            raise GGUFError("Tencent low-bit profiles require hunyuan-dense")
        if (
            self.metadata_types.get("general.file_type") not in INTEGER_VALUE_TYPES
            or self.metadata["general.file_type"] != file_type
        ):
            raise GGUFError("incompatible Tencent general.file_type")
        ids = {t.type_id for t in self.tensors.values()}
        if type_id not in ids:
            raise GGUFError("file has no tensors for selected Tencent profile")
        if not ids <= {0, 14, type_id}:
            raise GGUFError("unexpected mixed types in Tencent legacy export")

    # -- access -----------------------------------------------------------------------------------------

    def tensor(self, name: str) -> GGUFTensor:
        info = self.tensors.get(name)
        if info is None:
            raise GGUFError(f"missing tensor {name}")
        if self._mmap is None:
            raise GGUFError(f"GGUF file {self.path} is closed")
        data = np.frombuffer(self._mmap, np.uint8, info.byte_len, info.offset)
        return GGUFTensor(info, data)

    def huge_page_bytes(self) -> int | None:
        """Bytes of this file mapped with 2 MiB pages in this process (``None`` where the OS does not say)."""
        return hugepages.mapped_huge_bytes(self.path)

    def get_str(self, key: str, default: Any = _MISSING) -> str:
        return self._get(key, default, "string", lambda kind, v: kind == GGUFValueType.STRING, str)

    def get_int(self, key: str, default: Any = _MISSING) -> int:
        return self._get(key, default, "integer", lambda kind, v: kind in INTEGER_VALUE_TYPES and v >= 0, int)

    def get_bool(self, key: str, default: Any = _MISSING) -> bool:
        return self._get(key, default, "boolean", lambda kind, v: kind == GGUFValueType.BOOL, bool)

    def get_float(self, key: str, default: Any = _MISSING) -> float:
        value = self._get(
            key,
            default,
            "float",
            lambda kind, v: kind in INTEGER_VALUE_TYPES or kind in FLOAT_VALUE_TYPES,
            float,
        )
        if key not in self.metadata:
            return value
        with np.errstate(over="ignore"):
            value32 = np.float32(value)
        if not np.isfinite(value32):
            raise GGUFError(f"non-finite metadata {key}")
        return float(value32)

    def _get(
        self, key: str, default: Any, what: str, valid: Callable[[int, Any], bool], convert: type
    ) -> Any:
        if key not in self.metadata:
            if default is _MISSING:
                raise GGUFError(f"missing or invalid {what} metadata {key}")
            return default
        kind, value = self.metadata_types[key], self.metadata[key]
        if not valid(kind, value):
            raise GGUFError(f"missing or invalid {what} metadata {key}")
        return convert(value)

    def close(self) -> None:
        """Release the mapping; tensor views still alive keep it mapped until they are dropped."""
        self._buf = b""
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:
                pass  # numpy views still reference it; it is unmapped when the last one is collected
            self._mmap = None

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFFile({str(self.path)!r}, profile={self.profile!r}, tensors={len(self.tensors)})"


# -- whole-file SHA-256 with a digest cache ---------------------------------------------------------------

_HASH_CHUNK = 16 * 1024 * 1024  # slices of an existing mapping
_READ_CHUNK = 1024 * 1024  # reads of a file that is not mapped


def file_sha256(path: str | os.PathLike[str], buf: Any = None, stat: os.stat_result | None = None) -> str:
    """Lowercase hex SHA-256 of a whole file, reusing a cached digest when the file is provably unchanged.

    ``buf`` may be the file's existing mapping (hashed without reopening); ``stat`` its ``os.fstat``.
    """
    path = Path(path)
    if stat is None:
        stat = os.stat(path)
    cache = _DigestCache()
    key, fingerprint = _digest_key(path, stat)
    digest = cache.get(key, fingerprint)
    if digest is not None:
        return digest
    hasher = hashlib.sha256()
    if buf is not None and len(buf) == stat.st_size:
        view = memoryview(buf)
        try:
            for start in range(0, len(view), _HASH_CHUNK):
                hasher.update(view[start : start + _HASH_CHUNK])
        finally:
            view.release()
    else:
        with open(path, "rb") as f:
            while chunk := f.read(_READ_CHUNK):
                hasher.update(chunk)
    digest = hasher.hexdigest()
    cache.put(key, fingerprint, digest)
    return digest


def remember_file_sha256(path: str | os.PathLike[str], digest: str) -> None:
    """Record the digest of a file the caller has just hashed itself (e.g. while downloading it)."""
    key, fingerprint = _digest_key(Path(path), os.stat(path))
    _DigestCache().put(key, fingerprint, digest.lower())


def _digest_key(path: Path, stat: os.stat_result) -> tuple[str, dict[str, int]]:
    # A renamed file has another realpath; a modified or replaced one another size, mtime, ctime or inode.
    fingerprint = {
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "ctime_ns": stat.st_ctime_ns,
        "inode": stat.st_ino,
        "device": stat.st_dev,
    }
    return os.path.realpath(path), fingerprint


class _DigestCache:
    """SHA-256 digests of large files in ``$XDG_CACHE_HOME/hymt/digests.json`` (else ``~/.cache/hymt``).

    Best effort: a missing, corrupt or unwritable cache is ignored and the digest is simply recomputed.
    """

    MAX_ENTRIES = 64

    def __init__(self) -> None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        self.path = Path(base) / "hymt" / "digests.json"

    def _load(self) -> dict[str, Any]:
        try:
            with open(self.path, encoding="utf-8") as f:
                entries = json.load(f)
        except (OSError, ValueError):
            return {}
        return entries if isinstance(entries, dict) else {}

    def get(self, key: str, fingerprint: dict[str, int]) -> str | None:
        entry = self._load().get(key)
        if not isinstance(entry, dict) or entry.get("fingerprint") != fingerprint:
            return None
        digest = entry.get("sha256")
        valid = isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
        return digest if valid else None

    def put(self, key: str, fingerprint: dict[str, int], digest: str) -> None:
        entries = self._load()
        entries.pop(key, None)
        entries[key] = {"fingerprint": fingerprint, "sha256": digest}
        while len(entries) > self.MAX_ENTRIES:
            entries.pop(next(iter(entries)))
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".digests-", dir=self.path.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(entries, f)
                os.replace(tmp, self.path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError:
            pass  # a cache we cannot write only costs the next start a re-hash
