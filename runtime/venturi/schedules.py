"""Periodic tasks: schedules declared in code, each tick enqueued exactly once.

    Schedule("nightly-report", Report(), cron="0 3 * * *", tz="Europe/Riga")
    Schedule("sync-contacts", SyncContacts(), every=timedelta(minutes=5))

A worker given `schedules=[...]` runs them. Each schedule has a row in the database that
records its last tick; a tick is enqueued in the same transaction that moves the row past it,
with the row locked, so however many workers run the same schedules, each tick is enqueued
once (database time decides what is due). Cron expressions are parsed and stepped by cronsim
(time zones and DST as Debian's cron does: a time skipped by the spring change runs once right
after it, a time repeated in autumn runs once).

This module is pure: what a schedule is, and what is due when. `_scheduler` does the I/O.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ulid import ULID

from venturi._shown import shown
from venturi.task import Task, check_queue_name, kind_of

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,199}")


class Missed(enum.StrEnum):
    """What a schedule does with ticks that passed while nothing ran it (downtime)."""

    SKIP = "skip"
    """Drop them; only a tick found on time (within `late_after`) runs."""
    RUN_ONCE = "run_once"
    """Run once for all of them (the latest), however late."""


class Overlap(enum.StrEnum):
    """What a tick does while the previous tick's job has not finished."""

    ALLOW = "allow"
    """Enqueue anyway."""
    SKIP = "skip"
    """Skip this tick (counted as skipped)."""


@dataclass(frozen=True)
class Schedule:
    """A task enqueued on a cron expression (in a time zone) or at a fixed interval.

    `name` identifies the schedule across releases (its row in the database): rename it and
    the schedule starts afresh. `task` is enqueued as given at every tick, or, if it is a
    function, called with the tick (an aware UTC datetime) to make the task (a report for
    that day, say); on `queue` (None: the queue of the worker that runs the schedules).
    """

    name: str
    task: Task[Any] | Callable[[datetime], Task[Any]]
    cron: str | None = None
    every: timedelta | None = None
    tz: str = "UTC"
    missed: Missed | str = Missed.SKIP
    overlap: Overlap | str = Overlap.ALLOW
    late_after: timedelta = timedelta(minutes=1)
    """A tick found later than this after its time counts as missed."""
    queue: str | None = None
    _zone: ZoneInfo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        where = f"Schedule {self.name!r}"
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValueError(
                f"Schedule name {self.name!r}: expected 1-200 letters, digits and _ . : / -"
            )
        if isinstance(self.task, Task):
            kind_of(type(self.task))
        elif not callable(self.task):
            raise TypeError(
                f"{where}: task must be a Task, or a function of the tick returning one; "
                f"got {shown(self.task)}"
            )
        if self.queue is not None:
            check_queue_name(self.queue, setting=f"{where}: queue")
        if (self.cron is None) == (self.every is None):
            raise ValueError(f"{where}: give exactly one of cron= and every=")
        try:
            zone = ZoneInfo(self.tz)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise ValueError(f"{where}: unknown time zone {self.tz!r}") from None
        object.__setattr__(self, "_zone", zone)
        if self.cron is not None:
            object.__setattr__(self, "cron", _check_cron(where, self.cron))
        elif self.tz != "UTC":
            raise ValueError(
                f"{where}: tz= applies to cron= schedules only (every= ticks fall on multiples "
                "of the interval since the epoch, in no time zone)"
            )
        if self.every is not None:
            if not isinstance(self.every, timedelta) or self.every < timedelta(seconds=1):
                raise ValueError(f"{where}: every= must be a timedelta of at least 1 second")
            if self.every > timedelta(days=366):
                raise ValueError(f"{where}: every= must be at most 366 days")
        object.__setattr__(self, "missed", _choice(where, "missed", Missed, self.missed))
        object.__setattr__(self, "overlap", _choice(where, "overlap", Overlap, self.overlap))
        if not isinstance(self.late_after, timedelta) or self.late_after <= timedelta(0):
            raise ValueError(f"{where}: late_after must be a positive timedelta")

    def task_for(self, tick: datetime) -> Task[Any]:
        """The task to enqueue for `tick`."""
        if isinstance(self.task, Task):
            return self.task
        task = self.task(tick)
        if not isinstance(task, Task):
            raise TypeError(f"Schedule {self.name!r}: task({tick}) returned {shown(task)}")
        return task

    @property
    def spec(self) -> str:
        """The schedule as stored and listed: `cron 0 3 * * * Europe/Riga` or `every 300s`."""
        if self.cron is not None:
            return f"cron {self.cron} {self.tz}"
        assert self.every is not None
        return f"every {self.every.total_seconds():g}s"

    def next_tick(self, after: datetime) -> datetime:
        """The first tick strictly after `after` (aware), in UTC."""
        if after.tzinfo is None:
            raise ValueError("next_tick: `after` must be timezone-aware")
        if self.every is not None:
            n = math.floor(after.timestamp() / self._period) + 1  # ticks align to the epoch
            return datetime.fromtimestamp(n * self._period, UTC)
        return next(self._cron_from(after)).astimezone(UTC)

    def latest_tick(self, at: datetime) -> datetime:
        """The last tick at or before `at` (aware), in UTC."""
        if self.every is not None:
            n = math.floor(at.timestamp() / self._period)
            return datetime.fromtimestamp(n * self._period, UTC)
        return next(self._cron_from(at + _INSTANT, reverse=True)).astimezone(UTC)

    def ticks_between(self, first: datetime, last: datetime, limit: int = 10_000) -> int:
        """How many ticks lie in [first, last] (both ticks), counting at most `limit`."""
        if self.every is not None:
            return min(limit, round((last - first).total_seconds() / self._period) + 1)
        n, ticks = 1, self._cron_from(first)
        while n < limit and next(ticks).astimezone(UTC) <= last:
            n += 1
        return n

    @property
    def _period(self) -> float:
        assert self.every is not None
        return self.every.total_seconds()

    def _cron_from(self, at: datetime, *, reverse: bool = False) -> Iterator[datetime]:
        from cronsim import CronSim

        assert self.cron is not None
        it: Iterator[datetime] = CronSim(self.cron, at.astimezone(self._zone), reverse=reverse)
        return it


_INSTANT = timedelta(microseconds=1)


_E = TypeVar("_E", bound=enum.StrEnum)


def _choice(where: str, setting: str, choices: type[_E], value: str) -> _E:
    """`value` as one of `choices`, or a ValueError naming the setting and the choices."""
    try:
        return choices(value)
    except ValueError:
        names = ", ".join(repr(c.value) for c in choices)
        raise ValueError(f"{where}: {setting}= must be one of {names}, got {value!r}") from None


_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
"""Debian cron's shorthands (all but @reboot), as the five fields they stand for."""


def _check_cron(where: str, expr: str) -> str:
    """The expression as five fields (a shorthand expanded), or a ValueError naming what is
    wrong. Five fields only, as cron: cronsim would read a sixth as seconds, first, so a daily
    `0 3 * * *` with one field too many would run every hour."""
    try:
        from cronsim import CronSim, CronSimError
    except ImportError:
        raise ImportError(
            "cron schedules need the cronsim package: pip install venturi[schedules]"
        ) from None
    if not isinstance(expr, str):
        raise TypeError(f"{where}: cron= must be a string, got {shown(expr)}")
    fields = _ALIASES.get(expr.strip().lower(), expr).split()
    if len(fields) != 5:
        raise ValueError(
            f"{where}: invalid cron expression {expr!r}: expected 5 fields (minute, hour, day "
            f"of month, month, day of week) or one of {', '.join(_ALIASES)}, got "
            f"{len(fields)} field{'s' if len(fields) != 1 else ''}"
        )
    five = " ".join(fields)
    try:
        CronSim(five, datetime.now(UTC))
    except CronSimError as exc:
        raise ValueError(f"{where}: invalid cron expression {expr!r}: {exc}") from None
    return five


@dataclass(frozen=True, slots=True)
class Decision:
    """What one pass does for one schedule."""

    enqueue: datetime | None
    """The tick to enqueue a job for (None: none)."""
    last_tick: datetime
    """The schedule's last tick after this pass (every tick up to it is dealt with)."""
    skipped: int
    """Ticks passed over without a job (missed, or overlapping)."""
    next_tick: datetime


def decide(
    schedule: Schedule, *, last_tick: datetime, now: datetime, previous_running: bool
) -> Decision:
    """Pure: what to do with the ticks in (last_tick, now]. At most one job per pass: only
    the latest due tick can run; the earlier ones were missed."""
    first = schedule.next_tick(last_tick)
    if first > now:
        return Decision(None, last_tick, 0, first)
    latest = schedule.latest_tick(now)
    missed = schedule.ticks_between(first, latest) - 1
    following = schedule.next_tick(latest)
    late = now - latest > schedule.late_after
    if (schedule.missed is Missed.SKIP and late) or (
        schedule.overlap is Overlap.SKIP and previous_running
    ):
        return Decision(None, latest, missed + 1, following)
    return Decision(latest, latest, missed, following)


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """A schedule as recorded in the database (`Queue.schedules()`, `venturi schedules`)."""

    name: str
    spec: str
    kind: str
    """The KIND of its task (of the last worker that declared it); '' for a schedule whose
    task is a function, until its first tick."""
    last_tick: datetime
    """The last tick it passed (enqueued or skipped); before its first, when it was first
    recorded (its ticks count from there)."""
    next_tick: datetime
    last_job: ULID | None
    enqueued: int
    skipped: int
    seen_at: datetime
    """When a worker running it last declared or advanced it (a schedule removed from the
    code keeps its row, with an old `seen_at`)."""
    seen_by: str | None
