"""One virtual environment per measured system, cached outside the repository.

Each system is installed the same way: from PyPI at the version pinned here for the peers, from
this repository for venturi (its committed HEAD by default: other people edit the working tree
while a run goes on; ``worktree`` source measures uncommitted code). The environments live under
``~/.cache/venturi-bench/venvs`` (``VENTURI_BENCH_CACHE`` overrides) and are recreated when
missing; every run re-applies the pins (a no-op when they are met), ``--no-upgrade`` skips that.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# What goes into each environment besides the system's own adapter code (which is imported
# from this repository's ``bench`` package through PYTHONPATH).
# Pinned, so that a run measures what its RESULTS.md names and two runs measure the same code;
# raise a pin to measure a newer release.
PEER_REQUIREMENTS: dict[str, list[str]] = {
    # asyncpg is pgqueuer's fastest driver and the one its performance guide uses; uvloop is a
    # dependency of pgqueuer itself (its CLI runs on it).
    "pgqueuer": ["pgqueuer==1.6.0", "asyncpg==0.32.0"],
    # psycopg[binary]: the libpq C implementation instead of psycopg's pure-Python one.
    "procrastinate": ["procrastinate==3.10.0", "psycopg[binary]==3.3.9"],
    # Celery with its Redis transport (the ``redis`` extra pins a compatible redis-py).
    "celery": ["celery[redis]==5.7.0"],
}

# What a build of the venturi distribution needs from the repository (see pyproject.toml).
_VENTURI_SOURCES = ("pyproject.toml", "README.md", "runtime", "operator")


_REINSTALLED: set[Path] = set()
"""venturi venvs reinstalled by this run (``venturi-uvloop`` shares ``venturi``'s)."""


def cache_base() -> Path:
    """Everything the harness installs lives under here, never in the repository."""
    override = os.environ.get("VENTURI_BENCH_CACHE")
    return Path(override) if override else Path.home() / ".cache" / "venturi-bench"


def cache_root() -> Path:
    return cache_base() / "venvs"


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure(system: str, repo: Path, *, upgrade: bool, log: Path, source: str = "head") -> Path:
    """Create (if missing) and update the environment of ``system``; return its python."""
    venv = cache_root() / system
    fresh = not python_of(venv).exists()
    if fresh:
        shutil.rmtree(venv, ignore_errors=True)
        venv.parent.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, "-m", "venv", str(venv)], log)
    pip = [str(python_of(venv)), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if system in ("venturi", "venturi-base"):
        if venv in _REINSTALLED:
            return python_of(venv)
        # Always reinstalled (once a run): the point is to measure the code in this tree.
        # Built from a copy so that the build's scratch files never land in the repository.
        # With the uvloop extra, for the venturi-uvloop variant.
        with tempfile.TemporaryDirectory(prefix="venturi-bench-src-") as tmp:
            src = _venturi_sources(repo, Path(tmp), source)
            _run([*pip, "--upgrade", "--force-reinstall", f"{src}[uvloop]"], log)
        _REINSTALLED.add(venv)
    elif fresh or upgrade:
        _run([*pip, "--upgrade", *PEER_REQUIREMENTS[system]], log)
    return python_of(venv)


def _venturi_sources(repo: Path, dest: Path, source: str) -> Path:
    """The files a build of venturi needs: from HEAD (``head``) or a commit (``commit:SHA``),
    by ``git archive``, or from the working tree (``worktree``)."""
    src = dest / "venturi-src"
    src.mkdir()
    if source == "head" or source.startswith("commit:"):
        commit = "HEAD" if source == "head" else source.removeprefix("commit:")
        present = [n for n in _VENTURI_SOURCES if _tracked(repo, n, commit)]
        archive = subprocess.run(
            ["git", "-C", str(repo), "archive", "--format=tar", commit, "--", *present],
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    else:
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
        for name in _VENTURI_SOURCES:
            path = repo / name
            if path.is_dir():
                shutil.copytree(path, src / name, ignore=ignore)
            elif path.exists():
                shutil.copy2(path, src / name)
    # pyproject.toml names a readme and two package roots; a checkout may lack one of them.
    (src / "README.md").touch()
    (src / "operator").mkdir(exist_ok=True)
    return src


def _tracked(repo: Path, name: str, commit: str) -> bool:
    probe = subprocess.run(
        ["git", "-C", str(repo), "ls-tree", "--name-only", commit, "--", name],
        capture_output=True,
        text=True,
    )
    return bool(probe.stdout.strip())


def _run(args: list[str], log: Path) -> None:
    with open(log, "a") as fh:
        fh.write(f"$ {' '.join(args)}\n")
        fh.flush()
        result = subprocess.run(args, stdout=fh, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:4])} ... failed; see {log}")
