"""GGUF bytes built field by field with ``struct``, independently of hymt's writer, for reader tests.

Each helper returns the little-endian encoding of one GGUF field, so a test can assemble exactly the
(possibly malformed) file it needs.
"""

from __future__ import annotations

import struct

U64_MAX = 2**64 - 1


def gguf_string(text: str | bytes) -> bytes:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def header(tensor_count: int, kv_count: int, *, magic: bytes = b"GGUF", version: int = 3) -> bytes:
    return magic + struct.pack("<IQQ", version, tensor_count, kv_count)


def kv(key: str | bytes, value_type: int, payload: bytes) -> bytes:
    """One key/value pair: key, u32 value type, already-encoded value."""
    return gguf_string(key) + struct.pack("<I", value_type) + payload


def kv_u32(key: str, value: int) -> bytes:
    return kv(key, 4, struct.pack("<I", value))


def kv_str(key: str, value: str | bytes) -> bytes:
    return kv(key, 8, gguf_string(value))


def array(element_type: int, count: int, elements: bytes) -> bytes:
    return struct.pack("<IQ", element_type, count) + elements


def tensor_info(name: str | bytes, dims: list[int], type_id: int, offset: int) -> bytes:
    return gguf_string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, type_id, offset)


def pad(data: bytes, alignment: int = 32) -> bytes:
    return data + bytes(-len(data) % alignment)


def gguf_file(kvs: list[bytes], infos: list[bytes], payload: bytes = b"", *, alignment: int = 32) -> bytes:
    """A whole file: header, the given key/value pairs and tensor infos, padding, then ``payload``."""
    head = header(len(infos), len(kvs)) + b"".join(kvs) + b"".join(infos)
    return pad(head, alignment) + payload


def weight_file() -> bytes:
    """The §12.2 file: one F32 tensor ``weight``, dims [2], values 1, −2."""
    return gguf_file([], [tensor_info("weight", [2], 0, 0)], struct.pack("<2f", 1.0, -2.0))
