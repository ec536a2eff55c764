"""The four programs also run as ``python -m hymt.<module>``, with the same parser as their ``bin/`` scripts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import hymt

PACKAGE_ROOT = str(Path(hymt.__file__).resolve().parents[1])


@pytest.mark.parametrize("module", ["bench", "download", "inspect", "serve"])
def test_module_entry_points(module):
    env = dict(os.environ, PYTHONPATH=PACKAGE_ROOT)
    run = [sys.executable, "-m", f"hymt.{module}"]
    result = subprocess.run([*run, "--version"], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == f"hymt-{module} {hymt.__version__}"
    result = subprocess.run([*run, "--no-such-flag"], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2 and result.stderr.startswith(f"usage: hymt-{module} ")
    assert (
        "error: unrecognized arguments: --no-such-flag" in result.stderr and "Traceback" not in result.stderr
    )


def test_data_dir_expands_a_leading_tilde(monkeypatch, tmp_path):
    """HYMT_DATA_DIR=~/models from a .env or systemd file reaches hymt unexpanded; a folder literally
    named `~` in the working directory is not what anyone wants (and invites a fatal `rm -rf ~`)."""
    from hymt.cli import data_dir

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("HYMT_DATA_DIR", "~/models")
    assert data_dir() == tmp_path / "models"
    monkeypatch.delenv("HYMT_DATA_DIR")
    assert data_dir() == Path("data")
    from hymt.cli import resolve_model

    assert resolve_model("~/m.gguf") == (tmp_path / "m.gguf", "auto")
