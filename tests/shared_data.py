"""The one place tests find ../shared (real Hy-MT2 fixtures): `from shared_data import shared_file`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_dir() -> Path | None:
    """The shared data folder (env HYMT_SHARED, default ../shared beside the checkout), or None."""
    root = Path(os.environ.get("HYMT_SHARED") or REPO_ROOT.parent / "shared")
    return root if root.is_dir() else None


def shared_file(*parts: str) -> Path:
    """Path of a file under shared/; skips the test when it is absent, fails under CI=true."""
    root = shared_dir()
    path = root.joinpath(*parts) if root is not None else None
    if path is None or not path.exists():
        message = f"shared fixture {'/'.join(parts)} not found (set HYMT_SHARED)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path
