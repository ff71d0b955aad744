"""One reconcile tick of one JobQueue: read the DSN and the stats, decide each pool with the
pure policy, scale what must change, and say what happened (status, Events, metrics).

Called by the kopf daemon in `handlers`; calls `kube` (Kubernetes), `databases`
(PostgreSQL), `policy` and `status` (pure). Per-pool histories live here, in memory: a
restarted operator starts fresh histories, which the policy seeds safely.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from venturi import Stats, WorkerInfo
from venturi_operator import cadence, policy, scalein, serving, status
from venturi_operator.config import DEFAULT_MAX_REPLICAS
from venturi_operator.databases import DatabaseError, Databases
from venturi_operator.kube import SCALE_ANNOTATION, DeploymentState, Kube, KubeError
from venturi_operator.metrics import OperatorMetrics, PoolSnapshot, Snapshot
from venturi_operator.spec import (
    JobQueueSpec,
    PoolSpec,
    SpecError,
    parse_spec,
    pool_loads,
    unserved_by_pool,
)
from venturi_operator.spec import unserved_kinds as find_unserved

logger = logging.getLogger(__name__)

EventSink = Callable[[str, str, str], None]
"""post(type, reason, message): an Event on the JobQueue (Normal or Warning)."""


class Refused(Exception):
    """A pool the operator will not scale (a rule, not an API failure); like KubeError, its
    `reason` and `message` go to the pool's status and the Ready condition."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass
class _Memory:
    """What the operator remembers about one JobQueue between ticks."""

    histories: dict[str, policy.History] = field(default_factory=dict)
    replicas: dict[str, int] = field(default_factory=dict)
    """Each pool's replicas as of the last tick (for wake-from-zero on NOTIFY)."""
    ticked_at: float | None = None
    """When the last tick started (the wake rule's clock: cadence.wake_at)."""
    spec: JobQueueSpec | None = None
    problem: str | None = None
    """The reason the last tick was not Ready (Warnings are posted when it changes)."""
    coverage: dict[str, serving.Coverage] = field(default_factory=dict)
    """What each pool's workers were last seen to serve (serving.pool_coverage)."""
    unserved_said: frozenset[tuple[str, str, str]] | None = None
    """What the UnservedKinds Event last posted said waits unserved, as (pool, queue, kind),
    pool "" for a kind no pool serves: posted again only when that changes, not when only its
    wording does (whether a pool's workers are live or were last seen)."""
    fenced: dict[str, dict[str, float]] = field(default_factory=dict)
    """Each pool's pods fenced by its scale-ins, and when (each lifted FENCE_SETTLE later)."""


@dataclass(frozen=True, kw_only=True)
class TickResult:
    status: dict[str, Any]
    stats: Stats | None
    scaled: dict[str, tuple[int, int]]
    """Pools scaled this tick: deployment -> (from, to)."""
    spared: bool = False
    """Whether a pool's scale-in was held back by its busy pods (the next tick comes sooner:
    ``cadence.next_wait``)."""


class Reconciler:
    def __init__(
        self,
        kube: Kube,
        databases: Databases,
        metrics: OperatorMetrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        max_replicas: int = DEFAULT_MAX_REPLICAS,
    ) -> None:
        self.kube = kube
        self.databases = databases
        self.metrics = metrics
        self.max_replicas = max_replicas
        """No pool is scaled whose maxReplicas is above it (whatever its JobQueue says)."""
        self._clock = clock
        self._wall = wall
        self._memory: dict[tuple[str, str], _Memory] = {}

    def pools_at_zero_for(self, namespace: str, name: str, kind: str) -> bool:
        """True if a pool that may serve `kind` (any pool, for an empty kind) was at zero."""
        memory = self._memory.get((namespace, name))
        if memory is None or memory.spec is None:
            return False
        if not kind:
            return any(n == 0 for n in memory.replicas.values())
        return any(memory.replicas.get(p.deployment) == 0 for p in memory.spec.pools_taking(kind))

    def wake_delay(self, namespace: str, name: str, kind: str) -> float | None:
        """Seconds until a NOTIFY for `kind` (any pool, for an empty kind) should tick this
        JobQueue (cadence.wake_at): 0 for a pool at zero; None to leave it to the interval."""
        memory = self._memory.get((namespace, name))
        if memory is None or memory.spec is None:
            return None
        if kind:
            # The NOTIFY does not say the job's queue: every pool that may take the kind (a
            # tick for a pool the job is not for finds nothing new, and costs one read).
            pools = memory.spec.pools_taking(kind)
            # A kind no worker of the pool takes, in any queue: the tick would find nothing to do.
            pools = [
                p
                for p in pools
                if (known := memory.coverage.get(p.deployment)) is None or known.registers(kind)
            ]
        else:
            pools = list(memory.spec.pools)
        now = self._clock()
        times = [
            when
            for p in pools
            if (
                when := cadence.wake_at(
                    decided=memory.replicas.get(p.deployment),
                    last_tick=memory.ticked_at,
                    now=now,
                )
            )
            is not None
        ]
        return max(0.0, min(times) - now) if times else None

    def failed(
        self,
        namespace: str,
        name: str,
        generation: int,
        previous_status: Mapping[str, Any],
        exc: BaseException,
        post: EventSink,
    ) -> dict[str, Any]:
        """The status of a tick that raised (a bug: the daemon logs its traceback): every
        condition false with reason ReconcileFailed, and a Warning when that is new, so that
        a JobQueue no longer scaled does not keep reading Ready. Names the exception's class
        only (its text could hold anything)."""
        message = (
            f"the operator failed to reconcile this JobQueue ({type(exc).__name__}; its log "
            f"has the traceback): its pools are not scaled until a tick succeeds"
        )
        return self._finish(
            (namespace, name),
            _all_false("ReconcileFailed", message),
            {},
            previous_status.get("conditions") or [],
            generation,
            self._wall(),
            post,
            count=False,  # the daemon counts it (reason "Exception")
        )

    def _finish(
        self,
        key: tuple[str, str],
        conds: list[status.Condition],
        body: dict[str, Any],
        previous_conditions: Sequence[Mapping[str, Any]] | None,
        generation: int,
        now_wall: datetime,
        post: EventSink,
        *,
        count: bool = True,
    ) -> dict[str, Any]:
        """`body` with the tick's conditions; a Warning when the reason the JobQueue is not
        Ready is new, and (`count`) the reconcile error counted."""
        memory = self._memory.setdefault(key, _Memory())
        ready = next(c for c in conds if c.type == "Ready")
        problem = None if ready.ok else ready.reason
        if problem is not None and problem != memory.problem:
            post("Warning", ready.reason, ready.message)
        if problem is not None and count:
            self.metrics.reconcile_errors.labels(*key, ready.reason).inc()
        memory.problem = problem
        body["observedGeneration"] = generation
        body["conditions"] = status.conditions(
            conds, previous_conditions, generation=generation, now=now_wall
        )
        return body

    async def forget(self, namespace: str, name: str) -> None:
        self._memory.pop((namespace, name), None)
        self.metrics.forget(namespace, name)
        await self.databases.release((namespace, name))

    async def tick(
        self,
        namespace: str,
        name: str,
        spec_raw: Mapping[str, Any],
        generation: int,
        previous_status: Mapping[str, Any],
        post: EventSink,
        on_wake: Callable[[str], None] | None = None,
    ) -> TickResult:
        started = time.perf_counter()
        memory = self._memory.setdefault((namespace, name), _Memory())
        try:
            return await self._tick(
                namespace, name, spec_raw, generation, previous_status, post, on_wake, memory
            )
        finally:
            self.metrics.reconcile_duration.labels(namespace, name).observe(
                time.perf_counter() - started
            )

    async def _tick(
        self,
        namespace: str,
        name: str,
        spec_raw: Mapping[str, Any],
        generation: int,
        previous_status: Mapping[str, Any],
        post: EventSink,
        on_wake: Callable[[str], None] | None,
        memory: _Memory,
    ) -> TickResult:
        now_wall = self._wall()
        memory.ticked_at = self._clock()
        previous_conditions = previous_status.get("conditions") or []

        def finish(conds: list[status.Condition], body: dict[str, Any]) -> dict[str, Any]:
            return self._finish(
                (namespace, name), conds, body, previous_conditions, generation, now_wall, post
            )

        # 1. The spec (the schema should have caught anything bad; this is the backstop).
        try:
            spec = parse_spec(spec_raw)
        except SpecError as exc:
            conds = _all_false("InvalidSpec", str(exc))
            self.metrics.update(namespace, name, Snapshot(stats_up=False))
            return TickResult(status=finish(conds, {}), stats=None, scaled={})
        memory.spec = spec

        # 2. The stats, through the DSN in the Secret.
        stats: Stats | None = None
        db_problem: tuple[str, str] | None = None
        dsn: str | None = None
        try:
            dsn = await self.kube.secret_value(
                namespace, spec.database.secret_name, spec.database.key
            )
            if on_wake is not None:
                self.databases.watch(dsn, spec.database.prefix, (namespace, name), on_wake)
            stats = await self.databases.stats(dsn, spec.database.prefix, (namespace, name))
        except (KubeError, DatabaseError) as exc:
            db_problem = (exc.reason, exc.message)
        registrations: list[serving.Registration] = []
        if dsn is not None and stats is not None:
            registrations = await self._registrations(namespace, dsn, spec.database.prefix)

        # 3. Each pool: read, decide, scale.
        loads = pool_loads(spec, stats) if stats is not None else {}
        try:
            conflicts = await self.kube.other_autoscalers(namespace)
        except KubeError as exc:
            conflicts = {}
            logger.warning(
                "cannot check for other autoscalers in %s: %s",
                namespace,
                exc,
                extra={"namespace": namespace, "jobqueue": name},
            )
        now = self._clock()
        pools_status: list[dict[str, Any]] = []
        pool_snapshots: dict[str, PoolSnapshot] = {}
        pool_problems: list[tuple[str, str]] = []
        decisions: list[policy.Decision] = []
        scaled: dict[str, tuple[int, int]] = {}
        # Per pool, the pending (queue, kind) pairs its workers do not serve.
        unserved: dict[str, frozenset[tuple[str, str]]] = {}
        for pool in spec.pools:
            load = loads.get(pool.deployment) if stats is not None else None
            entry: dict[str, Any] = {"deployment": pool.deployment}
            current: int | None = None
            desired: int | None = None
            if pool.deployment in conflicts:
                problem = (
                    "ConflictingAutoscaler",
                    f"Deployment {pool.deployment} is also scaled by "
                    f"{conflicts[pool.deployment]}; venturi leaves it alone",
                )
                pool_problems.append(problem)
                entry |= {"reason": problem[0], "message": problem[1]}
            else:
                try:
                    queue = (dsn, spec.database.prefix) if dsn and stats is not None else None
                    deployment = await self._deployment(namespace, name, pool)
                    if stats is not None:
                        coverage = await self._coverage(
                            namespace, pool, deployment, registrations, memory
                        )
                        covered = {pool.deployment: coverage}
                        load = pool_loads(spec, stats, covered)[pool.deployment]
                        unserved[pool.deployment] = unserved_by_pool(spec, stats, covered)[
                            pool.deployment
                        ]
                    current, decision = await self._scale_pool(
                        namespace,
                        name,
                        pool,
                        deployment,
                        load,
                        memory,
                        spec.paused,
                        now,
                        post,
                        queue,
                    )
                except (KubeError, Refused) as exc:
                    pool_problems.append((exc.reason, exc.message))
                    entry |= {"reason": exc.reason, "message": exc.message}
                else:
                    desired = decision.replicas
                    decisions.append(decision)
                    if decision.replicas != current:
                        scaled[pool.deployment] = (current, decision.replicas)
                        entry["lastScaleTime"] = status.timestamp(now_wall)
                    elif last := _previous_pool(previous_status, pool.deployment).get(
                        "lastScaleTime"
                    ):
                        entry["lastScaleTime"] = last
                    entry |= {
                        "currentReplicas": current,
                        "desiredReplicas": decision.replicas,
                        "fallback": decision.fallback,
                        "reason": str(decision.reason),
                        "message": decision.message,
                        "lastDecisionTime": status.timestamp(now_wall),
                    }
                    if decision.recommendation is not None:
                        entry["recommendedReplicas"] = decision.recommendation
            if load is not None:
                entry |= {"pending": load.pending, "claimed": load.claimed}
                if load.oldest_pending_age is not None:
                    entry["oldestPendingAge"] = round(load.oldest_pending_age, 3)
                kinds = sorted({kind for _, kind in unserved.get(pool.deployment, ())})
                if kinds:
                    entry["unservedKinds"] = kinds
            pools_status.append(entry)
            pool_snapshots[pool.deployment] = PoolSnapshot(
                pending=load.pending if load else 0,
                claimed=load.claimed if load else 0,
                oldest_pending_age=load.oldest_pending_age if load else None,
                current_replicas=current,
                desired_replicas=desired,
                min_replicas=pool.min_replicas,
                max_replicas=pool.max_replicas,
                max_oldest_pending_age=pool.max_oldest_pending_age,
            )

        # 4. Say what happened.
        body: dict[str, Any] = {"pools": pools_status}
        current_total = [p["currentReplicas"] for p in pools_status if "currentReplicas" in p]
        desired_total = [p["desiredReplicas"] for p in pools_status if "desiredReplicas" in p]
        body["replicas"] = sum(current_total)
        body["desiredReplicas"] = sum(desired_total)
        if stats is not None:
            unrouted = sorted(find_unserved(spec, stats))
            body["stats"] = {
                "observedTime": status.timestamp(now_wall),
                "pending": stats.pending,
                "claimed": stats.claimed,
                "oldestPendingAge": round(stats.oldest_pending_age or 0.0, 3),
                "pendingByKind": dict(stats.pending_by_kind),
                "claimedByKind": dict(stats.claimed_by_kind),
                "deadByKind": dict(stats.dead_by_kind),
                "oldestPendingAgeByKind": {
                    k: round(max(v, 0.0), 3) for k, v in stats.oldest_pending_age_by_kind.items()
                },
                "unservedKinds": unrouted,
            }
            # The status is written as a merge patch, which keeps a map's keys it does not
            # name: a kind no longer pending would stay listed with its old count.
            body["stats"] = status.dropping_gone_keys(body["stats"], previous_status.get("stats"))
        elif isinstance(previous_status.get("stats"), Mapping):
            body["stats"] = dict(previous_status["stats"])  # keep the last good figures
        self.metrics.update(
            namespace,
            name,
            Snapshot(
                stats_up=stats is not None,
                pending_by_kind=dict(stats.pending_by_kind) if stats else {},
                claimed_by_kind=dict(stats.claimed_by_kind) if stats else {},
                dead_by_kind=dict(stats.dead_by_kind) if stats else {},
                oldest_pending_age_by_kind=dict(stats.oldest_pending_age_by_kind) if stats else {},
                pools=pool_snapshots,
            ),
        )
        conds = _conditions(spec, db_problem, pool_problems, decisions)
        if stats is not None:
            no_pool = find_unserved(spec, stats)
            said = _unserved_condition(unserved, memory.coverage, no_pool)
            facts = frozenset(
                [(pool, queue, kind) for pool, pairs in unserved.items() for queue, kind in pairs]
                + [("", "", kind) for kind in no_pool]
            )
            if said.ok and facts != memory.unserved_said:
                post("Warning", said.reason, said.message)
            memory.unserved_said = facts if said.ok else None
        else:
            said = status.Condition(
                type="UnservedKinds",
                ok=False,
                reason="StatsUnavailable",
                message="stats could not be read: which kinds wait unserved is not known",
            )
        conds.append(said)
        spared = any(d.reason is policy.Reason.BUSY_PODS_SPARED for d in decisions)
        return TickResult(status=finish(conds, body), stats=stats, scaled=scaled, spared=spared)

    async def _scale_pool(
        self,
        namespace: str,
        name: str,
        pool: PoolSpec,
        deployment: DeploymentState,
        load: policy.PoolLoad | None,
        memory: _Memory,
        paused: bool,
        now: float,
        post: EventSink,
        queue: tuple[str, str] | None = None,
    ) -> tuple[int, policy.Decision]:
        """Decide one pool with the pure policy, scale its Deployment if the replicas change
        (an Event and a metric), and remember the history; returns (current, decision).

        Before a scale-in, the pods' deletion costs are set from the jobs each holds, and the
        policy decides again knowing how many pods are busy (it never scales in below them);
        the pods it takes are fenced first (see `scalein`)."""
        current = deployment.replicas
        history = memory.histories.get(pool.deployment, policy.History())
        fences = memory.fenced.get(pool.deployment)
        if fences is None and queue is not None and deployment.selector:
            # First sight of the pool (this operator just started): fences an operator before
            # it wrote for the pool's pods and never lifted (it died between a fence and its
            # scale-in) are lifted as its own would be, `FENCE_SETTLE` from now for the pods
            # still there, instead of holding idle pods back for their whole TTL.
            fences = await self._left_fences(namespace, deployment.selector, now, *queue)
        fences = memory.fenced.setdefault(pool.deployment, fences or {})
        if queue is not None and deployment.selector:
            await self._lift_fences(namespace, deployment.selector, fences, now, *queue)

        def decide(busy: int | None, unfenced: int = 0) -> policy.Decision:
            return policy.decide(
                load,
                pool,
                history,
                now,
                current=current,
                paused=paused,
                ready=deployment.ready,
                busy=busy,
                unfenced=unfenced,
            )

        decision = decide(None)
        if decision.replicas < current and queue is not None:
            if deployment.selector:
                decision = await self._prepare_scale_in(
                    namespace, deployment.selector, current, decision, decide, fences, now, *queue
                )
            else:
                decision = _held_unknown(
                    decision, decide, current, "the Deployment has no selector to list them by"
                )
        if decision.replicas != current:
            try:
                await self.kube.scale(namespace, pool.deployment, decision.replicas)
            except KubeError:
                # No scale-in: this tick's fences hold nothing back (the next tick chooses
                # afresh), and lifted now they cannot be renewed tick after tick.
                mine = [pod for pod, at in fences.items() if at == now]
                if queue is not None and mine and await self._unfence(namespace, *queue, mine):
                    for pod in mine:
                        del fences[pod]
                raise
            direction = "up" if decision.replicas > current else "down"
            self.metrics.scale_events.labels(namespace, name, pool.deployment, direction).inc()
            post(
                "Normal",
                "Scaled",
                f"Scaled Deployment {pool.deployment} from {current} to "
                f"{decision.replicas} ({decision.reason}): {decision.message}",
            )
            logger.info(
                "%s/%s: scaled %s %d -> %d (%s)",
                namespace,
                name,
                pool.deployment,
                current,
                decision.replicas,
                decision.reason,
                extra={"namespace": namespace, "jobqueue": name},
            )
        # Kept only once the scale is applied: a failed patch loses just this tick's sample.
        memory.histories[pool.deployment] = decision.history
        memory.replicas[pool.deployment] = decision.replicas
        return current, decision

    async def _deployment(self, namespace: str, name: str, pool: PoolSpec) -> DeploymentState:
        """Read one pool's Deployment. Refuses a pool above the operator's replica ceiling, or
        whose Deployment has not opted in to this JobQueue: naming a Deployment must not be
        enough to scale it."""
        if pool.max_replicas > self.max_replicas:
            raise Refused(
                "MaxReplicasAboveLimit",
                f"pool {pool.deployment}: maxReplicas {pool.max_replicas} is above the "
                f"operator's limit of {self.max_replicas} (venturi-operator --max-replicas; "
                "the chart's operator.maxReplicas)",
            )
        deployment = await self.kube.deployment(namespace, pool.deployment)
        if deployment.jobqueue != name:
            raise Refused("NotOptedIn", _not_opted_in(namespace, name, pool, deployment.jobqueue))
        return deployment

    async def _registrations(
        self, namespace: str, dsn: str, prefix: str
    ) -> list[serving.Registration]:
        """The live registry rows of workers in pods; none when the registry cannot be read
        (each pool then goes by what its workers were last seen to serve: serving)."""
        try:
            rows = await self.databases.workers(dsn, prefix)
        except DatabaseError as exc:
            logger.warning(
                "%s: cannot read the worker registry: %s",
                namespace,
                exc,
                extra={"namespace": namespace},
            )
            return []
        return [_registration(w) for w in rows if w.live and w.pod]

    async def _coverage(
        self,
        namespace: str,
        pool: PoolSpec,
        deployment: DeploymentState,
        registrations: list[serving.Registration],
        memory: _Memory,
    ) -> serving.Coverage | None:
        """What the pool's workers serve (serving.pool_coverage), remembered for the next tick.
        The pods are listed only when some worker in a pod registered: without one there is
        nothing to match them with."""
        pods: Collection[str] = ()
        if registrations and deployment.selector:
            try:
                pods = await self.kube.pods(namespace, deployment.selector)
            except KubeError as exc:
                logger.warning(
                    "%s: cannot list the pods of %s: %s",
                    namespace,
                    pool.deployment,
                    exc,
                    extra={"namespace": namespace},
                )
        coverage = serving.pool_coverage(
            pods,
            registrations,
            template=deployment.template,
            remembered=memory.coverage.get(pool.deployment),
        )
        if coverage is None:
            memory.coverage.pop(pool.deployment, None)
        else:
            memory.coverage[pool.deployment] = coverage
        return coverage

    async def _prepare_scale_in(
        self,
        namespace: str,
        selector: str,
        current: int,
        decision: policy.Decision,
        decide: Callable[[int | None, int], policy.Decision],
        fences: dict[str, float],
        now: float,
        dsn: str,
        prefix: str,
    ) -> policy.Decision:
        """Mark the pods for a scale-in and fence the ones it takes (see `scalein`); the
        decision, made again knowing the busy pods and the fenced ones. `fences` (the pool's
        pods fenced, and when) gains every pod a fence was written for, before the write, so
        that a fence that committed with its reply lost is lifted too.

        When the pods or the claims cannot be read there is no scale-in (it would take pods
        at random, busy or not) until they can be, unless the claims say no job is claimed at
        all. A pod that claimed a job just before its fence is kept and unfenced, and another
        idle pod is fenced in its place (for a few rounds at most); a scale-in takes no pod
        that is not fenced (when a fence cannot be written, e.g. a schema before migration 18,
        it waits: `decide`'s unfenced pods)."""
        try:
            claimed = await self.databases.claimed_by_pod(dsn, prefix)
        except DatabaseError as exc:
            self._cannot_mark(namespace, exc)
            return _held_unknown(decision, decide, current, exc.message)
        try:
            pods = await self.kube.pods(namespace, selector)
        except KubeError as exc:
            self._cannot_mark(namespace, exc)
            if not claimed:  # no job is claimed at all: no pod can be busy, any may go
                return decision
            return _held_unknown(decision, decide, current, exc.message)
        costs = scalein.deletion_costs(pods, claimed)
        decision = decide(scalein.busy_pods(costs), 0)
        unready = {name for name, pod in pods.items() if not pod.ready}
        fenced: list[str] = []
        tried: set[str] = set()
        fencing = True  # False: the database has no fences (a schema before migration 18)
        for _ in range(scalein.FENCE_ROUNDS):
            untried = {pod: cost for pod, cost in costs.items() if pod not in tried}
            leaving = current - decision.replicas - len(fenced)
            chosen = scalein.victims(untried, leaving, unready=unready)
            if not chosen:
                break
            tried.update(chosen)
            fences.update(dict.fromkeys(chosen, now))
            try:
                await self.databases.fence_pods(dsn, prefix, chosen, scalein.FENCE_TTL)
                claimed = await self.databases.claimed_by_pod(dsn, prefix)
            except DatabaseError as exc:
                fencing = exc.reason != "SchemaMissing"
                logger.warning(
                    "%s: cannot fence the pods a scale-in takes (%s): %s",
                    namespace,
                    exc,
                    "it takes only pods already fenced"
                    if fencing
                    else "sparing busy pods by their deletion cost only, as before migration 18",
                    extra={"namespace": namespace},
                )
                break
            idle, turned = scalein.still_idle(chosen, claimed)
            fenced += idle
            if turned and await self._unfence(namespace, dsn, prefix, turned):
                for pod in turned:  # claimed a job just before the fence: kept
                    fences.pop(pod, None)
            costs = scalein.deletion_costs(pods, claimed)
            decision = decide(scalein.busy_pods(costs), 0)
        leaving = max(current - decision.replicas, 0)
        if len(fenced) > leaving:
            # The pool needs more pods than the first read said: unfence the surplus.
            surplus, fenced = fenced[leaving:], fenced[:leaving]
            if await self._unfence(namespace, dsn, prefix, surplus):
                for pod in surplus:
                    fences.pop(pod, None)
        costs |= dict.fromkeys(fenced, scalein.FENCED_COST)
        # Safe to remove: the pods the ReplicaSet takes before any other (the fenced ones; or,
        # without fences, the idle ones), and pods not listed (not created yet, or gone: they
        # hold nothing). A busy pod that is not ready would go before them all.
        spare = fenced if fencing else [pod for pod, cost in costs.items() if cost <= 0]
        safe = scalein.takes_only(spare, costs, unready=unready) + max(current - len(pods), 0)
        if leaving > safe:
            busy = scalein.busy_pods(costs)
            decision = decide(busy, max(current - safe - busy, 0))
        try:
            annotated = {name: pod.cost for name, pod in pods.items()}
            for name, cost in scalein.stale_costs(annotated, costs).items():
                await self.kube.set_deletion_cost(namespace, name, cost)
        except KubeError as exc:
            self._cannot_mark(namespace, exc)
        return decision

    def _cannot_mark(self, namespace: str, exc: Exception) -> None:
        logger.warning(
            "%s: cannot mark idle pods before a scale-in: %s",
            namespace,
            exc,
            extra={"namespace": namespace},
        )

    async def _lift_fences(
        self,
        namespace: str,
        selector: str,
        fences: dict[str, float],
        now: float,
        dsn: str,
        prefix: str,
    ) -> None:
        """Lift the fences of a pool's scale-ins once the ReplicaSet has acted on them: of the
        pods fenced `FENCE_SETTLE` ago or more, those still there (and not terminating) were
        kept, and may claim again; the others are being deleted (their workers, SIGTERMed,
        claim nothing) or gone, and their fences lapse by themselves."""
        due = [pod for pod, at in fences.items() if now - at >= scalein.FENCE_SETTLE]
        if not due:
            return
        try:
            listed = await self.kube.pods(namespace, selector)
        except KubeError as exc:
            self._cannot_mark(namespace, exc)
            return
        kept = [pod for pod in due if pod in listed]
        if kept and not await self._unfence(namespace, dsn, prefix, kept):
            return
        for pod in due:
            del fences[pod]

    async def _left_fences(
        self, namespace: str, selector: str, now: float, dsn: str, prefix: str
    ) -> dict[str, float]:
        """The pool's pods fenced now, as fenced at `now` (none when that cannot be read:
        those fences then lapse by themselves)."""
        try:
            fenced = await self.databases.fenced_pods(dsn, prefix)
            listed = await self.kube.pods(namespace, selector) if fenced else {}
        except (DatabaseError, KubeError) as exc:
            logger.warning(
                "%s: cannot look for fences an earlier operator left (%s): they lapse within %.0fs",
                namespace,
                exc,
                scalein.FENCE_TTL,
                extra={"namespace": namespace},
            )
            return {}
        return {pod: now for pod in fenced if pod in listed}

    async def _unfence(self, namespace: str, dsn: str, prefix: str, pods: list[str]) -> bool:
        try:
            await self.databases.unfence_pods(dsn, prefix, pods)
        except DatabaseError as exc:
            logger.warning(
                "%s: cannot lift the fences of pods %s (%s): they lapse within %.0fs",
                namespace,
                ", ".join(pods),
                exc,
                scalein.FENCE_TTL,
                extra={"namespace": namespace},
            )
            return False
        return True


def _registration(worker: WorkerInfo) -> serving.Registration:
    return serving.Registration(
        pod=worker.pod or "",
        queues=worker.queues,
        kinds=worker.kinds,
        every_kind=worker.unknown_kinds == "fail",
    )


def _unserved_condition(
    by_pool: Mapping[str, frozenset[tuple[str, str]]],
    coverage: Mapping[str, serving.Coverage],
    unrouted: frozenset[str],
) -> status.Condition:
    """UnservedKinds: True while jobs wait for a kind no worker that could take them serves --
    none of their pool's live workers registers it, or no pool serves it. Not demand: such a
    pool is not scaled up for them (and a pool at zero stays there)."""
    parts = []
    for deployment, pairs in sorted(by_pool.items()):
        if pairs:
            kinds = ", ".join(f"{kind} (queue {queue})" for queue, kind in sorted(pairs))
            known = coverage.get(deployment)
            whose = (
                "no live worker of its pods registers"
                if known is None or known.live
                else "its workers did not register when last seen, under this pod template"
            )
            parts.append(f"pool {deployment}: pending {kinds}, which {whose} (no demand)")
    if unrouted:
        parts.append(f"no pool serves pending or claimed {', '.join(sorted(unrouted))}")
    if not parts:
        return status.Condition(
            type="UnservedKinds",
            ok=False,
            reason="AllKindsServed",
            message="every pending kind is served by its pool's workers, or not known not to be",
        )
    return status.Condition(
        type="UnservedKinds", ok=True, reason="KindsUnserved", message="; ".join(parts)
    )


_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def _not_opted_in(namespace: str, name: str, pool: PoolSpec, other: str | None) -> str:
    where = f"Deployment {namespace}/{pool.deployment}"
    if other:
        # Repeated only if it is a name: an annotation may hold anything, of any length.
        whom = f"JobQueue {other!r}" if _NAME.fullmatch(other) else "another JobQueue"
        return f"{where} opted in to scaling by {whom}, not {name!r}: left alone"
    return (
        f"{where} has not opted in to scaling by this JobQueue: whoever manages it annotates it "
        f"(kubectl -n {namespace} annotate deployment {pool.deployment} "
        f"{SCALE_ANNOTATION}={name})"
    )


def _previous_pool(previous_status: Mapping[str, Any], deployment: str) -> Mapping[str, Any]:
    for entry in previous_status.get("pools") or []:
        if isinstance(entry, Mapping) and entry.get("deployment") == deployment:
            return entry
    return {}


def _all_false(reason: str, message: str) -> list[status.Condition]:
    return [
        status.Condition(type=t, ok=False, reason=reason, message=message)
        for t in status.CONDITION_TYPES
    ]


def _conditions(
    spec: JobQueueSpec,
    db_problem: tuple[str, str] | None,
    pool_problems: list[tuple[str, str]],
    decisions: list[policy.Decision],
) -> list[status.Condition]:
    c = status.Condition
    out = []
    if db_problem is None:
        out.append(
            c(
                type="DatabaseReachable",
                ok=True,
                reason="StatsRead",
                message="the queue's stats were read",
            )
        )
    else:
        out.append(
            c(type="DatabaseReachable", ok=False, reason=db_problem[0], message=db_problem[1])
        )
    fallback = [d for d in decisions if d.fallback]
    limited = [d for d in decisions if d.limited]
    if spec.paused:
        active = c(
            type="ScalingActive",
            ok=False,
            reason="Paused",
            message="spec.paused is set: replicas are left as they are",
        )
    elif db_problem is not None:
        active = c(
            type="ScalingActive",
            ok=False,
            reason="StatsUnavailable",
            message="stats could not be read: replicas are kept (or raised to fallback)",
        )
    elif not decisions:
        active = c(
            type="ScalingActive", ok=False, reason=pool_problems[0][0], message=pool_problems[0][1]
        )
    else:
        active = c(
            type="ScalingActive",
            ok=True,
            reason="Scaling",
            message=f"{len(decisions)} of {len(spec.pools)} pools scaled from the stats",
        )
    out.append(active)
    if limited:
        d = limited[0]
        out.append(c(type="ScalingLimited", ok=True, reason=str(d.reason), message=d.message))
    else:
        out.append(
            c(
                type="ScalingLimited",
                ok=False,
                reason="WithinBounds",
                message="every pool's desired replicas were within its bounds and rates",
            )
        )
    if fallback:
        d = fallback[0]
        out.append(c(type="Fallback", ok=True, reason=str(d.reason), message=d.message))
    elif db_problem is not None:
        # No pool could act on the fallback either (none opted in, say): nothing is held at
        # fallbackReplicas, but the stats are not available.
        out.append(
            c(
                type="Fallback",
                ok=False,
                reason="NoPoolToHold",
                message="stats could not be read, and no pool could be held at its fallback",
            )
        )
    else:
        out.append(
            c(
                type="Fallback",
                ok=False,
                reason="StatsAvailable",
                message="decisions are based on current stats",
            )
        )
    if db_problem is not None:
        ready = c(type="Ready", ok=False, reason=db_problem[0], message=db_problem[1])
    elif pool_problems:
        ready = c(
            type="Ready",
            ok=False,
            reason=pool_problems[0][0],
            message="; ".join(m for _, m in pool_problems),
        )
    else:
        ready = c(
            type="Ready", ok=True, reason="Reconciled", message="stats read and every pool scaled"
        )
    return [ready, *out]


def _held_unknown(
    decision: policy.Decision,
    decide: Callable[[int | None, int], policy.Decision],
    current: int,
    why: str,
) -> policy.Decision:
    """`decision`'s scale-in held back, at `current` replicas: which pods hold jobs is not
    known (`why`), and the ReplicaSet would pick its victims busy or not."""
    held = decide(0, current)  # every pod spared, as if none could be fenced
    if held.replicas < current:  # a bound the user set (maxReplicas lowered): it stands
        return decision
    return dataclasses.replace(
        held,
        reason=policy.Reason.BUSY_PODS_UNKNOWN,
        message=(
            f"{decision.message}; which pods hold jobs is not known ({why}): no scale-in "
            "until it is, so no running job is interrupted"
        ),
    )
