"""Exception hierarchy: every library failure is a ``HymtError`` carrying the exact message of REFERENCE.md.

One subclass per layer, so callers can catch a layer's failures without string matching; programs catch
``HymtError`` and print ``error: <message>``.
"""

from __future__ import annotations


class HymtError(Exception):
    """Base class of every error hymt raises on purpose."""

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class GGUFError(HymtError):
    """A GGUF file is malformed, truncated, or uses something hymt does not support."""


class KernelError(HymtError):
    """Bad arguments to a kernel (shapes, dtypes, byte counts) or an unusable ISA family."""


class TokenizerError(HymtError):
    """Tokenizer metadata is invalid or a token id is out of range."""


class TemplateError(HymtError):
    """A chat template failed to render or was refused by the sandbox."""


class ModelError(HymtError):
    """Model configuration, tensor shapes, sessions or a forward pass failed."""


class GenerationError(HymtError):
    """Sampling or generation parameters are invalid, or generation failed."""


class DownloadError(HymtError):
    """A model download or verification failed."""


class ServerError(HymtError):
    """Server configuration is invalid."""
