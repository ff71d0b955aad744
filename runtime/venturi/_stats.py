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


# The columns that are plain counts, each filling the `_Counts` field of its name.
_COUNTED = ("claimed", "completed", "dead", "done", "failed")


_Columns = tuple[tuple[str, dict[str, int], dict[str, int]], ...]


def _columns(c: _Counts, totals: _Counts) -> _Columns:
    """Each plain count's column with the queue's dict and the totals' dict it fills: looked
    up once per queue, not once per row (a row is read per queue and kind: 100 at 5 queues
    and 20 kinds, and stats() is called often)."""
    return tuple((column, getattr(c, column), getattr(totals, column)) for column in _COUNTED)


def stats_from_rows(rows: Iterable[Row]) -> Stats:
    """`Stats` from one row per queue and kind, of columns queue, kind, pending, scheduled,
    oldest_s, claimed, dead, completed, done, failed and paused (a NULL count is 0):
    `pending` counts every pending job of that queue and kind, `scheduled` of them wait for
    a future run_at, and `oldest_s` is the age of the oldest eligible one (None when none
    is); `done` and `failed` are the jobs finished in the last hour. A row with `paused`
    true names a queue paused now (its other columns are unused)."""
    by_queue: dict[str, _Counts] = {}
    paused: set[str] = set()
    totals = _Counts()
    seen: dict[str, tuple[_Counts, _Columns]] = {}
    for r in rows:
        name = r["queue"]
        if r["paused"]:
            paused.add(name)
            continue
        kind = r["kind"]
        found = seen.get(name)
        if found is None:
            counts = _Counts()
            found = seen[name] = (counts, _columns(counts, totals))
        c, columns = found
        shown = False
        pending = r["pending"] or 0
        if pending > 0:
            shown = True
            scheduled = r["scheduled"] or 0
            if pending > scheduled:
                eligible = c.pending[kind] = pending - scheduled
                totals.pending[kind] = totals.pending.get(kind, 0) + eligible
            if scheduled:
                c.scheduled[kind] = scheduled
                totals.scheduled[kind] = totals.scheduled.get(kind, 0) + scheduled
            oldest = r["oldest_s"]
            if oldest is not None:
                # The database clock can be a hair behind a job's run_at: never negative.
                oldest = c.oldest[kind] = oldest if oldest > 0.0 else 0.0
                if oldest >= totals.oldest.get(kind, 0.0):
                    totals.oldest[kind] = oldest
        for column, mine, total in columns:
            n = r[column]
            if n is not None and n > 0:  # NULL: none of that status
                shown = True
                mine[kind] = n
                total[kind] = total.get(kind, 0) + n
        if shown:  # a queue whose counts are all 0 is not shown
            by_queue[name] = c
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
