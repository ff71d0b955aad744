"""A claim's reply becomes `ClaimedJob`s by position, after its column names are checked:
every field must land where it belongs, from both claim statements."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from venturi import Backoff, PostgresStore, Priority, Queue, Task
from venturi._records import ClaimedJob
from venturi.postgres import CLAIM_COLUMNS

from .helpers import claim


@dataclass
class Tuned(Task):
    KIND = "tuned"
    n: int

    def lease(self) -> float:
        return 90.0

    def backoff(self) -> Backoff:
        return Backoff(base=2.0, cap=40.0)

    def max_attempts(self) -> int:
        return 7

    def timeout(self) -> float:
        return 25.0

    def priority(self) -> Priority:
        return Priority.HIGH


def test_claimed_job_s_fields_are_in_the_order_of_the_claim_s_columns() -> None:
    assert tuple(f.name for f in dataclasses.fields(ClaimedJob)) == CLAIM_COLUMNS


@pytest.mark.parametrize("pod", [None, "pod-a"], ids=["plain statement", "claim function"])
async def test_every_field_of_a_claimed_job_is_read_from_its_own_column(
    store: PostgresStore, pod: str | None
) -> None:
    queue = Queue(store, queue="tuned-q")
    batch_id = await queue.batch("b").add(Tuned(1)).enqueue()
    await store._pool_or_raise().execute(
        f"UPDATE {store.prefix}_jobs SET trace_context = 'tp', carry = '{{\"c\": 1}}'"
    )
    [job] = await claim(store, 5, queue="tuned-q", kinds=["tuned"], pod=pod, traced=True)
    assert (job.kind, job.queue, job.payload, job.carry) == (
        "tuned",
        "tuned-q",
        '{"n": 1}',
        '{"c": 1}',
    )
    assert (job.run_count, job.failures, job.lease_s) == (1, 0, 90.0)
    assert (job.backoff_base_s, job.backoff_cap_s, job.max_attempts, job.timeout_s) == (
        2.0,
        40.0,
        7,
        25.0,
    )
    assert 0 <= job.waited_s < 60 and job.history == ()
    assert (job.priority, job.reserved, job.trace_context) == (int(Priority.HIGH), False, "tp")
    assert job.batch_id is not None and job.batch_id.bytes == batch_id.bytes
    row = await store._pool_or_raise().fetchrow(
        f"SELECT id, claim_token FROM {store.prefix}_jobs WHERE kind = 'tuned'"
    )
    assert row is not None and (job.id, job.claim_token) == (row["id"], row["claim_token"])
