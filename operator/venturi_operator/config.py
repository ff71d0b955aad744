"""The operator's settings: frozen, keyword-only, with the reason for each default."""

from __future__ import annotations

from dataclasses import dataclass, field

from venturi.postgres import POOLERS, Pooler

DEFAULT_MAX_REPLICAS = 100
"""KEDA's default maxReplicaCount: room for real backlogs, not for a typo's 10,000 pods."""


@dataclass(frozen=True, kw_only=True)
class LeaderElection:
    """Elect one leader among the operator's replicas (see `leadership`): only it acts."""

    namespace: str
    """Where the Lease is: the operator's own namespace."""
    name: str = "venturi-operator"
    """The Lease's name: replicas that share it elect one leader among them."""
    identity: str
    """This replica's name in the Lease: its pod's, and a suffix of its own, so that a
    restarted container is not taken for the leader it was."""


@dataclass(frozen=True, kw_only=True)
class OperatorConfig:
    namespaces: tuple[str, ...] = field(default_factory=tuple)
    """Namespaces to watch; empty means every namespace (cluster-wide)."""
    metrics_port: int | None = 8080
    """Port of the Prometheus /metrics endpoint (None: no endpoint)."""
    metrics_host: str = "0.0.0.0"
    liveness_endpoint: str | None = "http://0.0.0.0:8081/healthz"
    """kopf's liveness probe endpoint (None: no probe)."""
    connect_timeout: float = 5.0
    """Seconds to connect to a queue's database: a dead database must not stall a tick."""
    statement_timeout: float = 5.0
    """Seconds a stats query may run (enforced by PostgreSQL and by the client)."""
    pool_size: int = 4
    """Connections per distinct database: one LISTEN connection for all its queues' wake-ups,
    and three for the stats queries of every JobQueue on it (each takes about a millisecond)."""
    application_name: str = "venturi-operator"
    """How the operator's connections show in pg_stat_activity."""
    pooler: Pooler = "none"
    """"transaction" when the queues' DSNs go through PgBouncer (or another pooler) in
    transaction mode (`PostgresStore.connect(pooler=)`): the operator then keeps no session
    state and does not LISTEN, so pools wake on their `interval` only, not on NOTIFY."""
    leader_election: LeaderElection | None = None
    """Elect a leader among replicas through a Lease (None: act alone, as one replica)."""
    max_replicas: int = DEFAULT_MAX_REPLICAS
    """The most replicas any pool may ask for: a pool whose maxReplicas is higher is not
    scaled at all. Whoever may create a JobQueue must not be able to order unbounded pods."""

    def __post_init__(self) -> None:
        if self.pooler not in POOLERS:
            raise ValueError(f"pooler: expected none or transaction, got {self.pooler!r}")
        if isinstance(self.max_replicas, bool) or not 1 <= self.max_replicas <= 2**31 - 1:
            raise ValueError(f"max_replicas: expected 1 to {2**31 - 1}, got {self.max_replicas!r}")
