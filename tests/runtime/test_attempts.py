"""A task's attempts and its per-run timeout, against a real PostgreSQL: `max_attempts`
counts failed executions only (the worker's backstop stays the failsafe), a run longer than
its `timeout` is cancelled and recorded as a timeout, a handler that ignores the cancellation
keeps its slot and its job until it returns, and the lease outlasts the timeout."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from venturi import (
    Backoff,
    CancelReason,
    Context,
    JobStatus,
    JournalOutcome,
    Outcome,
    Queue,
    Task,
    TaskError,
    Worker,
    _executor,
)
from venturi.backoff import Seconds

from .helpers import WAIT_TIMEOUT, running, until_status


@dataclass
class Flaky(Task):
    KIND = "attempts.flaky"
    attempts: Any = None  # any value, for max_attempts() to check (an int field would refuse)
    pause_first: bool = False

    def max_attempts(self) -> int | None:
        attempts: int | None = self.attempts
        return attempts


@dataclass
class Slow(Task):
    KIND = "attempts.slow"
    seconds: float = 0.3
    attempts: int | None = 1
    lease_s: float | None = None

    def timeout(self) -> Seconds | None:
        return self.seconds

    def max_attempts(self) -> int | None:
        return self.attempts

    def lease(self) -> Seconds | None:
        return self.lease_s


@dataclass
class Plain(Task):
    KIND = "attempts.plain"


@dataclass
class Seen:
    attempts: list[tuple[int, int, int | None]] = field(default_factory=list)
    """(run_count, attempt, max_attempts) of each run."""
    reasons: list[CancelReason | None] = field(default_factory=list)


def worker_for(queue: Queue, seen: Seen, **settings: Any) -> Worker[None]:
    async def flaky(task: Flaky, ctx: Context[None], app: None) -> Outcome:
        seen.attempts.append((ctx.run_count, ctx.attempt, ctx.max_attempts))
        if task.pause_first and ctx.run_count % 2 == 1:
            return Outcome.pause_in(0)  # never an attempt
        raise TaskError.retryable("nope")

    async def slow(task: Slow, ctx: Context[None], app: None) -> Outcome:
        seen.attempts.append((ctx.run_count, ctx.attempt, ctx.max_attempts))
        if ctx.attempt > 1:
            return Outcome.completed()  # the retry is quick
        try:
            await asyncio.Event().wait()  # longer than any timeout
        finally:
            seen.reasons.append(ctx.cancel_reason)
        return Outcome.completed()

    settings.setdefault("backoff", Backoff(0, 0))
    worker = Worker(None, queue.store, **settings)
    worker.register(Flaky, flaky)
    worker.register(Slow, slow)
    return worker


async def test_max_attempts_counts_failed_executions(queue: Queue) -> None:
    seen = Seen()
    job_id = await queue.enqueue(Flaky(attempts=3))
    async with running(worker_for(queue, seen)):
        await until_status(queue, job_id, JobStatus.DEAD)
    job = await queue.job(job_id)
    assert job is not None and job.failures == 3 and job.run_count == 3
    assert seen.attempts == [(1, 1, 3), (2, 2, 3), (3, 3, 3)]
    journal = await queue.job_journal(job_id)
    assert [e.outcome for e in journal] == [
        JournalOutcome.FAILED,
        JournalOutcome.FAILED,
        JournalOutcome.DEAD,
    ]
    assert journal[-1].note == "max_attempts (3) reached; last: nope"


async def test_pauses_never_use_an_attempt(queue: Queue) -> None:
    seen = Seen()
    job_id = await queue.enqueue(Flaky(attempts=2, pause_first=True))
    async with running(worker_for(queue, seen)):
        await until_status(queue, job_id, JobStatus.DEAD)
    # Runs 1 and 3 paused; 2 and 4 failed: the second failure (run 4) ended the job.
    assert seen.attempts == [(1, 1, 2), (2, 1, 2), (3, 2, 2), (4, 2, 2)]
    job = await queue.job(job_id)
    assert job is not None and (job.failures, job.run_count) == (2, 4)


async def test_the_backstop_stays_the_failsafe(queue: Queue) -> None:
    """A task without max_attempts stops at the worker's backstop; one with more attempts
    than the backstop stops at the backstop too (the lower limit wins)."""
    seen = Seen()
    unset = await queue.enqueue(Flaky())
    higher = await queue.enqueue(Flaky(attempts=10))
    async with running(worker_for(queue, seen, backstop=2)):
        await until_status(queue, unset, JobStatus.DEAD)
        await until_status(queue, higher, JobStatus.DEAD)
    for job_id in (unset, higher):
        job = await queue.job(job_id)
        assert job is not None and job.failures == 2
        assert job.last_error == "backstop reached after 2 failed executions; last: nope"
    assert {m for _, _, m in seen.attempts} == {2}


async def test_a_lease_that_expires_uses_an_attempt(queue: Queue) -> None:
    """The worker holding the job died (its lease expired): a failed execution, and with
    max_attempts 1, the job's last."""
    job_id = await queue.enqueue(Flaky(attempts=1))
    (claimed,) = await queue.store.claim(
        queues=["default"], kinds=[Flaky.KIND], limit=1, worker="gone", pod=None,
        default_lease_s=0.5,
    )  # fmt: skip
    assert claimed.max_attempts == 1
    async with running(worker_for(queue, Seen())):
        await until_status(queue, job_id, JobStatus.DEAD)
    job = await queue.job(job_id)
    assert job is not None and job.failures == 1
    assert job.last_error == (
        "the worker stopped during the last attempt "
        "(lease expired while held by gone; max_attempts (1) reached)"
    )


async def test_a_run_longer_than_its_timeout_is_a_failed_execution(queue: Queue) -> None:
    seen = Seen()
    job_id = await queue.enqueue(Slow(seconds=0.3, attempts=1))
    async with running(worker_for(queue, seen)):
        await until_status(queue, job_id, JobStatus.DEAD)
    assert seen.reasons == [CancelReason.TIMEOUT]  # the handler was cancelled, and told why
    journal = await queue.job_journal(job_id)
    assert [e.outcome for e in journal] == [JournalOutcome.DEAD]
    assert journal[0].note == (
        "max_attempts (1) reached; last: timeout: the run took longer than its timeout of 0.3s"
    )
    assert journal[0].duration is not None and journal[0].duration >= 0.3


async def test_a_timed_out_run_is_retried_like_any_failure(queue: Queue) -> None:
    seen = Seen()
    job_id = await queue.enqueue(Slow(seconds=0.2, attempts=2))
    async with running(worker_for(queue, seen)):
        await until_status(queue, job_id, JobStatus.COMPLETED)
    assert seen.attempts == [(1, 1, 2), (2, 2, 2)]
    journal = await queue.job_journal(job_id)
    assert [e.outcome for e in journal] == [JournalOutcome.FAILED, JournalOutcome.COMPLETED]
    assert journal[0].note == "timeout: the run took longer than its timeout of 0.2s"


@dataclass
class Stubborn(Task):
    KIND = "attempts.stubborn"

    def timeout(self) -> Seconds | None:
        return 0.2

    def max_attempts(self) -> int | None:
        return 1


class Records(logging.Handler):
    def __init__(self, needle: str) -> None:
        super().__init__()
        self.needle = needle
        self.seen = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.needle in record.getMessage():
            self.seen.set()


async def test_a_handler_that_ignores_its_timeout_keeps_its_slot_and_its_job(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It is reported, its job stays claimed (never run twice at once) and its slot busy
    (concurrency 1: the next job waits) until it returns; then it is settled as a timeout."""
    monkeypatch.setattr(_executor, "STUCK_AFTER", 0.2)
    stuck = Records("ignored its timeout's cancellation")
    logging.getLogger("venturi._executor").addHandler(stuck)
    let_go = asyncio.Event()
    ran: list[str] = []

    async def stubborn(task: Stubborn, ctx: Context[None], app: None) -> Outcome:
        ran.append("stubborn")
        while not let_go.is_set():
            with contextlib.suppress(asyncio.CancelledError):  # ignores it
                await let_go.wait()
        return Outcome.completed()

    async def plain(task: Plain, ctx: Context[None], app: None) -> Outcome:
        ran.append("plain")
        return Outcome.completed()

    worker = Worker(None, queue.store, concurrency=1, prefetch=False, backoff=Backoff(0, 0))
    worker.register(Stubborn, stubborn)
    worker.register(Plain, plain)
    try:
        job_id = await queue.enqueue(Stubborn())
        async with running(worker):
            await until_status(queue, job_id, JobStatus.CLAIMED)
            other = await queue.enqueue(Plain())
            await asyncio.wait_for(stuck.seen.wait(), WAIT_TIMEOUT)
            job = await queue.job(job_id)
            assert job is not None and (job.status, job.run_count) == (JobStatus.CLAIMED, 1)
            assert (await queue.job(other)).status is JobStatus.PENDING  # type: ignore[union-attr]
            assert ran == ["stubborn"]
            let_go.set()
            await until_status(queue, other, JobStatus.COMPLETED)
        job = await queue.job(job_id)
        assert job is not None and (job.status, job.run_count) == (JobStatus.DEAD, 1)
        assert job.last_error == (
            "max_attempts (1) reached; last: timeout: the run took longer than its timeout "
            "of 0.2s (the handler ignored the cancellation)"
        )
        assert ran == ["stubborn", "plain"]
    finally:
        logging.getLogger("venturi._executor").removeHandler(stuck)


async def test_a_run_past_its_timeout_then_stopped_by_a_shutdown_counts_as_failed(
    queue: Queue,
) -> None:
    """The timeout fired, the handler ignored it, and then the worker shut down (a deploy, a
    scale-in): that run is a failed execution, its note the timeout. Recorded as a release,
    such a job never used an attempt and, redeployed often enough, never went dead."""
    timed_out, let_go = asyncio.Event(), asyncio.Event()

    async def stubborn(task: Stubborn, ctx: Context[None], app: None) -> Outcome:
        while not let_go.is_set():
            try:
                await let_go.wait()
            except asyncio.CancelledError:
                if ctx.cancel_reason is CancelReason.TIMEOUT:
                    timed_out.set()  # and goes on, ignoring it
        return Outcome.completed()

    worker = Worker(None, queue.store, concurrency=1, shutdown_timeout=0.2)
    worker._exits_with_run = True  # as `venturi worker`: the job is settled, not left claimed
    worker.register(Stubborn, stubborn)
    job_id = await queue.enqueue(Stubborn())
    try:
        async with running(worker):
            await asyncio.wait_for(timed_out.wait(), WAIT_TIMEOUT)
    finally:
        let_go.set()  # the abandoned handler may end now
    job = await queue.job(job_id)
    assert job is not None and (job.status, job.failures) == (JobStatus.DEAD, 1)
    [entry] = await queue.job_journal(job_id)
    assert entry.outcome == "dead" and entry.note is not None
    assert "timeout: the run took longer than its timeout of 0.2s" in entry.note


async def test_the_lease_of_a_job_with_a_timeout_outlasts_it(queue: Queue) -> None:
    store = queue.store
    short_lease = await queue.enqueue(Slow(seconds=120, lease_s=1))  # lease < timeout
    default_lease = await queue.enqueue(Slow(seconds=600))  # the worker's lease < timeout
    long_lease = await queue.enqueue(Slow(seconds=10, lease_s=3600))  # already long enough
    no_timeout = await queue.enqueue(Plain())
    claimed = await store.claim(
        queues=["default"], kinds=[Slow.KIND, Plain.KIND], limit=10, worker="w", pod=None,
        default_lease_s=300,
    )  # fmt: skip
    leases = {c.id: c.lease_s for c in claimed}
    assert leases == {
        short_lease.to_uuid(): 180,
        default_lease.to_uuid(): 660,
        long_lease.to_uuid(): 3600,
        no_timeout.to_uuid(): 300,
    }
    for job_id, lease in ((short_lease, 180), (default_lease, 660)):
        job = await queue.job(job_id)
        assert job is not None and job.lease_until is not None and job.claimed_at is not None
        assert job.lease_until - job.claimed_at == timedelta(seconds=lease)
    # Renewal extends by the same lease: the renewer uses what the claim returned.
    assert {c.timeout_s for c in claimed} == {120, 600, 10, None}


@pytest.mark.parametrize(
    ("attempts", "error", "message"),
    [
        (0, ValueError, r"Flaky.max_attempts\(\): expected an int from 1 .* got 0"),
        (-3, ValueError, r"max_attempts\(\): expected an int from 1 .* got -3"),
        (True, TypeError, r"max_attempts\(\): expected an int from 1 .* got True"),
        (2.5, TypeError, r"max_attempts\(\): expected an int from 1 .* got 2.5"),
        (2**31, ValueError, r"max_attempts\(\): expected an int from 1 to 2,147,483,647"),
    ],
)
async def test_a_bad_attempt_count_is_a_clear_error(
    queue: Queue, attempts: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        await queue.enqueue(Flaky(attempts=attempts))
    with pytest.raises(error, match=message):
        await queue.enqueue_many([Plain(), Flaky(attempts=attempts)])
    assert await queue.jobs() == []


@dataclass
class Timed(Task):
    KIND = "attempts.timed"
    seconds: str  # parsed by timeout(): a NaN payload field would fail the encoding first

    def timeout(self) -> Seconds | None:
        return float(self.seconds)


@pytest.mark.parametrize(
    ("seconds", "message"),
    [
        ("0", r"Timed.timeout\(\): expected a duration from 0.001 s to 29 days, got 0"),
        ("-1", r"timeout\(\): expected a duration .* got -1"),
        ("nan", r"timeout\(\): expected a duration .* got nan"),
        ("inf", r"timeout\(\): expected a duration .* got inf"),
        ("2592000", r"timeout\(\): expected a duration from 0.001 s to 29 days"),
    ],
)
async def test_a_bad_timeout_is_a_clear_error(queue: Queue, seconds: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        await queue.enqueue(Timed(seconds))
    with pytest.raises(ValueError, match=message):
        await queue.enqueue_many([Plain(), Timed(seconds)])
    assert await queue.jobs() == []


async def test_without_limits_the_context_shows_the_backstop(queue: Queue) -> None:
    ran: list[tuple[int, int | None]] = []

    async def plain(task: Plain, ctx: Context[None], app: None) -> Outcome:
        ran.append((ctx.attempt, ctx.max_attempts))
        return Outcome.completed()

    for backstop, expected in ((25, (1, 25)), (None, (1, None))):
        ran.clear()
        job_id = await queue.enqueue(Plain())
        worker = Worker(None, queue.store, backstop=backstop)
        worker.register(Plain, plain)
        async with running(worker):
            await until_status(queue, job_id, JobStatus.COMPLETED)
        assert ran == [expected]


@dataclass
class Fetch(Task):
    """A payload with fields named like the policy methods (mypy says they shadow them): at
    run time they stay payload."""

    KIND = "attempts.fetch"
    url: str
    timeout: float  # type: ignore[assignment]
    max_attempts: int = 0  # type: ignore[assignment]


async def test_fields_named_like_the_policies_stay_payload(queue: Queue) -> None:
    ids = [await queue.enqueue(Fetch("https://example.com", 5.0))]
    ids += await queue.enqueue_many([Fetch("https://example.com", 0.0, max_attempts=-1)] * 2)
    claimed = await queue.store.claim(
        queues=["default"], kinds=[Fetch.KIND], limit=5, worker="w", pod=None,
        default_lease_s=300,
    )  # fmt: skip
    assert {(c.timeout_s, c.max_attempts, c.lease_s) for c in claimed} == {(None, None, 300)}
    job = await queue.job(ids[0])
    assert job is not None and job.payload["timeout"] == 5.0
