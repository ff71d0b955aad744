"""The orchestrator: ``python -m bench [--quick] [--no-peers] ...``.

One command: prepare one virtual environment per system, start a private PostgreSQL, run every
scenario for every system with repetitions interleaved (rep 1 of all systems, then rep 2, ...,
with the system order rotated each time, so drifting machine load hits everyone alike), run
the pgbench ceiling in the same session, write the raw results and RESULTS.md, and stop every
process it started.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from bench import ceiling, redis_server, report, systems
from bench.pg import PrivateServer, find_bindir
from bench.processes import ControlProcess, SystemEnv
from bench.redis_server import PrivateRedis
from bench.scenarios import Outcome, Plan, Runner
from bench.systems import BASE, SYSTEMS

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
SCENARIOS = (
    "drain_c1",
    "drain_c16",
    "enqueue_sequential",
    "ceiling_single",
    "enqueue_bulk100",
    "enqueue_bulk1000",
    "pickup_c1",
    "pickup",
    "backlog",
    "ceiling",
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes, one repetition (CI smoke test)"
    )
    parser.add_argument("--no-peers", action="store_true", help="measure venturi only")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, help="systems to measure")
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, help="scenarios to run")
    parser.add_argument("--reps", type=int, help="repetitions (default: 3, quick: 1)")
    parser.add_argument("--n", type=int, help="jobs per drain/enqueue measurement")
    parser.add_argument("--backlog", type=int, help="pending jobs in the big backlog")
    parser.add_argument(
        "--out",
        type=Path,
        help="where RESULTS.md and results.json go (default: bench/ in full mode, "
        "a temporary directory in quick mode)",
    )
    parser.add_argument(
        "--no-upgrade", action="store_true", help="reuse cached peer venvs as they are"
    )
    parser.add_argument(
        "--venturi-from",
        choices=("head", "worktree"),
        default="head",
        help="build venturi from the committed HEAD (default) or the working tree",
    )
    parser.add_argument(
        "--venturi-base",
        metavar="COMMIT",
        help="also measure venturi built from COMMIT (as the system venturi-base), "
        "interleaved with the rest: a before/after of venturi in one run",
    )
    parser.add_argument(
        "--keep-workdir", action="store_true", help="keep logs and timings after success"
    )
    parser.add_argument(
        "--report-only",
        type=Path,
        metavar="RESULTS_JSON",
        help="measure nothing: rewrite RESULTS.md beside an existing results.json",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report_only:
        raw = json.loads(args.report_only.read_text())
        report.write(raw, (args.out or args.report_only.parent) / "RESULTS.md")
        return 0
    plan = Plan.quick() if args.quick else Plan.full()
    overrides: dict[str, Any] = {}
    if args.reps:
        overrides["reps"] = args.reps
    if args.n:
        overrides["n"] = args.n
    if args.backlog:
        overrides["backlog_big"] = args.backlog
    plan = Plan(**{**plan.as_dict(), **overrides})
    if args.systems:
        selected = list(args.systems)
    elif args.no_peers:
        selected = ["venturi"]
    else:
        selected = list(SYSTEMS)
    if args.venturi_base:
        args.venturi_base = resolve_commit(args.venturi_base)
        if BASE not in selected:
            selected.insert(selected.index("venturi") + 1 if "venturi" in selected else 0, BASE)
    scenarios = list(args.only or SCENARIOS)
    workdir = Path(tempfile.mkdtemp(prefix="venturi-bench-run-"))
    out = args.out or (workdir if args.quick else BENCH)
    out.mkdir(parents=True, exist_ok=True)

    # SIGTERM (CI timeouts, kill) becomes an exception, so every finally block below runs
    # and the server and adapter processes are stopped.
    def terminate(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, terminate)
    print(f"bench: workdir {workdir}", flush=True)
    ok = False
    try:
        asyncio.run(_run(args, plan, selected, scenarios, workdir, out))
        ok = True
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
    finally:
        if ok and not args.keep_workdir and out != workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"bench: logs kept in {workdir}", flush=True)
    return 0 if ok else 1


async def _run(
    args: argparse.Namespace,
    plan: Plan,
    selected: list[str],
    scenarios: list[str],
    workdir: Path,
    out: Path,
) -> None:
    started = time.monotonic()
    results: dict[str, Any] = {
        "meta": {
            "command": " ".join(["python -m bench", *sys.argv[1:]]),
            "mode": "quick" if args.quick else "full",
            "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "plan": plan.as_dict(),
            "systems": selected,
            "scenarios": scenarios,
            "machine": machine(),
            "git": git_revision(args.venturi_from),
            **({"venturi_base": describe_commit(args.venturi_base)} if args.venturi_base else {}),
            "load_before": os.getloadavg(),
        },
        "records": [],
        "ceiling": [],
        "ceiling_single": [],
        "unavailable": {},
    }
    redis: PrivateRedis | None = None
    server: PrivateServer | None = None
    try:
        if systems.needs_redis(selected):
            redis = PrivateRedis(await asyncio.to_thread(redis_server.find_binary))
            await asyncio.to_thread(redis.start)
            results["meta"]["redis"] = await asyncio.to_thread(redis.describe)
        envs = await prepare_envs(
            selected,
            workdir,
            upgrade=not args.no_upgrade,
            source=args.venturi_from,
            base=args.venturi_base,
            results=results,
            redis_url=redis.url if redis else None,
        )
        server = PrivateServer(await asyncio.to_thread(find_bindir))
        await asyncio.to_thread(server.start)
        results["meta"]["postgres"] = await asyncio.to_thread(server.describe)
        results["meta"]["versions"] = await collect_versions(server, envs)
        runner = Runner(server, envs, plan, workdir)
        for rep in range(plan.reps):
            order = selected[rep % len(selected) :] + selected[: rep % len(selected)]
            for scenario in scenarios:
                if scenario == "ceiling":
                    print(f"bench: rep {rep + 1}/{plan.reps} ceiling", flush=True)
                    rows = await ceiling.measure_async(
                        server,
                        f"ceiling_rep{rep}",
                        plan.ceiling_batches,
                        plan.ceiling_clients,
                        plan.ceiling_seconds,
                    )
                    results["ceiling"] += [{"rep": rep, **row} for row in rows]
                    continue
                if scenario == "ceiling_single":
                    # Run right after the single enqueues, so both see the same machine.
                    print(f"bench: rep {rep + 1}/{plan.reps} ceiling_single", flush=True)
                    rate = await ceiling.measure_single_async(
                        server, f"ceiling_single_rep{rep}", plan.ceiling_seconds
                    )
                    results["ceiling_single"].append({"rep": rep, "jobs_per_s": rate})
                    _save(results, out)
                    continue
                for system in order:
                    if system not in envs:
                        continue
                    record = await run_one(runner, scenario, system, rep, plan)
                    results["records"].append(record)
                    _save(results, out)
    finally:
        # Every server this run started is stopped here, also on SIGTERM/Ctrl-C (the adapter
        # processes were stopped by the scenarios' own finally blocks before this runs).
        if server is not None:
            await asyncio.to_thread(server.stop)
        if redis is not None:
            await asyncio.to_thread(redis.stop)
        results["meta"]["load_after"] = os.getloadavg()
        results["meta"]["duration_s"] = round(time.monotonic() - started, 1)
        _save(results, out)
    report.write(results, out / "RESULTS.md")
    print(f"bench: wrote {out / 'RESULTS.md'} and {out / 'results.json'}", flush=True)


async def run_one(
    runner: Runner, scenario: str, system: str, rep: int, plan: Plan
) -> dict[str, Any]:
    record: dict[str, Any] = {"scenario": scenario, "system": system, "rep": rep}
    if (why := systems.not_applicable(system, scenario)) is not None:
        record.update(metrics={}, skipped={"*": why}, info={}, seconds=0.0)
        return record
    print(f"bench: rep {rep + 1}/{plan.reps} {scenario} {system}", flush=True)
    began = time.monotonic()
    try:
        outcome: Outcome
        if scenario.startswith("drain_c"):
            outcome = await runner.drain(system, int(scenario.removeprefix("drain_c")))
        elif scenario == "enqueue_sequential":
            outcome = await runner.enqueue(system, 1)
        elif scenario.startswith("enqueue_bulk"):
            outcome = await runner.enqueue(system, int(scenario.removeprefix("enqueue_bulk")))
        elif scenario == "pickup":
            outcome = await runner.pickup(system, plan.pickup_concurrency)
        elif scenario == "pickup_c1":
            outcome = await runner.pickup(system, 1)
        elif scenario == "backlog":
            outcome = await runner.backlog(system)
        else:
            raise ValueError(scenario)
        record.update(metrics=outcome.metrics, skipped=outcome.skipped, info=outcome.info)
    except Exception as exc:
        # One system failing a scenario must not lose the rest of the run: it is reported.
        record["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    record["seconds"] = round(time.monotonic() - began, 1)
    return record


async def prepare_envs(
    selected: list[str],
    workdir: Path,
    *,
    upgrade: bool,
    source: str,
    base: str | None,
    results: dict[str, Any],
    redis_url: str | None,
) -> dict[str, SystemEnv]:
    # The Python adapters import ``bench`` from a directory that holds nothing else, so no
    # other top-level directory of the repository can shadow a module inside the venvs.
    pythonpath = workdir / "pythonpath"
    pythonpath.mkdir()
    (pythonpath / "bench").symlink_to(BENCH)
    envs = {}
    for system in selected:
        print(f"bench: preparing the {system} environment", flush=True)
        try:
            envs[system] = await asyncio.to_thread(
                systems.prepare,
                system,
                repo=REPO,
                workdir=workdir,
                pythonpath=pythonpath,
                upgrade=upgrade,
                source=f"commit:{base}" if system == BASE else source,
                redis_url=redis_url,
            )
        except Exception as exc:
            if system == "venturi":
                raise
            # A peer that cannot be installed is reported, not fatal (peers are optional).
            results["unavailable"][system] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
    return envs


async def collect_versions(server: PrivateServer, envs: dict[str, SystemEnv]) -> dict[str, Any]:
    versions: dict[str, Any] = {}
    dsn = await asyncio.to_thread(server.create_database, "versions")
    try:
        for system, env in envs.items():
            control = await ControlProcess.start(env, dsn, f"versions_{system}")
            try:
                versions[system] = (await control.call("info", within=60))["versions"]
            finally:
                await control.close()
    finally:
        await asyncio.to_thread(server.drop_database, "versions")
    versions["python"] = platform.python_version()
    return versions


def machine() -> dict[str, Any]:
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    mem_kb = next((int(line.split()[1]) for line in meminfo if line.startswith("MemTotal")), 0)
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo if "model name" in line), "")
    return {
        "cores": os.cpu_count(),
        "cpu": model,
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
        "os": platform.platform(),
    }


def resolve_commit(ref: str) -> str:
    """The full commit id of `ref` in this repository (a clear error if there is none)."""
    found = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if found.returncode != 0:
        raise SystemExit(f"python -m bench: --venturi-base {ref!r}: no such commit here")
    return found.stdout.strip()


def describe_commit(commit: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), "log", "-1", "--format=%h (%cs) %s", commit],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def git_revision(source: str) -> str:
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        runtime = subprocess.run(
            ["git", "-C", str(REPO), "log", "-1", "--format=%h", "--", "runtime", "pyproject.toml"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--", "runtime", "pyproject.toml"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown"
    revision = f"HEAD {head} (runtime last changed in {runtime})"
    if source == "head":
        return revision
    return revision + (" + uncommitted runtime changes" if dirty else "")


def _save(results: dict[str, Any], out: Path) -> None:
    # Written after every measurement, so an interrupted run still leaves its raw data.
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(results, indent=1, sort_keys=False) + "\n")
    tmp.replace(out / "results.json")
