"""Sessions of finished requests, kept so the next prompt that starts the same way skips that part.

Translation traffic repeats itself at the front: every request of a client carries the same instruction
("Translate the following text into Chinese:"), and a conversation resends all its earlier turns. A
finished request's session still holds the keys and values of every token it saw (``Session.tokens``);
a new prompt sharing its first k tokens continues from it after ``rewind(k)`` and prefills only the rest.
Every per-token operation of the forward pass reads only that token's inputs and the cache, so the
result is bit-identical to prefilling the whole prompt on a fresh session: a request's output does not
depend on what ran before it.

Memory: at most ``limit`` sessions exist at once, counting those of running requests, so the KV memory
never exceeds what ``limit`` concurrent requests could hold anyway (the server's ``max_kv_bytes``). A
request that matches nothing gets a new session while that bound allows, else the least recently used
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
        self.hits = 0  # requests that continued from an idle session
        self.reused_tokens = 0  # prompt tokens those requests did not prefill

    @property
    def idle(self) -> int:
        return len(self._idle)

    def take(self, prompt: Sequence[int], busy: int, cancel: Callable[[], bool] | None = None) -> Any:
        """A session for a new request whose prompt is ``prompt``, while ``busy`` other sessions are in use.

        The idle session sharing the longest prefix with the prompt (at most all but its last token, whose
        logits the request needs) comes back rewound to that prefix; the most recent one wins a tie.
        """
        best, best_len = None, 0
        for index, session in enumerate(self._idle):
            length = min(shared_prefix(session.tokens, prompt), len(prompt) - 1)
            if length > 0 and length >= best_len:
                best, best_len = index, length
        if best is None:
            if busy + len(self._idle) < self.limit or not self._idle:
                return self.model.new_session(self.context, cancel)
            best, best_len = 0, 0  # reuse the least recently used one's memory, emptied
        else:
            self.hits += 1
            self.reused_tokens += best_len
        session = self._idle.pop(best)
        session.rewind(best_len)
        session.cancel = cancel
        return session

    def give(self, session: Any) -> None:
        """Keep a finished request's session; one left invalid by a failed forward is dropped."""
        if session.poisoned or session.position == 0:
            return
        session.cancel = None
        self._idle.append(session)

    def clear(self) -> None:
        self._idle.clear()
