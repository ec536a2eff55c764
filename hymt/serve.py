"""`hymt-serve`: serve one model through the text Chat Completions API (REFERENCE §9.1, §9.10, §10.1).

gunicorn runs programmatically: one ``gthread`` worker process (one model, one global queue, so a 429 means
the server is full), threads = active + queue + 4 so spare threads answer `/healthz`, `/v1/models` and 429s
while every slot is busy. The model file is resolved (downloaded, or written when synthetic) in the master;
the model itself and its compute pool are created in the worker, never before the fork. SIGINT and SIGTERM
both drain: new requests get 503, in-flight ones may finish within ``--graceful-timeout``, then the rest are
cancelled and the process exits.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import math
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from gunicorn import util as gunicorn_util
from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter
from gunicorn.workers.gthread import ThreadWorker

from hymt.cli import ArgumentParser, add_model_arguments, resolve_model
from hymt.errors import HymtError, ServerError
from hymt.server import ServerConfig

log = logging.getLogger("hymt.serve")

# How much longer than our own graceful timeout gunicorn waits before it kills the worker: our drain
# cancels at the timeout and cuts stuck connections a second later, so this is only a last resort.
GUNICORN_GRACE_MARGIN = 4
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
PIPE_MESSAGE_BYTES = 4096  # one write of at most PIPE_BUF bytes reaches the master whole


def parse_listen(value: str) -> tuple[str, int]:
    """`IP:port` or `[IPv6]:port` → (host, port)."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise ServerError(f"invalid listen address {value!r}; expected IP:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        version = 6
    else:
        version = 4
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ServerError(
            f"invalid listen address {value!r}; expected IP:port with a numeric IP "
            "(127.0.0.1:8080 for localhost, 0.0.0.0:8080 for every interface, [::1]:8080)"
        ) from None
    if address.version != version:
        raise ServerError(f"invalid listen address {value!r}; write IPv6 addresses as [addr]:port")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ServerError(f"invalid port in listen address {value!r}")
    return str(address), int(port_text)


def check_listen(host: str, port: int) -> None:
    """Fail at once, before a model is downloaded or loaded, when the address cannot be bound: gunicorn
    itself would retry five times a second apart and end without an `error:` line."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    address = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ServerError(f"cannot listen on {address}: {exc.strerror or exc}") from None


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="hymt-serve", description="Serve one model through the text Chat Completions API."
    )
    add_model_arguments(parser)
    parser.add_argument(
        "--model-id", default="hy-mt2", help="the model id requests must name (default: hy-mt2)"
    )
    parser.add_argument(
        "--listen", default="127.0.0.1:8080", help="IP:port, IPv6 as [addr]:port (default: 127.0.0.1:8080)"
    )
    parser.add_argument("--ctx-size", type=int, default=8192, help="context per request (default: 8192)")
    parser.add_argument(
        "--threads", type=int, default=None, help="compute threads (default: usable physical cores)"
    )
    parser.add_argument("--max-concurrent-requests", type=int, default=2, help="active requests (default: 2)")
    parser.add_argument(
        "--queue-capacity", type=int, default=8, help="requests waiting for a slot (default: 8)"
    )
    parser.add_argument(
        "--graceful-timeout",
        type=float,
        default=30.0,
        help="seconds in-flight requests may take after SIGINT/SIGTERM (default: 30)",
    )
    parser.add_argument(
        "--no-prompt-cache",
        dest="prompt_cache",
        action="store_false",
        help="prefill every prompt in full instead of continuing from the KV cache of a finished request "
        "whose prompt started the same way (finished requests' caches are kept, within the memory of "
        "--max-concurrent-requests full caches)",
    )
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info", help="default: info")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("HYMT_API_KEY") or None,
        help="require `Authorization: Bearer <key>` on every route but /healthz (default: $HYMT_API_KEY)",
    )
    # Longest silence on an open SSE stream (15 s in production; tests shorten it).
    parser.add_argument("--ping-interval", type=float, default=15.0, help=argparse.SUPPRESS)
    return parser


class _Arbiter(Arbiter):
    def handle_int(self) -> None:
        """SIGINT drains like SIGTERM (§9.10); a second one during the drain forces a quick exit."""
        raise StopIteration


def write_json_error(sock: Any, status: int, reason: str, message: str) -> None:
    """gunicorn's answer to a request it cannot parse (bad request line or header, URI too long), in the
    API's JSON error shape instead of gunicorn's HTML page; replaces ``gunicorn.util.write_error``."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    error = {"message": message or reason, "type": kind, "param": None, "code": kind}
    body = json.dumps({"error": error}, ensure_ascii=False, separators=(",", ":")).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    gunicorn_util.write_nonblock(sock, head.encode("latin-1") + body)


class HymtWorker(ThreadWorker):
    """gunicorn's threaded worker whose SIGINT/SIGTERM also start the app's drain (§9.10), and whose
    errors for unparsable requests are JSON like every other error of the API."""

    def init_process(self) -> None:
        gunicorn_util.write_error = write_json_error  # this process is ours: its one error writer
        super().init_process()

    def init_signals(self) -> None:
        super().init_signals()
        signal.signal(signal.SIGINT, self.handle_exit)

    def handle_exit(self, sig: int, frame: Any) -> None:
        first = self.alive
        super().handle_exit(sig, frame)
        if first and hasattr(self, "method_queue"):
            self.method_queue.defer(self._stop_listening)
        app = getattr(self, "wsgi", None)
        state = getattr(app, "extensions", {}).get("hymt") if app is not None else None
        if first and state is not None:
            state.begin_shutdown()

    def _stop_listening(self) -> None:
        """Close the listening sockets as the drain starts (on the worker's main loop). gunicorn's gthread
        worker (27.0) only stops polling them and closes them when the last request has ended, so during
        the whole graceful timeout new clients were accepted by the kernel and left hanging, not refused."""
        self.set_accept_enabled(False)
        for listener in self.sockets:
            listener.close()

    def accept(self, listener: Any) -> None:
        # A listener event polled in the same round as the drain callback may still be dispatched after
        # the listener was closed; accepting on it would raise and end the worker mid-drain.
        if getattr(self, "_accepting", True):
            super().accept(listener)


class _Application(BaseApplication):
    def __init__(self, options: dict[str, Any], factory: Callable[[], Any]) -> None:
        self._options = options
        self._factory = factory
        super().__init__()

    def load_config(self) -> None:
        for key, value in self._options.items():
            if key in self.cfg.settings:
                self.cfg.set(key, value)

    def load(self) -> Any:
        return self._factory()

    def run(self) -> None:
        _Arbiter(self).run()


def _load_app(config: ServerConfig, path: str, profile: str, error_fd: int) -> Any:
    """Runs in the worker: load the model, build the app, log `model ready` (§9.11). A failure's message
    goes to the master through ``error_fd``; the master prints it after gunicorn's own shutdown lines."""
    from hymt import kernels, load
    from hymt.server import create_app

    try:
        started = time.perf_counter()
        model = load(path, profile, threads=config.threads)
        load_ms = (time.perf_counter() - started) * 1000.0
        app = create_app(config, model=model)
    except (HymtError, OSError) as exc:
        if isinstance(exc, HymtError):
            message = str(exc)
        else:
            message = f"{exc.strerror or exc}: {exc.filename or path}"
        os.write(error_fd, message.encode("utf-8", "replace")[:PIPE_MESSAGE_BYTES])
        sys.exit(Arbiter.WORKER_BOOT_ERROR)
    max_kv_bytes = model.kv_bytes_per_token * config.context_size * config.max_concurrent_requests
    log.info(
        "model ready architecture=%s profile=%s weight_file_bytes=%d max_kv_bytes=%d context=%d "
        "concurrency=%d threads=%d kernel=%s load_ms=%.1f",
        model.config.architecture,
        model.profile,
        model.file_bytes,
        max_kv_bytes,
        config.context_size,
        config.max_concurrent_requests,
        config.threads,
        kernels.isa(),
        load_ms,
    )
    warning = memory_warning(model.file_bytes, max_kv_bytes, physical_memory_bytes())
    if warning:
        log.warning(warning)
    return app


def physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def memory_warning(weight_bytes: int, max_kv_bytes: int, memory: int | None) -> str | None:
    """A start-up warning when the weights plus full KV caches cannot fit in the machine's memory.

    KV caches grow with use, so such a server starts fine and is killed by the kernel's OOM killer later,
    taking every in-flight request with it, when long requests run at full concurrency.
    """
    if memory is None or weight_bytes + max_kv_bytes <= memory:
        return None
    return (
        f"weights ({weight_bytes / 2**30:.1f} GiB) plus full KV caches ({max_kv_bytes / 2**30:.1f} GiB = "
        f"context x concurrency) exceed this machine's memory ({memory / 2**30:.1f} GiB); long requests at "
        "full concurrency may run out of memory: lower --ctx-size or --max-concurrent-requests"
    )


def _log_listening(worker: Any) -> None:
    for sock in worker.sockets:
        host, port = sock.getsockname()[:2]
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        log.info("listening address=%s", address)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    host, port = parse_listen(args.listen)
    if args.threads is None:
        from hymt.kernels import usable_physical_cores

        args.threads = usable_physical_cores()
    config = ServerConfig(
        model_id=args.model_id,
        context_size=args.ctx_size,
        max_concurrent_requests=args.max_concurrent_requests,
        queue_capacity=args.queue_capacity,
        threads=args.threads,
        profile=args.gguf_profile,
        api_key=args.api_key,
        graceful_timeout=args.graceful_timeout,
        ping_interval=args.ping_interval,
        prompt_cache=args.prompt_cache,
    )
    config.validate()
    check_listen(host, port)  # after the cheap checks, before a download or a model write
    path, profile = resolve_model(args.model, args.gguf_profile)
    if path.is_dir():
        raise ServerError(f"model path is a directory: {path}")
    if not path.is_file():
        raise ServerError(f"model file not found: {path}")
    config.model_path, config.profile = str(path), profile
    bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    options = {
        "bind": [bind],
        "workers": 1,
        "worker_class": HymtWorker,
        "threads": config.max_concurrent_requests + config.queue_capacity + 4,
        "timeout": 0,  # a large model may take long to map; compute never blocks the heartbeat anyway
        "graceful_timeout": math.ceil(
            config.graceful_timeout + GUNICORN_GRACE_MARGIN
        ),  # gunicorn wants an int
        "keepalive": 5,
        "loglevel": args.log_level,
        "errorlog": "-",
        "accesslog": None,
        "proc_name": "hymt-serve",
        "preload_app": False,
        "control_socket_disable": True,
        "post_worker_init": _log_listening,
    }
    master = os.getpid()
    error_read, error_write = os.pipe()  # the worker's start-up error, if it has one
    try:
        _Application(options, lambda: _load_app(config, str(path), profile, error_write)).run()
    except SystemExit as exc:
        if os.getpid() != master:
            raise  # the forked worker leaving: its exit code tells the master why
        code = exc.code if isinstance(exc.code, int) else 1
        if code in (Arbiter.WORKER_BOOT_ERROR, Arbiter.APP_LOAD_ERROR):
            os.close(error_write)  # every worker has exited, so the read below ends
            with os.fdopen(error_read, "rb") as pipe:
                message = pipe.read().decode("utf-8", "replace")
            raise ServerError(message or "the server worker failed to start (see the log above)") from None
        return code
    return 0


if __name__ == "__main__":
    from hymt.cli import run

    run(main)
