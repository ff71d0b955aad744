"""Scale-in fences (migration 0018): a fenced pod claims nothing; a fence waits for the claims
of its pod in flight, so a read of the pod's claims after it is the last word; fences expire.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import asyncpg
import pytest

from venturi import Context, Outcome, PostgresStore, Queue, Task, Worker
from venturi.identity import WorkerIdentity

from .helpers import until


@dataclass
class Chore(Task):
    KIND = "fence.chore"
    n: int


async def claim(store: PostgresStore, pod: str | None, limit: int = 10) -> list[str]:
    jobs = await store.claim(
        queues=["default"],
        kinds=[Chore.KIND],
        limit=limit,
        worker=f"{pod}/host:1#x",
        pod=pod,
        default_lease_s=60,
    )
    return [str(j.id) for j in jobs]


async def test_a_fenced_pod_claims_nothing_and_the_others_do(queue: Queue) -> None:
    await queue.enqueue_many(Chore(i) for i in range(4))
    await queue.fence_pods(["worker-a"])
    assert await queue.fenced_pods() == ["worker-a"]
    assert await claim(queue.store, "worker-a") == []
    assert len(await claim(queue.store, "worker-b", limit=1)) == 1
    assert len(await claim(queue.store, None, limit=1)) == 1  # outside Kubernetes: no pod
    await queue.unfence_pods(["worker-a"])
    assert await queue.fenced_pods() == []
    assert len(await claim(queue.store, "worker-a")) == 2
    assert await queue.claimed_by_pod() == {"worker-a": 2, "worker-b": 1}


async def test_a_fence_waits_for_the_claims_of_its_pod_in_flight(queue: Queue, pg_dsn: str) -> None:
    """The race a fence closes: a claim that began before the fence and commits after it. The
    fence returns only once that claim has committed, so the operator's read of the pod's
    claims right after the fence counts it; and any claim after the fence gets nothing."""
    prefix = queue.store.prefix
    await queue.enqueue_many(Chore(i) for i in range(3))
    conn = await asyncpg.connect(pg_dsn)
    try:
        tx = conn.transaction()
        await tx.start()
        rows = await conn.fetch(
            f"SELECT id FROM {prefix}_claim_v7(ARRAY['default'], ARRAY['{Chore.KIND}'], "
            "ARRAY[]::text[], 1, 0, 0, 'worker-a/host:1#x', 'worker-a', 60, NULL, 'x')"
        )
        assert len(rows) == 1  # claimed, not committed
        fence = asyncio.create_task(queue.fence_pods(["worker-a"]))
        waiting = await asyncio.wait_for(_lock_waits(queue, "worker-a"), 30)
        assert waiting and not fence.done()
        # Another pod is not held up by the fence of this one.
        assert len(await claim(queue.store, "worker-b", limit=1)) == 1
        await tx.commit()
        await asyncio.wait_for(fence, 30)
    finally:
        await conn.close()
    assert await queue.claimed_by_pod() == {"worker-a": 1, "worker-b": 1}
    assert await claim(queue.store, "worker-a") == []


async def test_a_claim_behind_a_fence_in_flight_sees_it(queue: Queue, pg_dsn: str) -> None:
    """The other order: a claim that starts while a fence is being written waits for it, and
    then (its next statement a new snapshot) claims nothing, though a job is pending."""
    await queue.enqueue(Chore(1))
    fence = queue.store._q["fences_set"]
    conn = await asyncpg.connect(pg_dsn)
    try:
        tx = conn.transaction()
        await tx.start()
        await conn.execute(fence.text, *fence.args({"pods": ["worker-a"], "ttl_s": 60.0}))
        claiming = asyncio.create_task(claim(queue.store, "worker-a"))
        assert await asyncio.wait_for(_lock_waits(queue, "worker-a"), 30)
        assert not claiming.done()
        await tx.commit()
        assert await asyncio.wait_for(claiming, 30) == []
    finally:
        await conn.close()
    assert (await queue.stats()).pending_by_kind == {Chore.KIND: 1}


async def _lock_waits(queue: Queue, pod: str) -> bool:
    """Wait until a backend waits for the fence lock (the fence, blocked by the claim)."""

    async def blocked() -> bool:
        n = await queue.store._pool_or_raise().fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND objid = hashtext($1)::oid",
            pod,
        )
        return bool(n)

    await until(blocked)
    return True


async def test_an_expired_fence_holds_nothing_back_and_is_forgotten(queue: Queue) -> None:
    prefix, pool = queue.store.prefix, queue.store._pool_or_raise()
    await queue.enqueue(Chore(1))
    await queue.fence_pods(["worker-a", "worker-c"], ttl=60)
    await pool.execute(
        f"UPDATE {prefix}_fences SET until = now() - interval '1 s' WHERE pod = 'worker-a'"
    )
    assert await queue.fenced_pods() == ["worker-c"]
    assert len(await claim(queue.store, "worker-a")) == 1
    await queue.unfence_pods([])  # forgets what expired, lifts nothing else
    rows = await pool.fetch(f"SELECT pod FROM {prefix}_fences ORDER BY pod")
    assert [r["pod"] for r in rows] == ["worker-c"]


async def test_fencing_again_moves_the_until_and_duplicates_are_one_fence(queue: Queue) -> None:
    prefix, pool = queue.store.prefix, queue.store._pool_or_raise()
    await queue.fence_pods(["worker-a", "worker-a"], ttl=5)
    first = await pool.fetchval(f"SELECT until FROM {prefix}_fences")
    await queue.fence_pods(["worker-a"], ttl=600)
    rows = await pool.fetch(f"SELECT until FROM {prefix}_fences")
    assert len(rows) == 1 and rows[0]["until"] > first


async def test_a_worker_in_a_fenced_pod_takes_no_job(queue: Queue) -> None:
    """End to end: a worker of a fenced pod finds nothing to claim (a `once` run ends at its
    first claim with nothing run); lifted, the same pod's next worker runs every job."""
    ran: list[int] = []

    async def chore(task: Chore, ctx: Context[None], app: None) -> Outcome:
        ran.append(task.n)
        return Outcome.completed()

    def pod_worker() -> Worker[None]:
        worker = Worker(None, queue.store, identity=WorkerIdentity("host", 1, "worker-a"))
        worker.register(Chore, chore)
        return worker

    await queue.enqueue_many(Chore(i) for i in range(3))
    await queue.fence_pods(["worker-a"])
    await asyncio.wait_for(pod_worker().run(once=True), 60)
    assert ran == []
    assert (await queue.stats()).pending_by_kind == {Chore.KIND: 3}
    await queue.unfence_pods(["worker-a"])
    await asyncio.wait_for(pod_worker().run(once=True), 60)
    assert sorted(ran) == [0, 1, 2]


async def test_bad_pod_names_are_clear_errors(queue: Queue) -> None:
    with pytest.raises(TypeError, match="pods: expected pod names \\(an iterable of str\\)"):
        await queue.fence_pods("worker-a")
    with pytest.raises(TypeError, match="pods: expected pod names \\(str\\), got 5"):
        await queue.fence_pods([5])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="invalid pod name ''"):
        await queue.fence_pods([""])
    with pytest.raises(ValueError, match="invalid pod name"):
        await queue.unfence_pods(["x" * 254])
    with pytest.raises(ValueError, match="ttl"):
        await queue.fence_pods(["worker-a"], ttl=0)
    assert await queue.fenced_pods() == []
