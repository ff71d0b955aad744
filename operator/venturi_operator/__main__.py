"""`venturi-operator`: run the operator (kopf) with its metrics endpoint.

venturi-operator --namespace jobs --metrics-port 8080 --log-level info --max-replicas 100
venturi-operator --all-namespaces
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

import kopf

from venturi_operator.config import DEFAULT_MAX_REPLICAS, OperatorConfig
from venturi_operator.databases import Databases
from venturi_operator.handlers import build_registry
from venturi_operator.kube import Kube
from venturi_operator.metrics import OperatorMetrics
from venturi_operator.reconcile import Reconciler


def parse_args(argv: Sequence[str] | None = None) -> tuple[OperatorConfig, str]:
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
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    parser.add_argument(
        "--max-replicas",
        type=int,
        default=DEFAULT_MAX_REPLICAS,
        help="refuse to scale a pool whose maxReplicas is above this (default %(default)s)",
    )
    args = parser.parse_args(argv)
    if not 1 <= args.max_replicas <= 2**31 - 1:
        parser.error(f"--max-replicas: expected 1 to {2**31 - 1}, got {args.max_replicas}")
    config = OperatorConfig(
        namespaces=tuple(args.namespace),
        metrics_port=args.metrics_port or None,
        metrics_host=args.metrics_host,
        liveness_endpoint=args.liveness or None,
        max_replicas=args.max_replicas,
    )
    return config, args.log_level


async def run(config: OperatorConfig, stop: asyncio.Event | None = None) -> None:
    """Run until `stop` is set (or the process is signalled)."""
    metrics = OperatorMetrics()
    if config.metrics_port is not None:
        metrics.serve(config.metrics_port, config.metrics_host)
    databases = Databases(config)
    reconciler = Reconciler(
        Kube.from_environment(), databases, metrics, max_replicas=config.max_replicas
    )
    registry = build_registry(reconciler)
    try:
        await kopf.operator(
            registry=registry,
            standalone=True,
            clusterwide=not config.namespaces,
            namespaces=list(config.namespaces),
            liveness_endpoint=config.liveness_endpoint,
            stop_flag=stop,
        )
    finally:
        await databases.close()


def main(argv: Sequence[str] | None = None) -> int:
    config, level = parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    kopf.configure(verbose=level == "debug")
    try:
        asyncio.run(run(config))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
