"""Middleware: code that wraps every run of a worker's handlers.

A middleware is an async function of the task, its context and `call_next` (which runs the
rest of the chain and then the handler). It may act before and after, change nothing, or
short-circuit the run by returning an `Outcome` without calling `call_next`, e.g. to put a
job back for later without running it:

    async def business_hours(task: Task, ctx: Context[Any], call_next: CallNext) -> Outcome | None:
        if not 9 <= datetime.now().hour < 17:
            return Outcome.pause_in(timedelta(hours=1), note="outside business hours")
        return await call_next()

    worker = Worker(app, store, middleware=[business_hours])

The first middleware of the list is the outermost. What a middleware returns or raises is
the run's outcome, exactly as if the handler had: an exception is a failed execution, a
`TaskError` chooses its fate, a pause is not a failure. Use hooks (`venturi.hooks`) to only
observe; use middleware to change what happens. A worker without middleware calls its
handlers directly.

A middleware with a true `reads_trace_context` attribute (`venturi.otel`'s) makes the
worker's claims also read each job's stored trace context, as `ctx.trace_context`; without
one the claim never reads it.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

from venturi.context import Context
from venturi.outcome import Outcome

CallNext = Callable[[], Awaitable[Outcome | None]]
"""Runs the rest of the chain, then the handler, and returns its outcome."""

Middleware = Callable[[Any, Context[Any], CallNext], Awaitable[Outcome | None]]
"""`async def middleware(task, ctx, call_next) -> Outcome | None`."""

_Call = Callable[[Any, Context[Any], Any], Awaitable[Outcome | None]]


def compose(middleware: Sequence[Middleware], handler: _Call) -> _Call:
    """`handler` wrapped in `middleware`, the first the outermost (`handler` itself when
    there is none)."""
    call = awaiting(handler, "handler")
    for mw in reversed(middleware):
        call = _wrap(awaiting(mw, "middleware"), call)
    return call


def check_call(fn: object, where: str, parameters: str, count: int = 3) -> None:
    """Refuse at once a handler, middleware or hook that could never be called as it will
    be, with `count` positional arguments (`parameters` names them), rather than at a run."""
    if not callable(fn):
        raise TypeError(f"{where}: expected an async callable {parameters}, got {fn!r}")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # no signature to read (a builtin): it is called as it is
    try:
        signature.bind(*[None] * count)
    except TypeError:
        taken = ", ".join(signature.parameters)
        raise TypeError(f"{where}: {_name(fn)}({taken}) cannot be called as {parameters}") from None


def awaiting(fn: Any, what: str) -> _Call:
    """`fn` itself when it is an `async def` (or an object whose `__call__` is); otherwise a
    wrapper that names it when what it returns cannot be awaited (a plain `def` handler),
    instead of Python's "object NoneType can't be used in 'await' expression"."""
    # An async def, or an instance of a class with an async __call__.
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__):
        return cast(_Call, fn)

    async def call(first: Any, ctx: Context[Any], last: Any) -> Outcome | None:
        result = fn(first, ctx, last)
        if not inspect.isawaitable(result):
            raise TypeError(
                f"{what} {_name(fn)} returned {result!r}, which cannot be awaited: "
                f"define it with `async def`"
            )
        outcome: Outcome | None = await result
        return outcome

    return call


def _name(fn: object) -> str:
    return str(getattr(fn, "__qualname__", None) or repr(fn))


def _wrap(mw: Middleware, inner: _Call) -> _Call:
    async def wrapped(task: Any, ctx: Context[Any], app: Any) -> Outcome | None:
        return await mw(task, ctx, lambda: inner(task, ctx, app))

    return wrapped
