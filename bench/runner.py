"""The worker's own CPU per job, without a database.

    python -m bench.runner [--jobs 50000] [--reps 9] [--concurrency 16]

What a worker spends in Python on each job between a claim's reply and the hand-off of its
outcome: accepting it (start or prefetch buffer), its task, decoding its payload, the
`Context`, a no-op handler, the settlement. The claims are made-up rows fed in batches of
500 (a drain's claim size); the settlements go to a completer that drops them, so neither
the database nor the encoding of the settle statement is in the figure. Prints the process
CPU time per job, median and best of `--reps`. Meant for before/after comparisons of the
runner's hot path (run it alternately on both builds: the figures are the machine's, noisy
on a shared one); `python -m bench` measures whole drains.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from dataclasses import dataclass
from typing import Any

from venturi import Context, PanicPolicy, Task
from venturi._executor import Policy, Registration
from venturi._hooks import HookSet
from venturi._records import ClaimedJob, Settlement
from venturi._runner import Runner
from venturi.backoff import DEFAULT_BACKOFF
from venturi.worker import DEFAULT_BACKSTOP, DEFAULT_JITTER_FRACTION

BATCH = 500


@dataclass
class Noop(Task):
    KIND = "bench.noop"
    x: float


async def _noop(task: Noop, ctx: Context[None], app: None) -> None:
    return None


class _Dropping:
    """The completer's surface the runner uses, counting settlements and writing none."""

    store = None

    def __init__(self) -> None:
        self.settled = 0

    async def settle(self, settlement: Settlement) -> None:
        self.settled += 1

    def settle_nowait(self, settlement: Settlement) -> None:
        self.settled += 1

    def unwritten(self) -> list[uuid.UUID]:
        return []


def _jobs(n: int) -> list[ClaimedJob]:
    return [
        ClaimedJob(
            uuid.uuid4(), Noop.KIND, "default", '{"x": 0.0}', None, 1, 0, uuid.uuid4(),
            300.0, None, None, 0.01, (),
        )
        for _ in range(n)
    ]  # fmt: skip


async def cpu_per_job(jobs: int, concurrency: int) -> float:
    """Process CPU seconds per job for one pass over `jobs` made-up claimed jobs."""
    # A worker's defaults, its registration of a task with no middleware.
    policy = Policy(DEFAULT_BACKOFF, DEFAULT_JITTER_FRACTION, DEFAULT_BACKSTOP, PanicPolicy.RETRY)
    reg = Registration(Noop, Noop.KIND, _noop, None, None)
    claimed = _jobs(jobs)
    completer = _Dropping()
    runner = Runner(
        app=None,
        concurrency=concurrency,
        policy=policy,
        completer=completer,  # type: ignore[arg-type]
        hooks=HookSet(()),
    )
    loop = asyncio.get_running_loop()
    started = time.process_time()
    for i in range(0, jobs, BATCH):
        now = loop.time()
        for job in claimed[i : i + BATCH]:
            runner.accept(job, reg, now, now)
        await runner.idle.wait()  # set when the last run of the batch has ended
    spent = time.process_time() - started
    if completer.settled != jobs:
        raise RuntimeError(f"{completer.settled} of {jobs} jobs settled")
    return spent / jobs


async def _main(args: Any) -> None:
    figures = [await cpu_per_job(args.jobs, args.concurrency) for _ in range(args.reps)]
    print(
        f"runner CPU per job at concurrency {args.concurrency}, {args.jobs:,} no-op jobs: "
        f"median {1e6 * statistics.median(figures):.2f} us, best {1e6 * min(figures):.2f} us "
        f"({args.reps} passes)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.runner", description=__doc__)
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--concurrency", type=int, default=16)
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
