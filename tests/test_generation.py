"""Text assembler (§8.4), generation loop (§8.3) and request validation (§8.1)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from hymt.errors import GenerationError
from hymt.generation import Completion, Generation, GenerationRequest, TextAssembler, generate
from hymt.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0, top_p=1.0, top_k=-1, repetition_penalty=1.0)

# ---------------------------------------------------------------------------------------------------------
# Text assembler


def test_stop_split_at_every_byte_position():
    data = "你好世界STOPignored".encode()
    for cut in range(len(data) + 1):
        assembler = TextAssembler(["STOP"])
        deltas = [assembler.push(data[:cut]), assembler.push(data[cut:]), assembler.finish()]
        assert "".join(deltas) == "你好世界", cut
        assert assembler.text == "你好世界"
        assert assembler.stopped


def test_stop_split_into_single_bytes():
    assembler = TextAssembler(["STOP"])
    deltas = [assembler.push(bytes([b])) for b in "你好世界STOPignored".encode()] + [assembler.finish()]
    assert "".join(deltas) == "你好世界"
    # Nothing is released before a character is complete, and nothing of the stop string ever.
    assert all("S" not in d for d in deltas)


def test_partial_stop_is_held_then_flushed():
    assembler = TextAssembler(["END"])
    assert assembler.push(b"hello E") == "hello "
    assert assembler.finish() == "E"
    assert not assembler.stopped


def test_invalid_utf8_one_byte_at_a_time():
    data = bytes([0xF0, 0xFF, ord("a"), 0xE4, 0xBD, 0xA0, 0xE5])
    assembler = TextAssembler([])
    text = "".join(assembler.push(bytes([b])) for b in data) + assembler.finish()
    assert text == data.decode("utf-8", "replace")
    assert assembler.text == text


def test_earliest_start_wins_over_stop_order():
    assembler = TextAssembler(["cd", "bcde"])
    assert assembler.push(b"abcdef") == "a"  # "bcde" starts first although "cd" is listed first
    assert assembler.stopped
    assert assembler.push(b"more") == ""


def reference_assembly(pieces: list[bytes], stops: list[bytes]) -> str:
    """The first push whose accumulated bytes contain a stop cuts at the smallest start; else all text."""
    stream = b""
    for piece in pieces:
        stream += piece
        starts = [stream.find(s) for s in stops if s in stream]
        if starts:
            return stream[: min(starts)].decode("utf-8", "replace")
    return stream.decode("utf-8", "replace")


def test_assembler_against_reference_on_random_streams():
    rng = np.random.default_rng(7)
    alphabet = [b"a", b"b", b"ab", "\u00e9".encode(), "好".encode(), b"\xff", b"\xe4", b"\xbd\xa0", b" "]
    for _ in range(3000):
        pieces = [b"".join(rng.choice(alphabet, size=rng.integers(0, 3))) for _ in range(rng.integers(0, 12))]
        stops = [
            b"".join(rng.choice(alphabet[:6], size=rng.integers(1, 4))) for _ in range(rng.integers(0, 4))
        ]
        stops = [s for s in stops if s.decode("utf-8", "ignore").encode() == s] or []
        assembler = TextAssembler([s.decode() for s in stops])
        deltas = [assembler.push(p) for p in pieces] + [assembler.finish()]
        assert "".join(deltas) == assembler.text == reference_assembly(pieces, stops), (pieces, stops)


# ---------------------------------------------------------------------------------------------------------
# Generation loop on a scripted model (the loop's contract, independent of any real graph)


@dataclass
class _Config:
    vocab_size: int


@dataclass
class _Tokenizer:
    pieces: dict[int, bytes]
    end_ids: frozenset[int]

    def token_bytes(self, token: int) -> bytes:
        return self.pieces[token]


@dataclass
class _Session:
    context: int
    history: list[int] = field(default_factory=list)

    @property
    def position(self) -> int:
        return len(self.history)


class ScriptedModel:
    """Emits ``script[i]`` as the clear argmax once the prompt and i generated tokens have been forwarded."""

    def __init__(self, script: list[int], prompt_len: int, vocab: int = 16, end_ids=(0,)) -> None:
        self.script = script
        self.prompt_len = prompt_len
        self.config = _Config(vocab)
        pieces = {i: bytes([ord("a") + i]) for i in range(vocab)}
        pieces[9] = "é".encode()[:1]
        pieces[10] = "é".encode()[1:]
        self.tokenizer = _Tokenizer(pieces, frozenset(end_ids))
        self.calls: list[list[int]] = []

    def new_session(self, context, cancel=None):
        return _Session(context)

    def forward(self, session, tokens):
        self.calls.append(list(tokens))
        session.history.extend(tokens)
        logits = np.zeros(self.config.vocab_size, dtype=np.float32)
        step = session.position - self.prompt_len
        if step >= 0:  # mid-prompt logits are never sampled
            logits[self.script[step]] = 10.0
        return logits


def _run(model, request, context=64):
    stream = generate(model, request, context=context)
    deltas = list(stream)
    completion = stream.completion
    assert isinstance(completion, Completion)
    assert "".join(deltas) == completion.text
    assert all(deltas)
    return deltas, completion


def test_length_finish_usage_and_forwarded_tokens():
    prompt = list(range(1, 8))
    model = ScriptedModel([1, 2, 3, 4, 5, 6], len(prompt))
    _, completion = _run(model, GenerationRequest(prompt, 4, GREEDY, []))
    assert completion.text == "bcde"
    assert completion.finish_reason == "length"
    assert completion.token_ids == [1, 2, 3, 4]
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (7, 4)
    assert completion.usage.total_tokens == 11
    # The prompt goes out first, then every sampled token except the last.
    assert model.calls == [prompt, [1], [2], [3]]
    timing = completion.timing
    assert 0 <= timing.prefill_ms <= timing.first_token_ms <= timing.total_ms
    assert timing.decode_ms == pytest.approx(timing.total_ms - timing.first_token_ms)
    record = completion.as_dict()
    assert set(record) == {"text", "finish_reason", "usage", "timing", "token_ids"}
    assert record["usage"] == completion.usage.as_dict()
    assert record["usage"] == {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}
    assert record["timing"] == completion.timing.as_dict()
    assert set(record["timing"]) == {"prefill_ms", "first_token_ms", "decode_ms", "total_ms"}


def test_end_token_stops_without_text():
    model = ScriptedModel([3, 0, 5], 2)
    _, completion = _run(model, GenerationRequest([1, 2], 10, GREEDY, []))
    assert completion.text == "d"
    assert completion.finish_reason == "stop"
    assert completion.token_ids == [3, 0]
    assert completion.usage.completion_tokens == 2
    assert model.calls == [[1, 2], [3]]


def test_stop_string_counts_the_completing_token():
    model = ScriptedModel([1, 2, 3, 4, 2, 3], 1)
    _, completion = _run(model, GenerationRequest([1], 10, GREEDY, ["cd"]))
    assert completion.text == "b"
    assert completion.finish_reason == "stop"
    assert completion.usage.completion_tokens == 3


def test_utf8_split_across_tokens_and_flushed_tail():
    model = ScriptedModel([9, 10, 9], 1)
    deltas, completion = _run(model, GenerationRequest([1], 3, GREEDY, []))
    assert completion.text == "é\ufffd"
    assert deltas == ["é", "\ufffd"]


def test_prompt_chunks_follow_the_limit():
    prompt = list(range(1, 12))
    model = ScriptedModel([1, 2], len(prompt))
    generation = Generation(model, GenerationRequest(prompt, 2, GREEDY, []), context=64)
    chunks = []
    while tokens := generation.next_input(limit=4):
        assert generation.next_input(limit=4) == tokens  # asking again gives the same input
        chunks.append(tokens)
        generation.feed(model.forward(generation.session, tokens))
    assert chunks == [prompt[0:4], prompt[4:8], prompt[8:11], [1]]
    assert generation.done and generation.completion.token_ids == [1, 2]


def test_cancelled_forward_raises():
    model = ScriptedModel([1, 2], 1)
    generation = Generation(model, GenerationRequest([1], 2, GREEDY, []), context=8)
    generation.next_input()
    with pytest.raises(GenerationError, match="^request cancelled$"):
        generation.feed(None)
    assert generation.done and generation.completion is None


def test_cancel_callable_checked_at_each_step():
    flag = {"cancel": False}
    model = ScriptedModel([1, 2, 3], 1)
    stream = generate(model, GenerationRequest([1], 3, GREEDY, []), context=8, cancel=lambda: flag["cancel"])
    assert next(stream) == "b"
    flag["cancel"] = True
    with pytest.raises(GenerationError, match="^request cancelled$"):
        next(stream)


def test_seeded_generation_is_reproducible():
    class Flat(ScriptedModel):
        def forward(self, session, tokens):
            session.history.extend(tokens)
            return np.linspace(0, 1, self.config.vocab_size, dtype=np.float32)

    params = SamplingParams(1.5, 1.0, -1, 1.0, seed=11)
    runs = [
        _run(Flat([], 1, end_ids=()), GenerationRequest([1], 12, params, []))[1].token_ids for _ in range(2)
    ]
    assert runs[0] == runs[1]
    assert len(set(runs[0])) > 1


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "stop", "message"),
    [
        ([], 1, [], "prompt leaves no output space"),
        (list(range(8)), 1, [], "prompt leaves no output space"),
        (list(range(4)), 5, [], "prompt plus output limit exceeds context size"),
        (list(range(4)), 0, [], "output token limit must be positive"),
        (list(range(4)), 2, ["a", "b", "c", "d", "e"], "at most four stop strings are supported"),
        (list(range(4)), 2, [""], r"stop strings must contain 1..=4096 UTF-8 bytes"),
        (list(range(4)), 2, ["é" * 2049], r"stop strings must contain 1..=4096 UTF-8 bytes"),
    ],
)
def test_request_validation(prompt, max_tokens, stop, message):
    with pytest.raises(GenerationError, match=f"^{message}$"):
        GenerationRequest(prompt, max_tokens, GREEDY, stop).validate(8)


def test_request_validation_checks_sampling():
    bad = SamplingParams(temperature=-1, top_p=1.0, top_k=-1, repetition_penalty=1.0)
    with pytest.raises(GenerationError, match="^temperature must be between 0 and 2$"):
        GenerationRequest([1], 2, bad, []).validate(8)
    GenerationRequest([1], 7, GREEDY, ["x" * 4096]).validate(8)


# ---------------------------------------------------------------------------------------------------------
# §12.6: the always-`a` tiny model


def test_always_a_model_with_stop_aaa(tmp_path):
    hymt = pytest.importorskip("hymt")
    if not hasattr(hymt, "load"):
        pytest.skip("hymt.load is not available yet")
    from hymt.synthetic import write_tiny_fixture

    model = hymt.load(write_tiny_fixture(tmp_path / "a.gguf", moe=False, numeric=False))
    stream = generate(model, GenerationRequest([1], 8, GREEDY, ["aaa"]), context=64)
    deltas = list(stream)
    completion = stream.completion
    assert deltas == [] and completion.text == ""
    assert completion.usage.completion_tokens == 3
    assert completion.usage.total_tokens == 4
    assert completion.finish_reason == "stop"
    assert completion.token_ids == [ord("a")] * 3


def _tiny_model(tmp_path, numeric=True, moe=False):
    hymt = pytest.importorskip("hymt")
    if not hasattr(hymt, "load"):
        pytest.skip("hymt.load is not available yet")
    from hymt.synthetic import write_tiny_fixture

    return hymt.load(write_tiny_fixture(tmp_path / "m.gguf", moe=moe, numeric=numeric))


@pytest.mark.parametrize("moe", [False, True])
def test_batched_generations_match_lone_runs(tmp_path, moe):
    """Generations driven together through one batched forward give what each gives alone."""
    model = _tiny_model(tmp_path, moe=moe)
    sampled = SamplingParams(1.0, 0.9, 0, 1.1, seed=5)
    requests = [
        GenerationRequest([256, 257, *b"hello", 258], 12, GREEDY, []),
        GenerationRequest(list(range(60, 90)), 9, sampled, ["zz"]),
        GenerationRequest([256, 1, 2, 3], 15, SamplingParams(0.7, 0.6, 20, 1.05, seed=9), []),
    ]
    alone = [_run(model, r, context=128)[1] for r in requests]
    generations = [Generation(model, r, context=128) for r in requests]
    texts = ["" for _ in requests]
    while not all(g.done for g in generations):
        live = [g for g in generations if not g.done]
        results = model.forward([(g.session, g.next_input()) for g in live])
        for g, logits in zip(live, results, strict=True):
            texts[generations.index(g)] += g.feed(logits)
    for g, text, lone in zip(generations, texts, alone, strict=True):
        assert g.completion.token_ids == lone.token_ids
        assert text == g.completion.text == lone.text
        assert g.completion.usage == lone.usage
        assert g.completion.finish_reason == lone.finish_reason


def test_seeded_requests_reproduce_on_a_real_model(tmp_path):
    model = _tiny_model(tmp_path)
    params = SamplingParams(1.2, 0.95, 0, 1.0, seed=1234)
    request = GenerationRequest([256, 257, 72, 105, 258], 20, params, [])
    first, second = (_run(model, request, context=64)[1] for _ in range(2))
    assert first.token_ids == second.token_ids and first.text == second.text
    assert first.usage.completion_tokens == len(first.token_ids)
    assert first.usage.total_tokens == 5 + len(first.token_ids)
