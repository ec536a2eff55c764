"""The prompt cache: finished requests' sessions reused for prompts that start the same way.

The reference for every output here is the same request on an engine without the cache (a fresh session
prefilled in full); the model-level property it rests on (a rewound session continues bit-identically) is
tested per format in test_model.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import hymt
from hymt.engine import Engine
from hymt.errors import GenerationError, ModelError
from hymt.generation import Generation, GenerationRequest
from hymt.prompt_cache import PromptCache, shared_prefix
from hymt.sampling import SamplingParams
from hymt.synthetic import write_synthetic_model

VOCAB_IDS = range(3, 490)  # byte and merge ids of the synthetic tiny vocabulary (its specials sit above)


@pytest.fixture(scope="module", params=[("tiny", "stq1", "tencent-stq1"), ("tiny-moe", "q4_k", "auto")])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    preset, fmt, profile = request.param
    path = write_synthetic_model(
        tmp_path_factory.mktemp("cache") / f"{preset}-{fmt}.gguf", preset, fmt, seed=4
    )
    return hymt.load(path, profile, threads=2)


class Recording:
    """The real model, recording how many tokens each session was fed and every session it made."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self.fed: dict[int, int] = {}  # id(session) -> tokens forwarded
        self.sessions: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def new_session(self, *args: Any) -> Any:
        session = self._model.new_session(*args)
        self.sessions.append(session)
        return session

    def forward(self, batch: Any) -> Any:
        for session, tokens in batch:
            self.fed[id(session)] = self.fed.get(id(session), 0) + len(tokens)
        return self._model.forward(batch)


def request_for(prompt: list[int], seed: int, max_tokens: int = 12) -> GenerationRequest:
    sampling = SamplingParams(temperature=0.9, top_p=0.95, top_k=40, repetition_penalty=1.0, seed=seed)
    return GenerationRequest(prompt_ids=prompt, max_tokens=max_tokens, sampling=sampling)


def run_alone(model: Any, request: GenerationRequest) -> list[int]:
    engine = Engine(model, max_concurrent=1, queue_capacity=0, context=256, prompt_cache=False)
    try:
        with engine.submit(request) as ticket:
            return ticket.result().token_ids
    finally:
        engine.shutdown()


def prompts() -> list[list[int]]:
    rng = np.random.default_rng(11)
    instruction = [int(t) for t in rng.choice(VOCAB_IDS, 30)]
    texts = [[int(t) for t in rng.choice(VOCAB_IDS, n)] for n in (9, 14, 5)]
    assert len({text[0] for text in texts}) == 3  # the prompts share exactly the instruction
    return [instruction + texts[0], instruction + texts[1], instruction + texts[1], instruction + texts[2]]


def test_shared_prefix() -> None:
    assert shared_prefix([], [1]) == 0
    assert shared_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert shared_prefix([1, 2], [1, 2, 3]) == 2
    assert shared_prefix([1, 2, 3], [1, 2]) == 2


def test_engine_continues_from_finished_sessions_with_unchanged_outputs(model: Any) -> None:
    """Requests one after another on one slot: later ones skip the shared instruction (the same prompt
    again skips all but its last token), and every output equals the request run on a fresh session."""
    recording = Recording(model)
    engine = Engine(recording, max_concurrent=1, queue_capacity=0, context=256)
    outputs, fed = [], []
    try:
        for seed, prompt in enumerate(prompts()):
            with engine.submit(request_for(prompt, seed)) as ticket:
                completion = ticket.result()
            outputs.append(completion.token_ids)
            assert completion.usage.prompt_tokens == len(prompt)  # usage counts the whole prompt
            fed.append(recording.fed)
            recording.fed = {}
    finally:
        engine.shutdown()
    assert len(recording.sessions) == 1  # one slot: one session, reused throughout
    sizes = [len(p) for p in prompts()]
    generated = [len(o) - 1 for o in outputs]  # the last sampled token is never forwarded
    assert [sum(f.values()) for f in fed] == [
        sizes[0] + generated[0],
        sizes[1] - 30 + generated[1],
        1 + generated[2],  # the same prompt again: only its last token
        sizes[3] - 30 + generated[3],
    ]
    assert engine.prompt_cache is not None
    assert engine.prompt_cache.hits == 3 and engine.prompt_cache.reused_tokens == 30 + sizes[2] - 1 + 30
    for seed, prompt in enumerate(prompts()):
        assert outputs[seed] == run_alone(model, request_for(prompt, seed))


def test_engine_cache_under_concurrency_keeps_the_session_bound(model: Any) -> None:
    """Three slots, bursts of requests: never more than three sessions exist, and outputs are unchanged."""
    recording = Recording(model)
    engine = Engine(recording, max_concurrent=3, queue_capacity=8, context=256)
    cases = [(prompt, 100 + 10 * burst + i) for burst in range(3) for i, prompt in enumerate(prompts())]
    try:
        results = []
        for burst in range(3):
            tickets = [engine.submit(request_for(p, s, 8)) for p, s in cases[4 * burst : 4 * burst + 4]]
            for ticket in tickets:
                results.append(ticket.result().token_ids)
                ticket.close()
        assert engine.admitted == 0 and engine.active == 0
    finally:
        engine.shutdown()
    assert len(recording.sessions) <= 3
    assert engine.prompt_cache is not None and engine.prompt_cache.hits >= 6
    for (prompt, seed), got in zip(cases, results, strict=True):
        assert got == run_alone(model, request_for(prompt, seed, 8))


def test_session_cancelled_mid_prefill_is_reused_safely(model: Any) -> None:
    """A request cancelled inside a prompt chunk leaves rows past its position half-written; the next
    request continues from the valid part and still gets the fresh-session output."""
    rng = np.random.default_rng(3)
    long_prompt = prompts()[0] + [int(t) for t in rng.choice(VOCAB_IDS, 150)]
    checks = {"n": 0}

    def cancel_after_one_layer() -> bool:  # polled before the call and before every layer
        checks["n"] += 1
        return checks["n"] > 2

    cache = PromptCache(model, 256, limit=1)
    session = cache.take(long_prompt, busy=[])
    model.forward(session, long_prompt[:20])
    before = session.keys[0][:, 20:170].copy()
    session.cancel = cancel_after_one_layer
    with pytest.raises(ModelError, match="^request cancelled$"):
        model.forward(session, long_prompt[20:170])
    assert session.position == 20 and not session.poisoned
    assert not np.array_equal(session.keys[0][:, 20:170], before)  # the first layer wrote its rows
    cache.give(session)
    request = request_for(prompts()[1], 7)
    reused = cache.take(request.prompt_ids, busy=[])
    assert reused is session and reused.position == 20
    generation = Generation(model, request, context=256, session=reused)
    while tokens := generation.next_input():
        generation.feed(model.forward(generation.session, tokens))
    assert generation.completion is not None
    assert generation.completion.token_ids == run_alone(model, request)


def test_prompt_cache_choice_and_bounds(model: Any) -> None:
    cache = PromptCache(model, 64, limit=3)
    a = cache.take([5, 6, 7, 8], busy=[])
    model.forward(a, [5, 6, 7, 8])
    b = cache.take([1, 2, 3], busy=[a])  # nothing shared: a new session
    model.forward(b, [5, 6, 9])
    assert a is not b
    cache.give(a)
    cache.give(b)
    assert cache.idle == 2
    # the longest shared prefix wins, capped so the last prompt token is always forwarded
    c = cache.take([5, 6, 7, 8], busy=[])
    assert c is a and c.position == 3 and c.tokens == [5, 6, 7]
    cache.give(c)
    # a tie goes to the most recently finished session
    d = cache.take([5, 6, 1], busy=[])
    assert d is a and d.position == 2
    cache.give(d)
    # no shared prefix: a new session while the bound allows (idle sessions kept for later prompts) ...
    e = cache.take([40, 41], busy=[])
    assert e not in (a, b) and e.position == 0 and cache.idle == 2
    # ... else the least recently used idle one, emptied
    f = cache.take([42, 43], busy=[e])
    assert f is b and f.position == 0 and f.tokens == [] and cache.idle == 1
    assert cache.hits == 2 and cache.reused_tokens == 5
    # nothing to keep: a session no forward has filled, or one a failed forward left invalid
    cache.give(e)
    model.forward(f, [42, 43])
    f.poisoned = True
    cache.give(f)
    assert cache.idle == 1
    # the cancel callable belongs to the request that holds the session
    g = cache.take([5, 6], busy=[], cancel=lambda: True)
    assert g is a and g.cancelled
    cache.give(g)
    assert g.cancel is None


def test_generation_refuses_a_session_that_does_not_hold_the_prompt_start(model: Any) -> None:
    session = model.new_session(64)
    model.forward(session, [5, 6, 7])
    for prompt in ([5, 6, 8, 9], [5, 6, 7]):  # different, or nothing left to forward
        with pytest.raises(GenerationError, match="^the session does not hold a prefix of the prompt$"):
            Generation(model, request_for(prompt, 0), context=64, session=session)
    with pytest.raises(GenerationError, match="^the session does not hold a prefix of the prompt$"):
        Generation(model, request_for([5, 6, 7, 8], 0), context=128, session=session)
    generation = Generation(model, request_for([5, 6, 7, 8], 0), context=64, session=session)
    assert generation.next_input() == [8]


def test_prompt_cache_copies_a_longer_prefix_from_a_running_session(model: Any) -> None:
    cache = PromptCache(model, 64, limit=3)
    running = model.new_session(64)
    model.forward(running, [5, 6, 7, 8, 9])
    idle = model.new_session(64)
    model.forward(idle, [5, 6, 1])
    cache.give(idle)
    copy = cache.take([5, 6, 7, 8, 2], busy=[running])
    assert copy is not running and copy is not idle and cache.idle == 1  # room for a new session
    assert copy.position == 4 and copy.tokens == [5, 6, 7, 8]
    assert running.position == 5 and running.tokens == [5, 6, 7, 8, 9]  # the source goes on untouched
    fresh = model.new_session(64)
    np.testing.assert_array_equal(model.forward(copy, [2]), model.forward(fresh, [5, 6, 7, 8, 2]))
    for layer in range(model.config.layers):
        np.testing.assert_array_equal(copy.keys[layer][:, :5], fresh.keys[layer][:, :5])
        np.testing.assert_array_equal(copy.values[layer][:, :5], fresh.values[layer][:, :5])
    # at the bound, the copy goes into the least recently used idle session
    second = cache.take([5, 6, 7, 3], busy=[running, copy])
    assert second is idle and second.tokens == [5, 6, 7] and cache.idle == 0
    # an idle session wins a tie with a running one (no copy needed)
    cache.give(second)
    assert cache.take([5, 6, 7, 4], busy=[running, copy]) is idle
    assert cache.hits == 3 and cache.reused_tokens == 4 + 3 + 3


def test_requests_arriving_together_share_the_prefix_of_an_earlier_one(model: Any) -> None:
    """After one request, four arrive at once: one takes its idle session, the others copy the shared
    instruction from it within the same step, and all four give their fresh-session outputs."""
    recording = Recording(model)
    engine = Engine(recording, max_concurrent=4, queue_capacity=0, context=256)
    first, *others = prompts()
    rng = np.random.default_rng(8)
    others.append(first[:30] + [int(t) for t in rng.choice(VOCAB_IDS, 7)])
    try:
        with engine.submit(request_for(first, 50)) as ticket:
            ticket.result()
        recording.fed = {}
        gate = [engine.admit() for _ in others]  # admitted first, so all four start in one engine turn
        for ticket, (seed, prompt) in zip(gate, enumerate(others, 60), strict=True):
            ticket.start(request_for(prompt, seed))
        outputs = [ticket.result().token_ids for ticket in gate]
        for ticket in gate:
            ticket.close()
    finally:
        engine.shutdown()
    assert len(recording.sessions) == 4
    assert engine.prompt_cache is not None and engine.prompt_cache.hits == 4
    expected_fed = sorted(len(p) - 30 + len(o) - 1 for p, o in zip(others, outputs, strict=True))
    assert sorted(recording.fed.values()) == expected_fed
    for (seed, prompt), got in zip(enumerate(others, 60), outputs, strict=True):
        assert got == run_alone(model, request_for(prompt, seed))


def test_server_flag_turns_the_cache_off(model: Any) -> None:
    from hymt.serve import build_parser
    from hymt.server import ServerConfig, create_app

    assert build_parser().parse_args([]).prompt_cache is True
    assert build_parser().parse_args(["--no-prompt-cache"]).prompt_cache is False
    for enabled in (True, False):
        app = create_app(ServerConfig(model_id="test", threads=1, prompt_cache=enabled), model=model)
        engine = app.extensions["hymt"].engine
        try:
            assert (engine.prompt_cache is not None) is enabled
        finally:
            engine.shutdown()


def test_an_idle_session_left_early_is_kept_whole_for_a_repeat(model: Any) -> None:
    """The same instruction before another text copies the instruction and keeps the idle session whole, so a
    repeat of its own prompt still reuses all of it; at the bound the copy goes into the least recently used
    idle session, which is rewound itself when it is the one sharing most."""
    cache = PromptCache(model, 64, limit=3)
    a = cache.take([5, 6, 7, 8], busy=[])
    model.forward(a, [5, 6, 7, 8, 30])  # instruction 5, 6, text 7, 8, one generated token
    cache.give(a)
    b = cache.take([5, 6, 9, 10], busy=[])  # another text: room, so a new session with a copy of 5, 6
    assert b is not a and b.tokens == [5, 6] and a.tokens == [5, 6, 7, 8, 30] and cache.idle == 1
    fresh = model.new_session(64)
    np.testing.assert_array_equal(model.forward(b, [9, 10]), model.forward(fresh, [5, 6, 9, 10]))
    cache.give(b)
    c = cache.take([5, 6, 7, 8], busy=[])  # a repeat: the whole prompt but its last token, rewound in place
    assert c is a and c.tokens == [5, 6, 7] and cache.idle == 1
    model.forward(c, [8, 31])
    cache.give(c)
    # at the bound (one running, two idle: b, then a), another text copies into the least recent (b) ...
    running = model.new_session(64)
    d = cache.take([5, 6, 7, 1, 2], busy=[running])
    assert d is b and d.tokens == [5, 6, 7] and a.tokens == [5, 6, 7, 8, 31] and cache.idle == 1
    # ... and the one left is the least recent, so it is rewound itself
    e = cache.take([5, 6, 2, 3], busy=[running, d])
    assert e is a and e.tokens == [5, 6] and cache.idle == 0
    assert cache.hits == 4 and cache.reused_tokens == 2 + 3 + 3 + 2
