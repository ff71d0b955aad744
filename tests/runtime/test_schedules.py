"""Periodic tasks: the pure tick logic (cron with time zones and DST, intervals, missed ticks,
overlap), and against the real PostgreSQL, each tick enqueued exactly once by several
workers racing, missed ticks after downtime, the overlap policy and the listing."""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from venturi import (
    Context,
    JobStatus,
    Missed,
    Overlap,
    PostgresStore,
    Queue,
    Schedule,
    Task,
    Worker,
)
from venturi.schedules import decide

from .helpers import running, until

RIGA = ZoneInfo("Europe/Riga")


@dataclass
class Tick(Task):
    KIND = "tick"
    at: str = ""

    async def handle(self, ctx: Context[None], app: None) -> None:
        return None


def riga(y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0) -> datetime:
    return datetime(y, mo, d, h, mi, s, tzinfo=RIGA).astimezone(UTC)


def utc(y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0) -> datetime:
    return datetime(y, mo, d, h, mi, s, tzinfo=UTC)


# -- pure ---------------------------------------------------------------------------------


def test_cron_ticks_follow_the_time_zone_across_dst() -> None:
    daily = Schedule("daily", Tick(), cron="30 3 * * *", tz="Europe/Riga")
    # Spring forward (29 March 2026, 03:00 -> 04:00): 03:30 does not exist, it runs at 04:00.
    assert daily.next_tick(riga(2026, 3, 29, 0, 0)) == riga(2026, 3, 29, 4, 0)
    assert daily.next_tick(riga(2026, 3, 29, 4, 0)) == riga(2026, 3, 30, 3, 30)
    # Fall back (25 October 2026, 04:00 -> 03:00): 03:30 happens twice and runs once.
    first = daily.next_tick(riga(2026, 10, 25, 0, 0))
    assert first == utc(2026, 10, 25, 0, 30)  # 03:30 at +03:00
    assert daily.next_tick(first) == utc(2026, 10, 26, 1, 30)  # next day, 03:30 at +02:00
    utc_daily = Schedule("utc", Tick(), cron="30 3 * * *")
    assert utc_daily.next_tick(utc(2026, 3, 29, 0, 0)) == utc(2026, 3, 29, 3, 30)


def test_interval_ticks_align_to_the_epoch() -> None:
    every = Schedule("five", Tick(), every=timedelta(minutes=5))
    assert every.next_tick(utc(2026, 1, 1, 10, 2, 7)) == utc(2026, 1, 1, 10, 5)
    assert every.next_tick(utc(2026, 1, 1, 10, 5)) == utc(2026, 1, 1, 10, 10)
    assert every.latest_tick(utc(2026, 1, 1, 10, 9, 59)) == utc(2026, 1, 1, 10, 5)


def test_a_tick_runs_once_and_missed_ticks_follow_the_policy() -> None:
    minute = timedelta(minutes=1)
    strict = timedelta(seconds=10)
    last = utc(2026, 1, 1, 10, 0)
    on_time = decide(
        Schedule("a", Tick(), every=minute), last_tick=last, now=utc(2026, 1, 1, 10, 1, 2),
        previous_running=False,
    )  # fmt: skip
    assert (on_time.enqueue, on_time.skipped, on_time.next_tick) == (
        utc(2026, 1, 1, 10, 1), 0, utc(2026, 1, 1, 10, 2),
    )  # fmt: skip
    early = decide(
        Schedule("a", Tick(), every=minute), last_tick=last, now=utc(2026, 1, 1, 10, 0, 59),
        previous_running=False,
    )  # fmt: skip
    assert (early.enqueue, early.last_tick, early.skipped) == (None, last, 0)

    back = utc(2026, 1, 1, 10, 10, 30)  # after downtime: 10:01 .. 10:10 passed, 10:10 30 s ago
    within = decide(
        Schedule("a", Tick(), every=minute), last_tick=last, now=back, previous_running=False
    )
    assert (within.enqueue, within.skipped) == (utc(2026, 1, 1, 10, 10), 9)
    skip = decide(
        Schedule("a", Tick(), every=minute, late_after=strict), last_tick=last, now=back,
        previous_running=False,
    )  # fmt: skip
    assert (skip.enqueue, skip.skipped, skip.last_tick) == (None, 10, utc(2026, 1, 1, 10, 10))
    once = decide(
        Schedule("a", Tick(), every=minute, late_after=strict, missed=Missed.RUN_ONCE),
        last_tick=last, now=back, previous_running=False,
    )  # fmt: skip
    assert (once.enqueue, once.skipped) == (utc(2026, 1, 1, 10, 10), 9)
    cron = decide(
        Schedule("c", Tick(), cron="0 * * * *", missed="run_once"),
        last_tick=utc(2026, 1, 1, 0, 0), now=utc(2026, 1, 2, 5, 30), previous_running=False,
    )  # fmt: skip
    assert (cron.enqueue, cron.skipped) == (utc(2026, 1, 2, 5, 0), 28)


def test_overlap_skip_passes_a_tick_while_the_previous_run_is_going() -> None:
    kw = {"every": timedelta(minutes=1), "overlap": Overlap.SKIP}
    last, now = utc(2026, 1, 1, 10, 0), utc(2026, 1, 1, 10, 1, 1)
    busy = decide(Schedule("o", Tick(), **kw), last_tick=last, now=now, previous_running=True)  # type: ignore[arg-type]
    assert (busy.enqueue, busy.skipped, busy.last_tick) == (None, 1, utc(2026, 1, 1, 10, 1))
    free = decide(Schedule("o", Tick(), **kw), last_tick=last, now=now, previous_running=False)  # type: ignore[arg-type]
    assert free.enqueue == utc(2026, 1, 1, 10, 1)
    allow = decide(
        Schedule("o", Tick(), every=timedelta(minutes=1)), last_tick=last, now=now,
        previous_running=True,
    )  # fmt: skip
    assert allow.enqueue == utc(2026, 1, 1, 10, 1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cron": "61 * * * *"}, "invalid cron expression '61 * * * *'"),
        # A sixth field would be read as seconds, first: a daily 3:00 run every hour at :03.
        ({"cron": "0 3 * * * *"}, "'0 3 * * * *': expected 5 fields"),
        ({"cron": "0 3 * * * *"}, "@daily, @midnight, @hourly, got 6 fields"),
        ({"cron": "@reboot"}, "'@reboot': expected 5 fields"),
        ({"every": timedelta(days=1), "tz": "Europe/Riga"}, "tz= applies to cron= schedules"),
        ({"cron": "* * * * *", "every": timedelta(minutes=1)}, "exactly one of cron= and every="),
        ({}, "exactly one of cron= and every="),
        ({"every": timedelta(milliseconds=10)}, "at least 1 second"),
        ({"cron": "* * * * *", "tz": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
        (
            {"every": timedelta(minutes=1), "missed": "sometimes"},
            "Schedule 'bad': missed= must be one of 'skip', 'run_once', got 'sometimes'",
        ),
        ({"every": timedelta(minutes=1), "overlap": "no"}, "Schedule 'bad': overlap= must be"),
        ({"every": timedelta(minutes=1), "late_after": timedelta(0)}, "late_after"),
    ],
)
def test_a_bad_schedule_is_refused_with_what_is_wrong(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace("*", r"\*")):
        Schedule("bad", Tick(), **kwargs)  # type: ignore[arg-type]


def test_cron_shorthands_are_debian_crons() -> None:
    assert Schedule("h", Tick(), cron="@hourly").cron == "0 * * * *"
    assert (
        Schedule("d", Tick(), cron="@DAILY", tz="Europe/Riga").spec == "cron 0 0 * * * Europe/Riga"
    )
    assert Schedule("w", Tick(), cron="@weekly").cron == "0 0 * * 0"


def test_a_bad_name_or_task_is_refused() -> None:
    with pytest.raises(ValueError, match="Schedule name 'a b'"):
        Schedule("a b", Tick(), every=timedelta(minutes=1))
    with pytest.raises(TypeError, match="task must be a Task"):
        Schedule("x", "Tick", every=timedelta(minutes=1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="the name 'x' is used twice"):
        Worker(None, None, schedules=[  # type: ignore[arg-type]
            Schedule("x", Tick(), every=timedelta(minutes=1)),
            Schedule("x", Tick(), every=timedelta(minutes=2)),
        ])  # fmt: skip


def test_a_bad_queue_is_refused_where_the_schedule_is_made() -> None:
    with pytest.raises(ValueError, match="Schedule 'x': queue: invalid queue name 'bad name!'"):
        Schedule("x", Tick(), every=timedelta(minutes=1), queue="bad name!")
    with pytest.raises(ValueError, match="invalid queue name ''"):
        Schedule("x", Tick(), every=timedelta(minutes=1), queue="")


# -- against the database ---------------------------------------------------------------------


async def ticks_of(queue: Queue) -> list[str]:
    return [j.payload["at"] for j in await queue.jobs() if j.kind == "tick"]


def stamped(tick: datetime) -> Tick:
    return Tick(at=tick.isoformat())


async def test_each_tick_is_enqueued_once_by_racing_workers(store: PostgresStore) -> None:
    every_second = Schedule("pulse", stamped, every=timedelta(seconds=1))
    workers = []
    for _ in range(3):
        worker: Worker[None] = Worker(None, store, concurrency=1, schedules=[every_second])
        worker.register(Tick, lambda task, ctx, app: asyncio.sleep(0))
        workers.append(worker)
    queue = Queue(store)
    async with running(workers[0]), running(workers[1]), running(workers[2]):
        await until(lambda: _count_at_least(queue, 4), limit=30)
    ticks = await ticks_of(queue)
    assert len(ticks) == len(set(ticks)) >= 4  # no tick twice
    seconds = sorted(datetime.fromisoformat(t) for t in ticks)
    assert all(b - a == timedelta(seconds=1) for a, b in itertools.pairwise(seconds))  # none lost
    (info,) = await queue.schedules()
    assert info.enqueued == len(ticks) and info.kind == "tick" and info.spec == "every 1s"


async def _count_at_least(queue: Queue, n: int) -> bool:
    return len(await ticks_of(queue)) >= n


async def test_ticks_missed_during_downtime_run_once_or_are_skipped(store: PostgresStore) -> None:
    # Hourly ticks (aligned to the epoch): with a tick every minute, a pass of the second
    # worker within `late_after` of a minute's start finds that tick on time (the skipper
    # enqueues it), and a minute starting during the test adds a tick: about one run in
    # sixty could fail.
    hour, soon = timedelta(hours=1), timedelta(seconds=1)
    schedules = [
        Schedule("catch-up", stamped, every=hour, missed=Missed.RUN_ONCE, late_after=soon),
        Schedule("skipper", Tick(at="skipper"), every=hour, late_after=soon),
    ]
    first: Worker[None] = Worker(None, store, concurrency=1, schedules=schedules)
    first.register(Tick)
    queue = Queue(store)
    async with running(first):
        await until(lambda: _declared(queue, 2))
    # Ten hours of downtime: the rows' last ticks as they were then.
    await store._pool_or_raise().execute(
        f"UPDATE {store.prefix}_schedules SET last_tick = last_tick - interval '10 hours', "
        "next_tick = now() - interval '9 hours'"
    )
    second: Worker[None] = Worker(None, store, concurrency=1, schedules=schedules)
    second.register(Tick)
    async with running(second):
        await until(lambda: _advanced(queue, 2))
    infos = {i.name: i for i in await queue.schedules()}
    assert infos["catch-up"].enqueued == 1 and infos["catch-up"].skipped >= 9
    assert infos["skipper"].enqueued == 0 and infos["skipper"].skipped >= 10
    payloads = [j.payload["at"] for j in await queue.jobs()]
    assert len(payloads) == 1 and payloads[0] != "skipper"


async def _declared(queue: Queue, n: int) -> bool:
    return len(await queue.schedules()) == n and all(
        i.next_tick > i.last_tick for i in await queue.schedules()
    )


async def _advanced(queue: Queue, n: int) -> bool:
    infos = await queue.schedules()
    return len(infos) == n and all(i.enqueued + i.skipped > 0 for i in infos)


async def test_overlap_skip_waits_for_the_previous_job(store: PostgresStore) -> None:
    release = asyncio.Event()

    async def slow(task: Tick, ctx: Context[None], app: None) -> None:
        await release.wait()

    schedule = Schedule("slow", stamped, every=timedelta(seconds=1), overlap=Overlap.SKIP)
    worker: Worker[None] = Worker(None, store, concurrency=2, schedules=[schedule])
    worker.register(Tick, slow)
    queue = Queue(store)
    async with running(worker):
        await until(lambda: _skipped_at_least(queue, 2), limit=30)
        assert len(await ticks_of(queue)) == 1  # the first run still holds the schedule
        release.set()
        await until(lambda: _count_at_least(queue, 2), limit=30)
    jobs = await queue.jobs()
    assert sum(j.status is JobStatus.COMPLETED for j in jobs) >= 1


async def _skipped_at_least(queue: Queue, n: int) -> bool:
    (info,) = await queue.schedules()
    return info.skipped >= n


async def test_a_schedule_whose_function_raises_skips_that_tick_and_the_worker_goes_on(
    store: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    calls = itertools.count()

    def flaky(tick: datetime) -> Tick:
        if next(calls) % 2 == 0:  # every other tick: the report's source is down, say
            raise RuntimeError("report source unavailable")
        return stamped(tick)

    schedule = Schedule("flaky", flaky, every=timedelta(seconds=1))
    worker: Worker[None] = Worker(None, store, concurrency=1, schedules=[schedule])
    worker.register(Tick, lambda task, ctx, app: asyncio.sleep(0))
    queue = Queue(store)
    async with running(worker):  # run() would end with the function's exception
        await until(lambda: _count_at_least(queue, 2), limit=30)
        await until(lambda: _skipped_at_least(queue, 2), limit=30)
    (info,) = await queue.schedules()
    assert info.enqueued >= 2 and info.skipped >= 2
    told = [
        r
        for r in caplog.records
        if "tick" in r.getMessage() and "skipped: making" in r.getMessage()
    ]
    assert told and told[0].exc_info is not None  # with the function's traceback
    assert "report source unavailable" in str(told[0].exc_info[1])


async def test_a_function_s_kind_is_kept_when_another_worker_declares_the_schedule(
    store: PostgresStore,
) -> None:
    schedule = Schedule("pulse", stamped, every=timedelta(seconds=1))
    first: Worker[None] = Worker(None, store, concurrency=1, schedules=[schedule])
    first.register(Tick, lambda task, ctx, app: asyncio.sleep(0))
    queue = Queue(store)
    async with running(first):
        await until(lambda: _count_at_least(queue, 1), limit=30)
    (info,) = await queue.schedules()
    assert info.kind == "tick"
    second: Worker[None] = Worker(None, store, concurrency=1, schedules=[schedule])
    second.register(Tick, lambda task, ctx, app: asyncio.sleep(0))
    async with running(second):  # declares the schedule again: its kind is not known yet
        (info,) = await queue.schedules()
        assert info.kind == "tick"


async def test_venturi_schedules_lists_the_next_run(store: PostgresStore, pg_dsn: str) -> None:
    schedule = Schedule("nightly", Tick(), cron="0 3 * * *", tz="Europe/Riga")
    worker: Worker[None] = Worker(None, store, concurrency=1, schedules=[schedule])
    worker.register(Tick)
    queue = Queue(store)
    async with running(worker):
        await until(lambda: _declared(queue, 1))
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "venturi", "schedules", "--json", "--dsn", pg_dsn,
         "--prefix", store.prefix],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    assert row["name"] == "nightly" and row["spec"] == "cron 0 3 * * * Europe/Riga"
    assert row["last_tick"] is None  # not ticked yet: its start is not a tick
    assert row["kind"] == "tick"
    next_run = datetime.fromisoformat(row["next_tick"]).astimezone(RIGA)
    assert (next_run.hour, next_run.minute) == (3, 0)
    assert next_run - datetime.now(RIGA) <= timedelta(days=1)
    text = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "venturi", "schedules", "--dsn", pg_dsn, "--prefix", store.prefix],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    header, line = text.stdout.splitlines()
    assert header.split() == [
        "NAME", "SPEC", "KIND", "NEXT", "RUN", "(UTC)", "LAST", "TICK", "ENQUEUED", "SKIPPED",
        "SEEN", "BY",
    ]  # fmt: skip
    # No tick has run yet: no last tick to show; the worker that declared it saw it.
    assert line.split()[-4:] == ["-", "0", "0", str(worker.identity)]
