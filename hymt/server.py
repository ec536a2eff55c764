"""The OpenAI-compatible Chat Completions API as a Flask app (REFERENCE §9).

``create_app(config, model=...)`` builds the app around one model and one ``Engine``. A chat request is
parsed and schema-checked, takes an admission permit (429 when none is left), is prepared (template,
tokens, §9.5 validation) while holding it, then waits for an active slot and streams the engine's events
back — as one JSON document or as server-sent events. The request thread only moves events from its
ticket's queue to the socket, so a client that stops reading stalls nothing but itself.

Disconnects are noticed through write failures and, while waiting, by polling the client socket for
end-of-file (under gunicorn it is ``environ["gunicorn.socket"]``; the Flask test client has none).
"""

from __future__ import annotations

import hmac
import itertools
import json
import logging
import math
import select
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from flask import Flask, Response, g, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from hymt.engine import Engine, EngineClosed, Event, QueueFull, Ticket
from hymt.errors import HymtError, ServerError
from hymt.generation import GenerationRequest
from hymt.sampling import default_sampling

log = logging.getLogger("hymt.server")

MAX_BODY_BYTES = 1024 * 1024
DEFAULT_MAX_TOKENS = 4096
DISCONNECT_POLL_SECONDS = 0.1
SSE_SEND_BUFFER_BYTES = 32 * 1024
U64_MAX = 2**64 - 1
I32_MIN, I32_MAX = -(2**31), 2**31 - 1
ROLES = ("system", "user", "assistant")


@dataclass
class ServerConfig:
    """What ``hymt-serve`` configures; the defaults are its flag defaults (§10.1)."""

    model_id: str = "hy-mt2"
    context_size: int = 8192
    max_concurrent_requests: int = 2
    queue_capacity: int = 8
    threads: int | None = None  # None → usable physical cores (§10.5)
    model_path: str | None = None  # None → the default model (ensured as by hymt-download)
    profile: str = "auto"
    api_key: str | None = None  # when set, every route but /healthz needs `Authorization: Bearer <key>`
    graceful_timeout: float = 30.0  # seconds in-flight requests may take after SIGINT/SIGTERM
    ping_interval: float = 15.0  # longest silence on an open SSE stream
    prompt_cache: bool = True  # continue new prompts from finished requests' KV caches (hymt.prompt_cache)

    def validate(self) -> None:
        if not self.model_id:
            raise ServerError("model ID must not be empty")
        if self.api_key is not None and not self.api_key.strip():  # `--api-key "$UNSET"`: no auth at all
            raise ServerError("API key must not be empty")
        if self.max_concurrent_requests < 1 or (self.threads is not None and self.threads < 1):
            raise ServerError("concurrency and threads must be positive")
        from hymt.kernels import MAX_THREADS  # not at import: `hymt-serve --version` loads no kernels

        if self.threads is not None and self.threads > MAX_THREADS:
            raise ServerError(f"threads must be at most {MAX_THREADS}")
        if self.queue_capacity < 0:
            raise ServerError("queue capacity must not be negative")
        if not 0 <= self.graceful_timeout < math.inf:  # NaN fails too; gunicorn needs a whole number
            raise ServerError("graceful timeout must be a finite number of seconds ≥ 0")
        if not self.ping_interval > 0:
            raise ServerError("ping interval must be positive")


class ApiError(Exception):
    """An error response in the §9.3 shape."""

    def __init__(self, status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.headers = headers or {}


def _invalid(message: str) -> ApiError:
    return ApiError(400, "invalid_request_error", message)


def _schema_error(detail: str) -> ApiError:
    return _invalid(f"Failed to deserialize the JSON body into the target type: {detail}")


def error_body(kind: str, message: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    return Response(text, status=status, headers=headers, content_type="application/json")


def _error_response(error: ApiError) -> Response:
    return _json_response(error_body(error.kind, error.message, error.kind), error.status, error.headers)


# ---- request body: JSON and schema (§9.3, §9.4) --------------------------------------------------------


class _DuplicateField(Exception):
    pass


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateField(key)
        result[key] = value
    return result


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("number out of range")
    return value


def _bounded_int(text: str) -> int:
    # Python refuses integers of more than 4300 digits with advice about sys.set_int_max_str_digits();
    # clients get the same message as for 1e999.
    try:
        return int(text)
    except ValueError:
        raise ValueError("number out of range") from None


def parse_json(body: bytes) -> Any:
    """The request body as JSON, or a 400 `Failed to parse the request body as JSON: …`."""
    prefix = "Failed to parse the request body as JSON: "
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _invalid(f"{prefix}invalid UTF-8 at byte {exc.start}") from None
    if text.startswith("\ufeff"):  # json's own message advises decoding with utf-8-sig
        raise _invalid(f"{prefix}unexpected byte order mark (BOM) at line 1 column 1")
    try:
        return json.loads(
            text,
            parse_constant=_reject_constant,
            parse_float=_finite_float,
            parse_int=_bounded_int,
            object_pairs_hook=_object_without_duplicates,
        )
    except json.JSONDecodeError as exc:
        raise _invalid(f"{prefix}{exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except _DuplicateField as exc:
        raise _schema_error(f"duplicate field `{exc.args[0]}`") from None
    except RecursionError:
        raise _invalid(f"{prefix}recursion limit exceeded") from None
    except ValueError as exc:  # NaN/Infinity, 1e999, integers of more than 4300 digits
        raise _invalid(f"{prefix}{exc}") from None


@dataclass(frozen=True)
class ChatRequest:
    """A schema-valid request body (§9.4); None = absent (JSON null included)."""

    model: str
    messages: list[dict[str, Any]]  # each {"role": str, "content": str | list of part objects}
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    include_usage: bool = False
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value!r}`"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "sequence"
    return "map"


def _expect(path: str, value: Any, expected: str) -> ApiError:
    return _schema_error(f"{path}: invalid type: {_type_name(value)}, expected {expected}")


def _integer(path: str, value: Any, low: int, high: int, expected: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _expect(path, value, expected)
    if not low <= value <= high:
        raise _schema_error(f"{path}: invalid value: integer `{value}`, expected {expected}")
    return value


def _number(path: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _expect(path, value, "a number")
    try:
        return float(value)
    except OverflowError:
        raise _schema_error(f"{path}: number out of range") from None


def _boolean(path: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _expect(path, value, "a boolean")
    return value


def _fields(path: str, obj: dict[str, Any], allowed: tuple[str, ...]) -> None:
    for key in obj:
        if key not in allowed:
            where = f"{path}: " if path else ""
            names = ", ".join(f"`{name}`" for name in allowed)
            raise _schema_error(f"{where}unknown field `{key}`, expected one of {names}")


def _content(path: str, value: Any) -> str | list[dict[str, Any]]:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise _expect(path, value, "a string or an array of content parts")
    for j, part in enumerate(value):
        where = f"{path}[{j}]"
        if not isinstance(part, dict):
            raise _expect(where, part, "a content part object")
        if "type" not in part:
            raise _schema_error(f"{where}: missing field `type`")
        if not isinstance(part["type"], str):
            raise _expect(f"{where}.type", part["type"], "a string")
        if part["type"] != "text":
            continue  # other part types are refused after admission (§9.5 step 4)
        _fields(where, part, ("type", "text"))
        if "text" not in part:
            raise _schema_error(f"{where}: missing field `text`")
        if not isinstance(part["text"], str):
            raise _expect(f"{where}.text", part["text"], "a string")
    return value


def _message(path: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _expect(path, value, "a message object")
    _fields(path, value, ("role", "content"))
    for key in ("role", "content"):
        if key not in value:
            raise _schema_error(f"{path}: missing field `{key}`")
    role = value["role"]
    if not isinstance(role, str):
        raise _expect(f"{path}.role", role, "a string")
    if role not in ROLES:
        raise _schema_error(
            f"{path}.role: unknown variant `{role}`, expected one of `system`, `user`, `assistant`"
        )
    return {"role": role, "content": _content(f"{path}.content", value["content"])}


_TOP_FIELDS = (
    "model",
    "messages",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "temperature",
    "top_p",
    "repetition_penalty",
    "top_k",
    "seed",
    "stop",
)


def parse_chat_request(body: Any) -> ChatRequest:
    """Check a parsed body against the §9.4 schema (first problem in document order wins)."""
    if not isinstance(body, dict):
        raise _schema_error(f"invalid type: {_type_name(body)}, expected a chat completion request object")
    _fields("", body, _TOP_FIELDS)
    values: dict[str, Any] = {}
    for key, value in body.items():
        if key == "model":
            if not isinstance(value, str):
                raise _expect(key, value, "a string")
            values[key] = value
        elif key == "messages":
            if not isinstance(value, list):
                raise _expect(key, value, "a sequence of messages")
            values[key] = [_message(f"messages[{i}]", m) for i, m in enumerate(value)]
        elif value is None:
            continue  # every optional field accepts null as absent
        elif key == "stream":
            values[key] = _boolean(key, value)
        elif key == "stream_options":
            if not isinstance(value, dict):
                raise _expect(key, value, "an object")
            _fields(key, value, ("include_usage",))
            include = value.get("include_usage")
            values["include_usage"] = False if include is None else _boolean(f"{key}.include_usage", include)
            values[key] = value
        elif key in ("max_tokens", "max_completion_tokens", "n"):
            values[key] = _integer(key, value, 0, U64_MAX, "a non-negative integer below 2^64")
        elif key in ("temperature", "top_p", "repetition_penalty"):
            values[key] = _number(key, value)
        elif key == "top_k":
            values[key] = _integer(key, value, I32_MIN, I32_MAX, "a 32-bit signed integer")
        elif key == "seed":
            values[key] = _integer(key, value, 0, U64_MAX, "an integer between 0 and 2^64-1")
        elif key == "stop":
            if isinstance(value, list):
                for i, item in enumerate(value):
                    if not isinstance(item, str):
                        raise _expect(f"stop[{i}]", item, "a string")
            elif not isinstance(value, str):
                raise _expect(key, value, "a string or an array of strings")
            values[key] = value
    for key in ("model", "messages"):
        if key not in values:
            raise _schema_error(f"missing field `{key}`")
    return ChatRequest(**values)


# ---- preparation after admission (§9.5 steps 1–9) ------------------------------------------------------


def prepare(chat: ChatRequest, model: Any, context: int) -> GenerationRequest:
    """Template, tokens and the §9.5 checks in order; a failure is a 400 with its message."""
    from hymt.chat import flatten_content, render_chat

    if chat.n is not None and chat.n != 1:
        raise _invalid("only n=1 is supported")
    if chat.max_tokens is not None and chat.max_completion_tokens is not None:
        raise _invalid("provide only one of max_tokens and max_completion_tokens")
    if chat.stream_options is not None and not chat.stream:
        raise _invalid("stream_options requires stream=true")
    try:
        messages = [{"role": m["role"], "content": flatten_content(m["content"])} for m in chat.messages]
        prompt_ids = model.tokenizer.encode(render_chat(model.tokenizer, messages))
    except HymtError as exc:
        raise _invalid(exc.message) from None
    if not prompt_ids or len(prompt_ids) >= context:
        raise _invalid("prompt leaves no output space in the configured context")
    room = context - len(prompt_ids)
    if chat.max_completion_tokens is not None:
        max_tokens = chat.max_completion_tokens
    elif chat.max_tokens is not None:
        max_tokens = chat.max_tokens
    else:
        max_tokens = min(DEFAULT_MAX_TOKENS, room)
    if max_tokens > room:
        raise _invalid("prompt plus output limit exceeds the configured context size")
    overrides = {
        name: getattr(chat, name)
        for name in ("temperature", "top_p", "top_k", "repetition_penalty")
        if getattr(chat, name) is not None
    }
    sampling = replace(default_sampling(model.config.architecture), **overrides, seed=chat.seed)
    stop = [chat.stop] if isinstance(chat.stop, str) else list(chat.stop or [])
    generation_request = GenerationRequest(
        prompt_ids=prompt_ids, max_tokens=max_tokens, sampling=sampling, stop=stop
    )
    try:
        generation_request.validate(context)
    except HymtError as exc:
        raise _invalid(exc.message) from None
    return generation_request


# ---- the app ---------------------------------------------------------------------------------------------


class ClientGone(Exception):
    """The client closed its connection."""


def peer_closed(sock: socket.socket) -> bool:
    """True when the client has closed its end (readable with end-of-file, or reset)."""
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN | select.POLLPRI)
        if not poller.poll(0):
            return False
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except (OSError, ValueError):
        return True


class ServerState:
    """Everything one app instance shares: config, model, engine, id counter, shutdown state."""

    def __init__(self, config: ServerConfig, model: Any) -> None:
        self.config = config
        self.model = model
        self.engine = Engine(
            model,
            max_concurrent=config.max_concurrent_requests,
            queue_capacity=config.queue_capacity,
            context=config.context_size,
            prompt_cache=config.prompt_cache,
        )
        self.started = int(time.time())
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._sockets: dict[int, socket.socket] = {}  # open chat requests' client sockets (shutdown)
        self.draining = False

    def next_id(self) -> str:
        return f"chatcmpl-{time.time_ns():x}-{next(self._ids):x}"

    def track(self, key: int, sock: socket.socket | None) -> None:
        if sock is not None:
            with self._lock:
                self._sockets[key] = sock

    def untrack(self, key: int) -> None:
        with self._lock:
            self._sockets.pop(key, None)

    def begin_shutdown(self) -> threading.Thread:
        """§9.10: refuse new requests, let in-flight ones finish within the graceful timeout, then cancel
        the rest and cut connections that still do not finish (a client that stopped reading)."""
        self.draining = True
        self.engine.stop_admitting()
        thread = threading.Thread(target=self._drain, name="hymt-drain", daemon=True)
        thread.start()
        return thread

    def _drain(self) -> None:
        deadline = time.monotonic() + self.config.graceful_timeout
        while self.engine.admitted and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.engine.admitted:
            log.info("graceful timeout reached; cancelling %d requests", self.engine.admitted)
        self.engine.cancel_all()
        cut = time.monotonic() + 1.0
        while self._sockets and time.monotonic() < cut:
            time.sleep(0.05)
        with self._lock:
            stuck = list(self._sockets.values())
        for sock in stuck:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.engine.shutdown(timeout=2.0)


def _read_body() -> bytes:
    """The whole request body, at most ``MAX_BODY_BYTES`` (413 beyond, with or without Content-Length)."""
    length = request.content_length
    if length is not None and length > MAX_BODY_BYTES:
        raise RequestEntityTooLarge()
    stream = request.environ["wsgi.input"]
    if length is None and "wsgi.input_terminated" not in request.environ:
        return b""  # no length and no server-terminated stream: there is no body
    limit = length if length is not None else MAX_BODY_BYTES + 1
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = stream.read(limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > MAX_BODY_BYTES:
        raise RequestEntityTooLarge()
    return b"".join(chunks)


def create_app(config: ServerConfig | None = None, *, model: Any = None) -> Flask:
    """The Flask app serving one model (§9.1); loads the model from ``config`` when none is given."""
    config = config or ServerConfig()
    config.validate()
    if model is None:
        from hymt import load
        from hymt.cli import resolve_model

        path, profile = resolve_model(config.model_path, config.profile)
        model = load(path, profile, threads=config.threads)
    model.new_session(config.context_size)  # trial session: `context must be between 1 and {n}`
    state = ServerState(config, model)

    app = Flask("hymt")
    app.extensions["hymt"] = state

    @app.before_request
    def _gate() -> Response | None:
        if state.draining:
            return _error_response(ApiError(503, "server_error", "Server is shutting down"))
        if config.api_key and request.path != "/healthz":
            scheme, _, given = request.headers.get("Authorization", "").partition(" ")
            # The scheme is case-insensitive (RFC 9110 §11.1): `bearer KEY` from hand-written clients is fine.
            valid = scheme.lower() == "bearer" and hmac.compare_digest(
                given.encode(), config.api_key.encode()
            )
            if not valid:
                return _error_response(ApiError(401, "authentication_error", "Invalid or missing API key"))
        g.body = _read_body()  # the 1 MiB limit holds on every route, chunked bodies included
        return None

    @app.errorhandler(ApiError)
    def _api_error(error: ApiError) -> Response:
        return _error_response(error)

    @app.errorhandler(HTTPException)
    def _http_error(error: HTTPException) -> Response:
        status = error.code or 500
        headers: dict[str, str] = {}
        if status == 404:
            return _error_response(ApiError(404, "not_found", "Unknown endpoint"))
        if status == 405:
            allow = error.get_response().headers.get("Allow")
            if allow:
                headers["Allow"] = allow
            return _error_response(ApiError(405, "invalid_request_error", "Method not allowed", headers))
        if status == 413:
            message = "Failed to buffer the request body: length limit exceeded"
            return _error_response(ApiError(413, "invalid_request_error", message, {"Connection": "close"}))
        kind = "server_error" if status >= 500 else "invalid_request_error"
        return _error_response(ApiError(status, kind, error.description or error.name))

    @app.errorhandler(Exception)
    def _unexpected(error: Exception) -> Response:
        log.exception("request failed")
        return _error_response(ApiError(500, "server_error", "Internal server error"))

    @app.get("/healthz")
    def _healthz() -> Response:
        return _json_response({"model": config.model_id, "status": "ok"})

    @app.get("/v1/models")
    def _models() -> Response:
        model_entry = {
            "id": config.model_id,
            "object": "model",
            "created": state.started,
            "owned_by": "local",
        }
        return _json_response({"object": "list", "data": [model_entry]})

    @app.post("/v1/chat/completions")
    def _chat() -> Response:
        return _chat_completion(state)

    return app


def _chat_completion(state: ServerState) -> Response:
    config = state.config
    if request.mimetype != "application/json":
        raise ApiError(415, "invalid_request_error", "Expected request with `Content-Type: application/json`")
    try:
        chat = parse_chat_request(parse_json(g.body))
    except ApiError as error:
        log.info("request failed status=%d message=%s", error.status, error.message)
        raise
    if chat.model != config.model_id:
        raise ApiError(
            404, "model_not_found", f"Model {json.dumps(chat.model, ensure_ascii=False)} is not loaded"
        )
    try:
        ticket = state.engine.admit()
    except QueueFull:
        log.info("request failed status=429 message=Request queue is full")
        raise ApiError(429, "rate_limit_error", "Request queue is full", {"Retry-After": "1"}) from None
    except EngineClosed:
        raise ApiError(503, "server_error", "Server is shutting down") from None
    try:
        generation_request = prepare(chat, state.model, config.context_size)
        ticket.start(generation_request)
    except BaseException as exc:
        ticket.close()
        if isinstance(exc, ApiError):
            log.info("request failed status=%d message=%s", exc.status, exc.message)
        raise
    sock = request.environ.get("gunicorn.socket")
    exchange = _Exchange(state, ticket, chat, sock)
    if chat.stream:
        if sock is not None:
            # A small send buffer bounds the kernel memory a stalled client can pin and makes it block the
            # stream's own thread early (it keeps its slot, §9.6); tokens are small, so it never limits speed.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SSE_SEND_BUFFER_BYTES)
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return Response(exchange.sse(), headers=headers, content_type="text/event-stream; charset=utf-8")
    return exchange.json_response()


class _Exchange:
    """One admitted chat request: waits for the ticket's events and turns them into the response."""

    def __init__(
        self, state: ServerState, ticket: Ticket, chat: ChatRequest, sock: socket.socket | None
    ) -> None:
        self.state = state
        self.ticket = ticket
        self.chat = chat
        self.sock = sock
        self.id = state.next_id()
        self.created = 0
        self._last_poll = time.monotonic()
        state.track(id(self), sock)

    def close(self) -> None:
        self.ticket.close()
        self.state.untrack(id(self))

    def wait(self, timeout: float) -> Event | None:
        """The next event within ``timeout`` seconds (None if none); raises ClientGone on disconnect."""
        deadline = time.monotonic() + timeout
        while True:
            now = time.monotonic()
            if self.sock is not None and now - self._last_poll >= DISCONNECT_POLL_SECONDS:
                self._last_poll = now
                if peer_closed(self.sock):
                    raise ClientGone()
            remaining = deadline - now
            if remaining <= 0:
                return None
            event = self.ticket.next_event(min(remaining, DISCONNECT_POLL_SECONDS))
            if event is not None:
                return event

    def log_complete(self) -> None:
        completion = self.ticket.completion
        assert completion is not None
        log.info(
            "request complete request_id=%s prompt_tokens=%d completion_tokens=%d first_token_ms=%.1f total_ms=%.1f",
            self.id,
            completion.usage.prompt_tokens,
            completion.usage.completion_tokens,
            completion.timing.first_token_ms,
            completion.timing.total_ms,
        )

    def json_response(self) -> Response:
        try:
            while True:
                event = self.wait(3600.0)
                if event is None or event.kind in ("started", "delta"):
                    if event is not None and event.kind == "started":
                        self.created = event.value
                    continue
                if event.kind == "done":
                    self.log_complete()
                    return _json_response(self._completion_body())
                message = event.value if event.kind == "error" else "request cancelled"
                log.warning("generation failed request_id=%s error=%s", self.id, message)
                return _error_response(ApiError(500, "server_error", message))
        except ClientGone:
            log.info("request failed request_id=%s error=client disconnected", self.id)
            return _error_response(ApiError(500, "server_error", "request cancelled"))
        finally:
            self.close()

    def _completion_body(self) -> dict[str, Any]:
        completion = self.ticket.completion
        assert completion is not None
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.state.config.model_id,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": completion.text},
                    "finish_reason": completion.finish_reason,
                }
            ],
            "usage": _usage(completion),
        }

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.state.config.model_id,
            "choices": choices,
        }
        if self.chat.include_usage:
            body["usage"] = None
        body.update(extra)
        return _event(body)

    def sse(self) -> _ClosingIterator:
        return _ClosingIterator(self._sse(), self.close)

    def _sse(self) -> Iterator[bytes]:
        ping_every = self.state.config.ping_interval
        # A request still waiting for its slot after a second sends its headers with a first ping, so the
        # client knows it was accepted; after that, pings keep the silence under ``ping_every``.
        last_sent = time.monotonic() - ping_every + min(ping_every, 1.0)
        try:
            while True:
                event = self.wait(max(0.0, last_sent + ping_every - time.monotonic()))
                if event is None:
                    yield b": ping\n\n"
                    last_sent = time.monotonic()
                    continue
                if event.kind == "started":
                    self.created = event.value
                    delta = {"role": "assistant", "content": ""}
                    yield self._chunk([{"index": 0, "delta": delta, "finish_reason": None}])
                elif event.kind == "delta":
                    yield self._chunk(
                        [{"index": 0, "delta": {"content": event.value}, "finish_reason": None}]
                    )
                elif event.kind == "done":
                    completion = self.ticket.completion
                    assert completion is not None
                    finish = {"index": 0, "delta": {}, "finish_reason": completion.finish_reason}
                    yield self._chunk([finish])
                    if self.chat.include_usage:
                        yield self._chunk([], usage=_usage(completion))
                    yield b"data: [DONE]\n\n"
                    self.log_complete()
                    return
                elif event.kind == "error":
                    log.warning("generation failed request_id=%s error=%s", self.id, event.value)
                    yield _event(error_body("server_error", event.value))
                    return
                else:  # cancelled (shutdown): end without [DONE]
                    log.info("request failed request_id=%s error=request cancelled", self.id)
                    return
                last_sent = time.monotonic()
        except ClientGone:
            log.info("request failed request_id=%s error=client disconnected", self.id)
        finally:
            self.close()


class _ClosingIterator:
    """A response body that releases the request when the server closes it, even if never iterated."""

    def __init__(self, events: Iterator[bytes], on_close: Any) -> None:
        self._events = events
        self._on_close = on_close

    def __iter__(self) -> _ClosingIterator:
        return self

    def __next__(self) -> bytes:
        return next(self._events)

    def close(self) -> None:
        try:
            self._events.close()  # type: ignore[attr-defined]
        finally:
            self._on_close()


def _usage(completion: Any) -> dict[str, int]:
    usage = completion.usage
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


def _event(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n\n"
