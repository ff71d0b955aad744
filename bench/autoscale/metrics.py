"""What one run of one policy on one trace measured."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from bench.autoscale.model import Cluster

#: A scale in the opposite direction of the previous one within this many seconds is a flap.
FLAP_WINDOW_S = 300.0


@dataclass(frozen=True, kw_only=True)
class RunMetrics:
    replica_seconds: float
    #: Busy slot-seconds / provisioned slot-seconds (replica-seconds x concurrency).
    utilisation: float
    wait_p50: float
    wait_p99: float
    wait_max: float
    flaps: int
    #: Times of the flaps (the second scale of each pair), for the report's explanations.
    flap_times: tuple[float, ...]
    #: Each flap's pair: "up-down" (a scale-up undone) or "down-up" (a scale-in, then a
    #: scale-up for new work).
    flap_kinds: tuple[str, ...]
    #: Running jobs aborted at the end of a drain and run again.
    rerun: int
    #: Running jobs SIGKILLed with their pod (back only when their lease expired).
    killed: int
    #: The wait of each first job that arrived at zero replicas.
    first_from_zero: tuple[float, ...]
    scale_events: int
    peak_replicas: int
    jobs: int
    #: Jobs not done when the run stopped (counted in the waits up to that time).
    unfinished: int

    @property
    def first_from_zero_max(self) -> float | None:
        return max(self.first_from_zero) if self.first_from_zero else None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def quantile(values: list[float], q: float) -> float:
    """The nearest-rank quantile (what a p99 over jobs means: 99 % waited at most this)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def flaps(events: list[tuple[float, int, int]]) -> list[float]:
    """Times of scales in the opposite direction to the previous scale, within the window."""
    return [at for at, _ in reversals(events)]


def reversals(events: list[tuple[float, int, int]]) -> list[tuple[float, str]]:
    """The flaps, each with its pair: "up-down" or "down-up"."""
    out: list[tuple[float, str]] = []
    previous: tuple[float, int] | None = None
    for at, before, after in events:
        direction = 1 if after > before else -1
        if previous is not None and direction != previous[1] and at - previous[0] < FLAP_WINDOW_S:
            out.append((at, "up-down" if direction < 0 else "down-up"))
        previous = (at, direction)
    return out


def measure(cluster: Cluster) -> RunMetrics:
    c = cluster.counters
    end = cluster.now
    # A finished job waited until the start of the run that completed it; an unfinished one
    # until now, at least.
    waits = [
        (started if done and started is not None else end) - arrived
        for arrived, started, done in zip(
            cluster.arrival, cluster.started, cluster.done, strict=True
        )
    ]
    provisioned = c.replica_seconds * cluster.worker.concurrency
    flapped = reversals(c.scale_events)
    firsts = tuple(waits[j] for j in c.first_from_zero)
    return RunMetrics(
        replica_seconds=c.replica_seconds,
        utilisation=c.busy_slot_seconds / provisioned if provisioned else 0.0,
        wait_p50=quantile(waits, 0.50),
        wait_p99=quantile(waits, 0.99),
        wait_max=max(waits, default=0.0),
        flaps=len(flapped),
        flap_times=tuple(at for at, _ in flapped),
        flap_kinds=tuple(kind for _, kind in flapped),
        rerun=c.rerun,
        killed=c.killed,
        first_from_zero=firsts,
        scale_events=len(c.scale_events),
        peak_replicas=c.peak_replicas,
        jobs=len(cluster.arrival),
        unfinished=len(cluster.arrival) - c.completed,
    )
