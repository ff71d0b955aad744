"""`wait_for` without Python 3.11's lost cancellation.

On 3.11, `asyncio.wait_for` returns the awaited result instead of raising when the task is
cancelled in the same loop iteration as that awaitable finishes (CPython gh-86296, fixed in
3.12 by rebuilding it on `asyncio.timeout`). A loop that awaits it then carries on as if it
had never been cancelled: the worker's background loops would keep a graceful shutdown
waiting forever (seen once in CI: the leader elector's loop, its task left "cancelling").
`asyncio.timeout` counts cancellations, so it never swallows one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def wait_for(awaitable: Awaitable[T], timeout: float | None) -> T:  # noqa: ASYNC109
    """`await awaitable`, raising TimeoutError after `timeout` seconds (None: never), as
    `asyncio.wait_for` does; a cancellation of the caller always propagates."""
    async with asyncio.timeout(timeout):
        return await awaitable
