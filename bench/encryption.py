"""``python -m bench.encryption``: what sealing costs, in one process on a private server.

Enqueues and drains the same no-op jobs as plain tasks and as `ENCRYPTED` tasks (the same
fields), interleaved in `--reps` rounds so machine drift falls on both alike, and prints the
medians and their ratio. A focused figure for the encrypted-payloads feature; the peer
comparison is `python -m bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass

from venturi import Context, KeyRing, PostgresStore, Queue, SealedCodec, Task, Worker
from venturi.embedded import EmbeddedPostgres
from venturi.encryption import new_key


@dataclass
class PlainJob(Task):
    KIND = "bench_plain"
    account: int
    note: str


@dataclass
class SealedJob(Task):
    KIND = "bench_sealed"
    ENCRYPTED = True
    account: int
    note: str


async def _noop(task: Task, ctx: Context[None], app: None) -> None:
    return None


async def _round(
    dsn: str, task_type: type[PlainJob | SealedJob], n: int, codec: SealedCodec, rep: int
) -> tuple[float, float]:
    prefix = f"benc_{task_type.KIND}_{rep}"
    async with await PostgresStore.connect(dsn, prefix=prefix, max_size=20) as store:
        await store.migrate()
        queue = Queue(store, codec=codec)
        began = time.perf_counter()
        for start in range(0, n, 1000):
            await queue.enqueue_many(
                task_type(i, "x" * 64) for i in range(start, min(n, start + 1000))
            )
        enqueue_s = time.perf_counter() - began
        worker: Worker[None] = Worker(None, store, concurrency=16, codec=codec)
        worker.register(task_type, _noop)
        began = time.perf_counter()
        await worker.run(stop_when_empty=True)
        drain_s = time.perf_counter() - began
    return n / enqueue_s, n / drain_s


async def _main(n: int, reps: int) -> None:
    codec = SealedCodec(KeyRing({"bench": new_key()}))
    results: dict[str, list[tuple[float, float]]] = {"plain": [], "encrypted": []}
    async with EmbeddedPostgres() as pg:
        for rep in range(reps):
            for name, task_type in (("plain", PlainJob), ("encrypted", SealedJob)):
                results[name].append(await _round(pg.dsn, task_type, n, codec, rep))
    medians = {
        name: (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
        for name, runs in results.items()
    }
    for name, (enq, drain) in medians.items():
        print(f"{name:>9}: enqueue (1,000 per call) {enq:9,.0f}/s   drain c=16 {drain:9,.0f}/s")
    (pe, pd), (ee, ed) = medians["plain"], medians["encrypted"]
    ratios = f"enqueue {ee / pe:.2f}x, drain {ed / pd:.2f}x"
    print(f"encrypted / plain: {ratios} (medians of {reps} reps of {n:,} jobs)")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.encryption")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(_main(args.jobs, args.reps))


if __name__ == "__main__":
    main()
