"""Drain and pickup through PgBouncer (transaction mode) against a direct connection.

    python -m bench.pooler [--n 5000] [--pickups 30] [--concurrency 8] [--reps 3]

Starts a private PostgreSQL and a private PgBouncer in front of it (`venturi.embedded`), then,
for each way of connecting, measures on the same server:

- drain: a backlog of N no-op jobs (enqueued first) worked by one worker; jobs per second.
- pickup: an idle worker, one job enqueued; the time from before the enqueue to the
  handler's start (median and p95 of `--pickups`).

The ways: `direct`; `pgbouncer + listen_dsn` (work through the pooler, LISTEN direct);
`pgbouncer, polling` (no LISTEN at all; `poll_max` 1 s, so pickup is bounded by it).
Each way is measured `--reps` times, the ways interleaved (so a burst of load elsewhere on the
machine hits them alike); the table shows the median drain and the pickups of every rep
together. Prints a Markdown table. The figures depend on the machine; on a shared one, they
are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from dataclasses import dataclass

from venturi import Context, PostgresStore, Queue, Task, Worker
from venturi.embedded import EmbeddedPgBouncer, EmbeddedPostgres


@dataclass
class Noop(Task):
    KIND = "bench.noop"
    n: int


async def _drain(store: PostgresStore, n: int, concurrency: int, poll_max: float) -> float:
    queue = Queue(store)
    for start in range(0, n, 1000):
        await queue.enqueue_many([Noop(i) for i in range(start, min(n, start + 1000))])
    done = asyncio.Event()
    count = 0

    async def handle(task: Noop, ctx: Context[None], app: None) -> None:
        nonlocal count
        count += 1
        if count == n:
            done.set()

    worker = Worker(None, store, concurrency=concurrency, poll_max=poll_max)
    worker.register(Noop, handle)
    shutdown = asyncio.Event()
    began = time.perf_counter()
    run = asyncio.create_task(worker.run(shutdown))
    await done.wait()
    elapsed = time.perf_counter() - began
    shutdown.set()
    await run
    return n / elapsed


async def _pickup(store: PostgresStore, times: int, poll_max: float) -> list[float]:
    queue = Queue(store)
    started: asyncio.Queue[float] = asyncio.Queue()

    async def handle(task: Noop, ctx: Context[None], app: None) -> None:
        started.put_nowait(time.perf_counter())

    worker = Worker(None, store, concurrency=2, poll_max=poll_max)
    worker.register(Noop, handle)
    shutdown = asyncio.Event()
    run = asyncio.create_task(worker.run(shutdown))
    await worker.ready.wait()
    found = []
    for i in range(times):
        await asyncio.sleep(0.05)  # let the worker go idle
        before = time.perf_counter()
        await queue.enqueue(Noop(i))
        found.append(await started.get() - before)
    shutdown.set()
    await run
    return found


async def main(n: int, pickups: int, concurrency: int, reps: int) -> None:
    async with EmbeddedPostgres() as pg:
        with EmbeddedPgBouncer(pg.port, pool_size=20) as bouncer:
            ways: list[tuple[str, dict[str, object], float]] = [
                ("direct", {"dsn": pg.dsn}, 30.0),
                (
                    "PgBouncer (transaction) + listen_dsn",
                    {"dsn": bouncer.dsn, "pooler": "transaction", "listen_dsn": pg.dsn},
                    30.0,
                ),
                (
                    "PgBouncer (transaction), polling",
                    {"dsn": bouncer.dsn, "pooler": "transaction"},
                    1.0,
                ),
            ]
            rates: dict[str, list[float]] = {name: [] for name, _, _ in ways}
            waits: dict[str, list[float]] = {name: [] for name, _, _ in ways}
            for _ in range(reps):
                for name, options, poll_max in ways:
                    prefix = f"bench_{uuid.uuid4().hex[:8]}"
                    store = await PostgresStore.connect(prefix=prefix, max_size=12, **options)  # type: ignore[arg-type]
                    try:
                        await store.migrate()
                        rates[name].append(await _drain(store, n, concurrency, poll_max))
                        waits[name] += await _pickup(store, pickups, poll_max)
                    finally:
                        await store.close()
            print(f"N={n} concurrency={concurrency} pickups={pickups} reps={reps}\n")
            print("| connection | poll_max | drain (jobs/s, median) | pickup p50 | pickup p95 |")
            print("|---|---|---|---|---|")
            for name, _, poll_max in ways:
                found = sorted(waits[name])
                p95 = found[min(len(found) - 1, round(0.95 * (len(found) - 1)))]
                print(
                    f"| {name} | {poll_max:g} s | {statistics.median(rates[name]):,.0f} | "
                    f"{statistics.median(found) * 1000:.1f} ms | {p95 * 1000:.1f} ms |"
                )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--pickups", type=int, default=30)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.n, args.pickups, args.concurrency, args.reps))
