"""The HTTP API through Flask's test client (REFERENCE §9, §12.9) and the engine underneath it.

Expected values come from the spec and the §12.1 tiny model, never from the code under test: the tiny
non-numeric model always emits `a`; its template renders `[BOS][USER]<content>[ASSISTANT]`, one token per
special marker and per byte, so a user message of n ASCII bytes gives n + 3 prompt tokens.
"""

from __future__ import annotations

import io
import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import hymt
from hymt.engine import Engine, QueueFull
from hymt.errors import GenerationError, ModelError
from hymt.generation import GenerationRequest
from hymt.sampling import SamplingParams
from hymt.server import MAX_BODY_BYTES, ServerConfig, create_app
from hymt.synthetic import write_tiny_fixture

BASE = {"model": "test", "messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "max_tokens": 4}
URL = "/v1/chat/completions"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = write_tiny_fixture(tmp_path_factory.mktemp("tiny") / "tiny.gguf", moe=False, numeric=False)
    return hymt.load(path, threads=1)


@pytest.fixture(scope="module")
def numeric_model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = write_tiny_fixture(tmp_path_factory.mktemp("numeric") / "numeric.gguf", moe=False, numeric=True)
    return hymt.load(path, threads=1)


class SlowModel:
    """The real model with a pause before every forward, to widen the windows a test aims at."""

    def __init__(self, model: Any, pause: float) -> None:
        self._model = model
        self.pause = pause
        self.forwards = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def forward(self, *args: Any) -> Any:
        self.forwards += 1
        time.sleep(self.pause)
        return self._model.forward(*args)


def make_app(model: Any, **overrides: Any) -> Any:
    settings = {"model_id": "test", "context_size": 2048, "threads": 1, "ping_interval": 0.2}
    settings.update(overrides)
    return create_app(ServerConfig(**settings), model=model)


@pytest.fixture()
def app(tiny_model: Any) -> Iterator[Any]:
    app = make_app(tiny_model)
    yield app
    app.extensions["hymt"].engine.shutdown()


@pytest.fixture()
def client(app: Any) -> Any:
    return app.test_client()


def post(client: Any, body: Any, **kwargs: Any) -> Any:
    return client.post(URL, data=json.dumps(body), content_type="application/json", **kwargs)


def sse_events(data: bytes) -> list[str]:
    text = data.decode("utf-8")
    assert text.endswith("\n\n")
    return [block for block in text[:-2].split("\n\n")]


def data_events(data: bytes) -> list[Any]:
    """The `data:` payloads of an SSE body (comments skipped); `[DONE]` stays a string."""
    out: list[Any] = []
    for block in sse_events(data):
        if block.startswith(":"):
            continue
        assert block.startswith("data: ")
        payload = block[len("data: ") :]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def assert_error(response: Any, status: int, kind: str, message: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.data
    assert response.mimetype == "application/json"
    body = response.get_json()
    assert set(body) == {"error"}
    error = body["error"]
    assert error["type"] == kind and error["code"] == kind and error["param"] is None
    assert isinstance(error["message"], str) and error["message"]
    if message is not None:
        assert error["message"] == message
    return error


# ---- responses ------------------------------------------------------------------------------------------


def test_non_streaming_response(client: Any) -> None:
    response = post(client, BASE)
    assert response.status_code == 200
    body = response.get_json()
    assert body["object"] == "chat.completion"
    assert body["model"] == "test"
    assert body["id"].startswith("chatcmpl-")
    assert abs(body["created"] - time.time()) < 60
    assert body["choices"] == [
        {"index": 0, "message": {"role": "assistant", "content": "aaaa"}, "finish_reason": "length"}
    ]
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}


def test_ids_are_unique_and_follow_the_reference_format(client: Any) -> None:
    ids = [post(client, BASE).get_json()["id"] for _ in range(3)]
    assert len(set(ids)) == 3
    for value in ids:
        prefix, nanos, counter = value.split("-")
        assert prefix == "chatcmpl"
        assert abs(int(nanos, 16) - time.time_ns()) < 60 * 10**9
        int(counter, 16)
    assert [int(v.split("-")[2], 16) for v in ids] == sorted(int(v.split("-")[2], 16) for v in ids)


def test_streaming_with_usage(client: Any) -> None:
    plain = post(client, BASE).get_json()
    response = post(client, {**BASE, "stream": True, "stream_options": {"include_usage": True}})
    assert response.status_code == 200
    assert response.mimetype == "text/event-stream"
    assert response.headers["Content-Type"] == "text/event-stream; charset=utf-8"
    assert response.headers["Cache-Control"] == "no-cache"
    assert response.headers["X-Accel-Buffering"] == "no"
    events = data_events(response.data)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({(c["id"], c["created"], c["model"]) for c in chunks}) == 1
    assert chunks[0]["model"] == "test"
    assert chunks[0]["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
    ]
    deltas = chunks[1:-2]
    assert all(
        c["choices"][0]["finish_reason"] is None and c["choices"][0]["delta"]["content"] for c in deltas
    )
    assert "".join(c["choices"][0]["delta"]["content"] for c in deltas) == "aaaa"
    assert chunks[-2]["choices"] == [{"index": 0, "delta": {}, "finish_reason": "length"}]
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == plain["usage"]


def test_streaming_without_usage_has_no_usage_key(client: Any) -> None:
    response = post(client, {**BASE, "stream": True})
    events = data_events(response.data)
    assert events[-1] == "[DONE]"
    assert all("usage" not in c for c in events[:-1])
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in events[:-1])
    assert text == "aaaa"


def test_stop_string_and_streamed_text_match_non_streamed(client: Any) -> None:
    body = {**BASE, "max_tokens": 10, "stop": ["aaa"]}
    plain = post(client, body).get_json()
    assert plain["choices"][0]["message"]["content"] == ""
    assert plain["choices"][0]["finish_reason"] == "stop"
    assert plain["usage"]["completion_tokens"] == 3
    body = {**BASE, "max_tokens": 10, "stop": "aaab"}
    plain = post(client, body).get_json()
    events = data_events(post(client, {**body, "stream": True}).data)
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in events[:-1])
    assert streamed == plain["choices"][0]["message"]["content"] == "a" * 10


def test_content_parts_are_concatenated(client: Any) -> None:
    parts = [{"type": "text", "text": "He"}, {"type": "text", "text": "llo"}]
    response = post(client, {**BASE, "messages": [{"role": "user", "content": parts}]})
    assert response.status_code == 200
    assert response.get_json()["usage"]["prompt_tokens"] == 3 + len("Hello")


def test_null_means_absent(client: Any) -> None:
    nulls = dict.fromkeys(
        ["stream", "stream_options", "max_completion_tokens", "n", "top_p", "top_k", "repetition_penalty"]
    )
    response = post(client, {**BASE, **nulls, "seed": None, "stop": None})
    assert response.status_code == 200
    assert response.get_json()["choices"][0]["message"]["content"] == "aaaa"
    response = post(client, {**BASE, "max_tokens": None, "max_completion_tokens": 3})
    assert response.get_json()["usage"]["completion_tokens"] == 3


def test_accepted_optional_fields(client: Any) -> None:
    body = {
        **BASE,
        "n": 1,
        "seed": 2**64 - 1,
        "top_k": 1,
        "top_p": 1,
        "repetition_penalty": 1.0,
        "temperature": 0.5,
        "stop": [],
        "stream": False,
    }
    response = post(client, body)
    assert response.status_code == 200, response.data
    assert response.get_json()["choices"][0]["message"]["content"] == "aaaa"


def test_default_output_limit_fills_the_context(tiny_model: Any) -> None:
    app = make_app(tiny_model, context_size=32)
    try:
        body = {k: v for k, v in BASE.items() if k != "max_tokens"}
        usage = post(app.test_client(), body).get_json()["usage"]
        assert usage == {"prompt_tokens": 5, "completion_tokens": 27, "total_tokens": 32}
    finally:
        app.extensions["hymt"].engine.shutdown()


def test_models_and_healthz(client: Any) -> None:
    models = client.get("/v1/models")
    assert models.status_code == 200
    body = models.get_json()
    assert body["object"] == "list"
    assert body["data"][0]["id"] == "test"
    assert body["data"][0]["object"] == "model" and body["data"][0]["owned_by"] == "local"
    assert isinstance(body["data"][0]["created"], int)
    health = client.get("/healthz")
    assert health.status_code == 200 and health.get_json() == {"model": "test", "status": "ok"}


# ---- validation (§9.3–9.5) ------------------------------------------------------------------------------

VALIDATION = [
    ({"temperature": -1}, "temperature must be between 0 and 2"),
    ({"temperature": 2.5}, "temperature must be between 0 and 2"),
    ({"top_p": 0}, "top_p must be in (0, 1]"),
    ({"top_p": 1.5}, "top_p must be in (0, 1]"),
    ({"top_k": -2}, "top_k must be -1, 0, or a positive integer"),
    ({"repetition_penalty": 0}, "repetition_penalty must be positive and finite"),
    ({"max_tokens": 10000}, "prompt plus output limit exceeds the configured context size"),
    ({"max_tokens": 0}, "output token limit must be positive"),
    ({"n": 2}, "only n=1 is supported"),
    ({"n": 0}, "only n=1 is supported"),
    ({"stop": ""}, "stop strings must contain 1..=4096 UTF-8 bytes"),
    ({"stop": ["a", ""]}, "stop strings must contain 1..=4096 UTF-8 bytes"),
    ({"stop": ["é" * 2049]}, "stop strings must contain 1..=4096 UTF-8 bytes"),
    ({"stop": ["1", "2", "3", "4", "5"]}, "at most four stop strings are supported"),
    ({"max_completion_tokens": 3}, "provide only one of max_tokens and max_completion_tokens"),
    ({"stream_options": {"include_usage": True}}, "stream_options requires stream=true"),
    ({"stream": False, "stream_options": {}}, "stream_options requires stream=true"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        "only text content parts are supported",
    ),
    ({"messages": []}, "messages must not be empty"),
    (
        {"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]},
        "system message must be first",
    ),
    (
        {"messages": [{"role": "user", "content": "x" * 2045}]},
        "prompt leaves no output space in the configured context",
    ),
]


@pytest.mark.parametrize(("change", "message"), VALIDATION)
def test_validation_messages(client: Any, change: dict[str, Any], message: str) -> None:
    assert_error(post(client, {**BASE, **change}), 400, "invalid_request_error", message)


def test_validation_order(client: Any) -> None:
    # n is checked before the output limits, which come before stream_options and content parts.
    body = {**BASE, "n": 3, "max_completion_tokens": 2, "stream_options": {}, "temperature": -1}
    assert_error(post(client, body), 400, "invalid_request_error", "only n=1 is supported")
    body = {**BASE, "max_completion_tokens": 2, "stream_options": {}}
    message = "provide only one of max_tokens and max_completion_tokens"
    assert_error(post(client, body), 400, "invalid_request_error", message)
    body = {**BASE, "max_tokens": 0, "temperature": -1, "messages": []}
    assert_error(post(client, body), 400, "invalid_request_error", "messages must not be empty")
    body = {**BASE, "max_tokens": 0, "temperature": -1}
    assert_error(post(client, body), 400, "invalid_request_error", "temperature must be between 0 and 2")


def test_unknown_model(client: Any) -> None:
    assert_error(
        post(client, {**BASE, "model": "missing"}), 404, "model_not_found", 'Model "missing" is not loaded'
    )
    error = assert_error(post(client, {**BASE, "model": 'a"b'}), 404, "model_not_found")
    assert error["message"] == 'Model "a\\"b" is not loaded'


def test_schema_checked_before_model(client: Any) -> None:
    error = assert_error(
        post(client, {**BASE, "model": "missing", "tools": []}), 400, "invalid_request_error"
    )
    assert "tools" in error["message"]


SCHEMA = [
    ({"tools": []}, "tools"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"logprobs": True}, "logprobs"),
    ({"user": "u"}, "user"),
    ({"presence_penalty": 0}, "presence_penalty"),
    ({"model": 1}, "model"),
    ({"messages": {}}, "messages"),
    ({"messages": ["Hi"]}, "messages[0]"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "role"),
    ({"messages": [{"role": 1, "content": "x"}]}, "role"),
    ({"messages": [{"role": "user"}]}, "content"),
    ({"messages": [{"content": "x"}]}, "role"),
    ({"messages": [{"role": "user", "content": "x", "name": "n"}]}, "name"),
    ({"messages": [{"role": "user", "content": None}]}, "content"),
    ({"messages": [{"role": "user", "content": 5}]}, "content"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "extra": 1}]}]}, "extra"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]}, "text"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "text"),
    ({"messages": [{"role": "user", "content": [{"text": "x"}]}]}, "type"),
    ({"messages": [{"role": "user", "content": ["x"]}]}, "content[0]"),
    ({"stream": "yes"}, "stream"),
    ({"stream": 1}, "stream"),
    ({"stream_options": {"include_usage": True, "other": 1}}, "other"),
    ({"stream_options": {"include_usage": "yes"}}, "include_usage"),
    ({"stream_options": []}, "stream_options"),
    ({"max_tokens": 1.0}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_tokens": "4"}, "max_tokens"),
    ({"max_tokens": 2**64}, "max_tokens"),
    ({"max_tokens": 10**30}, "max_tokens"),
    ({"max_completion_tokens": 1.5}, "max_completion_tokens"),
    ({"n": 1.0}, "n"),
    ({"temperature": True}, "temperature"),
    ({"temperature": "0"}, "temperature"),
    ({"temperature": 10**400}, "temperature"),
    ({"top_p": [1]}, "top_p"),
    ({"repetition_penalty": False}, "repetition_penalty"),
    ({"top_k": 2**31}, "top_k"),
    ({"top_k": -(2**31) - 1}, "top_k"),
    ({"top_k": 1.0}, "top_k"),
    ({"seed": -1}, "seed"),
    ({"seed": 2**64}, "seed"),
    ({"seed": 1.5}, "seed"),
    ({"stop": 1}, "stop"),
    ({"stop": [1]}, "stop"),
    ({"stop": ["a", None]}, "stop"),
]


@pytest.mark.parametrize(("change", "field"), SCHEMA)
def test_schema_errors_name_the_field(client: Any, change: dict[str, Any], field: str) -> None:
    error = assert_error(post(client, {**BASE, **change}), 400, "invalid_request_error")
    assert error["message"].startswith("Failed to deserialize the JSON body into the target type: ")
    assert field in error["message"]


@pytest.mark.parametrize("missing", ["model", "messages"])
def test_missing_required_field(client: Any, missing: str) -> None:
    body = {k: v for k, v in BASE.items() if k != missing}
    error = assert_error(post(client, body), 400, "invalid_request_error")
    assert error["message"].startswith("Failed to deserialize the JSON body into the target type: ")
    assert missing in error["message"]


@pytest.mark.parametrize(
    "raw",
    [
        b"{bad",
        b"",
        b'{"model": "test",}',
        b'{"model":"test","messages":[],"temperature":NaN}',
        b'{"model":"test","messages":[],"temperature":Infinity}',
        b'{"model":"test","messages":[],"temperature":-Infinity}',
        b'{"model":"test","messages":[],"temperature":1e999}',
        b'{"model":"test","messages":[],"max_tokens":' + b"9" * 5000 + b"}",
        b"[" * 100000 + b"]" * 100000,
        b'{"a":' * 50000 + b"1" + b"}" * 50000,
        b'{"model":"\xff\xfe"}',
        b'{"model":"\xed\xa0\x80"}',
        b"\xef\xbb\xbf{}",
        b'{"model":"test"} trailing',
    ],
)
def test_malformed_json(client: Any, raw: bytes) -> None:
    response = client.post(URL, data=raw, content_type="application/json")
    error = assert_error(response, 400, "invalid_request_error")
    assert error["message"].startswith("Failed to parse the request body as JSON: ")
    assert client.get("/healthz").status_code == 200


def test_byte_order_mark_is_named_without_python_advice(client: Any) -> None:
    # What PowerShell's Out-File and some Windows editors write; the RFC 8259 text has no BOM.
    raw = b"\xef\xbb\xbf" + json.dumps(BASE).encode()
    error = assert_error(
        client.post(URL, data=raw, content_type="application/json"), 400, "invalid_request_error"
    )
    assert error["message"] == (
        "Failed to parse the request body as JSON: unexpected byte order mark (BOM) at line 1 column 1"
    )


def test_huge_integer_is_out_of_range_without_python_advice(client: Any) -> None:
    raw = b'{"model":"test","messages":[],"max_tokens":1' + b"0" * 5000 + b"}"
    error = assert_error(
        client.post(URL, data=raw, content_type="application/json"), 400, "invalid_request_error"
    )
    assert error["message"] == "Failed to parse the request body as JSON: number out of range"


@pytest.mark.parametrize("raw", [b"[]", b"1", b'"x"', b"null"])
def test_non_object_body(client: Any, raw: bytes) -> None:
    error = assert_error(
        client.post(URL, data=raw, content_type="application/json"), 400, "invalid_request_error"
    )
    assert error["message"].startswith("Failed to deserialize the JSON body into the target type: ")


def test_duplicate_field_is_rejected(client: Any) -> None:
    raw = b'{"model":"test","model":"test","messages":[{"role":"user","content":"Hi"}]}'
    error = assert_error(
        client.post(URL, data=raw, content_type="application/json"), 400, "invalid_request_error"
    )
    assert "duplicate field `model`" in error["message"]


@pytest.mark.parametrize(
    "content_type", [None, "text/plain", "application/x-www-form-urlencoded", "application/jsonx"]
)
def test_wrong_content_type(client: Any, content_type: str | None) -> None:
    headers = {} if content_type is None else {"Content-Type": content_type}
    response = client.post(URL, data=json.dumps(BASE), headers=headers)
    assert_error(
        response, 415, "invalid_request_error", "Expected request with `Content-Type: application/json`"
    )


def test_content_type_with_parameters(client: Any) -> None:
    response = client.post(URL, data=json.dumps(BASE), content_type="application/json; charset=utf-8")
    assert response.status_code == 200


def test_body_over_one_mebibyte(client: Any) -> None:
    message = "Failed to buffer the request body: length limit exceeded"
    big = json.dumps({**BASE, "messages": [{"role": "user", "content": "x" * (2 << 20)}]})
    assert_error(post_raw(client, big.encode()), 413, "invalid_request_error", message)
    assert_error(client.get("/healthz", data=b"x" * (2 << 20)), 413, "invalid_request_error", message)
    # Chunked (no Content-Length): the limit applies while reading.
    response = client.post(
        URL,
        input_stream=io.BytesIO(big.encode()),
        content_type="application/json",
        environ_overrides={"wsgi.input_terminated": True},
        headers={"Transfer-Encoding": "chunked"},
    )
    assert_error(response, 413, "invalid_request_error", message)
    # Exactly at the limit is accepted (and then fails only as JSON).
    at_limit = b" " * (MAX_BODY_BYTES - 2) + b"{}"
    error = assert_error(post_raw(client, at_limit), 400, "invalid_request_error")
    assert "missing field" in error["message"]


def post_raw(client: Any, raw: bytes) -> Any:
    return client.post(URL, data=raw, content_type="application/json")


def test_unknown_path_and_wrong_method(client: Any) -> None:
    assert_error(client.get("/nope"), 404, "not_found", "Unknown endpoint")
    assert_error(client.post("/v1/completions", json=BASE), 404, "not_found", "Unknown endpoint")
    response = client.get(URL)
    assert_error(response, 405, "invalid_request_error", "Method not allowed")
    assert "POST" in response.headers["Allow"]
    response = client.post("/v1/models")
    assert_error(response, 405, "invalid_request_error", "Method not allowed")
    assert "GET" in response.headers["Allow"]
    assert_error(client.delete("/healthz"), 405, "invalid_request_error", "Method not allowed")


# ---- generation failures ---------------------------------------------------------------------------------

# float32(1e-45) is the smallest subnormal: dividing the positive logit of an already sampled `a` by it
# overflows, so the second step fails with the sampler's message after one `a` was released.
OVERFLOW = {**BASE, "temperature": 0, "repetition_penalty": 1e-45}


def test_generation_error_is_a_500(client: Any) -> None:
    message = "repetition_penalty overflowed the logits"
    assert_error(post(client, OVERFLOW), 500, "server_error", message)


def test_generation_error_in_stream(client: Any) -> None:
    response = post(client, {**OVERFLOW, "stream": True})
    assert response.status_code == 200
    events = data_events(response.data)
    assert "[DONE]" not in events
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[1]["choices"][0]["delta"] == {"content": "a"}
    assert events[-1] == {
        "error": {
            "message": "repetition_penalty overflowed the logits",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }


# ---- authentication -----------------------------------------------------------------------------------


def test_api_key(tiny_model: Any) -> None:
    app = make_app(tiny_model, api_key="sekret")
    try:
        client = app.test_client()
        assert client.get("/healthz").status_code == 200
        assert_error(client.get("/v1/models"), 401, "authentication_error")
        assert_error(post(client, BASE), 401, "authentication_error")
        wrong = {"Authorization": "Bearer nope"}
        assert_error(post(client, BASE, headers=wrong), 401, "authentication_error")
        good = {"Authorization": "Bearer sekret"}
        assert client.get("/v1/models", headers=good).status_code == 200
        assert post(client, BASE, headers=good).get_json()["choices"][0]["message"]["content"] == "aaaa"
        # The auth scheme is case-insensitive (RFC 9110 §11.1); the key itself is not.
        for header in ("bearer sekret", "BEARER sekret"):
            assert client.get("/v1/models", headers={"Authorization": header}).status_code == 200
        for header in ("Bearer SEKRET", "Basic sekret", "sekret", "Bearer", "Bearer sekret2", "Bearersekret"):
            assert_error(
                client.get("/v1/models", headers={"Authorization": header}), 401, "authentication_error"
            )
    finally:
        app.extensions["hymt"].engine.shutdown()


# ---- admission, queueing, shutdown ----------------------------------------------------------------------


def test_queue_full_is_429(tiny_model: Any) -> None:
    app = make_app(tiny_model, max_concurrent_requests=1, queue_capacity=1)
    engine = app.extensions["hymt"].engine
    try:
        held = [engine.admit(), engine.admit()]
        with pytest.raises(QueueFull):
            engine.admit()
        client = app.test_client()
        # Schema and model errors come before admission; everything else waits for a permit.
        assert_error(post(client, {**BASE, "model": "x"}), 404, "model_not_found")
        response = post(client, {**BASE, "n": 2})
        assert_error(response, 429, "rate_limit_error", "Request queue is full")
        assert response.headers["Retry-After"] == "1"
        assert client.get("/healthz").status_code == 200
        held[0].close()
        assert post(client, BASE).status_code == 200
        held[1].close()
        assert engine.admitted == 0 and engine.active == 0
    finally:
        engine.shutdown()


def test_shutdown_refuses_new_requests(tiny_model: Any) -> None:
    app = make_app(tiny_model, graceful_timeout=0.5)
    state = app.extensions["hymt"]
    client = app.test_client()
    assert post(client, BASE).status_code == 200
    state.begin_shutdown().join(10)
    for response in (post(client, BASE), client.get("/healthz"), client.get("/v1/models")):
        assert_error(response, 503, "server_error", "Server is shutting down")


def test_shutdown_cancels_streams_after_the_graceful_timeout(tiny_model: Any) -> None:
    slow = SlowModel(tiny_model, 0.02)
    app = make_app(slow, graceful_timeout=0.3)
    state = app.extensions["hymt"]
    response = post(app.test_client(), {**BASE, "max_tokens": 2000, "stream": True}, buffered=False)
    chunks = iter(response.response)
    first = next(chunks)
    assert b'"role":"assistant"' in first
    started = time.monotonic()
    drain = state.begin_shutdown()
    rest = b"".join(chunks)
    assert time.monotonic() - started < 5
    assert b"[DONE]" not in rest
    response.close()
    drain.join(10)
    assert state.engine.admitted == 0


def test_streams_send_pings_while_queued(tiny_model: Any) -> None:
    app = make_app(tiny_model, max_concurrent_requests=1, queue_capacity=1, ping_interval=0.05)
    engine = app.extensions["hymt"].engine
    try:
        blocker = engine.submit(request_for(tiny_model, [256, 257, 72, 258], 4))
        response = post(app.test_client(), {**BASE, "stream": True}, buffered=False)
        chunks = iter(response.response)
        assert next(chunks) == b": ping\n\n"
        assert next(chunks) == b": ping\n\n"
        assert engine.admitted == 2 and engine.active == 1
        blocker.close()  # its slot goes to the queued stream
        events = data_events(b"".join(chunks))
        assert events[-1] == "[DONE]"
        assert "".join(c["choices"][0]["delta"].get("content", "") for c in events[:-1]) == "aaaa"
        response.close()
        assert engine.admitted == 0 and engine.active == 0
    finally:
        engine.shutdown()


def test_closing_a_stream_early_frees_its_permits(tiny_model: Any) -> None:
    slow = SlowModel(tiny_model, 0.01)
    app = make_app(slow)
    engine = app.extensions["hymt"].engine
    try:
        response = post(app.test_client(), {**BASE, "max_tokens": 2000, "stream": True}, buffered=False)
        chunks = iter(response.response)
        next(chunks)
        next(chunks)
        assert engine.active == 1
        response.close()  # what the WSGI server does when the client goes away
        wait_until(lambda: engine.admitted == 0 and engine.active == 0)
        assert slow.forwards < 500
    finally:
        engine.shutdown()


# ---- the engine -----------------------------------------------------------------------------------------


def request_for(model: Any, prompt: list[int], max_tokens: int, **sampling: Any) -> GenerationRequest:
    params = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, **sampling}
    return GenerationRequest(prompt_ids=prompt, max_tokens=max_tokens, sampling=SamplingParams(**params))


def wait_until(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_engine_plain_api(tiny_model: Any) -> None:
    engine = Engine(tiny_model, max_concurrent=2, queue_capacity=0, context=64)
    try:
        with engine.submit(request_for(tiny_model, [256, 257, 72, 258], 5)) as ticket:
            assert "".join(ticket) == "aaaaa"
            assert ticket.completion is not None
            assert ticket.completion.finish_reason == "length"
            assert ticket.completion.usage.completion_tokens == 5
            assert ticket.created is not None
        assert engine.admitted == 0 and engine.active == 0
    finally:
        engine.shutdown()


def test_engine_logs_each_step_at_debug(tiny_model: Any, caplog: pytest.LogCaptureFixture) -> None:
    # One line per forward: the prompt in one step, then one decode token per step (the first output token
    # comes from the prompt's logits, so 3 tokens take 2 decode steps).
    caplog.set_level(logging.DEBUG, logger="hymt.engine")
    engine = Engine(tiny_model, max_concurrent=1, queue_capacity=0, context=64, prompt_cache=False)
    try:
        with engine.submit(request_for(tiny_model, [256, 257, 72, 258], 3)) as ticket:
            ticket.result()
    finally:
        engine.shutdown()
    steps = [r.getMessage() for r in caplog.records if r.getMessage().startswith("engine step ")]
    assert [s.rsplit(" forward_ms=", 1)[0] for s in steps] == [
        "engine step sequences=1 prompt_tokens=4 decode_tokens=0",
        "engine step sequences=1 prompt_tokens=0 decode_tokens=1",
        "engine step sequences=1 prompt_tokens=0 decode_tokens=1",
    ]
    assert all(float(s.rsplit("=", 1)[1]) >= 0 for s in steps)


class BatchLog:
    """The model, recording the tokens of each sequence of every forward."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self.batches: list[list[int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def forward(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        self.batches.append([len(tokens) for _, tokens in batch])
        return self._model.forward(batch, *args, **kwargs)


def test_engine_prefills_requests_being_prepared_with_the_one_that_started(
    tiny_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request that starts while others are admitted but not started (their prompts still being rendered
    and tokenized) waits for them: all the prompts go into one forward."""
    monkeypatch.setattr(hymt.engine, "PREPARE_WAIT_SECONDS", 5.0)  # ends as soon as they start
    log = BatchLog(tiny_model)
    engine = Engine(log, max_concurrent=3, queue_capacity=0, context=64, prompt_cache=False)
    prompts = [[256, 257, 72, 258], [256, 72, 258], [256, 257, 257, 72, 258]]
    try:
        tickets = [engine.admit() for _ in prompts]
        tickets[0].start(request_for(tiny_model, prompts[0], 2))
        time.sleep(0.05)  # long enough for the engine to have started a forward of its own
        for ticket, prompt in zip(tickets[1:], prompts[1:], strict=True):
            ticket.start(request_for(tiny_model, prompt, 2))
        for ticket in tickets:
            assert ticket.result().text == "aa"
            ticket.close()
    finally:
        engine.shutdown()
    assert log.batches[0] == [4, 3, 5]


def test_engine_waits_for_clients_answered_together(tiny_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a step that finished two requests, a new prompt waits (RETURN_WAIT_SECONDS) for a second one,
    so both are prefilled in one forward; after a step that finished one, nothing waits."""
    monkeypatch.setattr(hymt.engine, "RETURN_WAIT_SECONDS", 5.0)  # ends as soon as the second arrives
    log = BatchLog(tiny_model)
    engine = Engine(log, max_concurrent=2, queue_capacity=0, context=64, prompt_cache=False)
    prompt = [256, 257, 72, 258]
    try:
        for _ in range(2):  # a lone answer, then a lone request: no 5 s wait
            started = time.monotonic()
            with engine.submit(request_for(tiny_model, prompt, 3)) as ticket:
                ticket.result()
            assert time.monotonic() - started < 4.0
        pair = [engine.admit() for _ in range(2)]
        for ticket in pair:
            ticket.start(request_for(tiny_model, prompt, 3))
        for ticket in pair:
            ticket.result()
            ticket.close()
        assert log.batches[-1] == [1, 1]  # both finished in the same step
        log.batches.clear()
        first = engine.submit(request_for(tiny_model, prompt, 3))
        time.sleep(0.05)
        second = engine.submit(request_for(tiny_model, [256, 72, 258], 3))
        for ticket in (first, second):
            ticket.result()
            ticket.close()
        assert log.batches[0] == [4, 3]
    finally:
        engine.shutdown()


def test_engine_admission_and_fifo(tiny_model: Any) -> None:
    slow = SlowModel(tiny_model, 0.01)
    engine = Engine(slow, max_concurrent=1, queue_capacity=2, context=512)
    try:
        first = engine.submit(request_for(tiny_model, [256, 72, 258], 100))
        second = engine.submit(request_for(tiny_model, [256, 72, 258], 3))
        third = engine.submit(request_for(tiny_model, [256, 72, 258], 3))
        with pytest.raises(QueueFull):
            engine.admit()
        assert engine.active == 1 and engine.admitted == 3
        assert second.state == "queued" and third.state == "queued"
        assert first.result().text == "a" * 100
        # The finished ticket keeps its slot until its owner closes it.
        assert second.state == "queued"
        first.close()
        assert second.result().text == "aaa"
        second.close()
        assert third.result().text == "aaa"
        third.close()
        assert engine.admitted == 0 and engine.active == 0
    finally:
        engine.shutdown()


@pytest.mark.parametrize("phase", ["queued", "prefill", "decode"])
def test_engine_cancellation_frees_permits(tiny_model: Any, phase: str) -> None:
    slow = SlowModel(tiny_model, 0.02)
    engine = Engine(slow, max_concurrent=1, queue_capacity=1, context=2048, prefill_chunk=16)
    try:
        long_prompt = [256] + [97] * 1500 + [258]
        if phase == "queued":
            blocker = engine.submit(request_for(tiny_model, [256, 72, 258], 500))
            victim = engine.submit(request_for(tiny_model, [256, 72, 258], 5))
            assert victim.state == "queued"
            victim.close()
            assert engine.admitted == 1
            blocker.close()
        else:
            prompt = long_prompt if phase == "prefill" else [256, 72, 258]
            victim = engine.submit(request_for(tiny_model, prompt, 500))
            assert victim.next_event(5).kind == "started"
            if phase == "decode":
                assert victim.next_event(5).kind == "delta"
            time.sleep(0.1)
            victim.close()
        wait_until(lambda: engine.admitted == 0 and engine.active == 0, timeout=2.0)
        assert slow.forwards < 200
    finally:
        engine.shutdown()


def test_engine_batches_requests_into_one_forward(tiny_model: Any) -> None:
    class Recording(SlowModel):
        def __init__(self, model: Any) -> None:
            super().__init__(model, 0.0)
            self.batch_sizes: list[int] = []

        def forward(self, batch: Any) -> Any:
            self.batch_sizes.append(len(batch))
            return super().forward(batch)

    recording = Recording(tiny_model)
    engine = Engine(recording, max_concurrent=4, queue_capacity=0, context=256)
    try:
        gate = engine.admit()  # start all four at once: admitted and queued before any runs
        tickets = [engine.admit() for _ in range(3)]
        for ticket in [gate, *tickets]:
            ticket.start(request_for(tiny_model, [256, 72, 258], 20))
        for ticket in [gate, *tickets]:
            assert ticket.result().text == "a" * 20
            ticket.close()
        assert max(recording.batch_sizes) == 4
        assert len(recording.batch_sizes) < 4 * 20
    finally:
        engine.shutdown()


def test_parallel_outputs_equal_solo_outputs(numeric_model: Any) -> None:
    """8 requests with different prompts and seeds give, batched together, exactly what each gives alone."""
    app = make_app(numeric_model, max_concurrent_requests=8, queue_capacity=0)
    try:
        client = app.test_client()
        bodies = [
            {
                "model": "test",
                "messages": [{"role": "user", "content": f"Request {i}: " + "xyz" * i}],
                "temperature": 0.9,
                "top_k": 50,
                "top_p": 0.95,
                "seed": 1000 + i,
                "max_tokens": 24,
                "stream": i % 2 == 0,
            }
            for i in range(8)
        ]

        def run(body: dict[str, Any]) -> str:
            response = post(app.test_client(), body)
            assert response.status_code == 200
            if body["stream"]:
                events = data_events(response.data)
                return "".join(c["choices"][0]["delta"].get("content", "") for c in events[:-1])
            return response.get_json()["choices"][0]["message"]["content"]

        solo = [run(body) for body in bodies]
        assert len(set(solo)) > 1  # the seeds and prompts matter, so equality below means something
        together: list[str | None] = [None] * 8
        barrier = threading.Barrier(8)

        def worker(i: int) -> None:
            barrier.wait()
            together[i] = run(bodies[i])

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert together == solo
        assert post(client, bodies[1]).get_json()["choices"][0]["message"]["content"] == solo[1]
    finally:
        app.extensions["hymt"].engine.shutdown()


def test_engine_survives_a_failing_forward(tiny_model: Any) -> None:
    class FailingOnce(SlowModel):
        def forward(self, *args: Any) -> Any:
            if self.forwards == 0:
                self.forwards += 1
                raise ModelError("simulated forward failure")
            return super().forward(*args)

    engine = Engine(FailingOnce(tiny_model, 0.0), max_concurrent=2, queue_capacity=0, context=64)
    try:
        with engine.submit(request_for(tiny_model, [256, 72, 258], 4)) as failed:
            with pytest.raises(GenerationError, match="^simulated forward failure$"):
                failed.result()
        with engine.submit(request_for(tiny_model, [256, 72, 258], 4)) as ticket:
            assert ticket.result().text == "aaaa"
        assert engine.admitted == 0 and engine.active == 0
    finally:
        engine.shutdown()


def test_engine_prefill_packing_while_decoding(tiny_model: Any) -> None:
    """While a request decodes, short prompts share one step and a long prompt goes in 256-token chunks
    one per step, cut at the same places as when it runs alone."""

    class Recording(SlowModel):
        def __init__(self, model: Any) -> None:
            super().__init__(model, 0.02)
            self.steps: list[list[int]] = []

        def forward(self, batch: Any) -> Any:
            self.steps.append(sorted(len(tokens) for _, tokens in batch))
            return super().forward(batch)

    recording = Recording(tiny_model)
    # without the prompt cache: these prompts share their first tokens, which would shorten the chunks
    engine = Engine(recording, max_concurrent=5, queue_capacity=0, context=2048, prompt_cache=False)
    try:
        decoder = engine.submit(request_for(tiny_model, [256, 72, 258], 200))
        assert decoder.next_event(5).kind == "started"
        assert decoder.next_event(5).kind == "delta"
        short = [request_for(tiny_model, [256] + [72] * 8 + [258], 5) for _ in range(3)]
        long = request_for(tiny_model, [256] + [72] * 598 + [258], 5)
        tickets = [engine.submit(request) for request in [*short, long]]
        for ticket in tickets:
            assert ticket.result().text == "aaaaa"
            ticket.close()
        decoder.cancel()
        decoder.close()
        steps = recording.steps
        first = steps.index([1, 10, 10, 10])
        assert steps[first + 1 : first + 4] == [[1, 1, 1, 1, 256], [1, 1, 1, 1, 256], [1, 1, 1, 1, 88]]
        wait_until(lambda: engine.admitted == 0 and engine.active == 0)
    finally:
        engine.shutdown()


def test_random_bodies_never_cause_a_server_error(client: Any) -> None:
    """Seeded mutations of the base request: every answer is 200 or a 4xx in the error shape."""
    import random

    rng = random.Random(1234)
    values: list[Any] = [
        None, True, False, 0, 1, -1, 3, 2**31, 2**64, -(2**70), 0.5, -0.0, 1e308, "", "x", "test", "é\x00",
        [], [1], ["a"], [None], {}, {"a": 1}, {"include_usage": True}, {"type": "text", "text": "x"},
        [{"role": "user", "content": "x"}], [{"role": "user", "content": [{"type": "text", "text": "y"}]}],
    ]  # fmt: skip
    fields = [*BASE, "stream", "stream_options", "max_completion_tokens", "n", "top_p", "top_k"]
    fields += ["repetition_penalty", "seed", "stop", "tools", "messages"]
    for _ in range(300):
        body: dict[str, Any] = json.loads(json.dumps(BASE))
        for _ in range(rng.randint(1, 3)):
            choice = rng.random()
            if choice < 0.6:
                body[rng.choice(fields)] = json.loads(json.dumps(rng.choice(values)))  # a fresh copy
            elif choice < 0.8:
                message = (
                    body["messages"][0]
                    if body.get("messages") and isinstance(body["messages"], list)
                    else None
                )
                if isinstance(message, dict):
                    message[rng.choice(["role", "content", "name"])] = json.loads(
                        json.dumps(rng.choice(values))
                    )
            else:
                body.pop(rng.choice(list(body) or ["model"]), None)
        for key in ("max_tokens", "max_completion_tokens"):  # keep generations short, schema errors intact
            value = body.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and 8 < value < 2**64:
                body[key] = 8
        response = post(client, body)
        if response.status_code != 200:
            assert 400 <= response.status_code < 500, (body, response.data)
            assert_error(response, response.status_code, response.get_json()["error"]["type"])
    assert client.get("/healthz").status_code == 200


def test_engine_pauses_a_request_nobody_reads(tiny_model: Any) -> None:
    counting = SlowModel(tiny_model, 0.0)
    engine = Engine(counting, max_concurrent=2, queue_capacity=0, context=256, max_undelivered=4)
    try:
        unread = engine.submit(request_for(tiny_model, [256, 72, 258], 100))
        time.sleep(0.3)
        paused_at = counting.forwards
        assert paused_at <= 6  # started + deltas up to the limit, then nothing more is computed
        with engine.submit(request_for(tiny_model, [256, 72, 258], 20)) as other:
            assert other.result().text == "a" * 20  # the paused request holds up nobody
        assert unread.result().text == "a" * 100  # reading resumes it
        unread.close()
        assert engine.admitted == 0 and engine.active == 0
    finally:
        engine.shutdown()
