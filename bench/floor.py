"""``python -m bench.floor``: what this machine makes a paced request cost, and where a venturi
pickup's time goes, on a private server (PostgreSQL with fsync and synchronous_commit on).

The pickup scenario of ``python -m bench`` sends a job every 20 ms; between two jobs every
process sleeps, and waking one (the server's backend, the worker, the producer) is paid on
each round trip. Two parts, one run:

* **The floor**: one asyncpg connection, ``SELECT 1`` and a one-row INSERT (its own commit),
  ``--n`` times back to back, then paced every 20 ms: what any client pays here, with no
  queue library in the way. A pickup needs at least an INSERT's commit (the enqueue) and an
  UPDATE's (the claim), each at the paced price.
* **A venturi pickup, stage by stage**: a worker process (concurrency 1, its defaults) and a
  producer in this process enqueueing ``--n`` jobs at 50/s, as the bench's pickup does. The
  handler reports each job's pickup (enqueue call to handler start, one clock); the producer
  times its enqueue calls; the server logs every statement's duration
  (``log_min_duration_statement = 0``), read back by statement: the insert, the claim, the
  settlement. What is neither server time nor the enqueue call is the round trips and
  commits at the paced price, and venturi's own code in the worker.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import re
import sys
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg

from bench.harness import percentile
from venturi import Context, Outcome, PostgresStore, Queue, Task, Worker
from venturi.embedded import EmbeddedPostgres

PACE = 0.02
"""Seconds between two requests (two jobs): the bench's pickup rate, 50 a second."""
SETTINGS = {
    "fsync": "on",
    "synchronous_commit": "on",
    "log_min_duration_statement": "0",
    "log_line_prefix": "'@@ '",
}
PREFIX = "floor"
STATEMENTS = {
    "enqueue (INSERT)": "WITH inserted AS ( INSERT INTO",
    "claim": "WITH gate AS (",
    "settlement": "WITH s AS (",
}
"""The statements read back from the server's log, by how their text begins."""


@dataclasses.dataclass
class Ping(Task):
    KIND = "floor.ping"
    sent: float
    """The producer's clock (time.time()) just before its enqueue call."""


def quantiles(values: list[float]) -> str:
    p50, p90, p99 = (percentile(values, p) for p in (50, 90, 99))
    return f"p50 {p50:6.2f}  p90 {p90:6.2f}  p99 {p99:6.2f} ms"


async def paced(call: Callable[[], Awaitable[object]], n: int, pace: float) -> list[float]:
    """Milliseconds of each of `n` calls, `pace` seconds apart (0: back to back)."""
    ms = []
    for _ in range(n):
        if pace:
            await asyncio.sleep(pace)
        began = time.perf_counter()
        await call()
        ms.append((time.perf_counter() - began) * 1000.0)
    return ms


async def floor(dsn: str, n: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CREATE TABLE floor_rows (id bigserial PRIMARY KEY, payload jsonb)")
        calls: dict[str, Callable[[], Awaitable[object]]] = {
            "SELECT 1": lambda: conn.fetchval("SELECT 1"),
            "one-row INSERT": lambda: conn.execute(
                "INSERT INTO floor_rows (payload) VALUES ('{\"n\": 1}')"
            ),
        }
        for label, call in calls.items():
            for pace in (0.0, PACE):
                ms = await paced(call, n, pace)
                how = "back to back" if not pace else f"every {pace * 1000:.0f} ms"
                print(f"  {label:16} {how:14} {quantiles(ms)}")
    finally:
        await conn.close()


async def worker_main(dsn: str, n: int) -> None:
    """The worker process: run `n` pings, then print their pickups (ms) as JSON."""
    pickups: list[float] = []
    done = asyncio.Event()

    async def handle(task: Ping, ctx: Context[None], app: None) -> Outcome:
        pickups.append((time.time() - task.sent) * 1000.0)
        if len(pickups) >= n:
            done.set()
        return Outcome.completed()

    async with await PostgresStore.connect(dsn, prefix=PREFIX) as store:
        worker: Worker[None] = Worker(None, store, concurrency=1)
        worker.register(Ping, handle)
        stop = asyncio.Event()
        running = asyncio.create_task(worker.run(stop))
        print("ready", flush=True)
        await done.wait()
        stop.set()
        await running
    print(json.dumps(pickups), flush=True)


async def pickup(dsn: str, n: int, log: Path) -> None:
    async with await PostgresStore.connect(dsn, prefix=PREFIX) as store:
        await store.migrate()
        worker = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.floor",
            "--worker",
            dsn,
            "--n",
            str(n),
            stdout=asyncio.subprocess.PIPE,
            limit=2**24,
        )
        assert worker.stdout is not None
        try:
            if (await worker.stdout.readline()).strip() != b"ready":
                raise RuntimeError("the worker did not start")
            await asyncio.sleep(4)  # past its start-up (the election, the first heartbeat)
            log_from = await asyncio.to_thread(lambda: log.stat().st_size)
            queue = Queue(store)
            calls = []
            start = time.monotonic()
            for i in range(n):
                await asyncio.sleep(max(0.0, start + i * PACE - time.monotonic()))
                sent = time.time()
                await queue.enqueue(Ping(sent))
                calls.append((time.time() - sent) * 1000.0)
            pickups: list[float] = json.loads(await worker.stdout.readline())
            await worker.wait()
        finally:
            if worker.returncode is None:
                worker.kill()
                await worker.wait()
    print(f"  {'pickup':28} {quantiles(pickups)}")
    print(f"  {'enqueue call (producer)':28} {quantiles(calls)}")
    durations = await asyncio.to_thread(server_durations, log, log_from)
    for label in STATEMENTS:
        if durations[label]:
            print(f"  {'server: ' + label:28} {quantiles(durations[label])}")


def server_durations(log: Path, offset: int) -> dict[str, list[float]]:
    """The durations (ms) the server logged after `offset`, by statement (`STATEMENTS`)."""
    with log.open(errors="replace") as f:
        f.seek(offset)
        text = f.read()
    durations: dict[str, list[float]] = defaultdict(list)
    for entry in text.split("@@ ")[1:]:
        m = re.search(r"duration: ([0-9.]+) ms  (?:statement|execute [^:]*): (.*)", entry, re.S)
        if m is None:
            continue
        body = " ".join(m[2].split())
        for label, opening in STATEMENTS.items():
            if body.startswith(opening):
                durations[label].append(float(m[1]))
    return durations


async def main(n: int) -> None:
    async with EmbeddedPostgres(settings=SETTINGS) as pg:
        log = pg.log_path
        assert log is not None
        print(f"The floor ({n} requests each):")
        await floor(pg.dsn, n)
        print(f"A venturi pickup ({n} jobs at {1 / PACE:.0f}/s, concurrency 1):")
        await pickup(pg.dsn, n, log)


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--worker", metavar="DSN", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        asyncio.run(worker_main(args.worker, args.n))
    else:
        asyncio.run(main(args.n))


if __name__ == "__main__":
    cli()
