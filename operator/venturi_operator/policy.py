"""How many replicas a worker pool should run: the scaling policy, as one pure function.

The operator's reconcile tick calls :func:`decide` once per pool with the pool's load (built by
:func:`venturi_operator.spec.pool_loads` from the runtime's stats), the pool's spec, the
:class:`History` it kept from the previous tick, the time, the Deployment's ``spec.replicas``
and, when known, its ready replicas and how many of its pods hold a job. It gets back a
:class:`Decision`: the replicas to set, a machine-friendly reason plus a human message (for
status conditions and Events), and the updated history to keep for the next tick. There is no
I/O, clock, logging or kopf here, so every rule below is tested as a plain function
(``tests/operator/test_policy.py``) and driven by the simulator (``bench/autoscale``).

The recommendation counts what the pool can do, not only what waits (the HPA's ``AverageValue``
rule, one replica per ``targetPerReplica`` outstanding jobs, asks for more every tick while the
replicas it already asked for are still starting, and the scale-down window then holds that
peak). The HPA-compatible ``behavior`` stays, as the user's explicit limits. In order:

1. **Bounds first.** A Deployment above ``maxReplicas`` goes to ``maxReplicas``, one below
   ``minReplicas`` goes to ``minReplicas``, without consulting the load (the HPA does the same:
   "Current number of replicas above Spec.MaxReplicas").

2. **What the pool does.** Each tick differences the stats' finished totals (``completed`` +
   ``dead``) and outstanding count against the previous tick's: jobs finished, jobs arrived
   (``outstanding`` now - before + finished). Time-weighted averages over about a minute give
   the arrival rate ``lambda``, over about three minutes a slower one: their difference is the
   trend (an average lags its time constant behind a ramp). Over about ten minutes the busy
   slots and the completion rate give the service time ``S = busy / completions`` (Little's
   law, exact for any job-length distribution). A rise in arrivals well beyond Poisson noise
   (three standard deviations) in two ticks running, the second at least 80 % of the first, is
   a new rate, taken at once at the second tick's (the first straddled the change), at most
   twice the first's; one such tick alone is not (a batch is a backlog, not a rate; two
   batches in a row fall off the 80 %, a batch after a tick of noise off the twice). When it
   leaves more pending jobs than one replica runs it is a *burst*, whose time is kept; a pool
   whose bursts come less than 600 s apart takes a new rate only from two ticks within 80 %
   of each other either way (batches a tick apart are likelier there than a new rate). A
   fall as far below it two ticks running (the end of a spike, a step down) is a new, lower
   rate, taken at once in both averages: read as a trend, a step down would extrapolate the
   rate to nothing for minutes. Jobs that got longer (a dependency slowing down) would take
   the ten-minute service time minutes to show, the pool short meanwhile: far fewer jobs
   finished than it expects (three standard deviations of the Poisson count below the busy
   slot-seconds over ``S``) two ticks running is a new service time, the two ticks' own, taken
   at once (from fewer than four jobs, at most four times the one before: a stuck pool that
   finishes nothing must not read as endless jobs). Shorter jobs are left to the average: the
   pool is big enough meanwhile. A cleanup that lowers the totals skips that tick's sample.
   The time from a scale-up to its pods being ready is observed too (``startup``, 30 s until
   seen).

3. **Recommendation from capacity.** With ``k = targetPerReplica`` slots per replica and the
   age target ``H = maxOldestPendingAge`` (60 s unset):

   - the *flow* is ``lambda+ * S`` slots, ``lambda+`` the rate a pod asked for now will serve:
     ``lambda`` plus the trend over the average's lag and one start-up;
   - the *queue* is the pending jobs as they will be when a pod asked for now is ready: the
     arrivals until then, less what the ready replicas and (from when they will be ready) the
     starting ones take meanwhile;
   - that queue must start within ``3/4 H`` of now, served by the whole pool (first in, first
     out: the newest queued job waits for the jobs ahead of it, not for the flow behind it):
     ``latency = queue * S / (3/4 H - startup)`` slots, the quarter left a margin for errors
     in the estimated job time and start-up;
   - and be worked off by the slots beyond the flow within ``2 H``:
     ``drain = queue * S / (2 H - startup)`` slots (without it a queue that the flow's slots
     only keep level makes every later job wait as long).

   Slots for a queue never exceed one per queued job. The pool then needs, with ``s`` spare
   standard deviations of the work's Poisson noise (square-root staffing)::

       need(s) = ceil(max(flow + drain + s * sqrt(flow + drain), latency) / k)
       scale up   when current < need(0.75),   to need(1.25)
       scale down when current > need(2.5)+,   to need(1.25), never below ceil(claimed / k)

   where ``need(2.5)+`` counts the flow at the arrival rate's upper bound, one standard
   deviation of the Poisson count it was estimated from above it (a scale-in must not follow a
   low reading of the rate, which at a few jobs a second is a large share of it). Between the
   two the count holds: that band is the hysteresis, whole replicas wide at small counts, so
   noise does not flap; at large counts the spare is a small share, so a big pool
   runs its slots close to full. Until enough jobs have been seen finish (a new pool; more than
   twice the claimed jobs, or 50) the recommendation is the HPA's count, ``ceil((pending +
   claimed) / k)`` -- every job a slot at once, the most that can help without knowing how
   long jobs run. ``behavior.*.tolerance`` set by the user applies as the HPA's tolerance
   does, on the work per slot: no change while ``1 - scaleDown.tolerance <= work / (k *
   current) <= 1 + scaleUp.tolerance``.

4. **Latency term.** When the oldest pending job has waited longer than
   ``maxOldestPendingAge``, the pool never scales down, and gets one more replica per tick --
   never more than one per outstanding job -- unless replicas are still starting (they are the
   answer already; adding more while they start is how counts rules overshoot). A stale age
   with every replica ready means the estimates are wrong or the jobs need more than one slot
   each, and the count climbs until the target is met.

5. **Activation.** A pool is *active* when it has a claimed job, more pending jobs than
   ``activationThreshold``, or a pending job older than ``maxOldestPendingAge``. An inactive
   pool's recommendation is 0 -- once it has been inactive for ``cooldownSeconds``; before
   that (a lull: every job done, the next not yet arrived) a running pool is sized for its
   arrival rate as above, so that a moment without work does not take replicas the next
   minute needs. At zero replicas an active pool gets what it needs at once, at
   least one replica, whatever the stabilization windows and rate policies say.

6. **Stabilization**, exactly as the HPA's ``stabilizeRecommendationWithBehaviors``: the current
   count clamped between the lowest recommendation of the scale-up window and the highest of
   the scale-down window (each includes this tick's recommendation). Windows the user does not
   set: none, either way (the HPA's 300 s exists because a CPU ratio is noisy; the band of
   step 3 already absorbs noise, and a window on top makes a pool whose load falls steadily
   lag it by the window's worth of the fall), except a 120 s scale-down window for a pool
   whose bursts come less than 600 s apart (below), whose replicas bridge a burst's tail.
   Without ``behavior.scaleDown``, no scale-down either within 300 s of a scale-up: a scale in the
   opposite direction that soon undoes it (a flap). A pool whose bursts come less than 600 s
   apart (the median gap between its last six bursts) holds 600 s instead: its replicas bridge
   the gap to the next burst, which finds them warm, where a scale-in between the two would be
   undone within five minutes by the next burst (a flap too).

7. **Rate policies and bounds**, exactly as the HPA's ``convertDesiredReplicasWithBehaviorRate``
   for each direction whose ``behavior`` the user set (``Pods``/``Percent`` policies over
   ``periodSeconds``, ``selectPolicy`` ``Max``/``Min``/``Disabled``). A direction without rules
   has no rate limit: a pool scales up in one step to what it needs; then ``[minReplicas,
   maxReplicas]``.

8. **Busy pods are spared.** When the caller says how many of the Deployment's pods hold a
   claimed job (``busy``), a scale-in never goes below that: the operator gives the idle pods
   the lowest ``controller.kubernetes.io/pod-deletion-cost``, so the ReplicaSet takes them (and
   starting pods, which it takes first anyway) and no running job is interrupted. The rest goes
   once more pods are idle: after such a decision (``BusyPodsSpared``) the operator ticks again
   within seconds, not an interval later (``cadence.next_wait``), since with jobs spread over
   the pods an idle one appears seldom and not for long.

9. **Scale to zero.** The last replica goes once the pool has been inactive for
   ``cooldownSeconds`` -- exactly that, not also the scale-down window (1 -> 0 only); N -> 1
   follows the scale-down rules like any other step (KEDA applies its cooldown to N -> 0 and
   bypasses the HPA's policy on the way to zero: #7770, #7204). A pool with a claimed job is
   never scaled to zero.

10. **No stats.** When the stats cannot be read, the pool keeps its current replicas -- it never
    scales down blind, and never to zero (KEDA #1850, #2244) -- or is raised to
    ``fallbackReplicas`` when that is set and higher, which also works from zero (KEDA #7239).
    The decision says ``fallback=True``. Bounds (step 1) still apply.

``PoolLoad.paused`` (pending jobs of paused queues, from the stats) and ``PoolLoad.unserved``
(pending jobs of kinds the pool's workers do not serve, from the worker registry:
``venturi_operator.serving``) are counted in ``pending`` and never taken as demand; unserved
ones are no arrivals either (the pool is not sized for a flow it cannot take).

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
    "HPA_BEHAVIOR",
    "Behavior",
    "Decision",
    "History",
    "PolicyType",
    "PoolLoad",
    "PoolScaling",
    "Reason",
    "Recommendation",
    "Sample",
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

#: Spare slots, in standard deviations of the work's Poisson noise (square-root staffing): the
#: pool scales up when it has fewer than SPARE_UP, down when it has more than SPARE_DOWN, and
#: then to SPARE_TARGET.
SPARE_UP = 0.75
SPARE_TARGET = 1.25
SPARE_DOWN = 2.5
#: A scale-down also needs the pool too big for the arrival rate plus this many standard
#: deviations of its estimate (the Poisson count of the arrivals it was averaged from).
ESTIMATE_SIGMAS = 1.0
#: The age target when ``maxOldestPendingAge`` is not set.
DEFAULT_CLEAR_SECONDS = 60.0
#: The share of the age target within which the newest queued job is planned to start (the
#: rest is margin for errors in the estimated job time and start-up) ...
QUEUE_WAIT_SHARE = 0.75
#: ... and the age targets within which the slots beyond the flow work the queue off.
QUEUE_DRAIN_TARGETS = 2.0
#: Pod start-up assumed until a scale-up has been seen to become ready.
DEFAULT_STARTUP_SECONDS = 30.0
#: Time constants (seconds) of the arrival-rate, service-time and start-up averages, and of the
#: slower arrival average the trend is read against.
RATE_SECONDS = 60.0
TREND_SECONDS = 180.0
SERVICE_SECONDS = 600.0
STARTUP_WEIGHT = 0.3
#: Jobs that must have finished (fading count) before a service time is believed, and how many
#: times the claimed jobs that count must be ...
MIN_FINISHED = 4.0
SERVICE_EVIDENCE = 2.0
#: ... unless this many have been seen finish already.
ENOUGH_FINISHED = 50
#: A service time read from two ticks in which far fewer jobs finished than it expected is
#: taken at once; from fewer than ``MIN_FINISHED`` jobs, at most this many times the one it
#: replaces (a pool that finishes none at all, stuck, must not read as endless jobs).
SERVICE_GROWTH = 4.0
#: The shortest service time the policy takes (seconds): the held time is sampled at ticks, so
#: jobs that start and finish between two ticks add none, and a pool of such jobs reads 0 (a
#: slot of it would serve jobs without end).
MIN_SERVICE_SECONDS = 0.01
#: Seconds of arrivals observed before a rate is read from them: a span of next to nothing
#: (two ticks at one instant) would read a rate of infinity.
MIN_RATE_SPAN = 1e-3
#: A sample this many Poisson standard deviations above the arrival rate is a rise; a rise two
#: ticks running, the second at least RISE_AGREE of the first, is a new rate, at most
#: RISE_GROWTH times the first tick's. As many below it is a fall; two running, a new rate.
RISE_SIGMAS = 3.0
RISE_AGREE = 0.8
RISE_GROWTH = 2.0
#: This many Poisson standard deviations fewer jobs finished than the service time expects,
#: two ticks running, is a longer service time (see ``SERVICE_GROWTH``).
LAG_SIGMAS = 3.0
#: Without ``behavior.scaleDown``: the stabilization window (the highest recommendation of
#: these last seconds holds): none, or this for a pool whose bursts are bridged (below) ...
DEFAULT_SCALE_DOWN_WINDOW_SECONDS = 0
BRIDGE_SCALE_DOWN_WINDOW_SECONDS = 120
#: ... and how long a scale-up holds before any scale-down: a scale in the opposite direction
#: within five minutes is a flap.
HOLD_SECONDS = 300.0
#: ... or this long, for a pool whose bursts come closer together than this (the median gap
#: between the last BURST_MEMORY): the replicas bridge the gap to the next burst.
BRIDGE_SECONDS = 600.0
BURST_MEMORY = 6


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
    #: A scale-in held back to the number of pods that hold no job.
    BUSY_PODS_SPARED = "BusyPodsSpared"
    #: A scale-in held back: which pods hold jobs could not be read (the pods, or their claims).
    BUSY_PODS_UNKNOWN = "BusyPodsUnknown"


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
    """The HPA's ``behavior``: the user's limits for scaling up and scaling down.

    A direction set to None has no rules of the user's: no rate limit, and venturi's own
    stabilization (none up, :data:`DEFAULT_SCALE_DOWN_WINDOW_SECONDS` down) and hysteresis.
    """

    scale_up: ScalingRules | None = None
    scale_down: ScalingRules | None = None


#: No limits of the user's (what a pool without ``behavior`` gets).
DEFAULT_BEHAVIOR = Behavior()
#: The HPA's own defaults, spelled out (what ``behavior: {scaleUp: {}, scaleDown: {}}`` gets).
HPA_BEHAVIOR = Behavior(scale_up=DEFAULT_SCALE_UP, scale_down=DEFAULT_SCALE_DOWN)


@dataclass(frozen=True, kw_only=True)
class PoolLoad:
    """The work waiting for one pool, summed over the job kinds it serves."""

    #: Jobs eligible to run now (``run_at`` has passed) and not claimed.
    pending: int
    #: Jobs claimed by a worker and not yet settled: in-flight work.
    claimed: int
    #: Seconds the oldest pending job has been eligible, or None when nothing is pending.
    oldest_pending_age: float | None = None
    #: Jobs finished so far (completed + dead, as the stats count them), or None when unknown;
    #: the difference between two ticks is the completions in between.
    finished: int | None = None
    #: Of ``pending``, jobs in paused queues: no demand. (Read from the stats' per-queue
    #: ``paused``, which the runtime reports as False until queues can be paused: 0 today.)
    paused: int = 0
    #: Of ``pending``, jobs of kinds the pool's live workers do not serve (the worker
    #: registry, ``venturi_operator.serving``): no demand, a condition.
    unserved: int = 0
    #: The ``unserved`` were judged by the workers of a previous pod template (a release):
    #: they ask for one replica, whose worker tells whether the new pods serve them.
    probe: bool = False

    def __post_init__(self) -> None:
        if self.pending < 0 or self.claimed < 0:
            raise ValueError(
                f"expected non-negative counts, got pending={self.pending} claimed={self.claimed}"
            )
        if self.oldest_pending_age is not None and not self.oldest_pending_age >= 0.0:
            raise ValueError(f"oldest_pending_age: expected >= 0, got {self.oldest_pending_age}")
        if self.finished is not None and self.finished < 0:
            raise ValueError(f"finished: expected >= 0, got {self.finished}")
        if (
            not 0 <= self.paused + self.unserved <= self.pending
            or min(self.paused, self.unserved) < 0
        ):
            raise ValueError(
                f"expected 0 <= paused + unserved <= pending, got paused={self.paused} "
                f"unserved={self.unserved} pending={self.pending}"
            )

    @property
    def outstanding(self) -> int:
        """Pending plus claimed: the jobs that need a replica now."""
        return self.pending + self.claimed

    @property
    def demand(self) -> int:
        """Pending jobs a replica could take: not paused, of a kind some worker serves."""
        return self.pending - self.paused - self.unserved


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
class Sample:
    """The counts one tick saw, for the next tick to difference against."""

    at: float
    finished: int
    outstanding: int
    claimed: int
    #: The arrival rate this tick saw when it was a significant rise over the average (a rise
    #: two ticks running is taken at once), else None.
    rise: float | None = None
    #: The same for a significant fall below the average (a fall two ticks running is a new,
    #: lower rate, taken at once), else None.
    fall: float | None = None
    #: The slot-seconds held and the jobs finished this tick when far fewer finished than the
    #: service time expects (the jobs got longer: two such ticks running are a new service
    #: time, taken at once), else None.
    lag: tuple[float, int] | None = None


@dataclass(frozen=True, kw_only=True)
class History:
    """What the policy remembers about one pool between ticks: the HPA's per-HPA memory, and
    what the pool has been seen to do.

    Immutable: :func:`decide` returns an updated copy in :attr:`Decision.history`, and the caller
    keeps it (in memory, per pool) for the next tick. A fresh ``History()`` is correct after an
    operator restart: the first tick seeds it the way the HPA does (the current replicas count as
    a recommendation, and the cooldown to zero counts from then), so a restart never causes a
    sudden scale-down; until rates have been seen again the recommendation is the HPA's count.
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
    #: The previous tick's counts; None until a tick saw finished totals.
    sample: Sample | None = None
    #: Jobs arrived and seconds observed, both fading with a memory of ``RATE_SECONDS``: their
    #: ratio is the arrival rate.
    arrived: float = 0.0
    arrival_span: float = 0.0
    #: The same with a memory of ``TREND_SECONDS``: the slow average the trend is read against.
    arrived_slow: float = 0.0
    arrival_span_slow: float = 0.0
    #: When the last bursts began (a rise in arrivals, not sustained, that left more jobs
    #: pending than one replica runs), oldest first, at most ``BURST_MEMORY``.
    bursts: tuple[float, ...] = ()
    #: Slot-seconds held by claimed jobs and jobs finished, both fading with a memory of
    #: ``SERVICE_SECONDS``: their ratio is the service time (Little's law).
    held: float = 0.0
    finished: float = 0.0
    #: Jobs seen finish since the operator started (not fading): the evidence for the above.
    finished_seen: int = 0
    #: Seconds from a scale-up to its pods being ready, averaged; None until seen.
    startup_seconds: float | None = None
    #: A scale-up not yet ready: (when, replicas asked for).
    starting: tuple[float, int] | None = None
    #: When the policy last scaled up (None: not since the operator started).
    scaled_up_at: float | None = None

    @property
    def arrival_rate(self) -> float | None:
        """Jobs per second becoming eligible; None before two ticks saw the counts."""
        return self.arrived / self.arrival_span if self.arrival_span >= MIN_RATE_SPAN else None

    @property
    def arrival_trend(self) -> float:
        """How fast the arrival rate changes, in jobs/s per second (0 until seen): each average
        lags its time constant behind a ramp, so their difference is the ramp's slope times the
        difference of the time constants."""
        if self.arrival_span < MIN_RATE_SPAN or self.arrival_span_slow < MIN_RATE_SPAN:
            return 0.0
        fast = self.arrived / self.arrival_span
        slow = self.arrived_slow / self.arrival_span_slow
        return (fast - slow) / (TREND_SECONDS - RATE_SECONDS)

    @property
    def burst_gap(self) -> float | None:
        """The median gap between the remembered bursts; None before two were seen."""
        gaps = sorted(b - a for a, b in zip(self.bursts, self.bursts[1:], strict=False))
        if not gaps:
            return None
        middle = len(gaps) // 2
        return gaps[middle] if len(gaps) % 2 else (gaps[middle - 1] + gaps[middle]) / 2

    @property
    def service_seconds(self) -> float | None:
        """Seconds a job holds a slot; None until a few jobs finished."""
        if self.finished < MIN_FINISHED:
            return None
        return max(self.held / self.finished, MIN_SERVICE_SECONDS)


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
    #: True when a bound, a rate policy, the cooldown, busy pods or activation made ``replicas``
    #: differ from the stabilized recommendation (the HPA's ``ScalingLimited`` condition).
    limited: bool = False
    #: The unstabilized recommendation from the load; None when there was no load to read.
    recommendation: int | None = None


def _replicas(n: int) -> str:
    """`n` replicas, in a message: "1 replica", "3 replicas"."""
    return f"{n} replica" if n == 1 else f"{n} replicas"


def decide(
    load: PoolLoad | None,
    pool: PoolScaling,
    history: History,
    now: float,
    *,
    current: int,
    paused: bool = False,
    ready: int | None = None,
    busy: int | None = None,
    unfenced: int = 0,
) -> Decision:
    """Decide the replicas of one pool; see the module docstring for the rules.

    ``load`` is None when the stats could not be read. ``current`` is the Deployment's
    ``spec.replicas`` as read this tick (the policy never assumes its last decision was applied);
    ``ready`` its ready replicas (None: unknown, taken as all); ``busy`` how many of its pods
    hold a claimed job (None: unknown, no pod is spared), and ``unfenced`` how many idle pods
    a scale-in could not fence (kept as busy ones are: see ``scalein``). ``paused`` leaves the
    replicas alone and the history unchanged apart from its first seeding.
    """
    if current < 0:
        raise ValueError(f"current: expected >= 0, got {current}")
    if ready is not None and ready < 0:
        raise ValueError(f"ready: expected >= 0, got {ready}")
    if busy is not None and busy < 0:
        raise ValueError(f"busy: expected >= 0, got {busy}")
    if unfenced < 0 or (unfenced and busy is None):
        raise ValueError(f"unfenced: expected >= 0, with busy known, got {unfenced}")
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
            message=f"paused: keeping {_replicas(current)}",
            history=history,
        )
    if load is None:
        return _fallback(pool, history, now, current)
    history = _watch_startup(history, now, current, ready)
    history = _observe(history, load, now, pool.target_per_replica)
    return _decide_from_load(load, pool, history, now, current, ready, busy, unfenced)


def _fallback(pool: PoolScaling, history: History, now: float, current: int) -> Decision:
    """Stats unreadable: hold, or raise to ``fallbackReplicas``; never lower, except to max."""
    wanted = current
    reason = Reason.STATS_UNAVAILABLE
    message = f"stats unavailable: keeping {_replicas(current)}"
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


# --- what the pool does ---------------------------------------------------------------------


def _average(previous: float | None, sample: float, weight: float) -> float:
    return sample if previous is None else previous + weight * (sample - previous)


def _observe(history: History, load: PoolLoad, now: float, per_replica: int) -> History:
    """Difference this tick's counts against the last tick's: arrivals, completions, busy."""
    if load.finished is None:
        return history
    # Jobs no worker of the pool serves arrive for no one: they are no part of its flow (and
    # when a worker that serves them comes, they appear at once, as a backlog: a burst).
    sample = Sample(
        at=now,
        finished=load.finished,
        outstanding=load.outstanding - load.unserved,
        claimed=load.claimed,
    )
    last = history.sample
    if last is None or now <= last.at:
        return replace(history, sample=sample)
    span = now - last.at
    finished = load.finished - last.finished
    if finished < 0:
        return replace(history, sample=sample)  # a cleanup deleted finished jobs: no sample
    arrived = max(0, sample.outstanding - last.outstanding + finished)
    fade = math.exp(-span / RATE_SECONDS)
    rate = history.arrival_rate
    expected = (rate or 0.0) * span
    rise = (
        arrived / span if arrived > expected + RISE_SIGMAS * math.sqrt(max(expected, 1.0)) else None
    )
    floor = expected - RISE_SIGMAS * math.sqrt(max(expected, 1.0))
    fall = arrived / span if rate is not None and arrived < floor else None
    # Risen two ticks running, the second no lower than most of the first: a new rate (the
    # first of the two straddled the change; two batches one after the other fall off). A
    # pool whose bursts come close together takes it only from two ticks that agree either
    # way: there, batches a tick apart are likelier than a new rate.
    new_rate: float | None = None
    if rise is not None and last.rise is not None:
        gap = history.burst_gap
        bursty = gap is not None and gap < BRIDGE_SECONDS
        if rise >= RISE_AGREE * last.rise and (not bursty or RISE_AGREE * rise <= last.rise):
            # This tick's, at most twice the first's: a batch after a tick of noise is no rate.
            new_rate = min(rise, RISE_GROWTH * last.rise)
    counted = arrived
    if rate is not None and rise is not None:
        # A rise seen once may be a batch: a backlog (which the recommendation counts), not a
        # rate. Only what the rate expected counts, unless the next tick sees a rise too.
        counted = round(expected) if new_rate is None else min(arrived, round(new_rate * span))
    total, seconds = history.arrived * fade + counted, history.arrival_span * fade + span
    fade = math.exp(-span / TREND_SECONDS)
    slow = history.arrived_slow * fade + counted
    slow_seconds = history.arrival_span_slow * fade + span
    if rate is not None and new_rate is not None:
        # A new rate, at once; both averages take it: a step is no trend.
        total = max(total, new_rate * seconds)
        slow = max(slow, new_rate * slow_seconds)
    if fall is not None and last.fall is not None:
        # Fallen two ticks running (the end of a spike, a step down): the second tick's rate,
        # at once, in both averages -- read as a trend, a step down would extrapolate the
        # rate to nothing for minutes and size the pool for no arrivals at all.
        total = min(total, fall * seconds)
        slow = min(slow, fall * slow_seconds)
    bursts = history.bursts
    if rise is not None and last.rise is None and load.demand > per_replica:
        bursts = (*bursts, now)[-BURST_MEMORY:]
    fade = math.exp(-span / SERVICE_SECONDS)
    busy = (load.claimed + last.claimed) / 2 * span
    held = history.held * fade + busy
    done = history.finished * fade + finished
    # Jobs that got longer: the ten-minute average is mostly the short jobs before, and reads
    # short for minutes while the queue grows. Far fewer finished than it expects (Poisson
    # counts, as for arrivals) two ticks running is a new service time, that of the two ticks.
    lag: tuple[float, int] | None = None
    service = history.service_seconds
    if service is not None:
        expected = busy / service
        if finished < expected - LAG_SIGMAS * math.sqrt(max(expected, 1.0)):
            lag = (busy, finished)
            if last.lag is not None:
                count = finished + last.lag[1]
                seen = (busy + last.lag[0]) / max(count, 1)
                if count < MIN_FINISHED:
                    seen = min(seen, SERVICE_GROWTH * service)  # too few to read it from
                held = max(held, done * seen)
    return replace(
        history,
        sample=replace(sample, rise=rise, fall=fall, lag=lag),
        arrived=total,
        arrival_span=seconds,
        arrived_slow=slow,
        arrival_span_slow=slow_seconds,
        bursts=bursts,
        held=held,
        finished=done,
        finished_seen=history.finished_seen + finished,
    )


def _watch_startup(history: History, now: float, current: int, ready: int | None) -> History:
    """Once the replicas of the last scale-up are all ready, remember how long that took."""
    if history.starting is None or ready is None:
        return history
    since, asked = history.starting
    if current < asked:
        return replace(history, starting=None)  # scaled down since: nothing to time
    if ready < asked:
        return history
    # Ready at some point since the previous tick: take the middle of that interval.
    previous = history.sample.at if history.sample is not None else since
    seen = (max(previous, since) + now) / 2 - since
    startup = _average(history.startup_seconds, max(seen, 0.0), STARTUP_WEIGHT)
    return replace(history, starting=None, startup_seconds=startup)


# --- the recommendation ---------------------------------------------------------------------


def _is_active(load: PoolLoad, pool: PoolScaling) -> bool:
    """Whether the pool has work that justifies a replica (and defers the cooldown)."""
    return (
        load.claimed > 0
        or load.demand > pool.activation_threshold
        or _age_target_missed(load, pool)
        or _probing(load)
    )


def _probing(load: PoolLoad) -> bool:
    """Whether jobs a previous pod template's workers did not serve wait for the new one's."""
    return load.probe and load.unserved > 0


def _age_target_missed(load: PoolLoad, pool: PoolScaling) -> bool:
    return (
        pool.max_oldest_pending_age is not None
        and load.demand > 0
        and load.oldest_pending_age is not None
        and load.oldest_pending_age > pool.max_oldest_pending_age
    )


def _tolerances(behavior: Behavior, default: float) -> tuple[float, float]:
    up = behavior.scale_up.tolerance if behavior.scale_up is not None else default
    down = behavior.scale_down.tolerance if behavior.scale_down is not None else default
    return up, down


def _recommend(
    load: PoolLoad,
    pool: PoolScaling,
    history: History,
    now: float,
    current: int,
    ready: int | None,
) -> tuple[int, Reason, str]:
    """The unstabilized recommendation (steps 2-5 of the module docstring)."""
    lull = (
        current > 0
        and history.last_active is not None
        and now - history.last_active < pool.cooldown_seconds
        and history.arrival_rate is not None
    )
    if not _is_active(load, pool) and not lull:
        return (
            0,
            Reason.IDLE,
            (
                f"idle: {load.demand} pending (activation threshold "
                f"{pool.activation_threshold}), none claimed"
            ),
        )
    if _probing(load) and load.demand == 0 and load.claimed == 0:
        return (
            1,
            Reason.AT_TARGET if current == 1 else Reason.BACKLOG_BELOW_TARGET,
            (
                f"{load.unserved} pending of kinds the workers of the pool's previous pod "
                f"template did not register: 1 replica to learn whether the new one's do"
            ),
        )
    k = pool.target_per_replica
    service = history.service_seconds
    if history.finished_seen < min(SERVICE_EVIDENCE * load.claimed, ENOUGH_FINISHED):
        # Jobs still running weigh in the held time before they finish: until more have been
        # seen finish than run now (a new pool), the service time reads long.
        service = None
    if service is None:
        # Nothing seen finish yet: the HPA's count, one slot for every outstanding job.
        outstanding = load.demand + load.claimed
        work = float(outstanding)
        up = target = down = math.ceil(outstanding / k)
        counted = (
            f"{outstanding} outstanding jobs ({load.demand} pending, {load.claimed} claimed) "
            f"at {k} per replica"
        )
        tolerance_up, tolerance_down = _tolerances(pool.behavior, DEFAULT_TOLERANCE)
    else:
        horizon = pool.max_oldest_pending_age or DEFAULT_CLEAR_SECONDS
        startup = history.startup_seconds or DEFAULT_STARTUP_SECONDS
        # The rate a pod asked for now will serve: the average lags RATE_SECONDS behind a
        # trend, and the pod is ready a start-up from now.
        rate = max(
            0.0, (history.arrival_rate or 0.0) + history.arrival_trend * (RATE_SECONDS + startup)
        )
        # Claimed jobs above the flow are backlog being worked off: they free their slots
        # within a job's time, so they only keep the pool from shrinking below them.
        flow = rate * service
        queue = _queue_when_ready(load, history, now, current, ready, rate, service, k, startup)
        wait = QUEUE_WAIT_SHARE * horizon
        # First in, first out: the newest queued job waits for the queue ahead of it, served
        # by the whole pool; the slots beyond the flow work the queue off. Never more slots
        # than queued jobs: more shortens no wait.
        latency = queue * min(1.0, service / max(wait - startup, 1.0))
        drain = queue * min(1.0, service / max(QUEUE_DRAIN_TARGETS * horizon - startup, 1.0))
        slots = flow + drain
        work = max(slots, latency)

        def need(spare: float, extra: float = 0.0) -> int:
            # Square-root staffing: slots for the work plus `spare` of its Poisson noise.
            more = slots + extra
            return math.ceil(max(more + spare * math.sqrt(more), latency) / k - 1e-9)

        # The rate is an estimate from a minute or so of arrivals: a scale-in also needs the
        # pool to be too big for the rate's upper bound (Poisson counts), not only for the rate.
        span = history.arrival_span
        error = math.sqrt(history.arrived) / span if span >= MIN_RATE_SPAN else 0.0
        up, target = need(SPARE_UP), need(SPARE_TARGET)
        down = need(SPARE_DOWN, ESTIMATE_SIGMAS * error * service)
        target = max(target, math.ceil(load.claimed / k))
        down = max(down, target)
        counted = (
            f"{rate:.2f} jobs/s arriving, {service:.1f} s each, {load.claimed} claimed, "
            f"{load.demand} pending ({queue:.0f} once new replicas are up, to start within "
            f"{wait:g} s): {work:.0f} busy slots of {k} per replica"
        )
        tolerance_up, tolerance_down = _tolerances(pool.behavior, 0.0)
    if load.paused:
        # Counted in the JobQueue's pending column, not as demand: say why they scale nothing.
        counted += f"; {load.paused} more pending in paused queues (no demand)"
    # The HPA's tolerance, on the work per slot: no change while it is close enough to 1.
    ratio = work / (k * current) if current else math.inf
    tolerated = 1.0 - tolerance_down <= ratio <= 1.0 + tolerance_up
    if current == 0:
        recommendation = max(target, 1)
    elif (up > current and not tolerated) or (down < current and not tolerated):
        recommendation = target
    else:
        recommendation = current
    if recommendation > current:
        reason, message = Reason.BACKLOG_ABOVE_TARGET, f"{counted} need {_replicas(recommendation)}"
    elif recommendation < current:
        reason, message = Reason.BACKLOG_BELOW_TARGET, f"{counted} need {_replicas(recommendation)}"
    elif not (tolerated and (up > current or down < current)):
        verb = "is" if current == 1 else "are"
        reason, message = Reason.AT_TARGET, f"{counted}: {_replicas(current)} {verb} enough"
    else:
        reason, message = Reason.WITHIN_TOLERANCE, f"{counted}: within tolerance of {current}"
    if _age_target_missed(load, pool):
        # One more replica while none is starting, never fewer (down to one per job: more
        # replicas than jobs shorten no wait).
        starting = ready is not None and ready < current
        latency = min(current + (0 if starting else 1), load.demand + load.claimed)
        if latency > recommendation:
            recommendation = latency
            reason = Reason.PENDING_AGE_ABOVE_TARGET
            message = (
                f"oldest pending job waited {load.oldest_pending_age:.0f}s > "
                f"maxOldestPendingAge {pool.max_oldest_pending_age:g}s: {_replicas(recommendation)}"
                f"{' (replicas still starting)' if starting else ''} ({counted})"
            )
    return recommendation, reason, message


def _queue_when_ready(
    load: PoolLoad,
    history: History,
    now: float,
    current: int,
    ready: int | None,
    rate: float,
    service: float,
    k: int,
    startup: float,
) -> float:
    """The pending jobs as they will be when a replica asked for now is ready: the arrivals
    until then, less what the ready replicas take meanwhile and the starting ones from when
    they will be ready (all slots busy while there is a queue: first in, first out)."""
    serving = current if ready is None else min(ready, current)
    # The starting replicas are taken as asked for at the last scale-up; late ones as needing
    # another whole start-up (a pod that does not come up must not count as capacity).
    until = 0.0
    if serving < current:
        until = startup
        if history.starting is not None:
            left = history.starting[0] + startup - now
            until = left if 0.0 < left < startup else startup
    queue = max(0.0, load.demand + (rate - k * serving / service) * until)
    return max(0.0, queue + (rate - k * current / service) * (startup - until))


def _decide_from_load(
    load: PoolLoad,
    pool: PoolScaling,
    history: History,
    now: float,
    current: int,
    ready: int | None,
    busy: int | None,
    unfenced: int = 0,
) -> Decision:
    active = _is_active(load, pool)
    if active:
        history = replace(history, last_active=now)
    raw, reason, message = _recommend(load, pool, history, now, current, ready)
    behavior = pool.behavior

    if current > pool.max_replicas or current < pool.min_replicas:
        above = current > pool.max_replicas
        replicas = pool.max_replicas if above else pool.min_replicas
        history = _record_recommendation(history, behavior, now, raw)
        return Decision(
            replicas=replicas,
            reason=Reason.ABOVE_MAX_REPLICAS if above else Reason.BELOW_MIN_REPLICAS,
            message=(
                f"{_replicas(current)} is {'above maxReplicas' if above else 'below minReplicas'} "
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
            window = _up_window(behavior)
            held_by = "a lower"
        else:
            reason = Reason.SCALE_DOWN_STABILIZED
            window = _down_window(behavior, history)
            held_by = "a higher"
        message = (
            f"{message}; held at {stabilized} by {held_by} recommendation of the last {window}s"
        )

    replicas, limit = _limit_rate(stabilized, current, pool, history, now)
    if limit is not None:
        reason, limit_message = limit
        message = f"{message}; {limit_message}"

    # Never seen active since the operator started: count the cooldown from that start.
    idle_since = history.last_active
    if idle_since is None:
        idle_since = history.started_at if history.started_at is not None else now
    cooled = now - idle_since >= pool.cooldown_seconds
    if not active and current == 1 and pool.min_replicas == 0 and cooled:
        # cooldownSeconds alone governs the last replica, not the scale-down window as well.
        replicas, reason = 0, Reason.IDLE
        message = f"{message}; idle for cooldownSeconds {pool.cooldown_seconds}: to zero"
    if replicas == 0 and current > 0 and not cooled:
        replicas = 1
        reason = Reason.SCALE_TO_ZERO_COOLDOWN
        remaining = pool.cooldown_seconds - (now - idle_since)
        message = f"{message}; holding 1 replica for {remaining:.0f}s more of cooldownSeconds"
    if replicas == 0 and active:
        # An active pool (any claimed job among them) recommends >= 1, and stabilization and rate
        # policies never take a non-zero count below 1, so this only bites at zero: a scale-up
        # window or a Disabled scale-up must not keep an active pool asleep.
        replicas = 1
    since_up = now - history.scaled_up_at if history.scaled_up_at is not None else math.inf
    hold, why = HOLD_SECONDS, "after the last scale-up"
    gap = history.burst_gap
    if gap is not None and gap < BRIDGE_SECONDS:
        hold, why = BRIDGE_SECONDS, f"after the last scale-up (bursts come {gap:.0f}s apart)"
    if (
        replicas < current
        and behavior.scale_down is None
        and since_up < hold
        and not (current == 1 and replicas == 0)
    ):
        # A scale-down this soon after a scale-up would undo it (a flap), or be undone by the
        # next burst: it waits.
        replicas, reason = current, Reason.SCALE_DOWN_STABILIZED
        message = f"{message}; held {hold - since_up:.0f}s more {why}"
    if busy is not None and replicas < min(busy + unfenced, current):
        spared = min(busy + unfenced, current)
        held = (f"{busy} pods hold jobs" if busy != 1 else "1 pod holds jobs") + (
            f" and {unfenced} idle {'one' if unfenced == 1 else 'ones'} could not be fenced"
            if unfenced
            else ""
        )
        message = (
            f"{message}; {held}: scaling in to {spared}, not {replicas}, so no running job is "
            "interrupted"
        )
        replicas, reason = spared, Reason.BUSY_PODS_SPARED
    if current == 0 and replicas > 0:
        reason = Reason.ACTIVATED
        message = f"activated from zero to {replicas}: {message}"
    if replicas > current:
        history = replace(history, starting=(now, replicas), scaled_up_at=now)

    return Decision(
        replicas=replicas,
        reason=reason,
        message=message,
        history=_record_scale(history, behavior, now, current, replicas),
        limited=replicas != stabilized,
        recommendation=raw,
    )


# --- the HPA's stabilization and rate policies -----------------------------------------------


def _up_window(behavior: Behavior) -> int:
    rules = behavior.scale_up
    return rules.stabilization_window_seconds if rules is not None else 0


def _bridging(history: History) -> bool:
    """Whether the pool's bursts come close enough together for its replicas to bridge them."""
    gap = history.burst_gap
    return gap is not None and gap < BRIDGE_SECONDS


def _down_window(behavior: Behavior, history: History) -> int:
    rules = behavior.scale_down
    if rules is None:
        if _bridging(history):
            return BRIDGE_SCALE_DOWN_WINDOW_SECONDS
        return DEFAULT_SCALE_DOWN_WINDOW_SECONDS
    return rules.stabilization_window_seconds


def _stabilize(raw: int, current: int, history: History, behavior: Behavior, now: float) -> int:
    """The HPA's ``stabilizeRecommendationWithBehaviors``: clamp ``current`` into the windows."""
    up_cutoff = now - _up_window(behavior)
    down_cutoff = now - _down_window(behavior, history)
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
        up = behavior.scale_up
        disabled = up is not None and up.select_policy is SelectPolicy.DISABLED
        limit = (
            max(_scale_up_limit(current, history, up, now), current)
            if up is not None
            else pool.max_replicas
        )
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
        down = behavior.scale_down
        disabled = down is not None and down.select_policy is SelectPolicy.DISABLED
        limit = (
            min(_scale_down_limit(current, history, down, now), current)
            if down is not None
            else pool.min_replicas
        )
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
    # Without the user's scaleDown the window depends on the bursts: keep what the longer needs.
    longest = BRIDGE_SCALE_DOWN_WINDOW_SECONDS if behavior.scale_down is None else 0
    window = max(_up_window(behavior), _down_window(behavior, history), longest)
    cutoff = now - window
    kept = tuple(rec for rec in history.recommendations if rec.at > cutoff)
    return replace(history, recommendations=(*kept, Recommendation(at=now, replicas=raw)))


def _record_scale(
    history: History, behavior: Behavior, now: float, before: int, after: int
) -> History:
    """Remember a change of replicas for the rate policies; drop events older than any period."""
    period = max(
        (
            policy.period_seconds
            for rules in (behavior.scale_up, behavior.scale_down)
            if rules is not None
            for policy in rules.policies
        ),
        default=0,
    )
    cutoff = now - period
    ups = tuple(event for event in history.scale_ups if event.at > cutoff)
    downs = tuple(event for event in history.scale_downs if event.at > cutoff)
    if after > before:
        ups = (*ups, ScaleEvent(at=now, change=after - before))
    elif after < before:
        downs = (*downs, ScaleEvent(at=now, change=before - after))
    return replace(history, scale_ups=ups, scale_downs=downs)
