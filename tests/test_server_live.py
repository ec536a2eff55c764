"""`hymt-serve` as users run it: a real gunicorn process on loopback, driven over sockets (REFERENCE §12.9).

Each server is started by the test on a free port (`--listen 127.0.0.1:0`; the port is read from the
`listening` log line) and stopped by it. A "stalled" client is a raw socket with a tiny receive buffer that
sends a streaming request and then stops reading.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

import hymt
from hymt.synthetic import write_tiny_fixture

REPO_ROOT = Path(__file__).resolve().parents[1]
# The hymt under test (installed or built in place); -P keeps the bare source tree off sys.path.
PACKAGE_ROOT = str(Path(hymt.__file__).resolve().parents[1])
BASE = {"model": "test", "messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "max_tokens": 4}
LONG_STREAM = {**BASE, "max_tokens": 2000, "stream": True}  # ~300 KB of events: more than socket buffers hold
PROGRAM = "from hymt.cli import run; from hymt.serve import main; run(main)"


class LiveServer:
    """A `hymt-serve` subprocess; ``url`` once its `listening` line appeared."""

    def __init__(self, model: Path, *args: str, env: dict[str, str] | None = None) -> None:
        command = [sys.executable, "-P", "-c", PROGRAM, "--model", str(model), "--model-id", "test"]
        command += ["--ctx-size", "2048", "--listen", "127.0.0.1:0", "--ping-interval", "0.2", *args]
        environment = {**os.environ, "PYTHONPATH": PACKAGE_ROOT, **(env or {})}
        self.process = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env=environment,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        self.lines: list[str] = []
        self._ready = threading.Event()
        self.port = 0
        threading.Thread(target=self._read_log, daemon=True).start()
        if not self._ready.wait(60):
            self.stop()
            raise AssertionError("server did not start:\n" + "".join(self.lines))
        self.url = f"http://127.0.0.1:{self.port}"

    def _read_log(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)
            match = re.search(r"listening address=127\.0\.0\.1:(\d+)", line)
            if match:
                self.port = int(match.group(1))
                self._ready.set()

    def log(self) -> str:
        return "".join(self.lines)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def post(self, body: Any, **kwargs: Any) -> requests.Response:
        return requests.post(f"{self.url}/v1/chat/completions", json=body, timeout=30, **kwargs)


class StalledStream:
    """A streaming request whose client reads the response head and first event, then stops reading."""

    def __init__(
        self, server: LiveServer, body: dict[str, Any] | None = None, headers: dict[str, str] | None = None
    ) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.settimeout(10)
        self.sock.connect(("127.0.0.1", server.port))
        payload = json.dumps(body or LONG_STREAM).encode()
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n"
            + "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
            + "\r\n"
        )
        self.sock.sendall(head.encode() + payload)
        self.received = b""

    def read_until(self, marker: bytes) -> bytes:
        while marker not in self.received:
            chunk = self.sock.recv(4096)
            if not chunk:
                break
            self.received += chunk
        return self.received

    def status(self) -> int:
        self.read_until(b"\r\n")
        return int(self.received.split(b" ", 2)[1])

    def wait_started(self) -> None:
        """Blocks until the stream is active (its role chunk arrived)."""
        assert self.status() == 200, self.received
        assert b'"role":"assistant"' in self.read_until(b'"role":"assistant"')

    def read_rest(self) -> bytes:
        while True:
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            self.received += chunk
        return self.received

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_fixture(tmp_path_factory.mktemp("live") / "tiny.gguf", moe=False, numeric=False)


@pytest.fixture(scope="module")
def numeric_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_fixture(tmp_path_factory.mktemp("live") / "numeric.gguf", moe=False, numeric=True)


@pytest.fixture(scope="module")
def server(tiny_path: Path) -> Any:
    """Threads 1, concurrency 2, queue 0 (the §12.9 setting)."""
    live = LiveServer(tiny_path, "--threads", "1", "--max-concurrent-requests", "2", "--queue-capacity", "0")
    yield live
    live.stop()


def content(response: requests.Response) -> str:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def wait_for_capacity(server: LiveServer, timeout: float = 10.0) -> None:
    """Polls with normal requests until one succeeds; only 200 or 429 may be seen meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        response = server.post(BASE)
        assert response.status_code in (200, 429), response.text
        if response.status_code == 200:
            assert content(response) == "aaaa"
            return
        assert time.monotonic() < deadline, "capacity did not come back"
        time.sleep(0.05)


def assert_exact_capacity(server: LiveServer, slots: int, timeout: float = 10.0) -> None:
    """Exactly ``slots`` stalled streams are admitted (once the server has settled) and the next request
    gets 429: no permit leaked, none is counted twice."""
    deadline = time.monotonic() + timeout
    while True:
        stalled: list[StalledStream] = []
        try:
            for _ in range(slots):
                stalled.append(StalledStream(server))
                if stalled[-1].status() != 200:
                    break
                stalled[-1].wait_started()
            else:
                response = server.post(BASE)
                assert response.status_code == 429, response.text
                break
        finally:
            for stream in stalled:
                stream.close()
        assert time.monotonic() < deadline, "the server did not return to zero active requests"
        time.sleep(0.1)
    wait_for_capacity(server)


def test_routes(server: LiveServer) -> None:
    assert requests.get(f"{server.url}/healthz", timeout=10).json() == {"model": "test", "status": "ok"}
    assert requests.get(f"{server.url}/v1/models", timeout=10).json()["data"][0]["id"] == "test"
    response = requests.get(f"{server.url}/nope", timeout=10)
    assert response.status_code == 404 and response.json()["error"]["message"] == "Unknown endpoint"
    response = requests.get(f"{server.url}/v1/chat/completions", timeout=10)
    assert response.status_code == 405 and "POST" in response.headers["Allow"]
    assert content(server.post(BASE)) == "aaaa"
    assert "model ready architecture=hunyuan-dense" in server.log()
    assert re.search(r"max_kv_bytes=\d+ context=2048 concurrency=2 threads=1", server.log())


def test_sse_over_the_wire(server: LiveServer) -> None:
    body = {**BASE, "stream": True, "stream_options": {"include_usage": True}}
    response = requests.post(f"{server.url}/v1/chat/completions", json=body, stream=True, timeout=30)
    assert response.headers["Content-Type"] == "text/event-stream; charset=utf-8"
    raw = b"".join(response.iter_content(None))
    events = [block for block in raw.decode().split("\n\n") if block]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "aaaa"
    assert chunks[-1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}


def test_bad_input_over_the_wire(server: LiveServer) -> None:
    url = f"{server.url}/v1/chat/completions"
    headers = {"Content-Type": "application/json"}
    for raw in (b"{bad", b"[" * 200000, b'{"model":"\xff"}'):
        response = requests.post(url, data=raw, headers=headers, timeout=30)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["message"].startswith("Failed to parse the request body as JSON: ")
    response = requests.post(url, data=b"{}", headers={"Content-Type": "text/plain"}, timeout=30)
    assert response.status_code == 415
    big = json.dumps({**BASE, "messages": [{"role": "user", "content": "x" * (2 << 20)}]}).encode()
    response = requests.post(url, data=big, headers=headers, timeout=30)
    assert response.status_code == 413
    assert response.json()["error"]["message"] == "Failed to buffer the request body: length limit exceeded"

    def chunked() -> Any:
        for start in range(0, len(big), 65536):
            yield big[start : start + 65536]

    small = json.dumps(BASE).encode()
    response = requests.post(url, data=iter([small[:10], small[10:]]), headers=headers, timeout=30)
    assert content(response) == "aaaa"  # a chunked body within the limit is read whole
    try:
        response = requests.post(url, data=chunked(), headers=headers, timeout=30)
        assert response.status_code == 413
    except requests.ConnectionError:
        pass  # the server may close before the client finished sending; it must just stay up
    assert content(server.post(BASE)) == "aaaa"


def test_requests_gunicorn_cannot_parse_get_json_errors(server: LiveServer) -> None:
    """Broken HTTP is refused by gunicorn before the app sees it; the answer is still the JSON error shape
    (docs/api.md: every error is JSON), not gunicorn's HTML page."""
    cases = [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400),
        (b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
    ]
    for request_bytes, status in cases:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as client:
            client.sendall(request_bytes)
            answer = b""
            while chunk := client.recv(65536):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        assert int(lines[0].split()[1]) == status, answer
        assert "content-type: application/json" in [line.lower() for line in lines[1:]], answer
        error = json.loads(body)["error"]
        assert error["type"] == error["code"] == "invalid_request_error" and error["param"] is None
        assert isinstance(error["message"], str) and error["message"]
    assert content(server.post(BASE)) == "aaaa"


def test_unread_stream_does_not_block_a_normal_request(server: LiveServer) -> None:
    stalled = StalledStream(server, {**LONG_STREAM, "max_tokens": 1024})
    try:
        stalled.wait_started()
        started = time.monotonic()
        response = requests.post(f"{server.url}/v1/chat/completions", json=BASE, timeout=5)
        assert content(response) == "aaaa"
        assert time.monotonic() - started < 5
    finally:
        stalled.close()
    wait_for_capacity(server)


def test_429_only_when_full_and_recovery_after_disconnects(server: LiveServer) -> None:
    first, second = StalledStream(server), StalledStream(server)
    try:
        first.wait_started()
        second.wait_started()
        for _ in range(3):
            response = server.post(BASE)
            assert response.status_code == 429
            assert response.headers["Retry-After"] == "1"
            assert response.json()["error"] == {
                "message": "Request queue is full",
                "type": "rate_limit_error",
                "param": None,
                "code": "rate_limit_error",
            }
        assert requests.get(f"{server.url}/healthz", timeout=5).status_code == 200
    finally:
        first.close()
        second.close()
    wait_for_capacity(server)
    assert_exact_capacity(server, 2)


def test_disconnects_mid_request_free_permits(server: LiveServer) -> None:
    long_prompt = {**BASE, "messages": [{"role": "user", "content": "x" * 2000}], "max_tokens": 40}
    for body in (
        {**BASE, "max_tokens": 2000},  # non-streaming, killed during decode
        {**LONG_STREAM},  # streaming, killed mid-stream
        {**long_prompt, "stream": True},  # killed right after sending (queued or in prefill)
        long_prompt,
    ):
        for _ in range(2):
            stream = StalledStream(server, body)
            time.sleep(0.05)
            stream.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            stream.close()  # reset, like a killed client
    wait_for_capacity(server)
    assert_exact_capacity(server, 2)
    assert "error=client disconnected" in server.log()


def test_disconnect_while_queued_frees_permits(tiny_path: Path) -> None:
    live = LiveServer(tiny_path, "--threads", "1", "--max-concurrent-requests", "1", "--queue-capacity", "1")
    try:
        holder = StalledStream(live)
        holder.wait_started()
        queued = StalledStream(live, {**BASE, "stream": True})
        assert queued.status() == 200
        assert b": ping\n\n" in queued.read_until(b": ping\n\n")  # admitted, waiting for the slot
        assert live.post(BASE).status_code == 429
        queued.close()
        deadline = time.monotonic() + 5
        while True:  # the queue permit comes back: a new stream is admitted and waits
            again = StalledStream(live, {**BASE, "stream": True})
            if again.status() == 200:
                break
            again.close()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert b": ping" in again.read_until(b": ping")
        holder.close()  # its slot passes to the waiting stream
        assert b"data: [DONE]" in again.read_until(b"data: [DONE]")
        again.close()
    finally:
        live.stop()


def test_parallel_streams_equal_solo_runs_and_bounded_burst(numeric_path: Path) -> None:
    live = LiveServer(
        numeric_path, "--threads", "1", "--max-concurrent-requests", "8", "--queue-capacity", "8"
    )
    try:
        bodies = [
            {
                "model": "test",
                "messages": [{"role": "user", "content": f"Translate {i}: " + "abc" * i}],
                "temperature": 0.8,
                "top_k": 40,
                "seed": 7 + i,
                "max_tokens": 32,
                "stream": True,
            }
            for i in range(8)
        ]

        def stream_text(body: dict[str, Any]) -> str:
            response = requests.post(f"{live.url}/v1/chat/completions", json=body, stream=True, timeout=60)
            assert response.status_code == 200
            raw = b"".join(response.iter_content(None)).decode()
            events = [block for block in raw.split("\n\n") if block.startswith("data: ")]
            assert events[-1] == "data: [DONE]"
            chunks = [json.loads(e[len("data: ") :]) for e in events[:-1]]
            return "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)

        solo = [stream_text(body) for body in bodies]
        assert len(set(solo)) > 1
        with ThreadPoolExecutor(8) as pool:
            together = list(pool.map(stream_text, bodies))
        assert together == solo

        def one(i: int) -> int:
            body = {**bodies[i % 8], "stream": i % 3 == 0, "max_tokens": 8}
            return requests.post(f"{live.url}/v1/chat/completions", json=body, timeout=60).status_code

        with ThreadPoolExecutor(20) as pool:
            statuses = list(pool.map(one, range(200)))
        assert set(statuses) <= {200, 429}, statuses
        assert statuses.count(200) > 0
    finally:
        live.stop()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_shutdown_with_a_stalled_stream(tiny_path: Path, signum: int) -> None:
    graceful = 1.0
    live = LiveServer(
        tiny_path,
        "--threads",
        "1",
        "--max-concurrent-requests",
        "1",
        "--queue-capacity",
        "0",
        "--graceful-timeout",
        str(graceful),
    )
    stalled = StalledStream(live)
    try:
        stalled.wait_started()
        keepalive = requests.Session()
        assert keepalive.get(f"{live.url}/healthz", timeout=5).status_code == 200
        started = time.monotonic()
        live.process.send_signal(signum)
        time.sleep(0.3)
        # A request still reaching the app while draining gets 503.
        response = keepalive.get(f"{live.url}/healthz", timeout=5)
        assert response.status_code == 503
        assert response.json()["error"]["message"] == "Server is shutting down"
        # The client never resumes reading: the server must end the response itself and exit.
        live.process.wait(graceful + 5)
        assert time.monotonic() - started < graceful + 5
        rest = stalled.read_rest()  # what was buffered, then end-of-stream
        assert b"data: [DONE]" not in rest
        assert "Handling signal" in live.log()
    finally:
        stalled.close()
        live.stop()


def test_draining_server_refuses_new_connections(tiny_path: Path) -> None:
    """After SIGTERM the listening socket is closed at once: a new client is refused, instead of being
    accepted into the backlog and left hanging until the drain ends (up to --graceful-timeout)."""
    live = LiveServer(
        tiny_path, "--threads", "1", "--max-concurrent-requests", "1", "--queue-capacity", "0",
        "--graceful-timeout", "20",
    )  # fmt: skip
    stalled = StalledStream(live)
    try:
        stalled.wait_started()
        live.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        refused = False
        while not refused and time.monotonic() < deadline and live.process.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", live.port), timeout=5) as client:
                    client.sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
                    client.settimeout(0.5)
                    try:
                        client.recv(4096)
                    except TimeoutError:
                        pass  # accepted by the kernel, served by nobody: the hang this test is about
            except ConnectionRefusedError:
                refused = True
            time.sleep(0.1)
        assert refused, "new connections were still accepted while draining"
        assert live.process.poll() is None  # the stalled stream keeps the drain going meanwhile
    finally:
        stalled.close()
        live.stop()


def test_a_listener_event_after_the_drain_closed_it_is_ignored() -> None:
    """The drain closes the listeners from the worker's event loop; a listener event polled in the same
    round is then dispatched to ``accept`` on a closed socket, which must not end the worker."""
    from hymt.serve import HymtWorker

    worker = object.__new__(HymtWorker)  # no gunicorn arbiter needed for this one method
    worker._accepting = False
    worker.accept(None)  # would raise AttributeError inside gunicorn's accept if it were called


def test_memory_warning_when_full_kv_caches_cannot_fit() -> None:
    from hymt.serve import memory_warning

    gib = 2**30
    assert memory_warning(1 * gib, 2 * gib, 16 * gib) is None
    assert memory_warning(1 * gib, 2 * gib, None) is None  # memory size unknown: no guess
    warning = memory_warning(1 * gib, 64 * gib, 16 * gib)
    assert warning is not None and "64.0 GiB" in warning and "--ctx-size" in warning


def test_memory_warning_is_logged_at_start(tiny_path: Path) -> None:
    from hymt.serve import physical_memory_bytes

    memory = physical_memory_bytes()
    if memory is None:
        pytest.skip("physical memory size unknown here")
    model = hymt.load(tiny_path, threads=1)
    concurrency = memory // (model.kv_bytes_per_token * 4096) + 1  # full caches just past the memory
    model.close()
    live = LiveServer(
        tiny_path, "--threads", "1", "--ctx-size", "4096", "--max-concurrent-requests", str(concurrency)
    )
    try:
        assert "exceed this machine's memory" in live.log()
    finally:
        live.stop()


def test_port_in_use_is_one_clear_error(tiny_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [sys.executable, "-P", "-c", PROGRAM, "--model", str(tiny_path), "--threads", "1"]
        result = run_program([*command, "--listen", f"127.0.0.1:{port}"])
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: cannot listen on 127.0.0.1:{port}: ")
    assert "Connection in use" not in result.stderr  # gunicorn's five retries, one second apart
    assert "Traceback" not in result.stderr


def test_model_errors_end_the_program_cleanly(tiny_path: Path) -> None:
    command = [sys.executable, "-P", "-c", PROGRAM, "--model", str(tiny_path), "--ctx-size", "99999"]
    command += ["--listen", "127.0.0.1:0"]
    result = run_program(command)
    assert result.returncode == 1
    # The worker's error is the last thing the user reads, not followed by gunicorn's shutdown lines.
    assert result.stderr.strip().splitlines()[-1] == "error: context must be between 1 and 4096"
    assert "Traceback" not in result.stderr
    result = run_program(
        [sys.executable, "-P", "-c", PROGRAM, "--model", str(tiny_path.parent / "missing.gguf")]
    )
    assert result.returncode == 1 and "error: " in result.stderr and "Traceback" not in result.stderr
    not_gguf = tiny_path.parent / "not-a-model.gguf"
    not_gguf.write_bytes(b"this is not a GGUF file at all")
    for path, message in [(not_gguf, "not a GGUF file"), (tiny_path.parent, "model path is a directory")]:
        command = [sys.executable, "-P", "-c", PROGRAM, "--model", str(path), "--listen", "127.0.0.1:0"]
        result = run_program(command)
        assert result.returncode == 1, result.stderr
        assert result.stderr.strip().splitlines()[-1].startswith(f"error: {message}"), result.stderr
        assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("flags", "code", "message"),
    [
        (
            ["--listen", "localhost:80"],
            1,
            "error: invalid listen address 'localhost:80'; expected IP:port with a "
            "numeric IP (127.0.0.1:8080 for localhost",
        ),
        (["--listen", "::1:80"], 1, "error: invalid listen address"),
        (["--listen", "127.0.0.1:70000"], 1, "error: invalid port"),
        (["--max-concurrent-requests", "0"], 1, "error: concurrency and threads must be positive"),
        (["--threads", "0"], 1, "error: concurrency and threads must be positive"),
        (["--threads", "100000"], 1, "error: threads must be at most 1024"),  # crashed the worker
        (["--model-id", ""], 1, "error: model ID must not be empty"),
        # `--api-key "$KEY"` with KEY unset would otherwise serve without any authentication.
        (["--api-key", ""], 1, "error: API key must not be empty"),
        (["--api-key", "  "], 1, "error: API key must not be empty"),
        (["--graceful-timeout", "-1"], 1, "error: graceful timeout must be a finite number of seconds ≥ 0"),
        (["--graceful-timeout", "inf"], 1, "error: graceful timeout must be a finite number of seconds ≥ 0"),
        (["--graceful-timeout", "nan"], 1, "error: graceful timeout must be a finite number of seconds ≥ 0"),
        (["--queue-capacity", "x"], 2, "error: argument --queue-capacity"),
        (["--bogus"], 2, "error: unrecognized arguments"),
    ],
)
def test_bad_flags(tiny_path: Path, flags: list[str], code: int, message: str) -> None:
    result = run_program([sys.executable, "-P", "-c", PROGRAM, "--model", str(tiny_path), *flags])
    assert result.returncode == code, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def run_program(command: list[str]) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": PACKAGE_ROOT}
    return subprocess.run(command, cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("127.0.0.1:8080", ("127.0.0.1", 8080)), ("[::1]:0", ("::1", 0)), ("0.0.0.0:1", ("0.0.0.0", 1))],
)
def test_parse_listen(value: str, expected: tuple[str, int]) -> None:
    from hymt.serve import parse_listen

    assert parse_listen(value) == expected


def test_help_and_version() -> None:
    result = run_program([sys.executable, "-P", "-c", PROGRAM, "--help"])
    assert result.returncode == 0
    for flag in ("--model", "--model-id", "--listen", "--ctx-size", "--threads", "--max-concurrent-requests"):
        assert flag in result.stdout
    for flag in ("--queue-capacity", "--gguf-profile", "--graceful-timeout", "--log-level", "--api-key"):
        assert flag in result.stdout
    assert "Serve one model through the text Chat Completions API." in result.stdout
    result = run_program([sys.executable, "-P", "-c", PROGRAM, "--version"])
    assert result.returncode == 0 and result.stdout.startswith("hymt-serve ")


def test_ipv6_listen(tiny_path: Path) -> None:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback")
    command = [sys.executable, "-P", "-c", PROGRAM, "--model", str(tiny_path), "--model-id", "test"]
    command += ["--listen", "[::1]:0", "--threads", "1", "--ctx-size", "2048"]
    environment = {**os.environ, "PYTHONPATH": PACKAGE_ROOT}
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=environment, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        port = None
        for line in process.stderr:
            match = re.search(r"listening address=\[::1\]:(\d+)", line)
            if match:
                port = int(match.group(1))
                break
        assert port is not None
        response = requests.post(f"http://[::1]:{port}/v1/chat/completions", json=BASE, timeout=30)
        assert content(response) == "aaaa"
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
