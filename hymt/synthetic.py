"""Synthetic Hy-MT2-shaped GGUF files: the tiny test fixtures of REFERENCE §12.1 and seeded random models.

Tests, benchmarks and the server's smoke runs need models without downloading gigabytes, so this module writes
`hunyuan-dense` and `hy_v3` files of any preset shape in every supported tensor format with hymt's own
GGUF writer, using the metadata keys and tensor names of the official converter so llama.cpp loads them too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hymt.gguf import GGUFValueType, GGUFWriter

# ---------------------------------------------------------------------------------------------------------
# GPT-2 byte-level alphabet (REFERENCE §6.4)


def byte_to_unicode() -> list[str]:
    """The GPT-2 character of each byte value 0..255."""
    printable = set(range(33, 127)) | set(range(161, 173)) | set(range(174, 256))
    chars: list[str] = []
    next_extra = 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + next_extra))
            next_extra += 1
    return chars


# ---------------------------------------------------------------------------------------------------------
# REFERENCE §12.1: the tiny fixture models

TINY_TEMPLATE = "{{ bos_token }}{% for m in messages %}[USER]{{ m.content }}{% endfor %}[ASSISTANT]"
TOKEN_NORMAL = 1
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4


def _tiny_tensor_shapes(moe: bool) -> list[tuple[str, list[int]]]:
    """Tensor names and GGUF dims of the §12.1 fixture, in file order."""
    hidden, ffn, head_dim, vocab = 4, 8, 2, 260
    heads = 4 if moe else 2
    shapes: list[tuple[str, list[int]]] = [
        ("token_embd.weight", [hidden, vocab]),
        ("output.weight", [hidden, vocab]),
        ("output_norm.weight", [hidden]),
    ]
    for block in range(2 if moe else 1):
        p = f"blk.{block}."
        shapes += [
            (p + "attn_norm.weight", [hidden]),
            (p + "ffn_norm.weight", [hidden]),
            (p + "attn_q_norm.weight", [head_dim]),
            (p + "attn_k_norm.weight", [head_dim]),
            (p + "attn_q.weight", [hidden, head_dim * heads]),
            (p + "attn_k.weight", [hidden, head_dim]),
            (p + "attn_v.weight", [hidden, head_dim]),
            (p + "attn_output.weight", [head_dim * heads, hidden]),
        ]
        if block == 0:
            shapes += [
                (p + "ffn_gate.weight", [hidden, ffn]),
                (p + "ffn_up.weight", [hidden, ffn]),
                (p + "ffn_down.weight", [ffn, hidden]),
            ]
        else:
            experts, expert_ffn, shared_ffn = 3, 4, 4
            shapes += [
                (p + "ffn_gate_inp.weight", [hidden, experts]),
                (p + "exp_probs_b", [experts]),
                (p + "ffn_gate_exps.weight", [hidden, expert_ffn, experts]),
                (p + "ffn_up_exps.weight", [hidden, expert_ffn, experts]),
                (p + "ffn_down_exps.weight", [expert_ffn, hidden, experts]),
                (p + "ffn_gate_shexp.weight", [hidden, shared_ffn]),
                (p + "ffn_up_shexp.weight", [hidden, shared_ffn]),
                (p + "ffn_down_shexp.weight", [shared_ffn, hidden]),
            ]
    return shapes


def _tiny_tensor_values(name: str, count: int, numeric: bool) -> np.ndarray:
    """The §12.1 values of one tensor (float32, flat index i)."""
    i = np.arange(count, dtype=np.int64)
    if name.endswith("_norm.weight"):
        if not numeric:
            return np.ones(count, dtype=np.float32)
        return (0.8 + (i % 3) * 0.1).astype(np.float32)
    if numeric:
        name_sum = sum(name.encode("utf-8"))
        return (((i * 17 + name_sum) % 31) / 50 - 0.3).astype(np.float32)
    if name == "token_embd.weight":
        return np.ones(count, dtype=np.float32)
    if name == "output.weight":
        return np.where(i // 4 == 97, 1.0, 0.0).astype(np.float32)  # the row of byte `a`
    return np.zeros(count, dtype=np.float32)


def write_tiny_fixture(path: str | Path, moe: bool, numeric: bool) -> Path:
    """Write the REFERENCE §12.1 fixture: a 4-wide `hunyuan-dense` (1 block) or `hy_v3` (2 blocks) model."""
    path = Path(path)
    arch = "hy_v3" if moe else "hunyuan-dense"
    writer = GGUFWriter(path, alignment=32)
    writer.add_string("general.architecture", arch)
    for key, value in (
        ("block_count", 2 if moe else 1),
        ("context_length", 4096),
        ("embedding_length", 4),
        ("feed_forward_length", 8),
        ("attention.head_count", 4 if moe else 2),
        ("attention.head_count_kv", 1),
        ("attention.key_length", 2),
        ("attention.value_length", 2),
    ):
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_float32(f"{arch}.rope.freq_base", 10000.0)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    if moe:
        for key, value in (
            ("expert_count", 3),
            ("expert_used_count", 2),
            ("expert_feed_forward_length", 4),
            ("expert_shared_feed_forward_length", 4),
            ("expert_gating_func", 2),
        ):
            writer.add_uint32(f"{arch}.{key}", value)
        writer.add_bool(f"{arch}.expert_weights_norm", True)
        writer.add_float32(f"{arch}.expert_weights_scale", 2.826)

    tokens = byte_to_unicode() + ["[BOS]", "[USER]", "[ASSISTANT]", "[EOS]"]
    token_types = [TOKEN_NORMAL] * 256 + [TOKEN_CONTROL] * 4
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_array("tokenizer.ggml.tokens", tokens, GGUFValueType.STRING)
    writer.add_array("tokenizer.ggml.token_type", token_types, GGUFValueType.INT32)
    writer.add_array("tokenizer.ggml.merges", [], GGUFValueType.STRING)
    writer.add_string("tokenizer.ggml.pre", "hunyuan-dense")
    writer.add_uint32("tokenizer.ggml.bos_token_id", 256)
    writer.add_uint32("tokenizer.ggml.eos_token_id", 259)
    writer.add_string("tokenizer.chat_template", TINY_TEMPLATE)

    for name, dims in _tiny_tensor_shapes(moe):
        values = _tiny_tensor_values(name, int(np.prod(dims)), numeric)
        writer.add_tensor(name, dims, "F32", values.view(np.uint8))
    writer.write()
    return path
