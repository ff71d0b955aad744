"""The operator's costs, measured on a real control plane and a real PostgreSQL:

1. Wake from zero: a pool at 0 replicas with a one-hour reconcile interval; one job is
   enqueued; how long until the Deployment's spec.replicas is 1 (the LISTEN/NOTIFY path; KEDA
   would wait its polling interval, 30 s by default).
2. Cost per tick with 50 JobQueues on one database: stats queries per JobQueue per tick
   (counted by pg_stat_statements, not by the operator itself), reconcile duration per
   JobQueue (from the operator's own histogram), and the operator process's peak RSS.

Uses $KUBECONFIG when set; otherwise brings up the local control plane from e2e/ in its own
run dir and tears it down at the end. The operator runs as a separate process
(`venturi-operator`), so its RSS is its own. Results: bench/operator/RESULTS.md and .json.

    python -m bench.operator [--jobqueues 50] [--ticks 10]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from venturi import PostgresStore, Queue, Task
from venturi.embedded import EmbeddedPostgres, free_port

ROOT = Path(__file__).resolve().parents[2]
NS = "opbench"
HERE = Path(__file__).resolve().parent


@dataclass
class Wake(Task):
    KIND = "wake"


@contextmanager
def cluster() -> Iterator[dict[str, str]]:
    """A kubeconfig env: the caller's, or a local control plane for the duration."""
    if os.environ.get("KUBECONFIG"):
        yield dict(os.environ)
        return
    run_dir = tempfile.mkdtemp(prefix="venturi-opbench-run-")
    os.rmdir(run_dir)  # cluster.sh creates it (with its marker)
    env = {**os.environ, "VENTURI_E2E_RUN": run_dir}
    try:
        subprocess.run([str(ROOT / "e2e/cluster.sh"), "up"], env=env, check=True)
        # Let the shell evaluate the exports (they extend $PATH).
        out = subprocess.run(
            ["bash", "-c", f'eval "$({ROOT / "e2e/cluster.sh"} env)" && env -0'],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        env = dict(item.split("=", 1) for item in out.split("\0") if "=" in item)
        yield env
    finally:
        subprocess.run([str(ROOT / "e2e/cluster.sh"), "down"], env=env, check=False)


def kubectl(env: dict[str, str], *args: str, stdin: str | None = None) -> str:
    return subprocess.run(
        ["kubectl", *args], env=env, input=stdin, capture_output=True, text=True, check=True
    ).stdout


def apply(env: dict[str, str], objects: list[dict[str, Any]]) -> None:
    kubectl(
        env,
        "apply",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}),
    )


def deployment(name: str, replicas: int, jobqueue: str) -> dict[str, Any]:
    """A Deployment opted in to being scaled by the JobQueue `jobqueue`."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": NS,
            "annotations": {"venturi.dev/jobqueue": jobqueue},
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "w", "image": "venturi:bench"}]},
            },
        },
    }


def jobqueue(name: str, prefix: str, deployment_name: str, interval: int) -> dict[str, Any]:
    return {
        "apiVersion": "venturi.dev/v1alpha1",
        "kind": "JobQueue",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "database": {"secretName": "db", "prefix": prefix},
            "interval": interval,
            "pools": [
                {
                    "deployment": deployment_name,
                    "kinds": ["wake"],
                    "maxReplicas": 3,
                    "targetPerReplica": 10,
                    "cooldownSeconds": 0,
                    # back to zero at once between wake rounds (the HPA default waits 5 min)
                    "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}},
                }
            ],
        },
    }


def replicas(env: dict[str, str], name: str) -> int:
    return int(
        kubectl(env, "-n", NS, "get", "deployment", name, "-o", "jsonpath={.spec.replicas}") or 0
    )


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):  # peak resident set size
            return int(line.split()[1]) / 1024
    return 0.0


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text: str = r.read().decode()
        return text


def reconcile_seconds(text: str) -> tuple[float, float]:
    """(sum, count) of venturi_reconcile_duration_seconds over all JobQueues."""
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith("venturi_reconcile_duration_seconds_sum{"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith("venturi_reconcile_duration_seconds_count{"):
            count += float(line.rsplit(" ", 1)[1])
    return total, count


async def measure(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    settings = {
        "shared_preload_libraries": "pg_stat_statements",
        "fsync": "on",
        "synchronous_commit": "on",
    }
    async with EmbeddedPostgres(settings=settings) as pg:
        admin = await PostgresStore.connect(pg.dsn, prefix="opb")
        pool = admin._pool  # the benchmark reads pg_stat_statements directly
        await pool.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await admin.migrate()
        kubectl(env, "create", "namespace", NS)
        dsn = base64.b64encode(pg.dsn.encode()).decode()
        apply(
            env,
            [
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": "db", "namespace": NS},
                    "data": {"dsn": dsn},
                }
            ],
        )
        kubectl(env, "apply", "-f", str(ROOT / "crds/venturi.dev_jobqueues.yaml"))
        kubectl(env, "wait", "--for=condition=Established", "crd/jobqueues.venturi.dev")
        metrics_port = free_port()
        operator = start_operator(env, metrics_port)
        try:
            return await _scenarios(args, env, pg.dsn, pool, admin, operator, metrics_port)
        finally:
            operator.send_signal(signal.SIGTERM)
            try:
                operator.wait(timeout=30)
            except subprocess.TimeoutExpired:
                operator.kill()
                operator.wait()
            await admin.close()


async def _scenarios(
    args: argparse.Namespace,
    env: dict[str, str],
    dsn: str,
    pool: Any,
    admin: PostgresStore,
    operator: subprocess.Popen[str],
    metrics_port: int,
) -> dict[str, Any]:
    # 1. Wake from zero, several times: one-hour interval, so only NOTIFY can be this fast.
    apply(env, [deployment("wake", 0, "wake"), jobqueue("wake", "opb", "wake", 3600)])
    await _until(lambda: _status_ready(env, "wake"), 60)
    queue = Queue(admin)
    wakes = []
    for _ in range(args.wakes):
        began = time.perf_counter()
        job = await queue.enqueue(Wake())
        await _until(lambda: replicas(env, "wake") >= 1, 60, every=0.02)
        wakes.append(time.perf_counter() - began)
        await pool.execute("DELETE FROM opb_jobs WHERE id = $1", job.to_uuid())
        # back to zero (cooldown 0) before the next round: one reconcile nudged by a spec touch
        kubectl(
            env,
            "-n",
            NS,
            "patch",
            "jobqueue",
            "wake",
            "--type=merge",
            "-p",
            json.dumps({"spec": {"interval": 3600 - len(wakes) % 2}}),
        )
        await _until(lambda: replicas(env, "wake") == 0, 600)

    # 2. 50 JobQueues on one database, each its own prefix, ticking every `interval` s.
    prefixes = [f"jq{i:02d}" for i in range(args.jobqueues)]
    for p in prefixes:
        await admin.with_prefix(p).migrate()
    apply(env, [deployment(f"d{i:02d}", 0, f"q{i:02d}") for i in range(args.jobqueues)])
    apply(
        env, [jobqueue(f"q{i:02d}", p, f"d{i:02d}", args.interval) for i, p in enumerate(prefixes)]
    )
    await _until(lambda: all(_status_ready(env, f"q{i:02d}") for i in range(args.jobqueues)), 300)
    await pool.execute("SELECT pg_stat_statements_reset()")
    before = reconcile_seconds(scrape(metrics_port))
    window = args.ticks * args.interval
    await asyncio.sleep(window)  # the measurement window itself, not a synchronization
    after = reconcile_seconds(scrape(metrics_port))
    calls = await pool.fetchval(  # numeric: sum() of bigint
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements "
        "WHERE query LIKE '%_counts%' AND query LIKE '%totals%'"
    )
    calls = int(calls)
    ticks = after[1] - before[1]
    return {
        "wake_from_zero_s": wakes,
        "wake_from_zero_median_s": statistics.median(wakes),
        "jobqueues": args.jobqueues,
        "interval_s": args.interval,
        "window_s": window,
        "ticks_observed": ticks,
        "stats_queries": int(calls),
        "stats_queries_per_tick": (calls / ticks) if ticks else None,
        "reconcile_ms_per_jobqueue_tick": (
            1000 * (after[0] - before[0]) / ticks if ticks else None
        ),
        "operator_peak_rss_mb": rss_mb(operator.pid),
    }


def _status_ready(env: dict[str, str], name: str) -> bool:
    out = kubectl(
        env,
        "-n",
        NS,
        "get",
        "jobqueue",
        name,
        "-o",
        'jsonpath={.status.conditions[?(@.type=="Ready")].status}',
    )
    return out == "True"


async def _until(check: Any, limit: float, every: float = 0.2) -> None:
    """Poll the API server: it is the event source here, and kubectl has nothing to await."""
    deadline = time.monotonic() + limit
    while True:
        if await asyncio.to_thread(check):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {limit}s")
        await asyncio.sleep(every)


def start_operator(env: dict[str, str], metrics_port: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            "venturi-operator",
            "--namespace",
            NS,
            "--metrics-port",
            str(metrics_port),
            "--metrics-host",
            "127.0.0.1",
            "--liveness",
            "",
            "--log-level",
            "warning",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def report(result: dict[str, Any]) -> str:
    rows = [
        (
            "Wake from zero (enqueue -> Deployment at 1), median of "
            f"{len(result['wake_from_zero_s'])}",
            f"{result['wake_from_zero_median_s']:.2f} s",
            "under 2 s",
        ),
        ("Stats queries per JobQueue per tick", f"{result['stats_queries_per_tick']:.2f}", "1"),
        (
            "Reconcile time per JobQueue per tick",
            f"{result['reconcile_ms_per_jobqueue_tick']:.1f} ms",
            "-",
        ),
        (
            f"Operator peak RSS with {result['jobqueues']} JobQueues",
            f"{result['operator_peak_rss_mb']:.0f} MB",
            "under 150 MB",
        ),
    ]
    lines = [
        "# Operator benchmark",
        "",
        "`python -m bench.operator` on a real kube-apiserver (e2e/ control plane) and a real "
        "PostgreSQL; the operator runs as its own process.",
        "",
        "| measure | result | target |",
        "|---|---|---|",
    ]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    lines += [
        "",
        f"Wake-from-zero samples (s): {', '.join(f'{w:.2f}' for w in result['wake_from_zero_s'])}",
        f"Window: {result['window_s']} s at interval {result['interval_s']} s, "
        f"{result['ticks_observed']:.0f} JobQueue ticks observed, "
        f"{result['stats_queries']} stats queries counted by pg_stat_statements.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.operator")
    parser.add_argument("--jobqueues", type=int, default=50)
    parser.add_argument("--interval", type=int, default=2)
    parser.add_argument("--ticks", type=int, default=10)
    parser.add_argument("--wakes", type=int, default=5)
    args = parser.parse_args(argv)
    with cluster() as env:
        result = asyncio.run(measure(args, env))
    (HERE / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (HERE / "RESULTS.md").write_text(report(result))
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
