"""The inference engine: admission, a FIFO queue for active slots, and one compute thread that runs
continuous batching over every active request (REFERENCE §9.6, §8.5).

Each engine step is ONE ``model.forward(batch)``: the next prompt chunk of every request still in prefill
and one decode token of every running request, so the weights stream from memory once per step for all of
them. The compute thread samples, assembles text and pushes events into each request's own queue; the
request's thread drains that queue at its own pace, so a slow or stalled client never blocks the engine or
the other requests. A new request continues from the session of a finished one when their prompts start
the same way (``hymt.prompt_cache``; same output bits, less prefill). A step that starts new prompts waits
a moment for requests arriving with them (``Engine._gather_new_prompts``), so a burst is prefilled in one forward.

Permits: ``admit()`` takes one of ``max_concurrent + queue_capacity`` permits without waiting (none left →
``QueueFull``). ``Ticket.start(request)`` queues the prepared request for one of ``max_concurrent`` active
slots (first in, first out). A ticket holds its slot until its owner closes it: a client that stops reading
keeps its slot, and its generation pauses once ``max_undelivered`` events wait unread, so it costs no
compute and never holds up the others. Closing an unfinished ticket cancels it: a queued one leaves the
queue at once, an active one stops at the model's next layer check.

The engine knows nothing about HTTP; ``hymt-bench --concurrency`` drives it through the same API::

    ticket = engine.submit(request)        # admit + start
    for delta in ticket: ...               # text deltas; raises GenerationError on failure/cancellation
    completion = ticket.completion
    ticket.close()
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hymt.errors import GenerationError, HymtError, ServerError
from hymt.generation import PREFILL_CHUNK, Completion, Generation, GenerationRequest
from hymt.prompt_cache import PromptCache

log = logging.getLogger("hymt.engine")

PAUSED_POLL_SECONDS = 0.01  # how often the engine looks again when every active request is paused
# Longest a step that starts new prompts waits for requests still being prepared (admitted, their prompts
# rendered and tokenized on their own threads) so that a burst of arrivals is prefilled in one forward.
PREPARE_WAIT_SECONDS = 0.05
# After a step that finished several requests, how long new prompts wait for as many to arrive: clients
# that got their answers together send their next requests together (translation workers in a loop).
RETURN_WAIT_SECONDS = 0.02


class QueueFull(ServerError):
    """No admission permit is left (HTTP 429)."""

    def __init__(self) -> None:
        super().__init__("Request queue is full")


class EngineClosed(ServerError):
    """The engine is shutting down and admits nothing new (HTTP 503)."""

    def __init__(self) -> None:
        super().__init__("Server is shutting down")


@dataclass(frozen=True)
class Event:
    """One item of a ticket's event queue.

    kind: ``started`` (value = unix seconds when the active slot was obtained), ``delta`` (value = text),
    ``done`` (value = Completion), ``error`` (value = message), ``cancelled`` (value = None).
    """

    kind: str
    value: Any = None


# Ticket states.
_ADMITTED = "admitted"  # holds an admission permit, request not yet given
_QUEUED = "queued"  # waiting for an active slot
_RUNNING = "running"  # holds a slot; the compute thread is working on it
_FINISHED = "finished"  # holds a slot; generation over (events may still be undelivered)
_CLOSED = "closed"


class Ticket:
    """One admitted request: its cancel flag, its event queue and its place in the engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.cancelled = False  # read by the model before every layer (through the session's cancel callable)
        self.created: int | None = None  # unix seconds when the active slot was obtained
        self.completion: Completion | None = None
        self.error: str | None = None
        self.request: GenerationRequest | None = None
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._state = _ADMITTED
        self._owner_closed = False
        # Owned by the compute thread:
        self._generation: Generation | None = None
        self._prompt_left = 0  # prompt tokens not yet handed to a forward

    def is_cancelled(self) -> bool:
        return self.cancelled

    @property
    def state(self) -> str:
        return self._state

    def start(self, request: GenerationRequest) -> None:
        """Queue the prepared request for an active slot (FIFO)."""
        self.engine._start(self, request)

    def cancel(self) -> None:
        """Ask the engine to stop this request; the permits are released when the owner closes it."""
        self.cancelled = True
        self.engine._cancel(self)

    def close(self) -> None:
        """Cancel if unfinished and give the permits back. Idempotent."""
        self.cancelled = self.cancelled or self._state in (_ADMITTED, _QUEUED, _RUNNING)
        self.engine._close(self)

    def next_event(self, timeout: float | None = None) -> Event | None:
        """The next event, or None when nothing arrived within ``timeout`` seconds."""
        try:
            return self._events.get(timeout=timeout)
        except queue.Empty:
            return None

    def __iter__(self) -> Iterator[str]:
        """Text deltas until the completion (set on ``self.completion``); raises on failure or cancellation."""
        while True:
            event = self.next_event()
            assert event is not None
            if event.kind == "delta":
                yield event.value
            elif event.kind == "done":
                return
            elif event.kind == "error":
                raise GenerationError(event.value)
            elif event.kind == "cancelled":
                raise GenerationError("request cancelled")

    def result(self) -> Completion:
        """Wait for the end and return the completion."""
        for _ in self:
            pass
        assert self.completion is not None
        return self.completion

    def __enter__(self) -> Ticket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _push(self, event: Event) -> None:
        self._events.put(event)


class Engine:
    """Owns the model on one compute thread; see the module docstring."""

    def __init__(
        self,
        model: Any,
        *,
        max_concurrent: int,
        queue_capacity: int,
        context: int,
        prefill_chunk: int = PREFILL_CHUNK,
        max_undelivered: int = 64,
        prompt_cache: bool = True,
    ) -> None:
        if max_concurrent < 1:
            raise ServerError("concurrency and threads must be positive")
        if queue_capacity < 0:
            raise ServerError("queue capacity must not be negative")
        if not 1 <= prefill_chunk <= PREFILL_CHUNK:
            raise ServerError(f"prefill chunk must be between 1 and {PREFILL_CHUNK}")
        self.model = model
        self.max_concurrent = max_concurrent
        self.queue_capacity = queue_capacity
        self.context = context
        self.prefill_chunk = prefill_chunk
        self.max_undelivered = max(1, max_undelivered)  # events a request may have unread before it pauses
        # finished requests' sessions (compute thread only); at most max_concurrent sessions exist at once
        self.prompt_cache = PromptCache(model, context, max_concurrent) if prompt_cache else None
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._admitted = 0  # tickets holding an admission permit
        self._slots = 0  # tickets holding an active slot (running or finished, not yet closed)
        self._waiting: deque[Ticket] = deque()  # queued tickets, first in first out
        self._incoming: list[Ticket] = []  # just given a slot; the compute thread picks them up
        self._tickets: set[Ticket] = set()  # every unclosed ticket (shutdown cancels them)
        self._returning = 0  # requests the last step finished, if 2 or more: their clients may come back
        self._returning_until = 0.0  # time.monotonic() until which new prompts wait for them
        self._closed = False  # no new admissions
        self._stopping = False  # the compute thread exits once nothing is left to run
        self._thread = threading.Thread(target=self._run, name="hymt-engine", daemon=True)
        self._thread.start()

    # ---- public API -------------------------------------------------------------------------------------

    def admit(self) -> Ticket:
        """Take an admission permit without waiting; ``QueueFull`` or ``EngineClosed`` otherwise."""
        with self._lock:
            if self._closed:
                raise EngineClosed()
            if self._admitted >= self.max_concurrent + self.queue_capacity:
                raise QueueFull()
            self._admitted += 1
            ticket = Ticket(self)
            self._tickets.add(ticket)
            return ticket

    def submit(self, request: GenerationRequest) -> Ticket:
        """Admit and start a prepared request (the plain API for programs and tests)."""
        ticket = self.admit()
        try:
            ticket.start(request)
        except BaseException:
            ticket.close()
            raise
        return ticket

    @property
    def admitted(self) -> int:
        """Requests holding an admission permit (active + queued + being prepared)."""
        return self._admitted

    @property
    def active(self) -> int:
        """Requests holding an active slot."""
        return self._slots

    @property
    def closed(self) -> bool:
        return self._closed

    def stop_admitting(self) -> None:
        """New ``admit()`` calls fail with ``EngineClosed``; running work continues."""
        with self._lock:
            self._closed = True

    def cancel_all(self) -> None:
        """Cancel every unclosed request (queued ones are told at once, running ones at the next layer)."""
        with self._lock:
            tickets = list(self._tickets)
        for ticket in tickets:
            ticket.cancel()

    def shutdown(self, timeout: float | None = 5.0) -> None:
        """Stop admitting, cancel everything and stop the compute thread."""
        with self._lock:
            self._closed = True
        self.cancel_all()
        with self._lock:
            self._stopping = True
            self._wake.notify_all()
        self._thread.join(timeout)

    # ---- ticket transitions (any thread) ------------------------------------------------------------

    def _start(self, ticket: Ticket, request: GenerationRequest) -> None:
        with self._lock:
            if ticket._state != _ADMITTED:
                raise ServerError("request already started")
            ticket.request = request
            if ticket.cancelled:
                ticket._state = _FINISHED
                ticket._push(Event("cancelled"))
                return
            ticket._state = _QUEUED
            self._waiting.append(ticket)
            self._promote()
            self._wake.notify_all()  # one fewer request being prepared (_gather_new_prompts)

    def _cancel(self, ticket: Ticket) -> None:
        with self._lock:
            if ticket._state == _QUEUED:
                self._waiting.remove(ticket)
                ticket._state = _FINISHED  # no slot was taken
                ticket._push(Event("cancelled"))
            elif ticket._state == _RUNNING:
                self._wake.notify_all()

    def _close(self, ticket: Ticket) -> None:
        with self._lock:
            if ticket._owner_closed:
                return
            ticket._owner_closed = True
            if ticket._state == _QUEUED:
                self._waiting.remove(ticket)
                ticket._state = _ADMITTED  # released below without a slot
            if ticket._state == _RUNNING:
                # The compute thread still uses the session; it releases the permits when it drops it.
                self._wake.notify_all()
                return
            self._release(ticket)

    def _release(self, ticket: Ticket) -> None:
        """Give back the ticket's permits (lock held)."""
        if ticket._state == _CLOSED:
            return
        if ticket._state == _FINISHED and ticket.created is not None:
            self._slots -= 1
        ticket._state = _CLOSED
        self._admitted -= 1
        self._tickets.discard(ticket)
        self._promote()
        self._wake.notify_all()  # it may have been one being prepared (_gather_new_prompts)

    def _promote(self) -> None:
        """Move queued tickets into free active slots, oldest first (lock held)."""
        while self._waiting and self._slots < self.max_concurrent:
            ticket = self._waiting.popleft()
            self._slots += 1
            ticket._state = _RUNNING
            ticket.created = int(time.time())
            ticket._push(Event("started", ticket.created))
            self._incoming.append(ticket)
            self._wake.notify_all()

    # ---- compute thread -------------------------------------------------------------------------------

    def _run(self) -> None:
        running: list[Ticket] = []  # tickets with a live Generation, in admission order
        while True:
            with self._lock:
                while not self._incoming and not running and not self._stopping:
                    self._wake.wait()
                if self._stopping and not self._incoming and not running:
                    if self.prompt_cache is not None:
                        self.prompt_cache.clear()
                    return
                self._gather_new_prompts()
                incoming, self._incoming = self._incoming, []
            for ticket in incoming:
                self._begin(ticket, running)
            running = [t for t in running if not self._drop_if_cancelled(t)]
            # A request whose owner stopped reading pauses here (keeping its slot and session) instead of
            # spending compute on text nobody collects; it resumes once its queue drains.
            ready = [t for t in running if t._events.qsize() < self.max_undelivered]
            if running and not ready:
                with self._lock:
                    self._wake.wait(PAUSED_POLL_SECONDS)
                continue
            if ready:
                try:
                    self._step(ready)
                except Exception as exc:  # a failed forward fails its batch, never the engine
                    log.exception("engine step failed")
                    message = exc.message if isinstance(exc, HymtError) else "internal error"
                    for ticket in ready:
                        self._finish(ticket, Event("error", message))
                running = [t for t in running if t._state == _RUNNING]

    def _gather_new_prompts(self) -> None:
        """Before a step that starts new prompts, wait briefly for more of them (lock held), so that requests
        arriving together are prefilled in one forward rather than one by one, each prompt forward streaming
        all the weights. Clients answered in the same step send their next requests together, a few
        milliseconds apart (HTTP, four Q4_K streams: the first was prefilled alone, 94–107 ms, then the other
        three, 157–171 ms, where all four took ~190 ms). So the step waits for requests being prepared
        (admitted, prompts rendered and tokenized on their threads; at most PREPARE_WAIT_SECONDS) and, up to
        RETURN_WAIT_SECONDS after a step that finished several requests, for as many new ones. A lone
        request, or one after a single answer, waits for nothing."""
        prepared_until = time.monotonic() + PREPARE_WAIT_SECONDS
        while self._incoming and not self._stopping:
            if any(t.request is None for t in self._tickets):
                until = max(prepared_until, self._returning_until)
            elif len(self._incoming) < self._returning and not self._waiting:  # (queued ones have no slot)
                until = self._returning_until
            else:
                break
            left = until - time.monotonic()
            if left <= 0:
                break
            self._wake.wait(left)
        if self._incoming:
            self._returning = 0

    def _begin(self, ticket: Ticket, running: list[Ticket]) -> None:
        """Create the request's generation, on a session that may already hold its prompt's start."""
        if ticket.cancelled:
            self._finish(ticket, Event("cancelled"))
            return
        request = ticket.request
        assert request is not None
        session = None
        try:
            if self.prompt_cache is not None:
                busy = [t._generation.session for t in running if t._generation is not None]
                session = self.prompt_cache.take(request.prompt_ids, busy, ticket.is_cancelled)
                if session.position:
                    log.debug(
                        "prompt cache: %d of %d prompt tokens reused",
                        session.position,
                        len(request.prompt_ids),
                    )
            ticket._generation = Generation(
                self.model, request, context=self.context, cancel=ticket.is_cancelled, session=session
            )
        except Exception as exc:  # e.g. no memory for the KV cache: this request fails, the engine goes on
            if session is not None and self.prompt_cache is not None:
                self.prompt_cache.give(session)
            if not isinstance(exc, HymtError):
                log.exception("starting a generation failed")
            self._finish(
                ticket, Event("error", exc.message if isinstance(exc, HymtError) else "internal error")
            )
            return
        ticket._prompt_left = len(request.prompt_ids) - ticket._generation.session.position
        running.append(ticket)

    def _drop_if_cancelled(self, ticket: Ticket) -> bool:
        if ticket.cancelled:
            self._finish(ticket, Event("cancelled"))
            return True
        return False

    def _step(self, running: list[Ticket]) -> None:
        """One batched forward: a prompt chunk for prefilling requests, one token for decoding ones.

        While any request decodes, the prompt chunks of a step add up to at most ``prefill_chunk`` tokens
        (oldest requests first, at least one chunk), so a long prompt delays the others' next token by one
        chunk at most. A request's prompt is cut into ``prefill_chunk``-token pieces from where its session
        starts, whatever else runs (and since every per-token operation reads only that token's inputs and
        the cache, where a prompt is cut does not change its bits either).
        """
        decoding = any(not t._generation.prefilling for t in running)
        members: list[Ticket] = []
        batch: list[tuple[Any, list[int]]] = []
        prefill_tokens = 0
        decode_tokens = 0
        for ticket in running:
            generation = ticket._generation
            prefilling = generation.prefilling
            if prefilling:
                size = min(self.prefill_chunk, ticket._prompt_left)
                if decoding and prefill_tokens and prefill_tokens + size > self.prefill_chunk:
                    continue
                prefill_tokens += size
            tokens = generation.next_input(self.prefill_chunk)
            if prefilling:
                ticket._prompt_left -= len(tokens)
            else:
                decode_tokens += 1
            members.append(ticket)
            batch.append((generation.session, tokens))
        started = time.perf_counter()
        results = self.model.forward(batch)
        # what each forward carried and took: where a server's time goes (prompts against decode steps)
        log.debug(
            "engine step sequences=%d prompt_tokens=%d decode_tokens=%d forward_ms=%.1f",
            len(batch),
            prefill_tokens,
            decode_tokens,
            (time.perf_counter() - started) * 1e3,
        )
        finished = 0
        for ticket, logits in zip(members, results, strict=True):
            generation = ticket._generation
            if logits is None or ticket.cancelled:
                self._finish(ticket, Event("cancelled"))
                continue
            try:
                delta = generation.feed(logits)
            except HymtError as exc:
                self._finish(ticket, Event("cancelled" if ticket.cancelled else "error", exc.message))
                continue
            if delta:
                ticket._push(Event("delta", delta))
            if generation.done:
                ticket.completion = generation.completion
                self._finish(ticket, Event("done", generation.completion))
                finished += 1
        if finished >= 2:
            with self._lock:
                self._returning = finished
                self._returning_until = time.monotonic() + RETURN_WAIT_SECONDS

    def _finish(self, ticket: Ticket, event: Event) -> None:
        """The generation is over: keep or free its session, tell the owner, release if the owner left."""
        generation, ticket._generation = ticket._generation, None
        if generation is not None and self.prompt_cache is not None:
            self.prompt_cache.give(generation.session)
        with self._lock:
            if ticket._state != _RUNNING:
                return  # already finished (a failed step may report a ticket twice)
            if event.kind == "error":
                ticket.error = event.value
            ticket._state = _FINISHED
            ticket._push(event)
            if ticket._owner_closed:
                self._release(ticket)
