"""The README's two commands stay the ones a newcomer and CI run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), re.S)
    return [b.strip() for b in blocks[:2]]


def test_readme_opens_with_two_commands() -> None:
    start, test = readme_commands()
    assert "uvicorn app.main:app" in start and "pip install" in start
    assert "pytest" in test and "pip install" in test


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert readme_commands()[1] in ci


def test_setup_never_pulls_a_cuda_torch() -> None:
    # torch is pinned to the version whose CPU build these machines carry.
    for command in readme_commands():
        if "torch" in command:
            assert "torch==2.13.0" in command
