"""The peers that are not Python: River (Go) and graphile-worker (Node), built into the cache.

Both adapters are ours and live in the repository (``bench/river/``, ``bench/graphile/``), with
their dependencies pinned there (``go.mod``/``go.sum``, ``package.json``/
``package-lock.json``). What they pull in is downloaded by the ordinary clients (the Go module
proxy, npm) into ``~/.cache/venturi-bench`` (``VENTURI_BENCH_CACHE`` moves it) and never into
the repository: Go builds with its module and build caches there and writes the binary there;
npm installs into a copy of ``bench/graphile`` there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from bench.venvs import cache_base

BENCH = Path(__file__).resolve().parent


def river(log: Path) -> Path:
    """Build ``bench/river`` (River pinned in its go.mod) and return the binary."""
    go = shutil.which("go") or "/usr/local/go/bin/go"
    if not Path(go).exists():
        raise RuntimeError("no Go toolchain found (needed for the River adapter)")
    cache = cache_base() / "go"
    out = cache_base() / "river" / "river-adapter"
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "GOMODCACHE": str(cache / "mod"),
        "GOCACHE": str(cache / "build"),
        "GOTOOLCHAIN": "local",
        # -mod=readonly: go.sum in the repository is the pin; a mismatch fails the build.
        "GOFLAGS": "-mod=readonly -modcacherw -buildvcs=false",
        "CGO_ENABLED": "0",
    }
    # Go rebuilds only what changed, so this is cheap when the binary is current.
    _run([go, "build", "-trimpath", "-o", str(out), "."], log, cwd=BENCH / "river", env=env)
    return out


def graphile(log: Path) -> Path:
    """Install ``bench/graphile`` (graphile-worker pinned in its lock file) into the cache and
    return the adapter script there, beside its node_modules."""
    node = shutil.which("node")
    npm = shutil.which("npm")
    if node is None or npm is None:
        raise RuntimeError("node and npm are needed for the graphile-worker adapter")
    src = BENCH / "graphile"
    dest = cache_base() / "graphile"
    dest.mkdir(parents=True, exist_ok=True)
    lock = (src / "package-lock.json").read_bytes()
    stamp = dest / ".installed-lock"
    if not (dest / "node_modules").is_dir() or not stamp.exists() or stamp.read_bytes() != lock:
        for name in ("package.json", "package-lock.json"):
            shutil.copy2(src / name, dest / name)
        _run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            log,
            cwd=dest,
            env={**os.environ, "npm_config_cache": str(cache_base() / "npm")},
        )
        stamp.write_bytes(lock)
    # The scripts (the adapter and its modules) are copied on every run, so the ones measured
    # are the repository's.
    for script in src.glob("*.mjs"):
        shutil.copy2(script, dest / script.name)
    return dest / "adapter.mjs"


def _run(args: list[str], log: Path, *, cwd: Path, env: dict[str, str]) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as fh:
        fh.write(f"$ (cd {cwd} && {' '.join(args)})\n")
        fh.flush()
        result = subprocess.run(args, stdout=fh, stderr=subprocess.STDOUT, cwd=cwd, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:3])} ... failed in {cwd}; see {log}")
