"""Test helpers for applications that use venturi, as a pytest plugin.

Installing `venturi[testing]` registers the plugin (the `pytest11` entry point), so its
fixtures are there in every test without an import:

- `venturi_dsn`: the PostgreSQL the tests use, once per session: `--venturi-dsn`, else
  `VENTURI_TEST_DSN`, else a private server started for the session (`EmbeddedPostgres`;
  needs the PostgreSQL server binaries).
- `venturi_store`: a migrated `PostgresStore` on a table prefix of its own for each test;
  its tables are dropped afterwards, so a shared database stays clean.
- `venturi_queue`: a `Queue` on that store.
- `venturi_jobs`: a `Jobs` helper: what is queued, what was enqueued, and running the jobs
  with the application's own worker.

The worker is the application's: override the `venturi_worker` fixture to return a function
that builds it on a store (a `Worker` runs once, so the helpers build a new one per round):

    @pytest.fixture
    def venturi_worker():
        return build_worker          # def build_worker(store) -> Worker: ...

    async def test_invoice_is_sent(venturi_queue, venturi_jobs):
        await venturi_queue.enqueue(SendInvoice(order_id=7))
        await venturi_jobs.run_jobs()
        ...

Jobs run through the real worker (claim, middleware, hooks, settle, the journal), against
the real database: what passes here passes in production.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import pytest
from ulid import ULID

from venturi._shown import shown
from venturi.codec import DEFAULT_CODEC, Codec
from venturi.context import Cancellation, Context
from venturi.embedded import EmbeddedPostgres
from venturi.jobs import Job
from venturi.outcome import Outcome
from venturi.postgres import PostgresStore
from venturi.queue import Queue
from venturi.task import Task, kind_of
from venturi.worker import Worker

__all__ = [
    "MAX_RERUNS",
    "MAX_ROUNDS",
    "Jobs",
    "WorkerFactory",
]

T = TypeVar("T", bound=Task[Any])
F = TypeVar("F", bound=Callable[..., Any])


def _without_asyncio(fn: F) -> F:
    """The fixture, when pytest-asyncio is missing: a clear error, only if it is used."""

    def missing() -> None:
        raise pytest.UsageError(
            f"{fn.__name__}: venturi's test fixtures need pytest-asyncio "
            "(pip install venturi[testing])"
        )

    missing.__name__ = fn.__name__
    return pytest.fixture(missing)  # type: ignore[return-value]


_async_fixture: Callable[[F], F]
try:
    import pytest_asyncio
except ImportError:  # venturi without [testing]: the plugin must not break anyone's pytest
    _async_fixture = _without_asyncio
else:
    _async_fixture = pytest_asyncio.fixture  # type: ignore[assignment]  # overloaded

WorkerFactory = Callable[[PostgresStore], Worker[Any]]
"""Builds the application's worker (its tasks registered) on a store."""

MAX_ROUNDS = 1000
"""Rounds `run_jobs` and `run_all_jobs` take before they give up: jobs that keep queuing
others (a chain of a thousand links?) must fail the test, not hang it."""

MAX_RERUNS = 20
"""Runs of one job in one `run_jobs` or `run_all_jobs` after which, due again, it fails the
test: it keeps putting itself back (`Outcome.pause_in(0)`), or its retries never succeed."""

_prefixes = itertools.count()


class Jobs:
    """What a test asks of the queue: what is queued, and run it all now."""

    def __init__(
        self,
        store: PostgresStore,
        worker: WorkerFactory | None = None,
        *,
        codec: Codec | None = None,
    ) -> None:
        self.store = store
        self._factory = worker
        self._codec_found: Codec | None = codec

    @property
    def _codec(self) -> Codec:
        """The codec given, else the application's worker's (a `SealedCodec`, say), else
        JSON: what decodes the jobs the application's producers stored."""
        if self._codec_found is None:
            self._codec_found = (
                DEFAULT_CODEC if self._factory is None else self._worker().policy.codec
            )
        return self._codec_found

    @property
    def _queue(self) -> Queue:
        return Queue(self.store, codec=self._codec)

    # -- what is queued ----------------------------------------------------------------

    async def queued_jobs(
        self, kind: str | type[Task[Any]] | None = None, *, queue: str | None = None
    ) -> list[Job]:
        """Pending jobs (due now or later), by when they are due, the soonest first; of one
        kind (a KIND or a task class) and one named queue if given."""
        rows = await self.store._run.fetch(
            self.store._q["testing_pending"],
            kind=None if kind is None else _kind(kind),
            queue=queue,
        )
        return [await self._job(r["id"]) for r in rows]

    async def assert_enqueued(
        self,
        task_type: type[T],
        *,
        where: Callable[[T], bool] | None = None,
        count: int | None = None,
        queue: str | None = None,
    ) -> list[T]:
        """The pending jobs of `task_type` (decoded) that satisfy `where`; fails the test
        when there are none, or not exactly `count` of them when it is given."""
        rows = await self.store._run.fetch(
            self.store._q["testing_pending"], kind=_kind(task_type), queue=queue
        )
        # From the stored text, with its job's id and kind: a sealed payload opens only so.
        tasks = [
            self._codec.decode(task_type, r["payload"], kind=r["kind"], job_id=r["id"])
            for r in rows
        ]
        matching = [t for t in tasks if where is None or where(t)]
        name = task_type.__qualname__
        if count is None and not matching:
            raise AssertionError(
                f"no pending {name} job{'' if where is None else ' matches'}; "
                f"pending {name} jobs: {shown(tasks, 2000)}"
            )
        if count is not None and len(matching) != count:
            raise AssertionError(
                f"expected {count} pending {name} job(s), found {len(matching)}: "
                f"{shown(matching, 2000)}"
            )
        return matching

    # -- running them --------------------------------------------------------------------

    async def run_jobs(self) -> int:
        """Run every job that is due, until none is (jobs the runs enqueue too), with the
        application's worker. A job waiting for a later run_at, or a retry waiting for its
        backoff, is not due. Returns how many runs settled. Fails (AssertionError) when one
        job ran `MAX_RERUNS` times and is due again, or after `MAX_ROUNDS` rounds."""
        return await self._rounds(make_due=False)

    async def run_all_jobs(self, *, max_rounds: int = MAX_ROUNDS) -> int:
        """Run every pending job, delayed ones and retries too (their run_at is brought
        forward), until none is left; raises (AssertionError) after `max_rounds` rounds, or
        when one job ran `MAX_RERUNS` times and is pending again (a retry that never
        succeeds)."""
        return await self._rounds(make_due=True, max_rounds=max_rounds)

    async def dispatch_sync(self, task: Task[Any], *, queue: str = "default") -> Outcome:
        """Run `task`'s handler now, in the caller, as the worker would (its middleware
        included), without storing a job. Returns the outcome; the handler's exception is
        raised to the caller."""
        worker = self._worker()
        kind = kind_of(type(task))
        reg = worker._registry.get(kind)
        if reg is None:
            raise LookupError(f"dispatch_sync: the worker registers no task of kind {kind!r}")
        ctx: Context[Any] = Context(
            job_id=ULID(),
            kind=kind,
            queue=queue,
            run_count=1,
            history=(),
            carry=None if reg.carry_type is None else reg.carry_type(),
            cancellation=Cancellation(),
        )
        result = await reg.handler(task, ctx, worker.app)
        return Outcome.completed() if result is None else result

    def _worker(self) -> Worker[Any]:
        if self._factory is None:
            raise LookupError(
                "venturi_jobs needs the application's worker: override the `venturi_worker` "
                "fixture to return a function `store -> Worker` (see venturi.testing)"
            )
        worker = self._factory(self.store)
        if not isinstance(worker, Worker):
            raise TypeError(
                f"venturi_worker: expected a function returning a Worker, got {worker!r}"
            )
        return worker

    async def _rounds(self, *, make_due: bool, max_rounds: int = MAX_ROUNDS) -> int:
        runs = 0
        first_seen: dict[uuid.UUID, int] = {}  # a due job's run count when first seen due
        for _ in range(max_rounds):
            worker = self._worker()
            scope = {"queues": list(worker.queues), "kinds": worker.kinds}
            if make_due:
                await self.store._run.execute(self.store._q["testing_make_due"], **scope)
            due = await self.store._run.fetch(self.store._q["testing_due"], **scope)
            if not due:
                return runs
            for row in due:
                ran = row["run_count"] - first_seen.setdefault(row["id"], row["run_count"])
                if ran >= MAX_RERUNS:
                    job_id = ULID.from_bytes(row["id"].bytes)
                    raise AssertionError(
                        f"job {job_id} ({row['kind']}) ran {ran} times here and is due "
                        "again: it keeps putting itself back (Outcome.pause_in(0)?), or its "
                        "retries never succeed"
                    )
            await worker.run(once=True)
            runs += sum(n for outcome, n in worker._settled.items() if outcome != "returned")
        raise AssertionError(
            f"jobs were still due after {max_rounds} rounds: a job that keeps queuing "
            "itself, or a retry that never succeeds?"
        )

    async def _job(self, job_id: uuid.UUID) -> Job:
        job = await self._queue.job(ULID.from_bytes(job_id.bytes))
        assert job is not None, f"job {job_id} vanished while it was read"
        return job


def _kind(kind: str | type[Task[Any]]) -> str:
    return kind if isinstance(kind, str) else kind_of(kind)


# -- the plugin -------------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--venturi-dsn",
        default=None,
        help="PostgreSQL for venturi's test fixtures (default: $VENTURI_TEST_DSN, else a "
        "private server started for the session)",
    )


@pytest.fixture(scope="session")
def venturi_dsn(request: pytest.FixtureRequest) -> Iterator[str]:
    """The PostgreSQL the session's venturi fixtures use."""
    dsn = request.config.getoption("--venturi-dsn") or os.environ.get("VENTURI_TEST_DSN")
    if dsn:
        yield dsn
        return
    with EmbeddedPostgres() as pg:
        yield pg.dsn


@pytest.fixture
def venturi_worker() -> WorkerFactory | None:
    """Override: return a function that builds the application's worker on a store."""
    return None


@_async_fixture
async def venturi_store(venturi_dsn: str) -> AsyncIterator[PostgresStore]:
    """A migrated store on a table prefix of its own; its tables are dropped afterwards."""
    prefix = f"vt{next(_prefixes)}_{uuid.uuid4().hex[:8]}"
    store = await PostgresStore.connect(venturi_dsn, prefix=prefix)
    try:
        await store.migrate()
        yield store
    finally:
        try:
            await _drop(store)
        finally:
            await store.close()


@pytest.fixture
def venturi_queue(venturi_store: PostgresStore) -> Queue:
    return Queue(venturi_store)


@pytest.fixture
def venturi_jobs(venturi_store: PostgresStore, venturi_worker: WorkerFactory | None) -> Jobs:
    return Jobs(venturi_store, venturi_worker)


async def _drop(store: PostgresStore) -> None:
    """Drop every table and function of the store's prefix (nothing else)."""
    rows = await store._run.fetch(store._q["testing_drop_prefix"], prefix=store.prefix)
    if rows:
        await store._run.script(";\n".join(r["ddl"] for r in rows))
