"""`<prefix>_backlog`, the SQL function KEDA's `postgresql` scaler queries
(examples/keda/scaledobject.yaml): it counts what the operator counts (due pending plus
claimed jobs), per queue and kinds, as one number, capped."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest
import yaml

from venturi import PostgresStore, Queue, Task
from venturi._records import Settlement

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Mail(Task):
    KIND = "send_email"
    n: int = 0


@dataclass
class Report(Task):
    KIND = "report"
    n: int = 0


async def backlog(store: PostgresStore, query: str, *args: object) -> int:
    value: int = await store._pool.fetchval(query.replace("venturi_", f"{store.prefix}_"), *args)
    return value


async def test_backlog_counts_what_the_operator_counts(store: PostgresStore) -> None:
    default, other = Queue(store), Queue(store, queue="other")
    await default.enqueue_many([Mail(n) for n in range(5)])
    await default.enqueue_many([Report(n) for n in range(3)])
    await default.enqueue_in(Mail(), timedelta(hours=1))  # scheduled: not work yet
    await other.enqueue_many([Mail(n) for n in range(4)])
    claimed = await store.claim(
        queues=["default"],
        kinds=["send_email"],
        limit=2,
        worker="w",
        pod=None,
        default_lease_s=60,
    )
    finished = await store.claim(
        queues=["other"], kinds=["send_email"], limit=1, worker="w", pod=None, default_lease_s=60
    )
    await store.settle([Settlement.of(finished[0], "completed")], worker="w")
    assert len(claimed) == 2

    # The operator's number for the whole prefix: pending (due) plus claimed, by kind.
    stats = await default.stats()
    operator_counts = sum(stats.pending_by_kind.values()) + sum(stats.claimed_by_kind.values())
    query = "SELECT venturi_backlog()"
    assert await backlog(store, query) == operator_counts == 5 + 3 + 3

    by = "SELECT venturi_backlog($1, $2)"
    assert await backlog(store, by, "default", None) == 8  # 3 pending + 2 claimed mails, 3 reports
    assert await backlog(store, by, "default", ["send_email"]) == 5
    assert await backlog(store, by, "default", ["send_email", "report"]) == 8
    assert await backlog(store, by, "other", ["send_email"]) == 3  # the completed one is done
    assert await backlog(store, by, None, ["report"]) == 3
    assert await backlog(store, by, "nowhere", None) == 0
    # Capped, per part and in sum: a huge backlog is a bounded read.
    assert await backlog(store, "SELECT venturi_backlog(cap => 4)") == 4
    assert await backlog(store, "SELECT venturi_backlog('default', cap => 7)") == 7
    assert await backlog(store, "SELECT venturi_backlog(cap => 0)") == 0
    assert await backlog(store, "SELECT venturi_backlog(cap => NULL)") == 11  # no cap


async def test_the_function_is_planned_for_each_calls_arguments(store: PostgresStore) -> None:
    # A generic plan could not bound its index scans by the queue and kinds given.
    config = await store._pool.fetchval(
        "SELECT proconfig FROM pg_proc WHERE proname = $1", f"{store.prefix}_backlog"
    )
    assert config == ["plan_cache_mode=force_custom_plan"]


async def test_a_negative_cap_is_named(store: PostgresStore) -> None:
    with pytest.raises(asyncpg.InvalidParameterValueError) as raised:
        await backlog(store, "SELECT venturi_backlog(cap => -5)")
    assert str(raised.value) == (
        f"{store.prefix}_backlog: cap must be 0 or more (or NULL for no cap), got -5"
    )


async def test_the_example_scaledobject_query_runs(store: PostgresStore) -> None:
    scaled = yaml.safe_load((ROOT / "examples/keda/scaledobject.yaml").read_text())
    [trigger] = scaled["spec"]["triggers"]
    assert trigger["type"] == "postgresql"
    query = trigger["metadata"]["query"]
    assert await backlog(store, query) == 0
    await Queue(store).enqueue_many([Mail(n) for n in range(3)])
    await Queue(store).enqueue(Report())  # another kind: another Deployment's
    assert await backlog(store, query) == 3


async def test_a_paused_queues_due_jobs_need_no_worker(queue: Queue) -> None:
    await queue.enqueue_many([Mail(1), Mail(2)])
    backlog = f"SELECT {queue.store.prefix}_backlog('default')"
    pool = queue.store._pool_or_raise()
    assert await pool.fetchval(backlog) == 2
    await queue.pause("default", reason="maintenance")
    assert await pool.fetchval(backlog) == 0
    await queue.resume("default")
    assert await pool.fetchval(backlog) == 2
