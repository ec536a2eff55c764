"""hymt: Tencent Hy-MT2 translation models (GGUF) on the CPU, served through an OpenAI-compatible API."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hymt.errors import HymtError

if TYPE_CHECKING:
    from hymt.model import Model, load

__version__ = "0.1.0"

__all__ = ["HymtError", "Model", "__version__", "load"]


def __getattr__(name: str) -> Any:
    # `import hymt` stays cheap (no kernels, no numpy graphs) until the model API is used.
    if name in ("Model", "load"):
        from hymt import model

        return getattr(model, name)
    raise AttributeError(f"module 'hymt' has no attribute {name!r}")
