"""Prometheus metrics for venturi (the `venturi[metrics]` extra).

Names follow Prometheus conventions: a `venturi_` prefix, base units (seconds), `_total` on
counters, and only low-cardinality labels (`kind`, `outcome`, `action`). Metrics live in
prometheus-client's default registry, shared by every queue and worker of the process.

    worker = Worker(app, store, metrics=True, metrics_port=9100)   # serves /metrics
    queue = Queue(store, metrics=True)
"""

from __future__ import annotations

import threading

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from venturi.errors import MetricsPortError
from venturi.hooks import Claimed, Enqueued, Finished, Hooks, Recovered, Settled, Started

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

ENQUEUED = Counter("venturi_jobs_enqueued_total", "Jobs enqueued.", ["kind"])
MERGED = Counter(
    "venturi_jobs_merged_total", "Enqueues merged into a pending job.", ["kind", "action"]
)
CLAIMED = Counter("venturi_jobs_claimed_total", "Jobs claimed by workers.", ["kind"])
SETTLED = Counter("venturi_jobs_settled_total", "Runs settled, by outcome.", ["kind", "outcome"])
RECOVERED = Counter(
    "venturi_jobs_recovered_total", "Jobs recovered after their lease expired.", ["kind"]
)
CLAIM_LATENCY = Histogram(
    "venturi_claim_latency_seconds",
    "Time from a job becoming eligible to its claim.",
    ["kind"],
    buckets=_LATENCY_BUCKETS,
)
HANDLER_DURATION = Histogram(
    "venturi_handler_duration_seconds",
    "Time handlers ran, per run.",
    ["kind"],
    buckets=_LATENCY_BUCKETS,
)
IN_FLIGHT = Gauge("venturi_jobs_in_flight", "Jobs running in this process.", ["kind"])


class PrometheusHooks(Hooks):
    """Records the lifecycle into the metrics above: metrics are one hook among others."""

    def enqueued(self, event: Enqueued) -> None:
        if event.merged is None:
            ENQUEUED.labels(event.kind).inc()
        else:
            MERGED.labels(event.kind, event.merged).inc()

    def claimed(self, event: Claimed) -> None:
        CLAIMED.labels(event.kind).inc()
        CLAIM_LATENCY.labels(event.kind).observe(max(event.waited_s, 0.0))

    def started(self, event: Started) -> None:
        IN_FLIGHT.labels(event.kind).inc()

    def finished(self, event: Finished) -> None:
        IN_FLIGHT.labels(event.kind).dec()
        if event.duration_s is not None:
            HANDLER_DURATION.labels(event.kind).observe(event.duration_s)

    def settled(self, event: Settled) -> None:
        SETTLED.labels(event.kind, event.outcome if event.kept else "lost").inc()

    def recovered(self, event: Recovered) -> None:
        RECOVERED.labels(event.kind).inc()


_served: dict[int, object] = {}
_lock = threading.Lock()


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Serve /metrics on `port` from a background thread (once per port per process)."""
    with _lock:
        if port not in _served:
            try:
                _served[port] = start_http_server(port, addr)
            except OSError as exc:
                raise MetricsPortError(
                    f"metrics_port {port}: cannot serve /metrics on {addr}:{port}: "
                    f"{exc.strerror or exc}"
                ) from exc
