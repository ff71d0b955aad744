"""The worker registry as callers see it: one `WorkerInfo` per running worker.

Every `Worker` keeps a row while it runs (written at start, refreshed by its heartbeat,
removed on a clean exit; the leader sweeps the rows of workers gone silent). Read them with
`Queue.workers()` or `venturi workers`; `Queue.unserved_kinds()` says which pending kinds
no live worker serves.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

UnknownKinds = Literal["wait", "fail"]
"""What a worker does with a job of a kind it has no task for: leave it pending for a
worker that has one ("wait", the default), or claim it and fail it for good ("fail")."""

SILENT_AFTER = 5
"""Heartbeats a worker may miss before it counts as gone (and the leader sweeps its row)."""


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One worker's registry row."""

    id: str
    """Its identity, as on its claims and journal entries (`[pod/]host:pid#tag`)."""
    host: str
    pid: int
    pod: str | None
    """The Kubernetes pod name, when it runs in one."""
    queues: tuple[str, ...]
    """The queues it serves, in the order it empties them."""
    kinds: tuple[str, ...]
    """The KINDs it has tasks for."""
    unknown_kinds: UnknownKinds
    """"fail": it also claims every other kind of its queues, and fails those jobs."""
    concurrency: int
    heartbeat: float
    """Seconds between its heartbeats."""
    started_at: datetime
    last_seen: datetime
    """Its last heartbeat (the database's clock)."""
    live: bool
    """Heard from within the last `SILENT_AFTER` heartbeats."""
    leader: bool = False
    """It holds the maintenance lease: it runs the leader-only services."""
