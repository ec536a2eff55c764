"""hymt vs llama.cpp (llama-cpp-python) on synthetic models; opt-in: ``pytest -m reference``.

Teacher-forced: a 64-token prompt, then 16 single-token steps; the logits after the prompt and after each
step (17 vectors) are compared. llama.cpp evaluates the same 80 tokens with ``logits_all``.

* F32/F16: within relative L2 0.01 of llama.cpp and the same argmax at every position.
* Q8_0/Q4_K/Q6_K: distances to the exact float64 result on the same decoded weights; hymt must be no
  farther than 1.5× llama.cpp's own distance, and dense files within 0.1 of llama.cpp. (Quantized MoE:
  activation rounding flips near-tied expert choices in both engines, so only the distance to exact counts.)
Observed distances are printed (run with ``-s`` to see them).
"""

from __future__ import annotations

import numpy as np
import pytest
from llama_reference import open_llama
from model_reference import ReferenceModel, relative_l2

import hymt
from hymt.synthetic import write_synthetic_model

pytestmark = pytest.mark.reference

PROMPT, STEPS = 64, 16


def hymt_logits(path, tokens: list[int], float_path: bool = False) -> np.ndarray:
    model = hymt.load(path, float_path=float_path)
    session = model.new_session(PROMPT + STEPS)
    rows = [model.forward(session, tokens[:PROMPT])]
    rows += [model.forward(session, [t]) for t in tokens[PROMPT : PROMPT + STEPS]]
    model.close()
    return np.stack(rows)  # [17, vocab]


def llama_logits(path, tokens: list[int]) -> np.ndarray:
    llama = open_llama(path, logits_all=True, n_ctx=PROMPT + STEPS, n_batch=PROMPT + STEPS, n_threads=2)
    llama.eval(tokens)
    scores = np.array(llama.scores[: len(tokens)], dtype=np.float32)
    llama.close()
    return scores[PROMPT - 1 :]  # [17, vocab]


def teacher_tokens(model_path) -> list[int]:
    vocab = hymt.load(model_path).config.vocab_size
    return [int(t) for t in np.random.default_rng(7).integers(0, min(vocab, 256), PROMPT + STEPS)]


def row_distances(a: np.ndarray, b: np.ndarray) -> list[float]:
    return [relative_l2(x, y) for x, y in zip(a, b, strict=True)]


@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
@pytest.mark.parametrize("fmt", ["f32", "f16"])
def test_float_files_match_llama(tmp_path, preset, fmt):
    path = write_synthetic_model(tmp_path / f"{preset}-{fmt}.gguf", preset, fmt, seed=0)
    tokens = teacher_tokens(path)
    ours, theirs = hymt_logits(path, tokens), llama_logits(path, tokens)
    distances = row_distances(ours, theirs)
    print(f"\n{preset} {fmt}: hymt vs llama.cpp max relative L2 {max(distances):.6f}")
    assert max(distances) <= 0.01
    assert (ours.argmax(axis=1) == theirs.argmax(axis=1)).all()


@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
@pytest.mark.parametrize("fmt", ["q8_0", "q4_k", "q6_k"])
def test_quantized_files_no_farther_from_exact_than_llama(tmp_path, preset, fmt):
    path = write_synthetic_model(tmp_path / f"{preset}-{fmt}.gguf", preset, fmt, seed=0)
    tokens = teacher_tokens(path)
    reference = ReferenceModel(path)
    exact = reference.logits(tokens)[PROMPT - 1 :]
    reference.close()
    ours, theirs = hymt_logits(path, tokens), llama_logits(path, tokens)
    ours_exact = float(np.mean(row_distances(ours, exact)))
    theirs_exact = float(np.mean(row_distances(theirs, exact)))
    between = max(row_distances(ours, theirs))
    print(
        f"\n{preset} {fmt}: to exact hymt {ours_exact:.6f} llama.cpp {theirs_exact:.6f}; "
        f"hymt vs llama.cpp max {between:.6f}"
    )
    assert ours_exact <= 1.5 * theirs_exact
    if preset == "tiny":
        assert between <= 0.1
