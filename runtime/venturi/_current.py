"""The claim the running job acts under, for middleware that writes with it (`venturi.flow`).

The runner binds it at the start of each run, in the run's own task (a `ContextVar` is per
task), so a middleware finds the store and the claim token of the job it wraps without them
being threaded through the public middleware signature. Binding is one `ContextVar.set` per
run; nothing reads it unless a middleware asks.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import NamedTuple

from venturi._records import ClaimedJob
from venturi.postgres import PostgresStore


class Run(NamedTuple):
    store: PostgresStore
    job: ClaimedJob


run: ContextVar[Run | None] = ContextVar("venturi_current_run", default=None)


def current(what: str) -> Run:
    """The run in progress, or a RuntimeError naming `what` needed it outside a worker."""
    value = run.get()
    if value is None:
        raise RuntimeError(f"{what} runs only as a worker's middleware, inside a job's run")
    return value
