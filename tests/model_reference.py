"""An independent float64 numpy implementation of REFERENCE.md §4 (straightforward, unoptimized).

Weights are decoded from the raw tensor bytes with the ``gguf`` package's decoders for the standard formats
(F32, F16, Q8_0, Q4_K, Q6_K); the two Tencent formats, which the ``gguf`` package does not know, use
hymt's block decoders (checked bit-exact against the reference engines' outputs in §12.3 tests). Everything
after decoding — norms, RoPE, attention, FFN, routing — is float64 numpy written here from the spec.
"""

from __future__ import annotations

import math

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from hymt.gguf import GGUFFile

STANDARD = {
    "F32": GGMLQuantizationType.F32,
    "F16": GGMLQuantizationType.F16,
    "Q8_0": GGMLQuantizationType.Q8_0,
    "Q4_K": GGMLQuantizationType.Q4_K,
    "Q6_K": GGMLQuantizationType.Q6_K,
}


def decode(gguf: GGUFFile, name: str) -> np.ndarray:
    """The tensor as float64, numpy shape = reversed GGUF dims (rows of dims[0] elements)."""
    tensor = gguf.tensor(name)
    dims = tensor.dimensions
    raw = np.array(tensor.data)
    if tensor.dtype in STANDARD:
        rows = int(np.prod(dims[1:])) if len(dims) > 1 else 1
        values = gguf_dequantize(raw.reshape(rows, -1), STANDARD[tensor.dtype])
    else:
        from hymt.quant import dequantize

        values = dequantize(tensor.dtype, raw)
    return np.asarray(values, np.float64).reshape(tuple(reversed(dims)))


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x: np.ndarray, positions: np.ndarray, base: float) -> np.ndarray:
    """x[n, heads, D]: NeoX split-half pairs (j, j + D/2) rotated by pos × base^(−2j/D)."""
    D = x.shape[-1]
    half = D // 2
    freqs = base ** (-2.0 * np.arange(half) / D)
    angle = positions[:, None, None] * freqs[None, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * np.cos(angle) - b * np.sin(angle), a * np.sin(angle) + b * np.cos(angle)], -1)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


class ReferenceModel:
    """Float64 forward over a whole token sequence; returns the logits at every position."""

    def __init__(self, path, profile: str = "auto") -> None:
        self.gguf = GGUFFile(path, profile)
        meta = self.gguf.metadata
        self.arch = arch = meta["general.architecture"]
        self.layers = int(meta[f"{arch}.block_count"])
        self.heads = int(meta[f"{arch}.attention.head_count"])
        self.kv_heads = int(meta[f"{arch}.attention.head_count_kv"])
        self.head_dim = int(meta[f"{arch}.attention.key_length"])
        self.base = float(meta[f"{arch}.rope.freq_base"])
        self.eps = float(meta[f"{arch}.attention.layer_norm_rms_epsilon"])
        if arch == "hy_v3":
            self.used = int(meta[f"{arch}.expert_used_count"])
            self.norm_weights = bool(meta[f"{arch}.expert_weights_norm"])
            self.scale = float(meta[f"{arch}.expert_weights_scale"])
        self._cache: dict[str, np.ndarray] = {}

    def w(self, name: str) -> np.ndarray:
        if name not in self._cache:
            self._cache[name] = decode(self.gguf, name)
        return self._cache[name]

    def close(self) -> None:
        self._cache.clear()
        self.gguf.close()

    def ffn(self, x: np.ndarray, prefix: str, suffix: str) -> np.ndarray:
        gate = x @ self.w(f"{prefix}ffn_gate{suffix}.weight").T
        up = x @ self.w(f"{prefix}ffn_up{suffix}.weight").T
        return (silu(gate) * up) @ self.w(f"{prefix}ffn_down{suffix}.weight").T

    def moe(self, x: np.ndarray, p: str) -> np.ndarray:
        router = x @ self.w(p + "ffn_gate_inp.weight").T  # [n, E]
        bias = self.w(p + "exp_probs_b")
        gates, ups, downs = (self.w(p + f"ffn_{k}_exps.weight") for k in ("gate", "up", "down"))
        out = self.ffn(x, p, "_shexp")
        for t in range(x.shape[0]):
            sig = np.where(
                router[t] >= 0, 1 / (1 + np.exp(-router[t])), np.exp(router[t]) / (1 + np.exp(router[t]))
            )
            score = sig + bias
            chosen = sorted(range(len(score)), key=lambda e: (-score[e], e))[: self.used]
            total = sum(sig[e] for e in chosen)
            for e in sorted(chosen):
                weight = (
                    sig[e] / max(total, 6.103515625e-5) * self.scale
                    if self.norm_weights
                    else sig[e] * self.scale
                )
                y = (silu(gates[e] @ x[t]) * (ups[e] @ x[t])) @ downs[e].T
                out[t] += weight * y
        return out

    def logits(self, tokens: list[int]) -> np.ndarray:
        """[len(tokens), vocab] float64: position i's logits given tokens[: i + 1]."""
        n, H, K, D = len(tokens), self.heads, self.kv_heads, self.head_dim
        positions = np.arange(n, dtype=np.float64)
        hidden = self.w("token_embd.weight")[tokens]  # [n, h]
        for i in range(self.layers):
            p = f"blk.{i}."
            x = rms_norm(hidden, self.w(p + "attn_norm.weight"), self.eps)
            q = (x @ self.w(p + "attn_q.weight").T).reshape(n, H, D)
            k = (x @ self.w(p + "attn_k.weight").T).reshape(n, K, D)
            v = (x @ self.w(p + "attn_v.weight").T).reshape(n, K, D)
            qn, kn = self.w(p + "attn_q_norm.weight"), self.w(p + "attn_k_norm.weight")
            if self.arch == "hunyuan-dense":  # RoPE, then per-head norm
                q = rms_norm(rope(q, positions, self.base), qn, self.eps)
                k = rms_norm(rope(k, positions, self.base), kn, self.eps)
            else:  # per-head norm, then RoPE
                q = rope(rms_norm(q, qn, self.eps), positions, self.base)
                k = rope(rms_norm(k, kn, self.eps), positions, self.base)
            attended = np.zeros((n, H, D))
            for h in range(H):
                kv = h // (H // K)
                scores = q[:, h] @ k[:, kv].T / math.sqrt(D)  # [n, n]
                scores = np.where(np.tril(np.ones((n, n), bool)), scores, -np.inf)
                probs = np.exp(scores - scores.max(axis=1, keepdims=True))
                probs /= probs.sum(axis=1, keepdims=True)
                attended[:, h] = probs @ v[:, kv]
            hidden = hidden + attended.reshape(n, H * D) @ self.w(p + "attn_output.weight").T
            x = rms_norm(hidden, self.w(p + "ffn_norm.weight"), self.eps)
            hidden = hidden + (self.moe(x, p) if self.arch == "hy_v3" and i > 0 else self.ffn(x, p, ""))
        x = rms_norm(hidden, self.w("output_norm.weight"), self.eps)
        head = "output.weight" if "output.weight" in self.gguf.tensors else "token_embd.weight"
        return x @ self.w(head).T


def relative_l2(a: np.ndarray, b: np.ndarray) -> float:
    """sqrt(Σ(a−b)² / Σb²) in float64."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return math.sqrt(float(np.sum((a64 - b64) ** 2)) / float(np.sum(b64**2)))
