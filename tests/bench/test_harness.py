"""The benchmark harness's pure parts: process-tree sampling, what a system skips, the report.

The harness itself runs end to end in `python -m bench --quick --no-peers` (scripts/test);
these pin the pieces that decide what a figure means.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import asyncpg
import pytest
from bench.harness import clock_warning, read_proc

from bench import report, systems
from venturi import PostgresStore, Queue

_PARENT = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.fixture
def parent_with_child() -> Iterator[tuple[int, int]]:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        yield parent.pid, child
    finally:
        for pid in (child, parent.pid):
            subprocess.run(["kill", "-9", str(pid)], check=False)
        parent.wait()
        parent.stdout.close()


def test_read_proc_sums_a_worker_and_its_pool(parent_with_child: tuple[int, int]) -> None:
    parent, child = parent_with_child
    whole, alone = read_proc(parent), read_proc(child)
    assert whole.processes == 2
    assert alone.processes == 1
    # The tree's peak includes the child's own (a pool's memory is not hidden).
    assert whole.rss_peak_bytes > alone.rss_peak_bytes
    assert whole.cpu_seconds >= alone.cpu_seconds


def test_not_applicable_names_the_reason() -> None:
    assert systems.not_applicable("river", "enqueue_bulk100")
    assert systems.not_applicable("river", "drain_c1") is None
    assert systems.not_applicable("river-1ms", "enqueue_bulk100") is None
    assert systems.not_applicable("pgqueuer-defaults", "drain_c1") is None
    assert systems.not_applicable("pgqueuer-defaults", "pickup") is not None


def _raw(records: list[dict[str, Any]], scenarios: list[str]) -> dict[str, Any]:
    return {
        "meta": {
            "command": "python -m bench",
            "mode": "full",
            "started": "2026-01-01T00:00:00+00:00",
            "duration_s": 60.0,
            "plan": {
                "reps": 1,
                "n": 100,
                "backlog_big": 1000,
                "backlog_kinds": 20,
                "ceiling_clients": [1],
                "ceiling_batches": [100],
                "ceiling_seconds": 1.0,
            },
            "systems": ["venturi", "celery", "river"],
            "scenarios": scenarios,
            "machine": {"cores": 2, "cpu": "x", "memory_gib": 1.0, "os": "linux"},
        },
        "records": records,
        "ceiling": [],
        "unavailable": {},
    }


def _record(system: str, scenario: str, **fields: Any) -> dict[str, Any]:
    return {"system": system, "scenario": scenario, "rep": 0, "metrics": {}, **fields}


def test_report_shows_a_dash_and_the_reason_for_what_does_not_apply() -> None:
    raw = _raw(
        [
            _record("venturi", "enqueue_bulk100", metrics={"rate": 50_000.0}),
            _record("celery", "enqueue_bulk100", skipped={"rate": "no batch enqueue"}),
            _record("river", "enqueue_bulk100", skipped={"*": "measured as river-1ms"}),
        ],
        ["enqueue_bulk100"],
    )
    text = report.render(raw)
    assert "| celery | — |" in text
    assert "- celery: `rate` skipped: no batch enqueue" in text
    assert "- river: not run: measured as river-1ms" in text
    # With no peer figure, venturi is not declared ahead of anyone.
    assert "| Bulk enqueue (100) ≥ 1.5x the best peer | n/a | not measured |" in text


def test_report_names_a_capped_drain_and_the_scenarios_venturi_trails() -> None:
    drain = {"rate": 100.0, "wait_p50_ms": 1.0, "wait_p90_ms": 1.0, "wait_p99_ms": 1.0}
    raw = _raw(
        [
            _record("venturi", "drain_c1", metrics=drain),
            _record(
                "river",
                "drain_c1",
                metrics={**drain, "rate": 200.0},
                info={"capped": "stopped after 120 s"},
            ),
        ],
        ["drain_c1"],
    )
    text = report.render(raw)
    assert "- river: rep 1: stopped after 120 s" in text
    assert "| Drain c=1 ≥ 1.5x the best peer | 0.50x river | **missed** |" in text
    ahead = next(line for line in text.splitlines() if "Every scenario ahead" in line)
    assert "drain_c1 jobs/s (river)" in ahead
    assert "**missed**" in ahead


def test_a_job_started_before_it_was_enqueued_is_reported_as_a_clock_defect() -> None:
    assert clock_warning([10.0, 20.0], [10.002, 20.001]) is None
    warning = clock_warning([10.0, 20.0, 30.0], [10.002, 19.9995, 29.999])
    assert warning == (
        "2 of 3 waits negative (down to -1.00 ms): the producer's and the worker's clocks disagree"
    )
    pickup = {"wait_p50_ms": 1.0, "wait_p90_ms": 1.0, "wait_p99_ms": 1.0}
    raw = _raw(
        [
            _record("venturi", "pickup", metrics=pickup),
            {**_record("river", "pickup", metrics=pickup), "info": {"warning": warning}},
        ],
        ["pickup"],
    )
    assert f"- river: rep 1: warning: {warning}" in report.render(raw)


_CLOCK_RUN = """
import {{ wallClock }} from {clock};
// A simulated machine: every clock read takes 10 us; `wall` is the true wall time (ms),
// `mono` a monotonic clock with its own origin that a wall-clock step does not move.
let wall = 1_000_000.0, mono = 5.0;
const tick = () => {{ wall += 0.01; mono += 0.01; }};
const now = wallClock({{ wall: () => (tick(), Math.floor(wall)), mono: () => (tick(), mono) }});
const error = () => {{ const t = now() * 1000; return t - wall; }};
const errors = {{ start: error() }};
wall += 250; mono += 250;
errors.steady = error();
wall += 3;  // the wall clock steps ahead of the monotonic one
errors.ahead = [error(), error()];
wall -= 7;  // and back behind it
errors.behind = [error(), error()];
console.log(JSON.stringify(errors));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="the graphile-worker adapter runs on node")
def test_the_graphile_adapter_s_clock_reads_the_wall_clock_even_when_it_steps() -> None:
    clock = json.dumps((Path(__file__).parents[2] / "bench/graphile/clock.mjs").as_uri())
    run = subprocess.run(
        ["node", "--input-type=module", "-e", _CLOCK_RUN.format(clock=clock)],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    errors = json.loads(run.stdout)
    # Calibrated at a millisecond edge, it reads the wall clock to within a few clock reads.
    assert abs(errors["start"]) < 0.05
    assert abs(errors["steady"]) < 0.05
    # A monotonic clock carried forward would read 3 ms behind, then 4 ms ahead; it follows
    # the wall clock to within the millisecond that Date.now() gives.
    for error in errors["ahead"] + errors["behind"]:
        assert abs(error) <= 1.0


def test_report_tells_a_scenario_not_run_from_one_that_gave_no_figure() -> None:
    raw = _raw(
        [
            _record("venturi", "pickup", metrics={"wait_p99_ms": 4.0}),
            _record("river", "pickup", skipped={"*": "fell behind"}, info={"jobs": 10}),
            _record("celery", "pickup", skipped={"*": "does not apply"}, info={}),
        ],
        ["pickup"],
    )
    text = report.render(raw)
    assert "- river: rep 1: fell behind" in text
    assert "- celery: not run: does not apply" in text
    assert "| river | — | — | — |" in text


def test_report_reads_single_enqueues_against_the_single_row_ceiling() -> None:
    raw = _raw(
        [
            _record("venturi", "enqueue_sequential", metrics={"rate": 2_000.0}),
            _record("river", "enqueue_sequential", metrics={"rate": 1_000.0}),
        ],
        ["enqueue_sequential", "ceiling_single"],
    )
    raw["ceiling_single"] = [{"rep": 0, "jobs_per_s": 4_000.0}]
    text = report.render(raw)
    assert "| **single-row ceiling (pgbench)** | 4,000 |" in text
    assert "| **of the single-row ceiling** | venturi 50%, river 25% |" in text


def test_report_leaves_the_single_row_ceiling_out_when_not_run() -> None:
    raw = _raw(
        [_record("venturi", "enqueue_sequential", metrics={"rate": 2_000.0})],
        ["enqueue_sequential"],
    )
    assert "ceiling_single" not in raw  # a results.json from before it existed
    assert "single-row ceiling (pgbench)" not in report.render(raw)


def test_venturi_on_uvloop_is_shown_but_is_not_a_peer() -> None:
    raw = _raw(
        [
            _record("venturi", "enqueue_sequential", metrics={"rate": 2_000.0}),
            _record("venturi-uvloop", "enqueue_sequential", metrics={"rate": 2_400.0}),
            _record("river", "enqueue_sequential", metrics={"rate": 1_000.0}),
        ],
        ["enqueue_sequential"],
    )
    raw["meta"]["systems"].append("venturi-uvloop")
    text = report.render(raw)
    assert "| venturi-uvloop | 2,400 |" in text
    assert "| **venturi / best peer** | 2.00x (river) |" in text


def test_a_base_commit_is_read_against_venturi_and_is_not_a_peer() -> None:
    raw = _raw(
        [
            _record("venturi", "enqueue_sequential", metrics={"rate": 2_000.0}),
            _record("venturi-base", "enqueue_sequential", metrics={"rate": 2_500.0}),
            _record("river", "enqueue_sequential", metrics={"rate": 1_000.0}),
        ],
        ["enqueue_sequential"],
    )
    raw["meta"]["systems"].insert(1, "venturi-base")
    raw["meta"]["venturi_base"] = "abc1234 (2026-11-30) Before"
    text = report.render(raw)
    assert "| venturi-base | 2,500 |" in text
    assert "| **venturi / best peer** | 2.00x (river) |" in text
    assert "| **venturi / venturi-base** | 0.80x |" in text
    assert "built from commit abc1234 (2026-11-30) Before" in text
    assert "- venturi-base commit: abc1234 (2026-11-30) Before" in text


def test_a_base_commit_is_resolved_or_refused_by_name() -> None:
    from bench import run

    head = run.resolve_commit("HEAD")
    assert len(head) == 40 and run.describe_commit(head).startswith(head[:7])
    with pytest.raises(SystemExit, match="--venturi-base 'no-such-ref': no such commit"):
        run.resolve_commit("no-such-ref")


def test_venturi_is_built_from_the_commit_asked_for(tmp_path: Path) -> None:
    """A base commit's sources are that commit's files, not a later one's or the tree's."""
    from bench import venvs

    repo = tmp_path / "repo"
    (repo / "runtime" / "venturi").mkdir(parents=True)

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    git("init", "-q")
    (repo / "pyproject.toml").write_text("[project]\n")
    module = repo / "runtime" / "venturi" / "worker.py"
    module.write_text("BEFORE = True\n")
    git("add", "-A")
    git("commit", "-qm", "before")
    before = git("rev-parse", "HEAD")
    module.write_text("AFTER = True\n")
    git("commit", "-qam", "after")
    module.write_text("EDITING = True\n")  # the working tree, uncommitted

    for out in ("out-before", "out-head"):
        (tmp_path / out).mkdir()
    src = venvs._venturi_sources(repo, tmp_path / "out-before", f"commit:{before}")
    assert (src / "runtime" / "venturi" / "worker.py").read_text() == "BEFORE = True\n"
    assert (src / "pyproject.toml").exists()
    src = venvs._venturi_sources(repo, tmp_path / "out-head", "head")
    assert (src / "runtime" / "venturi" / "worker.py").read_text() == "AFTER = True\n"


async def test_the_runner_benchmark_hands_every_job_off() -> None:
    """`python -m bench.runner` times the worker's own path per job: a pass that lost a job
    (a run that never ended, a settlement that never came) would time less than the work."""
    from bench.runner import cpu_per_job

    assert await cpu_per_job(1_200, 4) > 0  # raises if a job was not handed off


async def test_the_stats_bench_gives_each_pending_job_its_own_run_at(
    store: PostgresStore,
) -> None:
    """`python -m bench.stats`'s last shape: the backlog's clones share a run_at per queue and
    kind (the index stores it once); the shape gives each job its own, as single enqueues do,
    and stats() still reads every queue and kind's oldest age."""
    from bench.stats import KINDS, QUEUES, _preload, _run_at_per_job

    prefix = store.prefix
    async with store._pool_or_raise().acquire() as pooled:
        conn = cast(asyncpg.Connection, pooled)  # the proxy passes every call through
        await _preload(store, conn, 400)
        distinct = f"SELECT count(DISTINCT run_at) FROM {prefix}_jobs WHERE status = 'pending'"
        assert await conn.fetchval(distinct) == KINDS * QUEUES  # one per batch (statement)
        await _run_at_per_job(store, conn)
        assert await conn.fetchval(distinct) == 400
    stats = await Queue(store).stats()
    assert stats.pending == 400
    assert sum(len(q.oldest_pending_age_by_kind) for q in stats.queues.values()) == KINDS * QUEUES


def test_the_floor_bench_reads_every_stage_of_a_pickup() -> None:
    """`python -m bench.floor` on its own server: the paced floor, and the pickup with the
    server's time for each of its statements, found in the server's log by how they begin
    (a statement that changed its opening would drop out of the report)."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-m", "bench.floor", "--n", "30"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    labels = {" ".join(line.split("p50")[0].split()) for line in out.splitlines() if "p99" in line}
    assert labels == {
        "SELECT 1 back to back",
        "SELECT 1 every 20 ms",
        "one-row INSERT back to back",
        "one-row INSERT every 20 ms",
        "pickup",
        "enqueue call (producer)",
        "server: enqueue (INSERT)",
        "server: claim",
        "server: settlement",
    }, out
