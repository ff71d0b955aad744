"""`PostgresStore`: the PostgreSQL adapter, the only module that talks to asyncpg.

It owns the connection pool, the migrations, and every statement (all in
`_db/queries.sql`). It speaks plain records (`_records`), never task types, so the
typed world above it (Queue, Worker) stays free of SQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import math
import ssl as ssl_module
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, Self, TypeVar, cast

import asyncpg
import msgspec
from ulid import ULID

from venturi import _dsn, codec
from venturi._db import sql
from venturi._db.failures import breaks_connection
from venturi._records import (
    ClaimedJob,
    ExistingJob,
    MergePlan,
    NewJob,
    Recovered,
    Recovery,
    Settlement,
    StaleJob,
)
from venturi.errors import SchemaError, StoreClosedError
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


_Method = TypeVar("_Method", bound=Callable[..., Awaitable[Any]])


def _schema_required(method: _Method) -> _Method:
    """Turn asyncpg's UndefinedTableError (an unmigrated prefix) into a `SchemaError` that
    says to migrate. Caught, never pre-checked: it costs nothing until it happens. (The
    single-row insert, the hottest call, does the same inline.)"""

    @functools.wraps(method)
    async def checked(self: PostgresStore, *args: Any, **kwargs: Any) -> Any:
        try:
            return await method(self, *args, **kwargs)
        except asyncpg.UndefinedTableError as exc:
            raise self._missing_schema(exc) from None

    return cast(_Method, checked)


class PostgresStore:
    """Jobs and their journal in PostgreSQL, under one table prefix.

    Prefer `async with await PostgresStore.connect(dsn) as store:` so the pool closes.
    Several independent queues can share one database under different prefixes.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        prefix: str,
        owns_pool: bool,
        connect_args: tuple[str | None, dict[str, Any]] | None = None,
    ) -> None:
        self._prefix = sql.validate_prefix(prefix)
        self._q = sql.queries(prefix)
        self._pool = pool
        self._owns_pool = owns_pool
        self._connect_args = connect_args
        """How the pool connects, so LISTEN can hold a connection of its own outside it."""
        self._closed = False
        # One connection of its own pool kept for single-row enqueues while no other
        # enqueue is using it: a pool acquire/release costs about a tenth of an enqueue.
        # Contended calls take the pool as usual; a pool of fewer than three connections
        # keeps none (the worker's loops would starve).
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
        connect_timeout: float | None = None,
        statement_timeout: float | None = None,
        application_name: str | None = None,
        **connect_kwargs: Any,
    ) -> PostgresStore:
        """Open a pool to `dsn`: a libpq URI (`postgresql://user:pw@host:5432/db`), a libpq
        keyword/value string (`host=db dbname=app user=u password='a b'`), or None to read
        the PG* environment variables.

        `ssl` is passed to asyncpg: an `ssl.SSLContext` for TLS with your own trust
        settings, or a libpq sslmode string such as "verify-full" (else the DSN's sslmode).
        `statement_timeout` (seconds) bounds every statement; `connect_timeout` bounds
        connecting (default: the DSN's connect_timeout, else 10 s); `application_name`
        defaults to the DSN's, else "venturi". The prefix and the DSN's form are validated
        before any connection is made.
        """
        sql.validate_prefix(prefix)
        parsed = _dsn.connect_args(dsn)
        settings = dict(parsed.server_settings)
        if application_name is not None:
            settings["application_name"] = application_name
        settings.setdefault("application_name", "venturi")
        if statement_timeout is not None:
            settings["statement_timeout"] = str(int(statement_timeout * 1000))
        timeout = connect_timeout if connect_timeout is not None else parsed.timeout
        if timeout is None:
            timeout = 10.0
        options: dict[str, Any] = {
            "ssl": ssl,
            # asyncpg takes None (its stubs say float) for libpq's connect_timeout=0: no limit
            "timeout": None if math.isinf(timeout) else timeout,
            "server_settings": settings,
            **connect_kwargs,
        }
        pool = await asyncpg.create_pool(
            parsed.dsn, min_size=min_size, max_size=max_size, reset=_keep_session, **options
        )
        return cls(pool, prefix=prefix, owns_pool=True, connect_args=(parsed.dsn, options))

    @classmethod
    def from_pool(cls, pool: asyncpg.Pool, *, prefix: str = DEFAULT_PREFIX) -> PostgresStore:
        """Use an existing asyncpg pool (the store will not close it).

        The worker holds one connection of it for LISTEN, so size the pool for that.
        """
        return cls(pool, prefix=prefix, owns_pool=False)

    def with_prefix(self, prefix: str) -> PostgresStore:
        """Another queue namespace over the same pool (which this store keeps owning)."""
        return PostgresStore(
            self._pool_or_raise(),
            prefix=prefix,
            owns_pool=False,
            connect_args=self._connect_args,
        )

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def pool_max_size(self) -> int:
        """The most connections the pool opens."""
        return int(self._pool.get_max_size())

    @property
    def listens_outside_pool(self) -> bool:
        """True when LISTEN uses a connection of its own (stores made by `connect()`)."""
        return self._connect_args is not None

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

    # Every statement runs through these instead of the pool's own shortcuts: a connection
    # that failed mid-statement (the server went away, a reply was half read, a timeout or
    # cancellation struck) is terminated instead of going back to the pool, where the next
    # caller would trip over its leftover state ("cannot switch to state 12; another
    # operation is in progress"). The pool has no reset query to catch that (see
    # `_keep_session`), so this is where it is caught.

    async def _fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        pool = self._pool_or_raise()
        conn = await pool.acquire()
        try:
            return await conn.fetch(query, *args)
        except BaseException as exc:
            _discard_if_broken(conn, exc)
            raise
        finally:
            await _release(pool, conn)

    async def _fetchval(self, query: str, *args: Any) -> Any:
        pool = self._pool_or_raise()
        conn = await pool.acquire()
        try:
            return await conn.fetchval(query, *args)
        except BaseException as exc:
            _discard_if_broken(conn, exc)
            raise
        finally:
            await _release(pool, conn)

    async def _fetchrow(self, query: str, *args: Any) -> asyncpg.Record | None:
        pool = self._pool_or_raise()
        conn = await pool.acquire()
        try:
            return await conn.fetchrow(query, *args)
        except BaseException as exc:
            _discard_if_broken(conn, exc)
            raise
        finally:
            await _release(pool, conn)

    async def _execute(self, query: str, *args: Any) -> None:
        pool = self._pool_or_raise()
        conn = await pool.acquire()
        try:
            await conn.execute(query, *args)
        except BaseException as exc:
            _discard_if_broken(conn, exc)
            raise
        finally:
            await _release(pool, conn)

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[asyncpg.pool.PoolConnectionProxy[Any]]:
        """A pooled connection inside a transaction, discarded if it breaks."""
        pool = self._pool_or_raise()
        conn = await pool.acquire()
        try:
            async with conn.transaction():
                yield conn
        except BaseException as exc:
            _discard_if_broken(conn, exc)
            raise
        finally:
            await _release(pool, conn)

    # -- schema ----------------------------------------------------------------------

    async def migrate(self) -> list[int]:
        """Apply pending migrations; returns the versions applied (empty if up to date).

        Idempotent, and safe with many processes starting at once: everything runs in one
        transaction under an advisory lock keyed by the prefix.
        """
        applied_now: list[int] = []
        async with self._transaction() as conn:
            await conn.execute(self._q["lock_migrations"], _lock_key(self._prefix))
            await conn.execute(self._q["migration_table_create"])
            done = {r[0] for r in await conn.fetch(self._q["migration_list"])}
            self._refuse_newer(done)
            for migration in sql.migrations(self._prefix):
                if migration.version in done:
                    continue
                await conn.execute(migration.sql)
                await conn.execute(self._q["migration_record"], migration.version, migration.name)
                applied_now.append(migration.version)
        return applied_now

    async def check_schema(self) -> None:
        """Raise `SchemaError` unless the prefix's schema is exactly the one this release's
        migrations make: missing tables or migrations say "run venturi migrate", migrations
        this release does not know (a newer release migrated) say "upgrade venturi".

        One small query; workers run it before they claim anything.
        """
        try:
            rows = await self._fetch(self._q["migration_list"])
        except asyncpg.UndefinedTableError as exc:
            raise self._missing_schema(exc) from None
        done = {r[0] for r in rows}
        self._refuse_newer(done)
        missing = sorted({m.version for m in sql.migrations(self._prefix)} - done)
        if missing:
            raise SchemaError(
                f"the schema of prefix {self._prefix!r} lacks migrations {missing}: run "
                f"`venturi migrate` (or `await store.migrate()`) before starting workers"
            )

    def _refuse_newer(self, done: set[int]) -> None:
        unknown = sorted(done - {m.version for m in sql.migrations(self._prefix)})
        if unknown:
            raise SchemaError(
                f"the schema of prefix {self._prefix!r} has migrations {unknown} that this "
                f"release of venturi does not know: a newer release migrated it; upgrade "
                f"venturi here (running against a schema it does not know could corrupt jobs)"
            )

    def _missing_schema(self, exc: asyncpg.UndefinedTableError) -> SchemaError:
        """asyncpg's "relation ... does not exist" on an unmigrated prefix, said plainly (the
        cause is kept: the operator matches "does not exist")."""
        return SchemaError(
            f"{exc}: the tables of prefix {self._prefix!r} are missing; run `venturi migrate` "
            f"(or `await store.migrate()`) first"
        )

    # -- producing -------------------------------------------------------------------

    async def insert(self, job: NewJob) -> None:
        query, args = self._q["job_insert"], (*_insert_args(job), self.channel)
        pool = self._pool_or_raise()
        if self._held_lock.locked() or not self._owns_pool or self.pool_max_size < 3:
            # Contended, or the caller's pool (which must close even if this store is not).
            try:
                await self._execute(query, *args)
            except asyncpg.UndefinedTableError as exc:
                raise self._missing_schema(exc) from None
            return
        async with self._held_lock:
            if self._held is None:
                self._held = await pool.acquire()
            try:
                await self._held.execute(query, *args)
            except BaseException as exc:
                if isinstance(exc, asyncpg.UndefinedTableError):
                    raise self._missing_schema(exc) from None
                if not breaks_connection(exc):
                    raise  # the statement failed; the connection is fine
                # Broken or cancelled mid-statement: drop the connection whatever its state
                # (the pool opens a fresh one when needed). The caller sees the error, as
                # with any failed enqueue; nothing is retried behind its back.
                held, self._held = self._held, None
                held.terminate()
                await _release(pool, held)
                raise

    @_schema_required
    async def insert_many(self, jobs: Sequence[NewJob]) -> None:
        """Insert many jobs of one named queue in one statement (one round trip)."""
        if not jobs:
            return
        queue = jobs[0].queue
        if any(j.queue != queue for j in jobs):
            raise ValueError("insert_many: every job of a batch must belong to the same queue")
        await self._execute(
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

    @_schema_required
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
        await self._execute(
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

    @_schema_required
    async def insert_deduplicated(
        self, job: NewJob, decide: Callable[[ExistingJob], MergePlan]
    ) -> ULID:
        """Insert `job` unless a pending job of the same queue, kind and dedup key exists;
        then `decide` (pure) chooses, and the plan is applied. Returns the id that holds the
        work.

        Producers of one (queue, kind, key) are serialized by an advisory lock, so concurrent
        enqueues end as the merge policy says, never with two rows where it said one.
        """
        assert job.dedup_key is not None
        async with self._transaction() as conn:
            await conn.execute(self._q["dedup_lock"], _dedup_lock_key(self._prefix, job))
            row = await conn.fetchrow(
                self._q["job_find_pending_duplicate"], job.kind, job.dedup_key, job.queue
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
        queues: Sequence[str],
        kinds: Sequence[str],
        limit: int,
        worker: str,
        pod: str | None,
        default_lease_s: float,
        reserved_low: int = 0,
        reserved_normal: int = 0,
        held_lease_s: float | None = None,
    ) -> list[ClaimedJob]:
        """Claim up to `limit` jobs of `queues`, emptying them in that order (one statement);
        within a queue `reserved_low` of the slots go to LOW jobs first and `reserved_normal`
        to NORMAL-or-LOW ones (anti-starvation), the rest to any tier.

        `held_lease_s` is how long the shortest lease this worker already holds has left
        (None: it holds none). A claim whose leases end sooner than that announces them
        (`listen(on_lease=...)`), so every other worker's rescuer knows when to look:
        one notification per busy period, not per claim (see `Rescuer`).
        """
        rows = await self._fetch(
            self._q["job_claim"],
            list(queues),
            list(kinds),
            limit,
            reserved_low,
            reserved_normal,
            worker,
            pod,
            default_lease_s,
            held_lease_s,
            self.channel,
        )
        return [
            ClaimedJob(
                id=r["id"],
                kind=r["kind"],
                queue=r["queue"],
                payload=r["payload"],
                carry=r["carry"],
                run_count=r["run_count"],
                failures=r["failures"],
                claim_token=r["claim_token"],
                lease_s=r["lease_s"],
                backoff_base_s=r["backoff_base_s"],
                backoff_cap_s=r["backoff_cap_s"],
                waited_s=r["waited_s"],
                history=_history(r["history"]),
            )
            for r in rows
        ]

    async def settle(self, settlements: Sequence[Settlement], *, worker: str) -> set[uuid.UUID]:
        """Write outcomes and journal rows; returns the ids this worker still owned."""
        rows = await self._fetch(
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
        rows = await self._fetch(
            self._q["job_renew_leases"], list(ids), list(tokens), list(lease_s)
        )
        return {r[0] for r in rows}

    async def release_unheld(
        self, *, worker: str, held: Sequence[uuid.UUID], note: str
    ) -> list[tuple[uuid.UUID, str]]:
        """Hand back every job the database says `worker` holds but it does not: a claim
        whose reply was lost with the connection. Journaled as `released` (not a failure),
        eligible at once. Returns (id, kind) of each job released."""
        rows = await self._fetch(
            self._q["job_release_unheld"], worker, list(held), note, self.channel
        )
        return [(r["id"], r["kind"]) for r in rows]

    async def recover_stale(
        self,
        decide: Callable[[list[StaleJob]], list[Recovery]],
        *,
        queues: Sequence[str],
        worker: str,
        limit: int = 500,
    ) -> list[Recovered]:
        """Recover jobs of `queues` whose lease expired: lock them, let `decide` (pure)
        choose, write. Returns what became of each recovered job.
        """
        async with self._transaction() as conn:
            rows = await conn.fetch(self._q["job_select_stale"], limit, list(queues))
            if not rows:
                return []
            stale = [
                StaleJob(
                    id=r["id"],
                    kind=r["kind"],
                    run_count=r["run_count"],
                    failures=r["failures"],
                    backoff_base_s=r["backoff_base_s"],
                    backoff_cap_s=r["backoff_cap_s"],
                    claimed_by=r["claimed_by"],
                )
                for r in rows
            ]
            tokens = {r["id"]: r["claim_token"] for r in rows}
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
        return [
            Recovered(
                id=ULID.from_bytes(r["id"].bytes),
                kind=r["kind"],
                queue=r["queue"],
                run=r["run_count"],
                status=JobStatus(r["status"]),
                note=r["note"],
            )
            for r in recovered
        ]

    async def next_lease_expiry(self, queues: Sequence[str]) -> float | None:
        """Seconds until the earliest lease in `queues` expires (negative if already
        expired; None when nothing is claimed there)."""
        value: float | None = await self._fetchval(self._q["lease_next_expiry"], list(queues))
        return value

    async def next_due(self, kinds: Sequence[str]) -> float | None:
        """Seconds until the next scheduled job of these kinds becomes eligible."""
        value: float | None = await self._fetchval(self._q["job_next_due"], list(kinds))
        return value

    @asynccontextmanager
    async def listen(
        self,
        on_notify: Callable[[str], None],
        on_lost: Callable[[], None],
        on_lease: Callable[[str, float], None] | None = None,
    ) -> AsyncIterator[Listening]:
        """Hold one connection LISTENing on the store's channel.

        `on_notify(kind)` runs for every job made claimable (an empty kind: any);
        `on_lease(queue, seconds)` for a claim that took leases ending sooner than any its
        worker held; `on_lost()` when the connection terminates. Yields a handle to probe
        the connection for liveness.
        """

        def control(_prefix: str, payload: str) -> None:
            if on_lease is None or not payload.startswith(_LEASE_NOTICE):
                return
            _, seconds, queue = payload.split(" ", 2)
            on_lease(queue, float(seconds))

        async with self.listen_queues(
            [self._prefix], lambda _prefix, kind: on_notify(kind), on_lost, on_control=control
        ) as listening:
            yield listening

    @asynccontextmanager
    async def listen_queues(
        self,
        prefixes: Sequence[str],
        on_notify: Callable[[str, str], None],
        on_lost: Callable[[], None],
        *,
        on_control: Callable[[str, str], None] | None = None,
    ) -> AsyncIterator[Listening]:
        """One connection LISTENing on the channels of several queues of this database
        (`on_notify(prefix, kind)`): a watcher of many queues holds one connection, not one
        per queue. Notifications that are not about a kind (they start with "!") go to
        `on_control(prefix, payload)`, if given.

        A store opened by `connect()` listens on a connection of its own, outside the pool
        (LISTEN is session state, and a long-held pooled connection would shrink the pool
        the worker's loops and handlers share); a `from_pool` store takes one from the pool.
        """
        channels = {f"{sql.validate_prefix(p)}_jobs": p for p in prefixes}

        def notified(_conn: object, _pid: int, channel: str, payload: object) -> None:
            text = str(payload)
            if text.startswith("!"):
                if on_control is not None:
                    on_control(channels[channel], text)
            else:
                on_notify(channels[channel], text)

        def terminated(_conn: object) -> None:
            on_lost()

        pool = self._pool_or_raise()
        if self._connect_args is not None:
            dsn, options = self._connect_args
            options = {k: v for k, v in options.items() if k not in _POOL_ONLY}
            settings = dict(options.get("server_settings") or {})
            settings["application_name"] = settings.get("application_name", "venturi") + " listen"
            options["server_settings"] = settings
            conn: Any = await asyncpg.connect(dsn, **options)
        else:
            conn = await pool.acquire()
        try:
            conn.add_termination_listener(terminated)
            for channel in channels:
                await conn.add_listener(channel, notified)
            yield Listening(conn, self._q["connection_probe"])
        finally:
            # Close rather than UNLISTEN channel by channel: it cannot be interrupted
            # half-way (by a cancellation at shutdown). A pooled connection that died is
            # already back in its pool (detached from this proxy), and has nothing to close.
            if self._connect_args is not None:
                conn.remove_termination_listener(terminated)
                conn.terminate()
            else:
                if not _detached(conn):
                    conn.remove_termination_listener(terminated)
                    conn.terminate()
                await _release(pool, conn)

    # -- operations ------------------------------------------------------------------

    @_schema_required
    async def get_job(self, job_id: ULID | uuid.UUID) -> Job | None:
        row = await self._fetchrow(self._q["job_get"], _as_uuid(job_id))
        return None if row is None else _job(row)

    @_schema_required
    async def list_jobs(self, f: HistoryFilter) -> list[Job]:
        rows = await self._fetch(
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

    @_schema_required
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
            n: int = await self._fetchval(
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

    @_schema_required
    async def journal(self, job_id: ULID | uuid.UUID) -> list[JournalEntry]:
        rows = await self._fetch(self._q["journal_list_for_job"], _as_uuid(job_id))
        return list(_journal(rows))

    @_schema_required
    async def stats(self) -> Stats:
        rows = await self._fetch(self._q["stats"])
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


_LEASE_NOTICE = "!lease "
"""Payload prefix of a claim's lease announcement: "!lease <seconds> <queue>"."""
_POOL_ONLY = frozenset({"setup", "init", "max_queries", "max_inactive_connection_lifetime"})
"""Pool arguments that a single connection does not take."""


def _discard_if_broken(conn: asyncpg.pool.PoolConnectionProxy[Any], exc: BaseException) -> None:
    """Terminate a pooled connection that failed mid-statement (see `PostgresStore._fetch`)."""
    if breaks_connection(exc) and not _detached(conn):
        conn.terminate()


def _detached(conn: Any) -> bool:
    """True once the pool took the connection back (it died, or was released)."""
    return getattr(conn, "_con", None) is None


async def _release(pool: asyncpg.Pool, conn: asyncpg.pool.PoolConnectionProxy[Any]) -> None:
    """Give a connection back to its pool; a dead or detached one is simply dropped (the pool
    opens another when needed), and the release never masks the caller's own error."""
    # When the release's rollback or reset fails, asyncpg has terminated the connection.
    with contextlib.suppress(asyncpg.InterfaceError, asyncpg.PostgresError, OSError, TimeoutError):
        await pool.release(conn)


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
    # Unambiguous: neither a prefix nor a queue name nor a KIND can hold a NUL.
    key = f"venturi:dedup:{prefix}\0{job.queue}\0{job.kind}\0{job.dedup_key}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big", signed=True)


class Listening:
    """A live LISTEN connection, as `PostgresStore.listen` yields it."""

    def __init__(self, conn: Any, probe_sql: str) -> None:
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
