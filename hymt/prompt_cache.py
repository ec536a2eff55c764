"""Sessions of finished requests, kept so the next prompt that starts the same way skips that part.

Translation traffic repeats itself at the front: every request of a client carries the same instruction
("Translate the following text into Chinese:"), and a conversation resends all its earlier turns. A
finished request's session still holds the keys and values of every token it saw (``Session.tokens``);
a new prompt sharing its first k tokens continues from it after ``rewind(k)`` and prefills only the rest.
When a running request's session shares more (requests that arrived together after a common one, a
conversation that is still generating), its first k positions are copied instead (``copy_prefix``:
128 KiB per position on the 1.8B, far cheaper than computing them). A copy also keeps an idle session
whole when the new prompt leaves it before its own end (a different text after the same instruction):
rewinding it would throw away the part that a repeat of its prompt would reuse.
Every per-token operation of the forward pass reads only that token's inputs and the cache, so the
result is bit-identical to prefilling the whole prompt on a fresh session: a request's output does not
depend on what ran before it.

Memory: at most ``limit`` sessions exist at once, counting those of running requests, so the KV memory
never exceeds what ``limit`` concurrent requests could hold anyway (the server's ``max_kv_bytes``). A
request that gets no idle session gets a new one while that bound allows, else the least recently used
idle one, emptied.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def shared_prefix(tokens: Sequence[int], prompt: Sequence[int]) -> int:
    """Length of the longest common prefix of two id lists."""
    n = min(len(tokens), len(prompt))
    i = 0
    while i < n and tokens[i] == prompt[i]:
        i += 1
    return i


class PromptCache:
    """Idle sessions of one model and context, most recently finished last; used by one thread."""

    def __init__(self, model: Any, context: int, limit: int) -> None:
        self.model = model
        self.context = context
        self.limit = limit  # sessions alive at once, idle ones included
        self._idle: list[Any] = []  # Session, least recently used first
        self.hits = 0  # requests that started from another request's cache (handed over or copied)
        self.reused_tokens = 0  # prompt tokens those requests did not prefill

    @property
    def idle(self) -> int:
        return len(self._idle)

    def take(
        self, prompt: Sequence[int], busy: Sequence[Any], cancel: Callable[[], bool] | None = None
    ) -> Any:
        """A session for a new request whose prompt is ``prompt``; ``busy`` are the running requests' sessions.

        The longest prefix shared with the prompt (at most all but its last token, whose logits the request
        needs) comes from an idle session, or, when a running request's session shares more (requests that
        arrived together, a conversation still generating), is copied from that one; the most recent idle
        session wins a tie. The idle session is handed over rewound when the prompt holds all of it, or all
        but its tail after the prompt (a repeat: the request writes that tail again). When the prompt leaves
        it earlier (the same instruction, another text), its shared part is copied and the session stays
        idle for a repeat of its own prompt: into a new session while the bound allows, else into the least
        recently used idle one (rewound itself when that is the least recently used).
        """
        idle_index, idle_length = self._longest(self._idle, prompt)
        busy_index, busy_length = self._longest(busy, prompt)
        room = len(busy) + len(self._idle) < self.limit
        if idle_length and idle_length >= busy_length:
            best = self._idle[idle_index]
            if idle_length in (len(prompt) - 1, best.position) or (not room and idle_index == 0):
                session = self._idle.pop(idle_index)
                session.rewind(idle_length)
            else:  # the prompt leaves it before its end: keep it whole, copy the shared part
                session = self.model.new_session(self.context) if room else self._idle.pop(0)
                session.copy_prefix(best, idle_length)
            reused = idle_length
        else:
            if room or not self._idle:
                session = self.model.new_session(self.context)
            else:  # at the bound: the least recently used idle session's memory, emptied
                session = self._idle.pop(0)
            if busy_length:
                session.copy_prefix(busy[busy_index], busy_length)
            else:
                session.rewind(0)
            reused = busy_length
        if reused:
            self.hits += 1
            self.reused_tokens += reused
        session.cancel = cancel
        return session

    @staticmethod
    def _longest(sessions: Sequence[Any], prompt: Sequence[int]) -> tuple[int, int]:
        """(index, length) of the session sharing the longest usable prefix, the last one on a tie."""
        best_index, best_length = 0, 0
        for index, session in enumerate(sessions):
            length = min(shared_prefix(session.tokens, prompt), len(prompt) - 1)
            if length and length >= best_length:
                best_index, best_length = index, length
        return best_index, best_length

    def give(self, session: Any) -> None:
        """Keep a finished request's session; one left invalid by a failed forward is dropped."""
        if session.poisoned or session.position == 0:
            return
        session.cancel = None
        self._idle.append(session)

    def clear(self) -> None:
        self._idle.clear()
