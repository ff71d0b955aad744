"""The event loop a `venturi` command runs on: asyncio's own, or uvloop (the `uvloop` extra).

uvloop is a drop-in replacement for asyncio's loop written on libuv; with it a worker spends
less CPU per job (claims, settlements, LISTEN and the handlers' own awaits all go through
the loop). Nothing in venturi depends on which loop runs it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

LOOPS = ("asyncio", "uvloop")
"""The loops `run` knows, the first the default."""


class LoopUnavailable(Exception):
    """The loop asked for is not installed."""


def run(main: Coroutine[Any, Any, T], loop: str) -> T:
    """Run `main` to completion on a new event loop of the kind `loop` names."""
    if loop not in LOOPS:
        main.close()
        raise ValueError(f"unknown event loop {loop!r}: expected one of {', '.join(LOOPS)}")
    if loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            main.close()  # never started: no "coroutine was never awaited" warning
            raise LoopUnavailable(
                "the uvloop event loop is not installed: pip install 'venturi[uvloop]'"
            ) from None
        return uvloop.run(main)
    return asyncio.run(main)
