"""GGUF reader and writer (REFERENCE.md §1, §12.2): read-back, validation messages, profiles, digest cache,
and cross-checks against the `gguf` package in both directions."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tracemalloc
from pathlib import Path

import gguf as gguf_pkg
import numpy as np
import pytest
from gguf_bytes import (
    U64_MAX,
    array,
    gguf_file,
    gguf_string,
    header,
    kv,
    kv_str,
    kv_u32,
    tensor_info,
    weight_file,
)
from shared_data import shared_file

import hymt.gguf as hg
from hymt import HymtError
from hymt.errors import GGUFError
from hymt.gguf import DTYPES, GGUFFile, GGUFValueType, GGUFWriter


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own digest cache, so no test sees another's (or the user's) digests."""
    cache = tmp_path_factory.mktemp("xdg-cache")
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache / "hymt" / "digests.json"


def write(tmp_path: Path, data: bytes, name: str = "m.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def load_error(tmp_path: Path, data: bytes, profile: str = "auto") -> str:
    with pytest.raises(GGUFError) as info:
        GGUFFile(write(tmp_path, data), profile)
    return str(info.value)


# -- §12.2: the one-tensor file -------------------------------------------------------------------------


def test_weight_reads_back_little_endian(tmp_path):
    with GGUFFile(write(tmp_path, weight_file())) as f:
        t = f.tensor("weight")
        assert t.dimensions == (2,) and t.dtype == "F32" and t.type_id == 0
        assert t.info.offset == 64 and t.info.byte_len == 8
        np.testing.assert_array_equal(t.data.view("<f4"), [1.0, -2.0])
        assert f.profile == "standard" and f.file_bytes == 72 and f.alignment == 32


def test_every_prefix_truncation_fails(tmp_path):
    data = weight_file()
    for n in range(len(data)):
        with pytest.raises(HymtError):
            GGUFFile(write(tmp_path, data[:n]))


@pytest.mark.parametrize("which", ["tensor", "kv"])
def test_u64_max_counts_fail_before_allocating(tmp_path, which):
    counts = (U64_MAX, 0) if which == "tensor" else (0, U64_MAX)
    path = write(tmp_path, header(*counts) + bytes(64))
    tracemalloc.start()
    try:
        with pytest.raises(GGUFError, match="^GGUF count exceeds file bounds$"):
            GGUFFile(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


# -- §1.2–1.5: header, metadata and tensor-table messages -----------------------------------------------

F32_INFO = tensor_info("w", [2], 0, 0)
F32_DATA = struct.pack("<2f", 1.0, 2.0)

MALFORMED = {
    "bad magic": (b"GGML" + weight_file()[4:], "not a GGUF file"),
    "empty file": (b"", "not a GGUF file"),
    "version 2": (header(0, 0, version=2), "only GGUF v3 is supported"),
    "header cut": (header(0, 1)[:-3], "truncated GGUF header"),
    "kv value cut": (
        header(0, 1) + gguf_string("k") + struct.pack("<I", 4) + b"\x01",
        "truncated GGUF header",
    ),
    "bool 2": (gguf_file([kv("b", 7, b"\x02")], []), "invalid GGUF boolean"),
    "bool array 2": (gguf_file([kv("b", 9, array(7, 2, b"\x01\x02"))], []), "invalid GGUF boolean"),
    "f32 nan": (gguf_file([kv("x", 6, struct.pack("<f", float("nan")))], []), "non-finite GGUF metadata"),
    "f64 inf": (gguf_file([kv("x", 12, struct.pack("<d", float("inf")))], []), "non-finite GGUF metadata"),
    "f32 array inf": (
        gguf_file([kv("x", 9, array(6, 2, struct.pack("<2f", 1.0, float("-inf"))))], []),
        "non-finite GGUF metadata",
    ),
    "metadata type 13": (gguf_file([kv("x", 13, bytes(8))], []), "unsupported GGUF metadata type 13"),
    "string past end": (
        gguf_file([kv("x", 8, struct.pack("<Q", 1000) + b"abc")], []),
        "GGUF count exceeds file bounds",
    ),
    "key past end": (header(0, 1) + struct.pack("<Q", U64_MAX) + bytes(16), "GGUF count exceeds file bounds"),
    "bad utf-8 value": (gguf_file([kv_str("x", b"\xff\xfe")], []), "invalid GGUF UTF-8"),
    "bad utf-8 key": (gguf_file([kv(b"k\xc3", 4, bytes(4))], []), "invalid GGUF UTF-8"),
    "bad utf-8 in array": (
        gguf_file([kv("x", 9, array(8, 2, gguf_string("ok") + gguf_string(b"\xed\xa0\x80")))], []),
        "invalid GGUF UTF-8",
    ),
    "nested array": (
        gguf_file([kv("x", 9, array(9, 1, array(4, 0, b"")))], []),
        "unsupported GGUF array element type 9",
    ),
    "array element type 13": (
        gguf_file([kv("x", 9, array(13, 0, b""))], []),
        "unsupported GGUF array element type 13",
    ),
    "array count past end": (
        gguf_file([kv("x", 9, array(10, 100, bytes(16)))], []),
        "GGUF count exceeds file bounds",
    ),
    "array count u64 max": (
        gguf_file([kv("x", 9, array(0, U64_MAX, b""))], []),
        "GGUF count exceeds file bounds",
    ),
    "duplicate key": (gguf_file([kv_u32("a", 1), kv_u32("a", 2)], []), "duplicate metadata key a"),
    "alignment f32": (
        gguf_file([kv("general.alignment", 6, struct.pack("<f", 32.0))], []),
        "invalid GGUF alignment",
    ),
    "alignment 48": (gguf_file([kv_u32("general.alignment", 48)], []), "invalid GGUF alignment 48"),
    "alignment 0": (gguf_file([kv_u32("general.alignment", 0)], []), "invalid GGUF alignment 0"),
    "alignment 2^17": (
        gguf_file([kv_u32("general.alignment", 1 << 17)], []),
        "invalid GGUF alignment 131072",
    ),
    "alignment negative": (
        gguf_file([kv("general.alignment", 5, struct.pack("<i", -32))], []),
        "invalid GGUF alignment -32",
    ),
    "split count 2": (
        gguf_file([kv("split.count", 2, struct.pack("<H", 2))], []),
        "split GGUF files are not supported; supply a merged file",
    ),
    "rank 0": (
        gguf_file([], [gguf_string("w") + struct.pack("<IIQ", 0, 0, 0)], bytes(32)),
        "invalid rank for tensor w",
    ),
    "rank 5": (
        gguf_file([], [tensor_info("w", [1, 1, 1, 1, 1], 0, 0)], bytes(32)),
        "invalid rank for tensor w",
    ),
    "zero dim": (gguf_file([], [tensor_info("w", [2, 0], 0, 0)], bytes(32)), "zero dimension in tensor w"),
    "unaligned": (gguf_file([], [tensor_info("w", [2], 0, 4)], bytes(32)), "unaligned tensor w"),
    "missing data": (header(1, 0) + tensor_info("w", [2], 0, 0), "missing tensor data"),
    "partial block": (
        gguf_file([], [tensor_info("w", [16], 8, 0)], bytes(32)),
        "tensor w has a partial quantization block in its row",
    ),
    "truncated tensor": (
        gguf_file([], [tensor_info("w", [4], 0, 0)], bytes(12)),
        "truncated tensor w: end 80, file length 76",
    ),
    "duplicate tensor": (
        gguf_file([], [tensor_info("w", [2], 0, 0), tensor_info("w", [2], 0, 32)], bytes(64)),
        "duplicate tensor w",
    ),
    "overlapping": (
        gguf_file([], [tensor_info("a", [16], 0, 0), tensor_info("b", [2], 0, 32)], bytes(64)),
        "overlapping tensors a and b",
    ),
    "unknown type": (
        gguf_file([], [tensor_info("w", [2], 2, 0)], bytes(32)),
        "tensor w: unsupported GGUF tensor type 2 for profile standard",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformation_messages(tmp_path, case):
    data, message = MALFORMED[case]
    assert load_error(tmp_path, data) == message


def test_huge_dims_use_unbounded_arithmetic(tmp_path):
    # 2^62 · 2^62 elements would wrap a 64-bit product; the end is reported exactly instead.
    data = gguf_file([], [tensor_info("w", [2**62, 2**62], 0, 0)], bytes(32))
    end = 96 + 4 * 2**124  # data section at 96: 24-byte header + 41-byte tensor info, padded
    assert load_error(tmp_path, data) == f"truncated tensor w: end {end}, file length 128"


def test_string_over_64_mib(tmp_path):
    # A sparse file: the length fits the file, so only the 64 MiB limit can refuse it.
    path = tmp_path / "big.gguf"
    with open(path, "wb") as f:
        f.write(header(0, 1) + gguf_string("k") + struct.pack("<IQ", 8, 64 * 1024 * 1024 + 1))
        f.truncate(80 * 1024 * 1024)
    with pytest.raises(GGUFError, match="^GGUF string exceeds 64 MiB limit$"):
        GGUFFile(path)


def test_array_over_16_million(tmp_path):
    path = tmp_path / "big.gguf"
    with open(path, "wb") as f:
        f.write(header(0, 1) + gguf_string("k") + struct.pack("<I", 9) + array(0, 16_000_001, b""))
        f.truncate(17_000_000)
    with pytest.raises(GGUFError, match="^GGUF array is too large$"):
        GGUFFile(path)


def test_split_count_one_and_custom_alignment_accepted(tmp_path):
    kvs = [kv_u32("split.count", 1), kv_u32("general.alignment", 64)]
    data = gguf_file(kvs, [tensor_info("w", [2], 0, 0), tensor_info("v", [2], 0, 64)], alignment=64)
    data += F32_DATA + bytes(56) + F32_DATA
    with GGUFFile(write(tmp_path, data)) as f:
        assert f.alignment == 64
        assert f.tensors["w"].offset % 64 == 0 and f.tensors["v"].offset == f.tensors["w"].offset + 64
    bad = gguf_file(kvs, [tensor_info("w", [2], 0, 32)], alignment=64) + bytes(128)
    assert load_error(tmp_path, bad) == "unaligned tensor w"


def test_vocab_only_file_without_tensor_data_section(tmp_path):
    # No tensors: nothing needs a data section, so an unpadded header is a complete file.
    data = header(0, 1) + kv_str("general.architecture", "hunyuan-dense")
    with GGUFFile(write(tmp_path, data)) as f:
        assert f.tensors == {} and f.metadata == {"general.architecture": "hunyuan-dense"}


def test_missing_tensor_lookup(tmp_path):
    with (
        GGUFFile(write(tmp_path, weight_file())) as f,
        pytest.raises(GGUFError, match="^missing tensor nope$"),
    ):
        f.tensor("nope")


def test_unknown_profile_is_refused(tmp_path):
    with pytest.raises(GGUFError, match="unknown GGUF profile"):
        GGUFFile(write(tmp_path, weight_file()), "tencent")


# -- metadata values and typed accessors ----------------------------------------------------------------

SCALARS = [
    ("u8", 0, "<B", 200),
    ("i8", 1, "<b", -100),
    ("u16", 2, "<H", 60000),
    ("i16", 3, "<h", -30000),
    ("u32", 4, "<I", 4_000_000_000),
    ("i32", 5, "<i", -2_000_000_000),
    ("u64", 10, "<Q", U64_MAX),
    ("i64", 11, "<q", -(2**63)),
    ("f64", 12, "<d", 0.1),
]


def metadata_file() -> bytes:
    kvs = [kv(key, kind, struct.pack(fmt, value)) for key, kind, fmt, value in SCALARS]
    kvs += [
        kv("f32", 6, struct.pack("<f", 1e-5)),
        kv("yes", 7, b"\x01"),
        kv_str("s", "héllo 世界"),
        kv("empty", 8, gguf_string("")),
        kv("strs", 9, array(8, 3, gguf_string("a") + gguf_string("") + gguf_string("€"))),
        kv("i32s", 9, array(5, 3, struct.pack("<3i", 1, -2, 3))),
        kv("f32s", 9, array(6, 2, struct.pack("<2f", 0.5, 1e-5))),
        kv("bools", 9, array(7, 3, b"\x01\x00\x01")),
        kv("u64s", 9, array(10, 1, struct.pack("<Q", U64_MAX))),
        kv("none", 9, array(4, 0, b"")),
        kv("neg", 5, struct.pack("<i", -1)),
        kv("big", 12, struct.pack("<d", 1e300)),
    ]
    return gguf_file(kvs, [])


def test_metadata_values_of_every_type(tmp_path):
    with GGUFFile(write(tmp_path, metadata_file())) as f:
        m, types = f.metadata, f.metadata_types
        for key, kind, _, value in SCALARS:
            assert m[key] == value and type(m[key]) is type(value) and types[key] == kind
        assert m["f32"] == 9.999999747378752e-06 and type(m["f32"]) is float
        assert m["yes"] is True and m["s"] == "héllo 世界" and m["empty"] == ""
        assert m["strs"] == ["a", "", "€"] and types["strs"] == GGUFValueType.ARRAY
        for key, dtype, values in [
            ("i32s", np.int32, [1, -2, 3]),
            ("f32s", np.float32, [0.5, np.float32(1e-5)]),
            ("bools", np.bool_, [True, False, True]),
            ("u64s", np.uint64, [U64_MAX]),
            ("none", np.uint32, []),
        ]:
            assert m[key].dtype == dtype and not m[key].flags.writeable
            np.testing.assert_array_equal(m[key], np.array(values, dtype))


def test_typed_accessors(tmp_path):
    with GGUFFile(write(tmp_path, metadata_file())) as f:
        assert f.get_int("u8") == 200 and f.get_int("u64") == U64_MAX and f.get_int("u16", 5) == 60000
        assert f.get_str("s") == "héllo 世界" and f.get_bool("yes") is True
        assert f.get_float("f32") == 9.999999747378752e-06
        assert f.get_float("f64") == float(np.float32(0.1))
        assert f.get_float("u16") == 60000.0
        assert f.get_int("absent", 7) == 7 and f.get_str("absent", None) is None
        assert f.get_float("absent", 1.5) == 1.5 and f.get_bool("absent", False) is False
        failures = {
            (f.get_int, "i8"): "missing or invalid integer metadata i8",  # negative
            (f.get_int, "neg"): "missing or invalid integer metadata neg",
            (f.get_int, "s"): "missing or invalid integer metadata s",
            (f.get_int, "yes"): "missing or invalid integer metadata yes",
            (f.get_int, "absent"): "missing or invalid integer metadata absent",
            (f.get_str, "u8"): "missing or invalid string metadata u8",
            (f.get_str, "strs"): "missing or invalid string metadata strs",
            (f.get_float, "s"): "missing or invalid float metadata s",
            (f.get_float, "absent"): "missing or invalid float metadata absent",
            (f.get_float, "big"): "non-finite metadata big",
            (f.get_bool, "u8"): "missing or invalid boolean metadata u8",
        }
        for (getter, key), message in failures.items():
            with pytest.raises(GGUFError) as info:
                getter(key)
            assert str(info.value) == message


# -- tensors: views, experts, shapes --------------------------------------------------------------------


def test_tensor_views_are_read_only_and_zero_copy(tmp_path):
    path = tmp_path / "m.gguf"
    rng = np.random.default_rng(0)
    payload = rng.integers(0, 256, 3 * 4 * 34, dtype=np.uint8)
    writer = GGUFWriter(path)
    writer.add_tensor("experts", [32, 4, 3], "Q8_0", payload)
    writer.write()
    with GGUFFile(path) as f:
        t = f.tensor("experts")
        assert not t.data.flags.writeable and not t.data.flags.owndata
        np.testing.assert_array_equal(t.data, payload)
        with pytest.raises(ValueError):
            t.data[0] = 1
        for i in range(3):
            e = t.expert(i)
            assert e.dimensions == (32, 4) and e.dtype == "Q8_0" and e.info.byte_len == 136
            assert e.info.offset == t.info.offset + 136 * i
            np.testing.assert_array_equal(e.data, payload[136 * i : 136 * (i + 1)])
        for bad in (-1, 3):
            with pytest.raises(GGUFError, match=rf"^experts: invalid expert {bad}$"):
                t.expert(bad)
        t.check_shape([32, 4, 3])
        with pytest.raises(GGUFError, match=r"^experts: expected GGUF shape \[32, 4\], got \[32, 4, 3\]$"):
            t.check_shape([32, 4])
        with pytest.raises(GGUFError, match="^experts: invalid expert 0$"):
            t.expert(0).expert(0)


def test_views_outlive_close(tmp_path):
    with GGUFFile(write(tmp_path, weight_file())) as f:
        data = f.tensor("weight").data
    np.testing.assert_array_equal(data.view("<f4"), [1.0, -2.0])


# -- §1.6 profiles --------------------------------------------------------------------------------------


def low_bit_file(
    tmp_path: Path,
    type_ids: list[int],
    *,
    architecture: str = "hunyuan-dense",
    file_type: int | None = 41,
    name: str = "low.gguf",
) -> Path:
    """A Tencent-shaped file: one 256-wide tensor per type id, written with hymt's writer."""
    writer = GGUFWriter(tmp_path / name)
    writer.add_string("general.architecture", architecture)
    if file_type is not None:
        writer.add_uint32("general.file_type", file_type)
    for i, type_id in enumerate(type_ids):
        fmt = next(d for d in DTYPES.values() if d.type_id == type_id)
        dims = [fmt.block_len * (2 if type_id == 40 else 1), 2]
        writer.add_tensor(f"t{i}", dims, fmt.name, bytes(fmt.byte_len(dims[0] * dims[1])))
    return writer.write()


def test_type_40_under_standard(tmp_path):
    path = low_bit_file(tmp_path, [40], file_type=39)
    with pytest.raises(GGUFError, match="^tensor t0: unsupported GGUF tensor type 40 for profile standard$"):
        GGUFFile(path, "standard")


def test_type_42_under_q2_0c(tmp_path):
    path = low_bit_file(tmp_path, [42], file_type=39)
    with pytest.raises(
        GGUFError, match="^tensor t0: unsupported GGUF tensor type 42 for profile tencent-q2-0c$"
    ):
        GGUFFile(path, "tencent-q2-0c")


def test_type_40_under_stq1(tmp_path):
    path = low_bit_file(tmp_path, [40])
    with pytest.raises(
        GGUFError, match="^tensor t0: unsupported GGUF tensor type 40 for profile tencent-stq1$"
    ):
        GGUFFile(path, "tencent-stq1")


def test_explicit_tencent_profiles(tmp_path):
    with GGUFFile(low_bit_file(tmp_path, [0, 42, 14]), "tencent-stq1") as f:
        assert f.profile == "tencent-stq1"
        assert [t.dtype for t in f.tensors.values()] == ["F32", "STQ1_0", "Q6_K"]
        assert f.tensors["t1"].byte_len == 2 * 42
    with GGUFFile(low_bit_file(tmp_path, [40, 0], file_type=39), "tencent-q2-0c") as f:
        assert f.tensors["t0"].dtype == "Q2_0C" and f.tensors["t0"].byte_len == 4 * 130


@pytest.mark.parametrize(
    ("kwargs", "type_ids", "message"),
    [
        ({"architecture": "hy_v3"}, [42], "Tencent low-bit profiles require hunyuan-dense"),
        ({"file_type": 39}, [42], "incompatible Tencent general.file_type"),
        ({"file_type": None}, [42], "incompatible Tencent general.file_type"),
        ({}, [0, 14], "file has no tensors for selected Tencent profile"),
        ({}, [42, 8], "unexpected mixed types in Tencent legacy export"),
        ({}, [42, 1], "unexpected mixed types in Tencent legacy export"),
    ],
)
def test_tencent_profile_checks(tmp_path, kwargs, type_ids, message):
    path = low_bit_file(tmp_path, type_ids, **kwargs)
    with pytest.raises(GGUFError) as info:
        GGUFFile(path, "tencent-stq1")
    assert str(info.value) == message


def test_auto_with_legacy_ids_and_unknown_hash_is_ambiguous(tmp_path):
    path = low_bit_file(tmp_path, [42])
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(GGUFError) as info:
        GGUFFile(path)
    assert str(info.value) == (
        f"ambiguous GGUF type 40/42 in an unrecognized file (SHA256 {digest}); use --gguf-profile "
        "tencent-q2-0c or tencent-stq1 only for a known Tencent legacy export"
    )


@pytest.mark.parametrize(
    ("pin", "type_id", "file_type", "profile"),
    [
        ("STQ_SHA256", 42, 41, "tencent-stq1"),
        ("Q2C_SHA256", 40, 39, "tencent-q2-0c"),
    ],
)
def test_auto_recognises_pinned_digests(tmp_path, monkeypatch, pin, type_id, file_type, profile):
    path = low_bit_file(tmp_path, [type_id, 0], file_type=file_type)
    monkeypatch.setattr(hg, pin, hashlib.sha256(path.read_bytes()).hexdigest())
    with GGUFFile(path) as f:
        assert f.profile == profile


def test_auto_detected_tencent_file_still_gets_tencent_checks(tmp_path, monkeypatch):
    path = low_bit_file(tmp_path, [42], architecture="llama")
    monkeypatch.setattr(hg, "STQ_SHA256", hashlib.sha256(path.read_bytes()).hexdigest())
    with pytest.raises(GGUFError, match="^Tencent low-bit profiles require hunyuan-dense$"):
        GGUFFile(path)


def test_auto_without_legacy_ids_never_hashes(tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("hashed a standard file")

    monkeypatch.setattr(hg, "file_sha256", fail)
    with GGUFFile(write(tmp_path, weight_file())) as f:
        assert f.profile == "standard"
    with GGUFFile(low_bit_file(tmp_path, [42]), "tencent-stq1") as f:  # explicit: no hashing either
        assert f.profile == "tencent-stq1"


# -- digest cache ---------------------------------------------------------------------------------------


class CountingSha256:
    """Stands in for hashlib.sha256 inside hymt.gguf and counts whole-file hashes."""

    def __init__(self, monkeypatch):
        self.calls = 0
        real = hashlib.sha256

        def sha256(*args):
            self.calls += 1
            return real(*args)

        monkeypatch.setattr(hg.hashlib, "sha256", sha256)


def ambiguous_digest(path: Path) -> str:
    with pytest.raises(GGUFError) as info:
        GGUFFile(path)
    return str(info.value).split("SHA256 ")[1].split(")")[0]


def test_digest_cache_reuses_unchanged_file(tmp_path, monkeypatch, private_cache):
    path = low_bit_file(tmp_path, [42])
    counter = CountingSha256(monkeypatch)
    first = ambiguous_digest(path)
    assert counter.calls == 1 and private_cache.exists()
    assert ambiguous_digest(path) == first and counter.calls == 1
    assert first == hashlib.new("sha256", path.read_bytes()).hexdigest()


def test_digest_cache_never_trusts_modified_or_renamed_files(tmp_path, monkeypatch):
    path = low_bit_file(tmp_path, [42])
    counter = CountingSha256(monkeypatch)
    before = ambiguous_digest(path)
    # Same size, one byte changed, mtime restored: the ctime (and the digest) still differ.
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    after = ambiguous_digest(path)
    assert counter.calls == 2 and after != before
    assert after == hashlib.new("sha256", bytes(data)).hexdigest()
    renamed = path.rename(tmp_path / "renamed.gguf")
    assert ambiguous_digest(renamed) == after and counter.calls == 3


@pytest.mark.parametrize("content", [b"{not json", b"[]", b'{"x": 1}'])
def test_corrupt_digest_cache_is_ignored(tmp_path, private_cache, content):
    path = low_bit_file(tmp_path, [42])
    expected = hashlib.new("sha256", path.read_bytes()).hexdigest()
    private_cache.parent.mkdir(parents=True)
    private_cache.write_bytes(content)
    assert ambiguous_digest(path) == expected
    assert ambiguous_digest(path) == expected


def test_forged_cache_entry_with_wrong_fingerprint_is_ignored(tmp_path, private_cache):
    path = low_bit_file(tmp_path, [42])
    private_cache.parent.mkdir(parents=True)
    entry = {"fingerprint": {"size": 1}, "sha256": hg.STQ_SHA256}
    private_cache.write_text(json.dumps({os.path.realpath(path): entry}))
    assert ambiguous_digest(path) == hashlib.new("sha256", path.read_bytes()).hexdigest()


def test_unwritable_digest_cache_is_ignored(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    path = low_bit_file(tmp_path, [42])
    assert ambiguous_digest(path) == hashlib.new("sha256", path.read_bytes()).hexdigest()


# -- writer ---------------------------------------------------------------------------------------------


def test_writer_layout_and_callable_payloads(tmp_path):
    calls = []

    def payload():
        calls.append(1)
        return np.arange(34 * 2, dtype=np.uint8)

    writer = GGUFWriter(tmp_path / "w.gguf", alignment=64)
    writer.add_tensor("a", [3], "F32", np.array([1, 2, 3], np.float32))
    writer.add_tensor("b", [32, 2], "Q8_0", payload)
    assert calls == []
    path = writer.write()
    assert calls == [1]
    data = path.read_bytes()
    with GGUFFile(path) as f:
        assert f.alignment == 64 and f.metadata["general.alignment"] == 64
        a, b = f.tensors["a"], f.tensors["b"]
        assert a.offset % 64 == 0 and b.offset == a.offset + 64 and len(data) % 64 == 0
        assert data[b.offset : b.offset + 68] == bytes(range(68))


def test_writer_rejects_wrong_payloads(tmp_path):
    writer = GGUFWriter(tmp_path / "w.gguf")
    with pytest.raises(GGUFError, match="partial quantization block"):
        writer.add_tensor("q", [16], "Q8_0", bytes(17))
    with pytest.raises(GGUFError, match="expected 34 bytes, got 33"):
        writer.add_tensor("q", [32], "Q8_0", bytes(33))
    with pytest.raises(GGUFError, match="^invalid rank for tensor q$"):
        writer.add_tensor("q", [], "F32", b"")
    with pytest.raises(GGUFError, match="unknown tensor dtype"):
        writer.add_tensor("q", [32], "Q5_K", bytes(33))
    writer.add_tensor("late", [2], "F32", lambda: bytes(4))
    with pytest.raises(GGUFError, match="expected 8 bytes, got 4"):
        writer.write()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(GGUFError, match="invalid GGUF alignment 24"):
        GGUFWriter(tmp_path / "x.gguf", alignment=24)


# -- cross-checks with the gguf package -----------------------------------------------------------------

CROSS_TENSORS = [
    ("f32", "F32", [8, 3]),
    ("f16", "F16", [6, 2]),
    ("q8", "Q8_0", [64, 3]),
    ("q4k", "Q4_K", [256, 2]),
    ("q6k", "Q6_K", [512, 1]),
    ("cube", "Q8_0", [32, 2, 2]),
]
CROSS_SCALARS = [
    ("k.u8", "uint8", 255),
    ("k.i8", "int8", -128),
    ("k.u16", "uint16", 65535),
    ("k.i16", "int16", -32768),
    ("k.u32", "uint32", 2**32 - 1),
    ("k.i32", "int32", -(2**31)),
    ("k.u64", "uint64", U64_MAX),
    ("k.i64", "int64", -(2**63)),
    ("k.f32", "float32", 0.1),
    ("k.f64", "float64", -2.5e-300),
    ("k.bool", "bool", True),
    ("k.str", "string", "Grüße, 世界 🌍"),
]
CROSS_ARRAYS = [
    ("a.u8", GGUFValueType.UINT8, [0, 255]),
    ("a.i8", GGUFValueType.INT8, [-1, 1]),
    ("a.u16", GGUFValueType.UINT16, [65535]),
    ("a.i16", GGUFValueType.INT16, [-5, 5]),
    ("a.u32", GGUFValueType.UINT32, [1, 2, 3]),
    ("a.i32", GGUFValueType.INT32, [-7, 7]),
    ("a.f32", GGUFValueType.FLOAT32, [0.5, -1.25]),
    ("a.bool", GGUFValueType.BOOL, [True, False]),
    ("a.str", GGUFValueType.STRING, ["x", "", "ÿ"]),
    ("a.u64", GGUFValueType.UINT64, [U64_MAX]),
    ("a.i64", GGUFValueType.INT64, [-(2**63)]),
    ("a.f64", GGUFValueType.FLOAT64, [1e-300, 3.0]),
]


def cross_payload(dtype: str, dims: list[int]) -> bytes:
    elements = int(np.prod(dims))
    rng = np.random.default_rng(elements)
    return rng.integers(0, 256, DTYPES[dtype].byte_len(elements), dtype=np.uint8).tobytes()


def field_value(field):
    """A gguf-package ReaderField as a Python value (its own contents accessor)."""
    return field.contents()


def test_our_writer_read_by_gguf_package(tmp_path):
    writer = GGUFWriter(tmp_path / "ours.gguf")
    for key, kind, value in CROSS_SCALARS:
        getattr(writer, f"add_{kind}")(key, value)
    for key, element_type, values in CROSS_ARRAYS:
        writer.add_array(key, values, element_type)
    for name, dtype, dims in CROSS_TENSORS:
        writer.add_tensor(name, dims, dtype, cross_payload(dtype, dims))
    path = writer.write()

    reader = gguf_pkg.GGUFReader(path)
    for key, kind, value in CROSS_SCALARS:
        got = field_value(reader.fields[key])
        assert got == (float(np.float32(value)) if kind == "float32" else value), key
    for key, element_type, values in CROSS_ARRAYS:
        field = reader.fields[key]
        assert int(field.types[0]) == GGUFValueType.ARRAY and int(field.types[1]) == element_type
        got = field_value(field)
        expected = [float(np.float32(v)) for v in values] if element_type == GGUFValueType.FLOAT32 else values
        assert list(got) == expected, key
    assert [t.name for t in reader.tensors] == [name for name, _, _ in CROSS_TENSORS]
    with GGUFFile(path) as ours:
        for t, (name, dtype, dims) in zip(reader.tensors, CROSS_TENSORS, strict=True):
            assert [int(d) for d in t.shape] == dims
            assert t.tensor_type.name == dtype and int(t.tensor_type) == DTYPES[dtype].type_id
            assert t.n_bytes == DTYPES[dtype].byte_len(int(np.prod(dims)))
            assert t.data_offset == ours.tensors[name].offset
            assert bytes(np.asarray(t.data).reshape(-1).view(np.uint8)) == cross_payload(dtype, dims)


def test_gguf_package_writer_read_by_us(tmp_path):
    path = tmp_path / "theirs.gguf"
    writer = gguf_pkg.GGUFWriter(path, "hunyuan-dense")
    for key, kind, value in CROSS_SCALARS:
        getattr(writer, f"add_{kind}")(key, value)
    for key, element_type, values in CROSS_ARRAYS:
        writer.add_key_value(key, values, gguf_pkg.GGUFValueType.ARRAY, gguf_pkg.GGUFValueType(element_type))
    for name, dtype, dims in CROSS_TENSORS:
        raw = np.frombuffer(cross_payload(dtype, dims), np.uint8)
        qtype = gguf_pkg.GGMLQuantizationType[dtype]
        if dtype in ("F32", "F16"):
            array_ = raw.view(np.float32 if dtype == "F32" else np.float16).reshape(dims[::-1])
            writer.add_tensor(name, array_)
        else:
            rows = int(np.prod(dims[1:]))
            writer.add_tensor(name, raw.reshape(rows, -1), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    reference = gguf_pkg.GGUFReader(path)
    with GGUFFile(path) as ours:
        assert ours.metadata["general.architecture"] == "hunyuan-dense"
        for key, kind, value in CROSS_SCALARS:
            expected = float(np.float32(value)) if kind == "float32" else value
            assert ours.metadata[key] == expected and type(ours.metadata[key]) is type(expected), key
            assert ours.metadata_types[key] == int(reference.fields[key].types[0])
        for key, element_type, values in CROSS_ARRAYS:
            got = ours.metadata[key]
            if element_type == GGUFValueType.STRING:
                assert got == values
            else:
                np.testing.assert_array_equal(
                    got, np.array(values, hg.VALUE_NUMPY_DTYPES[element_type]).astype(got.dtype)
                )
        assert list(ours.tensors) == [t.name for t in reference.tensors]
        for t in reference.tensors:
            info = ours.tensors[t.name]
            assert list(info.dimensions) == [int(d) for d in t.shape]
            assert info.type_id == int(t.tensor_type) and info.dtype == t.tensor_type.name
            assert info.offset == t.data_offset and info.byte_len == t.n_bytes
            np.testing.assert_array_equal(
                ours.tensor(t.name).data, np.asarray(t.data).reshape(-1).view(np.uint8)
            )


def test_vocab_gguf_matches_gguf_package():
    path = shared_file("fixtures", "hy-mt2-7b-vocab.gguf")
    with GGUFFile(path) as ours:
        reference = gguf_pkg.GGUFReader(path)
        assert set(ours.metadata) == set(reference.fields) - {
            "GGUF.version",
            "GGUF.tensor_count",
            "GGUF.kv_count",
        }
        tokens = ours.metadata["tokenizer.ggml.tokens"]
        assert len(tokens) == 128167 and ours.tensors == {}
        field = reference.fields["tokenizer.ggml.tokens"]
        for i in (0, 1, 255, 1000, 127957, len(tokens) - 1):
            assert tokens[i] == field.contents(i)
        merges = ours.metadata["tokenizer.ggml.merges"]
        assert merges[::5000] == [
            reference.fields["tokenizer.ggml.merges"].contents(i) for i in range(0, len(merges), 5000)
        ]
        np.testing.assert_array_equal(
            ours.metadata["tokenizer.ggml.token_type"],
            reference.fields["tokenizer.ggml.token_type"].contents(),
        )
        assert (
            ours.get_str("tokenizer.chat_template") == reference.fields["tokenizer.chat_template"].contents()
        )
