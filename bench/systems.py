"""The systems a run can measure, and how each one's adapter is built and started.

Python systems run ``python -m bench.adapters SYSTEM`` in their own venv (``venvs.py``); River
is our Go program in ``bench/river`` and graphile-worker our Node script in
``bench/graphile`` (``builds.py``). All of them speak the same adapter protocol
(``bench/adapters/base.py``), so the scenarios drive them alike.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

from bench import builds, venvs
from bench.processes import SystemEnv

SYSTEMS = (
    "venturi",
    "venturi-uvloop",
    "pgqueuer",
    "pgqueuer-defaults",
    "procrastinate",
    "river",
    "river-1ms",
    "graphile-worker",
    "celery",
)
PEERS = SYSTEMS[2:]

BASE = "venturi-base"
"""venturi built from another commit (`--venturi-base COMMIT`): the before of a before/after
measured in the same run. Not in SYSTEMS: it exists only with that option."""

# River at its defaults (FetchCooldown 100 ms, FetchPollInterval 1 s) is "river"; the same
# program with the shortest cooldown River allows and a short poll interval is "river-1ms".
RIVER_OPTIONS: dict[str, tuple[str, ...]] = {
    "river": (),
    "river-1ms": ("-fetch-cooldown=1ms", "-fetch-poll-interval=50ms"),
}

# Variants of a Python system: (venv and adapter, extra environment).
PYTHON_VARIANTS: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "venturi-uvloop": ("venturi", (("BENCH_VENTURI_LOOP", "uvloop"),)),
    "pgqueuer-defaults": ("pgqueuer", (("BENCH_PGQUEUER_MAPPING", "defaults"),)),
}

# Scenarios a system does not run, with the reason shown in RESULTS.md.
NOT_APPLICABLE: dict[tuple[str, str], str] = {
    **{
        ("pgqueuer-defaults", pattern): (
            "this variant only shows the c=1 drain at `pgq run`'s defaults; everywhere else "
            "it is pgqueuer"
        )
        for pattern in ("drain_c16", "enqueue_*", "pickup*", "backlog")
    },
    ("river", "enqueue_*"): (
        "the same insert code as river-1ms (the fetch settings change only the worker side), "
        "measured there"
    ),
}


def not_applicable(system: str, scenario: str) -> str | None:
    for (name, pattern), why in NOT_APPLICABLE.items():
        if name == system and fnmatch.fnmatch(scenario, pattern):
            return why
    return None


def needs_redis(systems: list[str]) -> bool:
    return "celery" in systems


def prepare(
    system: str,
    *,
    repo: Path,
    workdir: Path,
    pythonpath: Path,
    upgrade: bool,
    source: str,
    redis_url: str | None,
) -> SystemEnv:
    """Install or build ``system`` (cached) and say how to start its adapter."""
    log = workdir / "install.log"
    logdir = workdir / "logs"
    if system in RIVER_OPTIONS:
        binary = builds.river(log)
        return SystemEnv(system, (str(binary), *RIVER_OPTIONS[system]), logdir)
    if system == "graphile-worker":
        script = builds.graphile(log)
        return SystemEnv(system, ("node", str(script)), logdir)
    adapter, extra_env = PYTHON_VARIANTS.get(system, (system, ()))
    if system == "celery":
        if redis_url is None:
            raise RuntimeError("celery needs the private Redis server")
        extra_env = (("BENCH_REDIS_URL", redis_url),)
    if system == BASE:
        # Its own environment, the same adapter: only the installed venturi differs.
        python = venvs.ensure(BASE, repo, upgrade=upgrade, log=log, source=source)
        adapter = "venturi"
    else:
        python = venvs.ensure(adapter, repo, upgrade=upgrade, log=log, source=source)
    return SystemEnv.python(
        system, python, pythonpath, logdir, adapter=adapter, extra_env=extra_env
    )
