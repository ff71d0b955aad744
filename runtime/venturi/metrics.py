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


class PrometheusHooks:
    """Records the lifecycle into the metrics above (implements venturi._hooks.Hooks)."""

    def enqueued(self, kind: str, count: int = 1) -> None:
        ENQUEUED.labels(kind).inc(count)

    def merged(self, kind: str, action: str) -> None:
        MERGED.labels(kind, action).inc()

    def claimed(self, kind: str, latency_s: float) -> None:
        CLAIMED.labels(kind).inc()
        CLAIM_LATENCY.labels(kind).observe(max(latency_s, 0.0))

    def settled(self, kind: str, outcome: str, duration_s: float | None) -> None:
        SETTLED.labels(kind, outcome).inc()
        if duration_s is not None:
            HANDLER_DURATION.labels(kind).observe(duration_s)

    def recovered(self, kind: str) -> None:
        RECOVERED.labels(kind).inc()

    def running(self, kind: str, delta: int) -> None:
        IN_FLIGHT.labels(kind).inc(delta)


_served: dict[int, object] = {}
_lock = threading.Lock()


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Serve /metrics on `port` from a background thread (once per port per process)."""
    with _lock:
        if port not in _served:
            _served[port] = start_http_server(port, addr)
