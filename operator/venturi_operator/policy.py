"""How many replicas a worker pool should run: the scaling policy, as one pure function.

The operator's reconcile tick calls :func:`decide` once per pool with the pool's load (built by
:func:`venturi_operator.spec.pool_loads` from the runtime's stats), the pool's spec, the
:class:`History` it kept from the previous tick, the time, and the Deployment's current
``spec.replicas``. It gets back a :class:`Decision`: the replicas to set, a machine-friendly
reason plus a human message (for status conditions and Events), and the updated history to keep
for the next tick. There is no I/O, clock, logging or kopf here, so every rule below is tested as
a plain function (``tests/operator/test_policy.py``).

The algorithm is the HorizontalPodAutoscaler's (``autoscaling/v2``), so that users who know the HPA
can predict it, plus the rules queue workers need and KEDA lacks. In order:

1. **Bounds first.** A Deployment above ``maxReplicas`` goes to ``maxReplicas``, one below
   ``minReplicas`` goes to ``minReplicas``, without consulting the load (the HPA does the same:
   "Current number of replicas above Spec.MaxReplicas").

2. **Recommendation from the backlog** (the HPA's ``AverageValue`` external metric)::

       recommendation = ceil((pending + claimed) / targetPerReplica)

   Claimed jobs count: they are the in-flight work that a replica is busy with, and ignoring them
   is how KEDA's queue scalers drop to zero under running jobs (KEDA #356, #638, #1663). Like the
   HPA, "the control plane skips any scaling action if the ratio is sufficiently close to 1.0
   (within a configurable tolerance, 0.1 by default)"; the ratio is ``(pending + claimed) /
   (targetPerReplica * current)`` and the per-direction tolerances of ``behavior`` apply as in the
   HPA's ``isWithin``: ``1 - scaleDown.tolerance <= ratio <= 1 + scaleUp.tolerance``.

3. **Latency term.** A count alone is "magnitude-only and lagging" (KEDA #7966; also #647,
   #5754): when the pool's oldest pending job has waited longer than ``maxOldestPendingAge``, the
   recommendation becomes at least ``current + 1`` -- one more replica per tick while the target
   is missed -- but never more than one replica per outstanding job (``pending + claimed``),
   since more replicas than jobs cannot shorten any wait. While the target is missed this also
   never recommends fewer replicas than that cap, so a constant stale age settles on one value
   instead of flapping between the count and the age. The step is deliberately one replica and
   not proportional to the age: the replicas just added take time to start, the age keeps
   growing meanwhile, and a proportional rule would compound into ``maxReplicas``.

4. **Activation.** A pool is *active* when it has a claimed job, more pending jobs than
   ``activationThreshold``, or a pending job older than ``maxOldestPendingAge``. An inactive
   pool's recommendation is 0. At zero replicas an active pool gets at least one replica at once,
   whatever the stabilization windows and rate policies say (KEDA's activation phase: 0 -> 1 is
   not the HPA's business).

5. **Stabilization**, exactly as the HPA's ``stabilizeRecommendationWithBehaviors``: "When the
   metrics indicate that the target should be scaled down the algorithm looks into previously
   computed desired states, and uses the highest value from the specified interval ... This
   approximates a rolling maximum, and avoids having the scaling algorithm frequently remove Pods
   only to trigger recreating an equivalent Pod just moments later." Scale-up does the mirror
   image with a rolling minimum. The result is the current count clamped between the lowest
   recommendation of the scale-up window and the highest of the scale-down window (each window
   includes this tick's recommendation); the unstabilized recommendation is recorded.

6. **Rate policies and bounds**, exactly as the HPA's ``convertDesiredReplicasWithBehaviorRate``:
   "``periodSeconds`` indicates the length of time in the past for which the policy must hold
   true." For each policy the replica count at the start of its period is ``current - added +
   removed`` (over the scale events of the last ``periodSeconds``); a ``Pods`` policy allows
   ``start + value`` (scale-up) or ``start - value`` (scale-down), a ``Percent`` policy allows
   ``ceil(start * (1 + value/100))`` or ``floor(start * (1 - value/100))``. "When multiple
   policies are specified the policy which allows the highest amount of change is the policy
   which is selected by default ... By setting the value to ``Min`` which would select the policy
   which allows the smallest change in the replica count. Setting the value to ``Disabled``
   completely disables scaling in that direction." The result is then clamped to
   ``[minReplicas, maxReplicas]``.

7. **Scale to zero.** The last step, 1 -> 0, additionally waits until the pool has been inactive
   for ``cooldownSeconds``; N -> 1 follows the scale-down behavior like any other step (KEDA
   applies its cooldown to N -> 0 and bypasses the HPA's policy on the way to zero: #7770,
   #7204). A pool with a claimed job is never scaled to zero.

8. **No stats.** When the stats cannot be read, the pool keeps its current replicas -- it never
   scales down blind, and never to zero (KEDA #1850, #2244) -- or is raised to
   ``fallbackReplicas`` when that is set and higher, which also works from zero (KEDA #7239). The
   decision says ``fallback=True``. Bounds (step 1) still apply.

Times are floats in seconds on one clock of the caller's choice (``time.monotonic()`` suits an
in-memory history); only differences between them matter.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Protocol

__all__ = [
    "DEFAULT_BEHAVIOR",
    "DEFAULT_SCALE_DOWN",
    "DEFAULT_SCALE_UP",
    "DEFAULT_TOLERANCE",
    "Behavior",
    "Decision",
    "History",
    "PolicyType",
    "PoolLoad",
    "PoolScaling",
    "Reason",
    "Recommendation",
    "ScaleEvent",
    "ScalingPolicy",
    "ScalingRules",
    "SelectPolicy",
    "decide",
]

#: The HPA's cluster-wide default tolerance (``--horizontal-pod-autoscaler-tolerance``).
DEFAULT_TOLERANCE = 0.1
#: The HPA's bound on ``stabilizationWindowSeconds`` ("less than or equal to 3600 (one hour)").
MAX_STABILIZATION_WINDOW_SECONDS = 3600
#: The HPA's bound on a policy's ``periodSeconds`` ("1800 (half an hour)").
MAX_PERIOD_SECONDS = 1800


class PolicyType(enum.StrEnum):
    """How a scaling policy's ``value`` counts: whole Pods, or a percentage of the replicas."""

    PODS = "Pods"
    PERCENT = "Percent"


class SelectPolicy(enum.StrEnum):
    """Which of several policies wins: the largest change, the smallest, or none at all."""

    MAX = "Max"
    MIN = "Min"
    DISABLED = "Disabled"


class Reason(enum.StrEnum):
    """Why a decision came out as it did.

    CamelCase, so that each can be a Kubernetes condition ``reason`` as it is; the HPA's own
    reasons keep their HPA names (``ScaleUpLimit``, ``TooManyReplicas`` ...).
    """

    #: The JobQueue is paused: replicas are left as they are.
    PAUSED = "Paused"
    #: Stats could not be read: the current replicas are kept.
    STATS_UNAVAILABLE = "StatsUnavailable"
    #: Stats could not be read: raised to ``fallbackReplicas``.
    FALLBACK_REPLICAS = "FallbackReplicas"
    #: The Deployment had more replicas than ``maxReplicas``.
    ABOVE_MAX_REPLICAS = "AboveMaxReplicas"
    #: The Deployment had fewer replicas than ``minReplicas``.
    BELOW_MIN_REPLICAS = "BelowMinReplicas"
    #: No claimed job and no pending job above the activation threshold or age target.
    IDLE = "Idle"
    #: The backlog per replica is within the tolerance of the target.
    WITHIN_TOLERANCE = "WithinTolerance"
    #: The backlog needs exactly the current replicas.
    AT_TARGET = "AtTarget"
    #: The backlog needs more replicas.
    BACKLOG_ABOVE_TARGET = "BacklogAboveTarget"
    #: The backlog needs fewer replicas.
    BACKLOG_BELOW_TARGET = "BacklogBelowTarget"
    #: The oldest pending job waited longer than ``maxOldestPendingAge``.
    PENDING_AGE_ABOVE_TARGET = "PendingAgeAboveTarget"
    #: Woken from zero replicas.
    ACTIVATED = "Activated"
    #: A lower recommendation within the scale-up stabilization window held the count back.
    SCALE_UP_STABILIZED = "ScaleUpStabilized"
    #: A higher recommendation within the scale-down stabilization window held the count up.
    SCALE_DOWN_STABILIZED = "ScaleDownStabilized"
    #: A scale-up policy limited the change.
    SCALE_UP_LIMIT = "ScaleUpLimit"
    #: A scale-down policy limited the change.
    SCALE_DOWN_LIMIT = "ScaleDownLimit"
    #: ``scaleUp.selectPolicy`` is ``Disabled``.
    SCALE_UP_DISABLED = "ScaleUpDisabled"
    #: ``scaleDown.selectPolicy`` is ``Disabled``.
    SCALE_DOWN_DISABLED = "ScaleDownDisabled"
    #: The recommendation was above ``maxReplicas``.
    TOO_MANY_REPLICAS = "TooManyReplicas"
    #: The recommendation was below ``minReplicas``.
    TOO_FEW_REPLICAS = "TooFewReplicas"
    #: Held at one replica until the pool has been idle for ``cooldownSeconds``.
    SCALE_TO_ZERO_COOLDOWN = "ScaleToZeroCooldown"


@dataclass(frozen=True, kw_only=True)
class ScalingPolicy:
    """One HPA scaling policy: at most ``value`` Pods or percent of change per period."""

    type: PolicyType
    #: Pods, or percent of the replicas at the start of the period; must be > 0 as in the HPA.
    value: int
    #: How far back the policy looks, in seconds: (0, 1800] as in the HPA.
    period_seconds: int

    def __post_init__(self) -> None:
        if self.value < 1:
            raise ValueError(f"value: expected an integer >= 1, got {self.value}")
        if not 1 <= self.period_seconds <= MAX_PERIOD_SECONDS:
            raise ValueError(
                f"periodSeconds: expected an integer in [1, {MAX_PERIOD_SECONDS}], "
                f"got {self.period_seconds}"
            )


@dataclass(frozen=True, kw_only=True)
class ScalingRules:
    """The HPA's ``HPAScalingRules`` for one direction.

    There is no default for the whole object here because scale-up and scale-down have different
    ones: see :data:`DEFAULT_SCALE_UP` and :data:`DEFAULT_SCALE_DOWN`.
    """

    #: Seconds of past recommendations to consider, in [0, 3600].
    stabilization_window_seconds: int
    #: At least one policy, as the HPA requires.
    policies: tuple[ScalingPolicy, ...]
    select_policy: SelectPolicy = SelectPolicy.MAX
    #: No scaling while the load ratio is within this fraction of 1.0 in this direction.
    tolerance: float = DEFAULT_TOLERANCE

    def __post_init__(self) -> None:
        if not 0 <= self.stabilization_window_seconds <= MAX_STABILIZATION_WINDOW_SECONDS:
            raise ValueError(
                "stabilizationWindowSeconds: expected an integer in "
                f"[0, {MAX_STABILIZATION_WINDOW_SECONDS}], got {self.stabilization_window_seconds}"
            )
        if not self.policies:
            raise ValueError("policies: expected at least one policy, got none")
        if not 0.0 <= self.tolerance <= 1.0:
            raise ValueError(f"tolerance: expected a number in [0, 1], got {self.tolerance}")


#: The HPA's scale-up default: "4 pods or a 100% of the currently running replicas may at most
#: be added every 15 seconds", no stabilization.
DEFAULT_SCALE_UP = ScalingRules(
    stabilization_window_seconds=0,
    policies=(
        ScalingPolicy(type=PolicyType.PERCENT, value=100, period_seconds=15),
        ScalingPolicy(type=PolicyType.PODS, value=4, period_seconds=15),
    ),
    select_policy=SelectPolicy.MAX,
)
#: The HPA's scale-down default: a 300 s stabilization window, then all replicas may go at once.
DEFAULT_SCALE_DOWN = ScalingRules(
    stabilization_window_seconds=300,
    policies=(ScalingPolicy(type=PolicyType.PERCENT, value=100, period_seconds=15),),
    select_policy=SelectPolicy.MAX,
)


@dataclass(frozen=True, kw_only=True)
class Behavior:
    """The HPA's ``behavior``: separate rules for scaling up and scaling down."""

    scale_up: ScalingRules = DEFAULT_SCALE_UP
    scale_down: ScalingRules = DEFAULT_SCALE_DOWN


DEFAULT_BEHAVIOR = Behavior()


@dataclass(frozen=True, kw_only=True)
class PoolLoad:
    """The work waiting for one pool, summed over the job kinds it serves."""

    #: Jobs eligible to run now (``run_at`` has passed) and not claimed.
    pending: int
    #: Jobs claimed by a worker and not yet settled: in-flight work.
    claimed: int
    #: Seconds the oldest pending job has been eligible, or None when nothing is pending.
    oldest_pending_age: float | None = None

    def __post_init__(self) -> None:
        if self.pending < 0 or self.claimed < 0:
            raise ValueError(
                f"expected non-negative counts, got pending={self.pending} claimed={self.claimed}"
            )
        if self.oldest_pending_age is not None and not self.oldest_pending_age >= 0.0:
            raise ValueError(f"oldest_pending_age: expected >= 0, got {self.oldest_pending_age}")

    @property
    def outstanding(self) -> int:
        """Pending plus claimed: the jobs that need a replica now."""
        return self.pending + self.claimed


class PoolScaling(Protocol):
    """What :func:`decide` reads from a pool's spec (``spec.PoolSpec`` provides it).

    A protocol rather than an import so that this module depends on nothing in the project: the
    spec module builds on the policy, not the other way round.
    """

    @property
    def min_replicas(self) -> int: ...
    @property
    def max_replicas(self) -> int: ...
    @property
    def target_per_replica(self) -> int: ...
    @property
    def max_oldest_pending_age(self) -> float | None: ...
    @property
    def activation_threshold(self) -> int: ...
    @property
    def cooldown_seconds(self) -> int: ...
    @property
    def fallback_replicas(self) -> int | None: ...
    @property
    def behavior(self) -> Behavior: ...


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    """One unstabilized recommendation, kept for the stabilization windows."""

    at: float
    replicas: int


@dataclass(frozen=True, kw_only=True)
class ScaleEvent:
    """One change of replicas made by the policy, kept for the rate policies."""

    at: float
    #: Replicas added (in ``History.scale_ups``) or removed (in ``History.scale_downs``); > 0.
    change: int


@dataclass(frozen=True, kw_only=True)
class History:
    """What the policy remembers about one pool between ticks: the HPA's per-HPA memory.

    Immutable: :func:`decide` returns an updated copy in :attr:`Decision.history`, and the caller
    keeps it (in memory, per pool) for the next tick. A fresh ``History()`` is correct after an
    operator restart: the first tick seeds it the way the HPA does (the current replicas count as
    a recommendation, and the cooldown to zero counts from then), so a restart never causes a
    sudden scale-down.
    """

    #: When the policy first saw the pool; None for a fresh history.
    started_at: float | None = None
    #: The last tick at which the pool was active (see :func:`decide`), or None if never seen.
    last_active: float | None = None
    #: Unstabilized recommendations still inside a stabilization window, oldest first.
    recommendations: tuple[Recommendation, ...] = ()
    #: Scale-ups still inside some policy's period, oldest first.
    scale_ups: tuple[ScaleEvent, ...] = ()
    #: Scale-downs still inside some policy's period, oldest first.
    scale_downs: tuple[ScaleEvent, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Decision:
    """What :func:`decide` concluded for one pool at one tick."""

    #: The replicas the Deployment should have.
    replicas: int
    #: A CamelCase reason, usable as a condition reason and an Event reason.
    reason: Reason
    #: One sentence for humans, with the numbers that led to the decision.
    message: str
    #: The history to keep for the next tick. Store it once the scale has been applied (or
    #: nothing had to change); if applying failed, keeping the previous history only loses this
    #: tick's sample.
    history: History = field(repr=False)
    #: True when the stats could not be read and the fallback rule decided.
    fallback: bool = False
    #: True when a bound, a rate policy, the cooldown or activation made ``replicas`` differ from
    #: the stabilized recommendation (the HPA's ``ScalingLimited`` condition).
    limited: bool = False
    #: The unstabilized recommendation from the load; None when there was no load to read.
    recommendation: int | None = None


def decide(
    load: PoolLoad | None,
    pool: PoolScaling,
    history: History,
    now: float,
    *,
    current: int,
    paused: bool = False,
) -> Decision:
    """Decide the replicas of one pool; see the module docstring for the rules.

    ``load`` is None when the stats could not be read. ``current`` is the Deployment's
    ``spec.replicas`` as read this tick (the policy never assumes its last decision was applied).
    ``paused`` leaves the replicas alone and the history unchanged apart from its first seeding.
    """
    if current < 0:
        raise ValueError(f"current: expected >= 0, got {current}")
    if pool.max_replicas < 1 or not 0 <= pool.min_replicas <= pool.max_replicas:
        raise ValueError(
            "expected 0 <= minReplicas <= maxReplicas and maxReplicas >= 1, got "
            f"minReplicas={pool.min_replicas} maxReplicas={pool.max_replicas}"
        )
    if history.started_at is None:
        # The HPA's recordInitialRecommendation: the current count is the first recommendation.
        history = History(
            started_at=now, recommendations=(Recommendation(at=now, replicas=current),)
        )
    if paused:
        return Decision(
            replicas=current,
            reason=Reason.PAUSED,
            message=f"paused: keeping {current} replicas",
            history=history,
        )
    if load is None:
        return _fallback(pool, history, now, current)
    return _decide_from_load(load, pool, history, now, current)


def _fallback(pool: PoolScaling, history: History, now: float, current: int) -> Decision:
    """Stats unreadable: hold, or raise to ``fallbackReplicas``; never lower, except to max."""
    wanted = current
    reason = Reason.STATS_UNAVAILABLE
    message = f"stats unavailable: keeping {current} replicas"
    if pool.fallback_replicas is not None and pool.fallback_replicas > current:
        wanted = pool.fallback_replicas
        reason = Reason.FALLBACK_REPLICAS
        message = f"stats unavailable: raising {current} to fallbackReplicas {wanted}"
    replicas = min(max(wanted, pool.min_replicas), pool.max_replicas)
    if replicas != wanted:
        bound = "maxReplicas" if replicas < wanted else "minReplicas"
        message += f", bounded by {bound} {replicas}"
    return Decision(
        replicas=replicas,
        reason=reason,
        message=message,
        history=_record_scale(history, pool.behavior, now, current, replicas),
        fallback=True,
        limited=replicas != wanted,
    )


def _is_active(load: PoolLoad, pool: PoolScaling) -> bool:
    """Whether the pool has work that justifies a replica (and defers the cooldown)."""
    return (
        load.claimed > 0
        or load.pending > pool.activation_threshold
        or _age_target_missed(load, pool)
    )


def _age_target_missed(load: PoolLoad, pool: PoolScaling) -> bool:
    return (
        pool.max_oldest_pending_age is not None
        and load.pending > 0
        and load.oldest_pending_age is not None
        and load.oldest_pending_age > pool.max_oldest_pending_age
    )


def _recommend(load: PoolLoad, pool: PoolScaling, current: int) -> tuple[int, Reason, str]:
    """The unstabilized recommendation (steps 2-4 of the module docstring)."""
    if not _is_active(load, pool):
        return (
            0,
            Reason.IDLE,
            (
                f"idle: {load.pending} pending (activation threshold "
                f"{pool.activation_threshold}), none claimed"
            ),
        )
    outstanding = load.outstanding
    target = pool.target_per_replica
    needed = math.ceil(outstanding / target)
    counted = (
        f"{outstanding} outstanding jobs ({load.pending} pending, {load.claimed} claimed) at "
        f"{target} per replica"
    )
    recommendation = needed
    if current > 0:
        ratio = outstanding / (target * current)
        rules = pool.behavior
        if 1.0 - rules.scale_down.tolerance <= ratio <= 1.0 + rules.scale_up.tolerance:
            recommendation = current
    if recommendation == current and needed != current:
        reason, message = Reason.WITHIN_TOLERANCE, f"{counted}: within tolerance of {current}"
    elif recommendation > current:
        reason, message = Reason.BACKLOG_ABOVE_TARGET, f"{counted} need {recommendation} replicas"
    elif recommendation < current:
        reason, message = Reason.BACKLOG_BELOW_TARGET, f"{counted} need {recommendation} replicas"
    else:
        reason, message = Reason.AT_TARGET, f"{counted} need {recommendation} replicas"
    if _age_target_missed(load, pool):
        latency = min(current + 1, outstanding)
        if latency > recommendation:
            recommendation = latency
            reason = Reason.PENDING_AGE_ABOVE_TARGET
            message = (
                f"oldest pending job waited {load.oldest_pending_age:.0f}s > "
                f"maxOldestPendingAge {pool.max_oldest_pending_age:g}s: "
                f"{recommendation} replicas ({counted})"
            )
    return recommendation, reason, message


def _decide_from_load(
    load: PoolLoad, pool: PoolScaling, history: History, now: float, current: int
) -> Decision:
    active = _is_active(load, pool)
    if active:
        history = replace(history, last_active=now)
    raw, reason, message = _recommend(load, pool, current)
    behavior = pool.behavior

    if current > pool.max_replicas or current < pool.min_replicas:
        above = current > pool.max_replicas
        replicas = pool.max_replicas if above else pool.min_replicas
        history = _record_recommendation(history, behavior, now, raw)
        return Decision(
            replicas=replicas,
            reason=Reason.ABOVE_MAX_REPLICAS if above else Reason.BELOW_MIN_REPLICAS,
            message=(
                f"{current} replicas is {'above maxReplicas' if above else 'below minReplicas'} "
                f"{replicas}; {message}"
            ),
            history=_record_scale(history, behavior, now, current, replicas),
            limited=True,
            recommendation=raw,
        )

    stabilized = _stabilize(raw, current, history, behavior, now)
    history = _record_recommendation(history, behavior, now, raw)
    if stabilized != raw:
        if raw >= current:
            reason = Reason.SCALE_UP_STABILIZED
            window = behavior.scale_up.stabilization_window_seconds
            held_by = "a lower"
        else:
            reason = Reason.SCALE_DOWN_STABILIZED
            window = behavior.scale_down.stabilization_window_seconds
            held_by = "a higher"
        message = (
            f"{message}; held at {stabilized} by {held_by} recommendation of the last {window}s"
        )

    replicas, limit = _limit_rate(stabilized, current, pool, history, now)
    if limit is not None:
        reason, limit_message = limit
        message = f"{message}; {limit_message}"

    if replicas == 0 and current > 0:
        # Never seen active since the operator started: count the cooldown from that start.
        idle_since = history.last_active
        if idle_since is None:
            idle_since = history.started_at if history.started_at is not None else now
        if now - idle_since < pool.cooldown_seconds:
            replicas = 1
            reason = Reason.SCALE_TO_ZERO_COOLDOWN
            remaining = pool.cooldown_seconds - (now - idle_since)
            message = f"{message}; holding 1 replica for {remaining:.0f}s more of cooldownSeconds"
    if replicas == 0 and active:
        # An active pool (any claimed job among them) recommends >= 1, and stabilization and rate
        # policies never take a non-zero count below 1, so this only bites at zero: a scale-up
        # window or a Disabled scale-up must not keep an active pool asleep.
        replicas = 1
    if current == 0 and replicas > 0:
        reason = Reason.ACTIVATED
        message = f"activated from zero to {replicas}: {message}"

    return Decision(
        replicas=replicas,
        reason=reason,
        message=message,
        history=_record_scale(history, behavior, now, current, replicas),
        limited=replicas != stabilized,
        recommendation=raw,
    )


def _stabilize(raw: int, current: int, history: History, behavior: Behavior, now: float) -> int:
    """The HPA's ``stabilizeRecommendationWithBehaviors``: clamp ``current`` into the windows."""
    up_cutoff = now - behavior.scale_up.stabilization_window_seconds
    down_cutoff = now - behavior.scale_down.stabilization_window_seconds
    up_recommendation = raw
    down_recommendation = raw
    for rec in history.recommendations:
        if rec.at > up_cutoff:
            up_recommendation = min(up_recommendation, rec.replicas)
        if rec.at > down_cutoff:
            down_recommendation = max(down_recommendation, rec.replicas)
    return min(max(current, up_recommendation), down_recommendation)


def _limit_rate(
    desired: int, current: int, pool: PoolScaling, history: History, now: float
) -> tuple[int, tuple[Reason, str] | None]:
    """The HPA's ``convertDesiredReplicasWithBehaviorRate``: rate policies, then bounds."""
    behavior = pool.behavior
    if desired > current:
        disabled = behavior.scale_up.select_policy is SelectPolicy.DISABLED
        limit = max(_scale_up_limit(current, history, behavior.scale_up, now), current)
        if pool.max_replicas > limit:
            allowed = limit
            if disabled:
                why = (Reason.SCALE_UP_DISABLED, "scaleUp.selectPolicy is Disabled")
            else:
                why = (Reason.SCALE_UP_LIMIT, f"scale-up policies allow at most {allowed} now")
        else:
            allowed = pool.max_replicas
            why = (Reason.TOO_MANY_REPLICAS, f"limited by maxReplicas {allowed}")
        if desired > allowed:
            return allowed, why
    elif desired < current:
        disabled = behavior.scale_down.select_policy is SelectPolicy.DISABLED
        limit = min(_scale_down_limit(current, history, behavior.scale_down, now), current)
        if pool.min_replicas < limit:
            allowed = limit
            if disabled:
                why = (Reason.SCALE_DOWN_DISABLED, "scaleDown.selectPolicy is Disabled")
            else:
                why = (Reason.SCALE_DOWN_LIMIT, f"scale-down policies allow at least {allowed} now")
        else:
            allowed = pool.min_replicas
            why = (Reason.TOO_FEW_REPLICAS, f"limited by minReplicas {allowed}")
        if desired < allowed:
            return allowed, why
    return desired, None


def _changed_within(events: Iterable[ScaleEvent], period_seconds: int, now: float) -> int:
    """The HPA's ``getReplicasChangePerPeriod``: replicas changed in the last period."""
    cutoff = now - period_seconds
    return sum(event.change for event in events if event.at > cutoff)


def _period_start(current: int, history: History, period_seconds: int, now: float) -> int:
    added = _changed_within(history.scale_ups, period_seconds, now)
    removed = _changed_within(history.scale_downs, period_seconds, now)
    return current - added + removed


def _scale_up_limit(current: int, history: History, rules: ScalingRules, now: float) -> int:
    """The HPA's ``calculateScaleUpLimitWithScalingRules``."""
    if rules.select_policy is SelectPolicy.DISABLED:
        return current
    proposals = []
    for policy in rules.policies:
        start = _period_start(current, history, policy.period_seconds, now)
        if policy.type is PolicyType.PODS:
            proposals.append(start + policy.value)
        else:
            # Rounded up "because the proposed change might not increase the replica count
            # causing the target to never scale up" (the HPA's own comment).
            proposals.append(math.ceil(start * (1 + policy.value / 100)))
    return min(proposals) if rules.select_policy is SelectPolicy.MIN else max(proposals)


def _scale_down_limit(current: int, history: History, rules: ScalingRules, now: float) -> int:
    """The HPA's ``calculateScaleDownLimitWithBehaviors``."""
    if rules.select_policy is SelectPolicy.DISABLED:
        return current
    proposals = []
    for policy in rules.policies:
        start = _period_start(current, history, policy.period_seconds, now)
        if policy.type is PolicyType.PODS:
            proposals.append(start - policy.value)
        else:
            # Go's int32(float64) conversion truncates toward zero, as int() does.
            proposals.append(int(start * (1 - policy.value / 100)))
    # For scale-down the smallest change is the highest remaining count, hence the swap.
    return max(proposals) if rules.select_policy is SelectPolicy.MIN else min(proposals)


def _record_recommendation(history: History, behavior: Behavior, now: float, raw: int) -> History:
    """Append this tick's recommendation and drop those no window can see any more."""
    window = max(
        behavior.scale_up.stabilization_window_seconds,
        behavior.scale_down.stabilization_window_seconds,
    )
    cutoff = now - window
    kept = tuple(rec for rec in history.recommendations if rec.at > cutoff)
    return replace(history, recommendations=(*kept, Recommendation(at=now, replicas=raw)))


def _record_scale(
    history: History, behavior: Behavior, now: float, before: int, after: int
) -> History:
    """Remember a change of replicas for the rate policies; drop events older than any period."""
    period = max(
        policy.period_seconds
        for rules in (behavior.scale_up, behavior.scale_down)
        for policy in rules.policies
    )
    cutoff = now - period
    ups = tuple(event for event in history.scale_ups if event.at > cutoff)
    downs = tuple(event for event in history.scale_downs if event.at > cutoff)
    if after > before:
        ups = (*ups, ScaleEvent(at=now, change=after - before))
    elif after < before:
        downs = (*downs, ScaleEvent(at=now, change=before - after))
    return replace(history, scale_ups=ups, scale_downs=downs)
