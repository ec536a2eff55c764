"""Real Hy-MT2 models against the reference engines' outputs (REFERENCE.md §13; opt-in: HYMT_MODELS=dir).

Each official file is looked up by name in ``$HYMT_MODELS``; a missing file skips, a present one must match
its SHA-256. Without a reference logits file only the argmax is checked against the first greedy token.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
from model_reference import relative_l2
from shared_data import shared_dir, shared_file

import hymt
from hymt import kernels

KEYS = ["stq", "q2c", "7b", "30b"]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


@pytest.fixture(scope="module", params=KEYS)
def real(request):
    folder = os.environ.get("HYMT_MODELS")
    if not folder:
        pytest.skip("HYMT_MODELS is not set")
    entry = json.loads(shared_file("fixtures", "models.json").read_text())[request.param]
    path = Path(folder) / entry["file"]
    if not path.exists():
        pytest.skip(f"{entry['file']} not in HYMT_MODELS")
    assert sha256(path) == entry["sha256"]
    previous = kernels.get_num_threads()
    kernels.set_num_threads(4)
    model = hymt.load(path)
    references = json.loads(shared_file("fixtures", "model_reference.json").read_text())
    yield request.param, model, references.get(request.param)
    kernels.set_num_threads(previous)
    model.close()


def test_tokenizer_cases(real):
    key, model, _ = real
    from hymt.chat import render_chat

    fixture = json.loads(shared_file("fixtures", "tokenizers.json").read_text())
    cases = fixture[{"stq": "1.8b", "q2c": "1.8b", "7b": "7b", "30b": "30b"}[key]]["cases"]
    for case in cases:
        rendered = render_chat(model.tokenizer, case["messages"])
        assert rendered == case["rendered"]
        assert model.tokenizer.encode(rendered) == case["tokens"]


def test_prefill_logits(real):
    key, model, reference = real
    if reference is None:
        pytest.skip(f"no reference outputs for {key}")
    logits = model.prefill(model.new_session(512), reference["prompt_tokens"])
    assert int(np.argmax(logits)) == reference["generated_tokens"][0]
    root = shared_dir()
    logits_path = root / "fixtures" / reference["logits_file"] if root else None
    if logits_path is not None and logits_path.exists():
        expected = np.fromfile(logits_path, dtype="<f4")
        assert relative_l2(logits, expected) < reference["relative_l2_limit"]


def test_greedy_generation(real):
    key, model, reference = real
    if reference is None:
        pytest.skip(f"no reference outputs for {key}")
    from hymt.generation import GenerationRequest, generate
    from hymt.sampling import SamplingParams

    sampling = SamplingParams(temperature=0.0, top_p=1.0, top_k=-1, repetition_penalty=1.0)
    request = GenerationRequest(reference["prompt_tokens"], 16, sampling, [])
    stream = generate(model, request, context=512)
    text = "".join(stream)
    assert stream.completion.token_ids == reference["generated_tokens"]
    assert text == reference["text"]
