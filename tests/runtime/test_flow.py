"""`venturi.flow`: the lock and rate-window statements against the real PostgreSQL, the
middleware in one worker, and the clear errors for bad arguments. (Several processes:
tests/faults/test_flow.py.)"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from venturi import Context, JobStatus, Outcome, PostgresStore, Queue, Task, Worker
from venturi._records import ClaimedJob, Settlement
from venturi.flow import rate_limited, without_overlapping

from .helpers import running, until, until_status


@dataclass
class Keyed(Task):
    KIND = "flow.keyed"
    key: str


async def claim(store: PostgresStore, n: int) -> list[ClaimedJob]:
    return await store.claim(
        queues=["default"], kinds=[Keyed.KIND], limit=n, worker="w", pod=None, default_lease_s=60
    )


async def test_a_key_is_free_once_its_holders_claim_ends(store: PostgresStore) -> None:
    queue = Queue(store)
    await queue.enqueue_many([Keyed("k"), Keyed("k")])
    a, b = await claim(store, 2)
    assert await store.lock_take("k", a.id, a.claim_token) is None
    assert await store.lock_take("k", a.id, a.claim_token) is None  # the holder's own run
    assert await store.lock_take("k", b.id, b.claim_token) == a.id
    assert await store.lock_take("other", b.id, b.claim_token) is None
    # No release: settling alone ends the claim (clears its token), which frees the key.
    assert await store.settle([Settlement.of(a, "completed")], worker="w") == {a.id}
    assert await store.lock_take("k", b.id, b.claim_token) is None
    assert await store.lock_take("k", a.id, a.claim_token) == b.id
    await store.lock_release("k", a.id, a.claim_token)  # not the holder: a no-op
    assert await store.lock_take("k", a.id, a.claim_token) == b.id
    await store.lock_release("k", b.id, b.claim_token)
    assert await store.lock_take("k", a.id, a.claim_token) is None


async def test_a_rate_window_takes_at_most_max_starts(store: PostgresStore) -> None:
    taken, reopens_in = await store.rate_take("k", 2, 3600)
    assert taken
    assert 0 < reopens_in <= 3600
    assert (await store.rate_take("k", 2, 3600))[0]
    taken, reopens_in = await store.rate_take("k", 2, 3600)
    assert not taken
    assert 0 < reopens_in <= 3600
    assert (await store.rate_take("other", 2, 3600))[0]  # keys count apart


@dataclass
class Shared(Task):
    KIND = "flow.shared"
    n: int


async def test_a_job_over_the_limit_waits_for_the_next_window(store: PostgresStore) -> None:
    queue = Queue(store)
    ran: list[int] = []

    async def handle(task: Shared, ctx: Context[None], app: Any) -> Outcome:
        ran.append(task.n)
        return Outcome.completed()

    worker: Worker[None] = Worker(None, store, concurrency=1)
    worker.register(Shared, handle, middleware=[rate_limited("api", 1, per=3600)])
    first = await queue.enqueue(Shared(1))
    second = await queue.enqueue(Shared(2))
    async with running(worker):
        await until_status(queue, first, JobStatus.COMPLETED)

        async def put_back() -> bool:
            return bool(await store.journal(second))

        await until(put_back)
        journal = await store.journal(second)
    assert ran == [1]
    (entry,) = journal
    assert entry.outcome == "paused"
    assert entry.note is not None and entry.note.startswith("rate limit 'api': 1 starts per 3600s")
    job = await queue.job(second)
    assert job is not None and job.failures == 0  # no attempt used


def test_bad_arguments_are_refused_with_clear_errors() -> None:
    with pytest.raises(ValueError, match="at least 1 s"):
        rate_limited("api", 10, per=0.5)
    with pytest.raises(ValueError, match=r"max\): expected an int >= 1"):
        rate_limited("api", 0, per=1)
    with pytest.raises(TypeError, match="expected a str or a function"):
        without_overlapping(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="1-1000 characters"):
        without_overlapping("")
    with pytest.raises(ValueError, match="release_after"):
        without_overlapping("k", release_after=-1)


async def test_flow_middleware_outside_a_worker_says_so() -> None:
    mw = without_overlapping("k")

    async def call_next() -> Outcome | None:
        return None

    with pytest.raises(RuntimeError, match="only as a worker's middleware"):
        await mw(Keyed("k"), None, call_next)  # type: ignore[arg-type]
