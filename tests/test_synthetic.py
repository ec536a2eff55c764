"""Synthetic GGUF files, read back with the `gguf` package (an independent reader)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.quants import dequantize
from llama_reference import open_llama
from shared_data import shared_file

from hymt.errors import HymtError
from hymt.synthetic import (
    GENERATOR_VERSION,
    HY_7B_TEMPLATE,
    HY_18B_TEMPLATE,
    PRESETS,
    add_vocabulary,
    build_vocabulary,
    ensure_synthetic_model,
    random_blocks,
    random_floats,
    tensor_dtype,
    tensor_specs,
    write_synthetic_model,
    write_tiny_fixture,
)


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


# ---------------------------------------------------------------------------------------------------------
# Seeded random models


def _census(dtypes) -> dict[str, int]:
    counts: dict[str, int] = {}
    for d in dtypes:
        counts[d] = counts.get(d, 0) + 1
    return counts


@pytest.mark.parametrize(
    ("preset", "fmt", "census"),
    [
        # REFERENCE §4.1 tensor type census of the official files.
        ("1.8b", "q4_k", {"Q4_K": 192, "Q6_K": 33, "F32": 129}),
        ("7b", "q4_k", {"Q4_K": 192, "Q6_K": 33, "F32": 129}),
        ("1.8b", "stq1", {"STQ1_0": 224, "F32": 129, "Q6_K": 1}),
        ("1.8b", "q2_0c", {"Q2_0C": 224, "F32": 129, "Q6_K": 1}),
        ("30b-a3b", "q4_k", {"Q4_K": 407, "Q6_K": 72, "F32": 287}),
        ("30b-a3b", "q8_0", {"Q8_0": 479, "F32": 287}),
        ("1.8b", "q8_0", {"Q8_0": 225, "F32": 129}),
        ("1.8b", "f16", {"F16": 225, "F32": 129}),
    ],
)
def test_real_shape_type_census(preset, fmt, census):
    p = PRESETS[preset]
    assert _census(tensor_dtype(s, p, fmt) for s in tensor_specs(p)) == census


@pytest.mark.parametrize(
    ("preset", "arch", "shapes"),
    [
        (
            "1.8b",
            "hunyuan-dense",
            {
                "token_embd.weight": (2048, 120818),
                "blk.31.attn_q.weight": (2048, 2048),
                "blk.0.attn_k.weight": (2048, 512),
                "blk.0.attn_output.weight": (2048, 2048),
                "blk.5.ffn_down.weight": (6144, 2048),
                "blk.0.attn_q_norm.weight": (128,),
            },
        ),
        (
            "7b",
            "hunyuan-dense",
            {
                "token_embd.weight": (4096, 128167),
                "blk.0.attn_v.weight": (4096, 1024),
                "blk.0.ffn_up.weight": (4096, 14336),
            },
        ),
        (
            "30b-a3b",
            "hy_v3",
            {
                "output.weight": (2048, 120832),
                "blk.0.attn_q.weight": (2048, 4096),
                "blk.0.attn_output.weight": (4096, 2048),
                "blk.0.ffn_gate.weight": (2048, 6912),
                "blk.47.ffn_gate_inp.weight": (2048, 128),
                "blk.47.exp_probs_b": (128,),
                "blk.1.ffn_up_exps.weight": (2048, 768, 128),
                "blk.1.ffn_down_exps.weight": (768, 2048, 128),
                "blk.1.ffn_down_shexp.weight": (768, 2048),
            },
        ),
    ],
)
def test_real_shapes(preset, arch, shapes):
    p = PRESETS[preset]
    assert p.architecture == arch
    specs = {s.name: s.dims for s in tensor_specs(p)}
    for name, dims in shapes.items():
        assert specs[name] == dims, name
    assert ("output.weight" in specs) == (arch == "hy_v3")  # dense real shapes tie the head
    assert (
        "blk.1.ffn_gate.weight" not in specs if arch == "hy_v3" else "blk.1.ffn_gate_exps.weight" not in specs
    )


# Tiny presets written for real: every standard format is read back by the gguf package.
TINY_STANDARD = [(p, f) for p in ("tiny", "tiny-moe") for f in ("f32", "f16", "q8_0", "q4_k", "q6_k")]
GGUF_TYPES = {"F32": 0, "F16": 1, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14}


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic")
    return {(p, f): write_synthetic_model(root / f"{p}-{f}.gguf", p, f, seed=0) for p, f in TINY_STANDARD}


@pytest.mark.parametrize(("preset", "fmt"), TINY_STANDARD)
def test_tiny_presets_read_by_gguf_package(tiny_files, preset, fmt):
    reader = GGUFReader(tiny_files[preset, fmt])
    fields = _fields(reader)
    p = PRESETS[preset]
    arch = fields["general.architecture"][1]
    assert arch == ("hy_v3" if preset == "tiny-moe" else "hunyuan-dense")
    assert fields[f"{arch}.block_count"][1] == 4
    assert fields[f"{arch}.embedding_length"][1] == 512
    assert fields[f"{arch}.attention.key_length"][1] == 128
    assert fields[f"{arch}.attention.value_length"][1] == 128
    assert fields[f"{arch}.rope.freq_base"][1] == 11158840.0
    assert fields["general.file_type"][1] == {"f32": 0, "f16": 1, "q8_0": 7, "q4_k": 15, "q6_k": 18}[fmt]
    tensors = {t.name: t for t in reader.tensors}
    specs = tensor_specs(p)
    assert list(tensors) == [s.name for s in specs]
    for spec in specs:
        tensor = tensors[spec.name]
        assert tuple(int(d) for d in tensor.shape) == spec.dims
        want = tensor_dtype(spec, p, fmt)
        assert int(tensor.tensor_type) == GGUF_TYPES[want], spec.name
        one_d = len(spec.dims) == 1 or spec.name.endswith("ffn_gate_inp.weight")
        assert (want == "F32") == (one_d or fmt == "f32"), spec.name
    if fmt == "q4_k":  # Q6_K head and attn_v/ffn_down of llama.cpp's "more bits" layers 2 and 3 (of 4)
        q6 = sorted(s.name for s in specs if tensor_dtype(s, p, fmt) == "Q6_K")
        head = "token_embd.weight" if preset == "tiny" else "output.weight"
        down = "ffn_down.weight" if preset == "tiny" else "ffn_down_exps.weight"
        extra = [] if preset == "tiny" else ["blk.2.ffn_down_shexp.weight", "blk.3.ffn_down_shexp.weight"]
        assert q6 == sorted(
            [head, "blk.2.attn_v.weight", "blk.3.attn_v.weight", f"blk.2.{down}", f"blk.3.{down}", *extra]
        )


@pytest.mark.parametrize(("preset", "fmt"), [("tiny", "q4_k"), ("tiny-moe", "q8_0"), ("tiny", "f16")])
def test_tiny_weights_are_well_scaled(tiny_files, preset, fmt):
    reader = GGUFReader(tiny_files[preset, fmt])
    for tensor in reader.tensors:
        values = dequantize(tensor.data, tensor.tensor_type).astype(np.float64).reshape(-1)
        assert np.isfinite(values).all()
        dims = [int(d) for d in tensor.shape]
        if tensor.name.endswith("norm.weight"):
            assert 0.9 < values.mean() < 1.1 and values.std() > 0.05  # near one, with jitter
        elif tensor.name.endswith("exp_probs_b"):
            assert np.abs(values).max() < 0.5
        elif tensor.name in ("token_embd.weight", "output.weight"):
            assert values.std() == pytest.approx(512**-0.25, rel=0.1)
        else:
            assert values.std() == pytest.approx(dims[0] ** -0.5, rel=0.15), tensor.name
            assert abs(values.mean()) < 0.2 * values.std()


def test_seeded_and_deterministic(tmp_path):
    a = write_synthetic_model(tmp_path / "a.gguf", "tiny", "q8_0", seed=3).read_bytes()
    b = write_synthetic_model(tmp_path / "b.gguf", "tiny", "q8_0", seed=3).read_bytes()
    c = write_synthetic_model(tmp_path / "c.gguf", "tiny", "q8_0", seed=4).read_bytes()
    assert a.replace(b"seed 3", b"seed 4") != c and a == b
    assert len(a) == len(c)


def test_tencent_low_bit_tiny_files(tmp_path):
    from hymt.gguf import GGUFFile

    for fmt, dtype, type_id, file_type in (("q2_0c", "Q2_0C", 40, 39), ("stq1", "STQ1_0", 42, 41)):
        path = write_synthetic_model(tmp_path / f"{fmt}.gguf", "tiny", fmt)
        profile = "tencent-q2-0c" if fmt == "q2_0c" else "tencent-stq1"
        with GGUFFile(path, profile=profile) as g:
            assert g.metadata["general.file_type"] == file_type
            assert g.metadata.get("general.finetune") == ("2bit-stride16" if fmt == "stq1" else None)
            types = {t.name: t.type_id for t in g.tensors.values()}
            assert set(types.values()) == {0, 14, type_id}
            assert types["token_embd.weight"] == 14 and "output.weight" not in types
            assert sum(1 for v in types.values() if v == type_id) == 4 * 7
            q = g.tensor("blk.0.attn_q.weight")
            assert q.dtype == dtype and q.dimensions == (512, 512)
        if fmt == "q2_0c":  # decode one tensor by the §2.5 rule: codes ±1, ±3 times d, std ≈ 1/√512
            blocks = np.frombuffer(
                path.read_bytes()[q.info.offset : q.info.offset + q.info.byte_len], np.uint8
            )
            blocks = blocks.reshape(-1, 130)
            d = blocks[:, :2].copy().view("<f2").astype(np.float64)
            codes = (blocks[:, 2:, None] >> np.array([0, 2, 4, 6], dtype=np.uint8)) & 3
            weights = (2.0 * codes.reshape(len(blocks), -1) - 3) * d
            assert weights.std() == pytest.approx(512**-0.5, rel=0.1)
            # Tiny presets quantize one float model per seed: the 2-bit weights track the F32 file's.
            f32 = GGUFReader(write_synthetic_model(tmp_path / "f32.gguf", "tiny", "f32"))
            floats = {t.name: t for t in f32.tensors}["blk.0.attn_q.weight"].data.reshape(-1)
            assert np.corrcoef(weights.reshape(-1), floats)[0, 1] > 0.9


def test_low_bit_formats_need_dense_models(tmp_path):
    with pytest.raises(HymtError, match="requires hunyuan-dense"):
        write_synthetic_model(tmp_path / "x.gguf", "tiny-moe", "stq1")
    with pytest.raises(HymtError, match="unknown synthetic preset"):
        write_synthetic_model(tmp_path / "x.gguf", "huge", "f32")
    with pytest.raises(HymtError, match="unknown synthetic format"):
        write_synthetic_model(tmp_path / "x.gguf", "tiny", "q3_k")


@pytest.mark.parametrize("dtype", ["Q8_0", "Q4_K", "Q6_K"])
def test_random_code_blocks_decode_to_target_scale(dtype):
    gtype = {
        "Q8_0": GGMLQuantizationType.Q8_0,
        "Q4_K": GGMLQuantizationType.Q4_K,
        "Q6_K": GGMLQuantizationType.Q6_K,
    }
    raw = random_blocks(dtype, 256 * 512, 0.0125, np.random.default_rng(0))
    values = dequantize(raw, gtype[dtype]).astype(np.float64)
    assert values.std() == pytest.approx(0.0125, rel=0.1)
    assert abs(values.mean()) < 0.0125 * 0.05


@pytest.mark.parametrize("dtype", ["F32", "F16"])
def test_random_floats_are_near_gaussian(dtype):
    raw = random_floats(dtype, 200_000, 0.03, np.random.default_rng(2))
    values = raw.view({"F32": "<f4", "F16": "<f2"}[dtype]).astype(np.float64)
    assert values.std() == pytest.approx(0.03, rel=0.02) and abs(values.mean()) < 0.001
    assert np.mean(np.abs(values) < 0.03) == pytest.approx(0.6827, abs=0.01)  # one-sigma mass
    assert len(np.unique(values)) > 10_000


def test_random_stq1_blocks_follow_codebook_statistics():
    raw = random_blocks("STQ1_0", 256 * 64, 0.02, np.random.default_rng(1)).reshape(-1, 42)
    d = raw[:, 40:42].copy().view("<f2").astype(np.float64)
    # Each group of four weights has three ±1 digits: std = |d|·√0.75.
    assert float(np.sqrt(np.mean(d**2) * 0.75)) == pytest.approx(0.02, rel=0.1)


# -- vocabulary and templates --------------------------------------------------------------------------


def test_templates_equal_the_official_sources():
    fixture = json.loads(shared_file("fixtures", "tokenizers.json").read_text(encoding="utf-8"))
    assert HY_18B_TEMPLATE == fixture["1.8b"]["template"]
    assert HY_7B_TEMPLATE == fixture["7b"]["template"]


def test_added_tokens_match_the_official_1_8b_config():
    config = json.loads(
        shared_file("fixtures", "hy-mt2-1.8b-tokenizer_config.json").read_text(encoding="utf-8")
    )
    official = {int(k): (v["content"], v["special"]) for k, v in config["added_tokens_decoder"].items()}
    vocab = build_vocabulary(PRESETS["1.8b"])
    assert len(vocab.tokens) == 120818
    for token_id, (content, special) in official.items():
        assert vocab.tokens[token_id] == content, token_id
        assert vocab.token_types[token_id] == (3 if special else 4), token_id
    assert (vocab.bos_id, vocab.eos_id, vocab.eot_id) == (120000, 120020, None)
    assert (
        vocab.tokens[vocab.bos_id] == config["bos_token"]
        and vocab.tokens[vocab.eos_id] == config["eos_token"]
    )
    assert vocab.pre == "hunyuan-dense"


def test_7b_vocabulary_matches_the_official_added_tokens():
    from hymt.gguf import GGUFFile

    with GGUFFile(shared_file("fixtures", "hy-mt2-7b-vocab.gguf")) as official:
        meta = official.metadata
        tokens, types = meta["tokenizer.ggml.tokens"], [int(t) for t in meta["tokenizer.ggml.token_type"]]
        ids = [meta[f"tokenizer.ggml.{k}_token_id"] for k in ("bos", "eos", "eot", "padding")]
    vocab = build_vocabulary(PRESETS["7b"])
    assert len(vocab.tokens) == len(tokens) == 128167
    assert vocab.tokens[127957:] == tokens[127957:]
    assert vocab.token_types[127957:] == types[127957:]
    assert [vocab.bos_id, vocab.eos_id, vocab.eot_id, vocab.pad_id] == ids
    assert vocab.pre == "hunyuan"


def _vocab_only_tokenizer(tmp_path, vocab):
    from hymt.gguf import GGUFWriter
    from hymt.tokenizer import Tokenizer

    writer = GGUFWriter(tmp_path / "vocab.gguf", alignment=32)
    writer.add_string("general.architecture", "hunyuan-dense")
    add_vocabulary(writer, vocab)
    return Tokenizer.from_gguf(writer.write())


def test_vocabulary_learned_from_the_real_bpe_tokenizes_like_the_official_tokenizers(tmp_path):
    """The 1.8B shape on the real Hy-MT2 BPE (the 7B vocabulary's first 120000 tokens) keeps the 1.8B's
    added tokens at their official ids and splits text as the official tokenizers do."""
    from hymt.gguf import GGUFFile

    source = shared_file("fixtures", "hy-mt2-7b-vocab.gguf")
    cases = json.loads(shared_file("fixtures", "tokenizers.json").read_text(encoding="utf-8"))
    config = json.loads(
        shared_file("fixtures", "hy-mt2-1.8b-tokenizer_config.json").read_text(encoding="utf-8")
    )
    vocab = build_vocabulary(PRESETS["1.8b"], learned_from=source)
    with GGUFFile(source) as official:
        real_tokens = official.metadata["tokenizer.ggml.tokens"]
    assert len(vocab.tokens) == len(vocab.token_types) == 120818
    assert vocab.tokens[:120000] == list(real_tokens[:120000])
    assert all(t == 1 for t in vocab.token_types[:120000])
    for token_id, entry in config["added_tokens_decoder"].items():
        assert vocab.tokens[int(token_id)] == entry["content"]
    assert vocab.template == HY_18B_TEMPLATE and vocab.pre == "hunyuan-dense"
    tokenizer = _vocab_only_tokenizer(tmp_path, vocab)
    for case_18b in cases["1.8b"]["cases"]:
        ids = tokenizer.encode(case_18b["rendered"])
        # as many tokens as the official 1.8B tokenizer makes, within the 7B BPE's differences on CJK text
        assert abs(len(ids) - len(case_18b["tokens"])) <= 0.1 * len(case_18b["tokens"]), case_18b["rendered"]
    # English text: the 7B's official ids between the 1.8B's official BOS / User / Assistant ids
    first_18b, first_7b = cases["1.8b"]["cases"][0]["tokens"], cases["7b"]["cases"][0]["tokens"]
    assert (
        tokenizer.encode(cases["1.8b"]["cases"][0]["rendered"])
        == first_18b[:2] + first_7b[1:-1] + first_18b[-1:]
    )


def test_learned_vocabulary_errors(tmp_path):
    small = write_synthetic_model(tmp_path / "tiny.gguf", "tiny", "f32")  # 512 tokens, 13 of them added
    with pytest.raises(HymtError, match="fewer than 120000 learned"):
        build_vocabulary(PRESETS["1.8b"], learned_from=small)
    with pytest.raises(HymtError, match="vocabulary file not found"):
        ensure_synthetic_model("tiny", "f32", tmp_path, learned_vocab=tmp_path / "missing.gguf")
    from hymt.cli import resolve_model

    with pytest.raises(HymtError, match="synthetic models only"):
        resolve_model(str(small), "auto", learned_vocab=small)


def test_synthetic_model_on_a_learned_vocabulary_is_cached_apart(tmp_path):
    from hymt.model import load

    source = shared_file("fixtures", "hy-mt2-7b-vocab.gguf")
    plain = ensure_synthetic_model("tiny", "q8_0", tmp_path)
    learned = ensure_synthetic_model("tiny", "q8_0", tmp_path, learned_vocab=source)
    assert learned.parent == plain.parent and learned != plain
    assert learned.name.startswith(f"tiny-q8_0-s0-v{GENERATOR_VERSION}-vocab")
    assert ensure_synthetic_model("tiny", "q8_0", tmp_path, learned_vocab=source) == learned
    model = load(str(learned), threads=1)
    # " the" is one learned token of the real BPE (id 279, a byte pair merge among the first 512)
    assert model.tokenizer.encode(" the") == [279]
    session = model.new_session(64)
    assert np.isfinite(model.forward(session, model.tokenizer.encode("Translate the text."))).all()


@pytest.mark.parametrize("preset", ["tiny", "tiny-moe", "30b-a3b"])
def test_vocabulary_is_a_consistent_byte_bpe(preset):
    vocab = build_vocabulary(PRESETS[preset])
    assert len(vocab.tokens) == PRESETS[preset].vocab_size == len(vocab.token_types)
    assert len(set(vocab.tokens)) == len(vocab.tokens)  # every string maps to its own id
    assert vocab.tokens[:256] == [_gpt2_char(b) for b in range(256)]
    index = {t: i for i, t in enumerate(vocab.tokens)}
    for rank, merge in enumerate(vocab.merges):
        left, right = merge.split(" ")
        assert index[left] < 256 + rank and index[right] < 256 + rank  # built from earlier tokens
        assert index[left + right] == 256 + rank
    learned = 256 + len(vocab.merges)
    assert all(t == 1 for t in vocab.token_types[:learned])
    assert vocab.tokens[vocab.bos_id] == "<｜hy_begin▁of▁sentence｜>"
    assert vocab.tokens[vocab.eos_id] == "<｜hy_place▁holder▁no▁2｜>"
    for name in ("<｜hy_User｜>", "<｜hy_Assistant｜>", "<｜hy_place▁holder▁no▁3｜>", "<think>", "/no_think"):
        assert name in index


def test_tiny_metadata_is_consistent(tiny_files):
    reader = GGUFReader(tiny_files["tiny", "q8_0"])
    fields = _fields(reader)
    tokens = fields["tokenizer.ggml.tokens"][1]
    assert len(tokens) == len(fields["tokenizer.ggml.token_type"][1]) == 512
    assert tokens[fields["tokenizer.ggml.bos_token_id"][1]] == "<｜hy_begin▁of▁sentence｜>"
    assert tokens[fields["tokenizer.ggml.eos_token_id"][1]] == "<｜hy_place▁holder▁no▁2｜>"
    assert fields["tokenizer.ggml.pre"][1] == "hunyuan-dense"
    assert fields["tokenizer.chat_template"][1] == HY_18B_TEMPLATE
    embd = {t.name: t for t in reader.tensors}["token_embd.weight"]
    assert [int(d) for d in embd.shape] == [512, 512]


# -- caching and the command line -----------------------------------------------------------------------


def test_ensure_synthetic_model_caches(tmp_path, capsys):
    path = ensure_synthetic_model("tiny", "q6_k", tmp_path)
    assert path.parent == tmp_path / "synthetic"
    assert path.name == f"tiny-q6_k-s0-v{GENERATOR_VERSION}.gguf"
    # Writing a large preset takes a while (hymt-serve prints nothing else meanwhile): say what happens.
    assert capsys.readouterr().err == f"Writing synthetic model {path} (once; later runs reuse it)...\n"
    mtime = path.stat().st_mtime_ns
    assert ensure_synthetic_model("tiny", "q6_k", tmp_path) == path
    assert capsys.readouterr().err == ""
    assert path.stat().st_mtime_ns == mtime
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary files left


def test_command_line(tmp_path):
    out = tmp_path / "m.gguf"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hymt.synthetic",
            "--preset",
            "tiny",
            "--format",
            "q4_k",
            "-o",
            str(out),
            "--seed",
            "2",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (
        out.read_bytes()
        == write_synthetic_model(tmp_path / "again.gguf", "tiny", "q4_k", seed=2).read_bytes()
    )
    bad = subprocess.run(
        [sys.executable, "-m", "hymt.synthetic", "--preset", "nope", "--format", "q4_k", "-o", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "error:" in bad.stderr and "Traceback" not in bad.stderr


# -- llama.cpp loads the files (opt-in) ----------------------------------------------------------------


def _llama(path):
    return open_llama(path, n_ctx=128, n_batch=128, logits_all=True)


@pytest.mark.reference
@pytest.mark.parametrize(("preset", "fmt"), TINY_STANDARD)
def test_llama_cpp_loads_tiny_presets(tiny_files, preset, fmt):
    llm = _llama(tiny_files[preset, fmt])
    assert llm.n_vocab() == 512
    bos = llm.token_bos()
    assert llm.detokenize([bos], special=True).decode() == "<｜hy_begin▁of▁sentence｜>"
    ids = llm.tokenize("<｜hy_User｜>Hello, world<｜hy_Assistant｜>".encode(), add_bos=False, special=True)
    llm.eval([bos, *ids])
    logits = np.asarray(llm.scores[llm.n_tokens - 1])
    assert np.isfinite(logits).all() and logits.std() > 0.1


@pytest.mark.reference
@pytest.mark.parametrize(("moe", "numeric"), [(False, False), (True, True)])
def test_llama_cpp_loads_tiny_fixture(tmp_path, moe, numeric):
    llm = _llama(write_tiny_fixture(tmp_path / "f.gguf", moe=moe, numeric=numeric))
    llm.eval([256, 1])
    logits = np.asarray(llm.scores[llm.n_tokens - 1])
    assert np.isfinite(logits).all()
    if not numeric:
        assert int(np.argmax(logits)) == ord("a")


@pytest.mark.reference
@pytest.mark.parametrize("preset", ["1.8b", "7b"])
def test_llama_cpp_tokenizes_the_synthetic_vocabulary_like_hymt(tmp_path, preset):
    """The real-size synthetic vocabularies (120k+ merges, added tokens) mean the same to both engines."""
    from hymt.gguf import GGUFWriter
    from hymt.tokenizer import Tokenizer

    vocab = build_vocabulary(PRESETS[preset])
    writer = GGUFWriter(tmp_path / "vocab.gguf")
    writer.add_string("general.architecture", "hunyuan-dense")
    add_vocabulary(writer, vocab)
    path = writer.write()
    llm = open_llama(path, vocab_only=True)
    tokenizer = Tokenizer.from_gguf(path)
    texts = [
        "Hello, world. The quick brown fox jumps over the lazy dog!",
        "你好，日本語、ひらがな カタカナ 1234567 ١٢٣ 😀 e\u0301\t\n  end\n\n",
        "<｜hy_User｜>hi<｜hy_Assistant｜><think></think> /no_think",
        "<|startoftext|>Translate<|extra_0|>",
    ]
    for text in texts:
        assert tokenizer.encode(text) == llm.tokenize(text.encode(), add_bos=False, special=True), text
