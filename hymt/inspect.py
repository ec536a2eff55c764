"""`hymt-inspect` — "Validate GGUF layout and print model metadata." (REFERENCE.md §10.2)."""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any

from hymt.cli import ArgumentParser, add_model_arguments, resolve_model
from hymt.gguf import GGUFFile, GGUFValueType

# Printed separately by tools that need it; it is long and would bury the rest of the report.
OMITTED_KEYS = frozenset({"tokenizer.chat_template"})


def report(gguf: GGUFFile, *, tensors: bool = False) -> dict[str, Any]:
    """The §10.2 JSON record of a validated file."""
    metadata = {
        key: value
        for key, value in gguf.metadata.items()
        if gguf.metadata_types[key] != GGUFValueType.ARRAY and key not in OMITTED_KEYS
    }
    result: dict[str, Any] = {
        "file_bytes": gguf.file_bytes,
        "metadata": metadata,
        "profile": gguf.profile,
        "tensor_count": len(gguf.tensors),
        "tensor_types": dict(sorted(Counter(info.dtype for info in gguf.tensors.values()).items())),
    }
    if tensors:
        result["tensors"] = [gguf.tensors[name].as_dict() for name in sorted(gguf.tensors)]
    return result


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="hymt-inspect",
        description="Validate GGUF layout and print model metadata.",
    )
    parser.add_argument("path", nargs="?", metavar="PATH", help="GGUF file (same as --model PATH)")
    add_model_arguments(parser)
    parser.add_argument(
        "--tensors", action="store_true", help="also list every tensor record, sorted by name"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.path is not None and args.model is not None:
        parser.error("give the model either as PATH or as --model, not both")
    path, profile = resolve_model(args.path or args.model, args.gguf_profile)
    with GGUFFile(path, profile) as gguf:
        record = report(gguf, tensors=args.tensors)
    # JSON is UTF-8 whatever the locale says, so bytes go straight to stdout.
    sys.stdout.flush()
    sys.stdout.buffer.write(json.dumps(record, indent=2, ensure_ascii=False).encode("utf-8") + b"\n")
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    from hymt.cli import run

    run(main)
