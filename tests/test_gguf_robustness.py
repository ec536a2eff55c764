"""Seeded random mutations of a valid GGUF's header region: every one loads or raises a hymt error.

Mutations: byte flips, length/count fields set to hostile values, small-integer fields (types, ranks)
replaced, truncations, and combinations. Memory is bounded: no mutation may make the reader allocate
in proportion to a forged count.
"""

from __future__ import annotations

import random
import resource
import struct

import pytest
from gguf_bytes import U64_MAX, gguf_string, header, pad

from hymt import HymtError
from hymt.gguf import PROFILES, GGUFFile

MUTATIONS = 3000


def valid_file() -> tuple[bytes, int, list[int], list[int]]:
    """A valid file, the end of its header region, and the offsets of its u64 and u32 fields."""
    out = bytearray(header(3, 7))
    u64_fields = [8, 16]
    u32_fields = [4]

    def string(text: str) -> None:
        u64_fields.append(len(out))
        out.extend(gguf_string(text))

    def u32(value: int) -> None:
        u32_fields.append(len(out))
        out.extend(struct.pack("<I", value))

    def u64(value: int) -> None:
        u64_fields.append(len(out))
        out.extend(struct.pack("<Q", value))

    string("general.architecture")
    u32(8)
    string("hunyuan-dense")
    string("general.file_type")
    u32(4)
    out.extend(struct.pack("<I", 41))
    string("tokenizer.ggml.tokens")
    u32(9)
    u32(8)
    u64(4)
    for token in ("a", "bc", "Ġd", "世界"):
        string(token)
    string("tokenizer.ggml.token_type")
    u32(9)
    u32(5)
    u64(4)
    out.extend(struct.pack("<4i", 1, 1, 1, 3))
    string("scores")
    u32(9)
    u32(6)
    u64(2)
    out.extend(struct.pack("<2f", 0.5, -1.0))
    string("eps")
    u32(6)
    out.extend(struct.pack("<f", 1e-5))
    string("general.alignment")
    u32(4)
    out.extend(struct.pack("<I", 32))
    for name, dims, type_id, offset in (("w", [2], 0, 0), ("q", [256, 1], 14, 32), ("s", [256, 1], 42, 256)):
        string(name)
        u32(len(dims))
        for d in dims:
            u64(d)
        u32(type_id)
        u64(offset)
    header_end = len(pad(bytes(out)))
    data = pad(bytes(out)) + struct.pack("<2f", 1.0, -2.0) + bytes(24) + bytes(210) + bytes(14) + bytes(42)
    return data, header_end, u64_fields, u32_fields


HOSTILE_U64 = [
    0,
    1,
    2,
    3,
    7,
    31,
    32,
    33,
    255,
    2**16,
    2**31,
    2**32 - 1,
    2**32,
    2**62,
    2**63,
    U64_MAX - 1,
    U64_MAX,
]
HOSTILE_U32 = [0, 1, 2, 4, 5, 6, 7, 8, 9, 10, 12, 13, 14, 40, 42, 43, 2**31, 2**32 - 1]


def mutate(rng: random.Random, data: bytes, header_end: int, u64s: list[int], u32s: list[int]) -> bytes:
    out = bytearray(data)
    kinds = sorted(rng.randrange(4) for _ in range(rng.choice((1, 1, 1, 2, 3))))  # truncation (3) last
    for kind in kinds:
        if kind == 0:
            position = rng.randrange(header_end)
            out[position] = (
                rng.randrange(256) if rng.random() < 0.5 else out[position] ^ (1 << rng.randrange(8))
            )
        elif kind == 1:
            position = rng.choice(u64s)
            old = struct.unpack_from("<Q", out, position)[0]
            value = rng.choice(HOSTILE_U64 + [old + 1, max(old - 1, 0), len(data), rng.randrange(2**64)])
            struct.pack_into("<Q", out, position, value % 2**64)
        elif kind == 2:
            struct.pack_into("<I", out, rng.choice(u32s), rng.choice(HOSTILE_U32 + [rng.randrange(2**32)]))
        else:
            del out[rng.randrange(len(out) + 1) :]
    return bytes(out)


def test_random_header_mutations_load_or_raise_hymt_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    data, header_end, u64s, u32s = valid_file()
    with GGUFFile(_write(tmp_path / "valid.gguf", data), "tencent-stq1") as f:
        assert [t.dtype for t in f.tensors.values()] == ["F32", "Q6_K", "STQ1_0"]
    rng = random.Random(20260101)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    outcomes = {"loaded": 0, "refused": 0}
    path = tmp_path / "mutated.gguf"
    for _ in range(MUTATIONS):
        mutated = mutate(rng, data, header_end, u64s, u32s)
        _write(path, mutated)
        try:
            f = GGUFFile(path, rng.choice(PROFILES))
        except HymtError:
            outcomes["refused"] += 1
            continue
        except Exception as exc:  # pragma: no cover - the failure report
            pytest.fail(f"{type(exc).__name__}: {exc} for mutation {mutated[:header_end].hex()}")
        with f:
            for name, info in f.tensors.items():
                assert info.offset + info.byte_len <= len(mutated)
                assert f.tensor(name).data.size == info.byte_len
        outcomes["loaded"] += 1
    rss_growth_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
    assert rss_growth_kib < 200 * 1024
    assert outcomes["loaded"] > 0 and outcomes["refused"] > MUTATIONS // 2


def _write(path, data: bytes):
    path.write_bytes(data)
    return path
