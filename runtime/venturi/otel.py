"""OpenTelemetry traces from enqueue to run (the `otel` extra: `opentelemetry-api` only).

    from venturi.otel import Tracing

    tracing = Tracing()                                    # the application's tracer provider
    queue = Queue(store, tracer=tracing)                   # enqueue: a PRODUCER span
    worker = Worker(app, store, middleware=[tracing.middleware])   # each run: a CONSUMER span

An enqueue is a `send {queue}` PRODUCER span; its W3C `traceparent` is stored with each job
it wrote (a batch shares one span, its creation context). Each run is a `process {queue}`
CONSUMER span, a new trace *linked* to the enqueue's span by default (retries, and jobs of a
big batch, stay out of the request's trace, which sampling then keeps whole);
`Tracing(propagation="child")` makes it a child of the enqueue's span instead. Attributes
follow the OpenTelemetry messaging conventions (`messaging.system` "venturi",
`messaging.operation.name`/`.type`, `messaging.destination.name` the queue,
`messaging.message.id` the job id), with `venturi.job.kind`, `venturi.job.run`,
`venturi.job.retry_count` (runs before this one) and `venturi.job.outcome`; a handler's
exception is recorded on the span, whose status is then ERROR.

The run's span is current while the handler runs (its own spans are children of it), and it
ends when the handler returns or raises, in this middleware's `finally`: before the outcome
is written (writes are batched across jobs), so no span outlives its run or leaks into the
next. Put the middleware first, so it wraps the others.

With no SDK configured (the API's default provider), there are no spans and no trace
context is stored. Without this module's tracer and middleware nothing is traced, nothing
extra is stored, and claims do not read the column.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("venturi.otel needs opentelemetry-api: install venturi[otel]") from exc
from ulid import ULID

from venturi.context import Context
from venturi.middleware import CallNext
from venturi.outcome import Outcome, TaskError

Propagation = Literal["link", "child"]

SYSTEM = "venturi"
_W3C = TraceContextTextMapPropagator()


class Tracing:
    """Producer and consumer spans for one tracer provider (None: the global one).

    `propagation` is how a run's span relates to its enqueue's: "link" (a new trace with a
    link, the default) or "child" (the same trace, a child of the enqueue's span).
    """

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        *,
        propagation: Propagation = "link",
    ) -> None:
        if propagation not in ("link", "child"):
            raise ValueError(f"propagation: expected 'link' or 'child', got {propagation!r}")
        self.propagation = propagation
        self._tracer = trace.get_tracer(
            "venturi", importlib.metadata.version("venturi"), tracer_provider=tracer_provider
        )

    # -- producing: an EnqueueTracer (venturi.hooks) ---------------------------------

    @contextmanager
    def enqueue(self, queue: str, jobs: Sequence[tuple[ULID, str]]) -> Iterator[list[str | None]]:
        """A `send {queue}` PRODUCER span around one enqueue; yields each job's traceparent
        (the span's), or None without a span context (no SDK configured)."""
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.name": "send",
            "messaging.operation.type": "send",
            "messaging.destination.name": queue,
        }
        if len(jobs) == 1:
            attributes["messaging.message.id"] = str(jobs[0][0])
            attributes["venturi.job.kind"] = jobs[0][1]
        else:
            attributes["messaging.batch.message_count"] = len(jobs)
            kinds = sorted({kind for _, kind in jobs})
            attributes["venturi.job.kind"] = kinds[0] if len(kinds) == 1 else kinds
        with self._tracer.start_as_current_span(
            f"send {queue}", kind=trace.SpanKind.PRODUCER, attributes=attributes
        ) as span:
            context = None
            # Also for a span sampled out (its flags say so): the run's span then follows
            # the same sampling decision. No context at all without an SDK.
            if span.get_span_context().is_valid:
                carrier: dict[str, str] = {}
                _W3C.inject(carrier)
                context = carrier.get("traceparent")
            yield [context] * len(jobs)

    def merged(self, holder: ULID) -> None:
        """Called inside `enqueue`'s block when the job was merged into `holder` (a dedup
        key's pending job, or a unique id's holder): the span names the job that was
        stored, not the id the enqueue would have had."""
        span = trace.get_current_span()
        span.set_attribute("messaging.message.id", str(holder))
        span.set_attribute("venturi.job.merged", True)

    # -- consuming: a middleware (venturi.middleware) --------------------------------

    @property
    def middleware(self) -> _RunSpans:
        """The worker middleware that makes each run a CONSUMER span."""
        return _RunSpans(self)

    def _run_span(self, ctx: Context[Any]) -> trace.Span:
        # A fresh, empty context for "link": a run never inherits whatever context the
        # worker itself was started in.
        parent = otel_context.Context()
        links: list[trace.Link] = []
        if ctx.trace_context is not None:
            remote = _W3C.extract({"traceparent": ctx.trace_context})
            enqueued = trace.get_current_span(remote).get_span_context()
            if enqueued.is_valid:
                if self.propagation == "child":
                    parent = remote
                else:
                    links.append(trace.Link(enqueued))
        return self._tracer.start_span(
            f"process {ctx.queue}",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            links=links,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.name": "process",
                "messaging.operation.type": "process",
                "messaging.destination.name": ctx.queue,
                "messaging.message.id": str(ctx.job_id),
                "venturi.job.kind": ctx.kind,
                "venturi.job.run": ctx.run_count,
                "venturi.job.retry_count": ctx.run_count - 1,
            },
        )


class _RunSpans:
    """`Tracing.middleware`: a CONSUMER span around each run, ended when the run ends."""

    reads_trace_context = True
    """The worker's claims then read each job's stored trace context (`ctx.trace_context`)."""

    def __init__(self, tracing: Tracing) -> None:
        self._tracing = tracing

    async def __call__(self, task: Any, ctx: Context[Any], call_next: CallNext) -> Outcome | None:
        span = self._tracing._run_span(ctx)
        outcome = "failed"
        # end_on_exit: ended (and detached from the context) on every path out.
        with trace.use_span(
            span, end_on_exit=True, record_exception=False, set_status_on_exception=False
        ):
            try:
                result = await call_next()
            except asyncio.CancelledError:
                outcome = "released"  # venturi took the run back (shutdown, lost lease)
                raise
            except BaseException as exc:
                if isinstance(exc, TaskError) and exc.is_permanent:
                    outcome = "dead"
                span.record_exception(exc)
                span.set_attribute("error.type", type(exc).__qualname__)
                span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)[:200]))
                raise
            else:
                if isinstance(result, Outcome):
                    outcome = result.status
                elif result is None:
                    outcome = "completed"
                return result  # anything else fails the run (the executor says why)
            finally:
                span.set_attribute("venturi.job.outcome", outcome)
