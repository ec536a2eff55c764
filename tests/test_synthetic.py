"""Synthetic GGUF files, read back with the `gguf` package (an independent reader)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType

from hymt.synthetic import write_tiny_fixture


def _fields(reader: GGUFReader) -> dict[str, tuple[list[int], object]]:
    return {
        name: (list(field.types), field.contents())
        for name, field in reader.fields.items()
        if not name.startswith("GGUF.")
    }


def _gpt2_char(byte: int) -> str:
    """GPT-2's byte character, written out from the rule in REFERENCE §6.4."""
    if 33 <= byte <= 126 or 161 <= byte <= 172 or 174 <= byte <= 255:
        return chr(byte)
    unprintable = [b for b in range(256) if not (33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255)]
    return chr(0x100 + unprintable.index(byte))


def _expected_tiny_tensors(moe: bool) -> dict[str, list[int]]:
    heads = 4 if moe else 2
    expected = {"token_embd.weight": [4, 260], "output.weight": [4, 260], "output_norm.weight": [4]}
    for b in range(2 if moe else 1):
        expected.update(
            {
                f"blk.{b}.attn_norm.weight": [4],
                f"blk.{b}.ffn_norm.weight": [4],
                f"blk.{b}.attn_q_norm.weight": [2],
                f"blk.{b}.attn_k_norm.weight": [2],
                f"blk.{b}.attn_q.weight": [4, 2 * heads],
                f"blk.{b}.attn_k.weight": [4, 2],
                f"blk.{b}.attn_v.weight": [4, 2],
                f"blk.{b}.attn_output.weight": [2 * heads, 4],
            }
        )
    if moe:
        expected.update(
            {
                "blk.0.ffn_gate.weight": [4, 8],
                "blk.0.ffn_up.weight": [4, 8],
                "blk.0.ffn_down.weight": [8, 4],
                "blk.1.ffn_gate_inp.weight": [4, 3],
                "blk.1.exp_probs_b": [3],
                "blk.1.ffn_gate_exps.weight": [4, 4, 3],
                "blk.1.ffn_up_exps.weight": [4, 4, 3],
                "blk.1.ffn_down_exps.weight": [4, 4, 3],
                "blk.1.ffn_gate_shexp.weight": [4, 4],
                "blk.1.ffn_up_shexp.weight": [4, 4],
                "blk.1.ffn_down_shexp.weight": [4, 4],
            }
        )
    else:
        expected.update(
            {"blk.0.ffn_gate.weight": [4, 8], "blk.0.ffn_up.weight": [4, 8], "blk.0.ffn_down.weight": [8, 4]}
        )
    return expected


def _expected_value(name: str, i: int, numeric: bool) -> float:
    if name.endswith("_norm.weight"):
        return 0.8 + (i % 3) * 0.1 if numeric else 1.0
    if numeric:
        return ((i * 17 + sum(name.encode())) % 31) / 50 - 0.3
    if name == "token_embd.weight":
        return 1.0
    if name == "output.weight":
        return 1.0 if i // 4 == 97 else 0.0
    return 0.0


@pytest.mark.parametrize("moe", [False, True])
@pytest.mark.parametrize("numeric", [False, True])
def test_tiny_fixture_matches_reference_12_1(tmp_path, moe, numeric):
    path = write_tiny_fixture(tmp_path / "tiny.gguf", moe=moe, numeric=numeric)
    reader = GGUFReader(path)
    fields = _fields(reader)
    arch = "hy_v3" if moe else "hunyuan-dense"
    u32, f32, string = [GGUFValueType.UINT32], [GGUFValueType.FLOAT32], [GGUFValueType.STRING]
    expected = {
        "general.architecture": (string, arch),
        f"{arch}.block_count": (u32, 2 if moe else 1),
        f"{arch}.context_length": (u32, 4096),
        f"{arch}.embedding_length": (u32, 4),
        f"{arch}.feed_forward_length": (u32, 8),
        f"{arch}.attention.head_count": (u32, 4 if moe else 2),
        f"{arch}.attention.head_count_kv": (u32, 1),
        f"{arch}.attention.key_length": (u32, 2),
        f"{arch}.attention.value_length": (u32, 2),
        f"{arch}.rope.freq_base": (f32, 10000.0),
        f"{arch}.attention.layer_norm_rms_epsilon": (f32, float(np.float32(1e-5))),
        "tokenizer.ggml.model": (string, "gpt2"),
        "tokenizer.ggml.pre": (string, "hunyuan-dense"),
        "tokenizer.ggml.bos_token_id": (u32, 256),
        "tokenizer.ggml.eos_token_id": (u32, 259),
        "tokenizer.chat_template": (
            string,
            "{{ bos_token }}{% for m in messages %}[USER]{{ m.content }}{% endfor %}[ASSISTANT]",
        ),
        "tokenizer.ggml.tokens": (
            [GGUFValueType.ARRAY, GGUFValueType.STRING],
            [_gpt2_char(b) for b in range(256)] + ["[BOS]", "[USER]", "[ASSISTANT]", "[EOS]"],
        ),
        "tokenizer.ggml.token_type": ([GGUFValueType.ARRAY, GGUFValueType.INT32], [1] * 256 + [3] * 4),
    }
    if moe:
        expected.update(
            {
                f"{arch}.expert_count": (u32, 3),
                f"{arch}.expert_used_count": (u32, 2),
                f"{arch}.expert_feed_forward_length": (u32, 4),
                f"{arch}.expert_shared_feed_forward_length": (u32, 4),
                f"{arch}.expert_gating_func": (u32, 2),
                f"{arch}.expert_weights_norm": ([GGUFValueType.BOOL], True),
                f"{arch}.expert_weights_scale": (f32, float(np.float32(2.826))),
            }
        )
    merges = fields.pop("tokenizer.ggml.merges")
    assert merges[0][0] == GGUFValueType.ARRAY and merges[1] == []
    assert fields == expected

    tensors = {t.name: t for t in reader.tensors}
    shapes = _expected_tiny_tensors(moe)
    assert set(tensors) == set(shapes)
    for name, dims in shapes.items():
        tensor = tensors[name]
        assert list(tensor.shape) == dims, name
        assert tensor.tensor_type.name == "F32"
        assert tensor.data_offset % 32 == 0
        values = np.asarray(tensor.data, dtype=np.float32).ravel()
        want = np.array([_expected_value(name, i, numeric) for i in range(values.size)], dtype=np.float32)
        np.testing.assert_array_equal(values, want, err_msg=name)
    # The header (everything before the first payload) is padded to the alignment.
    assert min(t.data_offset for t in reader.tensors) % 32 == 0


def test_tiny_non_numeric_output_row_of_a(tmp_path):
    reader = GGUFReader(write_tiny_fixture(tmp_path / "t.gguf", moe=False, numeric=False))
    out = {t.name: t for t in reader.tensors}["output.weight"]
    rows = np.asarray(out.data, dtype=np.float32).reshape(260, 4)
    assert np.flatnonzero(rows.sum(axis=1)).tolist() == [ord("a")]
