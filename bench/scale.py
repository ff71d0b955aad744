"""``python -m bench.scale``: venturi at scale, on a private server (issue 18's "scale").

Three sections, each on its own table prefix of one embedded PostgreSQL (fsync and
synchronous_commit on, the main bench's settings):

* **processes**: a backlog of ``--n`` jobs over 20 kinds drained by 1, 2 and 4 worker
  processes at ``--concurrency`` each, repetitions interleaved (1, 2, 4, then 4, 2, 1, ...).
* **finished**: the jobs table holding ``--finished`` completed jobs and their journal rows
  (finished 8 days ago, vacuumed and analysed as autovacuum leaves a table), then ``--n``
  pending ones drained by one worker process, and ``stats()`` timed; the same while the
  retention cleaner (``Retention(completed=7 days)``, on a worker of its own that leads)
  deletes the finished jobs, with the cleaner's rate; and once it has deleted them all.
* **pending**: ``--pending`` jobs over 5 queues and 20 kinds; ``stats()`` timed, then ``--n``
  of them drained by one worker process serving the five queues in order.

A drain: the queues paused, the workers started and registered (``Queue.workers()``), the
queues resumed; jobs/s is ``--n`` over the time from the resume to the moment the counters show
no pending or claimed job. Worker CPU is the processes' user+system time over that window.
Each stage also records the claim's generic plan (``auto_explain``, a claim of no job): it
must be a range scan of the claim index, never a sequential scan of the jobs table (the test
of the same shape: ``tests/runtime/test_plans.py``).

Full run: ``--n 20000 --finished 10000000 --pending 1000000`` (about 15-20 minutes on 2 cores);
``--quick``: tiny sizes, one repetition, for CI (it asserts nothing about speed). The full run
writes ``bench/SCALE.md`` (``--out`` elsewhere); the quick one prints only.

The worker processes are this module's ``worker`` role (``python -m bench.scale worker``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import os
import signal
import statistics
import sys
import time
import warnings
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg

from bench.harness import read_proc
from bench.stats import time_stats
from venturi import Context, PostgresStore, Queue, Retention, Task, Worker
from venturi._records import Settlement
from venturi.embedded import EmbeddedPostgres

KINDS, QUEUES = 20, 5
TASKS = [
    dataclasses.make_dataclass(
        f"Noop{i}", [("n", int)], bases=(Task,), namespace={"KIND": f"noop{i}"}
    )
    for i in range(KINDS)
]
SETTINGS = {
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "shared_buffers": "1GB",
    "max_wal_size": "8GB",
    "checkpoint_timeout": "30min",
    "jit": "off",
}
RETENTION_DAYS = 7
FINISHED_AGO = datetime.timedelta(days=RETENTION_DAYS + 1)
CHUNK = 1_000_000
"""Finished jobs written per statement (each with its journal rows)."""
PROCESS_DRAIN_FACTOR = 3
"""The process drains take this many times N jobs each (4 processes drain N in about a second)."""
READY_TIMEOUT_S = 60.0
DRAIN_TIMEOUT_S = 600.0
ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Drain:
    jobs_s: float
    cpu_s_per_10k: float


@dataclasses.dataclass(frozen=True)
class Stage:
    label: str
    drains: list[Drain]
    stats_ms: float
    finished_left: int | None = None
    """Finished jobs still in the table after the stage's drains (the big-table stages)."""


@dataclasses.dataclass
class Results:
    sizes: dict[str, int]
    processes: dict[int, list[Drain]] = dataclasses.field(default_factory=dict)
    stages: list[Stage] = dataclasses.field(default_factory=list)
    cleaner: tuple[int, float] | None = None
    """(finished jobs the retention cleaner deleted, seconds it took)."""
    plans: list[tuple[str, bool, str]] = dataclasses.field(default_factory=list)
    """(stage, the claim an index scan of the claim index, the plan's scan lines)."""


# -- the worker role ------------------------------------------------------------------------


async def _noop(task: Any, ctx: Context[Any], app: None) -> None:
    return None


async def _work(dsn: str, prefix: str, concurrency: int, queues: list[str], clean: bool) -> None:
    store = await PostgresStore.connect(dsn, prefix=prefix)
    retention = (
        Retention(completed=datetime.timedelta(days=RETENTION_DAYS), interval=3600)
        if clean
        else None
    )
    worker = Worker(None, store, concurrency=concurrency, queues=queues, retention=retention)
    for task in TASKS:
        worker.register(task, _noop)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        await worker.run(stop)
    finally:
        await store.close()


# -- the orchestrator -----------------------------------------------------------------------


@asynccontextmanager
async def _workers(
    dsn: str, prefix: str, count: int, concurrency: int, queues: list[str], *, clean: bool = False
) -> AsyncIterator[list[asyncio.subprocess.Process]]:
    """`count` worker processes, stopped (SIGTERM, then SIGKILL) on the way out."""
    role = ["worker", dsn, prefix, str(concurrency), ",".join(queues)]
    procs: list[asyncio.subprocess.Process] = []
    try:
        for _ in range(count):
            procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "bench.scale",
                    *role,
                    *(["--clean"] if clean else []),
                    cwd=ROOT,
                )
            )
        yield procs
    finally:
        for p in procs:
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                async with asyncio.timeout(30):
                    await p.wait()
            except TimeoutError:
                p.kill()
                await p.wait()


async def _registered(
    queue: Queue, count: int, procs: Sequence[asyncio.subprocess.Process]
) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while len([w for w in await queue.workers() if w.live]) < count:
        if any(p.returncode is not None for p in procs):
            raise RuntimeError("a worker process exited before it registered")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count} workers did not register within {READY_TIMEOUT_S} s")
        await asyncio.sleep(0.05)


async def _outstanding(conn: asyncpg.Connection, prefix: str) -> int:
    # The counters, not the table: an exact count that stays cheap beside millions of rows.
    return int(
        await conn.fetchval(
            f"SELECT coalesce(sum(n), 0) FROM {prefix}_counts "
            "WHERE status IN ('pending', 'claimed')"
        )
    )


def _cpu(procs: Sequence[asyncio.subprocess.Process]) -> float:
    return sum(read_proc(p.pid).cpu_seconds for p in procs)


async def _drain(
    dsn: str,
    conn: asyncpg.Connection,
    store: PostgresStore,
    count: int,
    concurrency: int,
    queues: list[str],
    n: int | None = None,
) -> Drain:
    """Drain what is pending in `queues` with `count` processes (see the module's doc), or
    time the first `n` jobs of it."""
    queue = Queue(store)
    start = await _outstanding(conn, store.prefix)
    n = start if n is None else min(n, start)
    for name in queues:
        await queue.pause(name)
    async with _workers(dsn, store.prefix, count, concurrency, queues) as procs:
        await _registered(queue, count, procs)
        cpu0 = _cpu(procs)
        began = time.perf_counter()
        for name in queues:
            await queue.resume(name)
        while await _outstanding(conn, store.prefix) > start - n:
            if time.perf_counter() - began > DRAIN_TIMEOUT_S:
                raise TimeoutError(f"the drain of {n:,} jobs took over {DRAIN_TIMEOUT_S} s")
            await asyncio.sleep(0.005)
        took = time.perf_counter() - began
        cpu = _cpu(procs) - cpu0
    return Drain(jobs_s=n / took, cpu_s_per_10k=cpu / n * 10_000)


async def _enqueue(store: PostgresStore, n: int, queues: list[str]) -> None:
    """`n` pending jobs, spread over the kinds and `queues`, through the API in batches."""
    per = -(-n // len(queues))
    for name in queues:
        queue = Queue(store, queue=name)
        for start in range(0, per, 1000):
            size = min(1000, per - start)
            await queue.enqueue_many(TASKS[(start + i) % KINDS](n=i) for i in range(size))


async def _clone(conn: asyncpg.Connection, prefix: str, total: int, *, finished: bool) -> None:
    """`total` more jobs cloned from the table's pending ones (an API-written template):
    pending as they are, or completed `FINISHED_AGO` (with a journal row each)."""
    columns = [
        r["attname"]
        for r in await conn.fetch(
            "SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum",
            f"{prefix}_jobs",
        )
    ]
    made = {
        "id": "gen_random_uuid()",
        **(
            {
                "status": "'completed'",
                "run_count": "1",
                "claimed_at": "now() - $1::interval",
                "claimed_by": "'bench'",
                "finished_at": "now() - $1::interval",
            }
            if finished
            else {}
        ),
    }
    sources = ", ".join(made.get(c, f"t.{c}") for c in columns)
    template = int(
        await conn.fetchval(f"SELECT count(*) FROM {prefix}_jobs WHERE status = 'pending'")
    )
    done = 0
    while done < total:
        size = min(CHUNK, total - done)
        insert = (
            f"INSERT INTO {prefix}_jobs ({', '.join(columns)}) SELECT {sources} "
            f"FROM (SELECT * FROM {prefix}_jobs WHERE status = 'pending' ORDER BY id LIMIT "
            f"{template}) AS t CROSS JOIN generate_series(1, {-(-size // template)}) AS g "
            f"ORDER BY g, t.id LIMIT {size}"
        )
        if finished:
            await conn.execute(
                f"WITH j AS ({insert} RETURNING id, finished_at) "
                f"INSERT INTO {prefix}_journal (job_id, run, outcome, at, duration_s, worker) "
                "SELECT id, 1, 'completed', finished_at, 0.001, 'bench' FROM j",
                FINISHED_AGO,
            )
        else:
            await conn.execute(insert)
        done += size
        print(
            f"  {done:,} of {total:,} {'finished' if finished else 'pending'} jobs written",
            flush=True,
        )


async def _settle_table(conn: asyncpg.Connection) -> None:
    await conn.execute("VACUUM ANALYZE")
    await conn.execute("CHECKPOINT")


async def _plan(dsn: str, prefix: str, queues: list[str]) -> tuple[bool, str]:
    """The claim's generic plan, logged by auto_explain for a claim of one job (handed back
    unrun: the claim function runs its statement only for a queue it has room for)."""
    plans: list[str] = []

    async def setup(conn: asyncpg.Connection) -> None:
        conn.add_log_listener(
            lambda _c, m: plans.append(m.message) if "plan:" in m.message else None
        )

    explaining = (
        f"{dsn}{'&' if '?' in dsn else '?'}plan_cache_mode=force_generic_plan"
        "&session_preload_libraries=auto_explain&auto_explain.log_min_duration=0"
        "&auto_explain.log_nested_statements=on&auto_explain.log_level=notice"
    )
    with warnings.catch_warnings():  # asyncpg: "released to the pool with a log listener"
        warnings.simplefilter("ignore", asyncpg.InterfaceWarning)
        store = await PostgresStore.connect(explaining, prefix=prefix, setup=setup, max_size=1)
        try:
            claimed = await store.claim(
                queues=queues,
                kinds=None,
                limit=1,
                worker="bench-explain",
                pod=None,
                default_lease_s=60.0,
            )
            inner = [p.split("plan:", 1)[1] for p in plans if "FOR UPDATE SKIP LOCKED" in p]
            await store.settle([Settlement.of(j, "returned") for j in claimed], worker="bench")
        finally:
            await store.close()
    scans = sorted(
        {
            line.strip().lstrip("-> ").split("  ")[0]
            for p in inner
            for line in p.splitlines()
            if "Scan" in line and f"{prefix}_jobs" in line
        }
    )
    ok = bool(inner) and all(
        f"Seq Scan on {prefix}_jobs" not in p and f"{prefix}_jobs_claim_idx" in p for p in inner
    )
    return ok, "; ".join(scans)


async def _processes(
    dsn: str,
    conn: asyncpg.Connection,
    results: Results,
    n: int,
    concurrency: int,
    counts: list[int],
    reps: int,
) -> None:
    async with await PostgresStore.connect(dsn, prefix="bsproc") as store:
        await store.migrate()
        for rep in range(reps):
            for count in counts if rep % 2 == 0 else counts[::-1]:
                await _enqueue(store, PROCESS_DRAIN_FACTOR * n, ["default"])
                await conn.execute("ANALYZE bsproc_jobs")
                drain = await _drain(dsn, conn, store, count, concurrency, ["default"])
                results.processes.setdefault(count, []).append(drain)
                print(f"  {count} process(es): {drain.jobs_s:,.0f} jobs/s", flush=True)
        results.plans.append(("processes", *await _plan(dsn, "bsproc", ["default"])))


async def _finished(
    dsn: str,
    conn: asyncpg.Connection,
    results: Results,
    n: int,
    concurrency: int,
    finished: int,
    calls: int,
    reps: int,
) -> None:
    prefix = "bsfin"
    drained = 0  # completed by the drains: recent, so the cleaner keeps them

    async def old() -> int:
        return await _finished_left(conn, prefix) - drained

    async with await PostgresStore.connect(dsn, prefix=prefix) as store:
        await store.migrate()
        await _enqueue(store, KINDS * QUEUES, [f"q{i}" for i in range(QUEUES)])
        began = time.perf_counter()
        await _clone(conn, prefix, finished, finished=True)
        await conn.execute(f"DELETE FROM {prefix}_jobs WHERE status = 'pending'")
        await _settle_table(conn)
        print(f"  written in {time.perf_counter() - began:.0f} s", flush=True)

        async def stage(label: str) -> None:
            nonlocal drained
            drains = []
            stats = 0.0
            for rep in range(reps):
                await _enqueue(store, n, ["default"])
                await conn.execute(f"ANALYZE {prefix}_jobs")
                if rep == 0:
                    results.plans.append((label, *await _plan(dsn, prefix, ["default"])))
                    stats = await time_stats(Queue(store), calls)
                drains.append(await _drain(dsn, conn, store, 1, concurrency, ["default"]))
                drained += n
                print(f"  {label}: {drains[-1].jobs_s:,.0f} jobs/s", flush=True)
            results.stages.append(Stage(label, drains, stats, await old()))

        await stage(f"{finished:,} finished")
        # The cleaner on a worker of its own, the leader (the first worker up, alone).
        async with _workers(dsn, prefix, 1, 1, ["maintenance"], clean=True):
            start = await old()
            t0 = time.perf_counter()
            while await old() == start:
                if time.perf_counter() - t0 > READY_TIMEOUT_S:
                    raise TimeoutError("the retention cleaner did not start")
                await asyncio.sleep(0.05)
            await stage(f"{finished:,} finished, the cleaner deleting them")
            if results.stages[-1].finished_left == 0:
                print("  (the cleaner ended before the drains did: a lower bound of its cost)")
            while (left := await old()) > 0:
                if time.perf_counter() - t0 > DRAIN_TIMEOUT_S * 4:
                    raise TimeoutError(f"the cleaner left {left:,} jobs")
                await asyncio.sleep(0.5)
            took = time.perf_counter() - t0
        results.cleaner = (start, took)
        print(f"  the cleaner: {start:,} in {took:.0f} s ({start / took:,.0f}/s)", flush=True)
        await _settle_table(conn)
        await stage("after the cleaner (vacuumed)")


async def _finished_left(conn: asyncpg.Connection, prefix: str) -> int:
    """Completed jobs in the table, from the counters."""
    return int(
        await conn.fetchval(
            f"SELECT coalesce(sum(n), 0) FROM {prefix}_counts WHERE status = 'completed'"
        )
    )


async def _pending(
    dsn: str,
    conn: asyncpg.Connection,
    results: Results,
    n: int,
    concurrency: int,
    pending: int,
    calls: int,
    reps: int,
) -> None:
    prefix = "bspen"
    queues = [f"q{i}" for i in range(QUEUES)]
    async with await PostgresStore.connect(dsn, prefix=prefix) as store:
        await store.migrate()
        await _enqueue(store, KINDS * QUEUES, queues)
        await _clone(conn, prefix, pending - KINDS * QUEUES, finished=False)
        await _settle_table(conn)
        results.plans.append((f"{pending:,} pending", *await _plan(dsn, prefix, queues)))
        stats = await time_stats(Queue(store), calls)
        # The worker serves the five queues in order (q0 first): its first n jobs are timed.
        drains = []
        for _ in range(reps):
            drains.append(await _drain(dsn, conn, store, 1, concurrency, queues, n))
            print(f"  {pending:,} pending: {drains[-1].jobs_s:,.0f} jobs/s", flush=True)
        results.stages.append(
            Stage(f"{pending:,} pending over {QUEUES} queues and {KINDS} kinds", drains, stats)
        )


def _report(results: Results, took_s: float) -> str:
    s = results.sizes
    lines = [
        "# venturi at scale",
        "",
        f"Written by `python -m bench.scale` (do not edit by hand), {s['reps']} repetition(s) "
        f"of each drain (median, min-max), {took_s / 60:.0f} min. N = {s['n']:,} jobs per "
        f"drain ({PROCESS_DRAIN_FACTOR * s['n']:,} for the process drains), worker "
        f"concurrency {s['concurrency']}; one embedded PostgreSQL with fsync and "
        "synchronous_commit on. How each figure is measured: the docstring of "
        "`bench/scale.py`. Figures move with the machine's load; read them against each "
        "other, not against another run.",
        "",
        "## Worker processes",
        "",
        "| processes | jobs/s | x 1 process | worker CPU s / 10k jobs |",
        "|---|---|---|---|",
    ]
    one = (
        statistics.median(d.jobs_s for d in results.processes.get(1, []))
        if 1 in results.processes
        else None
    )
    for count, drains in sorted(results.processes.items()):
        rates = [d.jobs_s for d in drains]
        med = statistics.median(rates)
        ratio = f"{med / one:.2f}x" if one else "-"
        cpu = statistics.median(d.cpu_s_per_10k for d in drains)
        lines.append(
            f"| {count} | {med:,.0f} ({min(rates):,.0f}-{max(rates):,.0f}) | {ratio} | {cpu:.2f} |"
        )
    lines += [
        "",
        "## A big table, a big backlog",
        "",
        "| stage | jobs/s | worker CPU s / 10k jobs | stats() ms | finished jobs left |",
        "|---|---|---|---|---|",
    ]
    for st in results.stages:
        rates = [d.jobs_s for d in st.drains]
        cpu = statistics.median(d.cpu_s_per_10k for d in st.drains)
        left = "-" if st.finished_left is None else f"{st.finished_left:,}"
        lines.append(
            f"| {st.label} | {statistics.median(rates):,.0f} ({min(rates):,.0f}-"
            f"{max(rates):,.0f}) | {cpu:.2f} | {st.stats_ms:.2f} | {left} |"
        )
    if results.cleaner is not None:
        deleted, took = results.cleaner
        lines += [
            "",
            f"The retention cleaner deleted {deleted:,} finished jobs and their journal rows in "
            f"{took:.0f} s ({deleted / took:,.0f} jobs/s, batches of 1,000), while the drains "
            "above ran beside it.",
        ]
    lines += [
        "",
        "## The claim's plan at each stage",
        "",
        "| stage | index scan of the claim index | scans of the jobs table |",
        "|---|---|---|",
    ]
    for label, ok, scans in results.plans:
        lines.append(f"| {label} | {'yes' if ok else '**no**'} | {scans} |")
    load = os.getloadavg()
    lines += [
        "",
        f"Load average after: {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}; "
        f"{os.cpu_count()} cores.",
        "",
    ]
    return "\n".join(lines)


async def _main(args: argparse.Namespace) -> Results:
    results = Results(
        sizes={
            "n": args.n,
            "finished": args.finished,
            "pending": args.pending,
            "concurrency": args.concurrency,
            "reps": args.reps,
        }
    )
    # A SIGTERM ends the run through its finally blocks (workers and the server stopped).
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    async with EmbeddedPostgres(settings=SETTINGS) as pg:
        conn = await asyncpg.connect(pg.dsn)
        try:
            if "processes" in args.only:
                print("== worker processes", flush=True)
                await _processes(
                    pg.dsn, conn, results, args.n, args.concurrency, args.processes, args.reps
                )
            if "finished" in args.only:
                print(f"== {args.finished:,} finished jobs", flush=True)
                await _finished(
                    pg.dsn,
                    conn,
                    results,
                    args.n,
                    args.concurrency,
                    args.finished,
                    args.calls,
                    args.reps,
                )
            if "pending" in args.only:
                print(f"== {args.pending:,} pending jobs", flush=True)
                await _pending(
                    pg.dsn,
                    conn,
                    results,
                    args.n,
                    args.concurrency,
                    args.pending,
                    args.calls,
                    args.reps,
                )
        finally:
            await conn.close()
    return results


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        dsn, prefix, concurrency, queues, *flags = argv[1:]
        asyncio.run(_work(dsn, prefix, int(concurrency), queues.split(","), "--clean" in flags))
        return
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repetition")
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--finished", type=int, default=10_000_000)
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--calls", type=int, default=50, help="stats() calls timed per stage")
    parser.add_argument(
        "--only",
        nargs="+",
        default=["processes", "finished", "pending"],
        choices=["processes", "finished", "pending"],
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="where the report goes (full run: bench/SCALE.md)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.finished, args.pending, args.reps, args.calls = 2000, 20_000, 20_000, 1, 5
    began = time.perf_counter()
    results = asyncio.run(_main(args))
    report = _report(results, time.perf_counter() - began)
    print(report)
    out = args.out if args.out is not None else (None if args.quick else ROOT / "bench/SCALE.md")
    if out is not None:
        out.write_text(report)
        print(f"written to {out}")
    if not all(ok for _, ok, _ in results.plans):
        raise SystemExit("the claim was not an index scan of the claim index at some stage")


if __name__ == "__main__":
    main()
