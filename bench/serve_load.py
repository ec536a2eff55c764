"""Streaming load generator for the server benchmark (issue 6): aggregate tokens/s and time to first token.

Starts ``hymt-serve`` on a free loopback port (or uses ``--url``), then for each level of concurrent
streaming clients (default 1, 2, 4, 8) runs every client through a fixed number of chat completions and
reports, as JSON on stdout:

* ``aggregate_tokens_per_second`` = generated tokens of all clients ÷ wall time of the level;
* ``mean_ttft_ms`` = mean time from sending a request to its first content delta;
* ``per_stream_tokens_per_second`` = mean over requests of (tokens − 1) ÷ (last delta − first delta).

``--llama-cpp-server`` runs the same load against llama-cpp-python's server (``python -m llama_cpp.server``,
from ``pip install 'llama-cpp-python[server]'``) on the same file, same threads, greedy. That server has no
parallel slots: it serves one request at a time, which the report states next to its figures.

    python bench/serve_load.py --model synthetic:1.8b:q4_k --threads 2 --llama-cpp-server

``--learned-vocab GGUF`` builds a synthetic model's tokenizer on a real BPE vocabulary (the shared fixture
``hy-mt2-7b-vocab.gguf``), so the prompts have the real model's token counts: the synthetic vocabulary's random
merges make a one-sentence prompt ~62 tokens where the real Hy-MT2 tokenizer makes ~21 (docs/benchmarks.md).

    python bench/serve_load.py --model synthetic:1.8b:stq1 --learned-vocab ../shared/fixtures/hy-mt2-7b-vocab.gguf

The server runs with as many active slots as the largest level, so no request waits in the queue.
Requests take the sentences in turn (the same sequence for every server), so a text comes back only
after len(SENTENCES) = 32 others, more than either server's prompt cache holds (one prompt per slot);
greedy decoding and a fixed token budget.

``--rounds`` (default 3) runs the levels that many times, ascending and descending in turn, and reports
per level the run with the median aggregate (every round's figures beside it): on a shared host the
memory speed drifts by tens of percent over minutes, and a single pass compares levels measured at
different moments.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from hymt.cli import resolve_model  # noqa: E402

# One sentence per request of a default run (levels 1, 2, 4, 8 × 2 requests = 30), so no request repeats an
# earlier prompt: a server's prompt cache then saves only the shared instruction, at every level alike (with
# the 8 sentences used before, levels 2-8 re-sent texts that level 1 and 2 had served, and a cache that kept
# whole prompts served those from memory, inflating the higher levels' rates).
SENTENCES = [
    "The weather is nice today, so we are going to the park.",
    "Please send me the report before Friday afternoon.",
    "Machine translation has improved a lot in recent years.",
    "The train to Shanghai leaves at eight in the morning.",
    "She has been learning to play the piano since she was six.",
    "Our team will present the new product at the conference.",
    "Could you recommend a good restaurant near the hotel?",
    "The museum is closed on Mondays and public holidays.",
    "My grandmother grows tomatoes and beans in her small garden.",
    "The meeting has been moved to Thursday at three o'clock.",
    "He forgot his umbrella and got wet on the way home.",
    "This bridge was built more than two hundred years ago.",
    "We need to buy milk, bread and eggs for breakfast.",
    "The children painted pictures of animals in the classroom.",
    "Please turn off the lights when you leave the office.",
    "The new library opens next month in the city centre.",
    "I would like to book a table for four people tonight.",
    "The river flooded the fields after three days of heavy rain.",
    "Our flight was delayed because of a storm over the mountains.",
    "The doctor told him to drink more water and rest.",
    "They are planning a trip to the coast this summer.",
    "The software update fixes several problems with the printer.",
    "Her first novel was translated into twelve languages.",
    "The shop on the corner sells fresh fruit every morning.",
    "Students must hand in their essays by the end of the week.",
    "The old castle attracts thousands of tourists every year.",
    "We watched the sunset from the top of the hill.",
    "The company hired twenty new engineers last spring.",
    "Remember to bring your passport to the airport.",
    "The concert was cancelled because the singer was ill.",
    "A cup of green tea helps me relax in the evening.",
    "The farmers hope for good weather during the harvest.",
]
PROMPT = "Translate the following text into Chinese:\n{sentence}"  # one user message per request
STARTUP_TIMEOUT_S = 900.0
REQUEST_TIMEOUT_S = 600.0


@dataclass
class RequestResult:
    ttft_ms: float | None = None
    tokens: int = 0  # generated tokens (server usage when reported, else content chunks)
    prompt_tokens: int | None = None  # the prompt's tokens, as the server's usage reports them
    stream_ms: float = 0.0  # first content delta → last delta
    error: str | None = None


@dataclass
class Target:
    """One server under load: where it listens and how its requests are shaped."""

    name: str
    url: str
    model_id: str
    extra: dict[str, Any] = field(default_factory=dict)  # server-specific request fields
    process: subprocess.Popen[bytes] | None = None
    ready_path: str = "/healthz"  # answers 200 once the model is loaded


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, path: str, process: subprocess.Popen[bytes] | None, log: Path | None = None) -> None:
    """Wait until ``url`` answers 200 on ``path``; a server that exits first is reported with the end of its
    output (``log``), e.g. a missing dependency of hymt-serve in the Python that runs this script."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    parts = urlsplit(url)
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            message = f"server exited with code {process.returncode} before it was ready"
            if log is not None:
                try:
                    tail = log.read_text(errors="replace").splitlines()[-8:]
                except OSError:
                    tail = []
                message += f"; the end of its output ({log}):\n" + "\n".join(tail)
            raise RuntimeError(message)
        try:
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server at {url} not ready after {STARTUP_TIMEOUT_S:.0f} s")


def stop(process: subprocess.Popen[bytes] | None) -> None:
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def start_hymt(path: Path, profile: str, threads: int, slots: int, log: Path, prompt_cache: bool) -> Target:
    port = free_port()
    command = [
        sys.executable,
        "-c",
        "from hymt.cli import run; from hymt.serve import main; run(main)",
        "--model",
        str(path),
        "--gguf-profile",
        profile,
        "--listen",
        f"127.0.0.1:{port}",
        "--threads",
        str(threads),
        "--max-concurrent-requests",
        str(slots),
        "--queue-capacity",
        str(slots),
        "--ctx-size",
        "2048",
        "--log-level",
        "warning",
        *([] if prompt_cache else ["--no-prompt-cache"]),
    ]
    with log.open("ab") as sink:
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=sink, stderr=sink)
    target = Target("hymt", f"http://127.0.0.1:{port}", "hy-mt2", {"stream_options": {"include_usage": True}})
    target.process = process
    wait_ready(target.url, "/healthz", process, log)
    return target


# llama.cpp's AMX weight buffers crash on some AMX machines (llama.cpp issue #20824); this runs its server
# with plain CPU buffers, as `llama-server --no-repack` does.
PLAIN_BUFFERS_SERVER = """
import runpy
import llama_cpp.llama_cpp as C
default_params = C.llama_model_default_params
def plain_buffers():
    params = default_params()
    params.use_extra_bufts = False
    return params
C.llama_model_default_params = plain_buffers
runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
"""


def start_llama_cpp(path: Path, threads: int, log: Path, extra_buffer_types: bool) -> Target:
    port = free_port()
    launcher = ["-m", "llama_cpp.server"] if extra_buffer_types else ["-c", PLAIN_BUFFERS_SERVER]
    command = [
        sys.executable,
        *launcher,
        "--model",
        str(path),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_threads",
        str(threads),
        "--n_threads_batch",
        str(threads),
        "--n_ctx",
        "2048",
        "--n_batch",
        "512",
        "--n_ubatch",
        "512",
        # By default a new request interrupts the one being generated; queue them instead.
        "--interrupt_requests",
        "False",
    ]
    with log.open("ab") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=sink)
    # llama-cpp-python's chat API defaults to repeat_penalty 1.1; hymt's dense default is 1.05.
    target = Target("llama.cpp (llama-cpp-python server)", f"http://127.0.0.1:{port}", "model", {})
    target.extra = {"repeat_penalty": 1.05}
    target.process = process
    target.ready_path = "/v1/models"
    return target


def start_llama_server(
    binary: Path, path: Path, threads: int, slots: int, log: Path, extra_buffer_types: bool
) -> Target:
    port = free_port()
    command = [
        str(binary),
        "--model",
        str(path),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--threads",
        str(threads),
        "--threads-batch",
        str(threads),
        "--parallel",
        str(slots),
        "--ctx-size",
        str(2048 * slots),
        "--batch-size",
        "512",
        "--ubatch-size",
        "512",
    ]
    if not extra_buffer_types:
        command.append("--no-repack")
    with log.open("ab") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=sink)
    extra = {"stream_options": {"include_usage": True}, "repeat_penalty": 1.05}
    target = Target(f"llama.cpp llama-server --parallel {slots}", f"http://127.0.0.1:{port}", "model", extra)
    target.process = process
    target.ready_path = "/health"
    return target


def stream_chat(target: Target, prompt: str, max_tokens: int) -> RequestResult:
    """One streaming chat completion; times measured on this side of the socket."""
    parts = urlsplit(target.url)
    body = {
        "model": target.model_id,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        **target.extra,
    }
    result = RequestResult()
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=REQUEST_TIMEOUT_S)
    started = time.perf_counter()
    first = last = None
    chunks = 0
    usage_tokens = None
    done = False
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            result.error = f"HTTP {response.status}: {response.read()[:200]!r}"
            return result
        for raw in response:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                usage_tokens = chunk["usage"]["completion_tokens"]
                result.prompt_tokens = chunk["usage"].get("prompt_tokens")
            for choice in chunk.get("choices", []):
                if choice.get("delta", {}).get("content"):
                    now = time.perf_counter()
                    first = now if first is None else first
                    last = now
                    chunks += 1
    except (OSError, ValueError, http.client.HTTPException) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    finally:
        conn.close()
    if not done:
        result.error = "stream ended without [DONE]"
        return result
    if first is not None:
        result.ttft_ms = (first - started) * 1000.0
        result.stream_ms = (last - first) * 1000.0
    result.tokens = usage_tokens if usage_tokens is not None else chunks
    return result


def process_tree_cpu_seconds(pid: int) -> float | None:
    """User + system CPU of a process and its descendants (the gunicorn master and its worker), or None
    when /proc cannot tell (not Linux, already gone)."""
    tick = os.sysconf("SC_CLK_TCK")
    total, pending = 0.0, [pid]
    try:
        while pending:
            current = pending.pop()
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
            pending.extend(int(child) for child in children)
    except (OSError, ValueError, IndexError):
        return None
    return total


def run_level(
    target: Target, streams: int, requests: int, max_tokens: int, first_sentence: int
) -> dict[str, Any]:
    """One level of ``streams`` concurrent clients, its requests taking SENTENCES from ``first_sentence`` on.
    Besides the rates it reports the CPU each side spent per generated token: on a small machine the load
    generator competes with the server for cores, and the server's figure (compute threads included) shows
    how busy the level kept it."""
    results: list[RequestResult] = []
    lock = threading.Lock()
    pid = target.process.pid if target.process is not None else None
    load_average = os.getloadavg()[0]
    server_cpu = process_tree_cpu_seconds(pid) if pid is not None else None
    client_cpu = time.process_time()

    def client(index: int) -> None:
        for k in range(requests):
            outcome = stream_chat(target, prompt_for(first_sentence, index, k, streams), max_tokens)
            with lock:
                results.append(outcome)

    wall_s = run_clients(streams, client)
    client_cpu = time.process_time() - client_cpu
    server_end = process_tree_cpu_seconds(pid) if pid is not None else None
    good = [r for r in results if r.error is None]
    tokens = sum(r.tokens for r in good)
    server_ms = None
    if server_cpu is not None and server_end is not None and tokens:
        server_ms = (server_end - server_cpu) * 1000.0 / tokens
    ttfts = [r.ttft_ms for r in good if r.ttft_ms is not None]
    per_stream = [(r.tokens - 1) * 1000.0 / r.stream_ms for r in good if r.tokens > 1 and r.stream_ms > 0]
    prompt_tokens = [r.prompt_tokens for r in good if r.prompt_tokens is not None]
    return {
        "streams": streams,
        "requests": len(results),
        "errors": [r.error for r in results if r.error is not None],
        "generated_tokens": tokens,
        "wall_s": wall_s,
        "aggregate_tokens_per_second": tokens / wall_s,
        "mean_ttft_ms": statistics.fmean(ttfts) if ttfts else None,
        "per_stream_tokens_per_second": statistics.fmean(per_stream) if per_stream else None,
        "mean_prompt_tokens": statistics.fmean(prompt_tokens) if prompt_tokens else None,
        "server_cpu_ms_per_token": server_ms,
        "client_cpu_ms_per_token": client_cpu * 1000.0 / tokens if tokens else None,
        "load_average_at_start": load_average,
    }


def prompt_for(first_sentence: int, client: int, k: int, streams: int) -> str:
    """The prompt of client ``client``'s k-th request of a level whose requests take SENTENCES in turn from
    ``first_sentence`` on (request k of every client before request k + 1 of any)."""
    return PROMPT.format(sentence=SENTENCES[(first_sentence + client + k * streams) % len(SENTENCES)])


def run_clients(streams: int, client: Callable[[int], None]) -> float:
    """client(0), ..., client(streams − 1) on their own threads; the wall seconds until all are done."""
    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def median_level(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One level over its rounds: the run with the median aggregate (the lower one of an even count), every
    round's aggregate and the errors of all rounds."""
    ranked = sorted(runs, key=lambda run: run["aggregate_tokens_per_second"])
    row = dict(ranked[(len(ranked) - 1) // 2])
    row["aggregate_tokens_per_second_rounds"] = [run["aggregate_tokens_per_second"] for run in runs]
    row["errors"] = [error for run in runs for error in run["errors"]]
    row["rounds"] = len(runs)
    return row


def run_rounds(
    name: str, levels: Sequence[int], rounds: int, requests: int, run: Callable[[int, int], dict[str, Any]]
) -> dict[str, Any]:
    """``rounds`` passes over the levels, ascending and descending in turn; run(streams, first_sentence) runs
    one level. Returns the median run per level (``levels``) and the scaling from one stream: between those
    median runs, within each round, and the median of the rounds' figures."""
    runs: list[dict[int, dict[str, Any]]] = []  # [round] streams -> that level's run
    first_sentence = 0  # the sentences in turn across levels and rounds
    for index in range(rounds):
        runs.append({})
        for streams in levels if index % 2 == 0 else list(reversed(levels)):
            print(f"{name}: round {index + 1}, {streams} stream(s)", file=sys.stderr, flush=True)
            runs[-1][streams] = run(streams, first_sentence)
            first_sentence += streams * requests
    rows = [median_level([one[streams] for one in runs]) for streams in levels]
    report: dict[str, Any] = {"rounds": rounds, "levels": rows}
    if levels and levels[0] == 1:
        base = rows[0]["aggregate_tokens_per_second"]
        report["scaling_vs_one_stream"] = {
            str(row["streams"]): row["aggregate_tokens_per_second"] / base for row in rows
        }
        # the same ratio within each round (levels measured minutes apart at most)
        report["scaling_per_round"] = [
            {
                str(n): one[n]["aggregate_tokens_per_second"] / one[1]["aggregate_tokens_per_second"]
                for n in levels
            }
            for one in runs
        ]
        # the median of those: on a host whose speed drifts between rounds, the ratio of the median runs above
        # may divide levels measured in different rounds (one stream in a slow round against four in a fast one)
        report["scaling_median_of_rounds"] = {
            str(n): statistics.median(ratios[str(n)] for ratios in report["scaling_per_round"])
            for n in levels
        }
    return report


def run_target(
    target: Target, levels: Sequence[int], requests: int, max_tokens: int, rounds: int = 1
) -> dict[str, Any]:
    warm = stream_chat(target, PROMPT.format(sentence="Warm-up."), max_tokens)
    if warm.error is not None:
        raise RuntimeError(f"{target.name}: warm-up request failed: {warm.error}")

    def level(streams: int, first_sentence: int) -> dict[str, Any]:
        return run_level(target, streams, requests, max_tokens, first_sentence)

    report = run_rounds(f"serve_load: {target.name}", levels, rounds, requests, level)
    return {"server": target.name, "url": target.url, **report}


def machine() -> dict[str, Any]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": model, "cpus": os.cpu_count(), "load_average": list(os.getloadavg())}


def add_learned_vocab_argument(parser: argparse.ArgumentParser) -> None:
    """--learned-vocab, shared with engine_steps.py."""
    parser.add_argument(
        "--learned-vocab",
        type=Path,
        metavar="GGUF",
        help="build the synthetic model's tokenizer on this real vocabulary (e.g. the shared fixture "
        "hy-mt2-7b-vocab.gguf), so prompts have the real model's token counts",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="GGUF path or synthetic:<preset>:<format> (ignored with --url)")
    parser.add_argument("--gguf-profile", default="auto")
    add_learned_vocab_argument(parser)
    parser.add_argument("--url", help="benchmark a running hymt-serve instead of starting one")
    parser.add_argument("--model-id", default="hy-mt2", help="model id for --url (default: hy-mt2)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--levels", default="1,2,4,8", help="concurrent streams per level (default: 1,2,4,8)")
    parser.add_argument("--requests", type=int, default=2, help="requests per client per level (default: 2)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="passes over the levels (default: 3)")
    parser.add_argument("--llama-cpp-server", action="store_true", help="also load llama-cpp-python's server")
    parser.add_argument(
        "--llama-server", type=Path, metavar="BINARY", help="also load llama.cpp's llama-server binary"
    )
    parser.add_argument("--log", type=Path, default=Path("/tmp/serve_load.log"), help="server output")
    parser.add_argument(
        "--no-prompt-cache", dest="prompt_cache", action="store_false", help="start hymt-serve without it"
    )
    args = parser.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    if args.rounds < 1 or min(levels) < 1:
        parser.error("rounds and levels must be positive")

    report: dict[str, Any] = {
        "machine": machine(),
        "threads": args.threads,
        "max_tokens": args.max_tokens,
        "requests_per_client": args.requests,
        "rounds": args.rounds,
    }
    path: Path | None = None
    profile = args.gguf_profile
    if args.url:
        target = Target(
            "hymt", args.url.rstrip("/"), args.model_id, {"stream_options": {"include_usage": True}}
        )
        report["hymt"] = run_target(target, levels, args.requests, args.max_tokens, args.rounds)
    else:
        if not args.model:
            parser.error("--model or --url is required")
        path, profile = resolve_model(args.model, args.gguf_profile, args.learned_vocab)
        report["model"] = str(path)
        report["learned_vocab"] = None if args.learned_vocab is None else str(args.learned_vocab)
        target = start_hymt(path, profile, args.threads, max(levels), args.log, args.prompt_cache)
        report["prompt_cache"] = args.prompt_cache
        try:
            report["hymt"] = run_target(target, levels, args.requests, args.max_tokens, args.rounds)
        finally:
            stop(target.process)
    if args.llama_cpp_server:
        report["llama_cpp_server"] = run_llama_cpp(path, profile, args, levels, None)
    if args.llama_server is not None:
        report["llama_server"] = run_llama_cpp(path, profile, args, levels, args.llama_server)
    report["machine"]["load_average_end"] = list(os.getloadavg())
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _llama_cpp_unreadable(path: Path, profile: str) -> str | None:
    from hymt.gguf import GGUFFile

    with GGUFFile(path, profile=profile) as gguf:
        tencent = sorted({info.dtype for info in gguf.tensors.values() if info.dtype in ("Q2_0C", "STQ1_0")})
    return f"llama.cpp has no decoder for {', '.join(tencent)} tensors" if tencent else None


def run_llama_cpp(
    path: Path | None, profile: str, args: argparse.Namespace, levels: Sequence[int], binary: Path | None
) -> dict[str, Any]:
    """llama-cpp-python's server, or the ``llama-server`` at ``binary``, under the same load."""
    if path is None:
        return {"skipped": "--url given: no model file to load into llama.cpp"}
    if binary is None:
        try:
            import llama_cpp.server  # noqa: F401
        except ImportError as exc:
            return {
                "skipped": f"llama-cpp-python's server is not installed ({exc}); "
                "pip install 'llama-cpp-python[server]'"
            }
    reason = _llama_cpp_unreadable(path, profile)
    if reason is not None:
        return {"skipped": reason}
    slots = max(levels)
    if binary is None:
        notes = [
            "llama-cpp-python's server has no parallel slots: requests queue and run one at a time "
            "(--interrupt_requests False); token counts are content chunks, as it reports no usage while "
            "streaming"
        ]

        def start(extra: bool) -> Target:
            return start_llama_cpp(path, args.threads, args.log, extra)
    else:
        notes = [f"llama-server with --parallel {slots} (continuous batching), --ctx-size 2048 per slot"]

        def start(extra: bool) -> Target:
            return start_llama_server(binary, path, args.threads, slots, args.log, extra)

    target = start(True)
    try:
        wait_ready(target.url, target.ready_path, target.process, args.log)
        result = run_target(target, levels, args.requests, args.max_tokens, args.rounds)
    except RuntimeError:
        if target.process is not None:
            try:
                target.process.wait(timeout=10)  # a crashed server is already exiting
            except subprocess.TimeoutExpired:
                pass
        stop(target.process)
        if target.process is None or target.process.returncode != -signal.SIGSEGV:
            raise
        notes.append(
            "the default build (AMX/repacked extra buffer types) crashed with SIGSEGV on its first product; "
            "measured with use_extra_bufts=false (llama-server --no-repack)"
        )
        print(f"serve_load: {notes[-1]}", file=sys.stderr, flush=True)
        target = start(False)
        wait_ready(target.url, target.ready_path, target.process, args.log)
        result = run_target(target, levels, args.requests, args.max_tokens, args.rounds)
    finally:
        stop(target.process)
    result["notes"] = notes
    return result


if __name__ == "__main__":
    sys.exit(main())
