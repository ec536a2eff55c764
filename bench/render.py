"""Markdown tables for docs/benchmarks.md from the JSON of `hymt-bench kernels` or `bench/serve_load.py`.

hymt-bench kernels > kernels.json && python bench/render.py kernels.json
python bench/serve_load.py --model synthetic:1.8b:q4_k > serve.json && python bench/render.py serve.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def kernel_tables(report: dict[str, Any]) -> str:
    amx = any(c.get("amx_int8_peak_gmac_s") for c in report["ceilings"].values())
    lines = [
        "| threads | read GB/s | int8 peak GMAC/s |" + (" AMX peak GMAC/s |" if amx else ""),
        "|---:|---:|---:|" + ("---:|" if amx else ""),
    ]
    for threads, ceiling in sorted(report["ceilings"].items()):
        extra = f" {ceiling['amx_int8_peak_gmac_s'] or 0:.0f} |" if amx else ""
        lines.append(f"| {threads} | {ceiling['read_gb_s']:.1f} | {ceiling['int8_peak_gmac_s']:.0f} |{extra}")
    lines += [
        "",
        "| format | n | threads | µs/call | weight GB/s | int8 GOP/s | roofline ratio | peak ratio |"
        + (" AMX peak ratio |" if amx else ""),
        "|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if amx else ""),
    ]
    order = {"STQ1_0": 0, "Q2_0C": 1, "Q4_K": 2, "Q6_K": 3, "Q6_K head": 4, "Q8_0": 5}
    rows = sorted(report["results"], key=lambda r: (order.get(r["format"], 9), r["n"], r["threads"]))
    for r in rows:
        peak = "—" if r["peak_ratio"] is None else f"{r['peak_ratio']:.2f}"
        amx_ratio = r.get("amx_peak_ratio")
        extra = (" — |" if amx_ratio is None else f" {amx_ratio:.2f} |") if amx else ""
        lines.append(
            f"| {r['format']} | {r['n']} | {r['threads']} | {r['us_per_call']:.0f} | {r['weight_gb_s']:.1f} "
            f"| {r['int8_gop_s']:.0f} | {r['roofline_ratio']:.2f} | {peak} |{extra}"
        )
    return "\n".join(lines)


def _maybe(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def serve_tables(report: dict[str, Any]) -> str:
    header = (
        "| server | streams | requests | generated tokens | aggregate tok/s | each round | × one stream "
        "| × one stream, median of rounds | mean TTFT ms | per-stream tok/s | server CPU ms/token | load avg "
        "| errors |"
    )
    columns = header.count("|") - 1
    lines = [header, "|---" + "|---:" * (columns - 1) + "|"]
    for key in ("hymt", "llama_server", "llama_cpp_server"):
        target = report.get(key)
        if target is None:
            continue
        if "skipped" in target:
            lines.append(f"| {key} | " + "— | " * (columns - 2) + f"skipped: {target['skipped']} |")
            continue
        scaling = target.get("scaling_vs_one_stream", {})
        within = target.get("scaling_median_of_rounds", {})  # absent in reports of older versions
        for level in target["levels"]:
            ttft = level["mean_ttft_ms"]
            per_stream = level["per_stream_tokens_per_second"]
            lines.append(
                f"| {target['server']} | {level['streams']} | {level['requests']} | {level['generated_tokens']} "
                f"| {level['aggregate_tokens_per_second']:.1f} "
                f"| {' / '.join(f'{x:.1f}' for x in level.get('aggregate_tokens_per_second_rounds', []))} "
                f"| {scaling.get(str(level['streams']), 0):.2f} "
                f"| {_maybe(within.get(str(level['streams'])), '.2f')} "
                f"| {'—' if ttft is None else f'{ttft:.0f}'} "
                f"| {'—' if per_stream is None else f'{per_stream:.1f}'} "
                f"| {_maybe(level.get('server_cpu_ms_per_token'), '.1f')} "
                f"| {_maybe(level.get('load_average_at_start'), '.1f')} | {len(level['errors'])} |"
            )
    return "\n".join(lines)


def main() -> int:
    for name in sys.argv[1:]:
        report = json.loads(Path(name).read_text())
        print(kernel_tables(report) if "ceilings" in report else serve_tables(report))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
