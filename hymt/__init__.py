"""hymt: Tencent Hy-MT2 translation models (GGUF) on the CPU, served through an OpenAI-compatible API."""

from __future__ import annotations

from hymt.errors import HymtError

__version__ = "0.1.0"

__all__ = ["HymtError", "__version__"]
