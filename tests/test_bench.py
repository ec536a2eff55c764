"""`hymt-bench` run as a user runs it (a subprocess against the in-place build): §10.3 fields, §12.11.

The §12.1 non-numeric tiny fixture is the oracle: its vocabulary is the 256 bytes plus four control tokens
and no merges, so the templated prompt is `[BOS] [USER] <prompt bytes> [ASSISTANT]` id for id, and its
output row makes every greedy step emit byte `a` (id 97). The synthetic `tiny` preset checks the
`synthetic:` model spec and the config record against the `gguf` package's reader.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import gguf
import pytest

from hymt import kernels
from hymt.synthetic import ensure_synthetic_model, write_tiny_fixture

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PROMPT = "Translate the following text into Chinese:\nHello, world."
BOS, USER, ASSISTANT, EOS = 256, 257, 258, 259  # §12.1 control tokens
REPORT_KEYS = {
    "concurrency",
    "config",
    "kernel",
    "load_ms",
    "peak_rss_bytes",
    "profile",
    "prompt_token_ids",
    "runs",
    "threads",
    "wall_ms",
}
CONFIG_KEYS = {
    "architecture",
    "context_length",
    "head_dim",
    "heads",
    "hidden",
    "kv_heads",
    "layers",
    "rms_epsilon",
    "rope_base",
    "vocab_size",
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bench-data")
    ensure_synthetic_model("tiny", "f32", path)  # written once, reused by every subprocess
    return path


@pytest.fixture(scope="module")
def fixture_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_fixture(
        tmp_path_factory.mktemp("bench-fixture") / "tiny.gguf", moe=False, numeric=False
    )


def bench(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # The hymt under test (installed or built in place); -P keeps the bare source tree off sys.path.
    package_root = str(Path(kernels.__file__).resolve().parents[1])
    env = {**os.environ, "HYMT_DATA_DIR": str(data_dir), "PYTHONPATH": package_root}
    return subprocess.run(
        [
            sys.executable,
            "-P",
            "-c",
            "from hymt.cli import run; from hymt.bench import main; run(main)",
            *args,
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def report(data_dir: Path, *args: str) -> dict[str, Any]:
    result = bench(data_dir, *args)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)  # stdout is the JSON document and nothing else


def check_run(run: dict[str, Any], prompt_ids: list[int], max_tokens: int) -> None:
    completion = run["completion"]
    assert set(completion) == {"finish_reason", "text", "timing", "token_ids", "usage"}
    ids = completion["token_ids"]
    assert completion["usage"] == {
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": len(ids),
        "total_tokens": len(prompt_ids) + len(ids),
    }
    timing = completion["timing"]
    assert set(timing) == {"decode_ms", "first_token_ms", "prefill_ms", "total_ms"}
    assert 0 < timing["prefill_ms"] <= timing["first_token_ms"] <= timing["total_ms"]
    assert timing["decode_ms"] == pytest.approx(timing["total_ms"] - timing["first_token_ms"], rel=1e-9)
    prefill = len(prompt_ids) * 1000.0 / max(timing["prefill_ms"], 0.001)
    decode = max(len(ids) - 1, 0) * 1000.0 / max(timing["decode_ms"], 0.001)
    assert run["prefill_tokens_per_second"] == pytest.approx(prefill, rel=1e-12)
    assert run["decode_tokens_per_second"] == pytest.approx(decode, rel=1e-12)
    assert 1 <= len(ids) <= max_tokens


def test_report_on_the_tiny_fixture(data_dir: Path, fixture_model: Path) -> None:
    out = report(data_dir, "--model", str(fixture_model), "--max-tokens", "5", "--threads", "1")
    assert REPORT_KEYS <= set(out)
    assert out["prompt_token_ids"] == [BOS, USER, *DEFAULT_PROMPT.encode(), ASSISTANT]
    assert out["concurrency"] == 1 and out["threads"] == 1
    assert out["kernel"] == kernels.isa()
    assert out["profile"] == "standard"
    assert out["config"] == {
        "architecture": "hunyuan-dense",
        "context_length": 4096,
        "head_dim": 2,
        "heads": 2,
        "hidden": 4,
        "kv_heads": 1,
        "layers": 1,
        "rms_epsilon": pytest.approx(1e-5, rel=1e-6),
        "rope_base": 10000.0,
        "vocab_size": 260,
    }
    assert isinstance(out["load_ms"], float) and out["load_ms"] > 0
    assert isinstance(out["peak_rss_bytes"], int) and out["peak_rss_bytes"] > 10 * 2**20
    [run] = out["runs"]
    check_run(run, out["prompt_token_ids"], 5)
    # Greedy (temperature 0 by default) with the dense penalty never leaves byte `a`.
    assert run["completion"]["token_ids"] == [97] * 5
    assert run["completion"]["text"] == "aaaaa"
    assert run["completion"]["finish_reason"] == "length"
    assert out["wall_ms"] >= run["completion"]["timing"]["total_ms"]


def test_raw_prompt_and_prompt_file(data_dir: Path, fixture_model: Path, tmp_path: Path) -> None:
    text = "Übersetze:\n«Grüße» — 你好\n"
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text(text, encoding="utf-8")
    common = ("--model", str(fixture_model), "--max-tokens", "2", "--prompt", "ignored")
    templated = report(data_dir, *common, "--prompt-file", str(prompt_file))
    assert templated["prompt_token_ids"] == [BOS, USER, *text.encode(), ASSISTANT]
    raw = report(data_dir, *common, "--prompt-file", str(prompt_file), "--raw-prompt")
    assert raw["prompt_token_ids"] == list(text.encode())  # no template, no BOS
    check_run(raw["runs"][0], raw["prompt_token_ids"], 2)
    inline = report(
        data_dir, "--model", str(fixture_model), "--max-tokens", "1", "--raw-prompt", "--prompt", "ab"
    )
    assert inline["prompt_token_ids"] == [97, 98]
    assert inline["runs"][0]["decode_tokens_per_second"] == 0.0  # one token: nothing after the first


def test_synthetic_spec_and_concurrency(data_dir: Path) -> None:
    out = report(data_dir, "--model", "synthetic:tiny:f32", "--max-tokens", "6", "--concurrency", "2")
    path = next((data_dir / "synthetic").glob("tiny-f32-*.gguf"))
    reader = gguf.GGUFReader(path)

    def field(key: str) -> Any:
        return reader.fields[key].contents()

    arch = field("general.architecture")
    assert out["config"]["architecture"] == arch
    assert out["config"]["layers"] == field(f"{arch}.block_count")
    assert out["config"]["hidden"] == field(f"{arch}.embedding_length")
    assert out["config"]["heads"] == field(f"{arch}.attention.head_count")
    assert out["config"]["kv_heads"] == field(f"{arch}.attention.head_count_kv")
    assert out["config"]["context_length"] == field(f"{arch}.context_length")
    assert out["config"]["vocab_size"] == len(field("tokenizer.ggml.tokens"))
    assert set(out["config"]) == CONFIG_KEYS
    assert out["concurrency"] == 2 and len(out["runs"]) == 2
    first, second = out["runs"]
    for run in out["runs"]:
        check_run(run, out["prompt_token_ids"], 6)
    assert first["completion"]["token_ids"] == second["completion"]["token_ids"]
    assert first["completion"]["text"] == second["completion"]["text"]
    assert out["prompt_token_ids"][0] == field("tokenizer.ggml.bos_token_id")
    assert out["threads"] == kernels.usable_physical_cores()


def test_llama_cpp_comparison_skips_tencent_formats(data_dir: Path) -> None:
    out = report(data_dir, "--model", "synthetic:tiny:q2_0c", "--max-tokens", "2", "--compare-llama-cpp")
    assert out["profile"] == "tencent-q2-0c"
    assert set(out["llama_cpp"]) == {"skipped"}
    assert "ratios" not in out
    skipped = out["llama_cpp"]["skipped"]
    assert "Q2_0C (GGUF type 40)" in skipped or "not installed" in skipped


@pytest.mark.reference
def test_llama_cpp_comparison_on_a_float_file(data_dir: Path) -> None:
    out = report(data_dir, "--model", "synthetic:tiny:f32", "--max-tokens", "8", "--compare-llama-cpp")
    theirs = out["llama_cpp"]
    assert "skipped" not in theirs and "error" not in theirs, theirs
    ours = out["runs"][0]
    # Same file, same prompt ids, same sampler: float32 logits agree far beyond a greedy decision.
    assert theirs["token_ids"] == ours["completion"]["token_ids"]
    assert theirs["perf_context"]["n_p_eval"] == len(out["prompt_token_ids"])
    assert out["ratios"]["decode"] == pytest.approx(
        ours["decode_tokens_per_second"] / theirs["decode_tokens_per_second"]
    )
    assert out["ratios"]["prefill"] == pytest.approx(
        ours["prefill_tokens_per_second"] / theirs["prefill_tokens_per_second"]
    )


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--concurrency", "0"], 2, "error: concurrency and threads must be positive"),
        (["--threads", "-1"], 2, "error: concurrency and threads must be positive"),
        # libgomp cannot create that many threads (or a worker crashes): refused up front instead.
        (["--threads", "100000"], 2, "error: threads must be at most 1024"),
        (["--seed", "-1"], 2, "error: seed must be an integer between 0 and 2^64-1"),
        (["--seed", str(2**64)], 2, "error: seed must be an integer between 0 and 2^64-1"),
        (["--max-tokens", "many"], 2, "error: argument --max-tokens: invalid int value: 'many'"),
        (["--no-such-flag"], 2, "error: unrecognized arguments: --no-such-flag"),
        (["--gguf-profile", "odd"], 2, "error: argument --gguf-profile: invalid choice"),
        (["--model", "synthetic:nope:f32"], 1, "error: unknown synthetic preset nope"),
    ],
)
def test_bad_flags(data_dir: Path, args: list[str], code: int, message: str) -> None:
    result = bench(data_dir, *args)
    assert result.returncode == code
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-tokens", "0"], "error: output token limit must be positive"),
        (["--temperature", "2.5"], "error: temperature must be between 0 and 2"),
        (["--temperature", "nan"], "error: temperature must be between 0 and 2"),
        (["--ctx-size", "5000"], "error: context must be between 1 and 4096"),
        (["--ctx-size", "10"], "error: prompt leaves no output space"),
        (["--ctx-size", "64", "--max-tokens", "64"], "error: prompt plus output limit exceeds context size"),
    ],
)
def test_bad_generation_settings(data_dir: Path, fixture_model: Path, args: list[str], message: str) -> None:
    result = bench(data_dir, "--model", str(fixture_model), *args)
    assert result.returncode == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_bad_files(data_dir: Path, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"NOTAGGUF" * 16)
    bad_prompt = tmp_path / "bad.txt"
    bad_prompt.write_bytes(b"\xff\xfe not utf-8")
    fixture = write_tiny_fixture(tmp_path / "tiny.gguf", moe=False, numeric=False)
    cases = [
        (["--model", str(tmp_path / "missing.gguf")], "missing.gguf"),
        (["--model", str(garbage)], "error: "),
        (["--model", str(fixture), "--prompt-file", str(tmp_path / "nope.txt")], "nope.txt"),
        (["--model", str(fixture), "--prompt-file", str(bad_prompt)], "is not valid UTF-8"),
    ]
    for args, message in cases:
        result = bench(data_dir, *args)
        assert result.returncode == 1, (args, result.stderr)
        assert message in result.stderr and "error: " in result.stderr
        assert "Traceback" not in result.stderr
        assert result.stdout == ""


def test_help_and_version(data_dir: Path) -> None:
    result = bench(data_dir, "--help")
    assert result.returncode == 0
    for flag in (
        "--model",
        "--gguf-profile",
        "--prompt",
        "--prompt-file",
        "--raw-prompt",
        "--max-tokens",
        "--ctx-size",
        "--temperature",
        "--seed",
        "--threads",
        "--concurrency",
        "--compare-llama-cpp",
    ):
        assert flag in result.stdout
    version = bench(data_dir, "--version")
    assert version.returncode == 0 and version.stdout.startswith("hymt-bench ")


def test_kernels_subcommand(data_dir: Path) -> None:
    out = report(
        data_dir,
        "kernels",
        "--formats",
        "Q8_0",
        "--threads",
        "1",
        "--batches",
        "1",
        "--working-set-mib",
        "4",
        "--min-seconds",
        "0.01",
        "--no-head",
    )
    assert out["machine"]["kernel"] == kernels.isa()
    assert set(out["ceilings"]) == {"1"}
    [row] = out["results"]
    assert (row["format"], row["n"], row["threads"]) == ("Q8_0", 1, 1)
    assert row["calls"] >= 7  # one pass over the seven matrices of a 1.8B layer at least


def test_seeded_sampling_is_identical_across_concurrent_runs(data_dir: Path) -> None:
    args = ("--model", "synthetic:tiny:f32", "--max-tokens", "8", "--temperature", "1.5", "--seed", "7")
    out = report(data_dir, *args, "--concurrency", "3")
    ids = [run["completion"]["token_ids"] for run in out["runs"]]
    assert ids[0] == ids[1] == ids[2]
    alone = report(data_dir, *args)
    assert alone["runs"][0]["completion"]["token_ids"] == ids[0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the inherited ru_maxrss is a Linux trait")
def test_peak_rss_is_the_process_own_not_its_parents() -> None:
    """A process started by a large one (model_table after its bandwidth pool, hymt-bench's llama.cpp child)
    reports its own peak: ru_maxrss would carry the parent's 512 MiB across fork and exec."""
    probe = "from hymt.bench import peak_rss_bytes; print(peak_rss_bytes())"
    parent = (
        "import subprocess, sys\n"
        "import numpy as np\n"
        "pool = np.ones(512 << 20, dtype=np.uint8)  # touched: resident\n"
        f"print(subprocess.run([sys.executable, '-P', '-c', {probe!r}], capture_output=True, text=True,"
        " check=True).stdout)"
    )
    # The hymt under test, as in bench(): installed or built in place, never the bare source tree.
    env = {**os.environ, "PYTHONPATH": str(Path(kernels.__file__).resolve().parents[1])}
    out = subprocess.run(
        [sys.executable, "-P", "-c", parent], capture_output=True, text=True, check=True, env=env
    )
    child_peak = int(out.stdout.split()[0])
    assert 10 * 2**20 < child_peak < 256 * 2**20
