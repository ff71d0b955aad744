"""Named queues in strict order: what serving several queues costs a worker.

    python -m bench.queues                 # N = 20,000, 3 repetitions, 200 pickups
    python -m bench.queues --quick         # a smoke run
    python -m bench.queues --dsn postgresql://...   # an existing server (a fresh prefix)

Two figures, each for one queue against three in strict order:

- drain: N no-op jobs drained by one worker at concurrency 16, jobs/s from the first claim
  to the last completion; with three queues the jobs are split evenly over them ("3 split"),
  or all in the last queue ("3 last": every claim probes two empty queues first);
- pickup: an idle worker, one job enqueued into the last queue it serves (the first ones
  empty), the time from the enqueue returning to the handler starting, in ms.

The machine is shared and noisy: report the ranges, not one number.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from venturi import Context, Outcome, PostgresStore, Queue, Task, Worker
from venturi.embedded import EmbeddedPostgres


@dataclass
class Noop(Task):
    KIND = "bench.noop"
    n: int


async def drain(dsn: str, n: int, served: Sequence[str], into: Sequence[str]) -> float:
    """Jobs/s draining `n` jobs spread over `into` with a worker serving `served`."""
    prefix = f"bq_{uuid.uuid4().hex[:10]}"
    async with await PostgresStore.connect(dsn, prefix=prefix, max_size=20) as store:
        await store.migrate()
        for i, name in enumerate(into):
            share = n // len(into) + (1 if i < n % len(into) else 0)
            queue = Queue(store, queue=name)
            for start in range(0, share, 5000):
                await queue.enqueue_many(Noop(j) for j in range(start, min(share, start + 5000)))
        done = asyncio.Event()
        count = 0
        first: float | None = None

        async def handle(task: Noop, ctx: Context[None], app: None) -> Outcome:
            nonlocal count, first
            if first is None:
                first = time.perf_counter()
            count += 1
            if count == n:
                done.set()
            return Outcome.completed()

        worker = Worker(None, store, concurrency=16, queues=list(served))
        worker.register(Noop, handle)
        shutdown = asyncio.Event()
        run = asyncio.create_task(worker.run(shutdown))
        await done.wait()
        end = time.perf_counter()
        shutdown.set()
        await run
        assert first is not None
        return n / (end - first)


async def pickups(dsn: str, times: int) -> dict[str, list[float]]:
    """Milliseconds from enqueue to handler start, one job at a time into the last queue of
    an idle worker: one serving ["c"], one serving ["a", "b", "c"], each on a prefix of its
    own, measured in turns so that the machine's noise hits both alike."""
    layouts = {"1 queue": ["c"], "3 queues": ["a", "b", "c"]}
    found: dict[str, list[float]] = {name: [] for name in layouts}
    async with contextlib.AsyncExitStack() as stack:
        queues: dict[str, Queue] = {}
        started: dict[str, asyncio.Event] = {}
        at: dict[str, float] = {}
        shutdown = asyncio.Event()
        runs = []
        for name, served in layouts.items():
            prefix = f"bq_{uuid.uuid4().hex[:10]}"
            store = await stack.enter_async_context(
                await PostgresStore.connect(dsn, prefix=prefix, max_size=20)
            )
            await store.migrate()
            started[name] = asyncio.Event()

            def handler(name: str) -> Any:
                async def handle(task: Noop, ctx: Context[None], app: None) -> Outcome:
                    at[name] = time.perf_counter()
                    started[name].set()
                    return Outcome.completed()

                return handle

            worker = Worker(None, store, concurrency=16, queues=served)
            worker.register(Noop, handler(name))
            runs.append(asyncio.create_task(worker.run(shutdown)))
            await worker.ready.wait()
            queues[name] = Queue(store, queue="c")
        for i in range(times + 5):
            for name in layouts:
                started[name].clear()
                await asyncio.sleep(0.02)  # let the worker go idle (waiting on LISTEN)
                await queues[name].enqueue(Noop(i))
                sent = time.perf_counter()
                await started[name].wait()
                if i >= 5:  # warm-up
                    found[name].append((at[name] - sent) * 1000)
        shutdown.set()
        await asyncio.gather(*runs)
    return found


def _range(values: Sequence[float]) -> str:
    return f"{min(values):,.0f}-{max(values):,.0f} (median {statistics.median(values):,.0f})"


async def main(dsn: str, n: int, reps: int, times: int) -> None:
    three = ["a", "b", "c"]
    layouts = {
        "1 queue": (["c"], ["c"]),
        "3 split": (three, three),
        "3 last": (three, ["c"]),
    }
    results: dict[str, list[float]] = {name: [] for name in layouts}
    for _ in range(reps):  # interleaved, so drift on a shared machine hits every layout
        for name, (served, into) in layouts.items():
            results[name].append(await drain(dsn, n, served, into))
    print(f"drain c=16, N={n:,}, {reps} repetitions, jobs/s:")
    for name, values in results.items():
        print(f"  {name:8} {_range(values)}")
    one = statistics.median(results["1 queue"])
    for name in ("3 split", "3 last"):
        print(f"  {name} / 1 queue (medians): {statistics.median(results[name]) / one:.2f}")
    print(f"pickup of the last queue, the others empty, {times} jobs each, in turns, ms:")
    found = await pickups(dsn, times)
    for label, values in found.items():
        ordered = sorted(values)
        p95 = ordered[int(len(ordered) * 0.95) - 1]
        print(
            f"  {label:8} median {statistics.median(ordered):.2f}  p95 {p95:.2f}  "
            f"max {ordered[-1]:.2f}"
        )
    paired = [b - a for a, b in zip(found["1 queue"], found["3 queues"], strict=True)]
    print(f"  3 queues - 1 queue, paired: median {statistics.median(paired):+.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="an existing server (default: a private embedded one)")
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--pickups", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="N=2,000, 1 repetition, 20 pickups")
    args = parser.parse_args()
    if args.quick:
        args.n, args.reps, args.pickups = 2000, 1, 20
    if args.dsn:
        asyncio.run(main(args.dsn, args.n, args.reps, args.pickups))
    else:
        with EmbeddedPostgres() as pg:
            asyncio.run(main(pg.dsn, args.n, args.reps, args.pickups))
