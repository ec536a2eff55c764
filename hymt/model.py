"""Hy-MT2 inference: configuration, weights, sessions with KV cache, and the batched forward pass.

REFERENCE.md §4 (graphs) and §5 (sessions). Two families share one forward loop:

* ``hunyuan-dense`` (1.8B, 7B): RoPE then per-head Q/K RMSNorm, SwiGLU FFN in every block, tied or
  separate output head;
* ``hy_v3`` (30B-A3B): per-head Q/K RMSNorm then RoPE, a dense FFN in block 0 and a sigmoid-routed
  mixture of experts with an ungated shared expert in every later block; separate output head.

Weights stay packed in the memory-mapped GGUF (matrix products go through ``hymt.quant``); only 1-D
norm/bias tensors are decoded, once, at load. ``Model.forward`` takes a batch of (session, tokens) pairs
and runs every matrix product once over all their tokens; attention runs per session over its own cache.
Every per-token operation reads only that token's inputs, so a session's logits are bit-identical
whether it runs alone or batched, and independent of the thread count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hymt import kernels, quant
from hymt._kernels import ops
from hymt._kernels import quant as _quant
from hymt.errors import ModelError
from hymt.gguf import GGUFFile, GGUFTensor

if TYPE_CHECKING:
    from hymt.tokenizer import Tokenizer

PREFILL_CHUNK = 256  # most tokens one forward call takes per session
KV_GROWTH = 256  # the KV cache grows in steps of this many positions
ARCHITECTURES = ("hunyuan-dense", "hy_v3")


# ----------------------------------------------------------------------------------------------------
# configuration


@dataclass(frozen=True)
class ModelConfig:
    """Model hyperparameters read from the ``{arch}.`` GGUF metadata (REFERENCE.md §4.1)."""

    architecture: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int  # attention.key_length, never hidden / heads (the 30B's query width 4096 != hidden)
    context_length: int
    rope_base: float
    rms_epsilon: float
    vocab_size: int
    ffn_width: int  # dense FFN width (every dense block; HyV3 block 0)
    experts: int = 0  # HyV3 only, below
    experts_used: int = 0
    expert_ffn_width: int = 0
    shared_ffn_width: int = 0
    expert_weights_norm: bool = False
    expert_weights_scale: float = 1.0

    @property
    def is_moe(self) -> bool:
        return self.architecture == "hy_v3"

    @property
    def kv_bytes_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * 4

    def is_moe_block(self, layer: int) -> bool:
        return self.is_moe and layer > 0

    def as_dict(self) -> dict[str, Any]:
        """The ``config`` record of REFERENCE.md §10.3."""
        keys = ("architecture", "context_length", "head_dim", "heads", "hidden", "kv_heads", "layers")
        record = {key: getattr(self, key) for key in keys}
        record.update(rms_epsilon=self.rms_epsilon, rope_base=self.rope_base, vocab_size=self.vocab_size)
        return dict(sorted(record.items()))

    @classmethod
    def from_gguf(cls, gguf: GGUFFile, vocab_size: int) -> ModelConfig:
        """Read and check the configuration; every failure is a ``ModelError`` with the §4.1 message."""
        arch = gguf.get_str("general.architecture")
        if arch not in ARCHITECTURES:
            raise ModelError(f"unsupported model architecture {arch}")
        p = f"{arch}."
        layers = gguf.get_int(p + "block_count")
        hidden = gguf.get_int(p + "embedding_length")
        heads = gguf.get_int(p + "attention.head_count")
        kv_heads = gguf.get_int(p + "attention.head_count_kv")
        head_dim = gguf.get_int(p + "attention.key_length")
        value_dim = gguf.get_int(p + "attention.value_length", default=head_dim)
        context = gguf.get_int(p + "context_length")
        base = gguf.get_float(p + "rope.freq_base")
        eps = gguf.get_float(p + "attention.layer_norm_rms_epsilon")
        if not (1 <= layers <= 1024 and hidden > 0):
            raise ModelError("invalid model dimensions")
        if not (heads > 0 and kv_heads > 0 and heads % kv_heads == 0):
            raise ModelError("invalid grouped-query head counts")
        if not (head_dim > 0 and head_dim % 2 == 0):
            raise ModelError("invalid RoPE head dimension")
        if value_dim != head_dim:
            raise ModelError("different key/value dimensions are not supported")
        if not (context > 0 and base > 0 and eps > 0):
            raise ModelError("invalid context, RoPE, or RMS settings")
        if p + "rope.scaling.type" in gguf.metadata and gguf.metadata[p + "rope.scaling.type"] != "none":
            raise ModelError("GGUF must contain an effective RoPE base with no extra scaling")
        if (
            p + "rope.dimension_count" in gguf.metadata
            and gguf.get_int(p + "rope.dimension_count") != head_dim
        ):
            raise ModelError("partial rotary embeddings are not supported")
        ffn_width = gguf.get_int(p + "feed_forward_length")
        if ffn_width <= 0:
            raise ModelError("invalid model dimensions")
        moe: dict[str, Any] = {}
        if arch == "hy_v3":
            experts = gguf.get_int(p + "expert_count")
            used = gguf.get_int(p + "expert_used_count")
            expert_ffn = gguf.get_int(p + "expert_feed_forward_length")
            shared_ffn = gguf.get_int(p + "expert_shared_feed_forward_length")
            if not (experts > 0 and 0 < used <= experts and expert_ffn > 0 and shared_ffn > 0):
                raise ModelError("invalid expert dimensions")
            if gguf.get_int(p + "expert_gating_func") != 2:
                raise ModelError("HYV3 requires a sigmoid router")
            scale = gguf.get_float(p + "expert_weights_scale")
            if not scale > 0:
                raise ModelError("invalid expert weight scale")
            moe = dict(
                experts=experts,
                experts_used=used,
                expert_ffn_width=expert_ffn,
                shared_ffn_width=shared_ffn,
                expert_weights_norm=gguf.get_bool(p + "expert_weights_norm", default=False),
                expert_weights_scale=scale,
            )
        return cls(
            architecture=arch,
            layers=layers,
            hidden=hidden,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            context_length=context,
            rope_base=base,
            rms_epsilon=eps,
            vocab_size=vocab_size,
            ffn_width=ffn_width,
            **moe,
        )


# ----------------------------------------------------------------------------------------------------
# weights


def _matrix(gguf: GGUFFile, name: str, shape: list[int]) -> GGUFTensor:
    """A packed tensor whose GGUF dims (fastest first) must equal ``shape``."""
    tensor = gguf.tensor(name)
    actual = list(tensor.dimensions)
    if actual != shape:
        raise ModelError(f"{name}: expected GGUF shape {shape}, got {actual}")
    return tensor


def _vector(gguf: GGUFFile, name: str, length: int) -> np.ndarray:
    """A 1-D norm/bias tensor decoded to float32 once; must be finite."""
    tensor = _matrix(gguf, name, [length])
    values = np.ascontiguousarray(quant.dequantize(tensor.dtype, tensor.data), dtype=np.float32)
    if not np.isfinite(values).all():
        raise ModelError(f"non-finite normalization/router tensor {name}")
    return values


@dataclass
class DenseFFN:
    gate: GGUFTensor  # [h, F]
    up: GGUFTensor  # [h, F]
    down: GGUFTensor  # [F, h]

    @classmethod
    def load(cls, gguf: GGUFFile, prefix: str, suffix: str, hidden: int, width: int) -> DenseFFN:
        return cls(
            gate=_matrix(gguf, f"{prefix}ffn_gate{suffix}.weight", [hidden, width]),
            up=_matrix(gguf, f"{prefix}ffn_up{suffix}.weight", [hidden, width]),
            down=_matrix(gguf, f"{prefix}ffn_down{suffix}.weight", [width, hidden]),
        )

    @cached_property
    def packed(self) -> tuple[quant.PackedMatrix, quant.PackedMatrix, quant.PackedMatrix]:
        """(gate, up, down) checked once, for the layer kernels (ops.Layer)."""
        return quant.packed(self.gate), quant.packed(self.up), quant.packed(self.down)


@dataclass
class MoEFFN:
    router: GGUFTensor  # ffn_gate_inp [h, E], F32
    bias: np.ndarray  # exp_probs_b [E] float32: selection only
    shared: DenseFFN  # *_shexp
    experts: list[DenseFFN]  # slices of ffn_{gate,up,down}_exps [h, M, E] / [M, h, E]


@dataclass
class Block:
    attn_norm: np.ndarray  # [h]
    ffn_norm: np.ndarray  # [h]
    q_norm: np.ndarray  # [D]
    k_norm: np.ndarray  # [D]
    wq: GGUFTensor  # [h, H*D]
    wk: GGUFTensor  # [h, K*D]
    wv: GGUFTensor  # [h, K*D]
    wo: GGUFTensor  # [H*D, h]
    ffn: DenseFFN | MoEFFN


def _load_block(gguf: GGUFFile, cfg: ModelConfig, i: int) -> Block:
    h, D = cfg.hidden, cfg.head_dim
    p = f"blk.{i}."
    if cfg.is_moe_block(i):
        E, M, S = cfg.experts, cfg.expert_ffn_width, cfg.shared_ffn_width
        router = _matrix(gguf, p + "ffn_gate_inp.weight", [h, E])
        if router.dtype != "F32":
            raise ModelError("HYV3 router must use F32")
        gate = _matrix(gguf, p + "ffn_gate_exps.weight", [h, M, E])
        up = _matrix(gguf, p + "ffn_up_exps.weight", [h, M, E])
        down = _matrix(gguf, p + "ffn_down_exps.weight", [M, h, E])
        ffn: DenseFFN | MoEFFN = MoEFFN(
            router=router,
            bias=_vector(gguf, p + "exp_probs_b", E),
            shared=DenseFFN.load(gguf, p, "_shexp", h, S),
            experts=[DenseFFN(gate.expert(e), up.expert(e), down.expert(e)) for e in range(E)],
        )
    else:
        ffn = DenseFFN.load(gguf, p, "", h, cfg.ffn_width)
    return Block(
        attn_norm=_vector(gguf, p + "attn_norm.weight", h),
        ffn_norm=_vector(gguf, p + "ffn_norm.weight", h),
        q_norm=_vector(gguf, p + "attn_q_norm.weight", D),
        k_norm=_vector(gguf, p + "attn_k_norm.weight", D),
        wq=_matrix(gguf, p + "attn_q.weight", [h, cfg.heads * D]),
        wk=_matrix(gguf, p + "attn_k.weight", [h, cfg.kv_heads * D]),
        wv=_matrix(gguf, p + "attn_v.weight", [h, cfg.kv_heads * D]),
        wo=_matrix(gguf, p + "attn_output.weight", [cfg.heads * D, h]),
        ffn=ffn,
    )


# ----------------------------------------------------------------------------------------------------
# sessions


class Session:
    """One request's state: position, float32 KV cache per layer, poison flag and cancel callable.

    ``tokens`` lists the ids whose keys and values the cache holds (``position`` is its length), so a
    later prompt that starts the same way can continue from this cache after ``rewind`` (the server's
    prompt cache). Every per-token operation reads only that token's inputs and the cache, so continuing
    from a rewound session gives the same bits as a fresh session fed the whole prompt.
    """

    def __init__(self, model: Model, context: int, cancel: Callable[[], bool] | None) -> None:
        self.model = model
        self.context = context
        self.poisoned = False
        self.cancel = cancel  # polled before every layer; None: never cancelled
        self.tokens: list[int] = []  # ids of positions 0..position-1
        cfg = model.config
        # [K, cap, D] per layer, kv head major: an attention task works on one kv head, so it streams that
        # head's positions as one contiguous run (position-major rows [cap, K*D] made it read D floats of
        # every K*D, a stride the hardware prefetcher follows poorly)
        self.keys: list[np.ndarray] = [np.empty((cfg.kv_heads, 0, cfg.head_dim), np.float32)] * cfg.layers
        self.values: list[np.ndarray] = list(self.keys)  # [K, cap, D]

    @property
    def position(self) -> int:
        """Positions the cache holds: the next token's position."""
        return len(self.tokens)

    @property
    def cancelled(self) -> bool:
        return bool(self.cancel()) if self.cancel is not None else False

    def rewind(self, position: int) -> None:
        """Keep only the first ``position`` positions; the next forward overwrites the rows after them."""
        if self.poisoned:
            raise ModelError("session was invalidated by a failed forward")
        if not (
            isinstance(position, int) and not isinstance(position, bool) and 0 <= position <= self.position
        ):
            raise ModelError(f"rewind position must be between 0 and {self.position}")
        del self.tokens[position:]

    def copy_prefix(self, source: Session, length: int) -> None:
        """Replace this session's cache with the first ``length`` positions of ``source``'s (a copy: ``source``
        goes on independently). The rows are the same bits ``length`` forwarded tokens would have made."""
        if self.poisoned or source.poisoned:
            raise ModelError("session was invalidated by a failed forward")
        if source.model is not self.model:
            raise ModelError("session belongs to a different model")
        limit = min(source.position, self.context)
        if not (isinstance(length, int) and not isinstance(length, bool) and 0 <= length <= limit):
            raise ModelError(f"prefix length must be between 0 and {limit}")
        self.tokens = []  # nothing of the old cache to keep while it grows
        self.reserve(length)
        for mine, theirs in zip(self.keys + self.values, source.keys + source.values, strict=True):
            mine[:, :length] = theirs[:, :length]
        self.tokens = source.tokens[:length]

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[1]

    @property
    def kv_bytes(self) -> int:
        """Bytes of KV cache allocated now."""
        return sum(cache.nbytes for cache in self.keys + self.values)

    def reserve(self, end: int) -> None:
        """Grow every layer's cache (256-position steps, at most the context) to hold positions < end."""
        if end <= self.capacity:
            return
        capacity = min(self.context, -(-end // KV_GROWTH) * KV_GROWTH)
        kv_heads, _, head_dim = self.keys[0].shape
        keys, values = [], []
        for old_k, old_v in zip(self.keys, self.values, strict=True):
            new_k = np.empty((kv_heads, capacity, head_dim), np.float32)
            new_v = np.empty((kv_heads, capacity, head_dim), np.float32)
            new_k[:, : self.position] = old_k[:, : self.position]
            new_v[:, : self.position] = old_v[:, : self.position]
            keys.append(new_k)
            values.append(new_v)
        self.keys, self.values = keys, values


@dataclass
class _Scratch:
    """Per-call activations of a forward pass over N batch rows, reused by every layer."""

    q: np.ndarray  # [N, H*D]
    k: np.ndarray  # [N, K*D]
    v: np.ndarray  # [N, K*D]
    attended: np.ndarray  # [N, H*D]: attention output, input of W_o
    ffn: np.ndarray  # [N, F]: silu(gate) * up of the dense FFN
    # HyV3: router logits [N, E], selections and weights [N, used], gathered x and expert outputs [P, h],
    # middles [N + P, max(M, S)], P = N · used up to 320 tokens, else N (see ops.MoEScratch)
    moe: ops.MoEScratch | None

    @classmethod
    def new(cls, cfg: ModelConfig, rows: int) -> _Scratch:
        qw, kvw = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        moe = None
        if cfg.is_moe:
            width = max(cfg.expert_ffn_width, cfg.shared_ffn_width)
            moe = ops.MoEScratch(rows, cfg.hidden, cfg.experts, cfg.experts_used, width)
        return cls(
            q=np.empty((rows, qw), np.float32),
            k=np.empty((rows, kvw), np.float32),
            v=np.empty((rows, kvw), np.float32),
            attended=np.empty((rows, qw), np.float32),
            ffn=np.empty((rows, cfg.ffn_width), np.float32),
            moe=moe,
        )


@dataclass
class _Segment:
    """The rows of one session inside a batched forward."""

    session: Session
    tokens: np.ndarray  # int64 [n]
    start: int = 0  # first row in the batch

    @property
    def stop(self) -> int:
        return self.start + len(self.tokens)


# ----------------------------------------------------------------------------------------------------
# model


class Model:
    """A loaded Hy-MT2 model: shared read-only weights; all request state lives in sessions."""

    def __init__(self, gguf: GGUFFile, tokenizer: Tokenizer, *, float_path: bool = False) -> None:
        self.gguf = gguf
        self.tokenizer = tokenizer
        self.config = cfg = ModelConfig.from_gguf(gguf, tokenizer.vocab_size)
        self.profile = gguf.profile
        self.file_bytes = gguf.file_bytes
        self.kv_bytes_per_token = cfg.kv_bytes_per_token
        # True: every product on the float32-activation path (the exact path tests compare closely).
        self.float_path = float_path
        h = cfg.hidden
        self.token_embd = _matrix(gguf, "token_embd.weight", [h, cfg.vocab_size])
        if "output.weight" in gguf.tensors:
            self.output = _matrix(gguf, "output.weight", [h, cfg.vocab_size])
        elif cfg.is_moe:
            raise ModelError("HYV3 requires separate output weights")
        else:
            self.output = self.token_embd
        self.output_norm = _vector(gguf, "output_norm.weight", h)
        self._head = quant.packed(self.output)  # checked once, for the decode step's fused head
        self._embd = quant.packed(self.token_embd)  # the same for the embedding lookup
        self.blocks = [_load_block(gguf, cfg, i) for i in range(cfg.layers)]
        self.rope_freqs = ops.rope_freqs(cfg.rope_base, cfg.head_dim)  # [D/2] float32
        self._norm_first = cfg.architecture == "hy_v3"
        self._layers = [self._layer_kernels(block) for block in self.blocks]
        # A decode step (one token per session) runs every layer in one C call; tests turn it off to compare
        # with the layer-by-layer calls a prompt takes.
        self._decode_in_one_call = True

    def _layer_kernels(self, block: Block) -> ops.Layer:
        """The block as one-call kernels (attention, then its dense or MoE FFN); weights checked here, once."""
        cfg = self.config
        qkv = (quant.packed(block.wq), quant.packed(block.wk), quant.packed(block.wv))
        ffn = moe = None
        if isinstance(block.ffn, DenseFFN):
            ffn = block.ffn.packed
        else:
            experts = [expert.packed for expert in block.ffn.experts]
            moe = (
                quant.packed(block.ffn.router), block.ffn.bias, block.ffn.shared.packed, experts,
                cfg.experts_used, cfg.expert_weights_norm, cfg.expert_weights_scale,
            )  # fmt: skip
        return ops.Layer(
            qkv, quant.packed(block.wo), ffn, block.attn_norm, block.ffn_norm, block.q_norm, block.k_norm,
            self.rope_freqs, cfg.heads, cfg.kv_heads, cfg.rms_epsilon, self._norm_first, self.float_path, moe,
        )  # fmt: skip

    def close(self) -> None:
        self.gguf.close()

    # --- sessions -----------------------------------------------------------------------------------

    def new_session(self, context: int, cancel: Callable[[], bool] | None = None) -> Session:
        n = self.config.context_length
        if not (isinstance(context, int) and 1 <= context <= n):
            raise ModelError(f"context must be between 1 and {n}")
        return Session(self, context, cancel)

    def _check(self, session: Session, tokens: Sequence[int]) -> np.ndarray:
        """The §5 checks before any work, in order; returns the tokens as int64."""
        if not isinstance(session, Session):
            raise ModelError("forward expects a session")
        # A decode step's [token] (a Python int in the vocabulary, so the token checks below cannot fail):
        # no asarray/astype/min/max, ~40 µs of cold-cache Python less per step (1.8B, 2 threads).
        known = type(tokens) is list and len(tokens) == 1 and type(tokens[0]) is int
        if known and 0 <= tokens[0] < self.config.vocab_size:
            ids = np.array(tokens, np.int64)
        else:
            known = False
            try:
                raw = np.asarray(tokens)
            except (OverflowError, TypeError, ValueError):
                raise ModelError("input token outside vocabulary") from None
            if raw.size and raw.dtype.kind not in "iu":  # floats, bools, objects (ints beyond 64 bits)
                raise ModelError("input token outside vocabulary")
            ids = raw.astype(np.int64).reshape(-1)
        if not 1 <= len(ids) <= PREFILL_CHUNK:
            raise ModelError(f"forward expects 1..={PREFILL_CHUNK} tokens")
        if session.poisoned:
            raise ModelError("session was invalidated by a failed forward")
        if session.position + len(ids) > session.context:
            raise ModelError("context limit exceeded")
        if session.model is not self:
            raise ModelError("session belongs to a different model")
        if not known and (ids.min() < 0 or ids.max() >= self.config.vocab_size):
            raise ModelError("input token outside vocabulary")
        return ids

    # --- forward ------------------------------------------------------------------------------------

    def forward(
        self, batch: Session | Sequence[tuple[Session, Sequence[int]]], tokens: Sequence[int] | None = None
    ) -> Any:
        """Append tokens to sessions and return last-token logits.

        ``forward(session, tokens)`` → float32 ``[vocab]`` (raises ``request cancelled`` on cancel);
        ``forward([(session, tokens), ...])`` → one entry per pair: logits, or None when that session was
        cancelled (before or during the call; its position is unchanged and it stays usable).
        """
        if isinstance(batch, Session):
            segments = [_Segment(batch, self._check(batch, tokens if tokens is not None else []))]
            if batch.cancelled:
                raise ModelError("request cancelled")
            logits = self._run(segments)
            if logits[0] is None:
                raise ModelError("request cancelled")
            return logits[0]
        if tokens is not None:
            raise ModelError("forward takes tokens only with a single session")
        pairs = list(batch)
        if len({id(session) for session, _ in pairs}) != len(pairs):
            raise ModelError("a session may appear only once in a batch")
        segments = [_Segment(session, self._check(session, ids)) for session, ids in pairs]
        live = [segment for segment in segments if not segment.session.cancelled]
        results = dict(zip((id(s) for s in live), self._run(live), strict=True)) if live else {}
        return [results.get(id(segment)) for segment in segments]

    def prefill(self, session: Session, tokens: Sequence[int]) -> np.ndarray:
        """Forward a whole prompt in 256-token chunks; the logits after the last chunk."""
        ids = list(tokens)
        if not ids:
            raise ModelError("prompt must contain at least one token")
        if session.position + len(ids) > session.context:
            raise ModelError("prompt exceeds context limit")
        logits = None
        for start in range(0, len(ids), PREFILL_CHUNK):
            logits = self.forward(session, ids[start : start + PREFILL_CHUNK])
        return logits

    def _run(self, segments: list[_Segment]) -> list[np.ndarray | None]:
        """The forward pass over checked, uncancelled segments; None for those cancelled mid-call.

        Each sublayer leaves its output in ``delta``; the next RMSNorm adds it to ``hidden`` in the same
        C call (hidden += delta, then x = RMSNorm(hidden)). A layer is one call into C (``ops.Layer``:
        attention then the dense or MoE FFN, norms, products, routing and attention without the GIL).
        A decode step (one token per session) runs all its layers in one call (``ops.run_layers``):
        1.25Bit, 2 threads, one session 27.5-32.9 -> 25.1-29.4 ms per step, four 49.6 -> 44.2 ms, because
        the OpenMP worker no longer sleeps through the Python between layers.
        Cancellation is checked between layers when prompts run, so a long chunk stops early.
        """
        cfg = self.config
        for segment in segments:
            segment.session.reserve(segment.session.position + len(segment.tokens))
        for segment in segments:
            segment.session.poisoned = True
        live = segments
        positions, bounds = self._layout(live)
        threads = kernels.get_num_threads()
        ids = np.concatenate([s.tokens for s in live])
        # [N, h]: the embedding rows (ids checked in _check; the kernel checks them again), through
        # hymt._kernels.quant directly: quant.decode_rows' Python checks were ~40 µs of a decode step
        hidden = np.empty((len(ids), cfg.hidden), np.float32)
        _quant.decode_rows(*self._embd, ids, hidden)
        delta = np.zeros_like(hidden)  # [N, h]: the last sublayer's output, not yet added to hidden
        x = np.empty_like(hidden)  # [N, h]: normalized input of the current sublayer
        scratch = _Scratch.new(cfg, len(ids))
        if self._decode_in_one_call and len(ids) == len(live):
            # A decode step (one token per session, tens of ms): every layer and the head (final norm, output
            # product, finiteness check) in one C call, so the kernel threads never wait on the interpreter
            # between layers or before the head; a cancellation is noticed after the head (its rows are
            # dropped). The head in the call: 1.25Bit, 2 threads, one session, 0.2 ms less Python per step
            # (the row gather, add_rmsnorm and np.isfinite ran with cold caches after the layers and head).
            logits = np.empty((len(live), cfg.vocab_size), np.float32)  # [S, vocab]: row = segment.start
            finite = ops.run_layers(
                self._layers, hidden, delta, x, scratch.q, scratch.k, scratch.v, scratch.attended, positions,
                bounds, [[s.session.keys[layer] for s in live] for layer in range(cfg.layers)],
                [[s.session.values[layer] for s in live] for layer in range(cfg.layers)], threads, scratch.ffn,
                scratch.moe, (self._head, self.output_norm, logits),
            )  # fmt: skip
            live = self._drop_cancelled(live)
            if not live:
                return [None] * len(segments)
            rows = [s.start for s in live]
            if not finite and not np.isfinite(logits[rows]).all():  # only the sessions still wanted count
                raise ModelError("model produced non-finite logits; check model format and weights")
            return self._finish(segments, live, logits, rows)
        else:
            for layer in range(cfg.layers):
                kept = self._drop_cancelled(live)
                if not kept:
                    return [None] * len(segments)
                if len(kept) != len(live):
                    rows = np.concatenate([np.arange(s.start, s.stop) for s in kept])
                    hidden, delta, x = hidden[rows], delta[rows], x[rows]
                    live, (positions, bounds) = kept, self._layout(kept)
                    scratch = _Scratch.new(cfg, len(rows))
                self._layers[layer].attention(
                    hidden, delta, x, scratch.q, scratch.k, scratch.v, scratch.attended, positions, bounds,
                    [s.session.keys[layer] for s in live], [s.session.values[layer] for s in live], threads,
                    scratch.ffn, scratch.moe,
                )  # fmt: skip
        live = self._drop_cancelled(live)
        if not live:
            return [None] * len(segments)
        last = [s.stop - 1 for s in live]
        last_hidden, last_x = hidden[last], np.empty((len(live), cfg.hidden), np.float32)  # [S, h]
        ops.add_rmsnorm(last_hidden, delta[last], self.output_norm, cfg.rms_epsilon, last_x, threads)
        logits = quant.matmul(self.output, last_x, float_path=self.float_path)  # [S, vocab]
        if not np.isfinite(logits).all():
            raise ModelError("model produced non-finite logits; check model format and weights")
        return self._finish(segments, live, logits, range(len(live)))

    @staticmethod
    def _finish(
        segments: list[_Segment], live: list[_Segment], logits: np.ndarray, rows: Sequence[int]
    ) -> list[np.ndarray | None]:
        """Commit the live segments (logits[rows[i]] is live[i]'s); None for the segments cancelled."""
        results: dict[int, np.ndarray] = {}
        for row, segment in zip(rows, live, strict=True):
            segment.session.tokens.extend(segment.tokens.tolist())
            segment.session.poisoned = False
            results[id(segment)] = logits[row]
        return [results.get(id(segment)) for segment in segments]

    @staticmethod
    def _layout(segments: list[_Segment]) -> tuple[np.ndarray, np.ndarray]:
        """Assign consecutive batch rows to segments.

        Returns every row's absolute position (int64 [N]) and the segments' row bounds (int64 [S+1]).
        """
        start = 0
        for segment in segments:
            segment.start = start
            start = segment.stop
        positions = np.concatenate(
            [np.arange(s.session.position, s.session.position + len(s.tokens)) for s in segments]
        )
        return positions, np.array([0] + [s.stop for s in segments], np.int64)

    @staticmethod
    def _drop_cancelled(segments: list[_Segment]) -> list[_Segment]:
        """Segments still wanted; a cancelled one is released (un-poisoned, position unchanged)."""
        kept = []
        for segment in segments:
            if segment.session.cancelled:
                segment.session.poisoned = False
            else:
                kept.append(segment)
        return kept

    # --- generation ---------------------------------------------------------------------------------

    def generate(
        self,
        messages: list[dict[str, Any]],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        repetition_penalty: float | None = None,
        seed: int | None = None,
        stop: str | list[str] | None = None,
        stream: bool = False,
        context: int | None = None,
    ) -> Any:
        """Chat completion: template → tokens → generation (REFERENCE.md §8.3).

        Returns a ``Completion``, or with ``stream=True`` the ``GenerationStream`` of text deltas.
        Unset sampling values take the architecture's model-card defaults; ``context`` defaults to
        min(8192, model context); ``max_tokens`` to min(4096, context − prompt length).
        """
        from hymt.chat import render_chat
        from hymt.generation import GenerationRequest, generate
        from hymt.sampling import SamplingParams, default_sampling

        context = min(8192, self.config.context_length) if context is None else context
        prompt_ids = self.tokenizer.encode(render_chat(self.tokenizer, messages))
        defaults = default_sampling(self.config.architecture)
        sampling = SamplingParams(
            temperature=defaults.temperature if temperature is None else temperature,
            top_p=defaults.top_p if top_p is None else top_p,
            top_k=defaults.top_k if top_k is None else top_k,
            repetition_penalty=defaults.repetition_penalty
            if repetition_penalty is None
            else repetition_penalty,
            seed=seed,
        )
        if max_tokens is None:
            max_tokens = max(1, min(4096, context - len(prompt_ids)))
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        request = GenerationRequest(
            prompt_ids=prompt_ids, max_tokens=max_tokens, sampling=sampling, stop=stops
        )
        result = generate(self, request, context=context)
        if stream:
            return result
        for _ in result:
            pass
        return result.completion


def load(
    path: str | Path, profile: str = "auto", threads: int | None = None, *, float_path: bool = False
) -> Model:
    """Open a GGUF model: map the file, read the tokenizer, check config and tensors (REFERENCE.md §4).

    ``threads`` sets the compute pool size (default: usable physical cores, §10.5).
    """
    from hymt.tokenizer import Tokenizer

    if threads is not None:
        kernels.set_num_threads(threads)
    gguf = GGUFFile(path, profile=profile)
    try:
        return Model(gguf, Tokenizer.from_gguf(gguf), float_path=float_path)
    except BaseException:
        gguf.close()
        raise
