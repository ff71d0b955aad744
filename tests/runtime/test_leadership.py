"""Leader election and the leader's maintenance services, in one process against the real
database: the lease's terms, one leader among several workers, a clean handover, the
registry's sweep, the retention cleaner (what it deletes, and what it keeps), custom
services, and bad settings (tests/faults/test_leader_kills.py kills leaders for real)."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import datetime, timedelta, tzinfo
from typing import cast

import asyncpg
import pytest
from ulid import ULID

from venturi import (
    Context,
    MaintenanceService,
    Outcome,
    PostgresStore,
    Queue,
    Retention,
    Task,
    Worker,
)
from venturi._maintenance import Maintainer
from venturi._maintenance.cleaner import RetentionCleaner
from venturi._outage import Outage

from .helpers import running, until
from .test_registry import silent_row


@dataclass
class Chore(Task):
    KIND = "leadership.chore"
    n: int = 0


async def done(task: Task, ctx: Context[None], app: None) -> Outcome:
    return Outcome.completed()


@pytest.fixture
async def pool(pg_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=2)
    try:
        yield pool
    finally:
        await pool.close()


def make_worker(store: PostgresStore, **kwargs: object) -> Worker[None]:
    worker = Worker(None, store, concurrency=2, **kwargs)  # type: ignore[arg-type]
    worker.register(Chore, done)
    return worker


# -- the lease ------------------------------------------------------------------------------


async def test_the_lease_has_terms_that_only_grow(store: PostgresStore, pool: asyncpg.Pool) -> None:
    lead = store.leadership
    first = await lead.attempt(worker="a", term=None, ttl_s=30)
    assert first.term == 1
    other = await lead.attempt(worker="b", term=None, ttl_s=30)
    assert other.term is None and other.expires_in_s is not None and 0 < other.expires_in_s <= 30
    assert (await lead.attempt(worker="a", term=1, ttl_s=30)).term == 1  # a renewal
    # The lease lapses: b takes it under a new term; a's renewal of term 1 is refused.
    await pool.execute(f"UPDATE {store.prefix}_leader SET expires_at = now()")
    assert (await lead.attempt(worker="b", term=None, ttl_s=30)).term == 2
    assert (await lead.attempt(worker="a", term=1, ttl_s=30)).term is None
    # A resignation ends the lease at once, and the next leader's term counts on.
    await lead.resign(worker="b", term=2)
    lease = await lead.lease()
    assert lease is not None and lease.leader == "b" and not lease.valid
    assert (await lead.attempt(worker="a", term=None, ttl_s=30)).term == 3
    # A leader whose own lease lapsed gets a new term, even with no one in between.
    await pool.execute(f"UPDATE {store.prefix}_leader SET expires_at = now()")
    assert (await lead.attempt(worker="a", term=3, ttl_s=30)).term == 4


# -- one leader among the workers -------------------------------------------------------------


async def test_one_of_several_workers_leads_and_a_clean_exit_hands_over(
    store: PostgresStore, queue: Queue
) -> None:
    workers = [make_worker(store) for _ in range(3)]
    async with AsyncExitStack() as stack:
        stops = [await stack.enter_async_context(running(w)) for w in workers]

        async def one_leads() -> bool:
            return sum(w.leads for w in workers) == 1

        await until(one_leads)
        [leader] = [w for w in workers if w.leads]
        listed = {w.id: w.leader for w in await queue.workers()}
        assert listed == {str(w.identity): w is leader for w in workers}
        lease = await store.leadership.lease()
        assert lease is not None and lease.leader == str(leader.identity)
        first_term = lease.term

        stops[workers.index(leader)].set()  # a clean exit resigns the lease

        async def another_leads() -> bool:
            lease = await store.leadership.lease()
            return lease is not None and lease.valid and lease.leader != str(leader.identity)

        await until(another_leads)
        lease = await store.leadership.lease()
        assert lease is not None and lease.term > first_term
        await until(one_leads)
        assert not leader.leads


@dataclass
class Counting:
    """A custom service: counts its runs, optionally failing the first ones."""

    name: str = "counting"
    interval: float = 0.05
    fail_first: int = 0
    runs: int = 0
    ran: asyncio.Event = field(default_factory=asyncio.Event)

    async def run_once(self, store: PostgresStore) -> None:
        self.runs += 1
        if self.runs <= self.fail_first:
            raise RuntimeError(f"bad run {self.runs}")
        if self.runs > self.fail_first + 2:
            self.ran.set()


async def test_custom_services_run_in_the_leader_only_and_survive_their_own_errors(
    store: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    services = [Counting(fail_first=2), Counting()]
    workers = [make_worker(store, maintenance=[s]) for s in services]
    assert isinstance(services[0], MaintenanceService)
    async with AsyncExitStack() as stack:
        for w in workers:
            await stack.enter_async_context(running(w))
        with caplog.at_level(logging.ERROR, logger="venturi.worker"):
            leader_service = await _first_to_run(services)
        assert not services[1 - services.index(leader_service)].runs, "the follower ran it"
        assert workers[services.index(leader_service)].leads
    if leader_service.fail_first:
        failures = [r for r in caplog.records if "maintenance service 'counting'" in r.message]
        assert len(failures) == 2 and all(r.exc_info for r in failures)


@dataclass
class SlowToUnwind:
    """A service caught in a statement at shutdown, whose cancellation takes a while to
    unwind (as a statement being cancelled on the server does)."""

    name: str = "slow-to-unwind"
    interval: float = 60.0
    inside: asyncio.Event = field(default_factory=asyncio.Event)
    unwound: bool = False

    async def run_once(self, store: PostgresStore) -> None:
        self.inside.set()
        try:
            await asyncio.Event().wait()  # never set: only the shutdown ends this run
        finally:
            await asyncio.sleep(0.2)
            self.unwound = True


async def test_a_stopping_leader_waits_for_its_services_to_unwind(store: PostgresStore) -> None:
    """The worker returns only after every service task has ended, so none holds a pool
    connection when the caller closes the store."""
    service = SlowToUnwind()
    async with running(make_worker(store, maintenance=[service])):
        await asyncio.wait_for(service.inside.wait(), 30)
    assert service.unwound


async def _first_to_run(services: list[Counting]) -> Counting:
    waits = {asyncio.ensure_future(s.ran.wait()): s for s in services}
    done, pending = await asyncio.wait(waits, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    for w in pending:
        w.cancel()
    assert done, "no service ran"
    return waits[done.pop()]


async def test_the_leader_sweeps_silent_workers(
    store: PostgresStore, queue: Queue, pool: asyncpg.Pool
) -> None:
    worker = make_worker(store)
    async with running(worker):
        await silent_row(pool, store.prefix, "gone:1#dead", ["leadership.chore"])

        async def swept() -> bool:
            return [w.id for w in await queue.workers()] == [str(worker.identity)]

        await until(swept)
        assert worker.leads


# -- retention -----------------------------------------------------------------------------


async def finished_jobs(queue: Queue, pool: asyncpg.Pool) -> dict[str, ULID]:
    """Jobs in every state, finished ones backdated, each with a journal row: name -> id."""
    prefix = queue.store.prefix
    ids = {n: await queue.enqueue(Chore()) for n in ("old_done", "new_done", "old_dead", "pending")}
    for name, status, age in (
        ("old_done", "completed", timedelta(days=8)),
        ("new_done", "completed", timedelta(0)),
        ("old_dead", "dead", timedelta(days=8)),
    ):
        await pool.execute(
            f"UPDATE {prefix}_jobs SET status = $2, run_count = 1, "
            f"finished_at = now() - $3::interval, created_at = now() - interval '9 days' "
            f"WHERE id = $1",
            ids[name].to_uuid(),
            status,
            age,
        )
        await pool.execute(
            f"INSERT INTO {prefix}_journal (job_id, run, outcome) VALUES ($1, 1, $2)",
            ids[name].to_uuid(),
            status,
        )
    return ids


async def remaining(pool: asyncpg.Pool, prefix: str) -> tuple[set[str], set[str]]:
    """Ids of the jobs left, and of the jobs with journal rows left."""
    jobs = {str(r["id"]) for r in await pool.fetch(f"SELECT id FROM {prefix}_jobs")}
    journal = {str(r["job_id"]) for r in await pool.fetch(f"SELECT job_id FROM {prefix}_journal")}
    return jobs, journal


async def test_the_cleaner_deletes_what_retention_names_and_nothing_else(
    queue: Queue, pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    store = queue.store
    ids = await finished_jobs(queue, pool)
    uuids = {n: str(i.to_uuid()) for n, i in ids.items()}
    jobs, journal = await remaining(pool, store.prefix)
    assert jobs == set(uuids.values())
    assert {uuids["old_done"], uuids["old_dead"]} <= journal

    await RetentionCleaner(Retention()).run_once(store)  # the default keeps everything
    assert (await remaining(pool, store.prefix))[0] == set(uuids.values())

    with caplog.at_level(logging.INFO, logger="venturi.worker"):
        await RetentionCleaner(Retention(completed=timedelta(days=7), batch_size=1)).run_once(store)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("retention")]
    assert said == ["retention: deleted 1 completed jobs finished more than 7 days ago"]
    jobs, journal = await remaining(pool, store.prefix)
    assert jobs == {uuids["new_done"], uuids["old_dead"], uuids["pending"]}
    assert uuids["old_done"] not in journal and uuids["old_dead"] in journal

    await RetentionCleaner(Retention(dead=timedelta(days=7))).run_once(store)
    jobs, journal = await remaining(pool, store.prefix)
    assert jobs == {uuids["new_done"], uuids["pending"]}
    assert uuids["old_dead"] not in journal


async def test_the_cleaner_measures_ages_on_the_database_clock(
    queue: Queue, pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leader whose host clock runs an hour ahead must not delete jobs that finished a
    minute ago under a 30-minute retention."""
    import venturi._maintenance.cleaner as cleaner

    class Skewed(datetime):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> Skewed:
            return cast(Skewed, datetime.now(tz) + timedelta(hours=1))

    # Whatever clock the cleaner's module might read: the host's, an hour ahead.
    monkeypatch.setattr(cleaner, "datetime", Skewed, raising=False)
    store = queue.store
    ids = await finished_jobs(queue, pool)
    await RetentionCleaner(Retention(completed=timedelta(minutes=30))).run_once(store)
    assert await queue.job(ids["new_done"]) is not None
    assert await queue.job(ids["old_done"]) is None


async def test_a_worker_with_retention_cleans_as_leader(queue: Queue, pool: asyncpg.Pool) -> None:
    store = queue.store
    ids = await finished_jobs(queue, pool)
    worker = make_worker(store, retention=Retention(completed=timedelta(days=7), interval=0.05))
    async with running(worker):

        async def cleaned() -> bool:
            return await queue.job(ids["old_done"]) is None

        await until(cleaned)
    for name in ("new_done", "old_dead", "pending"):
        assert await queue.job(ids[name]) is not None, name


# -- bad settings ----------------------------------------------------------------------------


@dataclass
class NoInterval:
    name: str = "bad"
    interval: float = 0.0

    async def run_once(self, store: PostgresStore) -> None:
        pass


def test_bad_maintenance_settings_are_clear_errors(store: PostgresStore) -> None:
    with pytest.raises(TypeError, match="maintenance: expected a list of services"):
        Worker(None, store, maintenance=Counting())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="is not a service"):
        Worker(None, store, maintenance=[object()])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=re.escape("service 'bad' has interval 0.0")):
        Worker(None, store, maintenance=[NoInterval()])
    with pytest.raises(ValueError, match="a name of its own, got"):
        Worker(None, store, maintenance=[Counting(), Counting()])
    with pytest.raises(ValueError, match="a name of its own"):
        Worker(None, store, maintenance=[Counting(name="worker-sweep")])
    with pytest.raises(TypeError, match=re.escape("retention: expected a venturi.Retention")):
        Worker(None, store, retention=timedelta(days=7))  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match=re.escape("Retention.completed: expected a duration from 1 s to 10 years")
    ):
        Retention(completed=0)
    with pytest.raises(TypeError, match=re.escape("Retention.dead: expected seconds")):
        Retention(dead="7d")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=re.escape("Retention.batch_size: expected an int >= 1")):
        Retention(completed=60, batch_size=0)


async def test_a_leader_past_its_deadline_starts_no_service_run(store: PostgresStore) -> None:
    """After the process was frozen past its deadline (a SIGSTOP, a paused VM), a service's
    timer may fire before the elector's: the run waits until the lease is renewed (or the
    term is deposed), so a frozen leader does not act beside the one elected meanwhile."""
    service = Counting()
    maintainer = Maintainer(store, [service], worker="frozen", outage=Outage("frozen"))
    loop = asyncio.get_running_loop()
    maintainer.elector.term = 1
    maintainer.elector.deadline = loop.time() - 1.0  # it woke up past its deadline
    serving = asyncio.create_task(maintainer._serve(service, 1))
    try:
        await asyncio.sleep(0.3)  # a bounded look: nothing must happen in it
        assert service.runs == 0
        maintainer.elector.deadline = loop.time() + 10.0  # the elector renewed the lease
        await asyncio.wait_for(service.ran.wait(), 10)
        assert service.runs >= 1
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)


async def test_a_worker_that_resigned_stands_for_no_term(store: PostgresStore) -> None:
    """A stopping worker resigns at the start of its shutdown and stays out of the election
    for its grace period: it took the lease when the leader stopped first, leading while it
    wound down."""
    elector = Maintainer(store, [], worker="stopping", outage=Outage("stopping")).elector
    await elector.resign()
    await asyncio.wait_for(elector.run(), 10)  # returns at once: no campaign
    lease = await store.leadership.lease()
    assert elector.term is None and (lease is None or lease.leader != "stopping")
