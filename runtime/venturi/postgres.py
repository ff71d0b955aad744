"""`PostgresStore`: the PostgreSQL adapter, the only module that talks to asyncpg.

It owns the connection pool, the migrations, and every statement (all in
`_db/queries.sql`). It speaks plain records (`_records`), never task types, so the
typed world above it (Queue, Worker) stays free of SQL.
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl as ssl_module
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, Self

import asyncpg
import msgspec
from ulid import ULID

from venturi import codec
from venturi._db import sql
from venturi._records import (
    ClaimedJob,
    ExistingJob,
    MergePlan,
    NewJob,
    Recovery,
    Settlement,
    StaleJob,
)
from venturi.errors import StoreClosedError
from venturi.jobs import (
    CleanupCriteria,
    HistoryFilter,
    Job,
    JobStatus,
    JournalEntry,
    JournalOutcome,
    Stats,
)

DEFAULT_PREFIX = "venturi"

SSLMode = Literal["disable", "prefer", "allow", "require", "verify-ca", "verify-full"]


class _HistoryRow(msgspec.Struct):
    run: int
    outcome: str
    at: datetime
    note: str | None = None
    attachment: Any = None
    duration_s: float | None = None
    worker: str | None = None


_history_decoder = msgspec.json.Decoder(list[_HistoryRow])


def _history(text: str | None) -> tuple[JournalEntry, ...]:
    if text is None:
        return ()
    return tuple(
        JournalEntry(
            run=row.run,
            outcome=JournalOutcome(row.outcome),
            at=row.at,
            note=row.note,
            attachment=row.attachment,
            duration=row.duration_s,
            worker=row.worker,
        )
        for row in _history_decoder.decode(text)
    )


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool release without asyncpg's default reset query (one extra round trip per call).

    Every venturi statement is self-contained: no session settings, cursors, or session-level
    advisory locks; the LISTEN connection unlistens before release, and asyncpg still rolls
    back any open transaction on its own.
    """


def _lock_key(prefix: str) -> int:
    digest = hashlib.blake2b(f"venturi:migrate:{prefix}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class PostgresStore:
    """Jobs and their journal in PostgreSQL, under one table prefix.

    Prefer `async with await PostgresStore.connect(dsn) as store:` so the pool closes.
    Several independent queues can share one database under different prefixes.
    """

    def __init__(self, pool: asyncpg.Pool, *, prefix: str, owns_pool: bool) -> None:
        self._prefix = sql.validate_prefix(prefix)
        self._q = sql.queries(prefix)
        self._pool = pool
        self._owns_pool = owns_pool
        self._closed = False
        # One connection of its own pool kept for single-row enqueues while no other
        # enqueue is using it: a pool acquire/release costs about a tenth of an enqueue.
        # Contended calls take the pool as usual.
        self._held: asyncpg.pool.PoolConnectionProxy[Any] | None = None
        self._held_lock = asyncio.Lock()

    @classmethod
    async def connect(
        cls,
        dsn: str | None = None,
        *,
        prefix: str = DEFAULT_PREFIX,
        ssl: ssl_module.SSLContext | bool | SSLMode | None = None,
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout: float = 10.0,
        statement_timeout: float | None = None,
        application_name: str = "venturi",
        **connect_kwargs: Any,
    ) -> PostgresStore:
        """Open a pool to `dsn` (libpq URI or key=value; None reads the PG* env vars).

        `ssl` is passed to asyncpg: an `ssl.SSLContext` for TLS with your own trust
        settings, or a libpq sslmode string such as "verify-full". `statement_timeout`
        (seconds) bounds every statement; `connect_timeout` bounds connecting. The
        prefix is validated before any connection is made.
        """
        sql.validate_prefix(prefix)
        settings = {"application_name": application_name}
        if statement_timeout is not None:
            settings["statement_timeout"] = str(int(statement_timeout * 1000))
        pool = await asyncpg.create_pool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            ssl=ssl,
            timeout=connect_timeout,
            server_settings=settings,
            reset=_keep_session,
            **connect_kwargs,
        )
        return cls(pool, prefix=prefix, owns_pool=True)

    @classmethod
    def from_pool(cls, pool: asyncpg.Pool, *, prefix: str = DEFAULT_PREFIX) -> PostgresStore:
        """Use an existing asyncpg pool (the store will not close it).

        The worker holds one connection of it for LISTEN, so size the pool for that.
        """
        return cls(pool, prefix=prefix, owns_pool=False)

    def with_prefix(self, prefix: str) -> PostgresStore:
        """Another queue namespace over the same pool (which this store keeps owning)."""
        return PostgresStore(self._pool_or_raise(), prefix=prefix, owns_pool=False)

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def channel(self) -> str:
        """The NOTIFY channel: every write that makes a job claimable signals it."""
        return f"{self._prefix}_jobs"

    async def close(self) -> None:
        """Close the pool if this store opened it. Safe to call twice."""
        if not self._closed:
            self._closed = True
            async with self._held_lock:
                if self._held is not None:
                    held, self._held = self._held, None
                    await self._pool.release(held)
            if self._owns_pool:
                await self._pool.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _pool_or_raise(self) -> asyncpg.Pool:
        if self._closed:
            raise StoreClosedError("PostgresStore is closed; create a new one")
        return self._pool

    # -- schema ----------------------------------------------------------------------

    async def migrate(self) -> list[int]:
        """Apply pending migrations; returns the versions applied (empty if up to date).

        Idempotent, and safe with many processes starting at once: everything runs in one
        transaction under an advisory lock keyed by the prefix.
        """
        applied_now: list[int] = []
        async with self._pool_or_raise().acquire() as conn, conn.transaction():
            await conn.execute(self._q["lock_migrations"], _lock_key(self._prefix))
            await conn.execute(self._q["migration_table_create"])
            done = {r[0] for r in await conn.fetch(self._q["migration_list"])}
            for migration in sql.migrations(self._prefix):
                if migration.version in done:
                    continue
                await conn.execute(migration.sql)
                await conn.execute(self._q["migration_record"], migration.version, migration.name)
                applied_now.append(migration.version)
        return applied_now

    # -- producing -------------------------------------------------------------------

    async def insert(self, job: NewJob) -> None:
        query, args = self._q["job_insert"], (*_insert_args(job), self.channel)
        pool = self._pool_or_raise()
        if self._held_lock.locked() or not self._owns_pool:
            # Contended, or the caller's pool (which must close even if this store is not).
            await pool.execute(query, *args)
            return
        async with self._held_lock:
            if self._held is None:
                self._held = await pool.acquire()
            try:
                await self._held.execute(query, *args)
            except BaseException as exc:
                if isinstance(exc, asyncpg.PostgresError) and not isinstance(exc, _CONNECTION_LOST):
                    raise  # the statement failed; the connection is fine
                # Broken or cancelled mid-statement: drop the connection whatever its state
                # (the pool opens a fresh one when needed). The caller sees the error, as
                # with any failed enqueue; nothing is retried behind its back.
                held, self._held = self._held, None
                held.terminate()
                raise

    async def insert_many(self, jobs: Sequence[NewJob]) -> None:
        """Insert many jobs of one named queue in one statement (one round trip)."""
        if not jobs:
            return
        queue = jobs[0].queue
        if any(j.queue != queue for j in jobs):
            raise ValueError("insert_many: every job of a batch must belong to the same queue")
        await self._pool_or_raise().execute(
            self._q["job_insert_many"],
            [j.id for j in jobs],
            [j.kind for j in jobs],
            queue,
            [j.priority for j in jobs],
            _column([j.run_at for j in jobs]),
            _column([j.delay_s for j in jobs]),
            [j.payload for j in jobs],
            _column([j.lease_s for j in jobs]),
            _column([j.backoff_base_s for j in jobs]),
            _column([j.backoff_cap_s for j in jobs]),
            _column([j.dedup_key for j in jobs]),
            self.channel,
        )

    async def insert_plain(
        self,
        ids: Sequence[ULID],
        kinds: Sequence[str],
        queue: str,
        priority: int,
        payloads: Sequence[str],
    ) -> None:
        """`insert_many` for the common batch: due now, one priority, no per-job policy."""
        if not ids:
            return
        await self._pool_or_raise().execute(
            self._q["job_insert_many"],
            ids,
            kinds,
            queue,
            [priority] * len(ids),
            None,
            None,
            payloads,
            None,
            None,
            None,
            None,
            self.channel,
        )

    async def insert_deduplicated(
        self, job: NewJob, decide: Callable[[ExistingJob], MergePlan]
    ) -> ULID:
        """Insert `job` unless a pending job of the same kind and dedup key exists; then
        `decide` (pure) chooses, and the plan is applied. Returns the id that holds the work.

        Producers of one (kind, key) are serialized by an advisory lock, so concurrent
        enqueues end as the merge policy says, never with two rows where it said one.
        """
        assert job.dedup_key is not None
        async with self._pool_or_raise().acquire() as conn, conn.transaction():
            await conn.execute(self._q["dedup_lock"], _dedup_lock_key(self._prefix, job))
            row = await conn.fetchrow(
                self._q["job_find_pending_duplicate"], job.kind, job.dedup_key
            )
            if row is not None:
                journal = await conn.fetch(self._q["journal_list_for_job"], row[0])
                existing = ExistingJob(row[0], row[1], row[2], row[3], _journal(journal))
                plan = decide(existing)
                if plan.action != "independent":
                    await conn.execute(
                        self._q["job_merge"],
                        existing.id,
                        plan.payload,
                        plan.set_carry,
                        plan.carry,
                        plan.priority,
                        plan.action,
                    )
                    return ULID.from_bytes(existing.id.bytes)
            await conn.execute(self._q["job_insert"], *_insert_args(job), self.channel)
            return job.id

    # -- consuming -------------------------------------------------------------------

    async def claim(
        self,
        *,
        queue: str,
        kinds: Sequence[str],
        limit: int,
        worker: str,
        pod: str | None,
        default_lease_s: float,
        reserved_low: int = 0,
        reserved_normal: int = 0,
    ) -> list[ClaimedJob]:
        """Claim up to `limit` jobs; `reserved_low` of the slots go to LOW jobs first and
        `reserved_normal` to NORMAL-or-LOW ones (anti-starvation), the rest to any tier."""
        rows = await self._pool_or_raise().fetch(
            self._q["job_claim"],
            queue,
            list(kinds),
            reserved_low,
            reserved_normal,
            limit - reserved_low - reserved_normal,
            worker,
            pod,
            default_lease_s,
        )
        return [
            ClaimedJob(
                id=r[0],
                kind=r[1],
                payload=r[2],
                carry=r[3],
                run_count=r[4],
                failures=r[5],
                claim_token=r[6],
                lease_s=r[7],
                backoff_base_s=r[8],
                backoff_cap_s=r[9],
                waited_s=r[10],
                history=_history(r[11]),
            )
            for r in rows
        ]

    async def settle(self, settlements: Sequence[Settlement], *, worker: str) -> set[uuid.UUID]:
        """Write outcomes and journal rows; returns the ids this worker still owned."""
        rows = await self._pool_or_raise().fetch(
            self._q["job_settle_many"],
            [s.id for s in settlements],
            [s.claim_token for s in settlements],
            [s.outcome for s in settlements],
            [s.delay_s for s in settlements],
            [s.carry for s in settlements],
            [s.set_carry for s in settlements],
            [s.note for s in settlements],
            [s.attachment for s in settlements],
            [s.duration_s for s in settlements],
            worker,
            self.channel,
        )
        return {r[0] for r in rows}

    async def renew_leases(
        self, ids: Sequence[uuid.UUID], tokens: Sequence[uuid.UUID], lease_s: Sequence[float]
    ) -> set[uuid.UUID]:
        """Extend leases; returns the ids still owned (the rest were recovered elsewhere)."""
        rows = await self._pool_or_raise().fetch(
            self._q["job_renew_leases"], list(ids), list(tokens), list(lease_s)
        )
        return {r[0] for r in rows}

    async def recover_stale(
        self,
        decide: Callable[[list[StaleJob]], list[Recovery]],
        *,
        worker: str,
        limit: int = 500,
    ) -> list[tuple[uuid.UUID, str, JobStatus]]:
        """Recover jobs whose lease expired: lock them, let `decide` (pure) choose, write.

        Returns (id, kind, new status) for each recovered job.
        """
        async with self._pool_or_raise().acquire() as conn, conn.transaction():
            rows = await conn.fetch(self._q["job_select_stale"], limit)
            if not rows:
                return []
            stale = [StaleJob(r[0], r[1], r[2], r[3], r[4], r[5], r[6]) for r in rows]
            tokens = {r[0]: r[7] for r in rows}
            decisions = decide(stale)
            recovered = await conn.fetch(
                self._q["job_recover_many"],
                [d.id for d in decisions],
                [tokens[d.id] for d in decisions],
                [d.dead for d in decisions],
                [d.delay_s for d in decisions],
                [d.note for d in decisions],
                worker,
                self.channel,
            )
        return [(r[0], r[1], JobStatus(r[2])) for r in recovered]

    async def next_lease_expiry(self) -> float | None:
        """Seconds until the earliest lease expires (negative if already expired)."""
        value: float | None = await self._pool_or_raise().fetchval(self._q["lease_next_expiry"])
        return value

    async def next_due(self, kinds: Sequence[str]) -> float | None:
        """Seconds until the next scheduled job of these kinds becomes eligible."""
        value: float | None = await self._pool_or_raise().fetchval(
            self._q["job_next_due"], list(kinds)
        )
        return value

    @asynccontextmanager
    async def listen(
        self, on_notify: Callable[[str], None], on_lost: Callable[[], None]
    ) -> AsyncIterator[Listening]:
        """Hold one connection LISTENing on the store's channel.

        `on_notify(kind)` runs for every notification; `on_lost()` when the connection
        terminates. Yields a handle to probe the connection for liveness.
        """
        async with self.listen_queues(
            [self._prefix], lambda _prefix, kind: on_notify(kind), on_lost
        ) as listening:
            yield listening

    @asynccontextmanager
    async def listen_queues(
        self,
        prefixes: Sequence[str],
        on_notify: Callable[[str, str], None],
        on_lost: Callable[[], None],
    ) -> AsyncIterator[Listening]:
        """One connection LISTENing on the channels of several queues of this database
        (`on_notify(prefix, kind)`): a watcher of many queues holds one connection, not one
        per queue."""
        channels = {f"{sql.validate_prefix(p)}_jobs": p for p in prefixes}

        def notified(_conn: object, _pid: int, channel: str, payload: object) -> None:
            on_notify(channels[channel], str(payload))

        def terminated(_conn: object) -> None:
            on_lost()

        async with self._pool_or_raise().acquire() as conn:
            conn.add_termination_listener(terminated)
            try:
                for channel in channels:
                    await conn.add_listener(channel, notified)
                yield Listening(conn, self._q["connection_probe"])
            finally:
                conn.remove_termination_listener(terminated)
                # Close rather than UNLISTEN channel by channel: it cannot be interrupted
                # half-way (by a cancellation at shutdown), and the pool replaces it.
                conn.terminate()

    # -- operations ------------------------------------------------------------------

    async def get_job(self, job_id: ULID | uuid.UUID) -> Job | None:
        row = await self._pool_or_raise().fetchrow(self._q["job_get"], _as_uuid(job_id))
        return None if row is None else _job(row)

    async def list_jobs(self, f: HistoryFilter) -> list[Job]:
        rows = await self._pool_or_raise().fetch(
            self._q["job_list"],
            f.status.value if f.status is not None else None,
            f.kind,
            f.queue,
            f.before_id.to_uuid() if f.before_id is not None else None,
            f.created_after,
            f.created_before,
            f.limit,
        )
        return [_job(r) for r in rows]

    async def cleanup(
        self,
        c: CleanupCriteria,
        *,
        batch_size: int = 1000,
        on_batch: Callable[[int], None] | None = None,
    ) -> int:
        """Delete finished jobs in bounded batches (each its own short transaction);
        `on_batch(total_so_far)` reports progress."""
        total = 0
        while True:
            n: int = await self._pool_or_raise().fetchval(
                self._q["job_cleanup_batch"],
                c.finished_before,
                c.kind,
                c.status.value if c.status is not None else None,
                batch_size,
            )
            total += n
            if on_batch is not None:
                on_batch(total)
            if n < batch_size:
                return total

    async def journal(self, job_id: ULID | uuid.UUID) -> list[JournalEntry]:
        rows = await self._pool_or_raise().fetch(self._q["journal_list_for_job"], _as_uuid(job_id))
        return list(_journal(rows))

    async def stats(self) -> Stats:
        rows = await self._pool_or_raise().fetch(self._q["stats"])
        pending: dict[str, int] = {}
        scheduled: dict[str, int] = {}
        claimed: dict[str, int] = {}
        dead: dict[str, int] = {}
        completed: dict[str, int] = {}
        oldest: dict[str, float] = {}
        for status, kind, total, n_scheduled, oldest_s in rows:
            if status == "pending":
                n = total - n_scheduled
                if n > 0:
                    pending[kind] = n
                if n_scheduled:
                    scheduled[kind] = n_scheduled
                if oldest_s is not None:
                    oldest[kind] = max(0.0, oldest_s)
            elif status == "claimed":
                claimed[kind] = total
            elif status == "completed":
                completed[kind] = total
            else:
                dead[kind] = total
        return Stats(
            pending_by_kind=pending,
            scheduled_by_kind=scheduled,
            claimed_by_kind=claimed,
            dead_by_kind=dead,
            oldest_pending_age_by_kind=oldest,
            completed_by_kind=completed,
        )

    async def claimed_by_pod(self) -> dict[str, int]:
        rows = await self._pool_or_raise().fetch(self._q["claimed_by_pod"])
        return {pod: n for pod, n in rows}


def _job(row: asyncpg.Record) -> Job:
    return Job(
        id=ULID.from_bytes(row[0].bytes),
        kind=row[1],
        queue=row[2],
        status=JobStatus(row[3]),
        priority=row[4],
        run_at=row[5],
        created_at=row[6],
        finished_at=row[7],
        payload=codec.decode_any(row[8]),
        carry=codec.decode_any(row[9]),
        run_count=row[10],
        failures=row[11],
        claimed_at=row[12],
        lease_until=row[13],
        claimed_by=row[14],
        claimed_pod=row[15],
        last_error=row[16],
    )


def _journal(rows: Sequence[asyncpg.Record]) -> tuple[JournalEntry, ...]:
    return tuple(
        JournalEntry(
            run=r[1],
            outcome=JournalOutcome(r[2]),
            at=r[3],
            note=r[4],
            attachment=codec.decode_any(r[5]),
            duration=r[6],
            worker=r[7],
        )
        for r in rows
    )


_CONNECTION_LOST = (asyncpg.PostgresConnectionError, asyncpg.OperatorInterventionError)
"""Server errors after which a connection is not reused (class 08, and 57: shutdown,
termination, cancellation)."""


def _column(values: list[Any]) -> list[Any] | None:
    """NULL for an all-NULL column: multi-array unnest() pads it with NULLs, and asyncpg
    skips encoding a thousand Nones (optional columns are usually unset)."""
    return None if all(v is None for v in values) else values


def _insert_args(job: NewJob) -> tuple[Any, ...]:
    return (
        job.id,
        job.kind,
        job.queue,
        job.priority,
        job.run_at,
        job.delay_s,
        job.payload,
        job.lease_s,
        job.backoff_base_s,
        job.backoff_cap_s,
        job.dedup_key,
    )


def _dedup_lock_key(prefix: str, job: NewJob) -> int:
    key = f"venturi:dedup:{prefix}:{job.kind}:{job.dedup_key}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big", signed=True)


class Listening:
    """A live LISTEN connection, as `PostgresStore.listen` yields it."""

    def __init__(self, conn: asyncpg.pool.PoolConnectionProxy[Any], probe_sql: str) -> None:
        self._conn = conn
        self._probe_sql = probe_sql

    async def probe(self) -> None:
        """Round-trip a trivial query; raises if the connection is dead."""
        await self._conn.fetchval(self._probe_sql)

    def abort(self) -> None:
        """Drop the connection at once (after a failed probe)."""
        self._conn.terminate()


def _as_uuid(job_id: ULID | uuid.UUID) -> uuid.UUID:
    if isinstance(job_id, ULID):
        return job_id.to_uuid()
    return job_id
