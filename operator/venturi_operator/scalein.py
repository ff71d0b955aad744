"""Which pods a scale-in takes: the idle ones, marked through their pod-deletion-cost.

The ReplicaSet controller deletes, of the pods it has too many of, not-ready ones first, then
those with the lowest ``controller.kubernetes.io/pod-deletion-cost`` (KEP-2255, on by default
since Kubernetes 1.22), then by its own ranks. Before the operator lowers a Deployment's
replicas it sets each pod's cost to the jobs the pod holds (``Queue.claimed_by_pod()``): idle
pods cost 0 and go first, and ``policy.decide`` never scales in below the busy pods, so no
running job is interrupted. Pure: the caller reads the pods and the claims, and patches.

A pod seen idle can still claim a job between that read and its SIGTERM (and then drain it:
finish it within its grace period, or hand it back to run again elsewhere). So the pods a
scale-in takes are chosen first (`victims`: idle ones, those not ready first, since the
ReplicaSet removes them before any other), fenced in the database (`Queue.fence_pods`: once
that returns, their claims in flight have committed, and they claim nothing more), their
claims read again, and only those still idle (`still_idle`) are given `FENCED_COST`, below
every other pod's; a victim that claimed a job meanwhile is unfenced and kept, and another
idle pod fenced in its place (`FENCE_ROUNDS`). The scale-in takes no pod it could not fence.
`FENCE_SETTLE` seconds later the fences of the pods the ReplicaSet kept are lifted; those of
pods being deleted lapse by themselves after `FENCE_TTL` seconds.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

__all__ = [
    "DELETION_COST",
    "FENCED_COST",
    "FENCE_ROUNDS",
    "FENCE_SETTLE",
    "FENCE_TTL",
    "busy_pods",
    "deletion_costs",
    "stale_costs",
    "still_idle",
    "takes_only",
    "victims",
]

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
FENCED_COST = -1
"""The cost of a fenced pod: below every other pod's (an idle one's is 0)."""
FENCE_TTL = 60.0
"""Seconds a fence holds unless lifted: a backstop for an operator that fenced and died."""
FENCE_ROUNDS = 3
"""Times a scale-in fences idle pods in place of ones that claimed a job just before their
fence, before it settles for fewer pods."""
FENCE_SETTLE = 10.0
"""Seconds after a scale-in before its fences are lifted: the ReplicaSet deletes the pods
within about a second, and a pod being deleted stops claiming by itself (its SIGTERM). A
fenced pod the ReplicaSet kept after all (it deletes pods that are not ready first) claims
again from then on."""


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


def victims(costs: Mapping[str, int], leaving: int, *, unready: Collection[str] = ()) -> list[str]:
    """The pods a scale-in by `leaving` takes: idle ones, those not ready first (the
    ReplicaSet removes them before any other, whatever their cost), then in name order (a
    fixed order makes a tick repeatable). Never more than there are idle pods."""
    idle = sorted((pod not in unready, pod) for pod, cost in costs.items() if cost == 0)
    return [pod for _, pod in idle[: max(leaving, 0)]]


def takes_only(
    spare: Collection[str], costs: Mapping[str, int], *, unready: Collection[str] = ()
) -> int:
    """How many pods a scale-in may take so that the ReplicaSet, in its order (not-ready pods
    first, then by cost: `costs` as they will be set), takes only pods of `spare`: the count of
    them before the first other pod. A busy pod that is not ready goes before every ready
    pod, fenced or not, so while one is listed only the spare pods not ready may go."""
    order = sorted(costs, key=lambda pod: (pod not in unready, costs[pod], pod not in spare))
    taken = 0
    for pod in order:
        if pod not in spare:
            break
        taken += 1
    return taken


def still_idle(chosen: Iterable[str], claimed: Mapping[str, int]) -> tuple[list[str], list[str]]:
    """The chosen pods split by the claims read after their fence: (still idle, which the
    scale-in takes; busy, which claimed a job before the fence and are kept)."""
    idle: list[str] = []
    busy: list[str] = []
    for pod in chosen:
        (busy if claimed.get(pod, 0) > 0 else idle).append(pod)
    return idle, busy
