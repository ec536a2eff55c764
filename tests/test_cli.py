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
