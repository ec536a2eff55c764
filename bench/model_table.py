"""Model benchmark table for docs/benchmarks.md: `hymt-bench --compare-llama-cpp` over formats × threads.

For each format of the synthetic 1.8B shape: one warm-up run (writes the file if needed and fills the page
cache, so every measured load is a second start), then one measured run per thread count with a raw prompt
of exactly ``--prompt-tokens`` tokens and ``--max-tokens`` greedy tokens, llama.cpp on the same file in the
same run. The decode memory roofline of each format is bytes read per decode token ÷ the read bandwidth
measured by the kernel benchmark's streaming loop right after the runs.

    python bench/model_table.py --formats stq1,q2_0c,q4_k,q8_0 --threads 2,1 --out /tmp/model_runs

Writes one JSON report per run into ``--out`` and prints the Markdown tables on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from hymt.cli import resolve_model  # noqa: E402

BENCH = "from hymt.cli import run; from hymt.bench import main; run(main)"
WORDS = (
    "The committee reviewed the annual report and agreed that the new translation service should support "
    "every regional office before the end of the year while keeping costs under control and quality high "
    "for customers who read documents in Chinese English French German Japanese Korean and Spanish"
).split()
MIB = 2**20
KV_STEP = 256  # sessions grow their KV cache in 256-position steps


def prompt_text(path: Path, profile: str, tokens: int) -> str:
    """A text of exactly ``tokens`` tokens under this model's tokenizer (raw, no template)."""
    from hymt.gguf import GGUFFile
    from hymt.tokenizer import Tokenizer

    with GGUFFile(path, profile=profile) as gguf:
        tokenizer = Tokenizer.from_gguf(gguf)
        words: list[str] = []
        while len(tokenizer.encode(" ".join(words))) < tokens:
            words.append(WORDS[len(words) % len(WORDS)])
        ids = tokenizer.encode(" ".join(words))[:tokens]
        for cut in range(len(ids), 0, -1):  # decoded prefixes re-encode to themselves almost always
            text = tokenizer.decode(ids[:cut])
            if len(tokenizer.encode(text)) == tokens:
                return text
        text = tokenizer.decode(ids)
        if len(tokenizer.encode(text)) != tokens:
            raise SystemExit(f"could not build a {tokens}-token prompt")
        return text


def decode_bytes_per_token(path: Path, profile: str) -> int:
    """Weight bytes one decode step reads: every matrix, plus the head (token_embd when tied)."""
    from hymt.gguf import GGUFFile

    with GGUFFile(path, profile=profile) as gguf:
        tied = "output.weight" not in gguf.tensors
        return sum(
            info.byte_len for name, info in gguf.tensors.items() if name != "token_embd.weight" or tied
        )


def run_bench(args: Sequence[str]) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", BENCH, *args], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise SystemExit(f"hymt-bench {' '.join(args)} failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout)


def read_bandwidth(threads: int, size: int = 2 << 30) -> float:
    """GB/s of the kernel benchmark's streaming read loop over ``size`` bytes (far beyond any cache)."""
    import numpy as np

    from hymt import kernelbench

    pool = np.ones(size, dtype=np.uint8)
    return kernelbench.measure_bandwidth(pool, threads) / 1e9


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--formats", default="stq1,q2_0c,q4_k,q8_0")
    parser.add_argument("--threads", default="2,1")
    parser.add_argument("--preset", default="1.8b")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("/tmp/model_runs"))
    parser.add_argument("--no-llama-cpp", action="store_true")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    formats = args.formats.split(",")
    threads = [int(t) for t in args.threads.split(",")]

    rows = []
    for fmt in formats:
        spec = f"synthetic:{args.preset}:{fmt}"
        path, profile = resolve_model(spec)
        prompt_file = args.out / f"prompt-{args.prompt_tokens}.txt"
        prompt_file.write_text(prompt_text(path, profile, args.prompt_tokens), encoding="utf-8")
        print(f"model_table: {spec} warm-up", file=sys.stderr, flush=True)
        run_bench(["--model", spec, "--max-tokens", "2", "--raw-prompt", "--prompt-file", str(prompt_file)])
        for t in threads:
            print(f"model_table: {spec} threads={t}", file=sys.stderr, flush=True)
            bench_args = [
                "--model",
                spec,
                "--raw-prompt",
                "--prompt-file",
                str(prompt_file),
                "--max-tokens",
                str(args.max_tokens),
                "--threads",
                str(t),
            ]
            if not args.no_llama_cpp:
                bench_args.append("--compare-llama-cpp")
            load_before = os.getloadavg()[0]
            report = run_bench(bench_args)
            report["load_average_before"] = load_before
            report["load_average_after"] = os.getloadavg()[0]
            report["decode_bytes_per_token"] = decode_bytes_per_token(path, profile)
            report["environment"] = {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
            (args.out / f"{fmt}-t{t}.json").write_text(json.dumps(report, indent=2))
            rows.append((fmt, t, report))

    bandwidth = {t: read_bandwidth(t) for t in threads}
    (args.out / "bandwidth.json").write_text(json.dumps(bandwidth))
    print(markdown(rows, bandwidth, args.max_tokens))
    return 0


def _fmt(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def markdown(
    rows: list[tuple[str, int, dict[str, Any]]], bandwidth: dict[int, float], max_tokens: int
) -> str:
    lines = [
        "| format | file MiB | threads | prefill tok/s hymt | llama.cpp | ratio | decode tok/s hymt | llama.cpp "
        "| ratio | tokens | peak RSS MiB hymt | RSS budget MiB | llama.cpp RSS MiB | load ms | load avg |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for fmt, threads, r in rows:
        run = r["runs"][0]
        llama = r.get("llama_cpp", {})
        ok = "prefill_tokens_per_second" in llama
        ratios = r.get("ratios", {})
        kv = r["kv_bytes_per_token"] * KV_STEP  # the step the 64+32 positions occupy
        budget = (r["file_bytes"] + kv + 200 * MIB) / MIB
        lines.append(
            f"| {fmt} | {r['file_bytes'] / MIB:.0f} | {threads} "
            f"| {_fmt(run['prefill_tokens_per_second'])} | {_fmt(llama.get('prefill_tokens_per_second'))} "
            f"| {_fmt(ratios.get('prefill'), 2)} "
            f"| {_fmt(run['decode_tokens_per_second'])} | {_fmt(llama.get('decode_tokens_per_second'))} "
            f"| {_fmt(ratios.get('decode'), 2)} "
            f"| {run['completion']['usage']['completion_tokens']}/{max_tokens} "
            f"| {r['peak_rss_bytes'] / MIB:.0f} | {budget:.0f} "
            f"| {_fmt(llama['peak_rss_bytes'] / MIB, 0) if ok else '—'} "
            f"| {r['load_ms']:.0f} | {r['load_average_before']:.1f} |"
        )
    skipped = {fmt: r["llama_cpp"]["skipped"] for fmt, _, r in rows if "skipped" in r.get("llama_cpp", {})}
    for fmt, reason in sorted(skipped.items()):
        lines.append(f"\nllama.cpp on {fmt}: skipped — {reason}.")
    notes = sorted({r["llama_cpp"]["note"] for _, _, r in rows if "note" in r.get("llama_cpp", {})})
    notes += sorted(
        {f"{f}: {r['llama_cpp']['error']}" for f, _, r in rows if "error" in r.get("llama_cpp", {})}
    )
    for note in notes:
        lines.append(f"\nllama.cpp: {note}.")
    if bandwidth:
        lines.append(
            "\n| format | threads | bytes/token MiB | read GB/s | roofline tok/s | decode tok/s "
            "| % of roofline |"
        )
        lines.append("|---|---:|---:|---:|---:|---:|---:|")
        for fmt, threads, r in rows:
            per_token = r["decode_bytes_per_token"]
            roofline = bandwidth[threads] * 1e9 / per_token
            decode = r["runs"][0]["decode_tokens_per_second"]
            lines.append(
                f"| {fmt} | {threads} | {per_token / MIB:.0f} | {bandwidth[threads]:.1f} | {roofline:.1f} "
                f"| {decode:.1f} | {100 * decode / roofline:.0f}% |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
