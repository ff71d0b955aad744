"""Unique enqueue throughput against a plain enqueue, on a private PostgreSQL.

    python -m bench.unique_enqueue [--n 3000] [--reps 3]

Four single-job enqueue workloads, each run sequentially (one producer) and with 16
concurrent producers, best of `--reps`: plain (no policy), unique with a fresh id each time
(nothing collides), unique duplicates (every enqueue collides with one holder, stores nothing)
and, for reference, deduplicated (`Merge.keep()`, every enqueue collides). Prints enqueues per
second. The figures are the machine's: on a shared machine they are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from venturi import DedupKey, Merge, Pending, PostgresStore, Queue, Task
from venturi.embedded import EmbeddedPostgres

_prefixes = itertools.count()


@dataclass
class Plain(Task):
    KIND = "bench.plain"
    n: int


@dataclass
class Unique(Task):
    KIND = "bench.unique"
    n: int

    def unique_for(self) -> float:
        return 3600

    def unique_id(self) -> str:
        return str(self.n)


@dataclass
class Dedup(Task):
    KIND = "bench.dedup"
    n: int

    def dedup_key(self) -> DedupKey:
        return DedupKey(self.n)

    def merge(self, existing: Pending[Any]) -> Merge:
        return Merge.keep()


WORKLOADS: dict[str, Callable[[int], Task[Any]]] = {
    "plain": Plain,
    "unique, no collision": Unique,
    "unique, every one a duplicate": lambda n: Unique(0),
    "dedup keep, every one a duplicate": lambda n: Dedup(0),
}


async def measure(dsn: str, make: Callable[[int], Task[Any]], n: int, producers: int) -> float:
    """Enqueues per second of `n` single enqueues by `producers` concurrent producers."""
    prefix = f"bench_unique_{next(_prefixes)}"
    async with await PostgresStore.connect(dsn, prefix=prefix, max_size=producers + 2) as store:
        await store.migrate()
        queue = Queue(store)
        await queue.enqueue(make(-1))  # warm: connections, statement cache, the first holder
        counter = itertools.count()

        async def producer() -> None:
            while (i := next(counter)) < n:
                await queue.enqueue(make(i))

        began = time.perf_counter()
        await asyncio.gather(*(producer() for _ in range(producers)))
        took = time.perf_counter() - began
    return n / took


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.unique_enqueue")
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    with EmbeddedPostgres() as pg:
        print(f"single-job enqueues per second, best of {args.reps}, n={args.n}")
        print(f"{'workload':36} {'c=1':>8} {'c=16':>8}")
        for name, make in WORKLOADS.items():
            best: list[float] = []
            for producers in (1, 16):
                results = [await measure(pg.dsn, make, args.n, producers) for _ in range(args.reps)]
                best.append(max(results))
            print(f"{name:36} {best[0]:8.0f} {best[1]:8.0f}")


if __name__ == "__main__":
    asyncio.run(main())
