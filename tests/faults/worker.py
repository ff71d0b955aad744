"""A worker process for the fault-injection suite (`python -m tests.faults.worker ...`).

It prints `ready` once the worker listens and claims, and exits 0 after a graceful
shutdown on SIGTERM. Every handler run is recorded by the handler itself, not by venturi,
in `RUNS_DIR/runs-<pid>.log`: `S job run time` when it starts and `E job run time how`
when it ends (written with os.write on an O_APPEND file, so a SIGKILL loses nothing
written before it). The suite checks venturi against these records.

Tasks:
- `Work(n, ms)`: sleeps `ms` milliseconds, then completes.
- `Checkpoint(n)`: works in 50 ms steps, counting them in its carry; when asked to wind
  down it pauses (checkpoints) at once.
- `Stubborn(n)`: sleeps a minute, ignoring the cooperative cancel (aborted at shutdown).
- `Swallower(n)`: ignores cancellation altogether (abandoned at shutdown).
- `Doomed(n, hang)`: fails for good at once, or (`hang`) hangs until its worker is killed.
  Its `failed` hook records `F job run time error` when it ran; with `--hook-blocks` it
  records `W job run time` on entry and then blocks forever, before doing anything.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any

from venturi import Context, Outcome, PostgresStore, Task, TaskError, Worker


@dataclass
class Work(Task):
    KIND = "faults.work"
    n: int
    ms: int


@dataclass
class Progress:
    steps: int = 0


@dataclass
class Checkpoint(Task[Progress]):
    KIND = "faults.checkpoint"
    n: int


@dataclass
class Stubborn(Task):
    KIND = "faults.stubborn"
    n: int


@dataclass
class Swallower(Task):
    KIND = "faults.swallower"
    n: int


@dataclass
class Doomed(Task):
    KIND = "faults.doomed"
    n: int
    hang: bool = False

    async def failed(self, error: BaseException, ctx: Context[None], app: Records) -> None:
        if app.hook_blocks:
            app.hook_entered(ctx)
            await asyncio.Event().wait()  # never set: only SIGKILL ends this
        app.hook_ran(ctx, error)


class Records:
    """This process's run records."""

    def __init__(self, directory: str, *, hook_blocks: bool = False) -> None:
        path = os.path.join(directory, f"runs-{os.getpid()}.log")
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.hook_blocks = hook_blocks

    def hook_entered(self, ctx: Context[Any]) -> None:
        self._write(f"W {ctx.job_id.to_uuid()} {ctx.run_count} {time.time():.6f}")

    def hook_ran(self, ctx: Context[Any], error: BaseException) -> None:
        self._write(f"F {ctx.job_id.to_uuid()} {ctx.run_count} {time.time():.6f} {error}")

    def started(self, ctx: Context[Any]) -> None:
        self._write(f"S {ctx.job_id.to_uuid()} {ctx.run_count} {time.time():.6f}")

    def ended(self, ctx: Context[Any], how: str) -> None:
        self._write(f"E {ctx.job_id.to_uuid()} {ctx.run_count} {time.time():.6f} {how}")

    def took(self, window_ends: float) -> None:
        """A start the rate limit granted, with when its window ends (see flow_worker)."""
        self._write(f"T {window_ends:.6f}")

    def _write(self, line: str) -> None:
        os.write(self._fd, f"{line}\n".encode())


async def work(task: Work, ctx: Context[None], app: Records) -> Outcome:
    app.started(ctx)
    how = "cancelled"
    try:
        await asyncio.sleep(task.ms / 1000)
        how = "done"
    finally:
        app.ended(ctx, how)
    return Outcome.completed()


async def checkpoint(task: Checkpoint, ctx: Context[Progress], app: Records) -> Outcome:
    app.started(ctx)
    try:
        while not ctx.is_cancelled:
            ctx.carry.steps += 1
            await asyncio.sleep(0.05)
        return Outcome.pause_in(0, note=f"checkpoint at step {ctx.carry.steps}")
    finally:
        app.ended(ctx, "checkpointed")


async def stubborn(task: Stubborn, ctx: Context[None], app: Records) -> Outcome:
    app.started(ctx)
    try:
        await asyncio.sleep(60)
    finally:
        app.ended(ctx, "aborted")
    return Outcome.completed()


async def doomed(task: Doomed, ctx: Context[None], app: Records) -> Outcome:
    app.started(ctx)
    if task.hang:
        await asyncio.Event().wait()  # never set: only SIGKILL ends this run
    app.ended(ctx, "failed")
    raise TaskError.permanent(f"doomed {task.n}")


async def swallower(task: Swallower, ctx: Context[None], app: Records) -> Outcome:
    app.started(ctx)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            await asyncio.sleep(deadline - time.monotonic())
        except asyncio.CancelledError:
            continue  # the misbehaviour under test
    app.ended(ctx, "gave up swallowing")
    return Outcome.completed()


def dump_tasks_on_sigusr1() -> None:
    """On SIGUSR1, print every asyncio task's stack to stderr: the harness asks for it when
    a worker has not exited long after its SIGTERM, so a hung shutdown says where it hangs."""

    def dump() -> None:
        for task in asyncio.all_tasks():
            print(f"--- {task!r}", file=sys.stderr)
            task.print_stack(file=sys.stderr)
        sys.stderr.flush()

    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, dump)


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tests.faults.worker")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--runs-dir", required=True)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--lease", type=float, default=15 * 60)
    parser.add_argument("--poll-max", type=float, default=30)
    parser.add_argument("--shutdown-timeout", type=float, default=30)
    parser.add_argument("--backstop", type=int, default=25)
    parser.add_argument("--hook-blocks", action="store_true")
    parser.add_argument("--name", default="faults")
    args = parser.parse_args(argv)

    shutdown = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, shutdown.set)
    dump_tasks_on_sigusr1()
    store = await PostgresStore.connect(
        args.dsn,
        prefix=args.prefix,
        max_size=args.concurrency + 4,
        application_name=args.name,
        connect_timeout=3,
    )
    try:
        worker = Worker(
            Records(args.runs_dir, hook_blocks=args.hook_blocks),
            store,
            backstop=args.backstop,
            concurrency=args.concurrency,
            lease=args.lease,
            poll_max=args.poll_max,
            shutdown_timeout=args.shutdown_timeout,
        )
        worker.register(Work, work)
        worker.register(Checkpoint, checkpoint)
        worker.register(Stubborn, stubborn)
        worker.register(Swallower, swallower)
        worker.register(Doomed, doomed)
        worker._exits_with_run = True  # as `venturi worker`: the process ends with run()
        run = asyncio.create_task(worker.run(shutdown))
        ready = asyncio.create_task(worker.ready.wait())
        done, _ = await asyncio.wait({run, ready}, return_when=asyncio.FIRST_COMPLETED)
        if run in done:
            ready.cancel()
            run.result()
            return 1
        print(f"ready {worker.identity}", flush=True)
        await run
        print("stopped", flush=True)
        if worker.abandoned:
            os._exit(0)  # as `venturi worker` does: never wait for a handler that won't stop
        return 0
    finally:
        await store.close()


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    sys.exit(asyncio.run(main(sys.argv[1:])))
