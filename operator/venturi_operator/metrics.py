"""The operator's Prometheus metrics, served from the last reconcile's results.

A scrape never touches a database: gauges are rendered from an in-memory snapshot per
JobQueue that each tick replaces, and a JobQueue's series disappear when it is deleted.
Labels: `jobqueue_namespace` (not `namespace`, which Prometheus' Kubernetes discovery
attaches to the scraped target), `jobqueue`, and `kind` or `pool`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

JQ = ("jobqueue_namespace", "jobqueue")


@dataclass(frozen=True, kw_only=True)
class PoolSnapshot:
    pending: int
    claimed: int
    oldest_pending_age: float | None
    current_replicas: int | None
    desired_replicas: int | None
    min_replicas: int
    max_replicas: int
    max_oldest_pending_age: float | None


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """What the last tick of one JobQueue saw."""

    stats_up: bool
    pending_by_kind: Mapping[str, int] = field(default_factory=dict)
    claimed_by_kind: Mapping[str, int] = field(default_factory=dict)
    dead_by_kind: Mapping[str, int] = field(default_factory=dict)
    oldest_pending_age_by_kind: Mapping[str, float] = field(default_factory=dict)
    pools: Mapping[str, PoolSnapshot] = field(default_factory=dict)


class OperatorMetrics(Collector):
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._snapshots: dict[tuple[str, str], Snapshot] = {}
        self._ticks: dict[tuple[str, str], tuple[float, float]] = {}
        """(when the last tick ended, Unix time; the JobQueue's interval) per JobQueue."""
        self._lock = threading.Lock()
        self.scale_events = Counter(
            "venturi_pool_scale_events_total",
            "Replica changes the operator made, by direction (up or down).",
            [*JQ, "pool", "direction"],
            registry=self.registry,
        )
        self.reconcile_duration = Histogram(
            "venturi_reconcile_duration_seconds",
            "Time one reconcile tick of a JobQueue took.",
            JQ,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.leader = Gauge(
            "venturi_operator_leader",
            "1 while this operator replica acts (leads, with --leader-elect), 0 while it waits.",
            registry=self.registry,
        )
        self.reconcile_errors = Counter(
            "venturi_reconcile_errors_total",
            "Reconcile ticks that could not do everything, by reason.",
            [*JQ, "reason"],
            registry=self.registry,
        )
        self.registry.register(self)

    def update(self, namespace: str, name: str, snapshot: Snapshot) -> None:
        with self._lock:
            self._snapshots[(namespace, name)] = snapshot
        for pool in snapshot.pools:
            for direction in ("up", "down"):
                # Create each series at 0, so increase() also counts its first scale event.
                self.scale_events.labels(namespace, name, pool, direction)

    def ticked(self, namespace: str, name: str, *, at: float, interval: float) -> None:
        """A tick of the JobQueue ended at `at` (Unix time), whatever it managed: a loop that
        no longer ticks (stuck, or its daemon gone) shows as a time that stops moving."""
        with self._lock:
            self._ticks[(namespace, name)] = (at, interval)

    def forget(self, namespace: str, name: str) -> None:
        """Drop every series of a deleted JobQueue."""
        with self._lock:
            self._snapshots.pop((namespace, name), None)
            self._ticks.pop((namespace, name), None)
        for metric in (self.scale_events, self.reconcile_duration, self.reconcile_errors):
            for labels in set(_label_sets(metric)):
                if labels[:2] == (namespace, name):
                    with contextlib.suppress(KeyError):
                        metric.remove(*labels)

    def describe(self) -> Iterator[Metric]:
        return iter(())  # collected dynamically

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            snapshots = dict(self._snapshots)
            ticks = dict(self._ticks)
        up = GaugeMetricFamily(
            "venturi_jobqueue_stats_up", "1 if the last tick read the queue's stats.", labels=JQ
        )
        last_tick = GaugeMetricFamily(
            "venturi_jobqueue_last_tick_timestamp_seconds",
            "When the JobQueue's last reconcile tick ended (Unix time), whatever it managed.",
            labels=JQ,
        )
        interval = GaugeMetricFamily(
            "venturi_jobqueue_interval_seconds",
            "The JobQueue's spec.interval: the most time between two ticks.",
            labels=JQ,
        )
        for (ns, name), (at, every) in sorted(ticks.items()):
            last_tick.add_metric([ns, name], at)
            interval.add_metric([ns, name], every)
        by_kind = {
            "pending": GaugeMetricFamily(
                "venturi_queue_pending_jobs", "Jobs eligible now, by kind.", labels=[*JQ, "kind"]
            ),
            "claimed": GaugeMetricFamily(
                "venturi_queue_claimed_jobs", "Jobs held by workers, by kind.", labels=[*JQ, "kind"]
            ),
            "dead": GaugeMetricFamily(
                "venturi_queue_dead_jobs",
                "Dead jobs not yet cleaned up, by kind.",
                labels=[*JQ, "kind"],
            ),
            "age": GaugeMetricFamily(
                "venturi_queue_oldest_pending_age_seconds",
                "How long the oldest eligible job has waited, by kind.",
                labels=[*JQ, "kind"],
            ),
        }
        pool = {
            "pending": GaugeMetricFamily(
                "venturi_pool_pending_jobs",
                "Eligible jobs of the kinds a pool serves.",
                labels=[*JQ, "pool"],
            ),
            "claimed": GaugeMetricFamily(
                "venturi_pool_claimed_jobs",
                "Claimed jobs of the kinds a pool serves.",
                labels=[*JQ, "pool"],
            ),
            "age": GaugeMetricFamily(
                "venturi_pool_oldest_pending_age_seconds",
                "How long the oldest eligible job of a pool's kinds has waited.",
                labels=[*JQ, "pool"],
            ),
            "age_target": GaugeMetricFamily(
                "venturi_pool_max_oldest_pending_age_seconds",
                "The pool's oldest-pending-age target (maxOldestPendingAge).",
                labels=[*JQ, "pool"],
            ),
            "current": GaugeMetricFamily(
                "venturi_pool_current_replicas",
                "The Deployment's replicas at the last tick.",
                labels=[*JQ, "pool"],
            ),
            "desired": GaugeMetricFamily(
                "venturi_pool_desired_replicas",
                "The replicas the operator decided.",
                labels=[*JQ, "pool"],
            ),
            "min": GaugeMetricFamily(
                "venturi_pool_min_replicas", "The pool's minReplicas.", labels=[*JQ, "pool"]
            ),
            "max": GaugeMetricFamily(
                "venturi_pool_max_replicas", "The pool's maxReplicas.", labels=[*JQ, "pool"]
            ),
        }
        for (ns, name), s in sorted(snapshots.items()):
            up.add_metric([ns, name], 1.0 if s.stats_up else 0.0)
            for kind, n in s.pending_by_kind.items():
                by_kind["pending"].add_metric([ns, name, kind], n)
            for kind, n in s.claimed_by_kind.items():
                by_kind["claimed"].add_metric([ns, name, kind], n)
            for kind, n in s.dead_by_kind.items():
                by_kind["dead"].add_metric([ns, name, kind], n)
            for kind, age in s.oldest_pending_age_by_kind.items():
                by_kind["age"].add_metric([ns, name, kind], age)
            for pool_name, p in s.pools.items():
                labels = [ns, name, pool_name]
                pool["pending"].add_metric(labels, p.pending)
                pool["claimed"].add_metric(labels, p.claimed)
                pool["age"].add_metric(labels, p.oldest_pending_age or 0.0)
                if p.max_oldest_pending_age is not None:
                    pool["age_target"].add_metric(labels, p.max_oldest_pending_age)
                if p.current_replicas is not None:
                    pool["current"].add_metric(labels, p.current_replicas)
                if p.desired_replicas is not None:
                    pool["desired"].add_metric(labels, p.desired_replicas)
                pool["min"].add_metric(labels, p.min_replicas)
                pool["max"].add_metric(labels, p.max_replicas)
        yield up
        yield last_tick
        yield interval
        yield from by_kind.values()
        yield from pool.values()

    def serve(self, port: int, host: str = "0.0.0.0") -> None:
        start_http_server(port, host, registry=self.registry)


def _label_sets(metric: Counter | Histogram) -> Iterator[tuple[str, ...]]:
    for sample_metric in metric.collect():
        for sample in sample_metric.samples:
            labels = sample.labels
            keys = [k for k in labels if k != "le"]
            yield tuple(labels[k] for k in keys)
