"""The README's two commands stay the ones a newcomer and CI run."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), re.S)
    return [b.strip() for b in blocks[:2]]


def test_readme_opens_with_two_commands() -> None:
    start, test = readme_commands()
    assert "uvicorn app.main:app" in start and "pip install" in start
    assert "pytest" in test and "pip install" in test


def ci_lines() -> list[str]:
    return [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]


def test_ci_runs_the_readme_test_command() -> None:
    # the README's install, then (after the checks) its pytest, each a line of its own
    install, tests = readme_commands()[1].split(" && ")
    lines = ci_lines()
    assert install in lines and tests in lines
    assert lines.index(install) < lines.index(tests)


def test_ci_checks_format_lint_and_types_before_the_tests() -> None:
    # python3 -m: the ruff and mypy the test extra installed; `set -e`: a failing check fails CI
    install, tests = readme_commands()[1].split(" && ")
    lines = ci_lines()
    assert "set -euo pipefail" in lines
    for check in ("python3 -m ruff format --check .", "python3 -m ruff check .", "python3 -m mypy"):
        assert lines.index(install) < lines.index(check) < lines.index(tests), check


def test_mypy_checks_every_package() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert sorted(config["files"]) == ["app", "calculators", "measure"]
    assert config["strict"] is True


def test_setup_never_pulls_a_cuda_torch() -> None:
    # torch is pinned to the version whose CPU build these machines carry.
    for command in readme_commands():
        if "torch" in command:
            assert "torch==2.13.0" in command
