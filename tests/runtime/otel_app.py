"""A traced worker for `venturi worker` in a process of its own (tests/runtime/test_otel.py):
the OpenTelemetry SDK with an exporter that appends each ended span, as one JSON line, to
the file named by VENTURI_TEST_SPANS."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from venturi import PostgresStore, Worker
from venturi.otel import Tracing

from .cli_app import Echo, echo


class FileExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock, open(self._path, "a") as out:
            for span in spans:
                out.write(span_json(span) + "\n")
        return SpanExportResult.SUCCESS


def span_json(span: ReadableSpan) -> str:
    ctx = span.get_span_context()
    assert ctx is not None
    return json.dumps(
        {
            "name": span.name,
            "kind": span.kind.name,
            "trace_id": f"{ctx.trace_id:032x}",
            "span_id": f"{ctx.span_id:016x}",
            "parent": None if span.parent is None else f"{span.parent.span_id:016x}",
            "links": [f"{link.context.span_id:016x}" for link in span.links],
            "attributes": dict(span.attributes or {}),
            "ended": span.end_time is not None,
        }
    )


def make_worker(store: PostgresStore) -> Worker[None]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter(os.environ["VENTURI_TEST_SPANS"])))
    worker = Worker(None, store, concurrency=4, middleware=[Tracing(provider).middleware])
    worker.register(Echo, echo)
    return worker
