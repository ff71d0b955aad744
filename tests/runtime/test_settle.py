"""The settle statement on its own: which settlements it writes (those whose claim still
holds), what it answers, and a batch's outcomes and delays sent once or per job."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from venturi import PostgresStore, Queue, Task
from venturi._records import ClaimedJob, Settlement

from .helpers import claim


@dataclass
class Chore(Task):
    KIND = "chore"
    n: int


async def claimed(store: PostgresStore, n: int) -> list[ClaimedJob]:
    """`n` new jobs, claimed."""
    await Queue(store).enqueue_many(Chore(i) for i in range(n))
    return await claim(store, n, kinds=["chore"])


async def rows(store: PostgresStore, jobs: list[ClaimedJob]) -> list[tuple[str, int, float]]:
    """(status, failures, seconds until run_at) of each job, in order."""
    found = await store._pool_or_raise().fetch(
        f"SELECT id, status, failures, extract(epoch FROM run_at - now())::float8 AS in_s "
        f"FROM {store.prefix}_jobs WHERE id = ANY($1::uuid[])",
        [j.id for j in jobs],
    )
    by_id = {r["id"]: (r["status"], r["failures"], r["in_s"]) for r in found}
    return [by_id[j.id] for j in jobs]


async def test_a_settle_writes_and_answers_only_the_claims_that_still_hold(
    store: PostgresStore,
) -> None:
    jobs = await claimed(store, 4)
    # Jobs 1 and 3 were recovered and claimed again elsewhere: their tokens changed.
    await store._pool_or_raise().execute(
        f"UPDATE {store.prefix}_jobs SET claim_token = gen_random_uuid() WHERE id = ANY($1)",
        [jobs[1].id, jobs[3].id],
    )
    owned = await store.settle([Settlement.of(j, "completed") for j in jobs], worker="w")
    assert owned == {jobs[0].id, jobs[2].id}
    assert [r[0] for r in await rows(store, jobs)] == ["completed", "claimed"] * 2
    # Nothing held: an empty answer, and nothing written.
    lost = [jobs[1], jobs[3]]
    assert await store.settle([Settlement.of(j, "completed") for j in lost], worker="w") == set()
    assert [r[0] for r in await rows(store, lost)] == ["claimed", "claimed"]
    # Every claim held (the usual batch): all of them.
    more = await claimed(store, 3)
    owned = await store.settle([Settlement.of(j, "completed") for j in more], worker="w")
    assert owned == {j.id for j in more}
    assert await store.settle([], worker="w") == set()


async def test_each_settlement_of_a_mixed_batch_gets_its_own_outcome_and_delay(
    store: PostgresStore,
) -> None:
    jobs = await claimed(store, 4)
    owned = await store.settle(
        [
            Settlement.of(jobs[0], "completed"),
            Settlement.of(jobs[1], "paused", delay_s=3600.0),
            Settlement.of(jobs[2], "failed", delay_s=0.0, note="boom"),
            Settlement.of(jobs[3], "dead", note="for good", hook_token=uuid.uuid4()),
        ],
        worker="w",
    )
    assert owned == {j.id for j in jobs}
    (done, _, _), paused, failed, (dead, dead_failures, _) = await rows(store, jobs)
    assert done == "completed" and (dead, dead_failures) == ("dead", 1)
    assert paused[:2] == ("pending", 0) and 3500 < paused[2] <= 3600
    assert failed[:2] == ("pending", 1) and failed[2] <= 0
    journal = await store._pool_or_raise().fetch(
        f"SELECT job_id, outcome FROM {store.prefix}_journal WHERE job_id = ANY($1::uuid[])",
        [j.id for j in jobs],
    )
    assert {r["job_id"]: r["outcome"] for r in journal} == {
        jobs[0].id: "completed",
        jobs[1].id: "paused",
        jobs[2].id: "failed",
        jobs[3].id: "dead",
    }


async def test_a_batch_of_one_outcome_with_delays_sends_each_delay(store: PostgresStore) -> None:
    jobs = await claimed(store, 3)
    delays = [0.0, 600.0, 1200.0]
    settlements = [Settlement.of(j, "paused", delay_s=d) for j, d in zip(jobs, delays, strict=True)]
    assert await store.settle(settlements, worker="w") == {j.id for j in jobs}
    waits = [in_s for _, _, in_s in await rows(store, jobs)]
    assert waits[0] <= 0 and 500 < waits[1] <= 600 and 1100 < waits[2] <= 1200
