"""Sampling parameters, model-card defaults and the per-request sampler of REFERENCE §8.1–8.2.

The sampler orders candidates by logit descending (ties: lower id), applies top-k, then the shortest top-p
prefix, then picks with one uniform draw per non-greedy step. Sorting a 120k vocabulary every token would cost
more than a decode step's sampling budget, so candidates are taken with partial selections of growing size:
the chosen token almost always lies among the first few dozen, and the order of the prefix examined is exactly
the order a full sort would give.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from hymt.errors import GenerationError

# Model-card defaults (Tencent); sampling values stored in a GGUF are deliberately ignored.
_DEFAULTS = {
    "hunyuan-dense": (0.7, 0.6, 20, 1.05),
    "hy_v3": (0.7, 1.0, -1, 1.0),
}
# First partial-selection size when no top-k bounds the candidates; doubled until the draw is resolved.
_FIRST_WINDOW = 64
# Disjoint groups whose maxima bound a partial selection (top-k up to this size avoids a full selection).
_SELECTION_GROUPS = 1024


def _is_real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    seed: int | None = None

    def validate(self) -> None:
        """Raise ``GenerationError`` with the §8.1 message of the first invalid parameter."""
        t = self.temperature
        if not _is_real(t) or not math.isfinite(t) or not 0 <= t <= 2:
            raise GenerationError("temperature must be between 0 and 2")
        p = self.top_p
        if not _is_real(p) or not math.isfinite(p) or not 0 < p <= 1:
            raise GenerationError("top_p must be in (0, 1]")
        k = self.top_k
        if not isinstance(k, int) or isinstance(k, bool) or k < -1:
            raise GenerationError("top_k must be -1, 0, or a positive integer")
        r = self.repetition_penalty
        if not _is_real(r) or not math.isfinite(r) or r <= 0:
            raise GenerationError("repetition_penalty must be positive and finite")
        seed = self.seed
        if seed is not None and (
            not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**64
        ):
            # numpy's default_rng rejects negative seeds deep inside; the API's range is 0..2^64-1 (§9.4).
            raise GenerationError("seed must be an integer between 0 and 2^64-1")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def default_sampling(architecture: str) -> SamplingParams:
    """The Tencent model-card sampling defaults of an architecture (§8.1)."""
    if architecture not in _DEFAULTS:
        raise GenerationError(f"unsupported model architecture {architecture}")
    temperature, top_p, top_k, penalty = _DEFAULTS[architecture]
    return SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, repetition_penalty=penalty)


def top_ids(logits: np.ndarray, count: int) -> np.ndarray:
    """Ids of the ``count`` largest logits ordered by logit descending, ties by lower id (exactly the prefix
    of a full stable sort), using a partial selection instead of sorting the whole vocabulary."""
    n = logits.shape[0]
    if count >= n:
        candidates = np.arange(n)
    else:
        ids = _bounded_candidates(logits, count)  # ascending ids, a superset of the prefix
        values = logits[ids]
        if count < ids.shape[0]:
            part = np.argpartition(values, ids.shape[0] - count)[ids.shape[0] - count :]
            kth = values[part].min()
            above = ids[values > kth]
            # Among equal logits at the boundary the lowest ids belong to the prefix.
            ties = ids[values == kth][: count - above.shape[0]]
            candidates = np.concatenate([above, ties])
        else:
            candidates = ids
    order = np.lexsort((candidates, -logits[candidates]))
    return candidates[order]


def _bounded_candidates(logits: np.ndarray, count: int) -> np.ndarray:
    """Ascending ids of every logit at least the ``count``-th largest of the maxima of disjoint groups.

    Those maxima are ``count`` distinct entries that large, so the ``count``-th largest logit reaches the
    bound and the ids include the whole top-``count`` prefix with all its ties. One vectorized pass finds
    the bound, so the selection afterwards runs on a few dozen entries instead of the whole vocabulary
    (selecting among all 120k logits costs more than a decode step's sampling budget).
    """
    n = logits.shape[0]
    rows = n // _SELECTION_GROUPS
    if rows < 2 or count > _SELECTION_GROUPS:
        return np.arange(n)
    split = rows * _SELECTION_GROUPS
    # Group j holds ids j, j + G, j + 2G, … below ``split``; each id at or above it is a group of its own.
    maxima = np.concatenate([logits[:split].reshape(rows, _SELECTION_GROUPS).max(axis=0), logits[split:]])
    bound = np.partition(maxima, maxima.shape[0] - count)[maxima.shape[0] - count]
    return np.flatnonzero(logits >= bound)


class Sampler:
    """One request's sampler: its RNG, its seen-token set and the §8.2 steps."""

    def __init__(self, params: SamplingParams, vocab_size: int, prompt_ids: Iterable[int]) -> None:
        params.validate()
        self.params = params
        self.vocab_size = vocab_size
        self.rng = np.random.default_rng(params.seed)
        self._seen: set[int] = set()
        self._seen_ids = np.empty(0, dtype=np.int64)  # distinct seen ids, for the vectorized penalty
        self._add_seen(prompt_ids)

    def _add_seen(self, ids: Iterable[int]) -> None:
        new = [i for i in dict.fromkeys(int(i) for i in ids) if i not in self._seen]
        if new:
            self._seen.update(new)
            self._seen_ids = np.concatenate([self._seen_ids, np.asarray(new, dtype=np.int64)])

    def _checked(self, logits: np.ndarray) -> tuple[np.ndarray, int]:
        """Step 1, and the argmax of the unpenalized logits (the lowest id of the maximum). Two reductions
        and no temporary array: argmax stops on a NaN (numpy ranks it highest), so the value it finds is
        NaN or +inf when any logit is, and the minimum is −inf when any is."""
        if logits.ndim != 1 or logits.shape[0] != self.vocab_size:
            raise GenerationError("invalid logit count")
        logits = np.asarray(logits, dtype=np.float32)
        best = int(np.argmax(logits))
        if not (math.isfinite(float(logits[best])) and math.isfinite(float(logits.min()))):
            raise GenerationError("non-finite logits")
        return logits, best

    def _seen_penalized(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Step 2 on the seen tokens only: their ids and penalized logits."""
        ids = self._seen_ids[self._seen_ids < self.vocab_size]
        seen_logits = logits[ids]
        factor = np.float32(self.params.repetition_penalty)
        with np.errstate(over="ignore"):
            penalized = np.where(seen_logits < 0, seen_logits * factor, seen_logits / factor)
        if not np.isfinite(penalized).all():
            raise GenerationError("repetition_penalty overflowed the logits")
        return ids, penalized

    def _penalizes(self) -> bool:
        return self.params.repetition_penalty != 1 and self._seen_ids.shape[0] > 0

    @staticmethod
    def _replaced(logits: np.ndarray, ids: np.ndarray, values: np.ndarray) -> np.ndarray:
        out = logits.copy()
        out[ids] = values
        return out

    def _penalized(self, logits: np.ndarray) -> np.ndarray:
        """Steps 1–2: checks and the repetition penalty (once per distinct seen token), on a copy."""
        logits, _ = self._checked(logits)
        return self._replaced(logits, *self._seen_penalized(logits)) if self._penalizes() else logits

    def _greedy(self, logits: np.ndarray) -> int:
        """Steps 1–3 at temperature 0 without a penalized copy of the vocabulary, since every decode step of
        every sequence runs this on the engine thread while the compute threads wait (120818 logits, 60
        seen: 64 → 40 µs a call). The argmax of the penalized logits is the better of the best unseen
        logit and the best penalized seen one, the lower id on a tie; when the plain argmax is a seen
        token, the best unseen one is not known, and the copy decides."""
        logits, best = self._checked(logits)
        if not self._penalizes():
            return best
        ids, penalized = self._seen_penalized(logits)
        if best in self._seen:
            return int(np.argmax(self._replaced(logits, ids, penalized)))
        top = penalized.max()
        if top < logits[best]:
            return best
        tied_seen = int(ids[penalized == top].min())
        return tied_seen if top > logits[best] else min(best, tied_seen)

    def sample(self, logits: np.ndarray) -> int:
        """Choose the next token from one step's logits (float32, length vocab) and record it as seen."""
        if self.params.greedy:
            chosen = self._greedy(logits)  # first maximum: the lowest id wins ties
        else:
            chosen = self._draw(self._penalized(logits), self.rng.random())
        self._add_seen((chosen,))
        return chosen

    def _draw(self, logits: np.ndarray, u: float) -> int:
        """Step 4: top-k, top-p shortest prefix, then the first kept entry whose running sum exceeds
        u × (kept sum)."""
        params = self.params
        n = logits.shape[0]
        temperature = float(params.temperature)
        top = float(logits.max())
        if 0 < params.top_k < n:
            ids = top_ids(logits, params.top_k)
            weights = np.exp((logits[ids].astype(np.float64) - top) / temperature)
            return _choose(ids, weights, params.top_p * weights.sum(), u)
        # No top-k: Σ p over the whole vocabulary, then resolve the draw on a growing sorted prefix.
        total = float(np.exp((logits.astype(np.float64) - top) / temperature).sum())
        threshold = params.top_p * total
        window = _FIRST_WINDOW
        while True:
            window = min(window, n)
            ids = top_ids(logits, window)
            weights = np.exp((logits[ids].astype(np.float64) - top) / temperature)
            if window == n:
                return _choose(ids, weights, threshold, u)
            running = np.cumsum(weights)
            if params.top_p < 1 and running[-1] >= threshold:
                return _choose(ids, weights, threshold, u)
            if params.top_p >= 1 and running[-1] > u * total:
                # Everything is kept: the kept sum is the total, and the draw lands inside this prefix.
                return int(ids[int(np.argmax(running > u * total))])
            window *= 2


def _choose(ids: np.ndarray, weights: np.ndarray, threshold: float, u: float) -> int:
    """Keep the shortest prefix whose running sum reaches ``threshold`` (all of it when rounding leaves the
    threshold unreached), then pick the first kept entry whose running sum exceeds u × (kept sum)."""
    running = np.cumsum(weights)
    reached = running >= threshold
    cut = int(np.argmax(reached)) if reached.any() else running.shape[0] - 1
    target = u * float(running[cut])
    above = running[: cut + 1] > target
    return int(ids[int(np.argmax(above))] if above.any() else ids[cut])
