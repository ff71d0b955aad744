"""The batch statements (and the inserts) keep their shape under a cached generic plan.

PostgreSQL switches a prepared statement to a generic plan after five runs. A generic plan
guesses that `unnest($1)` yields 10 rows, and statistics taken while the queue was idle say
no job is claimed. Settle, renew and recover must stay linear in the batch (a hash join, or
a primary-key probe per job): the old shape looped over every claimed job once per
outcome, which cost 186 ms per 1,000 settlements instead of 18 ms and stalled drains for
seconds.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import asyncpg
import pytest

from venturi import PostgresStore, Queue, Task
from venturi._records import NextDue, Recovery, Settlement, StaleJob

JOBS = 300


@dataclass
class Ping(Task):
    KIND = "ping"
    n: int


def explaining(
    pg_dsn: str, *options: str
) -> tuple[str, list[str], Callable[[asyncpg.Connection], Awaitable[None]]]:
    """A DSN whose sessions run on generic plans and log every statement's plan (auto_explain,
    with `auto_explain.<option>` on for each of `options`), the list the logged plans land
    in, and the store `setup` that collects them. (asyncpg passes DSN parameters it does not
    know to the server as session settings.)"""
    plans: list[str] = []

    def collect(_conn: object, message: asyncpg.PostgresLogMessage) -> None:
        if "plan:" in message.message:
            plans.append(message.message)

    async def explain_everything(conn: asyncpg.Connection) -> None:
        conn.add_log_listener(collect)

    dsn = (
        f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}plan_cache_mode=force_generic_plan"
        "&session_preload_libraries=auto_explain&auto_explain.log_min_duration=0"
        + "".join(f"&auto_explain.{option}=on" for option in options)
        + "&auto_explain.log_level=notice"
    )
    return dsn, plans, explain_everything


def assert_claims_scan_the_claim_index(plans: list[str], prefix: str, queues: list[str]) -> None:
    """The claim's logged plans: the plain statement for one queue, the function's for
    several (the statement the case is about), each a range scan of the claim index, never a
    sequential scan of the jobs table."""
    inner = [p for p in plans if "FOR UPDATE SKIP LOCKED" in p]
    assert inner, "no plan of the claim's statement was logged"
    assert any("WITH gate AS" in p for p in inner) == (len(queues) == 1)
    for plan in inner:
        body = plan.split("plan:", 1)[1]
        assert f"Seq Scan on {prefix}_jobs" not in body, body
        assert f"{prefix}_jobs_claim_idx" in body, body


async def seed(
    pg_dsn: str, prefix: str, queues: list[str], per_queue: int, *, then: str | None = None
) -> None:
    """Migrate `prefix` and enqueue `per_queue` pings in each of `queues`, run `then` (SQL)
    if given, and ANALYZE the jobs, on a store of its own."""
    setup = await PostgresStore.connect(pg_dsn, prefix=prefix)
    try:
        await setup.migrate()
        for name in queues:
            await Queue(setup, queue=name).enqueue_many(Ping(i) for i in range(per_queue))
        if then is not None:
            await setup._pool_or_raise().execute(then)
        await setup._pool_or_raise().execute(f"ANALYZE {prefix}_jobs")
    finally:
        await setup.close()


# Each acquire attaches the listener again (asyncpg drops listeners, warning, on release).
@pytest.mark.filterwarnings("ignore:.*active log listener")
async def test_batch_statements_stay_linear_under_generic_plans(pg_dsn: str, prefix: str) -> None:
    dsn, plans, explain_everything = explaining(pg_dsn, "log_analyze")
    store = await PostgresStore.connect(dsn, prefix=prefix, setup=explain_everything)
    try:
        await store.migrate()
        await Queue(store).enqueue_many(Ping(i) for i in range(JOBS))
        await store._pool_or_raise().execute(f"ANALYZE {prefix}_jobs")  # "nothing is claimed"
        claimed = await store.claim(
            queues=["default"], kinds=["ping"], limit=JOBS, worker="w", pod=None, default_lease_s=60
        )
        assert len(claimed) == JOBS
        plans.clear()

        # The insert statements: a batch (job_insert) and a single enqueue (job_insert_one).
        await Queue(store).enqueue_many(Ping(i) for i in range(JOBS))
        await Queue(store).enqueue(Ping(0))

        owned = await store.renew_leases(
            [j.id for j in claimed], [j.claim_token for j in claimed], [60.0] * JOBS
        )
        settled = await store.settle(
            [Settlement.of(j, "completed") for j in claimed[:200]],
            worker="w",
        )
        await store._pool_or_raise().execute(
            f"UPDATE {prefix}_jobs SET lease_until = now() - interval '1 second' "
            "WHERE status = 'claimed'"
        )

        def decide(stale: list[StaleJob]) -> list[Recovery]:
            return [Recovery(s.id, False, 0.0, "lease expired") for s in stale]

        recovered = await store.recover_stale(decide, queues=["default"], worker="w")
    finally:
        await store.close()

    assert len(owned) == JOBS and len(settled) == 200 and len(recovered) == JOBS - 200
    shapes = {
        "insert": [p for p in plans if f"INSERT INTO {prefix}_jobs" in p],
        "renew": [p for p in plans if "SET lease_until = now() + make_interval" in p],
        "settle": [p for p in plans if "INSERT INTO" in p and "'completed'" in p],
        "recover": [p for p in plans if "'stale_recovered'" in p],
    }
    for name, found in shapes.items():
        assert found, f"no {name} plan was logged"
        plan = found[0].split("plan:", 1)[1]
        plan = plan.split("Query Text:", 1)[1]
        body = plan[plan.index("\n", plan.rindex(";")) :]  # the plan tree after the SQL text
        assert "Join Filter" not in body, f"{name}: a join compares rows pairwise:\n{body}"
        for line in body.splitlines():
            # Only an index probe may run once per row; a scan re-run per row is quadratic.
            if re.search(r"loops=(?!1\))\d+", line):
                assert "Index Scan" in line or "Index Only Scan" in line, (
                    f"{name}: a scan runs once per row:\n{body}"
                )


@pytest.mark.filterwarnings("ignore:.*active log listener")
@pytest.mark.parametrize(
    ("queues", "per_queue"),
    [
        (["b", "a"], 2000),
        # One queue, one kind, a bigger backlog: ANALYZE then says the kind has one value,
        # which is what made a generic plan of claim_v4 expect no row and sort the table.
        (["a"], 20_000),
    ],
)
async def test_the_claim_is_an_index_scan_of_each_queue_under_generic_plans(
    pg_dsn: str, prefix: str, queues: list[str], per_queue: int
) -> None:
    """The claim function's statement, run per queue in order (several queues), and the
    plain one-queue statement (one): a range scan of the claim index, never a sequential
    scan of the jobs table, also with a cached generic plan."""
    dsn, plans, explain_everything = explaining(pg_dsn, "log_nested_statements")
    await seed(pg_dsn, prefix, queues, per_queue)
    store = await PostgresStore.connect(dsn, prefix=prefix, setup=explain_everything)
    try:
        for _ in range(7):  # past the five runs after which a plan may turn generic
            claimed = await store.claim(
                queues=queues,
                kinds=["ping"],
                limit=30,
                worker="w",
                pod=None,
                default_lease_s=60,
                reserved_low=1,
                reserved_normal=3,
            )
            assert len(claimed) == 30
    finally:
        await store.close()
    assert_claims_scan_the_claim_index(plans, prefix, queues)


# Each acquire attaches the listener again (asyncpg drops listeners, warning, on release).
@pytest.mark.filterwarnings("ignore:.*active log listener")
@pytest.mark.parametrize("queues", [["a"], ["a", "b"]])
async def test_the_claim_looks_up_each_row_s_reservation_in_a_hash(
    pg_dsn: str, prefix: str, queues: list[str]
) -> None:
    """Whether a tier reservation picked a claimed row is read from a hash of the picked ids
    (a hashed subplan), in the plain one-queue statement and in the function: `= ANY(ARRAY(
    ...))` compared every row with every reserved id, ~250,000 comparisons in a claim of
    1,000 jobs at the default ratio (a quarter of its slots reserved)."""
    dsn, plans, explain_everything = explaining(pg_dsn, "log_nested_statements", "log_verbose")
    await seed(pg_dsn, prefix, queues, 200)
    store = await PostgresStore.connect(dsn, prefix=prefix, setup=explain_everything)
    try:
        for _ in range(7):  # past the five runs after which a plan may turn generic
            claimed = await store.claim(
                queues=queues,
                kinds=None,
                limit=20,
                worker="w",
                pod=None,
                default_lease_s=60,
                reserved_low=2,
                reserved_normal=3,
            )
            assert len(claimed) == 20
            assert sum(j.reserved for j in claimed) == 5
    finally:
        await store.close()
    inner = [p.split("plan:", 1)[1] for p in plans if "FOR UPDATE SKIP LOCKED" in p]
    assert inner, "no plan of the claim's statement was logged"
    for body in inner:
        # The reply's columns: the first Output line, that of the plan's top node.
        reply = next(line for line in body.splitlines() if "Output:" in line)
        assert "c.id = ANY" not in reply, reply
        assert "(hashed SubPlan" in reply, reply


# Each acquire attaches the listener again (asyncpg drops listeners, warning, on release).
@pytest.mark.filterwarnings("ignore:.*active log listener")
@pytest.mark.parametrize("queues", [["q0"], ["q0", "q1", "q2", "q3", "q4"]])
async def test_the_claim_stays_an_index_scan_in_a_table_of_finished_jobs(
    pg_dsn: str, prefix: str, queues: list[str]
) -> None:
    """A queue that has run a while: nearly every row finished (what `python -m bench.scale`
    runs at 10,000,000), the few pending ones over five queues and 20 kinds, statistics
    taken so. The claim, plain (one queue) or the function (several), by a list of kinds or
    of every kind, stays a range scan of the claim index under a generic plan."""
    dsn, plans, explain_everything = explaining(pg_dsn, "log_nested_statements")
    await seed(
        pg_dsn,
        prefix,
        ["q0", "q1", "q2", "q3", "q4"],
        4000,
        then=f"WITH r AS (SELECT id, row_number() OVER (PARTITION BY queue ORDER BY id) AS n "
        f"FROM {prefix}_jobs) UPDATE {prefix}_jobs AS j SET kind = 'ping' || (r.n % 20), "
        "status = CASE WHEN r.n <= 60 THEN 'pending' ELSE 'completed' END, "
        "finished_at = CASE WHEN r.n <= 60 THEN NULL ELSE now() END FROM r WHERE j.id = r.id",
    )
    kinds = [f"ping{k}" for k in range(20)]
    store = await PostgresStore.connect(dsn, prefix=prefix, setup=explain_everything)
    try:
        for i in range(7):  # past the five runs after which a plan may turn generic
            claimed = await store.claim(
                queues=queues,
                kinds=kinds if i % 2 else None,
                limit=8,
                worker="w",
                pod=None,
                default_lease_s=60,
                reserved_low=1,
                reserved_normal=2,
            )
            assert len(claimed) == 8
            assert {j.queue for j in claimed} == {"q0"}  # the first queue, in order
    finally:
        await store.close()
    assert_claims_scan_the_claim_index(plans, prefix, queues)


async def test_the_claim_function_always_runs_on_generic_plans(store: PostgresStore) -> None:
    """Custom plans would re-plan the claim's statement for every queue of every claim, and
    planning was most of a claim's cost (most of all for the empty queues a strict-order
    claim passes over): the function pins generic plans, which the test above checks."""
    for version in ("v6", "v7"):  # the one of this release, and the one before it
        config = await store._pool_or_raise().fetchval(
            "SELECT proconfig FROM pg_proc WHERE proname = $1", f"{store.prefix}_claim_{version}"
        )
        assert config == ["plan_cache_mode=force_generic_plan"], version


@pytest.mark.filterwarnings("ignore:.*active log listener")
async def test_the_next_due_probe_reads_one_index_entry_per_queue_and_kind(
    pg_dsn: str, prefix: str
) -> None:
    """The worker's next-due timer (after a claim that came back short): a probe of the
    pending (queue, kind, run_at) index per queue and kind, under a generic plan too, also
    with many jobs scheduled; never a scan of the jobs or of the whole index."""
    dsn, plans, explain_everything = explaining(pg_dsn, "log_analyze")
    await seed(
        pg_dsn,
        prefix,
        ["a", "b"],
        5000,
        then=f"UPDATE {prefix}_jobs SET run_at = now() + CASE queue WHEN 'a' THEN "
        "interval '1 hour' ELSE interval '1 minute' END",
    )
    store = await PostgresStore.connect(dsn, prefix=prefix, setup=explain_everything)
    try:
        for _ in range(7):  # past the five runs after which a plan may turn generic
            due = await store.next_due(["ping", "pong"], queues=["a"])
            assert due.in_s is not None and 3500 < due.in_s <= 3600  # b's, sooner, not a's
            assert not due.held
    finally:
        await store.close()
    probes = [p for p in plans if "ORDER BY run_at LIMIT 1" in p]
    assert probes, "no plan of the next-due probe was logged"
    for plan in probes:
        body = plan.split("plan:", 1)[1]
        body = body[body.index("\n", body.rindex(";")) :]
        assert f"Seq Scan on {prefix}_jobs" not in body, body
        assert f"{prefix}_jobs_pending_queue_kind_idx" in body, body
        scanned = r"Index (?:Only )?Scan.*actual time=\S+ rows=(\d+)"
        read = [int(n) for n in re.findall(scanned, body)]
        assert read and max(read) <= 1, body  # one entry read per probe, not the range


async def test_the_worker_s_claim_settle_and_next_due_statements_are_planned_once(
    pg_dsn: str, prefix: str
) -> None:
    """After five runs PostgreSQL keeps a prepared statement's generic plan only if no custom
    plan looks cheaper. The claim's optional trace read (a CASE on a parameter, folded away
    by a custom plan), the settle's arrays and prune flag, and the next-due probe's arrays
    (counted, or folded, by a custom plan) made every custom plan look cheaper at a trickle
    (one job per claim and per settle), so each was planned anew at every run: 30-40 us per
    claim, ~280 us per settle, 150-200 us per next-due probe. Their parameters are read
    through subqueries now, and the generic plans are kept."""
    # Finished jobs in the table, as in any queue that has run a while (on a few rows a scan
    # of the table is as cheap as a probe, whatever the plan).
    await seed(
        pg_dsn, prefix, ["done"], 2000, then=f"UPDATE {prefix}_jobs SET status = 'completed'"
    )
    store = await PostgresStore.connect(pg_dsn, prefix=prefix, max_size=1)  # one session
    try:
        queue = Queue(store)
        for i in range(10):
            await queue.enqueue(Ping(i))
            # The plain one-queue statement, and the claim function (a pod's claim).
            for traced, pod in ((False, None), (True, None), (False, "p"), (True, "p")):
                claimed = await store.claim(
                    queues=["default"],
                    kinds=["ping"],
                    limit=16,
                    worker="w",
                    pod=pod,
                    default_lease_s=30.0,
                    traced=traced,
                )
                assert len(claimed) == (1 if (traced, pod) == (False, None) else 0)
                if claimed:
                    owned = await store.settle([Settlement.of(claimed[0], "completed")], worker="w")
                    assert owned == {claimed[0].id}
            assert await store.next_due(["ping"], queues=["default"]) == NextDue(None, False)
            assert await store.next_due_in_queues(["default"]) == NextDue(None, False)
        rows = await store._pool_or_raise().fetch(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
        )
    finally:
        await store.close()
    plans = {
        name: [(r["generic_plans"], r["custom_plans"]) for r in rows if marker in r["statement"]]
        for name, marker in (
            ("claim", f"{prefix}_claim_v7("),
            ("claim_queue", "WITH gate AS ("),
            ("settle", "AS u(id, token, outcome,"),
            ("next_due", " AS k(kind)"),
            ("next_due_in_queues", " AS p(priority)"),
        )
    }
    for name, counts in plans.items():
        assert len(counts) == 1, (name, counts)
        generic, custom = counts[0]
        assert custom <= 5 and generic >= 5, (name, generic, custom)
