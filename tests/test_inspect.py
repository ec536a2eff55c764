"""`hymt-inspect` as a subprocess (REFERENCE.md §10.2, §12.11): the JSON report, `--tensors` against the
`gguf` package's own view of a file it wrote, profiles, and `error: …` without a traceback on bad input."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import gguf as gguf_pkg
import numpy as np
import pytest
from gguf_bytes import gguf_file, tensor_info, weight_file

import hymt
from hymt.gguf import DTYPES, GGUFWriter

# The package directory under test (in-place checkout or installed), so the child imports the same hymt.
PACKAGE_ROOT = str(Path(hymt.__file__).resolve().parents[1])
PROGRAM = "from hymt.cli import run; from hymt.inspect import main; run(main)"


def inspect(*args: str | os.PathLike[str], cache: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=PACKAGE_ROOT)
    if cache is not None:
        env["XDG_CACHE_HOME"] = str(cache)
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, *map(str, args)],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=env,
        timeout=120,
    )


def assert_clean_error(result: subprocess.CompletedProcess[str], message: str, code: int = 1) -> None:
    assert result.returncode == code
    assert result.stdout == ""
    assert result.stderr.splitlines()[-1] == f"error: {message}"
    assert "Traceback" not in result.stderr


@pytest.fixture
def model(tmp_path: Path) -> Path:
    writer = GGUFWriter(tmp_path / "model.gguf")
    writer.add_string("general.architecture", "hunyuan-dense")
    writer.add_uint32("hunyuan-dense.block_count", 1)
    writer.add_float32("hunyuan-dense.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_float64("f64", 0.25)
    writer.add_bool("flag", True)
    writer.add_int8("neg", -3)
    writer.add_string("tokenizer.chat_template", "{{ bos_token }}")
    writer.add_array("tokenizer.ggml.tokens", ["a", "b"], 8)
    writer.add_string("general.name", "模型")
    writer.add_tensor("z.weight", [4], "F32", np.ones(4, np.float32))
    writer.add_tensor("a.weight", [32, 2], "Q8_0", bytes(68))
    writer.add_tensor("m.weight", [256, 1], "Q6_K", bytes(210))
    return writer.write()


def test_report_fields(model):
    result = inspect(model)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith('{\n  "file_bytes": ')  # pretty, 2-space indentation
    report = json.loads(result.stdout)
    assert report == {
        "file_bytes": model.stat().st_size,
        "metadata": {
            "general.architecture": "hunyuan-dense",
            "hunyuan-dense.block_count": 1,
            "hunyuan-dense.attention.layer_norm_rms_epsilon": 9.999999747378752e-06,
            "f64": 0.25,
            "flag": True,
            "neg": -3,
            "general.name": "模型",
        },
        "profile": "standard",
        "tensor_count": 3,
        "tensor_types": {"F32": 1, "Q6_K": 1, "Q8_0": 1},
    }
    assert "9.999999747378752e-06" in result.stdout


def test_tensors_flag_and_model_flag(model):
    result = inspect("--tensors", "--model", model, "--gguf-profile", "standard")
    assert result.returncode == 0, result.stderr
    tensors = json.loads(result.stdout)["tensors"]
    assert [t["name"] for t in tensors] == ["a.weight", "m.weight", "z.weight"]
    assert tensors[0] == {
        "name": "a.weight",
        "dimensions": [32, 2],
        "type_id": 8,
        "dtype": "Q8_0",
        "offset": tensors[0]["offset"],
        "byte_len": 68,
    }


def test_tensors_match_gguf_package(tmp_path):
    path = tmp_path / "theirs.gguf"
    writer = gguf_pkg.GGUFWriter(path, "llama")
    writer.add_uint32("llama.block_count", 2)
    shapes = {
        "tok.weight": ("F16", [64, 3]),
        "b.weight": ("Q4_K", [256, 2]),
        "c.weight": ("Q6_K", [256, 1]),
        "d.weight": ("Q8_0", [32, 5]),
        "a.weight": ("F32", [7]),
    }
    for name, (dtype, dims) in shapes.items():
        elements = int(np.prod(dims))
        raw = np.zeros(DTYPES[dtype].byte_len(elements), np.uint8)
        if dtype in ("F32", "F16"):
            writer.add_tensor(
                name, raw.view(np.float32 if dtype == "F32" else np.float16).reshape(dims[::-1])
            )
        else:
            writer.add_tensor(
                name, raw.reshape(int(np.prod(dims[1:])), -1), raw_dtype=gguf_pkg.GGMLQuantizationType[dtype]
            )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    result = inspect(path, "--tensors")
    assert result.returncode == 0, result.stderr
    ours = json.loads(result.stdout)
    reference = gguf_pkg.GGUFReader(path)
    expected = sorted(
        (
            {
                "name": t.name,
                "dimensions": [int(d) for d in t.shape],
                "type_id": int(t.tensor_type),
                "dtype": t.tensor_type.name,
                "offset": int(t.data_offset),
                "byte_len": int(t.n_bytes),
            }
            for t in reference.tensors
        ),
        key=lambda record: record["name"],
    )
    assert ours["tensors"] == expected
    assert ours["tensor_count"] == 5 and ours["metadata"]["llama.block_count"] == 2
    assert ours["tensor_types"] == {"F16": 1, "F32": 1, "Q4_K": 1, "Q6_K": 1, "Q8_0": 1}


def stq_file(tmp_path: Path) -> Path:
    writer = GGUFWriter(tmp_path / "stq.gguf")
    writer.add_string("general.architecture", "hunyuan-dense")
    writer.add_uint32("general.file_type", 41)
    writer.add_tensor("blk.0.w", [256, 2], "STQ1_0", bytes(84))
    writer.add_tensor("norm", [4], "F32", bytes(16))
    return writer.write()


def test_profiles(tmp_path):
    path = stq_file(tmp_path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    for _ in range(2):  # the second run answers from the digest cache, with the same message
        assert_clean_error(
            inspect(path, cache=tmp_path / "cache"),
            f"ambiguous GGUF type 40/42 in an unrecognized file (SHA256 {digest}); use --gguf-profile "
            "tencent-q2-0c or tencent-stq1 only for a known Tencent legacy export",
        )
    result = inspect(path, "--gguf-profile", "tencent-stq1", "--tensors")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["profile"] == "tencent-stq1" and report["tensor_types"] == {"F32": 1, "STQ1_0": 1}
    assert report["tensors"][0]["type_id"] == 42 and report["tensors"][0]["byte_len"] == 84
    assert_clean_error(
        inspect(path, "--gguf-profile", "tencent-q2-0c"),
        "tensor blk.0.w: unsupported GGUF tensor type 42 for profile tencent-q2-0c",
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"not gguf at all", "not a GGUF file"),
        (weight_file()[:20], "truncated GGUF header"),
        (weight_file()[:-1], "truncated tensor weight: end 72, file length 71"),
        (gguf_file([], [tensor_info("w", [2], 0, 4)], bytes(32)), "unaligned tensor w"),
        (b"GGUF" + struct.pack("<IQQ", 3, 2**64 - 1, 0) + bytes(32), "GGUF count exceeds file bounds"),
    ],
)
def test_bad_files(tmp_path, data, message):
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    assert_clean_error(inspect(path), message)


def test_missing_file_and_directory(tmp_path):
    result = inspect(tmp_path / "absent.gguf")
    assert result.returncode == 1 and result.stderr.startswith("error: ") and "Traceback" not in result.stderr
    result = inspect(tmp_path)
    assert result.returncode == 1 and result.stderr.startswith("error: ") and "Traceback" not in result.stderr


def test_help_version_and_bad_flags(model):
    result = inspect("--help")
    assert result.returncode == 0 and "Validate GGUF layout and print model metadata." in result.stdout
    assert "--gguf-profile" in result.stdout and "--tensors" in result.stdout
    result = inspect("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"hymt-inspect {hymt.__version__}"
    bad = inspect(model, "--gguf-profile", "legacy")
    assert (
        bad.returncode == 2
        and "error: argument --gguf-profile" in bad.stderr
        and "Traceback" not in bad.stderr
    )
    bad = inspect(model, "--bogus")
    assert bad.returncode == 2 and "error: unrecognized arguments: --bogus" in bad.stderr
    bad = inspect(model, "--model", model)
    assert bad.returncode == 2 and "error: " in bad.stderr
