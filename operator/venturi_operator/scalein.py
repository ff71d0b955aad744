"""Which pods a scale-in takes: the idle ones, marked through their pod-deletion-cost.

The ReplicaSet controller deletes, of the pods it has too many of, not-ready ones first, then
those with the lowest ``controller.kubernetes.io/pod-deletion-cost`` (KEP-2255, on by default
since Kubernetes 1.22), then by its own ranks. Before the operator lowers a Deployment's
replicas it sets each pod's cost to the jobs the pod holds (``Queue.claimed_by_pod()``): idle
pods cost 0 and go first, and ``policy.decide`` never scales in below the busy pods, so no
running job is interrupted. Pure: the caller reads the pods and the claims, and patches.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["DELETION_COST", "busy_pods", "deletion_costs", "stale_costs"]

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"


def deletion_costs(pods: Iterable[str], claimed: Mapping[str, int]) -> dict[str, int]:
    """Each pod's cost: the claimed jobs it holds (0 when idle)."""
    return {pod: claimed.get(pod, 0) for pod in pods}


def busy_pods(costs: Mapping[str, int]) -> int:
    """Pods that hold a job: the fewest replicas a scale-in may leave without interrupting one
    (pods not created yet, or starting, hold none)."""
    return sum(1 for cost in costs.values() if cost > 0)


def stale_costs(annotated: Mapping[str, str | None], costs: Mapping[str, int]) -> dict[str, int]:
    """The costs to patch: the pods whose annotation is not their cost already. An unset one is
    set too (the ReplicaSet reads it as 0), so every pod shows what the operator last saw."""
    return {pod: cost for pod, cost in costs.items() if annotated.get(pod) != str(cost)}
