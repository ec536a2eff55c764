"""The official `openai` Python client against a live `hymt-serve` (REFERENCE §12.9)."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from test_server_live import LiveServer, StalledStream

from hymt.synthetic import write_tiny_fixture

MESSAGES = [{"role": "user", "content": "Hi"}]
API_KEY = "test-key"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = write_tiny_fixture(tmp_path_factory.mktemp("openai") / "tiny.gguf", moe=False, numeric=False)
    live = LiveServer(
        path,
        "--threads",
        "1",
        "--max-concurrent-requests",
        "1",
        "--queue-capacity",
        "0",
        env={"HYMT_API_KEY": API_KEY},
    )
    yield live
    live.stop()


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=30)


def test_create(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model="test", messages=MESSAGES, temperature=0, max_tokens=4)
    assert completion.object == "chat.completion"
    assert completion.model == "test"
    assert completion.id.startswith("chatcmpl-")
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content == "aaaa"
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (5, 4)
    assert completion.usage.total_tokens == 9


def test_stream(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="test", messages=MESSAGES, temperature=0, max_tokens=4, stream=True
    )
    chunks = list(stream)
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == "aaaa"
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(chunk.usage is None for chunk in chunks)


def test_stream_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="test",
        messages=MESSAGES,
        temperature=0,
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 9
    assert all(chunk.usage is None for chunk in chunks[:-1])
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks[:-1]) == "aaaa"


def test_stop_seed_and_max_completion_tokens(client: openai.OpenAI) -> None:
    stopped = client.chat.completions.create(
        model="test", messages=MESSAGES, temperature=0, max_tokens=10, stop=["aaa"], seed=42
    )
    assert stopped.choices[0].message.content == ""
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.usage is not None and stopped.usage.completion_tokens == 3
    limited = client.chat.completions.create(
        model="test", messages=MESSAGES, temperature=0, max_completion_tokens=3, seed=7
    )
    assert limited.choices[0].message.content == "aaa"
    streamed = client.chat.completions.create(
        model="test", messages=MESSAGES, temperature=0, max_completion_tokens=6, stop="aaaaa", stream=True
    )
    assert "".join(chunk.choices[0].delta.content or "" for chunk in streamed) == ""


def test_models(client: openai.OpenAI) -> None:
    assert [model.id for model in client.models.list()] == ["test"]


def test_errors_carry_our_messages(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="test", messages=MESSAGES, temperature=-1, max_tokens=4)
    assert bad.value.status_code == 400
    assert "temperature must be between 0 and 2" in str(bad.value)
    assert (
        isinstance(bad.value.body, dict)
        and bad.value.body["message"] == "temperature must be between 0 and 2"
    )
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="missing", messages=MESSAGES, max_tokens=4)
    assert 'Model "missing" is not loaded' in str(missing.value)
    assert isinstance(missing.value.body, dict) and missing.value.body["type"] == "model_not_found"


def test_rate_limit(server: LiveServer, client: openai.OpenAI) -> None:
    stalled = StalledStream(server, headers={"Authorization": f"Bearer {API_KEY}"})
    try:
        stalled.wait_started()
        with pytest.raises(openai.RateLimitError) as limited:
            client.chat.completions.create(model="test", messages=MESSAGES, temperature=0, max_tokens=4)
        assert "Request queue is full" in str(limited.value)
        assert limited.value.response.headers["Retry-After"] == "1"
    finally:
        stalled.close()


def test_authentication(server: LiveServer) -> None:
    wrong = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model="test", messages=MESSAGES, max_tokens=4)
