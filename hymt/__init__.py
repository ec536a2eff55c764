"""hymt: Tencent Hy-MT2 translation models (GGUF) on the CPU, served through an OpenAI-compatible API."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

# OpenMP threads that finish a matrix product spin before they sleep. libgomp's default (300,000 spins,
# milliseconds) lets a waiting thread hold a core that its partner or another process needs: beside one busy
# process, decode steps of the 1.25Bit model took 0.5–0.7 s instead of 21 ms on 2 cores. 3000 spins (a few
# µs) still cover the gaps between the products of a forward pass: idle speed within 3 %, 56 ms beside the
# busy process (docs/benchmarks.md). Set before the kernels load libgomp; the user's own setting wins.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "3000")

from hymt.errors import HymtError  # noqa: E402

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
