"""The store: construction paths (own pool, caller's pool, shared prefixes) and its write paths."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from ulid import ULID

from venturi import PostgresStore, Priority, Queue, Task
from venturi._records import NewJob, NewJobs

from .helpers import all_migrations


@dataclass
class Ping(Task):
    KIND = "ping"


async def test_from_pool_uses_and_leaves_the_callers_pool(pg_dsn: str, prefix: str) -> None:
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=3)
    try:
        store = PostgresStore.from_pool(pool, prefix=prefix)
        assert await store.migrate() == all_migrations()
        await Queue(store).enqueue(Ping())
        await store.close()
        assert not pool.is_closing()  # the caller's pool is the caller's to close
        assert await pool.fetchval(f"SELECT count(*) FROM {prefix}_jobs") == 1
    finally:
        await pool.close()


async def test_with_prefix_shares_the_pool(store: PostgresStore, prefix: str) -> None:
    other = store.with_prefix(prefix + "_b")
    assert await other.migrate() == all_migrations()
    await Queue(other).enqueue(Ping())
    assert (await Queue(other).stats()).pending == 1
    assert (await Queue(store).stats()).pending == 0  # separate queues in one database
    await other.close()
    assert (await Queue(store).stats()).pending == 0  # the owner's pool is still open


async def test_concurrent_enqueues_share_the_held_connection_and_the_pool(
    store: PostgresStore, prefix: str
) -> None:
    queue = Queue(store)
    ids = await asyncio.gather(*(queue.enqueue(Ping()) for _ in range(200)))
    assert len(set(ids)) == 200
    assert (await queue.stats()).pending == 200


async def test_enqueue_recovers_from_a_broken_connection(store: PostgresStore) -> None:
    queue = Queue(store)
    await queue.enqueue(Ping())  # the store now holds a connection for enqueues
    held = store._held
    assert held is not None
    closed = asyncio.Event()
    held.add_termination_listener(lambda _conn: closed.set())
    async with store._pool_or_raise().acquire() as conn:
        killed = await conn.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND application_name = 'venturi' AND state = 'idle'"
        )
    assert killed >= 1
    await asyncio.wait_for(closed.wait(), 30)  # the client has seen it close
    # The next enqueue takes a fresh connection instead of failing on the dead one (it
    # raised, as the first enqueue after a server restart did) ...
    await queue.enqueue(Ping())
    assert store._held is not held
    await queue.enqueue(Ping())
    assert (await queue.stats()).pending == 3


@dataclass
class Slow(Task):
    KIND = "slow"

    def lease(self) -> float:
        return 120.0


async def test_enqueue_many_stores_policy_for_plain_and_hooked_classes(
    store: PostgresStore, prefix: str
) -> None:
    queue = Queue(store)
    plain = await queue.enqueue_many([Ping(), Ping()], priority=Priority.HIGH)
    mixed = await queue.enqueue_many([Ping(), Slow()])  # one hooked class: the general path
    rows = await store._pool_or_raise().fetch(
        f"SELECT id, kind, queue, priority, lease_s, payload::text FROM {prefix}_jobs"
    )
    by_id = {ULID.from_bytes(r["id"].bytes): r for r in rows}
    assert len(by_id) == 4
    assert [(by_id[i]["kind"], by_id[i]["priority"]) for i in plain] == [("ping", 2)] * 2
    assert [by_id[i]["lease_s"] for i in plain] == [None, None]
    assert [(by_id[i]["kind"], by_id[i]["lease_s"]) for i in mixed] == [
        ("ping", None),
        ("slow", 120),
    ]
    assert {r["queue"] for r in rows} == {"default"}
    assert {r["payload"] for r in rows} == {"{}"}


async def test_a_batch_stores_each_job_s_kind_and_priority_whether_or_not_they_vary(
    store: PostgresStore, prefix: str
) -> None:
    """A column of one value repeated is sent as that value once: every mix of one and many
    kinds and priorities stores each job's own."""
    shapes = [
        (["a", "a", "a"], [1, 1, 1]),
        (["a", "a", "a"], [0, 2, 1]),
        (["a", "b", "a"], [1, 1, 1]),
        (["b", "a", "c"], [2, 0, 1]),
    ]
    expected: dict[ULID, tuple[str, int]] = {}
    for kinds, priorities in shapes:
        ids = [ULID() for _ in kinds]
        await store.insert(NewJobs("q", ids, kinds, priorities, ["{}"] * len(ids)))
        expected.update(zip(ids, zip(kinds, priorities, strict=True), strict=True))
    rows = await store._pool_or_raise().fetch(f"SELECT id, kind, priority FROM {prefix}_jobs")
    assert {ULID.from_bytes(r["id"].bytes): (r["kind"], r["priority"]) for r in rows} == expected


def test_a_batch_has_a_value_per_job_in_every_column() -> None:
    a, b = ULID(), ULID()
    with pytest.raises(ValueError, match="every column must hold 2 values"):
        NewJobs("default", [a, b], ["ping"], [1, 1], ["{}", "{}"])
    with pytest.raises(ValueError, match="every column must hold 2 values"):
        NewJobs("default", [a, b], ["ping"] * 2, [1, 1], ["{}", "{}"], lease_s=[1.0])
    jobs = [NewJob(a, "ping", "q", 1, "{}"), NewJob(b, "ping", "q", 1, "{}", lease_s=60.0)]
    batch = NewJobs.of(jobs)
    assert (batch.queue, len(batch), batch.lease_s) == ("q", 2, [None, 60.0])
    assert batch.run_at is None and batch.dedup_keys is None  # no value at all: one NULL
    assert batch.queues is None  # one queue: no column by job
    spanning = NewJobs.of([*jobs, NewJob(ULID(), "ping", "other", 1, "{}")])
    assert (spanning.queue, spanning.queues) == ("q", ["q", "q", "other"])


async def test_a_single_job_and_a_batch_store_the_same_row(
    store: PostgresStore, prefix: str
) -> None:
    """A single job has a statement of its own (`job_insert_one`): it must store exactly what
    the batch statement stores, in every column."""
    at = datetime.now(UTC) + timedelta(hours=1)
    shapes: list[dict[str, Any]] = [
        {},
        {"run_at": at},
        {"delay_s": 1.5},
        {"lease_s": 60.0, "backoff_base_s": 0.5, "backoff_cap_s": 30.0, "dedup_key": "k"},
        {"trace_context": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
    ]
    pairs: list[tuple[ULID, ULID]] = []
    for shape in shapes:
        one, other = ULID(), ULID()
        await store.insert(NewJobs.of([NewJob(one, "ping", "q", 2, '{"a": 1}', **shape)]))
        batch = [
            NewJob(other, "ping", "q", 2, '{"a": 1}', **shape),
            NewJob(ULID(), "pad", "q", 1, "{}"),  # two jobs: the batch statement
        ]
        await store.insert(NewJobs.of(batch))
        pairs.append((one, other))
    rows = {
        ULID.from_bytes(r["id"].bytes): dict(r)
        for r in await store._pool.fetch(f"SELECT * FROM {prefix}_jobs WHERE kind = 'ping'")
    }

    def stored(job_id: ULID, shape: dict[str, Any]) -> dict[str, Any]:
        row = rows[job_id]
        created = row.pop("created_at")
        if "run_at" not in shape:  # due at (or after) its own statement's now()
            row["run_at"] -= created
        del row["id"]
        return row

    for shape, (one, other) in zip(shapes, pairs, strict=True):
        assert stored(one, shape) == stored(other, shape), shape
    assert rows[pairs[2][0]]["run_at"] == timedelta(seconds=1.5)  # not truncated to 1 s
    assert rows[pairs[3][0]]["dedup_key"] == "k" and rows[pairs[3][0]]["lease_s"] == 60.0
    assert rows[pairs[4][0]]["trace_context"] == shapes[4]["trace_context"]
