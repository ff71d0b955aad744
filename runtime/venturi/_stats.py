"""Folds the rows of the `stats` statement into `Stats`: per queue and kind, then the totals
over queues. Pure: `PostgresStore.stats` runs the statement and calls this.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from venturi.jobs import QueueStats, Stats


class Row(Protocol):
    """A row read by column name (an asyncpg Record, a dict)."""

    def __getitem__(self, column: str, /) -> Any: ...


@dataclass
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

    def add(self, other: _Counts) -> None:
        for mine, theirs in (
            (self.pending, other.pending),
            (self.scheduled, other.scheduled),
            (self.claimed, other.claimed),
            (self.dead, other.dead),
            (self.completed, other.completed),
            (self.done, other.done),
            (self.failed, other.failed),
        ):
            for kind, n in theirs.items():
                mine[kind] = mine.get(kind, 0) + n
        for kind, age in other.oldest.items():
            self.oldest[kind] = max(age, self.oldest.get(kind, age))


def stats_from_rows(rows: Iterable[Row], paused: frozenset[str] = frozenset()) -> Stats:
    """`Stats` from rows of (queue, status, kind, n, scheduled, oldest_s): `n` counts every
    job of that queue, kind and status; for pending rows, `scheduled` of them wait for a
    future run_at and `oldest_s` is the age of the oldest eligible one (None when none is).
    The statuses `done_last_hour` and `failed_last_hour` carry the per-minute counts' sums.
    `paused`: the queues paused now."""
    by_queue: dict[str, _Counts] = {}
    for r in rows:
        c = by_queue.setdefault(r["queue"], _Counts())
        status, kind, total = r["status"], r["kind"], r["n"]
        if status == "pending":
            eligible = total - r["scheduled"]
            if eligible > 0:
                c.pending[kind] = eligible
            if r["scheduled"]:
                c.scheduled[kind] = r["scheduled"]
            if r["oldest_s"] is not None:
                # The database clock can be a hair behind a job's run_at: never negative.
                c.oldest[kind] = max(0.0, r["oldest_s"])
        elif status == "claimed":
            c.claimed[kind] = total
        elif status == "completed":
            c.completed[kind] = total
        elif status == "dead":
            c.dead[kind] = total
        elif status == "done_last_hour":
            c.done[kind] = total
        elif status == "failed_last_hour":
            c.failed[kind] = total
    totals = _Counts()
    queues: dict[str, QueueStats] = {}
    for name in sorted(by_queue):
        c = by_queue[name]
        totals.add(c)
        queues[name] = QueueStats(
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
        paused_queues=paused,
    )
