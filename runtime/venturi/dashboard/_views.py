"""What the pages show, as plain values built from what the store read: pure functions, no
I/O, tested as such. The templates only lay these out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from ulid import ULID

from venturi.dashboard._store import ChainLink
from venturi.jobs import Job, JobStatus, MinuteCounts, Stats
from venturi.pauses import QueueState
from venturi.registry import WorkerInfo

PAYLOAD_SHOWN = 64 * 1024
"""Characters of a payload, carry or attachment a page shows before cutting it."""

STATUS_LABELS = {
    JobStatus.PENDING: "pending",
    JobStatus.CLAIMED: "running",
    JobStatus.COMPLETED: "done",
    JobStatus.DEAD: "dead",
    JobStatus.WAITING: "waiting",
    JobStatus.CANCELLED: "cancelled",
}


@dataclass(frozen=True, slots=True)
class KindRow:
    kind: str
    ready: int
    scheduled: int
    running: int
    done: int
    dead: int
    oldest_wait: float | None


@dataclass(frozen=True, slots=True)
class Overview:
    """The overview page's totals and its rows by kind (the rows by queue are
    `queue_rows`, the chart `minute_chart`)."""

    ready: int
    scheduled: int
    running: int
    dead: int
    done_total: int
    oldest_wait: float | None
    done_hour: int
    failed_hour: int
    """Jobs done, and failed for good, in the last hour: the per-minute counters (`Stats`)."""
    kinds: tuple[KindRow, ...]


def overview(stats: Stats, counts: Mapping[str, Mapping[JobStatus, int]]) -> Overview:
    kinds = sorted(
        set(counts)
        | set(stats.pending_by_kind)
        | set(stats.scheduled_by_kind)
        | set(stats.claimed_by_kind)
        | set(stats.dead_by_kind)
    )
    rows = tuple(
        KindRow(
            kind=k,
            ready=stats.pending_by_kind.get(k, 0),
            scheduled=stats.scheduled_by_kind.get(k, 0),
            running=stats.claimed_by_kind.get(k, 0),
            done=counts.get(k, {}).get(JobStatus.COMPLETED, 0),
            dead=stats.dead_by_kind.get(k, 0),
            oldest_wait=stats.oldest_pending_age_by_kind.get(k),
        )
        for k in kinds
    )
    return Overview(
        ready=stats.pending,
        scheduled=sum(stats.scheduled_by_kind.values()),
        running=stats.claimed,
        dead=stats.dead,
        done_total=sum(r.done for r in rows),
        oldest_wait=stats.oldest_pending_age,
        done_hour=stats.done_last_hour,
        failed_hour=stats.failed_last_hour,
        kinds=rows,
    )


@dataclass(frozen=True, slots=True)
class QueueRow:
    """One named queue: its live figures (`Stats.queues`) and its pause (`Queue.queues()`)."""

    name: str
    ready: int
    scheduled: int
    running: int
    dead: int
    oldest_wait: float | None
    done_hour: int
    failed_hour: int
    paused: bool
    reason: str | None
    since: datetime | None
    until: datetime | None


def queue_rows(stats: Stats, states: Sequence[QueueState]) -> tuple[QueueRow, ...]:
    """Every queue that holds a job, finished one in the last hour, or is paused, by name:
    the figures from `stats.queues`, the pause's reason and times from `states` (both read
    in one snapshot, so they agree)."""
    by_name = {s.name: s for s in states}
    names = sorted(set(stats.queues) | {s.name for s in states if s.paused} | stats.paused_queues)
    rows = []
    for name in names:
        q = stats.queues.get(name)
        state = by_name.get(name)
        paused = name in stats.paused_queues or (state is not None and state.paused)
        rows.append(
            QueueRow(
                name=name,
                ready=q.pending if q else 0,
                scheduled=q.scheduled if q else 0,
                running=q.claimed if q else 0,
                dead=q.dead if q else 0,
                oldest_wait=q.oldest_pending_age if q else None,
                done_hour=q.done_last_hour if q else 0,
                failed_hour=q.failed_last_hour if q else 0,
                paused=paused,
                reason=state.reason if paused and state else None,
                since=state.since if paused and state else None,
                until=state.until if paused and state else None,
            )
        )
    return tuple(rows)


@dataclass(frozen=True, slots=True)
class WorkerRow:
    id: str
    host: str
    pid: int
    pod: str | None
    queues: tuple[str, ...]
    kinds: tuple[str, ...]
    any_kind: bool
    """It claims every kind of its queues (unknown_kinds="fail")."""
    concurrency: int
    started_at: datetime
    last_seen: datetime
    live: bool
    leader: bool


def worker_rows(workers: Sequence[WorkerInfo]) -> tuple[WorkerRow, ...]:
    """The registry's workers: the leader first, then live ones, then silent, oldest first."""
    ordered = sorted(workers, key=lambda w: (not w.leader, not w.live, w.started_at, w.id))
    return tuple(
        WorkerRow(
            id=w.id,
            host=w.host,
            pid=w.pid,
            pod=w.pod,
            queues=w.queues,
            kinds=w.kinds,
            any_kind=w.unknown_kinds == "fail",
            concurrency=w.concurrency,
            started_at=w.started_at,
            last_seen=w.last_seen,
            live=w.live,
            leader=w.leader,
        )
        for w in ordered
    )


CHART_MINUTES = 120
"""The per-minute chart's span: the two hours the per-minute counters keep."""
CHART_WIDTH = 960
CHART_HEIGHT = 140
"""The chart's drawing size (SVG user units; the page scales it to its width)."""


@dataclass(frozen=True, slots=True)
class Bar:
    """One minute of the chart: done at the bottom, failed stacked above (SVG units)."""

    minute: datetime
    done: int
    failed: int
    x: float
    width: float
    done_y: float
    done_h: float
    failed_y: float
    failed_h: float


@dataclass(frozen=True, slots=True)
class MinuteChart:
    """Jobs done and failed per minute over the last two hours, every queue and kind."""

    bars: tuple[Bar, ...]
    """Minutes with any finished job, oldest first (empty minutes draw nothing)."""
    peak: int
    """The busiest minute's total: the chart's top."""
    done: int
    failed: int
    start: datetime
    """The first minute drawn (the left edge)."""
    width: int = CHART_WIDTH
    height: int = CHART_HEIGHT


def minute_chart(counts: Sequence[MinuteCounts], now: datetime) -> MinuteChart:
    """The overview's chart from `Queue.finished_per_minute()`: summed over queues and kinds,
    one slot per minute of the last `CHART_MINUTES` (the last one is `now`'s minute)."""
    last = now.replace(second=0, microsecond=0)
    start = last - timedelta(minutes=CHART_MINUTES - 1)
    done: dict[datetime, int] = {}
    failed: dict[datetime, int] = {}
    for c in counts:
        minute = c.minute.replace(second=0, microsecond=0)
        if start <= minute <= last:
            done[minute] = done.get(minute, 0) + c.done
            failed[minute] = failed.get(minute, 0) + c.failed
    minutes = sorted(m for m in set(done) | set(failed) if done.get(m) or failed.get(m))
    peak = max((done.get(m, 0) + failed.get(m, 0) for m in minutes), default=0)
    slot = CHART_WIDTH / CHART_MINUTES
    scale = CHART_HEIGHT / peak if peak else 0.0
    bars = []
    for m in minutes:
        d, f = done.get(m, 0), failed.get(m, 0)
        index = round((m - start).total_seconds() / 60)
        done_h, failed_h = d * scale, f * scale
        bars.append(
            Bar(
                minute=m,
                done=d,
                failed=f,
                x=round(index * slot + 0.5, 2),
                width=round(slot - 1, 2),
                done_y=round(CHART_HEIGHT - done_h, 2),
                done_h=round(done_h, 2),
                failed_y=round(CHART_HEIGHT - done_h - failed_h, 2),
                failed_h=round(failed_h, 2),
            )
        )
    return MinuteChart(
        bars=tuple(bars),
        peak=peak,
        done=sum(done.values()),
        failed=sum(failed.values()),
        start=start,
    )


@dataclass(frozen=True, slots=True)
class Chain:
    """One chain as the pages show it: its links in order and where it stands."""

    head: ULID
    links: tuple[ChainLink, ...]
    state: str
    """'done' (every link completed), 'running' (a link is pending or running), 'held' (a link
    failed for good and links wait after it: retrying it resumes the chain), 'failed' (the
    last link failed for good), or 'orphaned' (its first link waits for a link that is gone:
    one deleted while dead, by forget or cleanup)."""
    at: ChainLink | None
    """The link the chain stands at: the first not completed (None when all are)."""
    more: bool
    """More links follow than were read (the page's cap)."""
    earlier: bool = False
    """Links come before the first one read (the walk back's cap)."""

    @property
    def held(self) -> bool:
        return self.state == "held"


def chain(head: ULID, links: Sequence[ChainLink], *, earlier: bool = False) -> Chain:
    """Where a chain stands, from its links in order. Links before the one it stands at have
    completed and those after it wait, so the first link not completed tells it all."""
    more = bool(links) and links[-1].has_next
    at = next((link for link in links if link.status is not JobStatus.COMPLETED), None)
    if at is None:
        state = "running" if more else "done"  # the link it stands at is past the cap
    elif at.status is JobStatus.DEAD:
        state = "held" if at.has_next else "failed"
    elif at.status is JobStatus.WAITING:
        state = "orphaned" if at is links[0] and not earlier else "running"
    else:
        state = "running"
    return Chain(head=head, links=tuple(links), state=state, at=at, more=more, earlier=earlier)


@dataclass(frozen=True, slots=True)
class Place:
    """A job's place in its chain: itself and the links either side (None: none, or not
    read)."""

    link: ChainLink
    previous: ChainLink | None
    next: ChainLink | None


def place_in(c: Chain, job_id: ULID) -> Place | None:
    """`job_id`'s place among `c`'s links (None if the links read do not hold it)."""
    for i, link in enumerate(c.links):
        if link.id == job_id:
            previous = c.links[i - 1] if i > 0 else None
            following = c.links[i + 1] if i + 1 < len(c.links) else None
            return Place(link=link, previous=previous, next=following)
    return None


def link_status(link: ChainLink, now: datetime) -> str:
    """A link's status as a person reads it (see `shown_status`)."""
    if link.status is JobStatus.PENDING and link.run_at > now:
        return "scheduled"
    return STATUS_LABELS[link.status]


def status_totals(counts: Mapping[str, Mapping[JobStatus, int]]) -> dict[JobStatus, int]:
    """Jobs per status over every kind (for the jobs page's tabs)."""
    totals = dict.fromkeys(JobStatus, 0)
    for by_status in counts.values():
        for status, n in by_status.items():
            totals[status] += n
    return totals


def number(n: int) -> str:
    """1234567 -> '1,234,567'."""
    return f"{n:,}"


def duration(seconds: float | None) -> str:
    """A span of time for people: '850 ms', '4.2 s', '3 min', '2.5 h', '3 d'; '-' for none."""
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 0.001:
        return "<1 ms" if seconds > 0 else "0 s"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 86400 * 2:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} d"


def ago(at: datetime | None, now: datetime) -> str:
    """'3 min ago', 'in 5.0 s' (by the database's clock, `now`)."""
    if at is None:
        return "-"
    delta = (now - at).total_seconds()
    if -1 < delta < 1:
        return "now"
    return f"{duration(delta)} ago" if delta > 0 else f"in {duration(-delta)}"


def timestamp(at: datetime | None) -> str:
    """UTC, to the second: '2026-08-30 12:34:56'."""
    return "-" if at is None else at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def shown_status(job: Job, now: datetime) -> str:
    """The status a person reads: a pending job waiting for its run_at is 'scheduled'."""
    if job.status is JobStatus.PENDING and job.run_at > now:
        return "scheduled"
    return STATUS_LABELS[job.status]


def pretty(value: Any) -> str:
    """A decoded JSON value: on one line when short, else indented; cut at `PAYLOAD_SHOWN`
    characters."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    if len(text) > 72:
        text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    if len(text) > PAYLOAD_SHOWN:
        return text[:PAYLOAD_SHOWN] + f"\n… ({len(text) - PAYLOAD_SHOWN:,} more characters)"
    return text


def first_line(text: str | None, limit: int = 120) -> str:
    """The first line of an error, cut to `limit` characters."""
    if not text:
        return ""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"
