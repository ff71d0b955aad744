"""Bad input gets a clear error that names what is wrong, and loses nothing."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone

import asyncpg
import pytest
from ulid import ULID

from venturi import (
    AttachmentTooLarge,
    Backoff,
    CleanupCriteria,
    Context,
    DedupKey,
    DuplicateKindError,
    JobFilter,
    JobStatus,
    Outcome,
    PanicPolicy,
    PayloadError,
    PostgresStore,
    Priority,
    Queue,
    SchemaError,
    Task,
    TaskError,
    Worker,
)
from venturi.backoff import MAX_DELAY
from venturi.context import ATTACHMENT_MAX_BYTES, Cancellation
from venturi.merge import DEDUP_KEY_MAX_BYTES
from venturi.outcome import failure_note

from .helpers import all_migrations, migrate_before, running, until_status


@dataclass
class Order(Task):
    KIND = "order"
    order_id: int


@pytest.mark.parametrize(
    "bad", ["", "Venturi", "1abc", "a-b", "a b", "x" * 40, "jobs;drop table x", None]
)
async def test_invalid_prefix_is_rejected_before_any_sql(bad: object) -> None:
    # An unreachable DSN: if any connection were attempted, the error would differ.
    with pytest.raises(ValueError, match="invalid table prefix"):
        await PostgresStore.connect("postgresql://nobody@127.0.0.1:1/none", prefix=bad)  # type: ignore[arg-type]


async def test_longest_valid_prefix_works(pg_dsn: str) -> None:
    prefix = "p" + "x" * 38
    async with await PostgresStore.connect(pg_dsn, prefix=prefix) as store:
        assert await store.migrate() == all_migrations()
        assert await store.migrate() == []


async def test_concurrent_migrations_apply_once(pg_dsn: str, prefix: str) -> None:
    stores = [await PostgresStore.connect(pg_dsn, prefix=prefix, max_size=1) for _ in range(8)]
    try:
        results = await asyncio.gather(*(s.migrate() for s in stores))
    finally:
        await asyncio.gather(*(s.close() for s in stores))
    assert sorted(results) == [[]] * 7 + [all_migrations()]


async def test_unencodable_payload_names_the_field(queue: Queue) -> None:
    @dataclass
    class Bad(Task):
        KIND = "bad"
        fine: int
        handle_: object

    with pytest.raises(PayloadError, match=r"field 'handle_' \(object\)"):
        await queue.enqueue(Bad(fine=1, handle_=object()))
    with pytest.raises(PayloadError, match="handle_"):
        await queue.enqueue_many([Order(order_id=1), Bad(fine=1, handle_=object())])
    assert (await queue.stats()).pending == 0  # nothing stored, not even the good one


async def test_task_must_be_a_dataclass_with_a_kind(queue: Queue) -> None:
    class NotData(Task):
        KIND = "not_data"

    @dataclass
    class NoKind(Task):
        x: int = 0

    @dataclass
    class BadKind(Task):
        KIND = "has space"

    with pytest.raises(TypeError, match="must be a dataclass"):
        await queue.enqueue(NotData())
    with pytest.raises(TypeError, match="must define KIND"):
        await queue.enqueue(NoKind())
    with pytest.raises(TypeError, match="must be a dataclass"):
        await queue.enqueue_many([Order(order_id=1), NotData()])
    with pytest.raises(TypeError, match="must define KIND"):
        await queue.enqueue_many([NoKind()])
    instance = r"got the class Order: pass an instance, Order\(\.\.\.\)"
    with pytest.raises(TypeError, match=instance):
        await queue.enqueue(Order)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=instance):
        await queue.enqueue_many([Order(order_id=1), Order])  # type: ignore[list-item]
    not_a_task = r"expected a task \(an instance of a Task subclass\), got dict \{'n': 1\}"
    with pytest.raises(TypeError, match=not_a_task):
        await queue.enqueue({"n": 1})  # type: ignore[arg-type]
    assert (await queue.stats()).pending == 0  # a bad task in a batch stores nothing
    with pytest.raises(ValueError, match="KIND 'has space' is invalid"):
        Worker(None, queue.store).register(BadKind, lambda t, c, a: None)  # type: ignore[arg-type,return-value]


async def test_duplicate_kind_fails_at_registration(store: PostgresStore) -> None:
    @dataclass
    class Other(Task):
        KIND = "order"

    async def handle(task: Task, ctx: Context[None], app: None) -> None:
        return None

    worker = Worker(None, store)
    worker.register(Order, handle)
    with pytest.raises(DuplicateKindError, match=r"'order' is already registered by .*Order"):
        worker.register(Other, handle)


async def test_naive_datetime_is_rejected(queue: Queue) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        await queue.enqueue_at(Order(order_id=1), datetime(2030, 1, 1))


@dataclass
class Urgent(Task):
    KIND = "urgent"

    def priority(self) -> Priority:
        return 7  # type: ignore[return-value]  # what a typo in user code looks like


async def test_invalid_priority_is_rejected_and_nothing_is_stored(queue: Queue) -> None:
    expected = r"expected a Priority, LOW \(0\), NORMAL \(1\), HIGH \(2\); got 7"
    with pytest.raises(ValueError, match=f"^priority=: {expected}"):
        await queue.enqueue(Order(order_id=1), priority=7)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=f"^priority=: {expected}"):
        await queue.enqueue_many([Order(order_id=2), Order(order_id=3)], priority=7)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=rf"^Urgent\.priority\(\): {expected}"):
        await queue.enqueue(Urgent())
    assert (await queue.stats()).pending == 0


async def test_undecodable_payload_goes_dead_with_the_reason(queue: Queue) -> None:
    # A producer on an older release enqueued a string where the worker expects an int.
    @dataclass
    class OldOrder(Task):
        KIND = "order"
        order_id: str

    ran: list[int] = []

    async def handle(task: Order, ctx: Context[None], app: None) -> Outcome:
        ran.append(task.order_id)
        return Outcome.completed()

    bad = await queue.enqueue(OldOrder(order_id="abc"))
    good = await queue.enqueue(Order(order_id=2))
    worker = Worker(None, queue.store)
    worker.register(Order, handle)
    async with running(worker):
        await until_status(queue, bad, JobStatus.DEAD)
        await until_status(queue, good, JobStatus.COMPLETED)
    [entry] = await queue.job_journal(bad)
    assert entry.note is not None and "undecodable payload" in entry.note
    assert "$.order_id" in entry.note
    assert ran == [2]
    job = await queue.job(bad)
    assert job is not None and job.payload == {"order_id": "abc"}  # kept for inspection


async def test_unknown_kind_is_left_pending_for_a_worker_that_knows_it(queue: Queue) -> None:
    """A worker claims only kinds it registered: a job for a kind no running worker knows
    (say, enqueued by a newer producer during a rolling deploy) waits, and is not lost."""

    @dataclass
    class NewKind(Task):
        KIND = "new_kind"

    async def handle(task: Order, ctx: Context[None], app: None) -> Outcome:
        return Outcome.completed()

    unknown = await queue.enqueue(NewKind())
    known = await queue.enqueue(Order(order_id=1))
    worker = Worker(None, queue.store)
    worker.register(Order, handle)
    async with running(worker):
        await until_status(queue, known, JobStatus.COMPLETED)
    job = await queue.job(unknown)
    assert job is not None and job.status is JobStatus.PENDING and job.run_count == 0
    assert (await queue.stats()).pending_by_kind == {"new_kind": 1}


async def test_attachment_cap(queue: Queue) -> None:
    errors: list[str] = []

    async def handle(task: Order, ctx: Context[None], app: None) -> Outcome:
        try:
            ctx.attach("x" * ATTACHMENT_MAX_BYTES)
        except AttachmentTooLarge as exc:
            errors.append(str(exc))
        ctx.attach({"ok": True})
        return Outcome.completed()

    worker = Worker(None, queue.store)
    worker.register(Order, handle)
    job_id = await queue.enqueue(Order(order_id=1))
    async with running(worker):
        await until_status(queue, job_id, JobStatus.COMPLETED)
    assert len(errors) == 1 and "over the 65536-byte cap" in errors[0]
    [entry] = await queue.job_journal(job_id)
    assert entry.attachment == {"ok": True}


async def test_worker_settings_are_validated(store: PostgresStore) -> None:
    with pytest.raises(ValueError, match="concurrency"):
        Worker(None, store, concurrency=0)
    with pytest.raises(ValueError, match="backstop"):
        Worker(None, store, backstop=0)
    with pytest.raises(ValueError, match="lease"):
        Worker(None, store, lease=0)
    with pytest.raises(ValueError, match="no task registered"):
        await Worker(None, store).run(asyncio.Event())


async def test_closed_store_says_so(pg_dsn: str, prefix: str) -> None:
    from venturi import StoreClosedError

    store = await PostgresStore.connect(pg_dsn, prefix=prefix)
    await store.close()
    await store.close()  # twice is fine
    with pytest.raises(StoreClosedError, match="closed"):
        await store.stats()


def test_a_store_used_in_another_event_loop_says_so(pg_dsn: str, prefix: str) -> None:
    """A store's connections belong to the loop it was connected in (asyncpg said "Event loop
    is closed" or "attached to a different loop", or a later asyncio.run hung on them)."""
    home, other = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        store = home.run_until_complete(PostgresStore.connect(pg_dsn, prefix=prefix))
        home.run_until_complete(store.migrate())
        queue = Queue(store)

        async def elsewhere() -> None:
            message = "this PostgresStore was connected in another event loop"
            with pytest.raises(RuntimeError, match=message):
                await queue.enqueue(Order(order_id=1))
            with pytest.raises(RuntimeError, match=message):
                await queue.stats()
            with pytest.raises(RuntimeError, match=message):
                await queue.store.with_prefix(prefix).stats()

        other.run_until_complete(elsewhere())
        assert home.run_until_complete(queue.stats()).pending == 0  # at home: fine
        home.run_until_complete(store.close())
    finally:
        other.close()
        home.close()


async def test_closing_a_store_ends_even_with_a_connection_never_given_back(
    pg_dsn: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A connection some task holds past the end must not keep a stopping process alive
    (asyncpg's own close waits for it forever): close terminates it after its timeout."""
    store = await PostgresStore.connect(pg_dsn, prefix=prefix)
    with pytest.raises(ValueError, match=r"close\(grace\): expected seconds >= 0, got -1"):
        await store.close(grace=-1)  # refused before anything is closed
    leaked = await store._pool.acquire()
    backend = await leaked.fetchval("SELECT pg_backend_pid()")
    await asyncio.wait_for(store.close(grace=0.2), 10)
    with pytest.raises(asyncpg.InterfaceError):
        await leaked.fetchval("SELECT 1")  # taken from its holder
    assert "connections still in use after 0.2s were terminated" in caplog.text
    # The server's side of the connection is gone too, not just the client's.
    check = await asyncpg.connect(pg_dsn)
    try:
        for _ in range(100):
            alive = await check.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", backend
            )
            if not alive:
                break
            await asyncio.sleep(0.05)  # the server notices the closed socket on its own
        assert not alive
    finally:
        await check.close()


# -- values validated where they are made (issue 11) --------------------------------------


def test_outcome_and_task_error_check_their_values_at_the_call() -> None:
    with pytest.raises(TypeError, match="Outcome note: expected a str, got int"):
        Outcome.completed(note=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Outcome note"):
        Outcome.pause_in(1, note=b"bytes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="TaskError message: expected a str, got int"):
        TaskError.permanent(123)  # type: ignore[arg-type]
    for delay in (math.inf, 1e20, math.nan, -1, MAX_DELAY + 1):
        with pytest.raises(ValueError, match=r"pause_in\(delay\): expected a duration from 0 s"):
            Outcome.pause_in(delay)
    assert Outcome.pause_in(MAX_DELAY).delay == MAX_DELAY
    with pytest.raises(ValueError, match="pause_in"):
        Outcome("paused", None, math.inf)  # direct construction is checked too
    # Text for people is made safe rather than refused: a NUL becomes the 4 characters \x00.
    assert Outcome.completed(note="a\x00b").note == "a\\x00b"
    assert TaskError.retryable("x\x00y").message == "x\\x00y"
    assert Outcome.completed(note="lone \ud800").note == "lone \\ud800"


def test_failure_notes_survive_hostile_exceptions() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert failure_note(ValueError("a\x00b")) == "ValueError: a\\x00b"
    assert failure_note(TaskError.permanent("gone")) == "gone"
    assert failure_note(Unprintable()) == (
        "Unprintable: <unprintable: its __str__ raised RuntimeError>"
    )
    assert failure_note(KeyError("\udcff")) == "KeyError: '\\udcff'"
    # A message of megabytes keeps its start, and says how much it left out.
    huge = failure_note(RuntimeError("x" * 5_000_000))
    assert huge == f"RuntimeError: {'x' * 8000}... (4,992,000 more characters not kept)"
    assert failure_note(TaskError.retryable("y" * 8001)).endswith(
        "y... (1 more character not kept)"
    )


def test_attach_refuses_what_json_would_change() -> None:
    ctx: Context[None] = Context(
        job_id=ULID(),
        kind="k",
        queue="default",
        run_count=1,
        history=(),
        carry=None,
        cancellation=Cancellation(),
    )
    ctx.attach({"ok": 1.5, "none": None})
    with pytest.raises(ValueError, match=r"field \"\['ratio'\]\" is nan"):
        ctx.attach({"ratio": math.nan})
    with pytest.raises(ValueError, match=r"field '\[1\]' is inf"):
        ctx.attach([1.0, math.inf])
    with pytest.raises(ValueError, match="NUL character"):
        ctx.attach({"text": "a\x00b"})
    with pytest.raises(ValueError, match="nested too deeply"):
        ctx.attach(_nested(5000))
    assert ctx.attachment == b'{"ok":1.5,"none":null}'  # the earlier attachment is kept


@dataclass
class Hostile(Task):
    KIND = "hostile"
    mode: str


async def hostile(task: Hostile, ctx: Context[None], app: None) -> Outcome | None:
    if task.mode == "nul-note":
        return Outcome.completed(note="a\x00b")
    if task.mode == "nul-pause-note":
        return Outcome.pause_in(3600, note="p\x00")
    if task.mode == "nul-error":
        raise ValueError("bad \x00 input")
    if task.mode == "surrogate-error":
        raise RuntimeError("bytes \udcff")
    if task.mode == "nul-task-error":
        raise TaskError.permanent("gone\x00")
    if task.mode == "bad-attachments":
        for bad in (math.nan, {"s": "x\x00"}):
            with contextlib.suppress(ValueError):
                ctx.attach(bad)
        return None
    return None


async def test_hostile_values_from_handlers_settle_and_spare_the_batch(queue: Queue) -> None:
    """Each of these once made the batched settle statement fail, and with it every innocent
    job settled in the same batch: now each settles, with its text escaped."""
    modes = [
        "nul-note",
        "nul-pause-note",
        "nul-error",
        "surrogate-error",
        "nul-task-error",
        "bad-attachments",
    ]
    bad = {m: await queue.enqueue(Hostile(mode=m)) for m in modes}
    innocent = await queue.enqueue_many([Hostile(mode="fine") for _ in range(40)])
    worker = Worker(None, queue.store, concurrency=8, panic_policy=PanicPolicy.DEAD)
    worker.register(Hostile, hostile)
    async with running(worker):
        for job_id in innocent:
            await until_status(queue, job_id, JobStatus.COMPLETED)
        for job_id in bad.values():
            await until_status(
                queue, job_id, JobStatus.COMPLETED, JobStatus.DEAD, JobStatus.PENDING
            )
    assert (await queue.stats()).claimed == 0
    notes = {m: [e.note for e in await queue.job_journal(job_id)] for m, job_id in bad.items()}
    assert notes["nul-note"] == ["a\\x00b"]
    assert notes["nul-pause-note"] == ["p\\x00"]
    assert notes["nul-error"] == ["ValueError: bad \\x00 input"]
    assert notes["surrogate-error"] == ["RuntimeError: bytes \\udcff"]
    assert notes["nul-task-error"] == ["gone\\x00"]
    [entry] = await queue.job_journal(bad["bad-attachments"])
    assert entry.outcome.value == "completed" and entry.attachment is None


def _nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth):
        value = [value]
    return value


# -- enqueue: refused with a clear error, nothing stored (issue 11) ------------------------


@dataclass
class Reading(Task):
    KIND = "reading"
    sensor: str
    value: float
    note: str | None = None
    extra: dict[str, object] | None = None
    history: list[object] | None = None


async def test_values_json_would_change_are_refused_naming_the_field(queue: Queue) -> None:
    cases = [
        (Reading("s1", math.nan), r"field 'value' is nan: NaN and infinity cannot be stored"),
        (Reading("s1", -math.inf), r"field 'value' is -inf"),
        (Reading("s1", 1.0, history=[1.0, [2.0, math.inf]]), r"field 'history\[1\]\[1\]' is inf"),
        (Reading("s1", 1.0, extra={"k": math.nan}), r"""field "extra\['k'\]" is nan"""),
        (Reading("a\x00b", 1.0), r"field 'sensor' holds a NUL character"),
        (Reading("s1", 1.0, extra={"k\x00": 1}), r"a key of field 'extra' holds a NUL"),
        (Reading("s1", 1.0, history=_nested(5000)), r"field 'history' \(list\): nested too deeply"),
        (
            Reading("s1", 1.0, history=[["ok", "x\udcff"]]),
            r"field 'history\[0\]\[1\]' is not valid U",
        ),
    ]
    for task, message in cases:
        with pytest.raises(PayloadError, match=r"cannot encode payload of Reading \(reading\): "):
            await queue.enqueue(task)
        with pytest.raises(PayloadError, match=message):
            await queue.enqueue(task)
        with pytest.raises(PayloadError, match=message):
            await queue.enqueue_many([Reading("ok", 1.0), task])
    assert (await queue.stats()).pending == 0
    # What JSON stores faithfully still goes through: None, and a backslash before "u0000".
    fine = await queue.enqueue(Reading("s\\u0000", 2.5, note=None, extra={"null": None}))
    job = await queue.job(fine)
    assert job is not None and job.payload["sensor"] == "s\\u0000"
    assert job.payload["note"] is None and job.payload["value"] == 2.5


@dataclass
class Charge(Task):
    KIND = "charge_typed"
    order_id: int
    at: datetime | None = None
    tags: list[str] = field(default_factory=list)


async def test_values_that_do_not_fit_their_field_s_type_are_refused(queue: Queue) -> None:
    """A task is typed: "42" for an int would be stored, then send the job dead at the
    worker's decode; the enqueue refuses it instead, naming the field."""
    cases = [
        (Charge(order_id="42"), r"Expected `int`, got `str` - at `\$.order_id`"),  # type: ignore[arg-type]
        (Charge(1, at="yesterday"), r"Invalid RFC3339 encoded datetime - at `\$.at`"),  # type: ignore[arg-type]
        (Charge(1, tags=["a", 2]), r"Expected `str`, got `int` - at `\$.tags\[1\]`"),  # type: ignore[list-item]
    ]
    for task, message in cases:
        with pytest.raises(PayloadError, match=r"payload of Charge \(charge_typed\): "):
            await queue.enqueue(task)
        with pytest.raises(PayloadError, match=message):
            await queue.enqueue_many([Charge(1), task])
    assert (await queue.stats()).pending == 0
    # What decodes as the field's type goes through (an int where a float is declared, too).
    assert await queue.job(await queue.enqueue(Charge(7, tags=["x"]))) is not None
    assert await queue.job(await queue.enqueue(Reading("s1", 3))) is not None


@dataclass
class Keyed(Task):
    KIND = "keyed"
    key: str
    repeat: int = 1

    def dedup_key(self) -> DedupKey | None:
        return DedupKey(self.key * self.repeat)


async def test_bad_dedup_keys_are_refused(queue: Queue) -> None:
    with pytest.raises(ValueError, match=r"DedupKey: the key holds a NUL character"):
        DedupKey("a\x00b")
    with pytest.raises(
        ValueError, match=r"DedupKey: the key is 8,000 bytes of UTF-8, over the 2,000"
    ):
        await queue.enqueue(Keyed("x", repeat=8000))
    with pytest.raises(ValueError, match=r"2,400 bytes"):
        await queue.enqueue(Keyed("é", repeat=1200))  # the limit is in bytes: the index's unit
    with pytest.raises(ValueError, match="lone surrogate"):
        DedupKey("\ud800")
    assert (await queue.stats()).pending == 0
    longest = await queue.enqueue(Keyed("x", repeat=DEDUP_KEY_MAX_BYTES))
    assert await queue.enqueue(Keyed("x", repeat=DEDUP_KEY_MAX_BYTES)) == longest  # it merges


async def test_queue_names_are_validated_like_kinds(store: PostgresStore) -> None:
    for bad in ("", "a\x00b", "has space", "-lead", "x" * 201):
        with pytest.raises(ValueError, match=r"queue: invalid queue name"):
            Queue(store, queue=bad)
        with pytest.raises(ValueError, match=r"queue: invalid queue name"):
            Worker(None, store, queue=bad)
    for wrong in (None, 5):
        with pytest.raises(TypeError, match=r"queue: expected a queue name \(a str\)"):
            Queue(store, queue=wrong)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"queue: expected a queue name"):
        Worker(None, store, queue=5)  # type: ignore[arg-type]
    # A long name is shortened in the middle: the message still shows where it ends.
    with pytest.raises(ValueError, match=r"invalid queue name 'x{77}…': expected 1-200") as long:
        Queue(store, queue="x" * 201)
    assert len(str(long.value).split(": expected")[0]) < 120
    assert Worker(None, store, queue=None).queues == ("default",)  # None: the default queue
    assert Queue(store, queue="emails.eu-1:fast/v2").queue == "emails.eu-1:fast/v2"


async def test_a_workers_queues_are_validated(store: PostgresStore) -> None:
    assert Worker(None, store, queues=["high", "default"]).queues == ("high", "default")
    with pytest.raises(ValueError, match="not both"):
        Worker(None, store, queue="a", queues=["b"])
    with pytest.raises(ValueError, match="at least one queue"):
        Worker(None, store, queues=[])
    with pytest.raises(ValueError, match="each queue may be named once"):
        Worker(None, store, queues=["a", "b", "a"])
    with pytest.raises(TypeError, match="a list of queue names"):
        Worker(None, store, queues="high,default")
    with pytest.raises(ValueError, match=r"queues: invalid queue name"):
        Worker(None, store, queues=["ok", "not ok"])


async def test_a_subclass_must_declare_its_own_kind(queue: Queue) -> None:
    @dataclass
    class Priced(Order):  # inherits KIND = "order": its jobs would run as Order
        price: float = 0.0

    with pytest.raises(
        TypeError,
        match=r"Priced inherits KIND 'order' from .*Order: each task class declares its own KIND",
    ):
        await queue.enqueue(Priced(order_id=1, price=2.0))
    with pytest.raises(TypeError, match="declares its own KIND"):
        await queue.enqueue_many([Priced(order_id=1)])
    with pytest.raises(TypeError, match="declares its own KIND"):
        Worker(None, queue.store).register(Priced, lambda t, c, a: None)  # type: ignore[arg-type,return-value]
    assert (await queue.stats()).pending == 0

    @dataclass
    class Rebranded(Order):
        KIND = "rebranded_order"

    await queue.enqueue(Rebranded(order_id=1))  # a subclass with its own KIND is fine


@dataclass
class Policy(Task):
    KIND = "policy"
    lease_s: str | None = None  # a string, so the payload itself is always fine
    curve: tuple[float, float] | None = None
    raw_curve: bool = False

    def lease(self) -> float | None:
        return None if self.lease_s is None else float(self.lease_s)

    def backoff(self) -> Backoff | None:
        if self.curve is None:
            return None
        return self.curve if self.raw_curve else Backoff(*self.curve)  # type: ignore[return-value]


async def test_delays_and_policies_beyond_their_bounds_are_refused(queue: Queue) -> None:
    for delay in (math.inf, 1e12, math.nan, timedelta(days=3653), -1):
        with pytest.raises(
            ValueError, match=r"enqueue_in\(delay\): expected a duration from 0 s to 10 years"
        ):
            await queue.enqueue_in(Order(order_id=1), delay)
    for when in (
        datetime.max.replace(tzinfo=UTC),
        datetime.min.replace(tzinfo=UTC),
        datetime.now(UTC) + timedelta(days=3653),
        datetime(9999, 12, 31, 20, tzinfo=timezone(timedelta(hours=-5))),
    ):
        with pytest.raises(ValueError, match="enqueue_at: `when` must be within 10 years of now"):
            await queue.enqueue_at(Order(order_id=1), when)
    for lease in ("inf", "1e12", "0.001", "0", "nan"):
        with pytest.raises(
            ValueError, match=r"Policy.lease\(\): expected a duration from 0.5 s to 30 days"
        ):
            await queue.enqueue(Policy(lease_s=lease))
        with pytest.raises(ValueError, match=r"Policy.lease\(\)"):
            await queue.enqueue_many([Policy(lease_s=lease)])
    with pytest.raises(TypeError, match=r"Policy.backoff\(\) must return a Backoff or None"):
        await queue.enqueue(Policy(curve=(1, 2), raw_curve=True))
    assert (await queue.stats()).pending == 0
    # The curve itself is checked where it is made.
    with pytest.raises(ValueError, match=r"Backoff.base: expected a duration from 0 s to 10 years"):
        Backoff(math.inf)
    with pytest.raises(
        ValueError, match=r"Backoff.cap: expected a duration from 0 s to 10 years, got inf"
    ):
        Backoff(1, math.inf)
    with pytest.raises(ValueError, match=r"Backoff: base \(10 s\) must not exceed cap \(1 s\)"):
        Backoff(base=10, cap=1)
    # The bounds themselves are accepted.
    await queue.enqueue(Policy(lease_s="0.5", curve=(0, MAX_DELAY)))
    await queue.enqueue(Policy(lease_s="2592000", curve=(0, 0)))
    await queue.enqueue_in(Order(order_id=2), MAX_DELAY)
    await queue.enqueue_at(Order(order_id=3), datetime.now(UTC) - timedelta(days=3650))
    stats = await queue.stats()
    assert stats.pending_by_kind == {"policy": 2, "order": 1}
    assert stats.scheduled_by_kind == {"order": 1}


async def test_the_database_refuses_policies_no_release_may_store(store: PostgresStore) -> None:
    """A producer of an older release (or hand-written SQL) cannot store a policy that would
    make every claim or recovery statement of its queue fail."""
    insert = (
        f"INSERT INTO {store.prefix}_jobs (id, kind, payload, lease_s, backoff_base_s, "
        f"backoff_cap_s) VALUES (gen_random_uuid(), 'k', '{{}}', $1, $2, $3)"
    )
    async with store._pool.acquire() as conn:
        for lease, base, cap in [
            (math.inf, None, None),
            (math.nan, None, None),
            (1e12, None, None),
            (0.001, None, None),
            (None, math.inf, math.inf),
            (None, 10.0, 1.0),
            (None, 1.0, None),
            (None, -1.0, 1.0),
        ]:
            with pytest.raises(asyncpg.CheckViolationError):
                await conn.execute(insert, lease, base, cap)
        await conn.execute(insert, 0.5, 0.0, MAX_DELAY)


async def test_migrating_brings_stored_policies_within_bounds(pg_dsn: str, prefix: str) -> None:
    async with await PostgresStore.connect(pg_dsn, prefix=prefix) as store:
        async with store._pool.acquire() as conn, conn.transaction():
            # The schema as the previous release left it (migrations 1 and 2) ...
            await migrate_before(conn, prefix, "queue_dedup_and_policy_bounds")
            # ... with the rows that release let through.
            rows = {
                "inf-lease": (math.inf, None, None),
                "nan-lease": (math.nan, None, None),
                "tiny-lease": (0.001, None, None),
                "swapped-curve": (60.0, 10.0, 1.0),
                "inf-curve": (None, math.inf, math.inf),
                "fine": (60.0, 1.0, 600.0),
            }
            for kind, (lease, base, cap) in rows.items():
                await conn.execute(
                    f"INSERT INTO {prefix}_jobs (id, kind, payload, lease_s, backoff_base_s, "
                    f"backoff_cap_s) VALUES (gen_random_uuid(), $1, '{{}}', $2, $3, $4)",
                    kind,
                    lease,
                    base,
                    cap,
                )
        assert await store.migrate() == all_migrations()[2:]
        got = {
            r["kind"]: (r["lease_s"], r["backoff_base_s"], r["backoff_cap_s"])
            for r in await store._pool.fetch(
                f"SELECT kind, lease_s, backoff_base_s, backoff_cap_s FROM {prefix}_jobs"
            )
        }
    assert got == {
        "inf-lease": (2592000.0, None, None),
        "nan-lease": (None, None, None),  # the worker's lease
        "tiny-lease": (0.5, None, None),
        "swapped-curve": (60.0, None, None),  # the worker's curve
        "inf-curve": (None, None, None),
        "fine": (60.0, 1.0, 600.0),
    }


@pytest.mark.parametrize(
    ("setting", "value", "error", "message"),
    [
        (
            "concurrency",
            True,
            TypeError,
            r"concurrency: expected an int from 1 to 10,000, got True",
        ),
        ("concurrency", 10**6, ValueError, r"concurrency: expected an int from 1 to 10,000"),
        ("concurrency", 0, ValueError, r"concurrency: expected an int from 1"),
        ("concurrency", 2.0, TypeError, r"concurrency"),
        ("poll_max", 0, ValueError, r"poll_max: expected a duration from 0.01 s to 1 day"),
        ("poll_max", math.inf, ValueError, r"poll_max: expected a duration from 0.01 s"),
        ("lease", 0.001, ValueError, r"lease: expected a duration from 0.5 s to 30 days"),
        ("lease", math.inf, ValueError, r"lease: expected a duration from 0.5 s to 30 days"),
        (
            "shutdown_timeout",
            math.inf,
            ValueError,
            r"shutdown_timeout: expected a duration from 0 s to 1 day",
        ),
        ("shutdown_timeout", -1, ValueError, r"shutdown_timeout"),
        (
            "jitter_fraction",
            math.nan,
            ValueError,
            r"jitter_fraction: expected a number in \[0, 1\]",
        ),
        ("jitter_fraction", "0.5", TypeError, r"jitter_fraction"),
        ("backstop", True, TypeError, r"backstop: expected an int from 1"),
        ("backstop", 0, ValueError, r"backstop"),
        ("priority_ratio", False, TypeError, r"priority_ratio"),
        ("backoff", (1, 2), TypeError, r"backoff: expected a venturi.Backoff"),
        ("metrics_port", -1, ValueError, r"metrics_port: expected an int from 1 to 65,535, got -1"),
        ("metrics_port", 70000, ValueError, r"metrics_port: expected an int from 1 to 65,535"),
        ("metrics_port", "9100", TypeError, r"metrics_port"),
        ("metrics_host", "not an ip", ValueError, r"metrics_host: expected an IP address"),
        ("metrics_host", 127, TypeError, r"metrics_host"),
    ],
)
def test_worker_refuses_settings_out_of_range(
    store: PostgresStore, setting: str, value: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        Worker(None, store, **{setting: value})  # type: ignore[arg-type]


def test_worker_settings_at_their_bounds_and_documented_clamps(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = Worker(
        None, store, concurrency=10_000, poll_max=0.01, lease=0.5, shutdown_timeout=86400
    )
    assert (worker.concurrency, worker.poll_max, worker.lease) == (10_000, 0.01, 0.5)
    assert Worker(None, store, jitter_fraction=5).policy.jitter_fraction == 1.0  # clamped
    assert Worker(None, store, jitter_fraction=-3).policy.jitter_fraction == 0.0
    assert Worker(None, store, metrics_host="::1", metrics_port=65535).metrics_host == "::1"
    # /metrics listens on every interface only inside a pod.
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert Worker(None, store).metrics_host == "127.0.0.1"
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert Worker(None, store).metrics_host == "0.0.0.0"
    assert Worker(None, store, metrics_host="127.0.0.1").metrics_host == "127.0.0.1"


# -- the schema: missing, older or newer than this release (issue 11) ----------------------


async def test_tables_off_the_search_path_are_named_and_migrating_warns_of_a_second_queue(
    store: PostgresStore, pg_dsn: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A role whose search_path leaves out the schema of the tables: "run venturi migrate"
    made a second, empty queue in its schema, which the first queue's producers never fill."""
    schema = f"{prefix}_s"
    await store._pool.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in pg_dsn else "?"
    off_path = f"{pg_dsn}{sep}options=-c%20search_path%3D{schema}"
    try:
        async with await PostgresStore.connect(off_path, prefix=prefix) as other:
            elsewhere = (
                rf"the tables of prefix '{prefix}' are in schema public, which is not on this "
                rf"session's search_path \({schema}\): put it there"
            )
            with pytest.raises(SchemaError, match=elsewhere):
                await Queue(other).stats()
            with pytest.raises(SchemaError, match=elsewhere):
                await Queue(other).enqueue(Order(order_id=1))
            caplog.set_level("WARNING", logger="venturi")
            assert await other.migrate()  # still possible: a queue of its own, said so
            [said] = [r.message for r in caplog.records if "second, separate queue" in r.message]
            assert f"prefix '{prefix}' is installed in schema public" in said
            assert (await Queue(other).stats()).pending == 0
    finally:
        await store._pool.execute(f"DROP SCHEMA {schema} CASCADE")


async def test_an_unmigrated_prefix_says_to_migrate(pg_dsn: str, prefix: str) -> None:
    async with await PostgresStore.connect(pg_dsn, prefix=prefix) as store:
        queue = Queue(store)
        calls = [
            queue.enqueue(Order(order_id=1)),
            queue.enqueue_many([Order(order_id=1), Order(order_id=2)]),
            queue.enqueue(Keyed("k")),
            queue.stats(),
            queue.job(ULID()),
            queue.jobs(),
            queue.job_journal(ULID()),
            queue.result(ULID(), timeout=30),  # at once, not after its timeout
            queue.chain(Order(order_id=1), Order(order_id=2)),
            queue.batch("b").add(Order(order_id=1)).enqueue(),
            queue.batch_status(ULID()),
            queue.recent_batches(),
            queue.cancel_batch(ULID()),
            queue.prune_batches(60),
            queue.retry_all(),
            store.check_schema(),
        ]
        for call in calls:
            with pytest.raises(
                SchemaError,
                match=r"does not exist: the tables of prefix .* are missing, or older than this "
                r"release of venturi; run `venturi migrate`",
            ):
                await call
        # Also when the store's held connection serves the enqueue (a second single enqueue).
        with pytest.raises(SchemaError, match="run `venturi migrate`"):
            await queue.enqueue(Order(order_id=2))
        worker = Worker(None, store)
        worker.register(Order, lambda t, c, a: None)  # type: ignore[arg-type,return-value]
        with pytest.raises(SchemaError, match="run `venturi migrate`"):
            await worker.run(asyncio.Event())


async def test_a_schema_from_another_release_is_refused(store: PostgresStore) -> None:
    worker = Worker(None, store)
    worker.register(Order, lambda t, c, a: None)  # type: ignore[arg-type,return-value]
    await store.check_schema()  # this release's schema: fine
    await store._pool.execute(
        f"INSERT INTO {store.prefix}_migrations (version, name) VALUES (999, 'from_the_future')"
    )
    with pytest.raises(
        SchemaError, match=r"has migrations \[999\] that this release of venturi does not know"
    ):
        await store.migrate()
    with pytest.raises(SchemaError, match=r"\[999\].*upgrade venturi"):
        await store.check_schema()
    with pytest.raises(SchemaError, match=r"\[999\]"):
        await worker.run(asyncio.Event())
    # Older: a migration of this release is missing.
    await store._pool.execute(f"DELETE FROM {store.prefix}_migrations WHERE version IN (3, 999)")
    with pytest.raises(SchemaError, match=r"lacks migrations \[3\]: run `venturi migrate`"):
        await store.check_schema()


async def test_a_job_id_may_be_given_as_its_string_and_a_bad_one_is_named(queue: Queue) -> None:
    job_id = await queue.enqueue(Order(order_id=7))
    job = await queue.job(str(job_id))  # as `venturi jobs` and the logs show it
    assert job is not None and job.id == job_id
    assert [e.outcome for e in await queue.job_journal(str(job_id))] == []
    for call in (
        lambda: queue.job("01-not-a-ulid"),
        lambda: queue.job_journal("01-not-a-ulid"),
        lambda: queue.retry("01-not-a-ulid"),
        lambda: queue.forget("01-not-a-ulid"),
        lambda: queue.result("01-not-a-ulid", timeout=1),
    ):
        with pytest.raises(ValueError, match="job id: expected a ULID, got '01-not-a-ulid'"):
            await call()
    with pytest.raises(TypeError, match="job id: expected a ULID or its string, got 7"):
        await queue.job(7)  # type: ignore[arg-type]
    assert (await queue.stats()).pending == 1  # nothing changed


async def test_a_worker_refuses_a_store_bound_to_the_callers_connection(
    store: PostgresStore,
) -> None:
    async with store._pool_or_raise().acquire() as conn:
        with pytest.raises(TypeError, match="Worker: needs a store of its own"):
            Worker(None, store.using(conn))


async def test_filters_take_a_status_by_its_name_and_refuse_unknown_ones_and_kinds(
    queue: Queue,
) -> None:
    job_id = await queue.enqueue(Order(order_id=3))
    assert JobFilter(status="pending").status is JobStatus.PENDING  # type: ignore[arg-type]
    listed = await queue.jobs(JobFilter(status="pending"))  # type: ignore[arg-type]
    assert [j.id for j in listed] == [job_id]
    with pytest.raises(ValueError, match=r"JobFilter\.status: expected a JobStatus or one of pend"):
        JobFilter(status="done")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"CleanupCriteria\.status: expected a JobStatus"):
        CleanupCriteria(finished_before=datetime.now(UTC), status="gone")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kind: invalid KIND 'send email'"):
        await queue.jobs(JobFilter(kind="send email"))
    with pytest.raises(ValueError, match="kind: invalid KIND 'send email'"):
        await queue.cleanup(CleanupCriteria(finished_before=datetime.now(UTC), kind="send email"))
    # Every criterion is checked, as everywhere else: none is silently an empty list, nor
    # asyncpg's "invalid input for query argument $3".
    refused = [
        (JobFilter(queue="a b"), ValueError, "JobFilter.queue: invalid queue name 'a b'"),
        (JobFilter(queue=5), TypeError, r"JobFilter.queue: expected a queue name \(a str\)"),  # type: ignore[arg-type]
        (
            JobFilter(created_after=datetime(2026, 1, 1)),
            ValueError,
            "JobFilter.created_after: expected a timezone-aware datetime, got datetime",
        ),
        (
            JobFilter(created_before="yesterday"),  # type: ignore[arg-type]
            ValueError,
            "JobFilter.created_before: expected a timezone-aware datetime, got 'yesterday'",
        ),
        (JobFilter(before_id="nope"), ValueError, "JobFilter.before_id: expected a ULID"),  # type: ignore[arg-type]
        (JobFilter(limit=True), ValueError, r"JobFilter.limit: expected 1..10000, got True"),
        (JobFilter(limit=0), ValueError, r"JobFilter.limit: expected 1..10000, got 0"),
    ]
    for criteria, error, message in refused:
        with pytest.raises(error, match=message):
            await queue.jobs(criteria)
    # A ULID's string is taken, as everywhere an id is.
    newer = await queue.enqueue(Order(order_id=4))
    page = await queue.jobs(JobFilter(before_id=str(newer)))  # type: ignore[arg-type]
    assert [j.id for j in page] == [job_id]
    assert (await queue.stats()).pending == 2  # nothing changed


async def test_a_listing_shows_what_it_cannot_decode_and_the_rest(queue: Queue) -> None:
    """Enqueue takes nesting up to Python's recursion limit, from a shallow stack; a listing
    decodes from a deeper one (here made so by a lower limit). The value it cannot decode
    shows as such: the listing, and the CLI's, is not lost to a RecursionError."""
    deep = await queue.enqueue(Reading("deep", 1.0, history=_nested(600)))
    plain = await queue.enqueue(Reading("plain", 2.0))
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack(0)) + 300)  # room for everything but the value
    try:
        listed = {j.id: j.payload for j in await queue.jobs()}
    finally:
        sys.setrecursionlimit(limit)
    assert listed[deep] == {
        "venturi:unlisted": "nested too deeply to decode here (a worker decodes it)"
    }
    assert listed[plain]["sensor"] == "plain"
