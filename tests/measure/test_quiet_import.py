"""`python -m measure` and the job child print no NumPy warning where NumPy is absent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# NumPy made unimportable, as on a host where only torch was installed.
WITHOUT_NUMPY = "import sys; sys.modules['numpy'] = None; "


@pytest.mark.parametrize(
    "code",
    [
        # the CLI: parse the arguments, import the runner (and torch) as a run does
        "import runpy; sys.argv = ['measure', '--help']; import measure.runner; "
        "runpy.run_module('measure', run_name='__main__')",
        # the job child imports the runner by name
        "import importlib; importlib.import_module('measure.runner')",
    ],
)
def test_no_numpy_warning_without_numpy(code: str) -> None:
    pytest.importorskip("torch")
    done = subprocess.run(
        [sys.executable, "-W", "default", "-c", WITHOUT_NUMPY + code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert "NumPy" not in done.stderr, done.stderr
    # the same import without the filter does warn: the test sees the warning it guards against
    bare = subprocess.run(
        [sys.executable, "-W", "default", "-c", WITHOUT_NUMPY + "import torch"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert "Failed to initialize NumPy" in bare.stderr
