"""Kernel micro-benchmark (issue 3): matrix products of every quantized format against this machine's
roofline, measured in one run.

Ceilings: the streaming read bandwidth (every thread sums its slice of a buffer the size of the working set
with the widest loads of the active ISA) and the peak int8 multiply-accumulate rate (a register-only loop
of the ISA's best dot instruction on every thread). For a call, roofline time = max(weight bytes ÷
bandwidth, multiply-accumulates ÷ peak rate); a run's roofline ratio is Σ roofline time ÷ Σ measured time.

Workload: the matrices of the Hy-MT2-1.8B layers (q/o 2048×2048, k/v 512×2048, gate/up 6144×2048, down
2048×6144; rows × cols) in each format, cycled through a working set of at least 4× the last-level cache
(layers repeated as often as needed: a 1.25Bit model is smaller than that), plus the 120818×2048 Q6_K output head
on its own. Weights are random valid blocks (finite fp16 scales). Calls are timed in C, one product after
another, as the model issues them (activation preparation and the OpenMP region included).

    python -m hymt.kernelbench [--formats Q8_0,STQ1_0] [--threads 1,2] [--batches 1,8,64] > kernels.json
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hymt import kernels, quant
from hymt._kernels import quant as _quant
from hymt.cli import ArgumentParser
from hymt.errors import KernelError

# (name, rows, cols) of one Hy-MT2-1.8B layer, in the order the forward pass uses them.
LAYER_1_8B = (
    ("attn_q", 2048, 2048),
    ("attn_k", 512, 2048),
    ("attn_v", 512, 2048),
    ("attn_output", 2048, 2048),
    ("ffn_gate", 6144, 2048),
    ("ffn_up", 6144, 2048),
    ("ffn_down", 2048, 6144),
)
HEAD_1_8B = ("output", 120818, 2048)
HEAD_FORMAT = "Q6_K"
# Byte offsets of the fp16 scales in a block (everything else may be any byte).
SCALE_OFFSETS = {"Q8_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,), "Q2_0C": (0,), "STQ1_0": (40,)}
DEFAULT_L3_BYTES = 32 << 20


@dataclass(frozen=True)
class Matrix:
    name: str
    rows: int
    cols: int
    dtype: str
    data: np.ndarray  # uint8 [byte_len], a view of the shared random buffer

    @property
    def macs(self) -> int:
        return self.rows * self.cols


def last_level_cache_bytes() -> int:
    """The largest cache size Linux reports for CPU 0 (DEFAULT_L3_BYTES when unknown)."""
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        entries = os.listdir(base)
    except OSError:
        return DEFAULT_L3_BYTES
    for entry in entries:
        try:
            with open(f"{base}/{entry}/size") as f:
                text = f.read().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
        digits = text[:-1] if scale != 1 else text
        if digits.isdigit():
            best = max(best, int(digits) * scale)
    return best or DEFAULT_L3_BYTES


def available_memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def byte_len(dtype: str, rows: int, cols: int) -> int:
    info = quant.FORMATS[dtype]
    return rows * cols // info.block_len * info.block_bytes


def make_valid(dtype: str, data: np.ndarray, rng: np.random.Generator) -> None:
    """Write finite fp16 scales (±0.01) into every block of ``data`` in place."""
    info = quant.FORMATS[dtype]
    blocks = data.reshape(-1, info.block_bytes)
    for offset in SCALE_OFFSETS[dtype]:
        scales = rng.uniform(-0.01, 0.01, blocks.shape[0]).astype(np.float16)
        blocks[:, offset : offset + 2] = scales.view(np.uint8).reshape(-1, 2)


def carve(
    pool: np.ndarray,
    dtype: str,
    shapes: Sequence[tuple[str, int, int]],
    copies_until: int,
    rng: np.random.Generator,
) -> list[Matrix]:
    """Matrices of ``shapes`` in ``dtype`` laid end to end in ``pool``, repeated until they cover
    ``copies_until`` bytes (at least once)."""
    matrices: list[Matrix] = []
    offset = 0
    while offset < copies_until or not matrices:
        for name, rows, cols in shapes:
            size = byte_len(dtype, rows, cols)
            if offset + size > pool.size:
                raise KernelError(f"benchmark pool too small for {dtype} {name}")
            data = pool[offset : offset + size]
            make_valid(dtype, data, rng)
            matrices.append(Matrix(name, rows, cols, dtype, data))
            offset += size
    return matrices


def measure_bandwidth(pool: np.ndarray, threads: int, repeats: int = 3) -> float:
    """Best streaming read rate over ``pool`` in bytes/s."""
    best = 0.0
    for _ in range(repeats):
        seconds = _quant.bench_read(pool, 1, threads)
        best = max(best, pool.size / seconds)
    return best


def measure_int8_peak(threads: int, repeats: int = 3, iters: int = 20_000_000) -> float:
    """Best multiply-accumulates per second of the register-only int8 loop (0 when the ISA has none)."""
    best = 0.0
    for _ in range(repeats):
        seconds, macs = _quant.bench_int8_peak(iters, threads)
        if macs:
            best = max(best, macs / seconds)
    return best


def measure_amx_peak(threads: int, repeats: int = 3, iters: int = 1_000_000) -> float:
    """Best multiply-accumulates per second of the register-only AMX tdpbusd loop (0 without AMX tiles
    in use: the ceiling of the batched kernels when they run on tiles)."""
    best = 0.0
    if not kernels.amx() or kernels.isa() != "avx512":
        return best
    for _ in range(repeats):
        seconds, macs = _quant.bench_amx_peak(iters, threads)
        if macs:
            best = max(best, macs / seconds)
    return best


def run_products(
    matrices: list[Matrix], n: int, min_seconds: float, rng: np.random.Generator, repeats: int = 3
) -> tuple[list[float], list[int], list[float]]:
    """Time the same sequence of products ``repeats`` times (more while under ``min_seconds`` in total) and
    keep the fastest repetition (other processes only ever slow a run down). A repetition is one pass over
    every matrix for GEMV (so the weights come from memory, not cache) and enough whole layers for
    ~``min_seconds / repeats`` for batched calls. Returns seconds and calls per matrix of the fastest
    repetition, and each matrix's fastest single call over all repetitions."""
    max_cols = max(m.cols for m in matrices)
    max_rows = max(m.rows for m in matrices)
    x = rng.standard_normal(n * max_cols).astype(np.float32)  # [n, cols] per matrix
    out = np.empty(n * max_rows, dtype=np.float32)
    weights = [(m.dtype, m.data, m.rows, m.cols) for m in matrices]
    layer = min(len(weights), len(LAYER_1_8B))
    pilot, _, _ = _quant.bench_matmul(weights, x, n, out, 0, layer)  # also warms up scratch and threads
    if n == 1:
        calls = len(weights)
    else:
        per_layer = max(sum(pilot), 1e-6)
        calls = layer * max(1, int(min_seconds / repeats / per_layer))
    best: tuple[list[float], list[int]] | None = None
    fastest = [float("inf")] * len(weights)
    spent, done = 0.0, 0
    while done < repeats or spent < min_seconds:
        seconds, counts, quickest = _quant.bench_matmul(weights, x, n, out, 0, calls)
        fastest = [min(a, b) for a, b in zip(fastest, quickest, strict=True)]
        spent += sum(seconds)
        done += 1
        if best is None or sum(seconds) < sum(best[0]):
            best = (seconds, counts)
        if done >= 50:
            break
    assert best is not None
    return best[0], best[1], fastest


def summarize(
    label: str,
    matrices: list[Matrix],
    n: int,
    threads: int,
    seconds: list[float],
    calls: list[int],
    fastest: list[float],
    bandwidth: float,
    peak: float,
    amx_peak: float = 0.0,
) -> dict:
    """Rates of the fastest repetition, plus per shape the mean and the fastest single call. Roofline
    ratios are given for the repetition (``roofline_ratio``) and for one call of every shape at its
    fastest (``roofline_ratio_best_calls``, what the kernel does when nothing else runs)."""

    def roofline(m: Matrix) -> float:
        return max(m.data.size / bandwidth, m.macs * n / peak if peak else 0.0)

    total_s = sum(seconds)
    total_calls = sum(calls)
    total_bytes = sum(m.data.size * c for m, c in zip(matrices, calls, strict=True))
    total_macs = sum(m.macs * n * c for m, c in zip(matrices, calls, strict=True))
    roofline_s = sum(c * roofline(m) for m, c in zip(matrices, calls, strict=True))
    shapes: dict[str, dict] = {}
    for m, s, c, f in zip(matrices, seconds, calls, fastest, strict=True):
        e = shapes.setdefault(
            m.name,
            {
                "rows": m.rows,
                "cols": m.cols,
                "calls": 0,
                "seconds": 0.0,
                "best": f,
                "roofline": roofline(m),
                "macs": m.macs * n,
            },
        )
        e["calls"] += c
        e["seconds"] += s
        e["best"] = min(e["best"], f)
    best_s = sum(e["best"] for e in shapes.values())
    best_roofline_s = sum(e["roofline"] for e in shapes.values())
    best_macs = sum(e["macs"] for e in shapes.values())
    return {
        "format": label,
        "n": n,
        "threads": threads,
        "calls": total_calls,
        "us_per_call": round(1e6 * total_s / total_calls, 2),
        "weight_gb_s": round(total_bytes / total_s / 1e9, 2),
        "int8_gmac_s": round(total_macs / total_s / 1e9, 2),
        "int8_gop_s": round(2 * total_macs / total_s / 1e9, 2),
        "roofline_ratio": round(roofline_s / total_s, 3),
        "peak_ratio": round(total_macs / total_s / peak, 3) if peak else None,
        "roofline_ratio_best_calls": round(best_roofline_s / best_s, 3),
        "peak_ratio_best_calls": round(best_macs / best_s / peak, 3) if peak else None,
        # With AMX tiles in use, the batched kernels' own ceiling (peak_ratio stays against vpdpbusd).
        "amx_peak_ratio": round(total_macs / total_s / amx_peak, 3) if amx_peak else None,
        "shapes": {
            name: {
                "rows": e["rows"],
                "cols": e["cols"],
                "us_per_call": round(1e6 * e["seconds"] / e["calls"], 2) if e["calls"] else None,
                "best_us_per_call": round(1e6 * e["best"], 2),
            }
            for name, e in shapes.items()
        },
    }


def run_kernel_bench(
    formats: Sequence[str] | None = None,
    threads: Sequence[int] = (1, 2),
    batches: Sequence[int] = (1, 8, 64),
    *,
    working_set_bytes: int | None = None,
    min_seconds: float = 1.0,
    head: bool = True,
    seed: int = 0,
) -> dict:
    """Benchmark the int8 products of ``formats`` (default: every registered quantized format) and return
    a JSON-ready report with the machine's ceilings, per (format, n, threads) rates and roofline ratios.
    Formats without a registered kernel are listed under ``skipped``."""
    registered = [name for name, info in quant.FORMATS.items() if info.int8_path]
    wanted = list(formats) if formats else registered
    skipped = [f for f in wanted if f not in registered or f not in SCALE_OFFSETS]
    chosen = [f for f in wanted if f not in skipped]
    l3 = last_level_cache_bytes()
    if working_set_bytes is None:
        working_set_bytes = 4 * l3
        available = available_memory_bytes()
        if available is not None:
            working_set_bytes = min(working_set_bytes, available // 3)
    rng = np.random.default_rng(seed)

    # The shared pool: random bytes big enough for the largest format's cycle (rounded up to whole layers).
    largest = (
        max(
            [sum(byte_len(f, r, c) for _, r, c in LAYER_1_8B) for f in chosen]
            + ([byte_len(HEAD_FORMAT, HEAD_1_8B[1], HEAD_1_8B[2])] if head and HEAD_FORMAT in chosen else [0])
        )
        if chosen
        else 0
    )
    pool = rng.integers(0, 256, size=working_set_bytes + largest, dtype=np.uint8)

    # Ceilings are probed before the run and again before every measurement, keeping each one's best:
    # on a shared machine a single probe can land in a busy moment, and ratios against it would flatter.
    read_best = dict.fromkeys(threads, 0.0)
    peak_best = dict.fromkeys(threads, 0.0)
    amx_best = dict.fromkeys(threads, 0.0)

    def probe(t: int, repeats: int) -> None:
        read_best[t] = max(read_best[t], measure_bandwidth(pool[:working_set_bytes], t, repeats))
        peak_best[t] = max(peak_best[t], measure_int8_peak(t, repeats, iters=5_000_000))
        amx_best[t] = max(amx_best[t], measure_amx_peak(t, repeats, iters=250_000))

    previous_threads = kernels.get_num_threads()
    raw: list[tuple[str, list[Matrix], int, int, list[float], list[int], list[float]]] = []
    try:
        for t in threads:
            probe(t, 3)
        for dtype in chosen:
            runs = [(dtype, carve(pool, dtype, LAYER_1_8B, working_set_bytes, rng))]
            if head and dtype == HEAD_FORMAT:
                runs.append((f"{dtype} head", carve(pool, dtype, [HEAD_1_8B], working_set_bytes, rng)))
            for label, matrices in runs:
                for n in batches:
                    for t in threads:
                        probe(t, 1)
                        kernels.set_num_threads(t)
                        seconds, calls, fastest = run_products(matrices, n, min_seconds, rng)
                        raw.append((label, matrices, n, t, seconds, calls, fastest))
    finally:
        kernels.set_num_threads(previous_threads)
    results = [
        summarize(label, matrices, n, t, seconds, calls, fastest, read_best[t], peak_best[t], amx_best[t])
        for label, matrices, n, t, seconds, calls, fastest in raw
    ]
    ceilings = {
        t: {
            "read_gb_s": round(read_best[t] / 1e9, 2),
            "int8_peak_gmac_s": round(peak_best[t] / 1e9, 2),
            "amx_int8_peak_gmac_s": round(amx_best[t] / 1e9, 2) if amx_best[t] else None,
        }
        for t in threads
    }

    return {
        "machine": {
            "kernel": kernels.isa(),
            "amx": kernels.amx() and kernels.isa() == "avx512",
            "cpu": platform.processor() or platform.machine(),
            "usable_physical_cores": kernels.usable_physical_cores(),
            "features": {k: v for k, v in kernels.cpu_features().items() if v},
            "last_level_cache_bytes": l3,
            "working_set_bytes": working_set_bytes,
        },
        "ceilings": {str(t): c for t, c in ceilings.items()},
        "results": results,
        "skipped": skipped,
    }


def _int_list(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def main(argv: Sequence[str] | None = None) -> int:
    import json

    parser = ArgumentParser(
        prog="python -m hymt.kernelbench", description="Benchmark the quantized matrix kernels."
    )
    parser.add_argument(
        "--formats", help="comma-separated dtypes (default: every registered quantized format)"
    )
    parser.add_argument("--threads", type=_int_list, default=[1, 2], help="thread counts (default 1,2)")
    parser.add_argument(
        "--batches", type=_int_list, default=[1, 8, 64], help="tokens per call (default 1,8,64)"
    )
    parser.add_argument("--working-set-mib", type=int, help="bytes cycled through (default 4x the LLC)")
    parser.add_argument("--min-seconds", type=float, default=1.0, help="minimum time per measurement")
    parser.add_argument("--no-head", action="store_true", help="skip the 120818-row Q6_K head")
    args = parser.parse_args(argv)
    report = run_kernel_bench(
        formats=args.formats.split(",") if args.formats else None,
        threads=args.threads,
        batches=args.batches,
        working_set_bytes=args.working_set_mib << 20 if args.working_set_mib else None,
        min_seconds=args.min_seconds,
        head=not args.no_head,
    )
    report["command"] = " ".join(
        ["python -m hymt.kernelbench", *(argv if argv is not None else sys.argv[1:])]
    )
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    from hymt.cli import run

    run(main)
