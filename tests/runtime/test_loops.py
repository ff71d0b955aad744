"""The event loop `venturi worker` runs on (`--loop`, env VENTURI_LOOP): asyncio's, or uvloop."""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
from pathlib import Path

import pytest
import uvloop

from venturi import JobStatus, Queue
from venturi._loops import LoopUnavailable, run

from .cli_app import WhichLoop

ROOT = Path(__file__).resolve().parents[2]


async def _loop_class() -> type[asyncio.AbstractEventLoop]:
    return type(asyncio.get_running_loop())


def test_run_starts_the_loop_it_is_asked_for() -> None:
    assert issubclass(run(_loop_class(), "uvloop"), uvloop.Loop)
    assert not issubclass(run(_loop_class(), "asyncio"), uvloop.Loop)


def test_a_loop_that_is_not_installed_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` raises ImportError
    main = _loop_class()
    with pytest.raises(LoopUnavailable, match=r"pip install 'venturi\[uvloop\]'"):
        run(main, "uvloop")
    # Closed, not left unawaited (that warning is an error here).
    assert inspect.getcoroutinestate(main) == inspect.CORO_CLOSED


def test_an_unknown_loop_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown event loop 'trio'"):
        run(_loop_class(), "trio")


async def _worker_once(pg_dsn: str, prefix: str, *args: str, loop_env: str | None = None) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VENTURI_")}
    env |= {"VENTURI_DSN": pg_dsn, "VENTURI_PREFIX": prefix}
    if loop_env is not None:
        env["VENTURI_LOOP"] = loop_env
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "venturi",
        "worker",
        "tests.runtime.cli_app:make_loop_worker",
        "--once",
        *args,
        cwd=ROOT,
        env=env,
    )
    try:
        return await asyncio.wait_for(proc.wait(), timeout=60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _ran_on(queue: Queue, pg_dsn: str, *args: str, loop_env: str | None = None) -> str:
    job_id = await queue.enqueue(WhichLoop())
    assert await _worker_once(pg_dsn, queue.store.prefix, *args, loop_env=loop_env) == 0
    job = await queue.job(job_id)
    assert job is not None and job.status == JobStatus.COMPLETED
    [entry] = await queue.job_journal(job_id)
    assert entry.note is not None
    return entry.note


async def test_the_worker_command_runs_its_jobs_on_the_loop_it_is_given(
    queue: Queue, pg_dsn: str
) -> None:
    assert await _ran_on(queue, pg_dsn) == "asyncio.unix_events._UnixSelectorEventLoop"
    assert await _ran_on(queue, pg_dsn, "--loop", "uvloop") == "uvloop.Loop"
    assert await _ran_on(queue, pg_dsn, loop_env="uvloop") == "uvloop.Loop"
    assert await _ran_on(queue, pg_dsn, "--loop", "asyncio", loop_env="uvloop") == (
        "asyncio.unix_events._UnixSelectorEventLoop"
    )
