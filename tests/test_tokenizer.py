"""Tokenizer (REFERENCE.md §6, §12.7): fixtures, an independent Hugging Face `tokenizers` pipeline, errors.

The reference pipeline is built here from the same GGUF data with the `tokenizers` package (what the
official Hy-MT2 tokenizers are): BPE with the GGUF merges, Isolated `Split` stages with the §6.3 strings,
a ByteLevel pre-tokenizer without its own regex, and the added tokens as (non-)special AddedTokens.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
from shared_data import shared_file

from hymt.chat import render_chat
from hymt.errors import TokenizerError
from hymt.gguf import GGUFFile
from hymt.tokenizer import BYTE_DECODER, BYTE_ENCODER, Tokenizer

# REFERENCE.md §6.3, copied from the spec (not from hymt) for the reference pipeline.
SPEC_PRETOKENIZERS = {
    "hunyuan-dense": [
        r"\p{N}{1,3}",
        r"[一-龥぀-ゟ゠-ヿ]+",
        r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    ],
    "hunyuan": [
        r"""(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    ],
}

# The real 1.8B added tokens include this prefix pair (`<tool_call>` / `<tool_calls>`): appended to the 7B
# vocabulary as user-defined tokens they exercise leftmost-longest matching of ordinary added tokens.
EXTRA_USER_DEFINED = ["<think>", "</think>", "/no_think", "<tool_call>", "<tool_calls>"]


@pytest.fixture(scope="module")
def vocab_7b() -> dict:
    with GGUFFile(shared_file("fixtures", "hy-mt2-7b-vocab.gguf")) as gguf_file:
        return dict(gguf_file.metadata)


@pytest.fixture(scope="module")
def tok_7b() -> Tokenizer:
    return Tokenizer.from_gguf(shared_file("fixtures", "hy-mt2-7b-vocab.gguf"))


@pytest.fixture(scope="module")
def fixture_cases() -> dict:
    return json.loads(shared_file("fixtures", "tokenizers.json").read_text())


def test_byte_map_is_a_bijection():
    assert len(set(BYTE_ENCODER)) == 256
    assert {BYTE_DECODER[c] for c in BYTE_ENCODER} == set(range(256))
    assert BYTE_DECODER["Ġ"] == 0x20 and BYTE_DECODER["Ċ"] == 0x0A and BYTE_DECODER["a"] == ord("a")
    # Printable Latin-1 keeps its code point; the 68 others move to U+0100.. in byte order.
    moved = [b for b in range(256) if BYTE_ENCODER[b] != chr(b)]
    assert len(moved) == 68 and [ord(BYTE_ENCODER[b]) for b in moved] == list(range(256, 256 + 68))


def test_7b_vocabulary_metadata(tok_7b):
    assert tok_7b.vocab_size == 128167
    assert tok_7b.pre == "hunyuan"
    assert (tok_7b.bos_id, tok_7b.eos_id) == (127958, 3)
    assert tok_7b.end_ids == frozenset({3, 127960})
    assert tok_7b.bos_token == "<|startoftext|>"


@pytest.mark.parametrize("index", range(4))
def test_7b_fixture_cases_encode_exactly(tok_7b, fixture_cases, index):
    data = fixture_cases["7b"]
    case = data["cases"][index]
    rendered = render_chat(tok_7b, case["messages"])  # the GGUF's own template
    assert rendered == case["rendered"]
    assert tok_7b.encode(rendered) == case["tokens"]
    for message in case["messages"]:
        assert tok_7b.decode(tok_7b.encode(message["content"])) == message["content"]


def test_encode_adds_no_bos_or_eos(tok_7b):
    assert tok_7b.encode("") == []
    assert tok_7b.encode("Hello") == [9906]
    assert tok_7b.encode("<|startoftext|>Hello<|eos|>") == [127958, 9906, 127960]


def test_decomposed_accent_is_not_normalized(tok_7b):
    decomposed, composed = "e\u0301", "\u00e9"
    assert tok_7b.encode(decomposed) != tok_7b.encode(composed)
    assert tok_7b.decode(tok_7b.encode(decomposed)) == decomposed


def test_section_6_3_digit_example(vocab_7b):
    hy = _tokenizer(vocab_7b, "hunyuan")
    assert hy.encode(" 1234567") == [220, 16, 17, 18, 19, 20, 21, 22]
    dense = _tokenizer(vocab_7b, "hunyuan-dense")
    pieces = [dense.decode([i]) for i in dense.encode(" 1234567")]
    assert pieces == [" ", "123", "456", "7"]


def test_added_tokens_leftmost_longest(vocab_7b):
    tok = _tokenizer(vocab_7b, "hunyuan", extra_user_defined=EXTRA_USER_DEFINED)
    call, calls = (tok.tokens.index(t) for t in ("<tool_call>", "<tool_calls>"))
    assert tok.encode("<tool_calls>") == [calls]
    assert tok.encode("x<tool_call>s") == [tok.encode("x")[0], call, tok.encode("s")[0]]
    ids = tok.encode("ab<think>cd")
    assert ids.count(tok.tokens.index("<think>")) == 1
    assert tok.decode(tok.encode("a<think>b")) == "a<think>b"  # user-defined tokens decode to their text
    assert tok.decode(tok.encode("a<|eos|>b")) == "ab"  # control tokens decode to nothing


# ---- independent reference: a Hugging Face `tokenizers` pipeline built from the same data ----------------


def _tokenizer(meta: dict, pre: str, extra_user_defined: list[str] = ()) -> Tokenizer:
    tokens = list(meta["tokenizer.ggml.tokens"]) + list(extra_user_defined)
    types = np.concatenate([meta["tokenizer.ggml.token_type"], np.full(len(extra_user_defined), 4, np.int32)])
    return Tokenizer(
        tokens,
        types,
        meta["tokenizer.ggml.merges"],
        bos_id=meta["tokenizer.ggml.bos_token_id"],
        eos_id=meta["tokenizer.ggml.eos_token_id"],
        eot_id=meta["tokenizer.ggml.eot_token_id"],
        pre=pre,
    )


@pytest.fixture(scope="module")
def hf_reference(vocab_7b):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import AddedToken, Regex, decoders, models

    tokens = list(vocab_7b["tokenizer.ggml.tokens"]) + EXTRA_USER_DEFINED
    types = list(vocab_7b["tokenizer.ggml.token_type"].tolist()) + [4] * len(EXTRA_USER_DEFINED)
    merges = [tuple(m.split(" ", 1)) for m in vocab_7b["tokenizer.ggml.merges"]]
    hf = tokenizers.Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t, k in zip(tokens, types, strict=True)
            if k in (2, 3, 5)
        ]
    )
    hf.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types, strict=True) if k == 4]
    )

    def with_pre(pre: str):
        from tokenizers import pre_tokenizers

        stages = [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in SPEC_PRETOKENIZERS[pre]]
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [*stages, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
        return hf

    return with_pre


CHUNKS = {
    "latin": ["café", "naïve", "Größe", "façade", "Ångström", "hello", "World", "ÉCOLE", "ﬁne", "ǅemal", "ß"],
    "cjk": ["你好", "世界", "機器翻譯", "龥龦", "㐀", "中文字", "丂"],
    "kana": ["ひらがな", "カタカナ", "ｶﾀｶﾅ", "ー", "ゟ゠", "ヿ"],
    "hangul": ["안녕하세요", "세계", "가"],
    "cyrillic": ["Привет", "мир", "ЁЖ", "ёлка"],
    "arabic": ["مرحبا", "بالعالم", "٪"],
    "devanagari": ["नमस्ते", "दुनिया", "क्ष"],
    "thai": ["สวัสดี", "ชาวโลก", "ภาษาไทย"],
    "emoji": ["😀", "👍🏽", "👨‍👩‍👧", "🏳️‍🌈", "❤️", "🇯🇵", "\u200d", "👩🏿‍💻"],
    "combining": ["e\u0301", "a\u0308\u0301", "\u0301", "n\u0303", "\u20dd"],
    "space": [
        "\t",
        "\n",
        "\r\n",
        "\r",
        "\n\n\n",
        "  ",
        "   ",
        "\u00a0",
        "\u2003",
        "\u3000",
        "\u202f",
        "\x0b",
        "\x0c",
        "\x1c",
        "\x1f",
        "\u0085",
        "\u2028",
        "\u2029",
        "\u200b",
        "\ufeff",
        " \n ",
        "\t\t ",
        "\r\n\r\n",
    ],  # fmt: skip
    "contraction": [
        "'s",
        "'S",
        "'t",
        "'T",
        "'re",
        "'RE",
        "'Re",
        "'ve",
        "'VE",
        "'m",
        "'M",
        "'ll",
        "'LL",
        "'d",
        "'D",
        "n't",
        "isn't",
        "I'M",
        "WE'LL",
        "'x",
    ],  # fmt: skip
    "punct": [
        ".",
        ",",
        "!",
        "?",
        "...",
        "—",
        "«»",
        "“”",
        "、",
        "。",
        "，",
        "$",
        "€",
        "+",
        "=",
        "<",
        ">",
        "((",
        "@#",
        "_",
        "`",
        "~",
        "|",
        "\\",
        "/",
        "-",
        "'",
    ],  # fmt: skip
    "special": [
        "<|extra_0|>",
        "<|eos|>",
        "<|startoftext|>",
        "<think>",
        "</think>",
        "/no_think",
        "<tool_call>",
        "<tool_calls>",
        "<|extra_1",
        "<|extra_10|>",
        "<|extra_1|>0|>",
        "<thin",
        "think>",
        "<|eos|",
    ],  # fmt: skip
    "other": ["½", "Ⅻ", "²", "ℝ", "\u00ad", "\x00", "\x7f", "\ue000", "𝔘𝔫𝔦", "©", "°C", "™"],
}
DIGITS = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "۰۱۲۳۴۵۶۷۸۹", "０１２３４５６７８９", "०१२३४५६७८९", "๐๑๒๓๔๕๖๗๘๙"]


def random_text(rng: random.Random) -> str:
    out = []
    for _ in range(rng.randint(1, 24)):
        kind = rng.choice([*CHUNKS, "digits", "digits"])
        if kind == "digits":  # runs of every length 1..13, sometimes mixing digit systems
            alphabet = rng.choice(DIGITS) if rng.random() < 0.8 else "".join(DIGITS)
            chunk = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 13)))
        else:
            chunk = rng.choice(CHUNKS[kind])
        glue = rng.random()
        if glue < 0.4:
            out.append(" ")
        elif glue < 0.55:
            out.append(rng.choice(["a", "Z", "x", "é", "字", "'", "1"]))  # glue chunks mid-word
        out.append(chunk)
    return "".join(out)


@pytest.mark.parametrize("pre", ["hunyuan", "hunyuan-dense"])
def test_matches_hugging_face_pipeline(vocab_7b, hf_reference, pre):
    """Zero mismatches on 3000 seeded random mixed-script strings (7B vocabulary, both pre-tokenizers)."""
    rng = random.Random(20240607 + len(pre))
    texts = [random_text(rng) for _ in range(3000)]
    ours = _tokenizer(vocab_7b, pre, extra_user_defined=EXTRA_USER_DEFINED)
    reference = [e.ids for e in hf_reference(pre).encode_batch(texts, add_special_tokens=False)]
    mismatches = [
        (t, r, ours.encode(t)) for t, r in zip(texts, reference, strict=True) if ours.encode(t) != r
    ]
    assert mismatches == []
    special = [t for t, k in zip(ours.tokens, ours.token_types.tolist(), strict=True) if k in (2, 3, 5)]
    for text in texts[:500]:
        if not any(s in text for s in special):
            assert ours.decode(ours.encode(text)) == text


@pytest.mark.parametrize("pre", ["hunyuan", "hunyuan-dense"])
def test_long_pieces_match_hugging_face_pipeline(vocab_7b, hf_reference, pre):
    """Pieces over 128 bytes take the heap merge path: 1 MB-scale words must not be quadratic, or wrong."""
    rng = random.Random(99)
    alphabets = [
        "abcdefghijklmnopqrstuvwxyz",
        "aaab",
        "你好世界机器翻译",
        "ひらがなカタカナ",
        "абвгд",
        "😀👍🏽",
        "é\u0301ß",
    ]
    texts = [
        "".join(rng.choice(a) for _ in range(rng.randint(100, 3000))) for a in alphabets for _ in range(4)
    ]
    texts.append("x" * 20000 + " " + "字" * 5000)
    ours = _tokenizer(vocab_7b, pre)
    reference = [e.ids for e in hf_reference(pre).encode_batch(texts, add_special_tokens=False)]
    assert [ours.encode(t) for t in texts] == reference


def test_cache_does_not_change_results(vocab_7b):
    tok = _tokenizer(vocab_7b, "hunyuan-dense")
    text = random_text(random.Random(5)) * 3
    first = tok.encode(text)
    assert tok.encode(text) == first  # now from the piece cache


# ---- decoding of every token type ---------------------------------------------------------------------


def _small(**overrides) -> Tokenizer:
    """256 byte tokens, then control, user-defined, byte, unknown and unused tokens, and one merge."""
    tokens = [*BYTE_ENCODER, "<s>", "</s>", "<think>", "<0x41>", "<unk>", "<unused>", "ab"]
    types = [1] * 256 + [3, 3, 4, 6, 2, 5, 1]
    args = {
        "tokens": tokens,
        "token_types": types,
        "merges": ["a b"],
        "bos_id": 256,
        "eos_id": 257,
        "pre": "hunyuan",
    }
    args.update(overrides)
    return Tokenizer(args.pop("tokens"), args.pop("token_types"), args.pop("merges"), **args)


def test_decode_every_token_type():
    tok = _small()
    assert tok.decode([256, 257, 260, 261]) == ""  # control, unknown, unused → no text
    assert tok.token_bytes(258) == b"<think>"  # user-defined → its UTF-8
    assert tok.token_bytes(259) == b"A"  # byte token <0x41>
    assert tok.token_bytes(0x20) == b" " and tok.token_bytes(0x0A) == b"\n"
    assert tok.decode([104, 258, 105]) == "h<think>i"
    assert tok.encode("xab<think><s>") == [120, 262, 258, 256]
    assert tok.decode([0xE4, 0xBD]) == "\ufffd"  # truncated UTF-8 → replacement character
    assert tok.decode(tok.encode("日本")) == "日本"


def test_tiny_fixture_gguf_round_trip(tmp_path):
    from hymt.synthetic import write_tiny_fixture

    path = write_tiny_fixture(tmp_path / "tiny.gguf", moe=False, numeric=False)
    tok = Tokenizer.from_gguf(path)
    assert (tok.vocab_size, tok.bos_id, tok.eos_id, tok.end_ids) == (260, 256, 259, frozenset({259}))
    rendered = render_chat(tok, [{"role": "user", "content": "hi"}])
    assert rendered == "[BOS][USER]hi[ASSISTANT]"
    assert tok.encode(rendered) == [256, 257, ord("h"), ord("i"), 258]


# ---- §6 error messages --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"model": "llama"}, "only the Hy-MT2 byte BPE tokenizer is supported"),
        ({"pre": "llama3"}, "unsupported Hy-MT2 pretokenizer llama3"),
        ({"token_types": None}, "missing token types"),
        ({"token_types": [1] * 10}, "vocabulary and token type counts differ"),
        ({"token_types": [1] * 256 + [3, 3, 4, 6, 2, 5, 7]}, "unsupported token type 7"),
        ({"token_types": [0] + [1] * 255 + [3, 3, 4, 6, 2, 5, 1]}, "unsupported token type 0"),
        (
            {"tokens": [*BYTE_ENCODER, "<s>", "</s>", "<think>", "<0x41>", "<unk>", "<s>", "ab"]},
            "duplicate or remapped vocabulary token at 261",
        ),  # fmt: skip
        ({"merges": ["a b", "ab"]}, "invalid BPE merge"),
        ({"eos_id": 263}, "tokenizer.ggml.eos_token_id is outside the vocabulary"),
        ({"eot_id": 10**6}, "tokenizer.ggml.eot_token_id is outside the vocabulary"),
        ({"eom_id": 263}, "tokenizer.ggml.eom_token_id is outside the vocabulary"),
        ({"eos_id": None}, "GGUF does not declare an end token"),
        ({"eos_id": None, "eot_id": 257}, "missing or invalid integer metadata tokenizer.ggml.eos_token_id"),
        ({"bos_id": 263}, "BOS is outside the vocabulary"),
        ({"bos_id": None}, "missing or invalid integer metadata tokenizer.ggml.bos_token_id"),
        (
            {"tokens": [*BYTE_ENCODER, "<s>", "</s>", "<think>", "<0xZZ>", "<unk>", "<unused>", "ab"]},
            "invalid byte token",
        ),  # fmt: skip
        (
            {"tokens": [*BYTE_ENCODER, "<s>", "</s>", "<think>", "<0x41>", "<unk>", "<unused>", "a b"]},
            "invalid byte BPE character in token 262",
        ),  # fmt: skip
    ],
)
def test_construction_errors(overrides, message):
    with pytest.raises(TokenizerError) as error:
        _small(**overrides)
    assert str(error.value) == message


def test_lone_surrogates_are_an_error():
    with pytest.raises(TokenizerError, match="^text contains a lone surrogate code point$"):
        _small().encode("ok \ud800 no")


def test_out_of_range_ids():
    tok = _small()
    for bad in (-1, 263, 10**9):
        with pytest.raises(TokenizerError, match="^token ID outside vocabulary$"):
            tok.decode([1, bad])
        with pytest.raises(TokenizerError, match="^token ID outside vocabulary$"):
            tok.token_bytes(bad)


def test_metadata_errors(vocab_7b):
    good = dict(vocab_7b)
    for key, value, message in [
        ("tokenizer.ggml.model", "llama", "only the Hy-MT2 byte BPE tokenizer is supported"),
        ("tokenizer.ggml.pre", "qwen2", "unsupported Hy-MT2 pretokenizer qwen2"),
        ("tokenizer.ggml.token_type", None, "missing token types"),
        ("tokenizer.ggml.token_type", np.ones(5, np.int32), "vocabulary and token type counts differ"),
        ("tokenizer.ggml.eot_token_id", 128167, "tokenizer.ggml.eot_token_id is outside the vocabulary"),
        ("tokenizer.ggml.bos_token_id", 128167, "BOS is outside the vocabulary"),
    ]:
        meta = {**good, key: value}
        if value is None:
            del meta[key]
        with pytest.raises(TokenizerError) as error:
            Tokenizer.from_metadata(meta)
        assert str(error.value) == message


def test_bpe_symbol_missing_from_vocabulary_is_an_error():
    tokens = [c for c in BYTE_ENCODER if c != "q"]
    tok = Tokenizer(tokens, [1] * 255, [], bos_id=0, eos_id=1, pre="hunyuan")
    with pytest.raises(TokenizerError, match="no token for the BPE symbol 'q'"):
        tok.encode("quit")


# ---- opt-in: official GGUF files (§13) -------------------------------------------------------------------

OFFICIAL = {"stq": "1.8b", "q2c": "1.8b", "7b": "7b", "30b": "30b"}


@pytest.mark.parametrize("key", list(OFFICIAL))
def test_official_gguf_tokenizers(key, fixture_cases):
    folder = os.environ.get("HYMT_MODELS")
    if not folder:
        pytest.skip("HYMT_MODELS is not set")
    entry = json.loads(shared_file("fixtures", "models.json").read_text())[key]
    path = Path(folder) / entry["file"]
    if not path.exists():
        pytest.skip(f"{entry['file']} not in HYMT_MODELS")
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    assert digest.hexdigest() == entry["sha256"]
    tok = Tokenizer.from_gguf(path)
    for case in fixture_cases[OFFICIAL[key]]["cases"]:
        rendered = render_chat(tok, case["messages"])
        assert rendered == case["rendered"]
        assert tok.encode(rendered) == case["tokens"]
        for message in case["messages"]:
            assert tok.decode(tok.encode(message["content"])) == message["content"]
