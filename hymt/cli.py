"""What the four programs share: argument errors, `error: <message>` reporting, model resolution.

Programs (`bin/hymt-*`) call ``run(main)``; ``main(argv)`` parses with ``ArgumentParser`` and returns an
exit code. A ``HymtError`` (or any ``OSError`` from a file the user named) becomes ``error: <message>`` on
stderr and exit 1; argument errors exit 2; no traceback ever reaches the user.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from hymt import __version__
from hymt.errors import HymtError

PROFILES = ("auto", "standard", "tencent-q2-0c", "tencent-stq1")
SYNTHETIC_PREFIX = "synthetic:"
# Synthetic low-bit files cannot be recognised by the SHA-256 pins, so their profile comes from the spec.
SYNTHETIC_PROFILES = {"stq1": "tencent-stq1", "q2_0c": "tencent-q2-0c"}


class ArgumentParser(argparse.ArgumentParser):
    """argparse with `error: <message>` and exit 2 on bad arguments, and a `--version` flag."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.add_argument("--version", action="version", version=f"%(prog)s {__version__}")

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        metavar="PATH",
        help="GGUF file, or synthetic:<preset>:<format> (default: the Hy-MT2-1.8B 1.25Bit model, "
        "downloaded into $HYMT_DATA_DIR or ./data when missing)",
    )
    parser.add_argument("--gguf-profile", choices=PROFILES, default="auto", help="GGUF type-id profile")


def data_dir() -> Path:
    # `~` is expanded: HYMT_DATA_DIR=~/models set in a .env or systemd unit reaches us unexpanded.
    return Path(os.environ.get("HYMT_DATA_DIR") or "data").expanduser()


def resolve_model(
    spec: str | None, profile: str = "auto", learned_vocab: str | Path | None = None
) -> tuple[Path, str]:
    """Path of the model a program should load, and the GGUF profile to load it with.

    ``None`` ensures the default model (verify or download); ``synthetic:<preset>:<format>`` writes the
    synthetic model once into the data directory and reuses it (with ``learned_vocab``, one whose
    tokenizer learns from that real vocabulary: hymt.synthetic.build_vocabulary).
    """
    if spec is None:
        from hymt.download import ensure_default_model

        return Path(ensure_default_model(data_dir())), profile
    if spec.startswith(SYNTHETIC_PREFIX):
        from hymt.synthetic import ensure_synthetic_model

        parts = spec[len(SYNTHETIC_PREFIX) :].split(":")
        if len(parts) != 2 or not all(parts):
            raise HymtError(f"invalid synthetic model {spec!r}; expected synthetic:<preset>:<format>")
        path = Path(ensure_synthetic_model(parts[0], parts[1], data_dir(), learned_vocab=learned_vocab))
        if profile == "auto":
            profile = SYNTHETIC_PROFILES.get(parts[1], "auto")
        return path, profile
    if learned_vocab is not None:
        raise HymtError("a learned vocabulary applies to synthetic models only")
    return Path(spec).expanduser(), profile  # `--model=~/m.gguf` is not expanded by the shell


def run(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> NoReturn:
    """Run a program's ``main`` and turn expected failures into `error: <message>` and exit 1."""
    try:
        code = main(argv)
    except HymtError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = 1
    except OSError as exc:
        print(
            f"error: {exc.strerror or exc}{': ' + str(exc.filename) if exc.filename else ''}", file=sys.stderr
        )
        code = 1
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
