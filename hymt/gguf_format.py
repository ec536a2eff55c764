"""GGUF v3 format tables shared by the reader and the writer: value types, tensor formats, limits, profiles."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
DEFAULT_ALIGNMENT = 32
MAX_ALIGNMENT = 65536
MAX_STRING_BYTES = 64 * 1024 * 1024
MAX_ARRAY_COUNT = 16_000_000
MAX_RANK = 4
# Smallest possible encoding of one tensor-table entry (8-byte name length, rank, one dim, type, offset)
# and of one key/value pair (8-byte key length, 1-byte key, type, 1-byte value): the bounds check of §1.2.
MIN_TENSOR_INFO_BYTES = 24
MIN_KV_BYTES = 13

STQ_SHA256 = "cc497fe8f033b52b3b8b00a7669e9661435432f9d4cd43f7ed24400c01507a93"
Q2C_SHA256 = "dcc33bbae9b28d923c8c76a64f6157840841d26f8774f3dfd770d5fabeeb1cd7"

PROFILES = ("auto", "standard", "tencent-q2-0c", "tencent-stq1")
LEGACY_TYPE_IDS = frozenset({40, 42})


class GGUFValueType(IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# numpy dtypes (little-endian) of the fixed-size value types.
VALUE_NUMPY_DTYPES: dict[int, np.dtype] = {
    GGUFValueType.UINT8: np.dtype("<u1"),
    GGUFValueType.INT8: np.dtype("<i1"),
    GGUFValueType.UINT16: np.dtype("<u2"),
    GGUFValueType.INT16: np.dtype("<i2"),
    GGUFValueType.UINT32: np.dtype("<u4"),
    GGUFValueType.INT32: np.dtype("<i4"),
    GGUFValueType.FLOAT32: np.dtype("<f4"),
    GGUFValueType.BOOL: np.dtype("<u1"),
    GGUFValueType.UINT64: np.dtype("<u8"),
    GGUFValueType.INT64: np.dtype("<i8"),
    GGUFValueType.FLOAT64: np.dtype("<f8"),
}
INTEGER_VALUE_TYPES = frozenset(
    {
        GGUFValueType.UINT8,
        GGUFValueType.INT8,
        GGUFValueType.UINT16,
        GGUFValueType.INT16,
        GGUFValueType.UINT32,
        GGUFValueType.INT32,
        GGUFValueType.UINT64,
        GGUFValueType.INT64,
    }
)
FLOAT_VALUE_TYPES = frozenset({GGUFValueType.FLOAT32, GGUFValueType.FLOAT64})
# Minimum bytes per array element for the bounds check (§1.3); a string is at least its 8-byte length.
ARRAY_MIN_ELEMENT_BYTES = {t: d.itemsize for t, d in VALUE_NUMPY_DTYPES.items()} | {GGUFValueType.STRING: 8}


@dataclass(frozen=True)
class DType:
    """A tensor format: ``block_len`` weights are stored in ``block_bytes`` bytes."""

    name: str
    type_id: int
    block_len: int
    block_bytes: int

    def byte_len(self, elements: int) -> int:
        return elements // self.block_len * self.block_bytes


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("F32", 0, 1, 4),
        DType("F16", 1, 1, 2),
        DType("Q8_0", 8, 32, 34),
        DType("Q4_K", 12, 256, 144),
        DType("Q6_K", 14, 256, 210),
        DType("Q2_0C", 40, 512, 130),
        DType("STQ1_0", 42, 256, 42),
    )
}
_STANDARD_IDS = {d.type_id: d for d in DTYPES.values() if d.type_id not in LEGACY_TYPE_IDS}
_PROFILE_TYPE_IDS: dict[str, dict[int, DType]] = {
    "standard": _STANDARD_IDS,
    "tencent-q2-0c": _STANDARD_IDS | {40: DTYPES["Q2_0C"]},
    "tencent-stq1": _STANDARD_IDS | {42: DTYPES["STQ1_0"]},
}
# The type id, architecture and general.file_type a Tencent low-bit export must have (§1.6).
TENCENT_PROFILES = {"tencent-q2-0c": (40, 39), "tencent-stq1": (42, 41)}
TENCENT_ARCHITECTURE = "hunyuan-dense"


def dtype_for(type_id: int, profile: str) -> DType | None:
    """The format a raw type id means under a resolved profile, or None when it is not supported."""
    return _PROFILE_TYPE_IDS[profile].get(type_id)
