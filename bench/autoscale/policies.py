"""The policies besides KEDA: venturi's operator, driven as its reconcile loop drives it, a
static fleet, and a clairvoyant that knows the trace's arrival rate (the report's bounds).

``VenturiOperator`` runs the operator's own code on simulated inputs, in the order
``reconcile.Reconciler._scale_pool`` uses it: the JobQueue spec goes through
``spec.parse_spec``, the stats (a real ``venturi.Stats``) through ``spec.pool_loads``; each
tick calls ``policy.decide`` with the Deployment's replicas and ready replicas and the history
the previous tick returned; when that decides a scale-in, the pods' claims
(``Queue.claimed_by_pod()``) become deletion costs (``scalein``), the busy pods are counted and
``decide`` runs again with them, and the costs are patched before the scale. The loop around it
is the daemon's in ``handlers.jobqueue``: a tick when the JobQueue appears, then one
``interval`` after each tick ends (``cadence.next_wait``: a couple of seconds after a scale-in
busy pods held back), or earlier when a NOTIFY wakes it (``cadence.wake_at``, from the
replicas the last tick decided and when it ran).

The scale-in is fenced, as the operator's (``scalein``, ``Queue.fence_pods``): the pods it
would remove are fenced half-way through the tick's round trips (from then on they claim
nothing, as the claim refuses them), those that claimed before the fence are spared, and the
rest get the lowest deletion cost. ``fence=False`` is the operator before the fence (an
ablation): costs from one read of the claims, and a moment after it in which a pod may claim.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from bench.autoscale.model import READY, STARTING, Cluster
from venturi import QueueStats, Stats
from venturi_operator import cadence, policy, scalein
from venturi_operator.spec import parse_spec, pool_loads

#: The kind every simulated job has.
KIND = "work"
#: Seconds from a NOTIFY being sent to the operator's daemon waking.
NOTIFY_LATENCY_S = 0.01
#: Seconds a tick takes from reading the stats to the scale patch (API round trips).
TICK_LATENCY_S = 0.05


def example_spec(concurrency: int = 8, max_replicas: int = 100) -> dict[str, Any]:
    """The JobQueue a user writes (examples/jobqueue.yaml), for this worker and KEDA's bounds."""
    return {
        "database": {"secretName": "venturi-db"},
        "interval": 15,
        "pools": [
            {
                "deployment": "worker",
                "minReplicas": 0,
                "maxReplicas": max_replicas,
                "targetPerReplica": concurrency,
                "maxOldestPendingAge": 60,
                "cooldownSeconds": 300,
            }
        ],
    }


def cluster_stats(cluster: Cluster) -> Stats:
    """What ``Queue.stats()`` would return for the simulated queue now."""
    pending = len(cluster.pending)
    claimed = cluster.claimed
    age = cluster.oldest_pending_age()
    done = cluster.completed_total
    queue = QueueStats(
        pending_by_kind={KIND: pending} if pending else {},
        claimed_by_kind={KIND: claimed} if claimed else {},
        oldest_pending_age_by_kind={KIND: age} if age is not None else {},
        completed_by_kind={KIND: done} if done else {},
    )
    return Stats(
        pending_by_kind=queue.pending_by_kind,
        claimed_by_kind=queue.claimed_by_kind,
        oldest_pending_age_by_kind=queue.oldest_pending_age_by_kind,
        completed_by_kind=queue.completed_by_kind,
        queues={"default": queue},
    )


class VenturiOperator:
    """venturi's operator on one JobQueue with one pool."""

    def __init__(
        self,
        spec: Mapping[str, Any] | None = None,
        *,
        name: str = "venturi",
        spare_busy_pods: bool = True,
        retry: bool = True,
        fence: bool = True,
        overrides: Mapping[str, float] | None = None,
    ) -> None:
        self.name = name
        #: Victims fenced before a scale-in, as the operator does (False: an ablation).
        self.fence = fence
        #: An ablation only: the interval after a scale-in busy pods held back, too.
        self.retry = retry
        #: Ablations only (the report's "what each rule costs"): pods' claims ignored, or
        #: policy constants replaced while ``decide`` runs.
        self.spare_busy_pods = spare_busy_pods
        self.overrides = dict(overrides or {})
        self.spec = parse_spec(spec if spec is not None else example_spec())
        self.pool = self.spec.pools[0]
        self.history = policy.History()
        #: ``_Memory.replicas``: what the last tick decided (None before the first tick).
        self.decided: int | None = None
        #: (time, replicas before, decision) of every tick.
        self.decisions: list[tuple[float, int, policy.Decision]] = []
        #: When the last tick started (``_Memory.ticked_at``).
        self.last_tick: float | None = None
        self._generation = 0
        self._next_tick = 0.0
        self._woken = False

    def start(self, cluster: Cluster) -> None:
        self._schedule(cluster, cluster.now)

    def on_notify(self, cluster: Cluster) -> None:
        # handlers.on_job -> Reconciler.wakes_for.
        if self._woken:
            return
        when = cadence.wake_at(decided=self.decided, last_tick=self.last_tick, now=cluster.now)
        if when is None or when >= self._next_tick:
            return
        self._woken = True
        self._schedule(cluster, when + NOTIFY_LATENCY_S)

    def _schedule(self, cluster: Cluster, when: float) -> None:
        self._next_tick = when
        self._generation += 1
        generation = self._generation
        cluster.at(when, lambda: self._tick(cluster, generation))

    def _tick(self, cluster: Cluster, generation: int) -> None:
        if generation != self._generation:
            return  # a wake-up replaced this wait
        self._woken = False
        now = cluster.now
        self.last_tick = now
        load = pool_loads(self.spec, cluster_stats(cluster))[self.pool.deployment]
        current = cluster.spec_replicas
        ready = cluster.ready_pods()

        def decide(busy: int | None) -> policy.Decision:
            saved = {k: getattr(policy, k) for k in self.overrides}
            try:
                for k, v in self.overrides.items():
                    setattr(policy, k, v)
                return policy.decide(
                    load, self.pool, self.history, now, current=current, ready=ready, busy=busy
                )
            finally:
                for k, v in saved.items():
                    setattr(policy, k, v)

        if self.fence:
            for pod in cluster.live_pods():
                cluster.unfence(pod)  # each scale-in fences its own victims afresh
        decision = decide(None)
        costs: dict[str, int] = {}
        if decision.replicas < current and self.spare_busy_pods:
            pods = [p.name for p in cluster.live_pods()]
            costs = scalein.deletion_costs(pods, cluster.claimed_by_pod())
            decision = decide(scalein.busy_pods(costs))
        self.decisions.append((now, current, decision))
        if decision.replicas < current and self.fence:
            self._fenced_scale_in(cluster, now, current, decision.replicas, costs)
        elif decision.replicas != current:
            replicas = decision.replicas

            def apply() -> None:
                for pod in cluster.live_pods():
                    pod.cost = costs.get(pod.name, pod.cost)
                cluster.scale(replicas, by="venturi")

            cluster.at(now + TICK_LATENCY_S, apply)
        self.history = decision.history
        self.decided = decision.replicas
        spared = self.retry and decision.reason is policy.Reason.BUSY_PODS_SPARED
        wait = cadence.next_wait(self.spec.interval, spared=spared)
        self._schedule(cluster, now + TICK_LATENCY_S + wait)

    def _fenced_scale_in(
        self, cluster: Cluster, now: float, current: int, replicas: int, costs: dict[str, int]
    ) -> None:
        """The fence: the victims (starting pods first, as the ReplicaSet takes them,
        then idle ready ones) are recorded half-way through the tick's round trips, and from
        then claim nothing; a victim that claimed before the record is seen by the re-read
        after it and spared; the fenced idle ones get the lowest deletion cost, and the
        Deployment loses no more pods than they are."""
        live = cluster.live_pods()
        starting = [p for p in live if p.state == STARTING]
        idle = sorted(
            (p for p in live if p.state == READY and costs.get(p.name, 0) == 0),
            key=cluster._deletion_rank,
        )
        victims = (starting + idle)[: current - replicas]

        def record() -> None:
            for pod in victims:
                cluster.fence(pod)

        def apply() -> None:
            safe = [p for p in victims if p.fenced and not p.jobs and p.state in (STARTING, READY)]
            for pod in victims:
                if pod not in safe:
                    cluster.unfence(pod)
            for pod in cluster.live_pods():
                pod.cost = -1 if pod in safe else costs.get(pod.name, pod.cost)
            self.decided = max(replicas, current - len(safe))
            cluster.scale(self.decided, by="venturi")

        cluster.at(now + TICK_LATENCY_S / 2, record)
        cluster.at(now + TICK_LATENCY_S, apply)


class Static:
    """A fixed fleet, ready from the start: the reference for cost and wait."""

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas
        self.name = f"static ({replicas})"

    def start(self, cluster: Cluster) -> None:
        pass

    def on_notify(self, cluster: Cluster) -> None:
        pass


class Clairvoyant:
    """A policy that knows the arrival rate ahead: what no real autoscaler can do, so what it
    costs bounds what any of them can cost.

    Every ``every`` seconds it sets the replicas ``replicas_at`` gives for the time, taking the
    higher of now and ``lead`` seconds ahead: on the way up its pods are asked for a start-up
    before the rate rises, on the way down they go the moment it falls -- busy or not, unless
    ``spare_busy_pods`` (as venturi: never below the pods that hold jobs, idle ones first).
    """

    def __init__(
        self,
        name: str,
        replicas_at: Callable[[float], int],
        *,
        lead: float,
        spare_busy_pods: bool,
        every: float = 1.0,
    ) -> None:
        self.name = name
        self.replicas_at = replicas_at
        self.lead = lead
        self.spare_busy_pods = spare_busy_pods
        self.every = every

    def start(self, cluster: Cluster) -> None:
        cluster.at(cluster.now, lambda: self._tick(cluster))

    def on_notify(self, cluster: Cluster) -> None:
        pass

    def _tick(self, cluster: Cluster) -> None:
        now = cluster.now
        want = max(self.replicas_at(now), self.replicas_at(now + self.lead))
        current = cluster.spec_replicas
        if want < current and self.spare_busy_pods:
            pods = cluster.live_pods()
            costs = scalein.deletion_costs([p.name for p in pods], cluster.claimed_by_pod())
            for pod in pods:
                pod.cost = costs[pod.name]
            want = max(want, min(scalein.busy_pods(costs), current))
        if want != current:
            cluster.scale(want, by=self.name)
        cluster.at(now + self.every, lambda: self._tick(cluster))
