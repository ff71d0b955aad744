"""A JobQueue's ``spec`` as typed values, and the queue's stats split per worker pool.

The operator's handlers call :func:`parse_spec` on the ``spec`` mapping kopf hands them, and
:func:`pool_loads` on the stats the runtime reads each tick; the results feed
:func:`venturi_operator.policy.decide`. Everything here is pure: no I/O, no kopf, no ``venturi``
import (the runtime's stats object is described by the :class:`QueueStats` protocol).

The CRD (``crds/venturi.dev_jobqueues.yaml``) is the contract users see, and the API server has
already defaulted and validated the spec against it. This module still applies the same defaults
and checks, because a cluster may run an older CRD than the operator, and because tests and tools
build specs without an API server; ``tests/operator/test_spec.py`` holds the two in step (same
defaults, same bounds, same enums). Every check raises :class:`SpecError`, a ``ValueError`` that
names the offending field by its CRD path (``spec.pools[1].maxReplicas``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol, TypeVar

from venturi_operator import policy
from venturi_operator.policy import (
    DEFAULT_BEHAVIOR,
    Behavior,
    PolicyType,
    PoolLoad,
    ScalingPolicy,
    ScalingRules,
    SelectPolicy,
)
from venturi_operator.serving import Coverage

__all__ = [
    "Behavior",
    "DatabaseRef",
    "JobQueueSpec",
    "KindStats",
    "PolicyType",
    "PoolLoad",
    "PoolSpec",
    "QueueStats",
    "ScalingPolicy",
    "ScalingRules",
    "SelectPolicy",
    "SpecError",
    "parse_spec",
    "pool_loads",
    "unserved_by_pool",
    "unserved_kinds",
]

#: Secret key holding the DSN when ``database.key`` is not given.
DEFAULT_SECRET_KEY = "dsn"
#: The runtime's default table prefix.
DEFAULT_PREFIX = "venturi"
#: Seconds between reconcile ticks: the HPA's default sync period.
DEFAULT_INTERVAL = 15
INTERVAL_MIN, INTERVAL_MAX = 1, 3600
#: Replicas a pool may go down to; 0 lets an idle pool sleep.
DEFAULT_MIN_REPLICAS = 0
#: Pending jobs a sleeping pool tolerates before it wakes; 0 wakes on the first job.
DEFAULT_ACTIVATION_THRESHOLD = 0
#: Seconds an idle pool keeps its last replica before going to zero: KEDA's ``cooldownPeriod``.
DEFAULT_COOLDOWN_SECONDS = 300
COOLDOWN_MAX = 86400
#: Bounds of ``maxOldestPendingAge`` in seconds (one week at most).
MAX_OLDEST_PENDING_AGE_MIN, MAX_OLDEST_PENDING_AGE_MAX = 1, 604800
#: Pools per JobQueue and kinds per pool. Small on purpose: the CRD's CEL rule that keeps pools'
#: kinds disjoint compares the kinds of every pair of pools, so its cost grows with pools^2 *
#: kinds^2 * kind length, and the API server refuses a rule whose worst case is too expensive
#: (10M per rule when the CRD is applied, 1M per rule per request). At 10 pools of 32 kinds of
#: up to 200 characters the worst case still passes on kube-apiserver 1.36.
MAX_POOLS = 10
MAX_KINDS_PER_POOL = 32
#: Queues per pool; the same CEL rule compares them too, so they are bounded the same way.
MAX_QUEUES_PER_POOL = 8
#: The runtime's default queue: where a job goes when its producer names none.
DEFAULT_QUEUE = "default"

# Kubernetes object names (RFC 1123 subdomain), Secret data keys, the runtime's table prefix
# (venturi's own check) and job kinds and queue names (venturi.task's KIND rule).
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")
_PREFIX = re.compile(r"[a-z][a-z0-9_]{0,38}")
_KIND = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,199}")
_NAME_MAX = 253


class SpecError(ValueError):
    """A JobQueue spec that cannot be used; ``field`` is the CRD path of the culprit."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def _check(ok: bool, field: str, problem: str) -> None:
    if not ok:
        raise SpecError(field, problem)


def _check_name(value: str, field: str) -> None:
    _check(
        len(value) <= _NAME_MAX and _DNS_SUBDOMAIN.fullmatch(value) is not None,
        field,
        f"expected a Kubernetes object name (RFC 1123 subdomain), got {value!r}",
    )


@dataclass(frozen=True, kw_only=True)
class DatabaseRef:
    """Where the queue lives: a Secret in the JobQueue's namespace holding the DSN, and a prefix."""

    #: The Secret's name; it must be in the JobQueue's namespace.
    secret_name: str
    #: The key in the Secret's data whose value is the PostgreSQL DSN.
    key: str = DEFAULT_SECRET_KEY
    #: The runtime's table prefix (``venturi_jobs`` ...), checked as the runtime checks it.
    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        _check_name(self.secret_name, "secretName")
        _check(
            len(self.key) <= _NAME_MAX and _SECRET_KEY.fullmatch(self.key) is not None,
            "key",
            f"expected a Secret data key ([-._a-zA-Z0-9]+), got {self.key!r}",
        )
        _check(
            _PREFIX.fullmatch(self.prefix) is not None,
            "prefix",
            f"expected ^[a-z][a-z0-9_]{{0,38}}$, got {self.prefix!r}",
        )


@dataclass(frozen=True, kw_only=True)
class PoolSpec:
    """One worker pool: a Deployment, the job kinds and queues it serves, and how it scales.

    Provides :class:`venturi_operator.policy.PoolScaling`, what ``decide`` reads.
    """

    #: The Deployment's name, in the JobQueue's namespace.
    deployment: str
    #: The job kinds it serves; None: every kind (of its queues) no more specific pool names.
    kinds: tuple[str, ...] | None = None
    #: The queues it serves; None: every queue. A pool with neither is the catch-all.
    queues: tuple[str, ...] | None = None
    min_replicas: int = DEFAULT_MIN_REPLICAS
    max_replicas: int
    #: Outstanding jobs (pending + claimed) one replica should carry.
    target_per_replica: int
    #: Seconds the oldest pending job may wait before the pool scales up regardless of counts.
    max_oldest_pending_age: int | None = None
    #: Pending jobs at or below which a pool at zero stays asleep.
    activation_threshold: int = DEFAULT_ACTIVATION_THRESHOLD
    #: Seconds of idleness before the last replica goes (1 -> 0 only).
    cooldown_seconds: int = DEFAULT_COOLDOWN_SECONDS
    #: Replicas to run at least while stats cannot be read; None keeps the current count.
    fallback_replicas: int | None = None
    behavior: Behavior = DEFAULT_BEHAVIOR

    def __post_init__(self) -> None:
        _check_name(self.deployment, "deployment")
        if self.kinds is not None:
            _check(
                1 <= len(self.kinds) <= MAX_KINDS_PER_POOL,
                "kinds",
                f"expected 1 to {MAX_KINDS_PER_POOL} kinds (omit it for a catch-all pool), "
                f"got {len(self.kinds)}",
            )
            for i, kind in enumerate(self.kinds):
                _check(
                    _KIND.fullmatch(kind) is not None,
                    f"kinds[{i}]",
                    f"expected a job kind ([A-Za-z0-9][A-Za-z0-9_.:/-]{{0,199}}), got {kind!r}",
                )
                _check(kind not in self.kinds[:i], f"kinds[{i}]", f"duplicate kind {kind!r}")
        if self.queues is not None:
            _check(
                1 <= len(self.queues) <= MAX_QUEUES_PER_POOL,
                "queues",
                f"expected 1 to {MAX_QUEUES_PER_POOL} queues (omit it to serve every queue), "
                f"got {len(self.queues)}",
            )
            for i, queue in enumerate(self.queues):
                _check(
                    _KIND.fullmatch(queue) is not None,
                    f"queues[{i}]",
                    f"expected a queue name ([A-Za-z0-9][A-Za-z0-9_.:/-]{{0,199}}), got {queue!r}",
                )
                _check(queue not in self.queues[:i], f"queues[{i}]", f"duplicate queue {queue!r}")
        _check(self.min_replicas >= 0, "minReplicas", f"expected >= 0, got {self.min_replicas}")
        _check(self.max_replicas >= 1, "maxReplicas", f"expected >= 1, got {self.max_replicas}")
        _check(
            self.min_replicas <= self.max_replicas,
            "minReplicas",
            f"expected <= maxReplicas ({self.max_replicas}), got {self.min_replicas}",
        )
        _check(
            self.target_per_replica >= 1,
            "targetPerReplica",
            f"expected >= 1, got {self.target_per_replica}",
        )
        if self.max_oldest_pending_age is not None:
            _check(
                MAX_OLDEST_PENDING_AGE_MIN
                <= self.max_oldest_pending_age
                <= MAX_OLDEST_PENDING_AGE_MAX,
                "maxOldestPendingAge",
                f"expected seconds in [{MAX_OLDEST_PENDING_AGE_MIN}, "
                f"{MAX_OLDEST_PENDING_AGE_MAX}], got {self.max_oldest_pending_age}",
            )
        _check(
            self.activation_threshold >= 0,
            "activationThreshold",
            f"expected >= 0, got {self.activation_threshold}",
        )
        _check(
            0 <= self.cooldown_seconds <= COOLDOWN_MAX,
            "cooldownSeconds",
            f"expected seconds in [0, {COOLDOWN_MAX}], got {self.cooldown_seconds}",
        )
        if self.fallback_replicas is not None:
            _check(
                1 <= self.fallback_replicas <= self.max_replicas,
                "fallbackReplicas",
                f"expected 1 to maxReplicas ({self.max_replicas}), got {self.fallback_replicas}",
            )


@dataclass(frozen=True, kw_only=True)
class JobQueueSpec:
    """A whole JobQueue spec: the database, the tick interval, and the pools."""

    database: DatabaseRef
    #: One or more pools; each job kind is served by at most one of them.
    pools: tuple[PoolSpec, ...]
    #: Seconds between reconcile ticks.
    interval: int = DEFAULT_INTERVAL
    #: Leave every pool's replicas alone (stats are still read and reported).
    paused: bool = False

    def __post_init__(self) -> None:
        _check(
            INTERVAL_MIN <= self.interval <= INTERVAL_MAX,
            "interval",
            f"expected seconds in [{INTERVAL_MIN}, {INTERVAL_MAX}], got {self.interval}",
        )
        _check(
            1 <= len(self.pools) <= MAX_POOLS,
            "pools",
            f"expected 1 to {MAX_POOLS} pools, got {len(self.pools)}",
        )
        for i, pool in enumerate(self.pools):
            earlier = [p.deployment for p in self.pools[:i]]
            _check(
                pool.deployment not in earlier,
                f"pools[{i}].deployment",
                f"duplicate deployment {pool.deployment!r}",
            )
            for other in self.pools[:i]:
                _check_disjoint(i, pool, other)

    def pools_taking(self, kind: str) -> list[PoolSpec]:
        """The pools that may serve jobs of ``kind`` in some queue (a job's NOTIFY names its
        kind, not its queue: each of these may be the one it is for)."""
        return [p for p in self.pools if p.kinds is None or kind in p.kinds]

    def pool_for(self, kind: str, queue: str = DEFAULT_QUEUE) -> PoolSpec | None:
        """The pool serving jobs of ``kind`` in ``queue``, or None. The most specific pool
        wins: one naming the queue and the kind, then one naming the queue (every kind of
        it), then one naming the kind (in every queue), then the catch-all."""
        best: PoolSpec | None = None
        best_rank = -1
        for pool in self.pools:
            if pool.queues is not None and queue not in pool.queues:
                continue
            if pool.kinds is not None and kind not in pool.kinds:
                continue
            rank = (2 if pool.queues is not None else 0) + (1 if pool.kinds is not None else 0)
            if rank > best_rank:
                best, best_rank = pool, rank
        return best


def _check_disjoint(i: int, pool: PoolSpec, other: PoolSpec) -> None:
    """Two pools may overlap only at different precedence (see `pool_for`): of two pools that
    both name queues or both do not, and both name kinds or both do not, no (queue, kind) may
    be served by both."""
    if (pool.queues is None) != (other.queues is None) or (pool.kinds is None) != (
        other.kinds is None
    ):
        return
    shared_queues = [q for q in pool.queues or () if q in (other.queues or ())]
    if pool.queues is not None and not shared_queues:
        return
    where = f" of queue {shared_queues[0]!r}" if shared_queues else ""
    if pool.kinds is not None:
        for j, kind in enumerate(pool.kinds):
            if kind in (other.kinds or ()):
                raise SpecError(
                    f"pools[{i}].kinds[{j}]",
                    f"kind {kind!r}{where} is already served by {other.deployment!r}",
                )
        return
    if pool.queues is not None:
        j = pool.queues.index(shared_queues[0])
        raise SpecError(
            f"pools[{i}].queues[{j}]",
            f"queue {shared_queues[0]!r} is already served by {other.deployment!r} (neither "
            "pool names kinds)",
        )
    raise SpecError(
        f"pools[{i}].kinds",
        f"only one pool may omit both kinds and queues (the catch-all), and "
        f"{other.deployment!r} already does",
    )


class KindStats(Protocol):
    """The part of the runtime's stats that scaling needs, keyed by job kind: what the
    runtime's ``venturi.QueueStats`` (one queue) holds.

    Dead and completed jobs need no worker: their totals only tell, tick to tick, how many jobs
    finished (the pool's completion rate).
    """

    @property
    def pending_by_kind(self) -> Mapping[str, int]:
        """Jobs eligible to run now and not claimed."""
        ...

    @property
    def claimed_by_kind(self) -> Mapping[str, int]:
        """Jobs claimed by a worker and not yet settled."""
        ...

    @property
    def oldest_pending_age_by_kind(self) -> Mapping[str, float]:
        """Seconds the oldest eligible pending job of each kind has waited."""
        ...

    @property
    def completed_by_kind(self) -> Mapping[str, int]:
        """Completed jobs kept (a cleanup lowers it)."""
        ...

    @property
    def dead_by_kind(self) -> Mapping[str, int]:
        """Dead jobs kept (a cleanup lowers it)."""
        ...

    @property
    def paused(self) -> bool:
        """Whether the queue is paused: its pending jobs are no demand."""
        ...


class QueueStats(Protocol):
    """The runtime's ``venturi.Stats`` as scaling reads it: the same figures per queue."""

    @property
    def queues(self) -> Mapping[str, KindStats]:
        """Each queue's figures by kind, for every queue holding a job."""
        ...

    @property
    def pending_by_kind(self) -> Mapping[str, int]:
        """Jobs eligible to run now and not claimed, over all queues."""
        ...

    @property
    def claimed_by_kind(self) -> Mapping[str, int]:
        """Jobs claimed by a worker and not yet settled, over all queues."""
        ...


def pool_loads(
    spec: JobQueueSpec,
    stats: QueueStats,
    coverage: Mapping[str, Coverage | None] | None = None,
) -> dict[str, PoolLoad]:
    """Each pool's load, keyed by deployment in spec order.

    A pool's load sums the jobs of the (queue, kind) pairs it serves (see
    :meth:`JobQueueSpec.pool_for`); pending jobs of a paused queue count as pending and as
    ``paused``; pending jobs of a pair its workers do not serve (``coverage``, by deployment:
    :mod:`venturi_operator.serving`) as pending and as ``unserved``. Neither has an age the
    pool must meet. Pairs no pool serves are in :func:`unserved_kinds`.
    """
    unserved_pairs = unserved_by_pool(spec, stats, coverage or {})
    pending = {pool.deployment: 0 for pool in spec.pools}
    claimed = dict(pending)
    finished = dict(pending)
    paused = dict(pending)
    unserved = dict(pending)
    oldest: dict[str, float | None] = dict.fromkeys(pending)
    for queue, q in stats.queues.items():
        kinds = (
            set(q.pending_by_kind)
            | set(q.claimed_by_kind)
            | set(q.oldest_pending_age_by_kind)
            | set(q.completed_by_kind)
            | set(q.dead_by_kind)
        )
        for kind in kinds:
            pool = spec.pool_for(kind, queue)
            if pool is None:
                continue
            name = pool.deployment
            waiting = q.pending_by_kind.get(kind, 0)
            pending[name] += waiting
            no_demand = q.paused or (queue, kind) in unserved_pairs[name]
            if q.paused:
                paused[name] += waiting
            elif no_demand:
                unserved[name] += waiting
            claimed[name] += q.claimed_by_kind.get(kind, 0)
            finished[name] += q.completed_by_kind.get(kind, 0) + q.dead_by_kind.get(kind, 0)
            age = q.oldest_pending_age_by_kind.get(kind)
            if age is not None and waiting > 0 and not no_demand:
                # Database time can be a hair ahead of a job's run_at; an age is never negative.
                age = max(0.0, age)
                current = oldest[name]
                oldest[name] = age if current is None else max(current, age)
    coverage = coverage or {}
    return {
        name: PoolLoad(
            pending=pending[name],
            claimed=claimed[name],
            oldest_pending_age=oldest[name],
            finished=finished[name],
            paused=paused[name],
            unserved=unserved[name],
            probe=getattr(coverage.get(name), "probe", False),
        )
        for name in pending
    }


def unserved_by_pool(
    spec: JobQueueSpec, stats: QueueStats, coverage: Mapping[str, Coverage | None]
) -> dict[str, frozenset[tuple[str, str]]]:
    """Per pool (by deployment, every pool), the (queue, kind) pairs with pending jobs that
    the spec routes to it and its workers do not serve, by its coverage (none known: none)."""
    found: dict[str, set[tuple[str, str]]] = {pool.deployment: set() for pool in spec.pools}
    for queue, q in stats.queues.items():
        for kind, n in q.pending_by_kind.items():
            pool = spec.pool_for(kind, queue) if n > 0 else None
            if pool is None:
                continue
            known = coverage.get(pool.deployment)
            if known is not None and not known.serves(queue, kind):
                found[pool.deployment].add((queue, kind))
    return {name: frozenset(pairs) for name, pairs in found.items()}


def unserved_kinds(spec: JobQueueSpec, stats: QueueStats) -> frozenset[str]:
    """Kinds with pending or claimed jobs, in some queue, that no pool serves there (worth a
    warning in status)."""
    return frozenset(
        kind
        for queue, q in stats.queues.items()
        for by_kind in (q.pending_by_kind, q.claimed_by_kind)
        for kind, n in by_kind.items()
        if n > 0 and spec.pool_for(kind, queue) is None
    )


# --- parsing -------------------------------------------------------------------------------------


@contextmanager
def _under(path: str) -> Iterator[None]:
    """Re-raise a constructor's ``"field: problem"`` ValueError with the object's CRD path.

    Only constructors run inside it: the parsing helpers raise with full paths already.
    """
    try:
        yield
    except SpecError as exc:
        raise SpecError(f"{path}.{exc.field}", exc.problem) from exc
    except ValueError as exc:  # the policy's own dataclasses speak the same "field: problem"
        field, _, problem = str(exc).partition(": ")
        raise SpecError(f"{path}.{field}", problem) from exc


def _type_name(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


def _object(raw: object, path: str, fields: Sequence[str]) -> Mapping[str, object]:
    """``raw`` as a mapping with only known fields; null values count as absent, as in the CRD."""
    if not isinstance(raw, Mapping):
        raise SpecError(path, f"expected an object, got {_type_name(raw)}")
    result: dict[str, object] = {}
    for key, value in raw.items():
        if key not in fields:
            raise SpecError(f"{path}.{key}", f"unknown field (known: {', '.join(fields)})")
        if value is not None:
            result[str(key)] = value
    return result


def _required(obj: Mapping[str, object], key: str, path: str) -> object:
    if key not in obj:
        raise SpecError(f"{path}.{key}", "required field is missing")
    return obj[key]


def _int(raw: object, path: str) -> int:
    # bool is an int in Python but not in JSON; floats like 3.0 are not integers in the schema.
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise SpecError(path, f"expected an integer, got {_type_name(raw)} {raw!r}")
    return raw


def _number(raw: object, path: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise SpecError(path, f"expected a number, got {_type_name(raw)} {raw!r}")
    return float(raw)


def _str(raw: object, path: str) -> str:
    if not isinstance(raw, str):
        raise SpecError(path, f"expected a string, got {_type_name(raw)} {raw!r}")
    return raw


def _bool(raw: object, path: str) -> bool:
    if not isinstance(raw, bool):
        raise SpecError(path, f"expected a boolean, got {_type_name(raw)} {raw!r}")
    return raw


def _list(raw: object, path: str) -> Sequence[object]:
    if isinstance(raw, str | bytes) or not isinstance(raw, Sequence):
        raise SpecError(path, f"expected a list, got {_type_name(raw)}")
    return raw


def _opt_int(obj: Mapping[str, object], key: str, path: str) -> int | None:
    return _int(obj[key], f"{path}.{key}") if key in obj else None


def _int_or(obj: Mapping[str, object], key: str, path: str, default: int) -> int:
    return _int(obj[key], f"{path}.{key}") if key in obj else default


def parse_spec(spec: Mapping[str, object]) -> JobQueueSpec:
    """Parse and check a JobQueue's ``spec``, filling in the CRD's defaults."""
    path = "spec"
    obj = _object(spec, path, ("database", "interval", "paused", "pools"))
    database = _parse_database(_required(obj, "database", path), f"{path}.database")
    raw_pools = _list(_required(obj, "pools", path), f"{path}.pools")
    pools = tuple(_parse_pool(raw, f"{path}.pools[{i}]") for i, raw in enumerate(raw_pools))
    interval = _int_or(obj, "interval", path, DEFAULT_INTERVAL)
    paused = _bool(obj["paused"], f"{path}.paused") if "paused" in obj else False
    with _under(path):
        return JobQueueSpec(database=database, pools=pools, interval=interval, paused=paused)


def _parse_database(raw: object, path: str) -> DatabaseRef:
    obj = _object(raw, path, ("secretName", "key", "prefix"))
    secret_name = _str(_required(obj, "secretName", path), f"{path}.secretName")
    key = _str(obj["key"], f"{path}.key") if "key" in obj else DEFAULT_SECRET_KEY
    prefix = _str(obj["prefix"], f"{path}.prefix") if "prefix" in obj else DEFAULT_PREFIX
    with _under(path):
        return DatabaseRef(secret_name=secret_name, key=key, prefix=prefix)


_POOL_FIELDS = (
    "deployment",
    "kinds",
    "queues",
    "minReplicas",
    "maxReplicas",
    "targetPerReplica",
    "maxOldestPendingAge",
    "activationThreshold",
    "cooldownSeconds",
    "fallbackReplicas",
    "behavior",
)


def _parse_pool(raw: object, path: str) -> PoolSpec:
    obj = _object(raw, path, _POOL_FIELDS)
    deployment = _str(_required(obj, "deployment", path), f"{path}.deployment")
    kinds = None
    if "kinds" in obj:
        raw_kinds = _list(obj["kinds"], f"{path}.kinds")
        kinds = tuple(_str(kind, f"{path}.kinds[{i}]") for i, kind in enumerate(raw_kinds))
    queues = None
    if "queues" in obj:
        raw_queues = _list(obj["queues"], f"{path}.queues")
        queues = tuple(_str(q, f"{path}.queues[{i}]") for i, q in enumerate(raw_queues))
    min_replicas = _int_or(obj, "minReplicas", path, DEFAULT_MIN_REPLICAS)
    max_replicas = _int(_required(obj, "maxReplicas", path), f"{path}.maxReplicas")
    target = _int(_required(obj, "targetPerReplica", path), f"{path}.targetPerReplica")
    max_age = _opt_int(obj, "maxOldestPendingAge", path)
    activation = _int_or(obj, "activationThreshold", path, DEFAULT_ACTIVATION_THRESHOLD)
    cooldown = _int_or(obj, "cooldownSeconds", path, DEFAULT_COOLDOWN_SECONDS)
    fallback = _opt_int(obj, "fallbackReplicas", path)
    behavior = (
        _parse_behavior(obj["behavior"], f"{path}.behavior")
        if "behavior" in obj
        else DEFAULT_BEHAVIOR
    )
    with _under(path):
        return PoolSpec(
            deployment=deployment,
            kinds=kinds,
            queues=queues,
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            target_per_replica=target,
            max_oldest_pending_age=max_age,
            activation_threshold=activation,
            cooldown_seconds=cooldown,
            fallback_replicas=fallback,
            behavior=behavior,
        )


def _parse_behavior(raw: object, path: str) -> Behavior:
    obj = _object(raw, path, ("scaleUp", "scaleDown"))
    scale_up = _parse_rules(obj.get("scaleUp"), f"{path}.scaleUp", policy.DEFAULT_SCALE_UP)
    scale_down = _parse_rules(obj.get("scaleDown"), f"{path}.scaleDown", policy.DEFAULT_SCALE_DOWN)
    return Behavior(scale_up=scale_up, scale_down=scale_down)


def _parse_rules(raw: object, path: str, default: ScalingRules) -> ScalingRules | None:
    """One direction's rules, or None when the user set none (the policy's own then apply);
    each absent field of rules that are set takes the HPA's default for that direction."""
    if raw is None:
        return None
    obj = _object(
        raw, path, ("stabilizationWindowSeconds", "selectPolicy", "policies", "tolerance")
    )
    window = _int_or(obj, "stabilizationWindowSeconds", path, default.stabilization_window_seconds)
    policies = default.policies
    if "policies" in obj:
        raw_policies = _list(obj["policies"], f"{path}.policies")
        policies = tuple(
            _parse_policy(item, f"{path}.policies[{i}]") for i, item in enumerate(raw_policies)
        )
    select = default.select_policy
    if "selectPolicy" in obj:
        select = _enum(SelectPolicy, obj["selectPolicy"], f"{path}.selectPolicy")
    tolerance = default.tolerance
    if "tolerance" in obj:
        tolerance = _number(obj["tolerance"], f"{path}.tolerance")
    with _under(path):
        return ScalingRules(
            stabilization_window_seconds=window,
            policies=policies,
            select_policy=select,
            tolerance=tolerance,
        )


def _parse_policy(raw: object, path: str) -> ScalingPolicy:
    obj = _object(raw, path, ("type", "value", "periodSeconds"))
    kind = _enum(PolicyType, _required(obj, "type", path), f"{path}.type")
    value = _int(_required(obj, "value", path), f"{path}.value")
    period = _int(_required(obj, "periodSeconds", path), f"{path}.periodSeconds")
    with _under(path):
        return ScalingPolicy(type=kind, value=value, period_seconds=period)


_E = TypeVar("_E", PolicyType, SelectPolicy)


def _enum(enum_type: type[_E], raw: object, path: str) -> _E:
    value = _str(raw, path)
    try:
        return enum_type(value)
    except ValueError:
        allowed = ", ".join(member.value for member in enum_type)
        raise SpecError(path, f"expected one of {allowed}, got {value!r}") from None
