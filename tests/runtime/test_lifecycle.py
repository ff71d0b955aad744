"""The job lifecycle against a real PostgreSQL: outcomes, carry, journal, backoff, backstop,
delays and wake-ups."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from venturi import (
    Backoff,
    Context,
    DedupKey,
    JobStatus,
    JournalOutcome,
    Outcome,
    PanicPolicy,
    PayloadError,
    PostgresStore,
    Queue,
    Task,
    TaskError,
    Worker,
    _executor,
    _runner,
)
from venturi._producer import Producer

from .helpers import Claims, running, until, until_status


@dataclass
class Job(Task):
    KIND = "job"
    n: int = 0


@dataclass
class Progress:
    steps: list[int] = field(default_factory=list)


@dataclass
class Stepper(Task[Progress]):
    KIND = "stepper"
    total: int


def fast_worker(store: PostgresStore, **kwargs: object) -> Worker[None]:
    options: dict[str, object] = {"backoff": Backoff(0.01, 0.05), "poll_max": 5.0}
    options.update(kwargs)
    return Worker(None, store, **options)  # type: ignore[arg-type]


async def test_completed_with_note(queue: Queue) -> None:
    async def handle(task: Job, ctx: Context[None], app: None) -> Outcome:
        return Outcome.completed(note=f"did {task.n}")

    worker = fast_worker(queue.store)
    worker.register(Job, handle)
    job_id = await queue.enqueue(Job(n=7))
    async with running(worker):
        await until_status(queue, job_id, JobStatus.COMPLETED)
    job = await queue.job(job_id)
    assert job is not None
    assert job.finished_at is not None and job.run_count == 1 and job.failures == 0
    [entry] = await queue.job_journal(job_id)
    assert entry.outcome is JournalOutcome.COMPLETED and entry.note == "did 7"
    assert entry.run == 1 and not entry.is_failure
    assert entry.duration is not None and entry.duration >= 0
    assert entry.worker == str(worker.identity)


async def test_returning_none_completes(queue: Queue) -> None:
    async def handle(task: Job, ctx: Context[None], app: None) -> None:
        return None

    worker = fast_worker(queue.store)
    worker.register(Job, handle)
    job_id = await queue.enqueue(Job())
    async with running(worker):
        await until_status(queue, job_id, JobStatus.COMPLETED)


async def test_pause_carries_state_and_is_not_a_failure(queue: Queue) -> None:
    seen: list[tuple[int, list[int], int]] = []

    async def handle(task: Stepper, ctx: Context[Progress], app: None) -> Outcome:
        seen.append((ctx.run_count, list(ctx.carry.steps), len(ctx.history)))
        ctx.carry.steps.append(ctx.run_count)
        ctx.attach({"step": ctx.run_count})
        if len(ctx.carry.steps) < task.total:
            return Outcome.pause_in(0, note="checkpoint")
        return Outcome.completed()

    worker = fast_worker(queue.store, backstop=1)  # a pause must never trip the backstop
    worker.register(Stepper, handle)
    job_id = await queue.enqueue(Stepper(total=3))
    async with running(worker):
        await until_status(queue, job_id, JobStatus.COMPLETED)
    assert seen == [(1, [], 0), (2, [1], 1), (3, [1, 2], 2)]
    journal = await queue.job_journal(job_id)
    assert [e.outcome for e in journal] == ["paused", "paused", "completed"]
    assert [e.attachment for e in journal] == [{"step": 1}, {"step": 2}, {"step": 3}]
    assert [e.note for e in journal][:2] == ["checkpoint", "checkpoint"]
    job = await queue.job(job_id)
    assert job is not None and job.failures == 0 and job.run_count == 3


async def test_pause_in_delays_the_next_run(queue: Queue) -> None:
    runs: list[int] = []

    async def handle(task: Job, ctx: Context[None], app: None) -> Outcome:
        runs.append(ctx.run_count)
        return Outcome.pause_in(3600) if ctx.run_count == 1 else Outcome.completed()

    worker = fast_worker(queue.store)
    worker.register(Job, handle)
    job_id = await queue.enqueue(Job())
    async with running(worker):
        await until_status(queue, job_id, JobStatus.PENDING)
        await until_journal(queue, job_id, 1)
    job = await queue.job(job_id)
    assert job is not None and job.status is JobStatus.PENDING
    assert job.run_at - job.created_at > timedelta(minutes=59)
    assert runs == [1]


async def until_journal(queue: Queue, job_id: object, n: int) -> None:
    from .helpers import until

    async def check() -> bool:
        return len(await queue.job_journal(job_id)) >= n  # type: ignore[arg-type]

    await until(check)


async def test_retry_carries_state_and_records_failures(queue: Queue) -> None:
    seen: list[tuple[int, list[int], list[bool]]] = []

    async def handle(task: Stepper, ctx: Context[Progress], app: None) -> Outcome:
        seen.append((ctx.run_count, list(ctx.carry.steps), [e.is_failure for e in ctx.history]))
        ctx.carry.steps.append(ctx.run_count)
        if ctx.run_count < 3:
            raise RuntimeError(f"boom {ctx.run_count}")
        return Outcome.completed()

    worker = fast_worker(queue.store)
    worker.register(Stepper, handle)
    job_id = await queue.enqueue(Stepper(total=0))
    async with running(worker):
        await until_status(queue, job_id, JobStatus.COMPLETED)
    assert seen == [(1, [], []), (2, [1], [True]), (3, [1, 2], [True, True])]
    journal = await queue.job_journal(job_id)
    assert [e.outcome for e in journal] == ["failed", "failed", "completed"]
    assert journal[0].note == "RuntimeError: boom 1"
    job = await queue.job(job_id)
    assert job is not None and job.failures == 2 and job.last_error == "RuntimeError: boom 2"


@dataclass
class Cursor:
    page: int = 0
    score: float = 0.0


@dataclass
class Paged(Task[Cursor]):
    KIND = "paged"
    mode: str


async def test_a_carry_that_cannot_be_stored_is_never_stored(
    queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    """A carry that does not fit its type (a str page) or that JSON cannot hold (NaN) is
    refused where it is saved, naming the carry's field: a pause becomes a failed run, a
    failed run says its carry was not saved (and warns); the next run starts from the carry
    stored before, and the job is not sent dead by a carry it could not decode."""
    seen: list[tuple[str, int, Cursor]] = []

    async def handle(task: Paged, ctx: Context[Cursor], app: None) -> Outcome:
        seen.append((task.mode, ctx.run_count, Cursor(ctx.carry.page, ctx.carry.score)))
        if ctx.run_count == 1:
            ctx.carry.page = 5  # stored: a good carry, saved by this pause
            return Outcome.pause_in(0)
        if ctx.run_count == 2:
            if task.mode == "wrong type":
                ctx.carry.page = "next-token"  # type: ignore[assignment]
                return Outcome.pause_in(0)
            ctx.carry.page, ctx.carry.score = 6, float("nan")
            raise TaskError.retryable("upstream timeout")
        return Outcome.completed()

    worker = fast_worker(queue.store)
    worker.register(Paged, handle)
    wrong = await queue.enqueue(Paged("wrong type"))
    nan = await queue.enqueue(Paged("nan"))
    async with running(worker):
        await until_status(queue, wrong, JobStatus.COMPLETED)
        await until_status(queue, nan, JobStatus.COMPLETED)
    for mode in ("wrong type", "nan"):  # run 3 starts from run 1's carry
        assert [(r, c) for m, r, c in seen if m == mode] == [
            (1, Cursor()),
            (2, Cursor(5)),
            (3, Cursor(5)),
        ]
    [_, refused, _] = await queue.job_journal(wrong)
    assert refused.outcome == "failed" and refused.note is not None
    assert refused.note.startswith("PayloadError: cannot encode carry of Cursor (paged): ")
    assert "Expected `int`, got `str` - at `$.page`" in refused.note
    [_, failed, _] = await queue.job_journal(nan)
    assert failed.note is not None
    assert failed.note.startswith("upstream timeout; its carry was not saved: cannot encode ")
    assert "field 'score' is nan" in failed.note
    assert any(
        "carry was not saved" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records
    )


async def test_a_stored_carry_that_does_not_decode_is_named_as_the_carry(
    queue: Queue,
) -> None:
    job_id = await queue.enqueue(Paged("stored"))
    await queue.store._pool_or_raise().execute(
        f'UPDATE {queue.store.prefix}_jobs SET carry = \'{{"page": "x"}}\' WHERE id = $1',
        job_id.to_uuid(),
    )

    async def handle(task: Paged, ctx: Context[Cursor], app: None) -> Outcome:
        return Outcome.completed()

    worker = fast_worker(queue.store)
    worker.register(Paged, handle)
    async with running(worker):
        await until_status(queue, job_id, JobStatus.DEAD)
    job = await queue.job(job_id)
    assert job is not None and job.last_error == (
        "undecodable carry for kind 'paged': Expected `int`, got `str` - at `$.page`"
    )


@dataclass
class Transfer(Task):
    KIND = "transfer"
    amount: int

    def __post_init__(self) -> None:
        if self.amount <= 0:  # as an `assert` would (pytest rewrites those in test modules)
            raise AssertionError("amount must be positive")


async def test_a_payload_its_own_class_refuses_sends_the_job_dead_at_once(queue: Queue) -> None:
    """Whatever decoding raises (here the task class's own check, an AssertionError), the job
    is dead at once with that error, not left claimed until its lease and recovered as if its
    worker had died."""
    changed = Transfer(amount=5)
    changed.amount = -1  # after the check: the enqueue checks again, as a worker will
    with pytest.raises(PayloadError, match="AssertionError: amount must be positive"):
        await queue.enqueue(changed)
    job_id = await queue.enqueue(Transfer(amount=5))
    await queue.store._pool_or_raise().execute(
        f"UPDATE {queue.store.prefix}_jobs SET payload = '{{\"amount\": -1}}' WHERE id = $1",
        job_id.to_uuid(),
    )

    async def handle(task: Transfer, ctx: Context[None], app: None) -> Outcome:
        return Outcome.completed()

    worker = fast_worker(queue.store, lease=600.0)  # a job left claimed would sit for 10 min
    worker.register(Transfer, handle)
    async with running(worker):
        await until_status(queue, job_id, JobStatus.DEAD)
    job = await queue.job(job_id)
    assert job is not None and job.run_count == 1
    assert job.last_error == (
        "undecodable payload for kind 'transfer': AssertionError: amount must be positive"
    )


async def test_a_run_venturi_itself_fails_is_a_failed_run_not_a_lost_claim(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in venturi's own run of a job (simulated: `execute` raising) must not leave the
    job claimed, unsettled, until its lease: it is recorded as a failed run, and retried."""
    calls = 0
    real = _executor.execute

    async def broken(*args: object, **kwargs: object) -> object:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug")
        return await real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_runner, "execute", broken)

    async def handle(task: Job, ctx: Context[None], app: None) -> Outcome:
        return Outcome.completed()

    worker = fast_worker(queue.store, lease=600.0)
    worker.register(Job, handle)
    job_id = await queue.enqueue(Job())
    async with running(worker):
        await until_status(queue, job_id, JobStatus.COMPLETED)
    journal = await queue.job_journal(job_id)
    assert [(e.outcome, e.note) for e in journal] == [
        ("failed", "venturi failed running the job: RuntimeError: a bug"),
        ("completed", None),
    ]


async def test_task_error_retryable_then_permanent(queue: Queue) -> None:
    async def handle(task: Job, ctx: Context[None], app: None) -> Outcome:
        if ctx.run_count == 1:
            raise TaskError.retryable("not yet")
        raise TaskError.permanent("resource gone")

    worker = fast_worker(queue.store)
    worker.register(Job, handle)
    job_id = await queue.enqueue(Job())
    async with running(worker):
        await until_status(queue, job_id, JobStatus.DEAD)
    journal = await queue.job_journal(job_id)
    assert [(e.outcome, e.note) for e in journal] == [
        ("failed", "not yet"),
        ("dead", "resource gone"),
    ]
    job = await queue.job(job_id)
    assert job is not None and job.run_count == 2 and job.failures == 2


async def test_backstop_sends_to_dead(queue: Queue) -> None:
    async def handle(task: Job, ctx: Context[None], app: None) -> Outcome:
        raise ValueError("always")

    worker = fast_worker(queue.store, backstop=3, backoff=Backoff(0, 0))
    worker.register(Job, handle)
    job_id = await queue.enqueue(Job())
    async with running(worker):
        await until_status(queue, job_id, JobStatus.DEAD)
    journal = await queue.job_journal(job_id)
    assert [e.outcome for e in journal] == ["failed", "failed", "dead"]
    assert journal[-1].note is not None and "backstop reached after 3" in journal[-1].note


async def test_backstop_none_never_gives_up_by_itself(queue: Queue) -> None:
    async def handle(task: Job, ctx: Context[None], app: None) -> Outcome:
        if ctx.run_count < 30:
            raise ValueError("again")
        return Outcome.completed()

    worker = fast_worker(queue.store, backstop=None, backoff=Backoff(0, 0))
    worker.register(Job, handle)
    job_id = await queue.enqueue(Job())
    async with running(worker):
        await until_status(queue, job_id, JobStatus.COMPLETED)
    job = await queue.job(job_id)
    assert job is not None and job.failures == 29


async def test_panic_policy_dead(queue: Queue) -> None:
    async def handle(task: Job, ctx: Context[None], app: None) -> Outcome:
        raise KeyError("bug")

    worker = fast_worker(queue.store, panic_policy=PanicPolicy.DEAD)
    worker.register(Job, handle)
    job_id = await queue.enqueue(Job())
    async with running(worker):
        await until_status(queue, job_id, JobStatus.DEAD)
    [entry] = await queue.job_journal(job_id)
    assert entry.outcome is JournalOutcome.DEAD and entry.note == "KeyError: 'bug'"


async def test_retry_delay_follows_the_backoff_curve(queue: Queue) -> None:
    """The third failure waits base * (fib(3) - 1) = 1 base unit (no jitter)."""

    async def handle(task: Job, ctx: Context[None], app: None) -> Outcome:
        raise ValueError("fail")

    worker = Worker(None, queue.store, backoff=Backoff(3600, 7200), jitter_fraction=0.0, poll_max=5)
    worker.register(Job, handle)
    job_id = await queue.enqueue(Job())
    async with running(worker):
        # Failures 1 and 2 retry at once (multiplier 0); failure 3 waits one hour.
        await until_journal(queue, job_id, 3)
    job = await queue.job(job_id)
    journal = await queue.job_journal(job_id)
    assert job is not None and job.status is JobStatus.PENDING and job.failures == 3
    wait = job.run_at - journal[-1].at
    assert timedelta(minutes=59) < wait <= timedelta(hours=1, seconds=1)


async def test_task_backoff_override_is_stored_at_enqueue(queue: Queue) -> None:
    @dataclass
    class Slow(Task):
        KIND = "slow_backoff"

        def backoff(self) -> Backoff:
            return Backoff(7200, 7200)

    async def handle(task: Slow, ctx: Context[None], app: None) -> Outcome:
        raise ValueError("fail")

    worker = Worker(None, queue.store, backoff=Backoff(0, 0), jitter_fraction=0.0, poll_max=5)
    worker.register(Slow, handle)
    job_id = await queue.enqueue(Slow())
    async with running(worker):
        await until_journal(queue, job_id, 3)
    job = await queue.job(job_id)
    assert job is not None and job.run_at - job.created_at > timedelta(hours=1)


async def test_delayed_job_starts_when_due_not_at_poll(queue: Queue) -> None:
    started = asyncio.Event()
    start_times: list[datetime] = []

    async def handle(task: Job, ctx: Context[None], app: None) -> Outcome:
        start_times.append(datetime.now(UTC))
        started.set()
        return Outcome.completed()

    worker = fast_worker(queue.store, poll_max=60)  # a poll would be far too late
    worker.register(Job, handle)
    async with running(worker):
        job_id = await queue.enqueue_in(Job(), 0.5)
        await asyncio.wait_for(started.wait(), timeout=10)
    job = await queue.job(job_id)
    assert job is not None
    # Started at (or just after) its run_at, by the database clock, not before.
    lateness = (start_times[0] - job.run_at).total_seconds()
    assert -0.05 < lateness < 5


async def test_enqueue_at_in_the_future_waits(queue: Queue) -> None:
    async def handle(task: Job, ctx: Context[None], app: None) -> Outcome:
        return Outcome.completed()

    worker = fast_worker(queue.store)
    worker.register(Job, handle)
    later = await queue.enqueue_at(Job(n=1), datetime.now(UTC) + timedelta(hours=1))
    now = await queue.enqueue(Job(n=2))
    async with running(worker):
        await until_status(queue, now, JobStatus.COMPLETED)
    job = await queue.job(later)
    assert job is not None and job.status is JobStatus.PENDING and job.run_count == 0
    stats = await queue.stats()
    assert stats.scheduled_by_kind == {"job": 1} and stats.pending == 0


async def test_notify_wakes_an_idle_worker(queue: Queue) -> None:
    started = asyncio.Event()

    async def handle(task: Job, ctx: Context[None], app: None) -> Outcome:
        started.set()
        return Outcome.completed()

    worker = fast_worker(queue.store, poll_max=120)
    worker.register(Job, handle)
    async with running(worker):
        # The worker is idle until poll_max; only the NOTIFY can wake it in time.
        await queue.enqueue(Job())
        await asyncio.wait_for(started.wait(), timeout=10)


@dataclass
class Merged(Task):
    KIND = "merged"
    n: int = 0

    def dedup_key(self) -> DedupKey | None:
        return DedupKey("one")


def signalling_worker(store: PostgresStore, ran: asyncio.Event, **kwargs: object) -> Worker[None]:
    """A worker of Merged jobs that sets `ran` when one runs, idle until poll_max (120 s)
    unless something wakes it."""

    async def handle(task: Merged, ctx: Context[None], app: None) -> Outcome:
        ran.set()
        return Outcome.completed()

    worker = fast_worker(store, poll_max=120, **kwargs)
    worker.register(Merged, handle)
    return worker


@pytest.mark.parametrize("write", ["merge in the caller's transaction", "awaited mark"])
async def test_a_claim_that_skipped_a_locked_pending_job_is_woken_when_its_writer_commits(
    queue: Queue, pg_dsn: str, write: str
) -> None:
    """A claim skips the rows another transaction holds (SKIP LOCKED); a write that keeps the
    job pending wakes the worker at its commit, or the job would wait for poll_max."""
    ran = asyncio.Event()
    store = queue.store
    claims = Claims(store)
    job_id = await queue.enqueue(Merged(1))
    worker = signalling_worker(store, ran)
    conn = await asyncpg.connect(pg_dsn)
    stack = contextlib.AsyncExitStack()
    try:
        async with conn.transaction():
            # The pending job is written, and so locked, until this transaction commits.
            if write == "awaited mark":
                await conn.execute(
                    f"UPDATE {store.prefix}_jobs SET awaited = true WHERE id = $1",
                    job_id.to_uuid(),
                )
            else:
                assert await queue.enqueue(Merged(2), conn=conn) == job_id  # merged into it
            await stack.enter_async_context(running(worker))
            await claims.empty_one()  # the claim passed over the locked job
            assert not ran.is_set()
        # The worker sleeps until poll_max (120 s) unless this commit wakes it.
        await asyncio.wait_for(ran.wait(), timeout=20)
        await until_status(queue, job_id, JobStatus.COMPLETED)
    finally:
        await stack.aclose()
        await conn.close()


@pytest.mark.parametrize("unknown_kinds", ["wait", "fail"])  # its kinds; every kind
@pytest.mark.parametrize("hold", ["merge rolled back", "lock without a write"])
async def test_a_claim_that_skipped_a_locked_pending_job_claims_it_once_the_lock_goes(
    queue: Queue, pg_dsn: str, hold: str, unknown_kinds: str
) -> None:
    """A transaction that held a pending job's row and rolls back, or locked it without
    writing it, notifies nobody: the worker whose claim passed the job over claims again on
    its own (0.25 s after, backing off), not after poll_max (120 s here)."""
    ran = asyncio.Event()
    store = queue.store
    claims = Claims(store)
    job_id = await queue.enqueue(Merged(1))
    worker = signalling_worker(store, ran, unknown_kinds=unknown_kinds)
    conn = await asyncpg.connect(pg_dsn)
    stack = contextlib.AsyncExitStack()
    try:
        tx = conn.transaction()
        await tx.start()
        if hold == "merge rolled back":
            assert await queue.enqueue(Merged(2), conn=conn) == job_id  # merged into it
        else:
            await conn.execute(
                f"SELECT 1 FROM {store.prefix}_jobs WHERE id = $1 FOR UPDATE", job_id.to_uuid()
            )
        await stack.enter_async_context(running(worker))
        await claims.empty_one()  # the claim passed over the held job
        assert await claims.another() == []  # and claims again on its own: nothing was sent
        assert not ran.is_set()
        if hold == "merge rolled back":
            await tx.rollback()
        else:
            await tx.commit()
        await asyncio.wait_for(ran.wait(), timeout=20)
        await until_status(queue, job_id, JobStatus.COMPLETED)
        job = await queue.job(job_id)
        assert job is not None and job.run_count == 1
    finally:
        await stack.aclose()
        await conn.close()


async def test_a_paused_queue_s_due_jobs_are_not_claimed_again_and_again(queue: Queue) -> None:
    """A paused queue's due jobs are not jobs a claim passed over: its worker makes one
    claim and waits for the resume (or a notification, or poll_max), not a backoff."""
    store = queue.store
    claims = Claims(store)
    await queue.enqueue(Merged(1))
    await queue.pause("default")
    worker = fast_worker(store, poll_max=120)

    async def handle(task: Merged, ctx: Context[None], app: None) -> Outcome:
        return Outcome.completed()

    worker.register(Merged, handle)
    async with running(worker):
        await claims.empty_one()
        assert await claims.made_within(0.8) == 0  # the paused job is not taken for a held one


async def test_a_job_s_claim_and_settle_send_no_wake_up_of_their_own(
    queue: Queue, pg_dsn: str
) -> None:
    """The trigger that wakes workers on writes to a pending job stays off the hot path: a
    job enqueued, claimed and completed is announced once, by its enqueue."""
    heard: list[str] = []
    sentinel = asyncio.Event()

    def on_notify(_c: object, _pid: int, _channel: str, payload: object) -> None:
        assert isinstance(payload, str)
        if payload == "test-sentinel":
            sentinel.set()
        elif not payload.startswith("!"):  # lease and queue notices are not wake-ups
            heard.append(payload)

    async def handle(task: Job, ctx: Context[None], app: None) -> Outcome:
        return Outcome.completed()

    listener = await asyncpg.connect(pg_dsn)
    await listener.add_listener(queue.store.channel, on_notify)
    try:
        worker = fast_worker(queue.store)
        worker.register(Job, handle)
        async with running(worker):
            job_id = await queue.enqueue(Job(n=1))
            await until_status(queue, job_id, JobStatus.COMPLETED)
        # Notifications arrive in commit order: once this one is here, the others are too.
        await listener.execute("SELECT pg_notify($1, 'test-sentinel')", queue.store.channel)
        await asyncio.wait_for(sentinel.wait(), timeout=20)
    finally:
        await listener.close()
    assert heard == ["job"]


async def test_a_full_worker_that_is_notified_waits_for_a_slot_without_spinning(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A notification that arrives while every slot is taken must not wake the claim loop
    again and again until one frees (it once did: a core spent per full, notified worker)."""
    started, gate, notified = asyncio.Event(), asyncio.Event(), asyncio.Event()
    rounds = 0
    depth, told = Producer._prefetch_depth, Producer.notified

    def counted_depth(self: Producer) -> int:  # read once per round of the claim loop
        nonlocal rounds
        rounds += 1
        return depth(self)

    def observed_notified(self: Producer, kind: str) -> None:
        told(self, kind)
        if kind == "job":
            notified.set()

    monkeypatch.setattr(Producer, "_prefetch_depth", counted_depth)
    monkeypatch.setattr(Producer, "notified", observed_notified)

    async def handle(task: Job, ctx: Context[None], app: None) -> Outcome:
        started.set()
        await gate.wait()
        return Outcome.completed()

    worker = fast_worker(queue.store, concurrency=1, poll_max=120)
    worker.register(Job, handle)
    first = await queue.enqueue(Job(n=1))
    async with running(worker):
        await asyncio.wait_for(started.wait(), timeout=20)
        # The claim loop is parked: it ended its round before the handler's task could run.
        before = rounds
        second = await queue.enqueue(Job(n=2))  # notifies the full worker
        await asyncio.wait_for(notified.wait(), timeout=20)
        for _ in range(200):  # let the event loop run everything that is ready, many times
            await asyncio.sleep(0)
        # Nothing but a freed slot ends a full worker's wait.
        assert rounds == before, f"{rounds - before} claim-loop rounds while full"
        gate.set()  # the freed slot claims the second job
        await until_status(queue, second, JobStatus.COMPLETED)
        await until_status(queue, first, JobStatus.COMPLETED)


async def test_enqueue_many_is_one_batch(queue: Queue) -> None:
    done: list[int] = []

    async def handle(task: Job, ctx: Context[None], app: None) -> Outcome:
        done.append(task.n)
        return Outcome.completed()

    ids = await queue.enqueue_many(Job(n=i) for i in range(500))
    assert len(ids) == len(set(ids)) == 500
    assert ids == sorted(ids)  # ULIDs are time-ordered
    worker = fast_worker(queue.store, concurrency=8)
    worker.register(Job, handle)
    async with running(worker):
        await until_status(queue, ids[-1], JobStatus.COMPLETED)

        async def all_done() -> bool:
            return (await queue.stats()).pending == 0

        from .helpers import until

        await until(all_done)
    assert sorted(done) == list(range(500))


async def test_handle_method_on_the_task(queue: Queue) -> None:
    calls: list[str] = []

    @dataclass
    class Greet(Task):
        KIND = "greet"
        name: str

        async def handle(self, ctx: Context[None], app: list[str]) -> Outcome:
            app.append(self.name)
            return Outcome.completed()

    worker: Worker[list[str]] = Worker(calls, queue.store)
    worker.register(Greet)
    job_id = await queue.enqueue(Greet(name="grace"))
    async with running(worker):
        await until_status(queue, job_id, JobStatus.COMPLETED)
    assert calls == ["grace"]


@pytest.mark.parametrize("priority_first", [True])
async def test_priority_orders_claims(queue: Queue, priority_first: bool) -> None:
    from venturi import Priority

    order: list[int] = []

    async def handle(task: Job, ctx: Context[None], app: None) -> Outcome:
        order.append(task.n)
        return Outcome.completed()

    await queue.enqueue(Job(n=1), priority=Priority.LOW)
    await queue.enqueue(Job(n=2))
    await queue.enqueue(Job(n=3), priority=Priority.HIGH)
    worker = fast_worker(queue.store, concurrency=1, priority_ratio=None)
    worker.register(Job, handle)
    async with running(worker):

        async def all_done() -> bool:
            return len(order) == 3

        from .helpers import until

        await until(all_done)
    assert order == [3, 2, 1]


async def test_a_shutdown_while_the_worker_waits_to_start_ends_it(
    store: PostgresStore, pg_dsn: str
) -> None:
    """The start-up check waits for a database that cannot answer yet (here: behind a lock on
    the record of migrations); a shutdown meanwhile ends `run()` at once, before anything
    started. It used to be seen only once the check was through, however long that took (a
    pod's SIGTERM ended in its SIGKILL)."""
    prefix = store.prefix
    locker = await asyncpg.connect(pg_dsn)
    try:
        async with locker.transaction():
            await locker.execute(f"LOCK TABLE {prefix}_migrations IN ACCESS EXCLUSIVE MODE")
            worker = fast_worker(store)
            worker.register(Job, never_run)
            shutdown = asyncio.Event()
            run = asyncio.create_task(worker.run(shutdown))

            async def the_check_waits() -> bool:
                return bool(
                    await store._pool_or_raise().fetchval(
                        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
                        f"AND wait_event_type = 'Lock' AND query LIKE '%{prefix}_migrations%'"
                    )
                )

            await until(the_check_waits)
            shutdown.set()
            await asyncio.wait_for(run, 30)  # while the lock is still held
            assert not worker.ready.is_set()
            # The same for a run bounded by max_time, without a shutdown event.
            bounded = fast_worker(store)
            bounded.register(Job, never_run)
            await asyncio.wait_for(bounded.run(max_time=0.2), 30)
            assert not bounded.ready.is_set()
    finally:
        await locker.close()


async def never_run(task: Job, ctx: Context[None], app: None) -> Outcome:
    raise AssertionError("no job was enqueued")
