"""The §8.2 sampler against a straightforward implementation written here, plus the §12.8 scenarios."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hymt.errors import GenerationError
from hymt.sampling import Sampler, SamplingParams, default_sampling, top_ids


def reference_sample(logits, seen, params, rng):
    """REFERENCE §8.2 spelled out: float32 penalty per distinct seen token, full sort, top-k, top-p, draw."""
    values = [np.float32(x) for x in logits]
    if params.repetition_penalty != 1:
        pen = np.float32(params.repetition_penalty)
        for token in set(seen):
            values[token] = values[token] * pen if values[token] < 0 else values[token] / pen
    if params.temperature == 0:
        best = 0
        for i, v in enumerate(values):
            if v > values[best]:
                best = i
        return best
    u = rng.random()
    order = sorted(range(len(values)), key=lambda i: (-float(values[i]), i))
    if params.top_k > 0:
        order = order[: params.top_k]
    top = max(float(v) for v in values)
    weights = [math.exp((float(values[i]) - top) / params.temperature) for i in order]
    threshold = params.top_p * math.fsum(weights)
    running, kept = 0.0, len(order)
    for n, w in enumerate(weights):
        running += w
        if running >= threshold:
            kept = n + 1
            break
    kept_sum = sum(weights[:kept])
    target = u * kept_sum
    running = 0.0
    for n in range(kept):
        running += weights[n]
        if running > target:
            return order[n]
    return order[kept - 1]


CASES = [
    # (temperature, top_p, top_k, penalty)
    (0.0, 1.0, -1, 1.0),
    (0.0, 0.6, 20, 1.05),
    (0.0, 1.0, 0, 0.8),  # a penalty below 1 raises the seen tokens' logits
    (0.0, 1.0, -1, 1.5),
    (0.7, 0.6, 20, 1.05),
    (0.7, 1.0, -1, 1.0),
    (1.3, 0.9, 0, 1.2),
    (2.0, 1.0, 0, 0.8),
    (0.2, 0.3, 5, 1.5),
    (1.0, 0.95, 1, 1.0),
    (1.0, 1.0, 100000, 1.1),
]


@pytest.mark.parametrize("vocab", [7, 300, 3000])
@pytest.mark.parametrize("case", CASES)
def test_sampler_matches_straightforward_reference(vocab, case):
    temperature, top_p, top_k, penalty = case
    for seed in range(6):
        data = np.random.default_rng(1000 * vocab + seed)
        scale = [0.5, 3.0, 12.0][seed % 3]
        prompt = data.integers(0, vocab, size=5).tolist()
        params = SamplingParams(temperature, top_p, top_k, penalty, seed=seed)
        sampler = Sampler(params, vocab, prompt)
        rng = np.random.default_rng(seed)
        seen = list(prompt)
        for _step in range(6):
            logits = (data.standard_normal(vocab) * scale).astype(np.float32)
            if seed % 2:
                logits = np.round(logits).astype(np.float32)  # many exact ties
            want = reference_sample(logits, seen, params, rng)
            got = sampler.sample(logits)
            assert got == want, (case, vocab, seed, _step)
            seen.append(got)


def test_sampler_flat_distribution_beyond_first_window():
    """Near-uniform logits over a large vocabulary force the partial selections to grow."""
    vocab = 20000
    for seed in range(4):
        logits = (np.random.default_rng(seed).standard_normal(vocab) * 0.01).astype(np.float32)
        for top_p in (1.0, 0.97):
            params = SamplingParams(2.0, top_p, -1, 1.0, seed=seed)
            want = reference_sample(logits, [], params, np.random.default_rng(seed))
            assert Sampler(params, vocab, []).sample(logits) == want


def test_top_ids_on_a_real_vocabulary_size_is_the_full_sort_prefix():
    """Above two groups per id the selection is bounded by group maxima first; ties and every count that
    the bound covers (and the first one it does not) must still give exactly the sorted prefix."""
    for seed, scale in enumerate((0.5, 3.0, 40.0)):
        vocab = 120818 - 777 * seed
        logits = np.round(np.random.default_rng(seed).standard_normal(vocab) * scale).astype(np.float32)
        order = sorted(range(vocab), key=lambda i: (-float(logits[i]), i))
        for count in (1, 2, 20, 64, 1024, 1025, 3000):
            assert top_ids(logits, count).tolist() == order[:count], (seed, count)


def test_sampler_on_a_real_vocabulary_size_matches_reference():
    vocab = 120818
    for seed, case in enumerate([(0.7, 0.6, 20, 1.05), (1.0, 0.9, 50, 1.0), (0.7, 1.0, -1, 1.05)]):
        params = SamplingParams(*case, seed=seed)
        data = np.random.default_rng(seed)
        prompt = data.integers(0, vocab, size=30).tolist()
        sampler, rng, seen = Sampler(params, vocab, prompt), np.random.default_rng(seed), list(prompt)
        for _step in range(3):
            logits = np.round(data.standard_normal(vocab) * 4).astype(np.float32)
            want = reference_sample(logits, seen, params, rng)
            got = sampler.sample(logits)
            assert got == want, (case, _step)
            seen.append(got)


def test_top_k_one_is_argmax():
    data = np.random.default_rng(5)
    for seed in range(20):
        logits = data.standard_normal(1000).astype(np.float32)
        sampler = Sampler(SamplingParams(1.5, 1.0, 1, 1.0, seed=seed), 1000, [])
        assert sampler.sample(logits) == int(np.argmax(logits))


def test_same_seed_same_draws():
    logits = np.random.default_rng(9).standard_normal(500).astype(np.float32)
    a = Sampler(SamplingParams(1.0, 0.9, 0, 1.1, seed=1234), 500, [1, 2, 3])
    b = Sampler(SamplingParams(1.0, 0.9, 0, 1.1, seed=1234), 500, [1, 2, 3])
    draws_a = [a.sample(logits) for _ in range(20)]
    draws_b = [b.sample(logits) for _ in range(20)]
    assert draws_a == draws_b
    assert len(set(draws_a)) > 1  # the draws really are random


def test_greedy_consumes_no_random_draws():
    sampler = Sampler(SamplingParams(0.0, 1.0, -1, 1.0, seed=3), 10, [])
    sampler.sample(np.arange(10, dtype=np.float32))
    assert sampler.rng.random() == np.random.default_rng(3).random()


def test_penalty_applies_at_temperature_zero():
    logits = np.array([0.0, 2.0, 1.95, -1.0], dtype=np.float32)
    assert Sampler(SamplingParams(0.0, 1.0, -1, 1.0), 4, [1]).sample(logits) == 1
    # 2.0 / 1.05 = 1.905 < 1.95: the penalty on the seen token 1 changes the argmax.
    assert Sampler(SamplingParams(0.0, 1.0, -1, 1.05), 4, [1]).sample(logits) == 2


def test_penalty_once_per_distinct_token_and_negative_logits():
    # Token 0 appears three times and token 1 twice: each is penalized once (×2 below zero, ÷2 above).
    logits = np.array([-1.0, 3.0, -0.5, 0.25], dtype=np.float32)
    sampler = Sampler(SamplingParams(0.0, 1.0, -1, 2.0), 4, [0, 0, 0, 1, 1])
    assert sampler.sample(logits) == 1  # 3 / 2 = 1.5 is still the maximum
    # Seen now {0, 1}: a per-occurrence penalty would have pushed token 1 to 0.1875 < 0.25.
    assert sampler.sample(logits) == 1


def test_seen_includes_sampled_tokens():
    logits = np.array([1.0, 0.99], dtype=np.float32)
    sampler = Sampler(SamplingParams(0.0, 1.0, -1, 1.5), 2, [])
    assert sampler.sample(logits) == 0
    assert sampler.sample(logits) == 1  # 1.0 / 1.5 < 0.99 once token 0 is seen


def test_logit_checks():
    sampler = Sampler(SamplingParams(0.7, 0.6, 20, 1.05), 4, [0])
    with pytest.raises(GenerationError, match="^invalid logit count$"):
        sampler.sample(np.zeros(5, dtype=np.float32))
    with pytest.raises(GenerationError, match="^non-finite logits$"):
        sampler.sample(np.array([0, np.nan, 0, 0], dtype=np.float32))
    overflow = Sampler(SamplingParams(0.0, 1.0, -1, 1e-30), 2, [0])
    with pytest.raises(GenerationError, match="^repetition_penalty overflowed the logits$"):
        overflow.sample(np.array([1e10, 0], dtype=np.float32))


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (SamplingParams(-1, 1.0, -1, 1.0), "temperature must be between 0 and 2"),
        (SamplingParams(2.5, 1.0, -1, 1.0), "temperature must be between 0 and 2"),
        (SamplingParams(float("nan"), 1.0, -1, 1.0), "temperature must be between 0 and 2"),
        (SamplingParams(1.0, 0.0, -1, 1.0), r"top_p must be in \(0, 1\]"),
        (SamplingParams(1.0, 1.01, -1, 1.0), r"top_p must be in \(0, 1\]"),
        (SamplingParams(1.0, 1.0, -2, 1.0), "top_k must be -1, 0, or a positive integer"),
        (SamplingParams(1.0, 1.0, -1, 0.0), "repetition_penalty must be positive and finite"),
        (SamplingParams(1.0, 1.0, -1, float("inf")), "repetition_penalty must be positive and finite"),
        (SamplingParams(1.0, 1.0, -1, 1.0, seed=-1), r"seed must be an integer between 0 and 2\^64-1"),
        (SamplingParams(1.0, 1.0, -1, 1.0, seed=2**64), r"seed must be an integer between 0 and 2\^64-1"),
        (SamplingParams(1.0, 1.0, -1, 1.0, seed=True), r"seed must be an integer between 0 and 2\^64-1"),
    ],
)
def test_validation_messages(params, message):
    with pytest.raises(GenerationError, match=f"^{message}$"):
        params.validate()


def test_model_card_defaults():
    assert default_sampling("hunyuan-dense") == SamplingParams(0.7, 0.6, 20, 1.05)
    assert default_sampling("hy_v3") == SamplingParams(0.7, 1.0, -1, 1.0)
    default_sampling("hunyuan-dense").validate()
    with pytest.raises(GenerationError):
        default_sampling("llama")
