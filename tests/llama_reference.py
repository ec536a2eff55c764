"""llama.cpp (through llama-cpp-python) as the tests' external reference engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


def open_llama(path: Path, **kwargs: Any) -> Any:
    """A ``llama_cpp.Llama`` on plain CPU buffers (skips when llama-cpp-python is absent).

    llama-cpp-python 0.3.36 crashes in decode on quantized models through the CPU "extra buffer types"
    (AMX / repacked weights) on AVX-512 machines; plain CPU buffers compute the same products.
    """
    llama_cpp = pytest.importorskip("llama_cpp")
    import llama_cpp.llama as llama_module

    default_params = llama_cpp.llama_model_default_params

    def plain_buffers() -> Any:
        params = default_params()
        params.use_extra_bufts = False
        return params

    llama_module.llama_cpp.llama_model_default_params = plain_buffers
    try:
        return llama_cpp.Llama(model_path=str(path), verbose=False, **kwargs)
    finally:
        llama_module.llama_cpp.llama_model_default_params = default_params
