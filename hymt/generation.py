"""One request's generation (REFERENCE §8.3–8.4): prompt chunks in, sampled tokens and released text out.

``Generation`` is a state machine with no threads and no loop of its own, so the same code serves a lone
request (``generate``, which forwards one session at a time) and the server engine, which forwards the
``next_input()`` of many generations in one batched weight pass and ``feed``s each its logits.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from hymt.errors import GenerationError
from hymt.sampling import Sampler, SamplingParams

PREFILL_CHUNK = 256
MAX_STOP_STRINGS = 4
MAX_STOP_BYTES = 4096


class TextAssembler:
    """Turns token byte pieces into text: stop strings matched on bytes across token boundaries, UTF-8
    decoded incrementally (invalid sequences → U+FFFD exactly as ``bytes.decode("utf-8", "replace")``).

    Bytes that could still begin a stop string are held back, so no released text is ever retracted; the
    held-back suffix is the only place a future match can start.
    """

    def __init__(self, stop: Sequence[str] = ()) -> None:
        self._stops = [s.encode("utf-8") for s in stop]
        self._pending = b""  # bytes not yet handed to the decoder (a possible stop-string start)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""  # everything released so far
        self.stopped = False

    def push(self, piece: bytes) -> str:
        """Add one token's bytes; return the newly released text (maybe "")."""
        if self.stopped:
            return ""
        pending = self._pending + piece
        starts = [pos for pos in (pending.find(s) for s in self._stops) if pos >= 0]
        if starts:
            self._pending = b""
            self.stopped = True
            return self._emit(pending[: min(starts)], flush=True)
        hold = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(pending)), hold, -1):
                if pending.endswith(stop[:n]):
                    hold = n
                    break
        self._pending = pending[len(pending) - hold :]
        return self._emit(pending[: len(pending) - hold], flush=False)

    def finish(self) -> str:
        """Release everything still held (an incomplete UTF-8 tail becomes one U+FFFD)."""
        pending, self._pending = self._pending, b""
        return self._emit(pending, flush=True)

    def _emit(self, data: bytes, flush: bool) -> str:
        released = self._decoder.decode(data, final=flush)
        self.text += released
        return released


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class Timing:
    """Float milliseconds since the start of the request's generation (decode_ms = total − first token)."""

    prefill_ms: float
    first_token_ms: float
    decode_ms: float
    total_ms: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: str  # "stop" or "length"
    usage: Usage
    timing: Timing
    token_ids: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop: list[str] = field(default_factory=list)

    def validate(self, context: int) -> None:
        """Raise ``GenerationError`` with the §8.1 message of the first problem, prompt checks first (§9.5)."""
        prompt_len = len(self.prompt_ids)
        if prompt_len == 0 or prompt_len >= context:
            raise GenerationError("prompt leaves no output space")
        if isinstance(self.max_tokens, int) and self.max_tokens > context - prompt_len:
            raise GenerationError("prompt plus output limit exceeds context size")
        self.sampling.validate()
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens <= 0:
            raise GenerationError("output token limit must be positive")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise GenerationError("at most four stop strings are supported")
        for stop in self.stop:
            if not isinstance(stop, str) or not 1 <= len(stop.encode("utf-8")) <= MAX_STOP_BYTES:
                raise GenerationError("stop strings must contain 1..=4096 UTF-8 bytes")


class Generation:
    """One request's §8.3 loop, driven from outside: forward ``next_input()``, then ``feed`` the logits.

    The prompt goes out in chunks of at most ``limit`` tokens; once it is complete every ``feed`` samples
    one token, and the next input is that token — except the last sampled token, which is never forwarded.
    ``session`` may be one whose cache already holds the start of the prompt (``hymt.prompt_cache``); the
    prompt then goes out from its position on.
    """

    def __init__(
        self,
        model: Any,
        request: GenerationRequest,
        *,
        context: int,
        cancel: Callable[[], bool] | None = None,
        session: Any = None,
    ) -> None:
        self._start = time.perf_counter()
        request.validate(context)
        self.model = model
        self.request = request
        self._cancel = cancel
        if session is None:
            session = model.new_session(context, cancel)
        elif (
            session.context != context
            or session.position >= len(request.prompt_ids)
            or session.tokens != list(request.prompt_ids[: session.position])
        ):
            raise GenerationError("the session does not hold a prefix of the prompt")
        self.session = session
        self.sampler = Sampler(request.sampling, model.config.vocab_size, request.prompt_ids)
        self.assembler = TextAssembler(request.stop)
        self._tokenizer = model.tokenizer
        self._end_ids = model.tokenizer.end_ids
        self._prompt_sent = session.position  # prompt tokens in the cache or handed out by next_input
        self._input: list[int] | None = None  # handed out, not yet fed
        self._next_token: int | None = None  # sampled token still to be forwarded
        self.token_ids: list[int] = []
        self._prefill_ms = 0.0
        self._first_token_ms = 0.0
        self.done = False
        self.completion: Completion | None = None

    @property
    def prefilling(self) -> bool:
        return self._prompt_sent < len(self.request.prompt_ids)

    def next_input(self, limit: int = PREFILL_CHUNK) -> list[int]:
        """Tokens to forward next: a prompt chunk of 1..=limit tokens, or the last sampled token; [] when
        done. Asking again before ``feed`` returns the same tokens."""
        if self.done:
            return []
        if self._input is None:
            if self.prefilling:
                prompt = self.request.prompt_ids
                chunk = list(prompt[self._prompt_sent : self._prompt_sent + max(1, limit)])
                self._prompt_sent += len(chunk)
                self._input = chunk
            else:
                self._input = [self._next_token] if self._next_token is not None else []
        return self._input

    def feed(self, logits: np.ndarray | None) -> str:
        """Logits of the last forwarded ``next_input()``; returns the newly released text (maybe "").

        None means the forward was cancelled for this session: the generation ends and this raises.
        """
        if self.done or self._input is None:
            raise GenerationError("feed() without a pending next_input()")
        self._input = None
        if logits is None:
            self.done = True
            raise GenerationError("request cancelled")
        if self.prefilling:
            return ""
        if not self.token_ids:
            self._prefill_ms = self._elapsed_ms()
        return self._step(logits)

    def _step(self, logits: np.ndarray) -> str:
        if self._cancel is not None and self._cancel():
            self.done = True
            raise GenerationError("request cancelled")
        token = self.sampler.sample(logits)
        if not self.token_ids:
            self._first_token_ms = self._elapsed_ms()
        self.token_ids.append(token)
        if token in self._end_ids:  # an end token produces no text
            return self._finish("stop")
        released = self.assembler.push(self._tokenizer.token_bytes(token))
        if self.assembler.stopped:
            return released + self._finish("stop")
        if len(self.token_ids) >= self.request.max_tokens:
            return released + self._finish("length")
        self._next_token = token
        return released

    def _finish(self, reason: str) -> str:
        tail = self.assembler.finish()
        total_ms = self._elapsed_ms()
        prompt_tokens = len(self.request.prompt_ids)
        completion_tokens = len(self.token_ids)
        self.completion = Completion(
            text=self.assembler.text,
            finish_reason=reason,
            usage=Usage(prompt_tokens, completion_tokens, prompt_tokens + completion_tokens),
            timing=Timing(
                prefill_ms=self._prefill_ms,
                first_token_ms=self._first_token_ms,
                decode_ms=total_ms - self._first_token_ms,
                total_ms=total_ms,
            ),
            token_ids=list(self.token_ids),
        )
        self._next_token = None
        self.done = True
        return tail

    def _elapsed_ms(self) -> float:
        return (time.perf_counter() - self._start) * 1000.0


class GenerationStream:
    """Iterator of text deltas of one generation run alone; ``.completion`` is set once it is exhausted."""

    def __init__(self, generation: Generation) -> None:
        self.generation = generation
        self._deltas = self._run()

    @property
    def completion(self) -> Completion | None:
        return self.generation.completion

    def __iter__(self) -> Iterator[str]:
        return self._deltas

    def __next__(self) -> str:
        return next(self._deltas)

    def _run(self) -> Iterator[str]:
        generation = self.generation
        forward = generation.model.forward
        while tokens := generation.next_input():
            delta = generation.feed(forward(generation.session, tokens))
            if delta:
                yield delta


def generate(
    model: Any,
    request: GenerationRequest,
    *,
    context: int,
    cancel: Callable[[], bool] | None = None,
) -> GenerationStream:
    """Validate and start one request on its own session; iterate the result for text deltas."""
    return GenerationStream(Generation(model, request, context=context, cancel=cancel))
