"""The worker's and the operator's loops wait with a timeout that never loses a cancellation.

On Python 3.11 `asyncio.wait_for` returns the awaited result instead of raising when its
task is cancelled in the same loop iteration as the awaitable finishes (CPython gh-86296):
a background loop then runs on, and the worker's graceful shutdown waits for it forever (a
CI run caught the leader elector's loop so, its task left "cancelling").
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from venturi._timeouts import wait_for

ROOT = Path(__file__).resolve().parents[2]


async def cancelled_as_it_finishes(wait: Callable[[Awaitable[Any], float], Awaitable[Any]]) -> bool:
    """Whether a task awaiting `wait(fut, 10)` stops when cancelled in the very iteration in
    which `fut` gets its result (else it would go on to its next await)."""
    fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    went_on = asyncio.Event()

    async def loop_body() -> None:
        await wait(fut, 10)
        went_on.set()  # a loop that lost its cancellation carries on here
        await asyncio.Event().wait()

    task = asyncio.create_task(loop_body())
    await asyncio.sleep(0)  # the task now waits on fut
    fut.set_result(1)
    task.cancel()
    async with asyncio.timeout(5):
        await asyncio.wait(
            {task, asyncio.ensure_future(went_on.wait())}, return_when="FIRST_COMPLETED"
        )
    stopped = task.done() and task.cancelled()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return stopped


async def test_the_runtime_s_wait_for_never_loses_a_cancellation() -> None:
    assert await cancelled_as_it_finishes(wait_for)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="fixed in 3.12")
async def test_asyncio_s_wait_for_loses_it_on_this_python() -> None:
    """Why the helper exists: the same scenario with `asyncio.wait_for`."""
    assert not await cancelled_as_it_finishes(asyncio.wait_for)


def test_no_loop_waits_with_asyncio_wait_for() -> None:
    """Every timed wait in the runtime and the operator goes through `asyncio.timeout`
    (directly or by `venturi._timeouts.wait_for`)."""
    users = [
        str(path.relative_to(ROOT))
        for package in ("runtime/venturi", "operator/venturi_operator")
        for path in (ROOT / package).rglob("*.py")
        if "asyncio.wait_for(" in path.read_text(encoding="utf-8")
    ]
    assert users == []
