"""KEDA 2.x with its HorizontalPodAutoscaler, at their defaults: an independent model.

What a ScaledObject with one ``postgresql`` trigger does, and nothing venturi's own policy code
is reused for (the two must not share a bug):

**KEDA's scale loop** (kedacore/keda ``pkg/scaling/scale_handler.go`` ``startScaleLoop``, and
``pkg/scaling/executor/scale_scaledobjects.go`` ``RequestScale``, snapshot 8b4f083ca): every
``pollingInterval`` (30 s; the first check at once) it runs the trigger's query; the trigger is
active when the value is above ``activationTargetQueryValue`` (0; ``num > activation``,
``pkg/scalers/postgresql_scaler.go``). Active at zero replicas: ``scaleFromZeroOrIdle`` sets
``max(minReplicaCount, 1)`` = 1 replica. Active otherwise: ``lastActiveTime`` = now. Not active
with replicas and ``minReplicaCount`` 0: ``scaleToZeroOrIdle`` sets 0 once ``lastActiveTime +
cooldownPeriod`` (300 s) is past -- from any N, bypassing the HPA.

**The HPA** KEDA creates (``controllers/keda/hpa.go``: ``minReplicas`` = max(minReplicaCount,
1) = 1, ``maxReplicas`` = maxReplicaCount = 100, ``behavior`` nil unless the ScaledObject sets
``advanced.horizontalPodAutoscalerConfig.behavior``), synced every 15 s
(``--horizontal-pod-autoscaler-sync-period``) by kubernetes
``pkg/controller/podautoscaler/horizontal.go`` ``reconcileAutoscaler``:

- ``spec.replicas`` 0 and ``minReplicas`` 1: "scaling is disabled since the replica count of the
  target is zero" -- nothing happens (KEDA owns 0 <-> 1);
- above max / below min: to the bound;
- else the External ``AverageValue`` metric (``replica_calculator.go``
  ``GetExternalPerPodMetricReplicas``, the value read live through KEDA's metrics server since
  ``useCachedMetrics`` is false): ``ratio = value / (target * status.replicas)``; within the
  tolerance (``|1 - ratio| <= 0.1``) the proposal is ``status.replicas``, otherwise
  ``ceil(value / target)``;
- ``behavior`` nil takes ``normalizeDesiredReplicas``: the highest proposal of the last 300 s
  (``--horizontal-pod-autoscaler-downscale-stabilization``), then
  ``convertDesiredReplicasWithRules``: at most ``max(2 * current, 4)`` (``scaleUpLimitFactor``,
  ``scaleUpLimitMinimum``) and within ``[minReplicas, maxReplicas]`` -- the documented default
  "100 % or 4 pods per 15 s".

``status.replicas`` is the Deployment's pods that are not terminating (starting pods count).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Literal

from bench.autoscale.model import Cluster

Query = Literal["pending", "pending+running"]


@dataclass(kw_only=True)
class Hpa:
    """One HPA's controller state (its recommendations) and its sync, legacy (nil behavior) path."""

    min_replicas: int = 1
    max_replicas: int = 100
    tolerance: float = 0.1
    downscale_stabilization_s: float = 300.0
    scale_up_factor: float = 2.0
    scale_up_minimum: float = 4.0
    #: (time, replicas): the proposals of the stabilization window.
    recommendations: list[tuple[float, int]] = field(default_factory=list)
    _seeded: bool = False

    def proposal(self, value: float, target: float, status_replicas: int) -> int:
        """``GetExternalPerPodMetricReplicas`` for an AverageValue target."""
        ratio = math.inf if status_replicas == 0 else value / (target * status_replicas)
        if abs(1.0 - ratio) > self.tolerance:
            return math.ceil(value / target)
        return status_replicas

    def sync(
        self, now: float, spec_replicas: int, status_replicas: int, value: float, target: float
    ) -> int | None:
        """One ``reconcileAutoscaler``: the replicas to set, or None to leave them."""
        if not self._seeded:  # recordInitialRecommendation
            self.recommendations.append((now, spec_replicas))
            self._seeded = True
        if spec_replicas == 0 and self.min_replicas != 0:
            return None  # ScalingDisabled
        if spec_replicas > self.max_replicas:
            desired = self.max_replicas
        elif spec_replicas < self.min_replicas:
            desired = self.min_replicas
        else:
            proposal = self.proposal(value, target, status_replicas)
            desired = self._normalize(now, spec_replicas, proposal)
        return desired if desired != spec_replicas else None

    def _normalize(self, now: float, current: int, proposal: int) -> int:
        # stabilizeRecommendation: the window's highest proposal, this one included.
        cutoff = now - self.downscale_stabilization_s
        self.recommendations = [(t, r) for t, r in self.recommendations if t >= cutoff]
        stabilized = max([proposal, *(r for _, r in self.recommendations)])
        self.recommendations.append((now, proposal))
        # convertDesiredReplicasWithRules.
        limit = int(max(self.scale_up_factor * current, self.scale_up_minimum))
        maximum = min(self.max_replicas, limit)
        if stabilized < self.min_replicas:
            return self.min_replicas
        return min(stabilized, maximum)


@dataclass(kw_only=True)
class Keda:
    """The autoscaler: KEDA's loop and the HPA's, on one Deployment."""

    query: Query
    target: float = 8.0
    activation: float = 0.0
    polling_interval_s: float = 30.0
    cooldown_s: float = 300.0
    hpa_sync_s: float = 15.0
    #: KEDA's and the HPA's loops start at arbitrary phases; drawn from this seed.
    seed: int = 0
    hpa: Hpa = field(default_factory=Hpa)
    last_active: float | None = None

    @property
    def name(self) -> str:
        return f"keda ({self.query})"

    def value(self, cluster: Cluster) -> float:
        pending = len(cluster.pending)
        return float(pending if self.query == "pending" else pending + cluster.claimed)

    def start(self, cluster: Cluster) -> None:
        rng = random.Random(f"keda-{self.query}-{self.seed}")
        cluster.at(rng.uniform(0, self.polling_interval_s), lambda: self._poll(cluster))
        cluster.at(rng.uniform(0, self.hpa_sync_s), lambda: self._sync(cluster))

    def on_notify(self, cluster: Cluster) -> None:
        pass  # KEDA polls; it does not listen

    def _poll(self, cluster: Cluster) -> None:
        now = cluster.now
        active = self.value(cluster) > self.activation
        replicas = cluster.spec_replicas
        if active:
            if replicas == 0:
                cluster.scale(1, by="keda")
            self.last_active = now
        elif replicas > 0 and (
            self.last_active is None or self.last_active + self.cooldown_s < now
        ):
            cluster.scale(0, by="keda")
        cluster.at(now + self.polling_interval_s, lambda: self._poll(cluster))

    def _sync(self, cluster: Cluster) -> None:
        now = cluster.now
        desired = self.hpa.sync(
            now,
            cluster.spec_replicas,
            len(cluster.live_pods()),
            self.value(cluster),
            self.target,
        )
        if desired is not None:
            cluster.scale(desired, by="hpa")
        cluster.at(now + self.hpa_sync_s, lambda: self._sync(cluster))
