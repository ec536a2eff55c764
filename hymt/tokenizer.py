"""Hy-MT2 byte-level BPE tokenizer built from GGUF metadata alone (REFERENCE.md §6).

Reproduces the official Hugging Face `tokenizers` pipelines id for id:

    text ──added tokens (leftmost-longest, anywhere)──► segments
         ──pre-tokenizer (Isolated regex splits, §6.3)──► pieces
         ──GPT-2 byte map (§6.4)──► byte characters ──BPE (lowest rank first, leftmost on ties)──► ids

Encoding never adds BOS/EOS (the chat template already has them); decoding is lossy UTF-8 where control
tokens produce no text. BPE runs per pre-token piece and is cached, so real text mostly hits the cache.
"""

from __future__ import annotations

import heapq
import operator
import re
from collections.abc import Iterable, Sequence
from itertools import repeat
from os import PathLike
from typing import TYPE_CHECKING, Any

import numpy as np
import regex

from hymt.errors import TokenizerError

if TYPE_CHECKING:
    from hymt.gguf import GGUFFile

__all__ = ["BYTE_DECODER", "BYTE_ENCODER", "PRETOKENIZERS", "Tokenizer"]

# Token types of tokenizer.ggml.token_type (§6.1).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPECIAL_TYPES = frozenset({UNKNOWN, CONTROL, UNUSED})  # added tokens that never appear in decoded text
ADDED_TYPES = frozenset({UNKNOWN, CONTROL, USER_DEFINED, UNUSED})  # matched in raw text before pre-tokenizing

# §6.3, exact strings. `hunyuan-dense` is three sequential stages; `hunyuan` one Qwen2-style stage.
PRETOKENIZERS: dict[str, tuple[str, ...]] = {
    "hunyuan-dense": (
        r"\p{N}{1,3}",
        r"[一-龥぀-ゟ゠-ヿ]+",
        r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    ),
    "hunyuan": (
        r"""(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    ),
}

END_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")

# Distinct pre-token pieces remembered by one tokenizer; the cache is emptied when it reaches this size.
CACHE_LIMIT = 1 << 16
# Pieces longer than this (in bytes) use the O(n log n) heap merge and are not cached.
LONG_PIECE = 128


def _byte_encoder() -> tuple[str, ...]:
    """GPT-2 byte map (§6.4): printable Latin-1 bytes keep their code point, the other 68 move to U+0100+."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars: list[str] = [""] * 256
    shifted = 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + shifted)
            shifted += 1
    return tuple(chars)


BYTE_ENCODER: tuple[str, ...] = _byte_encoder()  # byte value → byte character
BYTE_DECODER: dict[str, int] = {c: b for b, c in enumerate(BYTE_ENCODER)}  # byte character → byte value
# Code point → byte value for every byte character, −1 for every other code point up to U+0144 (the last
# entry stands for everything above).
_BYTE_VALUES = np.full(0x145, -1, dtype=np.int16)
_BYTE_VALUES[[ord(c) for c in BYTE_ENCODER]] = np.arange(256)
# str.translate table: Latin-1 character (one UTF-8 byte) → its byte character.
_FROM_LATIN1: dict[int, str] = dict(enumerate(BYTE_ENCODER))
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class Tokenizer:
    """Byte-level BPE of the Hy-MT2 models; build with `from_gguf` or from plain Python data.

    `tokens[i]` is the string of id i in GPT-2 byte form (added tokens in plain text), `token_types[i]` its
    §6.1 type, `merges` the `"left right"` BPE merges in rank order.
    """

    def __init__(
        self,
        tokens: Sequence[str],
        token_types: Sequence[int] | np.ndarray | None,
        merges: Sequence[str],
        *,
        bos_id: int | None,
        eos_id: int | None,
        pre: str,
        eot_id: int | None = None,
        eom_id: int | None = None,
        chat_template: str = "",
        model: str = "gpt2",
    ) -> None:
        if model != "gpt2":
            raise TokenizerError("only the Hy-MT2 byte BPE tokenizer is supported")
        if pre not in PRETOKENIZERS:
            raise TokenizerError(f"unsupported Hy-MT2 pretokenizer {pre}")
        tokens = list(tokens)
        n_vocab = len(tokens)
        if token_types is None:
            raise TokenizerError("missing token types")
        types = np.asarray(token_types)
        if types.ndim != 1 or len(types) != n_vocab:
            raise TokenizerError("vocabulary and token type counts differ")
        if n_vocab and not np.issubdtype(types.dtype, np.integer):
            raise TokenizerError("missing token types")
        bad = np.flatnonzero((types < NORMAL) | (types > BYTE))
        if len(bad):
            raise TokenizerError(f"unsupported token type {int(types[bad[0]])}")

        self._vocab: dict[str, int] = dict(zip(tokens, range(n_vocab), strict=True))
        if len(self._vocab) != n_vocab:
            seen: set[str] = set()
            for i, token in enumerate(tokens):
                if token in seen:
                    raise TokenizerError(f"duplicate or remapped vocabulary token at {i}")
                seen.add(token)

        merges = list(merges)
        if not all(map(operator.contains, merges, repeat(" "))):
            raise TokenizerError("invalid BPE merge")
        # A merge "a b" splits at its first space; byte characters never contain a space, so keying the
        # ranks by the joined text `a + " " + b` is exact and saves splitting 128k strings at load.
        self._ranks: dict[str, int] = dict(zip(merges, range(len(merges)), strict=True))
        if len(self._ranks) != len(merges):  # a repeated merge keeps its first rank, as llama.cpp does
            self._ranks = {}
            for rank, merge in enumerate(merges):
                self._ranks.setdefault(merge, rank)
        self._no_rank = len(merges)  # sentinel rank, above every real one

        end_ids: set[int] = set()
        for key, value in zip(END_KEYS, (eos_id, eot_id, eom_id), strict=True):
            if value is not None:
                if not 0 <= value < n_vocab:
                    raise TokenizerError(f"{key} is outside the vocabulary")
                end_ids.add(int(value))
        if not end_ids:
            raise TokenizerError("GGUF does not declare an end token")
        if bos_id is None:
            raise TokenizerError("missing or invalid integer metadata tokenizer.ggml.bos_token_id")
        if not 0 <= bos_id < n_vocab:
            raise TokenizerError("BOS is outside the vocabulary")
        if eos_id is None:
            raise TokenizerError("missing or invalid integer metadata tokenizer.ggml.eos_token_id")

        self.vocab_size: int = n_vocab
        self.bos_id: int = int(bos_id)
        self.eos_id: int = int(eos_id)
        self.end_ids: frozenset[int] = frozenset(end_ids)
        self.bos_token: str = tokens[self.bos_id]
        self.eos_token: str = tokens[self.eos_id]
        self.chat_template: str = chat_template
        self.pre: str = pre
        self.tokens: tuple[str, ...] = tuple(tokens)
        self.token_types: np.ndarray = types.astype(np.int8)
        # One capturing group per stage, so split() keeps the matches (an Isolated split).
        self._stages = tuple(regex.compile(f"({p})") for p in PRETOKENIZERS[pre])
        self._pieces: list[bytes] = _decode_pieces(tokens, types)

        added = [i for i in np.flatnonzero(np.isin(types, list(ADDED_TYPES))).tolist() if tokens[i]]
        self._added: dict[str, int] = {tokens[i]: i for i in added}
        # Longest first: an alternation of literals is leftmost-first, which this makes leftmost-longest.
        alternatives = sorted(self._added, key=len, reverse=True)
        self._added_split = re.compile("(" + "|".join(map(re.escape, alternatives)) + ")") if added else None
        self._cache: dict[str, tuple[int, ...]] = {}

    @classmethod
    def from_gguf(cls, gguf_file_or_path: GGUFFile | str | PathLike[str]) -> Tokenizer:
        """Build from an open `hymt.gguf.GGUFFile` or a GGUF path (opened, read and closed here)."""
        if isinstance(gguf_file_or_path, (str, PathLike)):
            from hymt.gguf import GGUFFile

            with GGUFFile(gguf_file_or_path) as gguf_file:
                return cls.from_metadata(gguf_file.metadata)
        return cls.from_metadata(gguf_file_or_path.metadata)

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any]) -> Tokenizer:
        """Build from a GGUF metadata dict (string arrays as lists, numeric arrays as numpy arrays)."""
        model = _string(metadata, "tokenizer.ggml.model")
        if model != "gpt2":
            raise TokenizerError("only the Hy-MT2 byte BPE tokenizer is supported")
        return cls(
            _string_array(metadata, "tokenizer.ggml.tokens"),
            metadata.get("tokenizer.ggml.token_type"),
            _string_array(metadata, "tokenizer.ggml.merges"),
            bos_id=_optional_int(metadata, "tokenizer.ggml.bos_token_id"),
            eos_id=_optional_int(metadata, "tokenizer.ggml.eos_token_id"),
            eot_id=_optional_int(metadata, "tokenizer.ggml.eot_token_id"),
            eom_id=_optional_int(metadata, "tokenizer.ggml.eom_token_id"),
            pre=_string(metadata, "tokenizer.ggml.pre"),
            chat_template=_string(metadata, "tokenizer.chat_template"),
            model=model,
        )

    # ---- encoding -------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`: added tokens anywhere, the rest pre-tokenized and BPE-merged. No BOS/EOS."""
        if not isinstance(text, str):
            raise TokenizerError("text to encode must be a string")
        ids: list[int] = []
        if self._added_split is None:
            self._encode_ordinary(text, ids)
            return ids
        # split() with one group alternates [text, added token, text, added token, ..., text].
        parts = self._added_split.split(text)
        added = self._added
        for k, part in enumerate(parts):
            if k & 1:
                ids.append(added[part])
            elif part:
                self._encode_ordinary(part, ids)
        return ids

    def _encode_ordinary(self, text: str, ids: list[int]) -> None:
        """Append the ids of text that holds no added token."""
        pieces = [text]
        for stage in self._stages:  # Isolated: every match and every gap becomes a piece
            pieces = [p for piece in pieces for p in stage.split(piece) if p]
        cache = self._cache
        for piece in pieces:
            piece_ids = cache.get(piece)
            if piece_ids is None:
                piece_ids = self._bpe(piece)
                if len(piece) <= LONG_PIECE:  # long pieces rarely repeat: not worth their memory
                    if len(cache) >= CACHE_LIMIT:
                        cache.clear()
                    cache[piece] = piece_ids
            ids.extend(piece_ids)

    def _bpe(self, piece: str) -> tuple[int, ...]:
        """BPE of one pre-token piece: merge the lowest-rank adjacent pair (leftmost on ties) until none."""
        try:
            raw = piece.encode("utf-8")
        except UnicodeEncodeError:  # JSON can carry "\ud800"; UTF-8 (and the official tokenizers) cannot
            raise TokenizerError("text contains a lone surrogate code point") from None
        symbols = list(raw.decode("latin-1").translate(_FROM_LATIN1))
        if len(symbols) > LONG_PIECE:
            symbols = self._merge_long(symbols)
        elif len(symbols) > 1:
            self._merge_short(symbols)
        vocab = self._vocab
        try:
            return tuple([vocab[s] for s in symbols])
        except KeyError as missing:
            raise TokenizerError(
                f"the vocabulary has no token for the BPE symbol {missing.args[0]!r} of {piece[:100]!r}"
            ) from None

    def _merge_short(self, symbols: list[str]) -> None:
        """In place. O(n) per merge, but C-level min/index over a list: fastest for word-sized pieces."""
        rank_of = self._ranks.get
        none = self._no_rank
        # pair_ranks[j] = rank of (symbols[j], symbols[j + 1]); a trailing sentinel keeps min() defined.
        pair_ranks = [rank_of(a + " " + b, none) for a, b in zip(symbols, symbols[1:], strict=False)]
        pair_ranks.append(none)
        while True:
            best = min(pair_ranks)
            if best == none:
                return
            i = pair_ranks.index(best)  # first occurrence = leftmost
            merged = symbols[i] + symbols[i + 1]
            symbols[i : i + 2] = (merged,)
            del pair_ranks[i]
            if i + 1 < len(symbols):
                pair_ranks[i] = rank_of(merged + " " + symbols[i + 1], none)
            if i:
                pair_ranks[i - 1] = rank_of(symbols[i - 1] + " " + merged, none)

    def _merge_long(self, symbols: list[str]) -> list[str]:
        """The same merges in O(n log n) for long pieces (a 1 MB word without spaces is one piece).

        A heap of `rank << 32 | position` over a linked list of symbols; positions are original byte
        indices, so heap order is "lowest rank, leftmost first". A popped entry is current exactly when its
        position still starts a pair with that rank (ranks identify pairs), otherwise it is skipped.
        """
        rank_of = self._ranks.get
        n = len(symbols)
        right = [*range(1, n), -1]  # next live symbol, -1 at the end
        left = list(range(-1, n - 1))  # previous live symbol, -1 at the start
        heap = []
        for i in range(n - 1):
            rank = rank_of(symbols[i] + " " + symbols[i + 1])
            if rank is not None:
                heap.append(rank << 32 | i)
        heapq.heapify(heap)
        pop, push, low = heapq.heappop, heapq.heappush, (1 << 32) - 1
        while heap:
            entry = pop(heap)
            i = entry & low
            j = right[i]
            if j == -1 or symbols[i] is None or rank_of(symbols[i] + " " + symbols[j]) != entry >> 32:
                continue
            merged = symbols[i] = symbols[i] + symbols[j]
            symbols[j] = None  # merged away
            k = right[i] = right[j]
            if k != -1:
                left[k] = i
                rank = rank_of(merged + " " + symbols[k])
                if rank is not None:
                    push(heap, rank << 32 | i)
            h = left[i]
            if h != -1:
                rank = rank_of(symbols[h] + " " + merged)
                if rank is not None:
                    push(heap, rank << 32 | h)
        return [s for s in symbols if s is not None]

    # ---- decoding -------------------------------------------------------------------------------------

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token `token_id` contributes to decoded text (b"" for special tokens)."""
        if not 0 <= token_id < self.vocab_size:
            raise TokenizerError("token ID outside vocabulary")
        return self._pieces[token_id]

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """Concatenated byte pieces of `ids`."""
        ids = list(ids)
        if ids and (min(ids) < 0 or max(ids) >= self.vocab_size):
            raise TokenizerError("token ID outside vocabulary")
        return b"".join(map(self._pieces.__getitem__, ids))

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`; invalid UTF-8 sequences become U+FFFD, control tokens produce nothing."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, pre={self.pre!r}, added={len(self._added)})"


def _decode_pieces(tokens: list[str], types: np.ndarray) -> list[bytes]:
    """Byte piece of every token (§6.5), checked once at load."""
    pieces = np.full(len(tokens), b"", dtype=object)
    normal = np.flatnonzero(types == NORMAL)
    if len(normal):
        # All normal tokens in one vectorised pass: code points → byte values through _BYTE_VALUES, then
        # sliced by character count (one byte character = one byte).
        texts = [tokens[i] for i in normal.tolist()]
        code_points = np.frombuffer("".join(texts).encode("utf-32-le"), dtype=np.uint32)
        values = _BYTE_VALUES[np.minimum(code_points, len(_BYTE_VALUES) - 1)]
        if (values < 0).any():
            for i, text in zip(normal.tolist(), texts, strict=True):
                if any(c not in BYTE_DECODER for c in text):
                    raise TokenizerError(f"invalid byte BPE character in token {i}")
        raw = values.astype(np.uint8).tobytes()
        ends = np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))).tolist()
        pieces[normal] = [raw[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]
    for i in np.flatnonzero(types == BYTE).tolist():
        match = _BYTE_TOKEN.fullmatch(tokens[i])
        if match is None:
            raise TokenizerError("invalid byte token")
        pieces[i] = bytes((int(match.group(1), 16),))
    for i in np.flatnonzero(types == USER_DEFINED).tolist():
        pieces[i] = tokens[i].encode("utf-8")
    return pieces.tolist()


def _string(metadata: dict[str, Any], key: str) -> str:
    value = metadata.get(key)
    if not isinstance(value, str):
        raise TokenizerError(f"missing or invalid string metadata {key}")
    return value


def _string_array(metadata: dict[str, Any], key: str) -> list[str]:
    value = metadata.get(key)
    if not isinstance(value, list) or not set(map(type, value)) <= {str}:
        raise TokenizerError(f"missing or invalid string array metadata {key}")
    return value


def _optional_int(metadata: dict[str, Any], key: str) -> int | None:
    value = metadata.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise TokenizerError(f"missing or invalid integer metadata {key}")
    return int(value)
