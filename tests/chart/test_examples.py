"""examples/: the JobQueue, the worker Deployment and the Secret agree with each other, with
the CRD's rules (through the operator's own spec parser) and with the image."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any

import pytest
import yaml

from venturi import Worker, logs
from venturi_operator.dsn import describe
from venturi_operator.kube import SCALE_ANNOTATION
from venturi_operator.spec import parse_spec

from .rendering import REPO

EXAMPLES = REPO / "examples"
RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


def load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text(encoding="utf-8"))
    return doc


def env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def test_every_manifest_parses_and_is_documented() -> None:
    manifests = sorted(EXAMPLES.rglob("*.yaml"))
    assert manifests
    readme = (EXAMPLES / "README.md").read_text(encoding="utf-8")
    for path in manifests:
        docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
        assert len(docs) == 1, path
        assert {"apiVersion", "kind", "metadata"} <= docs[0].keys(), path
        assert "namespace" not in docs[0]["metadata"], f"{path}: apply with -n instead"
        assert str(path.relative_to(EXAMPLES)) in readme, f"{path} is not in examples/README.md"


def test_the_keda_example_agrees_with_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    scaled, auth = load("keda/scaledobject.yaml"), load("keda/triggerauthentication.yaml")
    secret, worker = load("secret.yaml"), load("worker.yaml")
    assert scaled["spec"]["scaleTargetRef"]["name"] == worker["metadata"]["name"]
    [trigger] = scaled["spec"]["triggers"]
    assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    [ref] = auth["spec"]["secretTargetRef"]
    assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"]
    # The query names the kinds the example's workers run; a replica is their concurrency.
    monkeypatch.syspath_prepend(str(EXAMPLES))
    built = importlib.import_module("myapp.jobs").make_worker(object())
    kinds = ", ".join(f"'{k}'" for k in built.kinds)
    assert trigger["metadata"]["query"] == f"SELECT venturi_backlog('default', ARRAY[{kinds}])"
    assert trigger["metadata"]["targetQueryValue"] == str(built.concurrency)


def test_jobqueue_passes_the_operators_spec_checks() -> None:
    jobqueue = load("jobqueue.yaml")
    assert jobqueue["apiVersion"] == "venturi.dev/v1alpha1"
    assert jobqueue["kind"] == "JobQueue"
    spec = parse_spec(jobqueue["spec"])
    assert [p.deployment for p in spec.pools] == ["myapp-worker"]


def test_the_names_agree() -> None:
    jobqueue, secret, worker = load("jobqueue.yaml"), load("secret.yaml"), load("worker.yaml")
    database = jobqueue["spec"]["database"]
    assert secret["kind"] == "Secret" and secret["metadata"]["name"] == database["secretName"]
    assert database["key"] in secret["stringData"]
    assert worker["kind"] == "Deployment"
    assert worker["metadata"]["name"] == jobqueue["spec"]["pools"][0]["deployment"]
    # The Deployment opts in to being scaled by this JobQueue (the operator refuses otherwise).
    assert worker["metadata"]["annotations"][SCALE_ANNOTATION] == jobqueue["metadata"]["name"]
    (container,) = worker["spec"]["template"]["spec"]["containers"]
    variables = env(container)
    assert variables["VENTURI_DSN"]["valueFrom"]["secretKeyRef"] == {
        "name": database["secretName"],
        "key": database["key"],
    }
    assert variables["VENTURI_PREFIX"]["value"] == database["prefix"]
    assert variables["VENTURI_LOG_FORMAT"]["value"] in logs.FORMATS
    migrate = load("migrate-job.yaml")
    (job_container,) = migrate["spec"]["template"]["spec"]["containers"]
    assert env(job_container)["VENTURI_DSN"] == variables["VENTURI_DSN"]
    assert job_container["command"] == ["venturi", "migrate"]


def test_the_dsn_is_a_url_the_operator_can_describe() -> None:
    dsn = load("secret.yaml")["stringData"]["dsn"]
    assert dsn.startswith("postgresql://")
    assert describe(dsn) == "postgres.database.svc:5432/venturi"


def test_worker_deployment() -> None:
    worker = load("worker.yaml")
    assert worker["spec"]["replicas"] == 0
    pod = worker["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["venturi", "worker", "myapp.jobs:make_worker"]
    assert env(container)["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert RESTRICTED_CONTAINER.items() <= container["securityContext"].items()
    # Longer than the worker's shutdown_timeout, so a SIGTERM'd worker drains.
    assert pod["terminationGracePeriodSeconds"] > 30
    labels = worker["spec"]["template"]["metadata"]["labels"]
    selector = load("monitoring/worker-podmonitor.yaml")["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items()
    assert {"name": "metrics", "containerPort": 9100, "protocol": "TCP"} in container["ports"]


def test_the_factory_builds_a_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    jobs = importlib.import_module("myapp.jobs")
    parameters = inspect.signature(jobs.make_worker).parameters
    assert list(parameters) == ["store"]
    worker = jobs.make_worker(object())  # the store is only used when the worker runs
    assert isinstance(worker, Worker)
    assert worker.metrics_port == 9100
    concurrency = load("jobqueue.yaml")["spec"]["pools"][0]["targetPerReplica"]
    assert f"concurrency={concurrency}" in inspect.getsource(jobs)


def test_worker_dockerfile_adds_the_app_to_the_venturi_image() -> None:
    text = (EXAMPLES / "Dockerfile").read_text(encoding="utf-8")
    assert "FROM ${VENTURI_IMAGE}" in text
    assert "COPY myapp /app/myapp" in text
    assert Path(EXAMPLES / "myapp" / "__init__.py").is_file()
