"""`PostgresStore`: the PostgreSQL adapter (with its package `_db`).

It owns the connection pool and runs every statement (in `_db/queries/`, run by name with
keyword arguments): the hot path's itself, those of a concern of their own through the classes
of `_db/` on the same runner (`schema`: migrations and start-up checks; `failed`;
`failure_steps`; `batches`; `registry`; `leadership`; `listener`: LISTEN, on connections of
its own). It speaks plain records (`_records`), never task types, so the typed world above it
(Queue, Worker) stays free of SQL.

A store runs its statements on its pool, or, bound by `using(conn)`, on a connection the
caller holds, inside the caller's transaction: the same statements either way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import logging
import math
import ssl as ssl_module
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, Self, TypeVar, cast

import asyncpg
import msgspec
from ulid import ULID

from venturi import _dsn
from venturi._db import sql
from venturi._db.batches import Batches
from venturi._db.failed import FailedJobs
from venturi._db.failure_steps import FailureSteps
from venturi._db.failures import breaks_connection
from venturi._db.leadership import Leadership
from venturi._db.listening import Listener
from venturi._db.listening import Listening as Listening  # what `listen` yields
from venturi._db.registry import Registry
from venturi._db.rows import history
from venturi._db.rows import journal as rows_journal
from venturi._db.run import (
    CallersConnection,
    Pooled,
    Runner,
    detached,
    discard_if_broken,
    release,
)
from venturi._db.run import Connection as Connection  # the caller's: see `using`
from venturi._db.run import Pooler as Pooler
from venturi._db.schema import MIGRATE_LOCK_TIMEOUT as MIGRATE_LOCK_TIMEOUT
from venturi._db.schema import MIGRATE_PATIENCE, Schema
from venturi._records import (
    ClaimedJob,
    ExistingJob,
    MergePlan,
    NewBatch,
    NewJob,
    NewJobs,
    NextDue,
    Recovered,
    Recovery,
    Settlement,
    StaleJob,
)
from venturi._shown import shown
from venturi._stats import stats_from_rows
from venturi.codec import DEFAULT_CODEC, Codec
from venturi.errors import SchemaError, StoreClosedError
from venturi.jobs import (
    BatchStatus,
    CleanupCriteria,
    FailedJob,
    Job,
    JobFilter,
    JobStatus,
    JournalEntry,
    MinuteCounts,
    Stats,
)
from venturi.pauses import QueueState
from venturi.registry import WorkerInfo
from venturi.schedules import ScheduleInfo

DEFAULT_PREFIX = "venturi"
DEFAULT_HOOK_LEASE_S = 15 * 60.0
"""Seconds a dead job's failure step is leased to the worker that made it dead (the worker's
lease, when it passes one)."""

# Seconds between two prunes of the per-minute counts by one store's settles: old minutes are
# few, and any writer may delete them, so a minute's delay costs nothing.
PRUNE_INTERVAL_S = 60.0

CLOSE_GRACE = 10.0
"""Seconds `close()` waits for connections in use to be released before terminating them."""

logger = logging.getLogger(__name__)

SSLMode = Literal["disable", "prefer", "allow", "require", "verify-ca", "verify-full"]
POOLERS: tuple[Pooler, ...] = ("none", "transaction")


CLAIM_COLUMNS = (
    "id", "kind", "queue", "payload", "carry", "run_count", "failures", "claim_token",
    "lease_s", "backoff_base_s", "backoff_cap_s", "waited_s", "history", "max_attempts",
    "timeout_s", "batch_id", "priority", "reserved", "trace_context",
)  # fmt: skip
"""The columns of a claim's reply (job_claim, job_claim_queue), in order."""


def _claimed_jobs(rows: list[asyncpg.Record]) -> list[ClaimedJob]:
    """The jobs of a claim's reply. Its column names are checked once per reply, then each
    row is unpacked and passed in that order (`ClaimedJob`'s fields are in it): reading 19
    columns by name and passing them by keyword costs about 3 us a job, this about 1."""
    if not rows:
        return []
    if tuple(rows[0].keys()) != CLAIM_COLUMNS:
        raise RuntimeError(f"a claim replied with columns {tuple(rows[0].keys())}")
    return [
        ClaimedJob(
            id_, kind, queue, payload, carry, run_count, failures, claim_token, lease_s,
            backoff_base_s, backoff_cap_s, waited_s, history(history_json), max_attempts,
            timeout_s, batch_id, priority, reserved, trace_context,
        )
        for (
            id_, kind, queue, payload, carry, run_count, failures, claim_token, lease_s,
            backoff_base_s, backoff_cap_s, waited_s, history_json, max_attempts, timeout_s,
            batch_id, priority, reserved, trace_context,
        ) in rows
    ]  # fmt: skip


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool release without asyncpg's default reset query (one extra round trip per call).

    Every venturi statement is self-contained: no session settings, cursors, or session-level
    advisory locks; the LISTEN connection unlistens before release, and asyncpg still rolls
    back any open transaction on its own.
    """


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
            raise await self._missing_schema(exc) from None

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
        conn: CallersConnection | None = None,
        pooler: Pooler = "none",
        statement_timeout_ms: int | None = None,
    ) -> None:
        self._prefix = sql.validate_prefix(prefix)
        self._q = sql.queries(prefix)
        self._pool = pool
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # made outside a loop: not checked
            self._loop = None
        self._owns_pool = owns_pool and conn is None
        self._connect_args = connect_args
        """How LISTEN connects, on a connection of its own outside the pool (None: it takes
        one of the pool's)."""
        self._conn = conn
        """The caller's connection this store is bound to (`using`), if any."""
        self._pooler = _check_pooler(pooler)
        self._statement_timeout_ms = statement_timeout_ms
        """Through a transaction pooler, set per transaction (`begin_with_timeout`)."""
        begin = None
        if pooler == "transaction" and statement_timeout_ms is not None:
            # A literal integer (SET takes no parameters), so nothing can be injected.
            begin = self._q["begin_with_timeout"].text.replace(
                "{statement_timeout_ms}", str(int(statement_timeout_ms))
            )
        self._run: Runner = (
            conn if conn is not None else Pooled(self._pool_or_raise, self._q, begin=begin)
        )
        self._closed = False
        # One connection of its own pool kept for single enqueues while no other enqueue is
        # using it: a pool acquire/release costs about a tenth of an enqueue.
        # Contended calls take the pool as usual; a pool of fewer than three connections
        # keeps none (the worker's loops would starve).
        self._held: asyncpg.pool.PoolConnectionProxy[Any] | None = None
        self._held_lock = asyncio.Lock()
        # When a settle next prunes the per-minute counts (monotonic seconds; 0: the first).
        self._prune_due = 0.0

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
        pooler: Pooler = "none",
        listen_dsn: str | None = None,
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

        `pooler="transaction"` says `dsn` reaches PostgreSQL through PgBouncer (or another
        pooler) in transaction mode, where session state does not survive a transaction:
        venturi then keeps none. No prepared-statement cache (`statement_cache_size=0`),
        `statement_timeout` set with SET LOCAL in a transaction around each statement (two
        more round trips per statement: prefer the role's setting, `ALTER ROLE ... SET
        statement_timeout`, and leave this unset), locks that end with their transaction
        (venturi takes no other kind), and LISTEN only on `listen_dsn`, a direct connection
        to PostgreSQL; without it workers poll, so a new job waits up to the worker's
        `poll_max`. `listen_dsn` may also be given without a pooler (LISTEN elsewhere).
        """
        sql.validate_prefix(prefix)
        _check_pooler(pooler)
        _check_seconds("statement_timeout", statement_timeout, low=0.001)
        _check_seconds("connect_timeout", connect_timeout, low=0.001)
        parsed = _dsn.connect_args(dsn)
        listen = None if listen_dsn is None else _dsn.connect_args(listen_dsn)
        settings = dict(parsed.server_settings)
        if application_name is not None:
            settings["application_name"] = application_name
        settings.setdefault("application_name", "venturi")
        timeout_ms = None if statement_timeout is None else int(statement_timeout * 1000)
        if timeout_ms is not None and pooler == "none":
            settings["statement_timeout"] = str(timeout_ms)
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
        if pooler == "transaction":
            # A pooler hands each transaction any of its server connections, where a named
            # prepared statement of another client's may or may not exist.
            options.setdefault("statement_cache_size", 0)
        pool = await asyncpg.create_pool(
            parsed.dsn, min_size=min_size, max_size=max_size, reset=_keep_session, **options
        )
        # LISTEN on a connection of its own: `listen_dsn`'s, else the pool's DSN unless a
        # transaction pooler is in between (none then: workers poll).
        listen_args: tuple[str | None, dict[str, Any]] | None = None
        if listen is not None:
            listen_args = (listen.dsn, _listen_options(options, listen, timeout_ms))
        elif pooler == "none":
            listen_args = (parsed.dsn, options)
        return cls(
            pool,
            prefix=prefix,
            owns_pool=True,
            connect_args=listen_args,
            pooler=pooler,
            statement_timeout_ms=timeout_ms,
        )

    @classmethod
    def from_pool(
        cls,
        pool: asyncpg.Pool,
        *,
        prefix: str = DEFAULT_PREFIX,
        pooler: Pooler = "none",
        listen_dsn: str | None = None,
    ) -> PostgresStore:
        """Use an existing asyncpg pool (the store will not close it).

        The worker holds one connection of it for LISTEN, so size the pool for that, unless
        `listen_dsn` names a connection of its own for LISTEN. `pooler="transaction"`: the
        pool reaches PostgreSQL through a pooler in transaction mode (see `connect`; create
        the pool with `statement_cache_size=0`); without `listen_dsn` workers then poll.
        """
        listen_args = None
        if listen_dsn is not None:
            listen = _dsn.connect_args(listen_dsn)
            listen_args = (listen.dsn, _listen_options({}, listen, None))
        return cls(pool, prefix=prefix, owns_pool=False, connect_args=listen_args, pooler=pooler)

    def with_prefix(self, prefix: str) -> PostgresStore:
        """Another queue namespace over the same pool (which this store keeps owning), or
        the same caller's connection."""
        other = PostgresStore(
            self._pool_or_raise() if self._conn is None else self._pool,
            prefix=prefix,
            owns_pool=False,
            connect_args=self._connect_args,
            conn=self._conn,
            pooler=self._pooler,
            statement_timeout_ms=self._statement_timeout_ms,
        )
        other._loop = self._loop
        return other

    def using(self, conn: Connection, *, autocommit: bool = False) -> PostgresStore:
        """This store's queue (same prefix), on a connection the caller holds: every
        statement runs on `conn` (an `asyncpg.Connection`, or one acquired from a pool),
        inside the caller's transaction, so what it writes exists only if that transaction
        commits, and its wake-ups (NOTIFY) are delivered at the commit.

        Each call raises `ValueError` while `conn` is not in a transaction, unless
        `autocommit=True` says that each statement committing on its own is meant. A
        deduplicated enqueue runs under a savepoint and holds its key's lock until the
        caller's transaction ends. Cheap to make: one per transaction, or per call, is fine.
        The bound store never closes `conn`, and cannot LISTEN.
        """
        bound = PostgresStore(
            self._pool,
            prefix=self._prefix,
            owns_pool=False,
            connect_args=self._connect_args,
            conn=CallersConnection(conn, self._q, autocommit=autocommit),
            pooler=self._pooler,
        )
        bound._loop = self._loop
        return bound

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def bound(self) -> bool:
        """True for a store made by `using()`: it runs on the caller's connection."""
        return self._conn is not None

    @property
    def registry(self) -> Registry:
        """The worker registry's statements (`_db/registry.py`), on this store's runner."""
        return Registry(self._run, self._q)

    @property
    def batches(self) -> Batches:
        """The batches' statements (`_db/batches.py`), on this store's runner."""
        return Batches(self._run, self._q)

    @property
    def leadership(self) -> Leadership:
        """The leader lease's statements (`_db/leadership.py`), on this store's runner."""
        return Leadership(self._run, self._q)

    @property
    def pool_max_size(self) -> int:
        """The most connections the pool opens."""
        return int(self._pool.get_max_size())

    @property
    def listens_outside_pool(self) -> bool:
        """True when LISTEN uses a connection of its own (stores made by `connect()`, or
        given a `listen_dsn`)."""
        return self._connect_args is not None

    @property
    def pooler(self) -> Pooler:
        """The pooler this store was told it connects through ("none" or "transaction")."""
        return self._pooler

    @property
    def can_listen(self) -> bool:
        """False through a transaction pooler without a `listen_dsn`: LISTEN is session
        state, which such a pooler does not keep; workers then poll (bounded by
        `poll_max`)."""
        return self.listener.can_listen

    @property
    def channel(self) -> str:
        """The NOTIFY channel: every write that makes a job claimable signals it."""
        return f"{self._prefix}_jobs"

    @property
    def results_channel(self) -> str:
        """The NOTIFY channel of awaited jobs that finished (payload: the job's uuid)."""
        return f"{self._prefix}_results"

    async def close(self, grace: float = CLOSE_GRACE) -> None:
        """Close the pool if this store opened it. Safe to call twice.

        Waits up to `grace` seconds for connections still in use to be released, then
        terminates them (and says so in the log): a connection some task never gives back
        must not keep a stopping process alive until it is killed."""
        if self._closed:
            return
        if not (isinstance(grace, (int, float)) and math.isfinite(grace) and grace >= 0):
            raise ValueError(f"close(grace): expected seconds >= 0, got {grace!r}")
        self._closed = True
        try:
            async with asyncio.timeout(grace):
                async with self._held_lock:  # an enqueue on the kept connection finishes first
                    if self._held is not None:
                        held, self._held = self._held, None
                        await self._pool.release(held)
                if self._owns_pool:
                    await self._pool.close()
        except TimeoutError:
            if self._owns_pool:
                self._pool.terminate()  # a cancelled close terminates too; this covers the rest
            logger.warning(
                "closing the store: connections still in use after %gs were terminated", grace
            )

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
        if self._loop is not None and _running_loop(self._loop) is not self._loop:
            # asyncpg would say "Event loop is closed" or "attached to a different loop".
            raise RuntimeError(
                "this PostgresStore was connected in another event loop: its connections "
                "belong to that loop; connect a store in each loop (each asyncio.run())"
            )
        return self._pool

    # -- schema ----------------------------------------------------------------------

    @property
    def schema(self) -> Schema:
        """The schema's statements (`_db/schema.py`), on this store's runner."""
        return Schema(self._run, self._q, self._prefix, bound=self._conn is not None)

    async def migrate(
        self, *, lock_timeout: float = MIGRATE_LOCK_TIMEOUT, patience: float = MIGRATE_PATIENCE
    ) -> list[int]:
        """Apply pending migrations; returns the versions applied (empty if up to date).

        Idempotent, and safe with many processes starting at once: everything runs in one
        transaction under an advisory lock keyed by the prefix. Up to date, it only reads.
        A migration's statement waits at most `lock_timeout` seconds for a lock on a table
        (an open transaction of the application holds one), then the migration rolls back
        and tries again a little later, for up to `patience` seconds; meanwhile the queue
        runs (a DDL statement waiting for its lock would hold up every statement on the
        table). `lock_timeout=0` waits as long as it takes.
        """
        return await self.schema.migrate(lock_timeout=lock_timeout, patience=patience)

    async def check_schema(self) -> None:
        """Raise `SchemaError` unless the prefix's schema is exactly the one this release's
        migrations make: missing tables or migrations say "run venturi migrate", migrations
        this release does not know (a newer release migrated) say "upgrade venturi".

        One small query; workers run it before they claim anything.
        """
        await self.schema.check_schema()

    async def check_privileges(self) -> None:
        """Raise `SchemaError` naming the prefix's tables on which this store's role lacks a
        privilege a worker needs (SELECT, INSERT, UPDATE and DELETE on each, SELECT only on
        the migrations' record, USAGE on the journal's id sequence), with the GRANT that
        mends it. Workers run it at start, after `check_schema`: a role granted before a
        migration added a table would otherwise claim nothing, each claim refused."""
        await self.schema.check_privileges()

    async def _missing_schema(self, exc: asyncpg.UndefinedTableError) -> SchemaError:
        return await self.schema.missing_schema(exc)

    # -- producing -------------------------------------------------------------------

    @_schema_required
    async def insert_chain(self, jobs: NewJobs) -> None:
        """Insert a chain's jobs, in order, each waiting for the one before it: on the
        caller's connection (inside its transaction), else in a transaction of its own."""
        ids = [_as_uuid(i) for i in jobs.ids]
        link = {
            "ids": ids,
            "nexts": [*ids[1:], None],
            "waits": [False] + [True] * (len(ids) - 1),
        }
        async with self._in_transaction() as tx:
            await tx.insert(jobs)
            await tx._run.execute(tx._q["chain_link"], **link)

    @_schema_required
    async def insert_batch(
        self,
        batch: NewBatch,
        members: NewJobs,
        callbacks: NewJobs,
        roles: Sequence[str],
    ) -> None:
        """Insert a batch: its row, its members and its callbacks (held waiting, `roles[i]`
        naming callback i: then, catch or finally), in one transaction: the caller's (a store
        made by `using`), else one of its own. A batch without members finishes at once."""
        values = {"id": batch.id, "name": batch.name, "allow_failures": batch.allow_failures}
        async with self._in_transaction() as tx:
            await tx._run.execute(tx._q["batch_insert"], total=len(members), **values)
            await tx.insert(dataclasses.replace(members, batch_id=batch.id))
            if callbacks.ids:
                await tx.insert(dataclasses.replace(callbacks, batch_id=batch.id))
                await tx._run.execute(
                    tx._q["batch_hold_callbacks"],
                    ids=[_as_uuid(i) for i in callbacks.ids],
                    whiches=list(roles),
                )
            if not members.ids:
                await tx._run.execute(tx._q["batch_finish"], id=batch.id)

    @asynccontextmanager
    async def _in_transaction(self) -> AsyncIterator[PostgresStore]:
        """This store on one connection inside one transaction: the caller's (a store made by
        `using`), else a pooled connection's own, committed when the block ends."""
        if self._conn is not None:
            yield self
            return
        async with self._pool_or_raise().acquire() as conn, conn.transaction():
            yield self.using(conn)

    async def insert(self, jobs: NewJobs) -> None:
        """Insert a batch of jobs (of one named queue, or of several) in one statement (one
        round trip), and wake listeners (at commit). Every enqueue comes here, a single one as
        a batch of one (which runs a statement of its own: see `job_insert_one`).
        """
        if not jobs.ids:
            return
        stmt, values = self._insert_statement(jobs)
        if (
            len(jobs.ids) != 1
            or self._conn is not None
            or self._held_lock.locked()
            or not self._holds_connection
        ):
            # A batch, contended, the caller's connection, or the caller's pool (which must
            # close even if this store is not).
            try:
                await self._run.execute(stmt, **values)
            except asyncpg.UndefinedTableError as exc:
                raise await self._missing_schema(exc) from None
            return
        args = stmt.args(values)
        pool = self._pool_or_raise()
        async with self._held_lock:
            if self._held is not None and (detached(self._held) or self._held.is_closed()):
                # Closed while kept (a server restart): as the pool does for its idle ones,
                # a fresh connection, not an error for this enqueue.
                kept, self._held = self._held, None
                await release(pool, kept)
            if self._held is None:
                self._held = await pool.acquire()
            try:
                await self._held.execute(stmt.text, *args)
            except BaseException as exc:
                if isinstance(exc, asyncpg.UndefinedTableError):
                    raise await self._missing_schema(exc) from None
                if not breaks_connection(exc):
                    raise  # the statement failed; the connection is fine
                # Broken or cancelled mid-statement: drop the connection whatever its state
                # (the pool opens a fresh one when needed). The caller sees the error, as
                # with any failed enqueue; nothing is retried behind its back.
                held, self._held = self._held, None
                if not discard_if_broken(pool, held, exc):
                    await release(pool, held)
                raise

    @property
    def _holds_connection(self) -> bool:
        """Whether single enqueues may keep a connection of the pool (see `__init__`): not
        when each statement needs a transaction of its own (a timeout through a pooler)."""
        return (
            self._owns_pool
            and self.pool_max_size >= 3
            and not (self._pooler == "transaction" and self._statement_timeout_ms is not None)
        )

    def _insert_statement(self, jobs: NewJobs) -> tuple[sql.Statement, dict[str, Any]]:
        """`job_insert` and its arguments, or, for a single job, `job_insert_one`."""
        if len(jobs.ids) != 1:
            return self._q["job_insert"], self._insert_values(jobs)
        return self._q["job_insert_one"], {
            "id": jobs.ids[0],
            "kind": jobs.kinds[0],
            "queue": jobs.queue,
            "priority": jobs.priorities[0],
            "run_at": _first(jobs.run_at),
            "delay_s": _first(jobs.delay_s),
            "payload": jobs.payloads[0],
            "lease_s": _first(jobs.lease_s),
            "backoff_base_s": _first(jobs.backoff_base_s),
            "backoff_cap_s": _first(jobs.backoff_cap_s),
            "dedup_key": _first(jobs.dedup_keys),
            "trace_context": _first(jobs.trace_contexts),
            "max_attempts": _first(jobs.max_attempts),
            "timeout_s": _first(jobs.timeout_s),
            "batch_id": jobs.batch_id,
            "channel": self.channel,
        }

    def _insert_values(self, jobs: NewJobs) -> dict[str, Any]:
        kinds = _varying(jobs.kinds)
        priorities = _varying(jobs.priorities)
        return {
            "queue": jobs.queue,
            "ids": jobs.ids,
            "kind": jobs.kinds[0] if kinds is None else None,
            "kinds": kinds,
            "priority": jobs.priorities[0] if priorities is None else None,
            "priorities": priorities,
            "payloads": jobs.payloads,
            "run_at": _column(jobs.run_at),
            "delay_s": _column(jobs.delay_s),
            "lease_s": _column(jobs.lease_s),
            "backoff_base_s": _column(jobs.backoff_base_s),
            "backoff_cap_s": _column(jobs.backoff_cap_s),
            "dedup_keys": _column(jobs.dedup_keys),
            "trace_contexts": _column(jobs.trace_contexts),
            "queues": jobs.queues,
            "max_attempts": _column(jobs.max_attempts),
            "timeout_s": _column(jobs.timeout_s),
            "batch_id": jobs.batch_id,
            "channel": self.channel,
            "wake_kinds": [jobs.kinds[0]] if kinds is None else list(set(kinds)),
        }

    @_schema_required
    async def insert_deduplicated(
        self, job: NewJob, decide: Callable[[ExistingJob], MergePlan]
    ) -> ULID:
        """Insert `job` unless a pending job of the same queue, kind and dedup key exists;
        then `decide` (pure) chooses, and the plan is applied. Returns the id that holds the
        work.

        Producers of one (queue, kind, key) are serialized by an advisory lock, so concurrent
        enqueues end as the merge policy says, never with two rows where it said one. On the
        caller's connection this runs under a savepoint: a failure (the lock timing out, say,
        or `decide` raising) rolls back only this enqueue, never the caller's transaction.
        """
        assert job.dedup_key is not None
        q = self._q
        async with self._run.transaction() as tx:
            await tx.execute(q["dedup_lock"], key=_dedup_lock_key(self._prefix, job))
            row = await tx.fetchrow(
                q["job_find_pending_duplicate"],
                kind=job.kind,
                dedup_key=job.dedup_key,
                queue=job.queue,
            )
            if row is not None:
                journal = await tx.fetch(q["journal_list_for_job"], id=row["id"])
                existing = ExistingJob(
                    id=row["id"],
                    payload=row["payload"],
                    carry=row["carry"],
                    run_count=row["run_count"],
                    journal=rows_journal(journal),
                )
                plan = decide(existing)
                if plan.action != "independent":
                    await tx.execute(
                        q["job_merge"],
                        id=existing.id,
                        payload=plan.payload,
                        set_carry=plan.set_carry,
                        carry=plan.carry,
                        priority=plan.priority,
                        action=plan.action,
                    )
                    return ULID.from_bytes(existing.id.bytes)
            stmt, values = self._insert_statement(NewJobs.of([job]))
            await tx.execute(stmt, **values)
            return job.id

    @_schema_required
    async def insert_unique(self, job: NewJob) -> ULID:
        """Insert `job` holding its unique id, unless a job of its kind holds it: then store
        nothing and return the holder's id (a holder whose time is up is detached first).

        Race-free through the unique index: of concurrent producers of one id, one inserts and
        the others wait for its commit and get its id. On the caller's connection this runs
        under a savepoint, so not even a serialization failure (REPEATABLE READ, a holder the
        snapshot cannot see) aborts the caller's transaction.
        """
        assert job.unique_key is not None
        assert job.unique_for_s is not None
        q = self._q
        values = {
            "id": job.id,
            "kind": job.kind,
            "queue": job.queue,
            "priority": job.priority,
            "run_at": job.run_at,
            "delay_s": job.delay_s,
            "payload": job.payload,
            "lease_s": job.lease_s,
            "backoff_base_s": job.backoff_base_s,
            "backoff_cap_s": job.backoff_cap_s,
            "unique_key": job.unique_key,
            "unique_for_s": job.unique_for_s,
            "trace_context": job.trace_context,
            "max_attempts": job.max_attempts,
            "timeout_s": job.timeout_s,
            "channel": self.channel,
        }
        for _ in range(10):  # another round only if the holder finished in between
            # Two statements, each committing on its own on the pool (no transaction needed:
            # the insert never fails on a collision); the caller's under a savepoint.
            async with (
                self._run.transaction() if self._conn is not None else _just(self._run)
            ) as run:
                if await run.fetch(q["job_insert_unique"], **values):
                    return job.id
                holder = await run.fetchval(
                    q["job_unique_holder"], kind=job.kind, unique_key=job.unique_key
                )
            if holder is not None:
                return ULID.from_bytes(holder.bytes)
        raise RuntimeError(f"unique id {job.unique_key!r} of {job.kind}: no holder, no insert")

    # -- consuming -------------------------------------------------------------------

    async def claim(
        self,
        *,
        queues: Sequence[str],
        kinds: Sequence[str] | None,
        limit: int,
        worker: str,
        pod: str | None,
        default_lease_s: float,
        reserved_low: int = 0,
        reserved_normal: int = 0,
        held_lease_s: float | None = None,
        traced: bool = False,
        skip_kinds: Sequence[str] = (),
    ) -> list[ClaimedJob]:
        """Claim up to `limit` jobs of `queues`, emptying them in that order (one statement:
        the claim function, or for one queue outside a pod its plain twin), of `kinds` (None:
        every kind but `skip_kinds`);
        within a queue `reserved_low` of the slots go to LOW jobs first and `reserved_normal`
        to NORMAL-or-LOW ones (anti-starvation), the rest to any tier. Jobs come back queue
        by queue, each in priority, then FIFO order; `_claims.spread_order` gives the order
        to start them in.

        `held_lease_s` is how long the earliest lease end the rescuers already know of has
        left: the shortest lease this worker holds, or one it announced (None: none). A claim
        whose leases end sooner than that announces them (`listen(on_lease=...)`), so every
        other worker's rescuer knows when to look: about one notification per lease, not
        per claim (see `Rescuer` and `Producer._known_lease_end`). `traced` also
        reads each job's stored trace context (for a worker whose middleware traces).
        """
        values: dict[str, Any] = {
            "kinds": None if kinds is None else list(kinds),
            "skip_kinds": list(skip_kinds),
            "n": limit,
            "reserved_low": reserved_low,
            "reserved_normal": reserved_normal,
            "worker": worker,
            "pod": pod,
            "default_lease_s": default_lease_s,
            "held_lease_s": held_lease_s,
            "channel": self.channel,
            "traced": traced,
        }
        if len(queues) == 1 and pod is None:  # the usual claim: a plain statement
            rows = await self._run.fetch(self._q["job_claim_queue"], queue=queues[0], **values)
        else:  # several queues in order, or a pod's (its fence): the claim function
            rows = await self._run.fetch(self._q["job_claim"], queues=list(queues), **values)
        return _claimed_jobs(rows)

    async def settle(
        self,
        settlements: Sequence[Settlement],
        *,
        worker: str,
        hook_lease_s: float = DEFAULT_HOOK_LEASE_S,
    ) -> set[uuid.UUID]:
        """Write outcomes and journal rows; returns the ids this worker still owned. A dead
        outcome's failure step is leased to this worker for `hook_lease_s`."""
        now = time.monotonic()
        prune = now >= self._prune_due
        if prune:
            self._prune_due = now + PRUNE_INTERVAL_S
        ids = [s.id for s in settlements]
        outcomes = [s.outcome for s in settlements]
        varying = _varying(outcomes)
        delays = [s.delay_s for s in settlements]
        # The usual batch (one outcome, no delay) sends each once, not once per job: asyncpg
        # checks every element of an array it encodes (about 0.25 us each).
        values = {
            "ids": ids,
            "tokens": [s.claim_token for s in settlements],
            "outcome": outcomes[0] if varying is None else None,
            "outcomes": varying,
            "delay_s": delays if any(delays) else None,
            "carries": _column([s.carry for s in settlements]),
            "set_carry": _flags([s.set_carry for s in settlements]),
            "notes": _column([s.note for s in settlements]),
            "attachments": _column([s.attachment for s in settlements]),
            "durations_s": [s.duration_s for s in settlements],
            "hook_tokens": _column([s.hook_token for s in settlements]),
            "hook_lease_s": hook_lease_s,
            "results": _column([s.result for s in settlements]),
            "progress": _column([s.progress for s in settlements]),
            "worker": worker,
            "channel": self.channel,
            "results_channel": self.results_channel,
            "prune": prune,
        }
        batch_ids = [s.batch_id for s in settlements if s.batch_id is not None]
        async with self.batches.in_batch_order(batch_ids) as run:
            row = await run.fetchrow(self._q["job_settle_many"], **values)
        assert row is not None  # an aggregate: always one row
        owned_ids = row["owned_ids"]  # NULL when every settlement held its claim
        return set(ids) if owned_ids is None else set(owned_ids)

    async def written_by(self, settlements: Sequence[Settlement], *, worker: str) -> set[uuid.UUID]:
        """Of `settlements`, the ids whose outcome `worker` has journaled for their run: the
        ones an earlier attempt of a retried settle wrote (its reply lost)."""
        rows = await self._run.fetch(
            self._q["journal_written_by"],
            ids=[s.id for s in settlements],
            runs=[s.run for s in settlements],
            worker=worker,
        )
        return {r["id"] for r in rows}

    async def renew_leases(
        self,
        ids: Sequence[uuid.UUID],
        tokens: Sequence[uuid.UUID],
        lease_s: Sequence[float],
        progress: Sequence[str | None] | None = None,
    ) -> set[uuid.UUID]:
        """Extend leases, and store each run's new progress (JSON, None: unchanged); returns
        the ids still owned (the rest were recovered elsewhere)."""
        rows = await self._run.fetch(
            self._q["job_renew_leases"],
            ids=list(ids),
            tokens=list(tokens),
            lease_s=list(lease_s),
            progress=None if progress is None else _column(list(progress)),
        )
        return {r["id"] for r in rows}

    async def release_unheld(
        self, *, worker: str, held: Sequence[uuid.UUID], note: str
    ) -> list[tuple[uuid.UUID, str]]:
        """Hand back every job the database says `worker` holds but it does not: a claim
        whose reply was lost with the connection. Journaled as `released` (not a failure),
        eligible at once. Returns (id, kind) of each job released."""
        rows = await self._run.fetch(
            self._q["job_release_unheld"],
            worker=worker,
            held=list(held),
            note=note,
            channel=self.channel,
        )
        return [(r["id"], r["kind"]) for r in rows]

    async def recover_stale(
        self,
        decide: Callable[[list[StaleJob]], list[Recovery]],
        *,
        queues: Sequence[str],
        worker: str,
        limit: int = 500,
        hook_lease_s: float = DEFAULT_HOOK_LEASE_S,
    ) -> list[Recovered]:
        """Recover jobs of `queues` whose lease expired: lock them, let `decide` (pure)
        choose, write. Returns what became of each recovered job.
        """
        async with self._run.transaction() as tx:
            rows = await tx.fetch(self._q["job_select_stale"], limit=limit, queues=list(queues))
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
                    max_attempts=r["max_attempts"],
                )
                for r in rows
            ]
            tokens = {r["id"]: r["claim_token"] for r in rows}
            decisions = decide(stale)
            recovered = await tx.fetch(
                self._q["job_recover_many"],
                ids=[d.id for d in decisions],
                tokens=[tokens[d.id] for d in decisions],
                dead=[d.dead for d in decisions],
                delay_s=[d.delay_s for d in decisions],
                notes=[d.note for d in decisions],
                hook_tokens=_column([d.hook_token for d in decisions]),
                hook_lease_s=hook_lease_s,
                worker=worker,
                channel=self.channel,
                results_channel=self.results_channel,
            )
        return [
            Recovered(
                id=ULID.from_bytes(r["id"].bytes),
                kind=r["kind"],
                queue=r["queue"],
                run=r["run_count"],
                status=JobStatus(r["status"]),
                note=r["note"],
                hook_token=r["hook_token"],
            )
            for r in recovered
        ]

    # -- failure steps (`_db/failure_steps.py`) --------------------------------------

    @property
    def failure_steps(self) -> FailureSteps:
        """The failure steps' leases (what the worker's undertaker runs)."""
        return FailureSteps(self._run, self._q)

    async def next_lease_expiry(self, queues: Sequence[str]) -> float | None:
        """Seconds until the earliest lease in `queues` expires (negative if already
        expired; None when nothing is claimed there)."""
        value: float | None = await self._run.fetchval(
            self._q["lease_next_expiry"], queues=list(queues)
        )
        return value

    async def next_due(self, kinds: Sequence[str], *, queues: Sequence[str]) -> NextDue:
        """When the next scheduled job of these kinds in `queues` (paused ones left out)
        becomes eligible, and whether one is due already (see `NextDue`)."""
        row = await self._run.fetchrow(
            self._q["job_next_due"], kinds=list(kinds), queues=list(queues)
        )
        assert row is not None  # an aggregate: always one row
        return NextDue(row["due_in_s"], row["held"])

    async def next_due_in_queues(self, queues: Sequence[str]) -> NextDue:
        """`next_due` for every kind of `queues`."""
        row = await self._run.fetchrow(self._q["job_next_due_in_queues"], queues=list(queues))
        assert row is not None
        return NextDue(row["due_in_s"], row["held"])

    # -- LISTEN (`_db/listening.py`) -------------------------------------------------

    @property
    def listener(self) -> Listener:
        """LISTEN on this store's channels (what the methods below call)."""
        return Listener(
            self._pool_or_raise,
            self._q,
            prefix=self._prefix,
            results_channel=self.results_channel,
            pooler=self._pooler,
            connect_args=self._connect_args,
            bound=self._conn is not None,
        )

    def listen(
        self,
        on_notify: Callable[[str], None],
        on_lost: Callable[[], None],
        on_lease: Callable[[str, float], None] | None = None,
        on_queue: Callable[[str, bool], None] | None = None,
        on_batch: Callable[[uuid.UUID], None] | None = None,
    ) -> AbstractAsyncContextManager[Listening]:
        """Hold one connection LISTENing on the store's channel.

        `on_notify(kind)` runs for every job made claimable (an empty kind: any);
        `on_lease(queue, seconds)` for a claim that took leases ending sooner than any its
        worker held; `on_queue(queue, paused)` when a queue is paused or resumed;
        `on_batch(id)` when a batch is cancelled; `on_lost()` when the connection
        terminates. Yields a handle to probe the connection for liveness.
        """
        return self.listener.listen(on_notify, on_lost, on_lease, on_queue, on_batch)

    def listen_queues(
        self,
        prefixes: Sequence[str],
        on_notify: Callable[[str, str], None],
        on_lost: Callable[[], None],
        *,
        on_control: Callable[[str, str], None] | None = None,
    ) -> AbstractAsyncContextManager[Listening]:
        """One connection LISTENing on the channels of several queues of this database
        (`on_notify(prefix, kind)`): a watcher of many queues holds one connection, not one
        per queue. Notifications that are not about a kind (they start with "!") go to
        `on_control(prefix, payload)`, if given.

        A store opened by `connect()` listens on a connection of its own, outside the pool
        (LISTEN is session state, and a long-held pooled connection would shrink the pool
        the worker's loops and handlers share); a `from_pool` store takes one from the pool.
        """
        return self.listener.listen_queues(prefixes, on_notify, on_lost, on_control=on_control)

    # -- flow control (venturi.flow) -------------------------------------------------

    async def lock_take(self, key: str, job_id: uuid.UUID, token: uuid.UUID) -> uuid.UUID | None:
        """Take `key` for the run (`job_id`, `token`): None when taken (or already this
        run's), else the id of the job whose live run holds it."""
        holder: uuid.UUID | None = await self._run.fetchval(
            self._q["lock_take"], key=key, job_id=job_id, token=token
        )
        return holder

    async def lock_release(self, key: str, job_id: uuid.UUID, token: uuid.UUID) -> None:
        """Release `key` if the run (`job_id`, `token`) still holds it."""
        await self._run.execute(self._q["lock_release"], key=key, job_id=job_id, token=token)

    async def rate_take(self, key: str, max_starts: int, per_s: float) -> tuple[bool, float]:
        """Take one start of `key`'s current window of `per_s` seconds, if fewer than
        `max_starts` were taken: (taken, seconds until the next window opens)."""
        row = await self._run.fetchrow(self._q["rate_take"], key=key, max=max_starts, per_s=per_s)
        assert row is not None  # the statement always returns its one row
        return row["taken"], row["reopens_in_s"]

    # -- operations ------------------------------------------------------------------

    @_schema_required
    async def get_job(self, job_id: ULID | uuid.UUID, codec: Codec = DEFAULT_CODEC) -> Job | None:
        """One job, its payload and carry decoded by `codec` into plain values."""
        row = await self._run.fetchrow(self._q["job_get"], id=_as_uuid(job_id))
        return None if row is None else _job(row, codec)

    @_schema_required
    async def wait_finished(
        self, job_id: ULID | uuid.UUID, codec: Codec = DEFAULT_CODEC
    ) -> Job | None:
        """`job_id` once it has finished (completed or dead), or None if there is no such job.
        Waits on the results channel (bound it with `asyncio.timeout`), holding one pool
        connection, listening, while it waits; through a transaction pooler, a connection of
        its own to `listen_dsn`, or without one it looks at the job, reading only, backing
        off as the worker's loops do after a failed statement (0.05 s doubling to 1 s)."""
        key = _as_uuid(job_id)
        await self.listener.until_finished(self._run, key)
        return await self.get_job(key, codec)

    @_schema_required
    async def list_jobs(self, f: JobFilter, codec: Codec = DEFAULT_CODEC) -> list[Job]:
        """Jobs matching `f`, newest first, their payloads decoded by `codec`."""
        rows = await self._run.fetch(
            self._q["job_list"],
            status=f.status.value if f.status is not None else None,
            kind=f.kind,
            queue=f.queue,
            before_id=f.before_id.to_uuid() if f.before_id is not None else None,
            created_after=f.created_after,
            created_before=f.created_before,
            limit=f.limit,
        )
        return [_job(r, codec) for r in rows]

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
            n: int = await self._run.fetchval(
                self._q["job_cleanup_batch"],
                finished_before=c.finished_before,
                kind=c.kind,
                status=c.status.value if c.status is not None else None,
                limit=batch_size,
            )
            total += n
            if on_batch is not None:
                on_batch(total)
            if n < batch_size:
                return total

    async def database_now(self) -> datetime:
        """The database's clock now (the one every stored time is read from)."""
        now: datetime = await self._run.fetchval(self._q["database_now"])
        return now

    @_schema_required
    async def fold_counts(self, minutes_since: datetime | None = None) -> int:
        """Fold the sharded counter rows, the live counts' and the per-minute counts' (of
        minutes from `minutes_since` on; None: all kept) into one row per group, skipping rows
        a writer holds (see queries/counts.sql), then sum the last hour's ended minutes for
        stats() (migration 0016); returns how many rows were folded away.
        The leader runs it (`venturi._maintenance.folder`); each statement is its own short
        transaction, and no sum anyone reads changes."""
        folded: int = await self._run.fetchval(self._q["counts_fold"])
        minutes: int = await self._run.fetchval(self._q["minute_counts_fold"], since=minutes_since)
        await self._run.fetchval(self._q["hour_counts_refresh"])
        return folded + minutes

    @_schema_required
    async def analyze_jobs_if_stale(self, at_least: int) -> bool | None:
        """ANALYZE the jobs table if the planner's row estimate is under a tenth of what the
        counters hold (and they hold at least `at_least` jobs); returns whether it did, or
        None when it is stale and this role may not analyse the table (only its owner, the
        database's owner or a superuser may; PostgreSQL would skip it with a warning). See
        `venturi._maintenance.analyzer`."""
        if not await self._run.fetchval(self._q["jobs_analyze_due"], at_least=at_least):
            return False
        if not await self._run.fetchval(self._q["jobs_may_analyze"]):
            return None
        await self._run.execute(self._q["jobs_analyze"])
        return True

    @_schema_required
    async def sealed_after(
        self, after: uuid.UUID, current_key: str, limit: int
    ) -> list[asyncpg.Record]:
        """Jobs after `after` with a value sealed by a key other than `current_key`."""
        return await self._run.fetch(
            self._q["sealed_after"], after=after, current=current_key, n=limit
        )

    async def rewrite_sealed(
        self, rows: Sequence[tuple[uuid.UUID, str, str | None, str | None, str | None]]
    ) -> int:
        """Store re-sealed (id, old payload, new payload, old carry, new carry) values where
        the job still holds the old ones; returns how many were rewritten."""
        n: int = await self._run.fetchval(
            self._q["sealed_rewrite"],
            ids=[r[0] for r in rows],
            old_payloads=[r[1] for r in rows],
            payloads=[r[2] for r in rows],
            old_carries=[r[3] for r in rows],
            carries=[r[4] for r in rows],
        )
        return n

    @_schema_required
    async def journal(self, job_id: ULID | uuid.UUID) -> list[JournalEntry]:
        rows = await self._run.fetch(self._q["journal_list_for_job"], id=_as_uuid(job_id))
        return list(rows_journal(rows))

    @_schema_required
    async def stats(self) -> Stats:
        return stats_from_rows(await self._run.fetch(self._q["stats"]))

    @_schema_required
    async def finished_per_minute(self, queue: str | None = None) -> list[MinuteCounts]:
        """Jobs done and failed for good per minute, queue and kind, for the minutes that
        began in the last two hours, oldest first (`queue` None: every queue)."""
        rows = await self._run.fetch(self._q["minute_counts_list"], queue=queue)
        return [
            MinuteCounts(
                minute=r["minute"],
                queue=r["queue"],
                kind=r["kind"],
                done=r["done"],
                failed=r["failed"],
            )
            for r in rows
        ]

    # -- queue control ---------------------------------------------------------------

    @_schema_required
    async def pause_queue(
        self, name: str, *, reason: str | None, until: datetime | None
    ) -> QueueState:
        """Pause the named queue (stored, announced to every worker at commit)."""
        row = await self._run.fetchrow(
            self._q["queue_pause"], name=name, reason=reason, until=until, channel=self.channel
        )
        assert row is not None
        return QueueState(row["name"], True, row["reason"], row["paused_at"], row["paused_until"])

    @_schema_required
    async def resume_queue(self, name: str) -> bool:
        """Resume the named queue; returns whether it was paused."""
        was: bool = await self._run.fetchval(
            self._q["queue_resume"], name=name, channel=self.channel
        )
        return was

    @_schema_required
    async def list_queues(self) -> list[QueueState]:
        """Queues with pending jobs or a stored pause, by name."""
        rows = await self._run.fetch(self._q["queue_list"])
        return [
            QueueState(r["name"], r["paused"], r["reason"], r["paused_at"], r["paused_until"])
            for r in rows
        ]

    async def next_resume(self, queues: Sequence[str]) -> float | None:
        """Seconds until the first of `queues` paused with an until resumes (None: none)."""
        value: float | None = await self._run.fetchval(
            self._q["queue_next_resume"], queues=list(queues)
        )
        return value

    @_schema_required
    async def batch_status(self, batch_id: uuid.UUID) -> BatchStatus | None:
        """The batch's progress, None if there is no such batch (`Batches.get`)."""
        return await self.batches.get(batch_id)

    @_schema_required
    async def recent_batches(self, limit: int, before: uuid.UUID | None) -> list[BatchStatus]:
        """The newest batches, newest first (`Batches.recent`)."""
        return await self.batches.recent(limit, before)

    @_schema_required
    async def cancel_batch(self, batch_id: uuid.UUID) -> int | None:
        """Cancel the batch's members not started; None if there is no such batch
        (`Batches.cancel`)."""
        return await self.batches.cancel(batch_id)

    @_schema_required
    async def prune_batches(self, finished_before: datetime, batch_size: int) -> int:
        """Delete the batches finished before `finished_before` (`Batches.prune`)."""
        return await self.batches.prune(finished_before, batch_size)

    @_schema_required
    async def workers(self) -> list[WorkerInfo]:
        """Every registered worker, oldest first (see `venturi.registry`)."""
        return await self.registry.workers()

    @_schema_required
    async def unserved_kinds(self) -> dict[str, list[str]]:
        """Queue -> pending KINDs that no live worker serving that queue registers."""
        return await self.registry.unserved_kinds()

    @_schema_required
    async def schedules(self) -> list[ScheduleInfo]:
        """Every schedule recorded by a worker that runs it, by name."""
        rows = await self._run.fetch(self._q["schedule_list"])
        return [
            ScheduleInfo(
                name=r["name"],
                spec=r["spec"],
                kind=r["kind"],
                last_tick=r["last_tick"],
                next_tick=r["next_tick"],
                last_job=None if r["last_job"] is None else ULID.from_bytes(r["last_job"].bytes),
                enqueued=r["enqueued"],
                skipped=r["skipped"],
                seen_at=r["seen_at"],
                seen_by=r["seen_by"],
            )
            for r in rows
        ]

    @_schema_required
    async def claimed_by_pod(self) -> dict[str, int]:
        """Claimed jobs per pod (workers outside Kubernetes have no pod)."""
        rows = await self._run.fetch(self._q["claimed_by_pod"])
        return {r["claimed_pod"]: r["n"] for r in rows}

    @_schema_required
    async def fence_pods(self, pods: Sequence[str], ttl_s: float) -> None:
        """Fence `pods` for `ttl_s` seconds: once this returns, their claims in flight have
        committed and they claim nothing more (see `queries/fences.sql`)."""
        await self._run.execute(self._q["fences_set"], pods=list(pods), ttl_s=ttl_s)

    @_schema_required
    async def unfence_pods(self, pods: Sequence[str]) -> None:
        """Lift the fences of `pods` (and forget the expired ones)."""
        await self._run.execute(self._q["fences_clear"], pods=list(pods))

    @_schema_required
    async def fenced_pods(self) -> list[str]:
        """The pods fenced now, by name."""
        return [r["pod"] for r in await self._run.fetch(self._q["fences_list"])]

    # -- failed jobs (`_db/failed.py`) -----------------------------------------------

    @property
    def failed(self) -> FailedJobs:
        """The failed jobs' statements (`_db/failed.py`), on this store's runner."""
        return FailedJobs(self._run, self._q, self.channel)

    @_schema_required
    async def list_failed(
        self,
        *,
        queue: str | None,
        kind: str | None,
        before_id: ULID | None,
        limit: int,
        codec: Codec = DEFAULT_CODEC,
    ) -> list[FailedJob]:
        """Failed (dead) jobs, newest first, their payloads decoded by `codec`."""
        return await self.failed.page(
            queue=queue,
            kind=kind,
            before_id=before_id,
            limit=limit,
            decode=functools.partial(_listed, codec.decode_any),
        )

    @_schema_required
    async def retry_failed(self, job_id: ULID | uuid.UUID, *, note: str) -> JobStatus | None:
        """Put a dead job back in its queue; returns its status before (None: no such job).
        Only a dead job is changed. A unique job takes its unique id again: while another
        job holds it, `JobStateError` names the holder."""
        return await self.failed.retry(_as_uuid(job_id), note=note)

    @_schema_required
    async def retry_all_failed(
        self,
        *,
        queue: str | None,
        kind: str | None,
        note: str,
        batch_size: int = 500,
        limit: int | None = None,
    ) -> int:
        """Retry every dead job of `queue` and `kind` (None: any), in bounded batches; at
        most `limit` (None: all)."""
        return await self.failed.retry_all(
            queue=queue, kind=kind, note=note, batch_size=batch_size, limit=limit
        )

    @_schema_required
    async def forget_failed(self, job_id: ULID | uuid.UUID) -> JobStatus | None:
        """Delete a dead job and its journal; returns its status (None: no such job). A job
        that is not dead is left alone."""
        return await self.failed.forget(_as_uuid(job_id))

    @_schema_required
    async def flush_failed(
        self,
        *,
        queue: str | None,
        kind: str | None,
        before: datetime | None,
        batch_size: int = 1000,
    ) -> int:
        """Delete dead jobs (and their journal) in bounded batches; returns how many."""
        return await self.failed.flush(queue=queue, kind=kind, before=before, batch_size=batch_size)

    @_schema_required
    async def queue_known(self, queue: str) -> bool:
        """Whether a kept job, a pause or a worker names `queue`."""
        known: bool = await self._run.fetchval(self._q["queue_known"], queue=queue)
        return known

    @_schema_required
    async def outstanding(self) -> int:
        """Jobs waiting (due now or later) or running, from the trigger-kept counts."""
        n: int = await self._run.fetchval(self._q["jobs_outstanding"])
        return n


def _job(row: asyncpg.Record, codec: Codec) -> Job:
    carry = row["carry"]
    return Job(
        id=ULID.from_bytes(row["id"].bytes),
        kind=row["kind"],
        queue=row["queue"],
        status=JobStatus(row["status"]),
        priority=row["priority"],
        run_at=row["run_at"],
        created_at=row["created_at"],
        finished_at=row["finished_at"],
        payload=_listed(codec.decode_any, row["payload"]),
        carry=None if carry is None else _listed(codec.decode_any, carry),
        run_count=row["run_count"],
        failures=row["failures"],
        claimed_at=row["claimed_at"],
        lease_until=row["lease_until"],
        claimed_by=row["claimed_by"],
        claimed_pod=row["claimed_pod"],
        last_error=row["last_error"],
        result=_plain(row["result"]),
        progress=_plain(row["progress"]),
        batch_id=None if row["batch_id"] is None else ULID.from_bytes(row["batch_id"].bytes),
    )


def _plain(text: str | None) -> Any:
    """A result or progress: stored as plain JSON, never through a codec (an encrypted task
    may store neither), so a codec's `decode_any` never sees them."""
    return None if text is None else _listed(msgspec.json.decode, text)


UNLISTED = {"venturi:unlisted": "nested too deeply to decode here (a worker decodes it)"}
"""What a listing shows of a value nested deeper than the listing's own call stack leaves
room to decode (enqueue takes nesting up to Python's recursion limit, from a shallower
stack): the rest of the listing is shown, not lost to a RecursionError."""


def _listed(decode: Callable[[str], Any], text: str) -> Any:
    try:
        return decode(text)
    except RecursionError:
        return dict(UNLISTED)


def _check_seconds(name: str, value: object, *, low: float) -> None:
    """A timeout in seconds: None, or a finite number from `low` on (a statement_timeout
    under a millisecond would be sent as 0, which turns the timeout off)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected seconds (a number) or None, got {shown(value)}")
    if not low <= value < math.inf:
        raise ValueError(f"{name}: expected seconds from {low:g} on (or None), got {value!r}")


def _check_pooler(pooler: object) -> Pooler:
    if pooler not in POOLERS:
        raise ValueError(f"pooler: expected one of {', '.join(POOLERS)}, got {pooler!r}")
    return pooler  # narrowed by `in POOLERS`


def _listen_options(
    options: dict[str, Any], listen: _dsn.ConnectArgs, statement_timeout_ms: int | None
) -> dict[str, Any]:
    """The LISTEN connection's options: the pool's, with `listen_dsn`'s own settings (it is
    a direct connection, so session settings are fine there)."""
    settings = {**dict(options.get("server_settings") or {}), **listen.server_settings}
    if statement_timeout_ms is not None:
        settings["statement_timeout"] = str(statement_timeout_ms)
    return {**options, "server_settings": settings}


def _column(values: Sequence[Any] | None) -> Sequence[Any] | None:
    """NULL for an all-NULL column: multi-array unnest() pads it with NULLs, and asyncpg
    skips encoding a thousand Nones (optional columns are usually unset)."""
    return None if values is None or all(v is None for v in values) else values


def _varying(values: Sequence[Any]) -> Sequence[Any] | None:
    """None for a column of one value repeated (the statement then takes that value once):
    asyncpg checks each element of an array it encodes against abstract base classes."""
    return None if values and values.count(values[0]) == len(values) else values


def _flags(values: Sequence[bool]) -> Sequence[bool] | None:
    """NULL for an all-false column of flags that the statement reads as `CASE WHEN flag`
    (where NULL is false): as `_column`, nothing to encode in the usual batch."""
    return values if any(values) else None


def _first(column: Sequence[Any] | None) -> Any:
    return None if column is None else column[0]


def _dedup_lock_key(prefix: str, job: NewJob) -> int:
    # Unambiguous: neither a prefix nor a queue name nor a KIND can hold a NUL.
    key = f"venturi:dedup:{prefix}\0{job.queue}\0{job.kind}\0{job.dedup_key}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big", signed=True)


@asynccontextmanager
async def _just(run: Runner) -> AsyncIterator[Runner]:
    """`run` itself, as a context manager (where no transaction is wanted)."""
    yield run


def _as_uuid(job_id: ULID | uuid.UUID) -> uuid.UUID:
    if isinstance(job_id, ULID):
        return job_id.to_uuid()
    return job_id


def _running_loop(default: asyncio.AbstractEventLoop) -> asyncio.AbstractEventLoop:
    """The running event loop; `default` when none runs (a store made in sync code)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return default
