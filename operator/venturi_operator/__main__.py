"""`venturi-operator`: run the operator (kopf) with its metrics endpoint.

venturi-operator --namespace jobs --metrics-port 8080 --log-level info --max-replicas 100
venturi-operator --all-namespaces --log-format json
venturi-operator --namespace jobs --leader-elect   # several replicas: one acts at a time

Logs go to stderr, as text or JSON lines (`--log-format`, env VENTURI_LOG_FORMAT), kopf's own
records included; a record about a JobQueue names it (`namespace`, `jobqueue`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kopf

from venturi import logs
from venturi.postgres import POOLERS
from venturi_operator.config import DEFAULT_MAX_REPLICAS, LeaderElection, OperatorConfig
from venturi_operator.databases import Databases
from venturi_operator.handlers import build_registry
from venturi_operator.kube import Kube
from venturi_operator.leadership import (
    SETTLE_SECONDS,
    Elector,
    LeadershipLost,
    answer_liveness,
    lead,
)
from venturi_operator.metrics import OperatorMetrics
from venturi_operator.reconcile import Reconciler

logger = logging.getLogger("venturi_operator")

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
"""Where a pod reads its own namespace (the Lease's default namespace)."""


@dataclass(frozen=True, slots=True)
class Logging:
    """--log-format and --log-level, checked."""

    format: str
    level: str


class JsonFormatter(logs.JsonFormatter):
    """venturi's JSON lines, with the JobQueue a record is about: kopf's per-object records
    carry a reference to it (`k8s_ref`), the operator's own pass `namespace` and `jobqueue`."""

    def fields(self, record: logging.LogRecord) -> Mapping[str, object]:
        ref = getattr(record, "k8s_ref", None)
        if isinstance(ref, dict) and ref.get("kind") == "JobQueue":  # the only kind it handles
            found = {"namespace": ref.get("namespace"), "jobqueue": ref.get("name")}
        else:
            found = {k: getattr(record, k, None) for k in ("namespace", "jobqueue")}
        return {k: v for k, v in found.items() if v is not None}


def parse_args(argv: Sequence[str] | None = None) -> tuple[OperatorConfig, Logging]:
    parser = argparse.ArgumentParser(
        prog="venturi-operator", description="Scale venturi worker Deployments from their queues."
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n", "--namespace", action="append", default=[], help="namespace to watch (repeatable)"
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    parser.add_argument("--metrics-port", type=int, default=8080, help="0 disables /metrics")
    parser.add_argument("--metrics-host", default="0.0.0.0")
    parser.add_argument(
        "--liveness", default="http://0.0.0.0:8081/healthz", help="kopf liveness endpoint ('' off)"
    )
    parser.add_argument(
        "--log-level",
        default=os.environ.get("VENTURI_LOG_LEVEL", "info"),
        help="debug, info, warning or error (env VENTURI_LOG_LEVEL, default info)",
    )
    parser.add_argument(
        "--log-format",
        default=os.environ.get("VENTURI_LOG_FORMAT", "text"),
        help="text or json, one object per line (env VENTURI_LOG_FORMAT, default text)",
    )
    parser.add_argument(
        "--pooler",
        default=os.environ.get("VENTURI_OPERATOR_POOLER", "none"),
        help="transaction: the queues' databases are reached through PgBouncer in transaction "
        "mode; no session state, no LISTEN (env VENTURI_OPERATOR_POOLER, default none)",
    )
    parser.add_argument(
        "--max-replicas",
        type=int,
        default=DEFAULT_MAX_REPLICAS,
        help="refuse to scale a pool whose maxReplicas is above this (default %(default)s)",
    )
    parser.add_argument(
        "--leader-elect",
        action="store_true",
        help="run as one of several replicas: they elect a leader through a Lease, and only "
        "it acts (the others wait to take over)",
    )
    parser.add_argument(
        "--leader-election-namespace",
        default=os.environ.get("POD_NAMESPACE", ""),
        help="the Lease's namespace (default: env POD_NAMESPACE, else the pod's own)",
    )
    parser.add_argument(
        "--leader-election-name",
        default="venturi-operator",
        help="the Lease's name (default %(default)s): replicas that share it elect one leader",
    )
    args = parser.parse_args(argv)
    if not 1 <= args.max_replicas <= 2**31 - 1:
        parser.error(f"--max-replicas: expected 1 to {2**31 - 1}, got {args.max_replicas}")
    # Checked here, not by `choices`: argparse does not check a default from the environment.
    if args.log_level.lower() not in logs.LEVELS:
        parser.error(
            f"--log-level: expected one of {', '.join(logs.LEVELS)}, got {args.log_level!r}"
        )
    if args.log_format not in logs.FORMATS:
        parser.error(f"--log-format: expected text or json, got {args.log_format!r}")
    if args.pooler not in POOLERS:
        parser.error(f"--pooler: expected none or transaction, got {args.pooler!r}")
    election = None
    if args.leader_elect:
        namespace = args.leader_election_namespace or _own_namespace()
        if not namespace:
            parser.error(
                "--leader-elect: give the Lease's namespace (--leader-election-namespace, or "
                "env POD_NAMESPACE): not in a pod, there is no namespace of its own"
            )
        election = LeaderElection(
            namespace=namespace,
            name=args.leader_election_name,
            identity=f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}",
        )
    config = OperatorConfig(
        leader_election=election,
        namespaces=tuple(args.namespace),
        metrics_port=args.metrics_port or None,
        metrics_host=args.metrics_host,
        liveness_endpoint=args.liveness or None,
        max_replicas=args.max_replicas,
        pooler=args.pooler,
    )
    return config, Logging(args.log_format, args.log_level.lower())


def _own_namespace() -> str:
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    except OSError:
        return ""


async def run(config: OperatorConfig, stop: asyncio.Event | None = None) -> None:
    """Run until `stop` is set (or the process is signalled). With leader election, wait to
    lead first; raises `LeadershipLost` if the lease is lost while leading (the process then
    exits, and its restart waits as a follower)."""
    metrics = OperatorMetrics()
    if config.metrics_port is not None:
        metrics.serve(config.metrics_port, config.metrics_host)
    kube = Kube.from_environment()
    databases = Databases(config)
    reconciler = Reconciler(kube, databases, metrics, max_replicas=config.max_replicas)
    registry = build_registry(reconciler)
    election = config.leader_election

    async def operate(flag: asyncio.Event | None) -> None:
        await kopf.operator(
            registry=registry,
            standalone=True,
            clusterwide=not config.namespaces,
            namespaces=list(config.namespaces),
            liveness_endpoint=config.liveness_endpoint,
            stop_flag=flag,
        )

    try:
        if election is None:
            metrics.leader.set(1)
            await operate(stop)
            return
        # The Lease's client has a thread of its own: renewals never queue behind the
        # reconcile calls of many JobQueues on a slow API server.
        lease_kube = Kube(kube.api, executor=ThreadPoolExecutor(1, thread_name_prefix="lease"))
        elector = Elector(lease_kube, election.namespace, election.name, election.identity)
        # Nothing the reconciler asks of the API server lands once a follower may lead.
        kube.within_lease(elector.time_left)
        # Also what stops kopf when the lease is lost.
        stopping = stop if stop is not None else asyncio.Event()

        @kopf.on.cleanup(registry=registry)
        async def give_up_the_lease(**_: Any) -> None:
            # As soon as the JobQueue loops have stopped (a SIGTERM), and their requests
            # still in flight have landed, not after the rest of kopf's shutdown: a follower
            # takes over at its next look. Setting the flag ends kopf's own wait on it (it
            # would wait 5 s for that task).
            stopping.set()
            if not await kube.settled(SETTLE_SECONDS):
                logger.warning("API requests still in flight after %gs", SETTLE_SECONDS)
            await elector.release()

        metrics.leader.set(0)
        # kopf answers the liveness probe and handles SIGTERM once it runs; until then, this
        # (its handlers replace these as it starts: no moment without either).
        if stop is None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stopping.set)
        async with answer_liveness(config.liveness_endpoint):
            if not await elector.acquire(stopping):
                return
        metrics.leader.set(1)
        try:
            await lead(elector, operate(stopping), stopping)
        finally:
            metrics.leader.set(0)
            await elector.release()
    finally:
        await databases.close()


def main(argv: Sequence[str] | None = None) -> int:
    config, log = parse_args(argv)
    # One handler for every record, kopf's included: kopf.configure() would add a second
    # (each line twice) and reset the level to info.
    logs.configure(log.format, log.level, json_formatter=JsonFormatter, quote_errors=False)
    if log.level != "debug":
        logging.getLogger("asyncio").setLevel(logging.WARNING)  # as kopf does, keeping errors
    try:
        asyncio.run(run(config))
    except KeyboardInterrupt:
        return 130
    except LeadershipLost:
        return 1  # restarted, it waits as a follower
    return 0


if __name__ == "__main__":
    sys.exit(main())
