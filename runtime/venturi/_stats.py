"""Folds the rows of the `stats` statement into `Stats`: per queue and kind, and the totals
over queues, in one pass. Pure: `PostgresStore.stats` runs the statement and calls this.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from venturi.jobs import QueueStats, Stats


class Row(Protocol):
    """A row read by column name (an asyncpg Record, a dict)."""

    def __getitem__(self, column: str, /) -> Any: ...


@dataclass(slots=True)
class _Counts:
    """Mutable by-kind counts while the rows are read."""

    pending: dict[str, int] = field(default_factory=dict)
    scheduled: dict[str, int] = field(default_factory=dict)
    claimed: dict[str, int] = field(default_factory=dict)
    dead: dict[str, int] = field(default_factory=dict)
    completed: dict[str, int] = field(default_factory=dict)
    done: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    oldest: dict[str, float] = field(default_factory=dict)


# The rows of these statuses are plain counts: the `_Counts` field each one fills.
_COUNTED = {
    "claimed": "claimed",
    "completed": "completed",
    "dead": "dead",
    "done_last_hour": "done",
    "failed_last_hour": "failed",
}


def _add(counts: dict[str, int], kind: str, n: int) -> None:
    counts[kind] = counts.get(kind, 0) + n


def stats_from_rows(rows: Iterable[Row]) -> Stats:
    """`Stats` from rows of (queue, status, kind, n, scheduled, oldest_s): `n` counts every
    job of that queue, kind and status; for pending rows, `scheduled` of them wait for a
    future run_at and `oldest_s` is the age of the oldest eligible one (None when none is).
    The statuses `done_last_hour` and `failed_last_hour` carry the per-minute counts' sums;
    a row of status `paused` names a queue paused now (its other columns are unused)."""
    by_queue: dict[str, _Counts] = {}
    paused: set[str] = set()
    totals = _Counts()
    for r in rows:
        name, status = r["queue"], r["status"]
        if status == "paused":
            paused.add(name)
            continue
        c = by_queue.get(name)
        if c is None:
            c = by_queue[name] = _Counts()
        kind, total = r["kind"], r["n"]
        if status == "pending":
            scheduled = r["scheduled"]
            if total > scheduled:
                c.pending[kind] = total - scheduled
                _add(totals.pending, kind, total - scheduled)
            if scheduled:
                c.scheduled[kind] = scheduled
                _add(totals.scheduled, kind, scheduled)
            oldest = r["oldest_s"]
            if oldest is not None:
                # The database clock can be a hair behind a job's run_at: never negative.
                oldest = c.oldest[kind] = max(0.0, oldest)
                totals.oldest[kind] = max(oldest, totals.oldest.get(kind, oldest))
            continue
        counted = _COUNTED.get(status)
        if counted is not None:
            getattr(c, counted)[kind] = total
            _add(getattr(totals, counted), kind, total)
    queues = {
        name: QueueStats(
            pending_by_kind=c.pending,
            scheduled_by_kind=c.scheduled,
            claimed_by_kind=c.claimed,
            dead_by_kind=c.dead,
            oldest_pending_age_by_kind=c.oldest,
            completed_by_kind=c.completed,
            done_last_hour_by_kind=c.done,
            failed_last_hour_by_kind=c.failed,
            paused=name in paused,
        )
        for name, c in sorted(by_queue.items())
    }
    return Stats(
        pending_by_kind=totals.pending,
        scheduled_by_kind=totals.scheduled,
        claimed_by_kind=totals.claimed,
        dead_by_kind=totals.dead,
        oldest_pending_age_by_kind=totals.oldest,
        completed_by_kind=totals.completed,
        done_last_hour_by_kind=totals.done,
        failed_last_hour_by_kind=totals.failed,
        queues=queues,
        paused_queues=frozenset(paused),
    )
