"""Synthetic Hy-MT2-shaped GGUF files: the tiny test fixtures of REFERENCE §12.1 and seeded random models.

Tests, benchmarks and the server's smoke runs need models without downloading gigabytes, so this module writes
`hunyuan-dense` and `hy_v3` files of any preset shape in every supported tensor format with hymt's own
GGUF writer, using the metadata keys and tensor names of the official converter so llama.cpp loads them too.
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hymt.errors import HymtError
from hymt.gguf import GGUFFile, GGUFValueType, GGUFWriter, file_sha256
from hymt.quantize import pack_q4_k_scales, quantize

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


# ---------------------------------------------------------------------------------------------------------
# Seeded random models of the real shapes (REFERENCE §4.1)

GENERATOR_VERSION = 4  # bump when the bytes written for a (preset, format, seed) change
FORMATS = ("f32", "f16", "q8_0", "q4_k", "q6_k", "q2_0c", "stq1")
_FILE_TYPES = {"f32": 0, "f16": 1, "q8_0": 7, "q4_k": 15, "q6_k": 18, "q2_0c": 39, "stq1": 41}
_SINGLE_DTYPE = {"f32": "F32", "f16": "F16", "q8_0": "Q8_0", "q6_k": "Q6_K"}
_TENCENT_DTYPE = {"q2_0c": "Q2_0C", "stq1": "STQ1_0"}
CONTEXT_LENGTH = 262144
ROPE_BASE = 11158840.0  # the official effective base (NTK scaling already folded in)
RMS_EPS = 1e-5
EXPERT_WEIGHTS_SCALE = 2.826


@dataclass(frozen=True)
class Preset:
    name: str
    architecture: str
    blocks: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int  # dense FFN width: every dense block, HyV3 block 0
    tied: bool  # output head shares token_embd
    vocabulary: str  # "hy-1.8b" (1.8B/30B-style added tokens and template) or "hy-7b"
    vocab_size: int
    experts: int = 0
    experts_used: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0
    # Small presets quantize float weights, so every format of a preset and seed approximates the same float
    # model; the real shapes draw random codes and scales directly (quantizing billions of floats would
    # take minutes).
    from_floats: bool = True


def _dense(name: str, blocks: int, hidden: int, heads: int, kv_heads: int, ffn: int, **kw: object) -> Preset:
    return Preset(name, "hunyuan-dense", blocks, hidden, heads, kv_heads, 128, ffn, tied=True, **kw)


def _hyv3(name: str, blocks: int, hidden: int, heads: int, kv_heads: int, ffn: int, **kw: object) -> Preset:
    return Preset(name, "hy_v3", blocks, hidden, heads, kv_heads, 128, ffn, tied=False, **kw)


# Tiny row lengths (hidden, heads × head_dim, FFN widths) are multiples of 512 so every format fits.
_TINY_MOE = dict(experts=8, experts_used=2, expert_ffn=256, shared_ffn=256)
_30B_MOE = dict(experts=128, experts_used=8, expert_ffn=768, shared_ffn=768)
PRESETS = {
    "tiny": _dense("tiny", 4, 512, 4, 2, 1024, vocabulary="hy-1.8b", vocab_size=512),
    "tiny-moe": _hyv3("tiny-moe", 4, 512, 8, 2, 1024, vocabulary="hy-1.8b", vocab_size=512, **_TINY_MOE),
    "1.8b": _dense("1.8b", 32, 2048, 16, 4, 6144, vocabulary="hy-1.8b", vocab_size=120818, from_floats=False),
    "7b": _dense("7b", 32, 4096, 32, 8, 14336, vocabulary="hy-7b", vocab_size=128167, from_floats=False),
    "30b-a3b": _hyv3(
        "30b-a3b",
        48,
        2048,
        32,
        4,
        6912,
        vocabulary="hy-1.8b",
        vocab_size=120832,
        from_floats=False,
        **_30B_MOE,
    ),
}

# -- vocabulary ------------------------------------------------------------------------------------------

FULLWIDTH_BAR = "\uff5c"  # ｜
LOWER_BLOCK = "\u2581"  # ▁

HY_18B_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}"
    "<｜hy_begin▁of▁sentence｜>{{ system_message }}<｜hy_place▁holder▁no▁3｜>"
    "{% else %}{% set loop_messages = messages %}<｜hy_begin▁of▁sentence｜>{% endif %}"
    "{% for message in loop_messages %}{% if message['role'] == 'user' %}<｜hy_User｜>{{ message['content'] }}"
    "{% elif message['role'] == 'assistant' %}<｜hy_Assistant｜>{{ message['content'] }}<｜hy_place▁holder▁no▁2｜>"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<｜hy_Assistant｜>{% else %}<｜hy_place▁holder▁no▁8｜>{% endif %}"
)

HY_7B_TEMPLATE = (
    "{% set ns = namespace(has_head=true) %}{% set loop_messages = messages %}"
    "{% for message in loop_messages %}{% set content = message['content'] %}"
    "{% if loop.index0 == 0 %}{% if content == '' %}{% set ns.has_head = false %}"
    "{% elif message['role'] == 'system' %}{% set content = '<|startoftext|>' + content + '<|extra_4|>' %}"
    "{% endif %}{% endif %}"
    "{% if message['role'] == 'user' %}{% if loop.index0 == 1 and ns.has_head %}"
    "{% set content = content + '<|extra_0|>' %}"
    "{% else %}{% set content = '<|startoftext|>' + content + '<|extra_0|>' %}{% endif %}"
    "{% elif message['role'] == 'assistant' %}{% set content = content + '<|eos|>' %}{% endif %}"
    "{{ content }}{% endfor %}"
)


def _hy(name: str) -> str:
    return f"<{FULLWIDTH_BAR}hy_{name.replace(' ', LOWER_BLOCK)}{FULLWIDTH_BAR}>"


def _placeholder(k: int) -> str:
    return _hy(f"place holder no {k}")


HY_BOS = _hy("begin of sentence")
HY_EOS = _placeholder(2)
HY_USER = _hy("User")
HY_ASSISTANT = _hy("Assistant")
HY_SYSTEM_END = _placeholder(3)
# The added tokens Hy-MT2-1.8B's tokenizer declares as non-special (user-defined).
HY_PLAIN_ADDED = (
    "<think>", "</think>", "<answer>", "</answer>", "<tool_call>", "</tool_call>", "<tool_calls>",
    "</tool_calls>", "<tool_response>", "</tool_response>", "/think", "/no_think", "<tool_responses>",
    "</tool_responses>", "<tool_sep>",
)  # fmt: skip


def hy_added_tokens(count: int) -> list[tuple[str, bool]]:
    """The first ``count`` Hy-MT2-1.8B added tokens (ids 120000 onwards) as (text, special), following the
    official numbering: nine named tokens, placeholders 11–19 then 0–10, the plain tokens, placeholders 26…"""
    named = ["begin of sentence", "end of sentence", " pad ", "fim hole", "fim begin", "fim end"]
    special = [_hy(n) for n in [*named, "User", "Assistant", "EOT"]]
    special += [_placeholder(k) for k in [*range(11, 20), *range(0, 11)]]
    added = [(t, True) for t in special] + [(t, False) for t in HY_PLAIN_ADDED]
    k = 26
    while len(added) < count:
        added.append((_placeholder(k), True))
        k += 1
    return added[:count]


# Tiny presets keep the added tokens their template and tests need, at compact ids.
_TINY_ADDED = {HY_BOS, _hy("end of sentence"), _hy(" pad "), HY_USER, HY_ASSISTANT, HY_EOS, HY_SYSTEM_END}
_TINY_ADDED |= {_placeholder(8), "<think>", "</think>", "<answer>", "</answer>", "/no_think"}


@dataclass(frozen=True)
class Vocabulary:
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    pre: str
    bos_id: int
    eos_id: int
    eot_id: int | None
    pad_id: int
    template: str


def _random_merges(count: int, reserved: set[str], seed: int) -> list[str]:
    """``count`` BPE merges over the byte alphabet, favouring letters and spaces so that merged tokens look
    like word pieces (``Ġthe``); every merge builds a new, unique token from two existing ones."""
    chars = byte_to_unicode()
    weight = np.full(256, 0.02)
    for group, w in (
        (b"abcdefghijklmnopqrstuvwxyz", 6.0),
        (b" ", 10.0),
        (b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", 1.0),
    ):
        weight[list(group)] = w
    weight[list(b"0123456789.,\n")] = 0.8
    weight[0xE4:0xEA] = 0.4  # UTF-8 lead bytes of CJK text
    weight[0x80:0xC0] = 0.1  # continuation bytes
    p = weight / weight.sum()
    rng = np.random.default_rng(seed)
    known = set(chars) | reserved
    merged: list[str] = []
    merges: list[str] = []
    while len(merges) < count:
        n = 2 * (count - len(merges)) + 64
        left_byte, right_byte = rng.choice(256, size=n, p=p), rng.choice(256, size=n, p=p)
        # Byte pairs first (like a learned BPE's most frequent merges), then longer pieces.
        ramp = min(1.0, len(merged) / 2000)
        left_merged, right_merged = rng.random(n) < 0.6 * ramp, rng.random(n) < 0.25 * ramp
        left_pick, right_pick = rng.random(n), rng.random(n)
        for i in range(n):
            a = merged[int(left_pick[i] * len(merged))] if left_merged[i] and merged else chars[left_byte[i]]
            b = (
                merged[int(right_pick[i] * len(merged))]
                if right_merged[i] and merged
                else chars[right_byte[i]]
            )
            token = a + b
            if len(token) > 16 or token in known:
                continue
            known.add(token)
            merged.append(token)
            merges.append(f"{a} {b}")
            if len(merges) == count:
                break
    return merges


def real_learned_tokens(source: str | Path, count: int) -> tuple[list[str], list[str]]:
    """The first ``count`` tokens of the byte-level BPE vocabulary in GGUF ``source`` (vocab-only or a
    model) and, in rank order, the merges that stay inside them.

    Random merges split text into 2.5–3× the tokens a learned BPE does ("Translate the following text
    into Chinese:" is 25 tokens against 7), so a synthetic model built on them sees prompts far longer than
    the real model's; a model built on these tokenizes like the real one (and encodes the same ids).
    """
    with GGUFFile(source) as vocab_file:
        meta = vocab_file.metadata
        tokens = [str(t) for t in meta.get("tokenizer.ggml.tokens", [])]
        types = [int(t) for t in meta.get("tokenizer.ggml.token_type", [])]
        merges = [str(m) for m in meta.get("tokenizer.ggml.merges", [])]
    learned = tokens[:count]
    if len(learned) < count or any(t != TOKEN_NORMAL for t in types[:count]):
        raise HymtError(f"{source} has fewer than {count} learned (normal) tokens before its added ones")
    kept = set(learned)
    inside = []
    for merge in merges:
        left, _, right = merge.partition(" ")
        if left in kept and right in kept and left + right in kept:
            inside.append(merge)
    return learned, inside


def build_vocabulary(preset: Preset, learned_from: str | Path | None = None) -> Vocabulary:
    """Byte tokens, random merges, then the family's added tokens (at their official ids for real shapes).

    ``learned_from``: a real byte-level BPE vocabulary (GGUF) whose first tokens and their merges replace
    the byte tokens and random merges (real_learned_tokens); the added tokens and template stay the preset's.
    """
    if preset.vocabulary == "hy-7b":
        added = ["<|endoftext|>", "<|startoftext|>", "<|bos|>", "<|eos|>", "<|pad|>"]
        added += [f"<|extra_{k}|>" for k in range(preset.vocab_size - 127957 - len(added))]
        specials = [(t, True) for t in added]
        pre, template = "hunyuan", HY_7B_TEMPLATE
    else:
        real_shape = preset.vocab_size > 120000
        specials = hy_added_tokens(preset.vocab_size - 120000 if real_shape else 818)
        if not real_shape:
            specials = [(t, s) for t, s in specials if t in _TINY_ADDED]
        pre, template = "hunyuan-dense", HY_18B_TEMPLATE
    learned = preset.vocab_size - len(specials)
    if learned_from is None:
        merges = _random_merges(learned - 256, {t for t, _ in specials}, seed=learned)
        tokens = byte_to_unicode() + [m.replace(" ", "") for m in merges] + [t for t, _ in specials]
    else:
        learned_tokens, merges = real_learned_tokens(learned_from, learned)
        tokens = learned_tokens + [t for t, _ in specials]
        if len(set(tokens)) != len(tokens):
            raise HymtError(f"{learned_from}: a learned token repeats one of the preset's added tokens")
    token_types = [TOKEN_NORMAL] * learned + [TOKEN_CONTROL if s else TOKEN_USER_DEFINED for _, s in specials]
    index = {t: i for i, t in enumerate(tokens)}
    if preset.vocabulary == "hy-7b":
        # As the published 7B GGUF declares them: EOS 3 (a byte token), EOT <|eos|>.
        ids = (index["<|startoftext|>"], 3, index["<|eos|>"], index["<|pad|>"])
    else:
        ids = (index[HY_BOS], index[HY_EOS], None, index[_hy(" pad ")])
    return Vocabulary(tokens, token_types, merges, pre, *ids, template=template)


def add_vocabulary(writer: GGUFWriter, vocab: Vocabulary) -> None:
    """The ``tokenizer.*`` metadata of a synthetic vocabulary, as the official converter writes it."""
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_string("tokenizer.ggml.pre", vocab.pre)
    writer.add_array("tokenizer.ggml.tokens", vocab.tokens, GGUFValueType.STRING)
    writer.add_array("tokenizer.ggml.token_type", vocab.token_types, GGUFValueType.INT32)
    writer.add_array("tokenizer.ggml.merges", vocab.merges, GGUFValueType.STRING)
    writer.add_uint32("tokenizer.ggml.bos_token_id", vocab.bos_id)
    writer.add_uint32("tokenizer.ggml.eos_token_id", vocab.eos_id)
    if vocab.eot_id is not None:
        writer.add_uint32("tokenizer.ggml.eot_token_id", vocab.eot_id)
    writer.add_uint32("tokenizer.ggml.padding_token_id", vocab.pad_id)
    writer.add_bool("tokenizer.ggml.add_bos_token", False)  # the template already starts with BOS
    writer.add_string("tokenizer.chat_template", vocab.template)


# -- tensors -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dims: tuple[int, ...]  # GGUF order, fastest first
    role: str  # "norm", "qk_norm", "router", "bias", "embedding", "output" or "matrix"
    layer: int = -1


def tensor_specs(preset: Preset) -> list[TensorSpec]:
    """Every tensor of a preset in file order, with the official names (REFERENCE §4.2)."""
    h, q_width, kv_width = preset.hidden, preset.heads * preset.head_dim, preset.kv_heads * preset.head_dim
    specs = [TensorSpec("token_embd.weight", (h, preset.vocab_size), "embedding")]
    for i in range(preset.blocks):
        p = f"blk.{i}."

        def add(name: str, dims: tuple[int, ...], role: str = "matrix", i: int = i, p: str = p) -> None:
            specs.append(TensorSpec(p + name, dims, role, i))

        add("attn_norm.weight", (h,), "norm")
        add("attn_q.weight", (h, q_width))
        add("attn_k.weight", (h, kv_width))
        add("attn_v.weight", (h, kv_width))
        add("attn_output.weight", (q_width, h))
        add("attn_q_norm.weight", (preset.head_dim,), "qk_norm")
        add("attn_k_norm.weight", (preset.head_dim,), "qk_norm")
        add("ffn_norm.weight", (h,), "norm")
        if preset.experts and i > 0:
            e, m, s = preset.experts, preset.expert_ffn, preset.shared_ffn
            add("ffn_gate_inp.weight", (h, e), "router")
            add("exp_probs_b", (e,), "bias")
            add("ffn_gate_exps.weight", (h, m, e))
            add("ffn_up_exps.weight", (h, m, e))
            add("ffn_down_exps.weight", (m, h, e))
            add("ffn_gate_shexp.weight", (h, s))
            add("ffn_up_shexp.weight", (h, s))
            add("ffn_down_shexp.weight", (s, h))
        else:
            add("ffn_gate.weight", (h, preset.ffn))
            add("ffn_up.weight", (h, preset.ffn))
            add("ffn_down.weight", (preset.ffn, h))
    specs.append(TensorSpec("output_norm.weight", (h,), "norm"))
    if not preset.tied:
        specs.append(TensorSpec("output.weight", (h, preset.vocab_size), "output"))
    return specs


def _more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's Q4_K_M rule for the layers whose attn_v / ffn_down get Q6_K."""
    eighth = layers // 8
    return layer < eighth or layer >= 7 * layers // 8 or (layer - eighth) % 3 == 2


def tensor_dtype(spec: TensorSpec, preset: Preset, fmt: str) -> str:
    """The tensor type a format gives this tensor (the official files' mixes)."""
    if spec.role in ("norm", "qk_norm", "router", "bias"):
        return "F32"
    if fmt in _SINGLE_DTYPE:
        return _SINGLE_DTYPE[fmt]
    if fmt in _TENCENT_DTYPE:  # Tencent low-bit exports: Q6_K embedding (shared as output), F32 norms
        return "Q6_K" if spec.role == "embedding" else _TENCENT_DTYPE[fmt]
    # q4_k: Q4_K_M — Q6_K head, and Q6_K attn_v / ffn_down* in llama.cpp's "more bits" layers.
    if spec.role == "output" or (spec.role == "embedding" and preset.tied):
        return "Q6_K"
    wants_more = spec.name.endswith(".attn_v.weight") or ".ffn_down" in spec.name
    return "Q6_K" if wants_more and _more_bits(spec.layer, preset.blocks) else "Q4_K"


def _weight_std(spec: TensorSpec, preset: Preset) -> float:
    if spec.role in ("embedding", "output"):
        return preset.hidden**-0.25  # logits of std ≈ hidden^(1/4): peaked, but not one-hot
    return spec.dims[0] ** -0.5  # std ≈ 1/√fan_in keeps activations near unit scale


def _float_values(spec: TensorSpec, preset: Preset, rng: np.random.Generator) -> np.ndarray:
    count = int(np.prod(spec.dims))
    noise = rng.standard_normal(count, dtype=np.float32)
    if spec.role == "norm":
        return 1 + np.float32(0.1) * noise
    if spec.role == "qk_norm":  # clearly non-uniform, so applying it before or after RoPE differs
        return 1 + np.float32(0.25) * noise
    if spec.role == "bias":
        return np.float32(0.05) * noise
    return np.float32(_weight_std(spec, preset)) * noise


def _fp16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype("<f2").view(np.uint8).reshape(-1, 2)


_BLOCK_SHAPES = {
    "Q8_0": (32, 34),
    "Q4_K": (256, 144),
    "Q6_K": (256, 210),
    "Q2_0C": (512, 130),
    "STQ1_0": (256, 42),
}


def _random_bytes(rng: np.random.Generator, count: int) -> np.ndarray:
    """``count`` uniform random bytes straight from the bit generator (several times faster than
    ``rng.integers``, which matters for gigabytes of codes)."""
    return rng.bit_generator.random_raw((count + 7) // 8).view(np.uint8)[:count]


_FLOAT_CHUNK = 1 << 22


@functools.cache
def _normal_quantiles() -> np.ndarray:
    """The 65536 quantiles of N(0, 1) at (i + 0.5)/65536: a table that turns random 16-bit indices into
    near-Gaussian values far faster than sampling normals (float32, shape [65536])."""
    normal = statistics.NormalDist()
    return np.array([normal.inv_cdf((i + 0.5) / 65536) for i in range(65536)], dtype=np.float32)


def random_floats(dtype: str, count: int, std: float, rng: np.random.Generator) -> np.ndarray:
    """Raw F32/F16 bytes of ``count`` near-Gaussian values of standard deviation ``std``."""
    table = (_normal_quantiles() * np.float32(std)).astype("<f4" if dtype == "F32" else "<f2")
    out = np.empty(count, dtype=table.dtype)
    for start in range(0, count, _FLOAT_CHUNK):  # bounded index temporaries ([chunk] intp)
        n = min(_FLOAT_CHUNK, count - start)
        indices = _random_bytes(rng, 2 * n).view(np.uint16).astype(np.intp)
        np.take(table, indices, out=out[start : start + n])
    return out.view(np.uint8)


def random_blocks(dtype: str, count: int, std: float, rng: np.random.Generator) -> np.ndarray:
    """Random valid blocks of a quantized type whose decoded weights have standard deviation ≈ ``std``
    (uniform random codes, per-block scales jittered by ±25%). Returns the raw bytes (uint8)."""
    if dtype not in _BLOCK_SHAPES:
        raise HymtError(f"no random block generator for {dtype}")
    block_len, block_bytes = _BLOCK_SHAPES[dtype]
    nb = count // block_len
    out = _random_bytes(rng, nb * block_bytes).reshape(nb, block_bytes)  # (blocks, bytes): codes
    jitter = rng.uniform(0.75, 1.25, size=nb).astype(np.float32)
    if dtype == "Q8_0":  # int8 codes uniform in [-128, 127]: std ≈ 73.9
        out[:, 0:2] = _fp16_bytes(jitter * np.float32(std / 73.9))
    elif dtype == "Q4_K":
        # w = d·sc·q − dmin·m with dmin = 7.5·d and m = sc: each sub-block centred on zero.
        sc = 12 + _random_bytes(rng, nb * 8).reshape(nb, 8) % 29  # 12..40
        d = jitter * np.float32(std / (4.61 * 28.0))  # q uniform 0..15: std 4.61; rms of sc ≈ 28
        out[:, 0:2] = _fp16_bytes(d)
        out[:, 2:4] = _fp16_bytes(d * np.float32(7.5))
        out[:, 4:16] = pack_q4_k_scales(sc, sc)
    elif dtype == "Q6_K":
        raw = _random_bytes(rng, nb * 16).reshape(nb, 16)
        magnitude = (16 + (raw & 127) % 112).astype(np.int8)  # 16..127, sign from the top bit
        out[:, 192:208] = np.where(raw & 128, -magnitude, magnitude).view(np.uint8)
        out[:, 208:210] = _fp16_bytes(jitter * np.float32(std / (18.47 * 78.3)))  # q − 32: std 18.47
    elif dtype == "Q2_0C":  # codes → ±1, ±3: std √5
        out[:, 0:2] = _fp16_bytes(jitter * np.float32(std / 5**0.5))
    else:  # STQ1_0: three ±1 and one 0 per group of four: std √0.75
        out[:, 40:42] = _fp16_bytes(jitter * np.float32(std / 0.75**0.5))
    return out.reshape(-1)


def _tensor_bytes(spec: TensorSpec, preset: Preset, dtype: str, seed: int, index: int) -> np.ndarray:
    rng = np.random.default_rng([seed, index])  # per tensor: independent of generation order
    count = int(np.prod(spec.dims))
    small = spec.role in ("norm", "qk_norm", "router", "bias")
    if small or preset.from_floats:
        return quantize(dtype, _float_values(spec, preset, rng))
    if dtype in ("F32", "F16"):
        return random_floats(dtype, count, _weight_std(spec, preset), rng)
    return random_blocks(dtype, count, _weight_std(spec, preset), rng)


# -- files -------------------------------------------------------------------------------------------------


def _check(preset: str, fmt: str) -> Preset:
    if preset not in PRESETS:
        raise HymtError(f"unknown synthetic preset {preset}; expected one of {', '.join(PRESETS)}")
    if fmt not in FORMATS:
        raise HymtError(f"unknown synthetic format {fmt}; expected one of {', '.join(FORMATS)}")
    chosen = PRESETS[preset]
    if fmt in _TENCENT_DTYPE and chosen.architecture != "hunyuan-dense":
        raise HymtError(f"format {fmt} is a Tencent low-bit profile, which requires hunyuan-dense")
    return chosen


def write_synthetic_model(
    path: str | Path, preset: str, fmt: str, seed: int = 0, learned_vocab: str | Path | None = None
) -> Path:
    """Write a seeded random model of ``preset`` shape in ``fmt`` (atomically) and return its path;
    ``learned_vocab``: the real BPE vocabulary its tokenizer learns from (build_vocabulary)."""
    p = _check(preset, fmt)
    arch = p.architecture
    vocab = build_vocabulary(p, learned_vocab)
    writer = GGUFWriter(Path(path), alignment=32)
    writer.add_string("general.architecture", arch)
    writer.add_string("general.type", "model")
    writer.add_string("general.name", f"hymt synthetic {p.name} {fmt} seed {seed}")
    if fmt == "stq1":
        writer.add_string("general.finetune", "2bit-stride16")
    writer.add_uint32("general.file_type", _FILE_TYPES[fmt])
    if fmt not in ("f32", "f16"):
        writer.add_uint32("general.quantization_version", 2)
    for key, value in (
        ("block_count", p.blocks),
        ("context_length", CONTEXT_LENGTH),
        ("embedding_length", p.hidden),
        ("feed_forward_length", p.ffn),
        ("attention.head_count", p.heads),
        ("attention.head_count_kv", p.kv_heads),
        ("attention.key_length", p.head_dim),
        ("attention.value_length", p.head_dim),
    ):
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_float32(f"{arch}.rope.freq_base", ROPE_BASE)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", RMS_EPS)
    if p.experts:
        for key, value in (
            ("expert_count", p.experts),
            ("expert_used_count", p.experts_used),
            ("expert_feed_forward_length", p.expert_ffn),
            ("expert_shared_feed_forward_length", p.shared_ffn),
            ("expert_shared_count", 1),
            ("leading_dense_block_count", 1),
            ("expert_gating_func", 2),
        ):
            writer.add_uint32(f"{arch}.{key}", value)
        writer.add_bool(f"{arch}.expert_weights_norm", True)
        writer.add_float32(f"{arch}.expert_weights_scale", EXPERT_WEIGHTS_SCALE)

    add_vocabulary(writer, vocab)

    for index, spec in enumerate(tensor_specs(p)):
        dtype = tensor_dtype(spec, p, fmt)
        writer.add_tensor(spec.name, spec.dims, dtype, _lazy(_tensor_bytes, spec, p, dtype, seed, index))
    return writer.write()


def _lazy(fn: Callable[..., np.ndarray], *args: object) -> Callable[[], np.ndarray]:
    return lambda: fn(*args)


def synthetic_path(
    preset: str, fmt: str, data_dir: str | Path, seed: int = 0, learned_vocab: str | Path | None = None
) -> Path:
    """Where the cache keeps a synthetic model; one built on a real vocabulary is named by that file's
    SHA-256, so another vocabulary (or an edited file) is another model."""
    vocab = "" if learned_vocab is None else f"-vocab{file_sha256(learned_vocab)[:12]}"
    return Path(data_dir) / "synthetic" / f"{preset}-{fmt}-s{seed}-v{GENERATOR_VERSION}{vocab}.gguf"


def ensure_synthetic_model(
    preset: str, fmt: str, data_dir: str | Path, seed: int = 0, learned_vocab: str | Path | None = None
) -> Path:
    """The cached synthetic model under ``<data_dir>/synthetic/``, written first if absent."""
    _check(preset, fmt)
    if learned_vocab is not None and not Path(learned_vocab).is_file():
        raise HymtError(f"vocabulary file not found: {learned_vocab}")
    path = synthetic_path(preset, fmt, data_dir, seed, learned_vocab)
    if not path.exists():
        print(f"Writing synthetic model {path} (once; later runs reuse it)...", file=sys.stderr, flush=True)
        write_synthetic_model(path, preset, fmt, seed, learned_vocab)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    from hymt.cli import ArgumentParser

    parser = ArgumentParser(
        prog="python -m hymt.synthetic", description="Write a synthetic Hy-MT2-shaped GGUF."
    )
    parser.add_argument("--preset", required=True, choices=list(PRESETS))
    parser.add_argument("--format", required=True, choices=FORMATS, dest="fmt")
    parser.add_argument("-o", "--output", required=True, type=Path, metavar="PATH")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--learned-vocab",
        type=Path,
        metavar="GGUF",
        help="take the learned BPE tokens and merges from this real vocabulary (vocab-only or model GGUF), "
        "so text tokenizes as with the real model",
    )
    args = parser.parse_args(argv)
    start = time.perf_counter()
    path = write_synthetic_model(args.output, args.preset, args.fmt, args.seed, args.learned_vocab)
    seconds = time.perf_counter() - start
    print(f"wrote {path} ({path.stat().st_size} bytes) in {seconds:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from hymt.cli import run

    run(main)
