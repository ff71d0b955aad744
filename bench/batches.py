"""``python -m bench.batches``: what a batch costs, in one process on a private server.

Drains the same no-op jobs enqueued as plain jobs (`enqueue_many`) and as the members of one
`Queue.batch` with `then` and `finally` callbacks, interleaved in `--reps` rounds so machine
drift falls on both alike, and prints the medians and their ratio: the enqueue, and the
drain until the batch's `finally` has run (its completion overhead: the member trigger's
counter updates in every settle, and the callbacks). A focused figure for the batches
feature; the peer comparison is `python -m bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass

from venturi import Context, PostgresStore, Queue, Task, Worker
from venturi.embedded import EmbeddedPostgres


@dataclass
class Member(Task):
    KIND = "bench_member"
    n: int


@dataclass
class Done(Task):
    KIND = "bench_done"


async def _noop(task: Task, ctx: Context[None], app: None) -> None:
    return None


async def _round(dsn: str, n: int, batched: bool, rep: int) -> tuple[float, float]:
    prefix = f"benb_{'batch' if batched else 'plain'}_{rep}"
    async with await PostgresStore.connect(dsn, prefix=prefix, max_size=20) as store:
        await store.migrate()
        queue = Queue(store)
        began = time.perf_counter()
        if batched:
            batch = queue.batch("bench").add(*(Member(i) for i in range(n)))
            await batch.then(Done()).finally_(Done()).enqueue()
        else:
            for start in range(0, n, 1000):
                await queue.enqueue_many(Member(i) for i in range(start, min(n, start + 1000)))
        enqueue_s = time.perf_counter() - began
        worker: Worker[None] = Worker(None, store, concurrency=16)
        worker.register(Member, _noop)
        worker.register(Done, _noop)
        began = time.perf_counter()
        await worker.run(stop_when_empty=True)  # the callbacks are due before it is empty
        drain_s = time.perf_counter() - began
        if batched:
            (status,) = await queue.recent_batches(1)
            if status.done != n or not status.finished:
                raise RuntimeError(f"the batch did not finish: {status}")
    return n / enqueue_s, n / drain_s


async def _main(n: int, reps: int) -> None:
    results: dict[str, list[tuple[float, float]]] = {"plain": [], "batch": []}
    async with EmbeddedPostgres() as pg:
        for rep in range(reps):
            for name in ("plain", "batch"):
                results[name].append(await _round(pg.dsn, n, name == "batch", rep))
    medians = {
        name: (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
        for name, runs in results.items()
    }
    for name, (enq, drain) in medians.items():
        print(f"{name:>6}: enqueue {enq:9,.0f} jobs/s   drain c=16 {drain:9,.0f} jobs/s")
    (pe, pd), (be, bd) = medians["plain"], medians["batch"]
    print(
        f"batch / plain: enqueue {be / pe:.2f}x, drain to the last callback {bd / pd:.2f}x "
        f"(medians of {reps} reps of {n:,} jobs)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.batches")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(_main(args.jobs, args.reps))


if __name__ == "__main__":
    main()
