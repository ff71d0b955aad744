"""OpenTelemetry (`venturi.otel`) with the SDK's in-memory exporter: enqueue spans, the
stored traceparent, run spans linked (or parented) to them, errors and retries recorded,
batches and batched settles leaving no span open; and across processes, a `venturi worker`
exporting its spans to a file."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from ulid import ULID

from venturi import (
    Backoff,
    Context,
    DedupKey,
    JobStatus,
    Outcome,
    PostgresStore,
    Queue,
    Task,
    TaskError,
    Worker,
)
from venturi.otel import Tracing

from .cli_app import Echo
from .helpers import running, until, until_status

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Traced(Task):
    KIND = "otel.traced"
    n: int = 0


@dataclass
class Flaky(Task):
    KIND = "otel.flaky"
    permanent: bool = False


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


async def stored_context(store: PostgresStore, job_id: ULID) -> str | None:
    value: str | None = await store._pool.fetchval(
        f"SELECT trace_context FROM {store.prefix}_jobs WHERE id = $1", job_id.to_uuid()
    )
    return value


def traceparent(span: ReadableSpan) -> str:
    ctx = span.get_span_context()
    assert ctx is not None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


async def run_until_settled(worker: Worker[None], queue: Queue, ids: list[ULID]) -> None:
    async with running(worker):
        for job_id in ids:
            await until_status(queue, job_id, JobStatus.COMPLETED, JobStatus.DEAD)


async def test_a_run_is_a_consumer_span_linked_to_its_enqueue(
    store: PostgresStore, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    tracing = Tracing(provider)
    queue = Queue(store, tracer=tracing)
    seen: list[trace.Span] = []

    async def handle(task: Traced, ctx: Context[None], app: None) -> None:
        seen.append(trace.get_current_span())  # the run's span is current in the handler

    request = provider.get_tracer("app").start_as_current_span("POST /signup")
    with request as outer:
        job_id = await queue.enqueue(Traced(1))
    [send] = named(exporter, "send ")
    assert send.kind is trace.SpanKind.PRODUCER and send.name == "send default"
    assert send.parent is not None and send.parent.span_id == outer.get_span_context().span_id
    assert dict(send.attributes or {}) == {
        "messaging.system": "venturi",
        "messaging.operation.name": "send",
        "messaging.operation.type": "send",
        "messaging.destination.name": "default",
        "messaging.message.id": str(job_id),
        "venturi.job.kind": Traced.KIND,
    }
    assert await stored_context(store, job_id) == traceparent(send)

    worker = Worker(None, store, middleware=[tracing.middleware])
    worker.register(Traced, handle)
    await run_until_settled(worker, queue, [job_id])
    [process] = named(exporter, "process ")
    assert process.kind is trace.SpanKind.CONSUMER and process.name == "process default"
    assert process.parent is None  # a trace of its own ...
    assert [link.context.span_id for link in process.links] == [send.context.span_id]  # ...linked
    assert process.context.trace_id != send.context.trace_id
    assert seen[0].get_span_context().span_id == process.context.span_id
    attributes = dict(process.attributes or {})
    assert attributes["messaging.operation.type"] == "process"
    assert attributes["messaging.destination.name"] == "default"
    assert attributes["messaging.message.id"] == str(job_id)
    assert attributes["venturi.job.kind"] == Traced.KIND
    assert attributes["venturi.job.outcome"] == "completed"
    assert attributes["venturi.job.retry_count"] == 0
    assert process.status.status_code is trace.StatusCode.UNSET


async def test_child_propagation_continues_the_enqueue_trace(
    store: PostgresStore, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    tracing = Tracing(provider, propagation="child")
    queue = Queue(store, tracer=tracing)
    job_id = await queue.enqueue(Traced())

    async def handle(task: Traced, ctx: Context[None], app: None) -> None:
        pass

    worker = Worker(None, store, middleware=[tracing.middleware])
    worker.register(Traced, handle)
    await run_until_settled(worker, queue, [job_id])
    [send], [process] = named(exporter, "send "), named(exporter, "process ")
    assert process.parent is not None and process.parent.span_id == send.context.span_id
    assert process.context.trace_id == send.context.trace_id and not process.links


async def test_errors_and_retries_are_recorded(
    store: PostgresStore, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    tracing = Tracing(provider)
    queue = Queue(store, tracer=tracing)

    async def handle(task: Flaky, ctx: Context[None], app: None) -> Outcome:
        if task.permanent:
            raise TaskError.permanent("no such account")
        if ctx.run_count == 1:
            raise RuntimeError("first try fails")
        return Outcome.completed()

    retried, dead = await queue.enqueue(Flaky()), await queue.enqueue(Flaky(permanent=True))
    worker = Worker(None, store, middleware=[tracing.middleware], backoff=Backoff(0.01, 0.01))
    worker.register(Flaky, handle)
    await run_until_settled(worker, queue, [retried, dead])
    by_job: dict[str, list[ReadableSpan]] = {}
    for span in named(exporter, "process "):
        by_job.setdefault(str((span.attributes or {})["messaging.message.id"]), []).append(span)
    first, second = sorted(by_job[str(retried)], key=lambda s: s.start_time or 0)
    assert (first.attributes or {})["venturi.job.outcome"] == "failed"
    assert first.status.status_code is trace.StatusCode.ERROR
    assert (first.attributes or {})["error.type"] == "RuntimeError"
    assert [e.name for e in first.events] == ["exception"]
    assert (second.attributes or {})["venturi.job.outcome"] == "completed"
    assert (second.attributes or {})["venturi.job.retry_count"] == 1
    # Both runs link to the one enqueue: the retry does not stretch the producer's trace.
    assert first.links[0].context.span_id == second.links[0].context.span_id
    [final] = by_job[str(dead)]
    assert (final.attributes or {})["venturi.job.outcome"] == "dead"


async def test_batches_and_batched_settles_leave_no_span_open(
    store: PostgresStore, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    tracing = Tracing(provider)
    queue = Queue(store, tracer=tracing)
    ids = await queue.enqueue_many([Traced(n) for n in range(60)])
    [send] = named(exporter, "send ")
    assert (send.attributes or {})["messaging.batch.message_count"] == 60
    assert {await stored_context(store, i) for i in ids} == {traceparent(send)}
    started = 0

    async def handle(task: Traced, ctx: Context[None], app: None) -> None:
        nonlocal started
        started += 1
        await asyncio.sleep(0)

    worker = Worker(None, store, concurrency=8, middleware=[tracing.middleware])
    worker.register(Traced, handle)
    with provider.get_tracer("app").start_as_current_span("worker main"):
        await run_until_settled(worker, queue, ids)
    runs = named(exporter, "process ")
    # One span per run, every one ended (only ended spans are exported), none the parent of
    # another nor of the ambient span the worker was started in.
    assert len(runs) == started == 60
    assert all(s.parent is None and s.end_time is not None for s in runs)
    assert {str((s.attributes or {})["messaging.message.id"]) for s in runs} == {
        str(i) for i in ids
    }
    assert trace.get_current_span() is trace.INVALID_SPAN  # nothing left attached here


async def test_transactional_enqueue_stores_the_context(
    store: PostgresStore, pg_dsn: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    queue = Queue(store, tracer=Tracing(provider))
    conn = await asyncpg.connect(pg_dsn)
    try:
        async with conn.transaction():
            job_id = await queue.enqueue(Traced(), conn=conn)
    finally:
        await conn.close()
    [send] = named(exporter, "send ")
    assert await stored_context(store, job_id) == traceparent(send)


async def test_untraced_paths_store_and_read_nothing(
    store: PostgresStore, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    # Without a tracer nothing is stored; with the API's default (no SDK) provider, neither.
    plain = await Queue(store).enqueue(Traced())
    unrecorded = await Queue(store, tracer=Tracing(trace.NoOpTracerProvider())).enqueue(Traced())
    assert await stored_context(store, plain) is None
    assert await stored_context(store, unrecorded) is None
    # A worker without the middleware never reads the stored context.
    traced = await Queue(store, tracer=Tracing(provider)).enqueue(Traced())
    assert await stored_context(store, traced) is not None
    contexts: list[str | None] = []

    async def handle(task: Traced, ctx: Context[None], app: None) -> None:
        contexts.append(ctx.trace_context)

    worker = Worker(None, store)
    worker.register(Traced, handle)
    await run_until_settled(worker, Queue(store), [plain, unrecorded, traced])
    assert contexts == [None, None, None]
    assert not named(exporter, "process ")


async def test_a_worker_process_links_its_runs_to_the_producer(
    queue: Queue,
    pg_dsn: str,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    tmp_path: Path,
) -> None:
    traced = Queue(queue.store, tracer=Tracing(provider))
    ids = [await traced.enqueue(Echo(text=str(n))) for n in range(3)]
    ids += await traced.enqueue_many([Echo(text="batch") for _ in range(5)])
    sends = {s.context.span_id: s for s in named(exporter, "send ")}
    spans_file = tmp_path / "spans.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VENTURI_", "PG"))}
    env |= {
        "VENTURI_DSN": pg_dsn,
        "VENTURI_PREFIX": queue.store.prefix,
        "VENTURI_TEST_SPANS": str(spans_file),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "venturi",
        "worker",
        "tests.runtime.otel_app:make_worker",
        "--stop-when-empty",
        cwd=ROOT,
        env=env,
    )
    try:
        assert await asyncio.wait_for(proc.wait(), timeout=60) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    runs = [json.loads(line) for line in spans_file.read_text().splitlines()]
    assert sorted(r["attributes"]["messaging.message.id"] for r in runs) == sorted(map(str, ids))
    for run in runs:
        assert run["kind"] == "CONSUMER" and run["ended"] and run["parent"] is None
        [link] = run["links"]
        assert int(link, 16) in sends  # the producer's span, in another process
    assert len({r["links"][0] for r in runs}) == 4  # three single sends and one batch
    await until(lambda: _all_completed(queue, ids))


async def _all_completed(queue: Queue, ids: list[ULID]) -> bool:
    for job_id in ids:
        job = await queue.job(job_id)
        if job is None or job.status is not JobStatus.COMPLETED:
            return False
    return True


async def test_a_sampled_out_enqueue_still_passes_its_decision_on(store: PostgresStore) -> None:
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    queue = Queue(store, tracer=Tracing(TracerProvider(sampler=ALWAYS_OFF)))
    job_id = await queue.enqueue(Traced())
    stored = await stored_context(store, job_id)
    assert stored is not None
    assert int(stored.rsplit("-", 1)[1], 16) & 1 == 0  # not sampled: a child follows suit


def test_venturi_runs_without_opentelemetry_installed() -> None:
    """Nothing but venturi.otel imports it; that module says which extra to install."""
    script = (
        "import sys, importlib.abc\n"
        "class Absent(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] == 'opentelemetry':\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Absent())\n"
        "import venturi, venturi.worker, venturi.queue, venturi.cli\n"
        "try:\n"
        "    import venturi.otel\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "venturi.otel needs opentelemetry-api: install venturi[otel]"


async def test_chains_and_batches_are_traced_like_any_enqueue(
    store: PostgresStore, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    queue = Queue(store, tracer=Tracing(provider))
    links = await queue.chain(Traced(1), Traced(2), Traced(3))
    [chained] = named(exporter, "send ")
    assert (chained.attributes or {})["messaging.batch.message_count"] == 3
    assert [await stored_context(store, i) for i in links] == [traceparent(chained)] * 3
    exporter.clear()
    batch_id = await queue.batch("traced").add(Traced(4), Traced(5)).then(Traced(6)).enqueue()
    [batched] = named(exporter, "send ")
    assert (batched.attributes or {})["messaging.batch.message_count"] == 3  # with the callback
    rows = await store._pool.fetch(
        f"SELECT trace_context FROM {store.prefix}_jobs WHERE batch_id = $1", batch_id.to_uuid()
    )
    assert [r["trace_context"] for r in rows] == [traceparent(batched)] * 3


@dataclass
class Keyed(Task):
    KIND = "otel.keyed"
    key: str = "k"

    def dedup_key(self) -> DedupKey | None:
        return DedupKey(self.key)


async def test_a_merged_enqueue_s_span_names_the_job_that_holds_the_work(
    store: PostgresStore, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    queue = Queue(store, tracer=Tracing(provider))
    first = await queue.enqueue(Keyed())
    again = await queue.enqueue(Keyed())  # merged into the first (the default keeps it)
    assert again == first
    first_send, second_send = named(exporter, "send ")
    assert (first_send.attributes or {})["messaging.message.id"] == str(first)
    assert (second_send.attributes or {})["messaging.message.id"] == str(first)
    assert (second_send.attributes or {})["venturi.job.merged"] is True
    assert "venturi.job.merged" not in (first_send.attributes or {})
