"""`hymt-bench`: measure local inference without HTTP (REFERENCE.md §10.3).

One model load, then ``--concurrency`` identical generations submitted together to ``hymt.engine.Engine``
— the continuous-batching engine the server uses — so the figures predict what the server delivers. The
report is pretty JSON on stdout; progress goes to stderr only.

``--compare-llama-cpp`` runs llama.cpp (llama-cpp-python) on the same file with the same prompt token ids,
thread count, sampler and token budget, in a child process started after hymt's run: a format llama.cpp
cannot read may abort the process that loads it, and each engine's peak RSS stays its own. Its rates are
measured with ``perf_counter`` around ``Llama.eval`` (prompt, then one call per generated token), the same
boundaries as hymt's timings; llama.cpp's own ``llama_perf_context`` figures are reported next to them.

``hymt-bench kernels ...`` runs the kernel micro-benchmark (``hymt.kernelbench``).
"""

from __future__ import annotations

import importlib.util
import json
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from hymt.cli import ArgumentParser, add_model_arguments, resolve_model
from hymt.errors import HymtError

DEFAULT_PROMPT = "Translate the following text into Chinese:\nHello, world."
# GGUF type ids of the Tencent formats llama.cpp has no CPU decoder for (REFERENCE.md §1.7).
DEFAULT_CONTEXT = 8192
LLAMA_CPP_UNREADABLE = {"Q2_0C": 40, "STQ1_0": 42}
# llama.cpp's logical and physical batch for the prompt (a 64-token prompt is one ubatch).
LLAMA_CPP_BATCH = 512
LLAMA_CPP_TIMEOUT_S = 1800


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="hymt-bench",
        description="Measure local inference, without HTTP.",
        epilog="`hymt-bench kernels --help`: the kernel micro-benchmark.",
    )
    add_model_arguments(parser)
    parser.add_argument(
        "--prompt", default=DEFAULT_PROMPT, help="prompt text (default: a translation request)"
    )
    parser.add_argument("--prompt-file", type=Path, metavar="PATH", help="read the prompt from a file")
    parser.add_argument(
        "--raw-prompt", action="store_true", help="encode the prompt directly: no chat template, no BOS"
    )
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens to generate (default: 32)")
    parser.add_argument(
        "--ctx-size",
        type=int,
        help=f"context per generation (default: {DEFAULT_CONTEXT}, or the model's context if smaller)",
    )
    parser.add_argument("--temperature", type=float, default=0.0, help="default: 0 (greedy)")
    parser.add_argument("--seed", type=int, default=42, help="default: 42")
    parser.add_argument("--threads", type=int, help="compute threads (default: usable physical cores)")
    parser.add_argument(
        "--concurrency", type=int, default=1, help="identical generations run together (default: 1)"
    )
    parser.add_argument(
        "--compare-llama-cpp",
        action="store_true",
        help="also run llama.cpp (llama-cpp-python) on the same file and prompt ids and report the ratios",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["kernels"]:
        from hymt import kernelbench

        return kernelbench.main(args_list[1:])
    parser = build_parser()
    args = parser.parse_args(args_list)
    if args.concurrency < 1 or (args.threads is not None and args.threads < 1):
        parser.error("concurrency and threads must be positive")
    if not 0 <= args.seed < 2**64:
        parser.error("seed must be an integer between 0 and 2^64-1")

    from hymt import kernels

    if args.threads is not None and args.threads > kernels.MAX_THREADS:
        parser.error(f"threads must be at most {kernels.MAX_THREADS}")

    threads = args.threads if args.threads is not None else kernels.usable_physical_cores()
    prompt = _read_prompt(args.prompt_file) if args.prompt_file is not None else args.prompt
    print(f"hymt-bench: preparing model {args.model or '(default)'}", file=sys.stderr, flush=True)
    path, profile = resolve_model(args.model, args.gguf_profile)

    import hymt

    started = time.perf_counter()
    model = hymt.load(path, profile, threads=threads)
    load_ms = (time.perf_counter() - started) * 1000.0
    try:
        report = _run_hymt(model, args, prompt, threads, load_ms)
        end_ids = model.tokenizer.end_ids
    finally:
        model.close()
    if args.compare_llama_cpp:
        report["llama_cpp"] = _compare_llama_cpp(path, report, args, threads, end_ids)
        if "skipped" not in report["llama_cpp"] and "error" not in report["llama_cpp"]:
            ours = report["runs"][0]
            theirs = report["llama_cpp"]
            report["ratios"] = {
                "prefill": _ratio(ours["prefill_tokens_per_second"], theirs["prefill_tokens_per_second"]),
                "decode": _ratio(ours["decode_tokens_per_second"], theirs["decode_tokens_per_second"]),
            }
    json.dump(report, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
    return 0


def _read_prompt(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise HymtError(f"prompt file {path} is not valid UTF-8") from None


def prompt_ids(model: Any, prompt: str, raw: bool) -> list[int]:
    """The prompt as token ids: one user message through the model's template, or the text as is."""
    if raw:
        return list(model.tokenizer.encode(prompt))
    from hymt.chat import render_chat

    return list(model.tokenizer.encode(render_chat(model.tokenizer, [{"role": "user", "content": prompt}])))


def bench_sampling(architecture: str, temperature: float, seed: int) -> Any:
    """Architecture defaults with temperature and seed overridden (§10.3)."""
    from hymt.sampling import default_sampling

    return replace(default_sampling(architecture), temperature=temperature, seed=seed)


def rates(
    prompt_tokens: int, completion_tokens: int, prefill_ms: float, decode_ms: float
) -> dict[str, float]:
    """§10.3: prefill counts every prompt token; decode counts the tokens after the first."""
    return {
        "prefill_tokens_per_second": prompt_tokens * 1000.0 / max(prefill_ms, 0.001),
        "decode_tokens_per_second": max(completion_tokens - 1, 0) * 1000.0 / max(decode_ms, 0.001),
    }


def peak_rss_bytes() -> int | None:
    """Peak resident set of this process: VmHWM on Linux, else ru_maxrss (KiB on Linux, bytes on macOS).

    Linux keeps ru_maxrss across fork and exec, so a process started by a large one (model_table after its
    2 GiB bandwidth pool, the llama.cpp child of a loaded hymt-bench) reported its parent's peak: Q4_K
    1878-1910 instead of 1196 MiB. VmHWM belongs to the process's own address space.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def _run_hymt(model: Any, args: Any, prompt: str, threads: int, load_ms: float) -> dict[str, Any]:
    from tqdm import tqdm

    from hymt import kernels
    from hymt.engine import Engine
    from hymt.generation import GenerationRequest

    ids = prompt_ids(model, prompt, args.raw_prompt)
    n = model.config.context_length
    context = min(DEFAULT_CONTEXT, n) if args.ctx_size is None else args.ctx_size
    if not 1 <= context <= n:
        raise HymtError(f"context must be between 1 and {n}")
    request = GenerationRequest(
        prompt_ids=ids,
        max_tokens=args.max_tokens,
        sampling=bench_sampling(model.config.architecture, args.temperature, args.seed),
        stop=[],
    )
    request.validate(context)

    engine = Engine(model, max_concurrent=args.concurrency, queue_capacity=0, context=context)
    bar = tqdm(
        total=args.concurrency * args.max_tokens, desc="generating", unit="tok", file=sys.stderr, leave=False
    )
    lock = threading.Lock()
    errors: list[BaseException] = []

    def drain(ticket: Any) -> None:
        try:
            for _ in ticket:  # one delta per token that released text
                with lock:
                    bar.update(1)
        except BaseException as exc:  # re-raised on the main thread
            errors.append(exc)

    try:
        started = time.perf_counter()
        tickets = [engine.submit(request) for _ in range(args.concurrency)]
        drainers = [threading.Thread(target=drain, args=(t,), daemon=True) for t in tickets]
        for thread in drainers:
            thread.start()
        for thread in drainers:
            thread.join()
        wall_ms = (time.perf_counter() - started) * 1000.0
        for ticket in tickets:
            ticket.close()
    finally:
        bar.close()
        engine.shutdown()
    if errors:
        raise errors[0]

    runs = []
    for ticket in tickets:
        completion = ticket.completion.as_dict()
        usage, timing = completion["usage"], completion["timing"]
        runs.append(
            {
                "completion": completion,
                **rates(
                    usage["prompt_tokens"],
                    usage["completion_tokens"],
                    timing["prefill_ms"],
                    timing["decode_ms"],
                ),
            }
        )
    return {
        "concurrency": args.concurrency,
        "config": model.config.as_dict(),
        "kernel": kernels.isa(),
        "load_ms": load_ms,
        "peak_rss_bytes": peak_rss_bytes(),
        "huge_page_bytes": model.gguf.huge_page_bytes(),  # of the file mapping: 4 KiB pages decode slower
        "profile": model.profile,
        "prompt_token_ids": ids,
        "runs": runs,
        "threads": threads,
        "wall_ms": wall_ms,
        # Beyond §10.3: what the figures mean for this file.
        "ctx_size": context,
        "kv_bytes_per_token": model.kv_bytes_per_token,
        "file_bytes": model.file_bytes,
        "model_path": str(model.gguf.path),
    }


def _ratio(ours: float, theirs: float) -> float | None:
    return ours / theirs if theirs > 0 else None


# ----------------------------------------------------------------------------------------------------
# llama.cpp comparison


def _unreadable_by_llama_cpp(path: Path, profile: str) -> str | None:
    """Why llama.cpp cannot read this file, or None."""
    from hymt.gguf import GGUFFile

    with GGUFFile(path, profile=profile) as gguf:
        found = {
            info.dtype: info.type_id for info in gguf.tensors.values() if info.dtype in LLAMA_CPP_UNREADABLE
        }
    if not found:
        return None
    kinds = ", ".join(f"{dtype} (GGUF type {type_id})" for dtype, type_id in sorted(found.items()))
    return f"llama.cpp has no decoder for {kinds} tensors in this file"


def _compare_llama_cpp(
    path: Path, report: dict[str, Any], args: Any, threads: int, end_ids: frozenset[int]
) -> dict[str, Any]:
    if importlib.util.find_spec("llama_cpp") is None:
        return {"skipped": "llama-cpp-python is not installed (pip install llama-cpp-python)"}
    reason = _unreadable_by_llama_cpp(path, report["profile"])
    if reason is not None:
        return {"skipped": reason}
    completion = report["runs"][0]["completion"]
    sampling = bench_sampling(report["config"]["architecture"], args.temperature, args.seed)
    params = {
        "path": str(path),
        "prompt_ids": report["prompt_token_ids"],
        "max_tokens": args.max_tokens,
        "threads": threads,
        # The KV cache llama.cpp allocates up front; hymt's grows in 256-position steps.
        "n_ctx": -(-(len(report["prompt_token_ids"]) + args.max_tokens) // 256) * 256,
        "sampling": {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "repetition_penalty": sampling.repetition_penalty,
            "seed": sampling.seed,
        },
        "vocab_size": report["config"]["vocab_size"],
        "end_ids": sorted(end_ids),
    }
    print("hymt-bench: running llama.cpp on the same file", file=sys.stderr, flush=True)
    child = _run_llama_cpp_child({**params, "extra_buffer_types": True})
    note = None
    if child.returncode == -signal.SIGSEGV:
        # llama.cpp's AMX weight buffers crash in ggml_backend_amx_mul_mat on some AMX machines (llama.cpp
        # issue #20824); its users there run with plain CPU buffers (llama-server --no-repack), as here.
        note = (
            "default llama.cpp (AMX/repacked extra buffer types) crashed with SIGSEGV; measured with "
            "use_extra_bufts=false (llama-server --no-repack)"
        )
        print(f"hymt-bench: {note}", file=sys.stderr, flush=True)
        child = _run_llama_cpp_child({**params, "extra_buffer_types": False})
    if child.returncode != 0:
        tail = [line for line in child.stderr.strip().splitlines() if line.strip()][-3:]
        return {"error": f"llama.cpp run failed (exit {child.returncode}): {' | '.join(tail)}"}
    result = json.loads(child.stdout)
    if note is not None:
        result["note"] = note
    theirs = result["token_ids"]
    ours = completion["token_ids"]
    same = 0
    while same < min(len(ours), len(theirs)) and ours[same] == theirs[same]:
        same += 1
    result["same_leading_token_ids"] = same
    return result


def _run_llama_cpp_child(params: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from hymt.bench import llama_cpp_child; llama_cpp_child()"],
        input=json.dumps(params),
        capture_output=True,
        text=True,
        timeout=LLAMA_CPP_TIMEOUT_S,
        check=False,
    )


def llama_cpp_child() -> None:
    """Child-process entry: JSON parameters on stdin, llama.cpp figures as JSON on stdout.

    The generation loop mirrors §8.3 on llama.cpp's logits with hymt's own sampler, so both engines
    decode with the same rule (greedy with the architecture's repetition penalty by default).
    """
    import numpy as np
    from llama_cpp import Llama, llama_cpp

    from hymt.hugepages import mapped_huge_bytes
    from hymt.sampling import Sampler, SamplingParams

    params = json.loads(sys.stdin.read())
    if not params["extra_buffer_types"]:
        default_params = llama_cpp.llama_model_default_params

        def plain_buffers() -> Any:
            model_params = default_params()
            model_params.use_extra_bufts = False
            return model_params

        llama_cpp.llama_model_default_params = plain_buffers  # read by Llama.__init__
    ids: list[int] = params["prompt_ids"]
    threads: int = params["threads"]
    end_ids = set(params["end_ids"])

    started = time.perf_counter()
    llm = Llama(
        model_path=params["path"],
        n_ctx=params["n_ctx"],
        n_batch=LLAMA_CPP_BATCH,
        n_ubatch=LLAMA_CPP_BATCH,
        n_threads=threads,
        n_threads_batch=threads,
        use_mmap=True,
        verbose=False,
    )
    load_ms = (time.perf_counter() - started) * 1000.0
    n_vocab = llm.n_vocab()
    if n_vocab != params["vocab_size"]:
        raise SystemExit(f"llama.cpp reports {n_vocab} vocabulary entries, hymt {params['vocab_size']}")
    ctx = llm.ctx
    sampler = Sampler(SamplingParams(**params["sampling"]), n_vocab, ids)

    def last_logits() -> np.ndarray:
        # [n_vocab] float32 view of llama.cpp's buffer, copied before the next eval overwrites it.
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy()

    llm.reset()
    llama_cpp.llama_perf_context_reset(ctx)
    start = time.perf_counter()
    llm.eval(ids)
    prefill_ms = (time.perf_counter() - start) * 1000.0
    token_ids: list[int] = []
    eval_ms: list[float] = []  # one per forwarded generated token
    first_token_ms = 0.0
    finish_reason = "length"
    for step in range(params["max_tokens"]):
        token = sampler.sample(last_logits())
        if step == 0:
            first_token_ms = (time.perf_counter() - start) * 1000.0
        token_ids.append(token)
        if token in end_ids:
            finish_reason = "stop"
            break
        if step + 1 < params["max_tokens"]:
            t0 = time.perf_counter()
            llm.eval([token])
            eval_ms.append((time.perf_counter() - t0) * 1000.0)
    total_ms = (time.perf_counter() - start) * 1000.0
    decode_ms = total_ms - first_token_ms
    perf = llama_cpp.llama_perf_context(ctx)
    result: dict[str, Any] = {
        "engine": f"llama.cpp via llama-cpp-python {_llama_cpp_version()}",
        "extra_buffer_types": params["extra_buffer_types"],
        "finish_reason": finish_reason,
        "load_ms": load_ms,
        "n_batch": LLAMA_CPP_BATCH,
        "n_ctx": params["n_ctx"],
        "peak_rss_bytes": peak_rss_bytes(),
        "huge_page_bytes": mapped_huge_bytes(params["path"]),  # of its file mapping, as for hymt
        "threads": threads,
        "timing": {
            "decode_ms": decode_ms,
            "first_token_ms": first_token_ms,
            "prefill_ms": prefill_ms,
            "total_ms": total_ms,
            "eval_ms_per_token": sum(eval_ms) / len(eval_ms) if eval_ms else None,
        },
        "token_ids": token_ids,
        **rates(len(ids), len(token_ids), prefill_ms, decode_ms),
        "perf_context": {
            "n_p_eval": perf.n_p_eval,
            "n_eval": perf.n_eval,
            "t_load_ms": perf.t_load_ms,
            "t_p_eval_ms": perf.t_p_eval_ms,
            "t_eval_ms": perf.t_eval_ms,
            "prefill_tokens_per_second": perf.n_p_eval * 1000.0 / perf.t_p_eval_ms
            if perf.t_p_eval_ms
            else None,
            "decode_tokens_per_second": perf.n_eval * 1000.0 / perf.t_eval_ms if perf.t_eval_ms else None,
        },
    }
    llm.close()
    json.dump(result, sys.stdout)


def _llama_cpp_version() -> str:
    import llama_cpp

    return str(getattr(llama_cpp, "__version__", "unknown"))


if __name__ == "__main__":
    from hymt.cli import run

    run(main)
