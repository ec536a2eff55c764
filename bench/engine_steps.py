"""Where the server benchmark's time goes: its load replayed on ``hymt.engine.Engine`` without HTTP.

The same requests as ``bench/serve_load.py`` (each client's chat requests in turn, every request its own
sentence, greedy with the architecture's defaults, a fixed token budget, the prompt cache on, as many
active slots as the largest level), submitted straight to the engine, with every ``Model.forward`` of the
engine timed, in ``--rounds`` passes over the levels as serve_load runs them (each level's run with the
median aggregate is reported). Per level it reports, as JSON on stdout:

* ``aggregate_tokens_per_second`` = generated tokens ÷ wall time (serve_load's figure, less HTTP);
* ``prompt_forwards``: the steps that carried prompt tokens, each as its wall ms and tokens per sequence
  (a decoding sequence contributes 1), and their total ms;
* ``decode_steps``: the steps with one token per sequence, their count, median ms and sequences per step;
* ``outside_forward_ms``: wall time not spent in a forward (sampling, text, the engine's bookkeeping).

So the scaling from one to N streams splits into its prompt part and its decode part: with every prompt
free, N streams could not beat N × (one-stream decode step) ÷ (N-stream decode step).

    python bench/engine_steps.py --model synthetic:1.8b:stq1 --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "bench"))

from serve_load import (  # noqa: E402
    PROMPT,
    add_learned_vocab_argument,
    machine,
    prompt_for,
    run_clients,
    run_rounds,
)

from hymt.bench import bench_sampling, prompt_ids  # noqa: E402
from hymt.cli import resolve_model  # noqa: E402
from hymt.engine import Engine  # noqa: E402
from hymt.generation import GenerationRequest  # noqa: E402
from hymt.model import load  # noqa: E402

CONTEXT = 2048  # serve_load's --ctx-size


class TimedModel:
    """The model with every ``forward`` timed: (wall ms, tokens per sequence) in ``steps``."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.steps: list[tuple[float, list[int]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def forward(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = self.model.forward(batch, *args, **kwargs)
        self.steps.append(((time.perf_counter() - start) * 1e3, [len(tokens) for _, tokens in batch]))
        return result


def request(model: Any, prompt: str, max_tokens: int) -> GenerationRequest:
    ids = prompt_ids(model, prompt, raw=False)
    sampling = bench_sampling(model.config.architecture, 0.0, 42)
    return GenerationRequest(prompt_ids=ids, max_tokens=max_tokens, sampling=sampling, stop=[])


def run_level(
    engine: Engine, timed: TimedModel, streams: int, requests: int, max_tokens: int, first_sentence: int
) -> dict[str, Any]:
    """``streams`` clients, each running ``requests`` requests one after another (serve_load's order)."""
    generated = [0] * streams

    def client(index: int) -> None:
        for k in range(requests):
            with engine.submit(
                request(timed, prompt_for(first_sentence, index, k, streams), max_tokens)
            ) as ticket:
                generated[index] += ticket.result().usage.completion_tokens

    timed.steps.clear()
    wall_ms = run_clients(streams, client) * 1e3
    prompt = [(ms, sizes) for ms, sizes in timed.steps if max(sizes) > 1]
    decode = [(ms, sizes) for ms, sizes in timed.steps if max(sizes) == 1]
    return {
        "streams": streams,
        "errors": [],  # a failed request raises instead
        "generated_tokens": sum(generated),
        "wall_ms": round(wall_ms, 1),
        "aggregate_tokens_per_second": sum(generated) * 1e3 / wall_ms,
        "prompt_forwards": [{"ms": round(ms, 1), "tokens": sizes} for ms, sizes in prompt],
        "prompt_forward_ms": round(sum(ms for ms, _ in prompt), 1),
        "decode_steps": len(decode),
        "decode_step_median_ms": round(statistics.median(ms for ms, _ in decode), 2) if decode else None,
        "decode_step_sequences": sorted({len(sizes) for _, sizes in decode}),
        "decode_ms": round(sum(ms for ms, _ in decode), 1),
        "outside_forward_ms": round(wall_ms - sum(ms for ms, _ in timed.steps), 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="GGUF path or synthetic:<preset>:<format>")
    parser.add_argument("--gguf-profile", default="auto")
    add_learned_vocab_argument(parser)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--levels", default="1,2,4,8", help="concurrent streams per level (default: 1,2,4,8)")
    parser.add_argument("--requests", type=int, default=2, help="requests per client per level (default: 2)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="passes over the levels (default: 3)")
    args = parser.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    if args.rounds < 1 or min(levels) < 1:
        parser.error("rounds and levels must be positive")

    started_on = machine()
    path, profile = resolve_model(args.model, args.gguf_profile, args.learned_vocab)
    timed = TimedModel(load(str(path), profile, threads=args.threads))
    engine = Engine(timed, max_concurrent=max(levels), queue_capacity=max(levels), context=CONTEXT)
    try:
        with engine.submit(request(timed, PROMPT.format(sentence="Warm-up."), args.max_tokens)) as ticket:
            ticket.result()

        def level(streams: int, first_sentence: int) -> dict[str, Any]:
            return run_level(engine, timed, streams, args.requests, args.max_tokens, first_sentence)

        rounds = run_rounds("engine_steps", levels, args.rounds, args.requests, level)
    finally:
        engine.shutdown()
    rows = rounds["levels"]
    report: dict[str, Any] = {
        "machine": started_on,
        "model": str(path),
        "learned_vocab": None if args.learned_vocab is None else str(args.learned_vocab),
        "threads": args.threads,
        "max_tokens": args.max_tokens,
        "requests_per_client": args.requests,
        **rounds,
    }
    step_1 = rows[0]["decode_step_median_ms"] if levels[0] == 1 else None
    if step_1:
        # the scaling a level would reach if its prompts cost nothing: N one-stream steps per N-stream step
        report["decode_only_bound"] = {
            str(row["streams"]): row["streams"] * step_1 / row["decode_step_median_ms"]
            for row in rows
            if row["decode_step_median_ms"]
        }
    report["machine"]["load_average_end"] = list(os.getloadavg())
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
