"""The operator's Deployment, RBAC, Service and labels, as `helm template` renders them."""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from .rendering import (
    CHART,
    INSTALL,
    NAMESPACE,
    HelmError,
    Object,
    helm,
    of_kind,
    one,
    operator_container,
    render,
    template_text,
)

ALL_MONITORING = {
    "monitoring": {
        "serviceMonitor": {"enabled": True, "additionalLabels": {"release": "kps"}},
        "prometheusRule": {"enabled": True, "additionalLabels": {"release": "kps"}},
        "grafanaDashboards": {"enabled": True},
    }
}

# What the operator does, exactly (kube.py, handlers.py and kopf); sorted for comparison.
EXPECTED_RULES = sorted(
    [
        ("venturi.dev", "jobqueues", ("get", "list", "patch", "watch")),
        ("venturi.dev", "jobqueues/status", ("get", "patch")),
        ("apps", "deployments", ("get",)),
        ("apps", "deployments/scale", ("get", "patch")),
        ("", "pods", ("get", "list", "patch")),
        ("autoscaling", "horizontalpodautoscalers", ("list",)),
        ("keda.sh", "scaledobjects", ("list",)),
        ("", "secrets", ("get",)),
        ("", "events", ("create", "patch")),
    ]
)


ELECTION = "venturi-leader-election"
"""The leader election's Role and RoleBinding (in the release's namespace), by name."""


def watched(docs: list[Object], kind: str) -> list[Object]:
    """The Roles (or RoleBindings) of the watched namespaces: every one but the election's."""
    return [
        d for d in of_kind(docs, kind) if not d["metadata"]["name"].endswith("-leader-election")
    ]


def flat_rules(role: Object) -> list[tuple[str, str, tuple[str, ...]]]:
    out = []
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs", "resourceNames"}, rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.append((group, resource, tuple(sorted(rule["verbs"]))))
    return sorted(out)


def test_lint_strict_passes_with_the_required_values_and_with_everything_on() -> None:
    for values in (INSTALL, {**INSTALL, **ALL_MONITORING}):
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", encoding="utf-8") as f:
            yaml.safe_dump(values, f)
            f.flush()
            helm("lint", "--strict", "--values", f.name)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({}, "operator.watchNamespaces is required"),
        ({"operator": {"watchNamespaces": ["jobs"]}}, "rbac.secretNames is required"),
        ({"operator": {"watchAllNamespaces": True}}, "rbac.secretNames is required"),
        (
            {"operator": {"watchNamespaces": ["jobs"], "watchAllNamespaces": True}},
            "exclude each other",
        ),
        (
            {
                "operator": {"watchNamespaces": ["jobs"]},
                "rbac": {"secretNames": ["a"], "readAllSecrets": True},
            },
            "exclude each other",
        ),
    ],
)
def test_the_defaults_grant_nothing_cluster_wide_they_ask(values: Object, message: str) -> None:
    """Without the namespaces and the Secrets, the chart fails with what to set: it never
    falls back to reading every Secret of the cluster."""
    with pytest.raises(HelmError, match=re.escape(message)) as failed:
        template_text(values, base=None)
    assert "--set" in str(failed.value) or "exclude" in message


def test_default_objects() -> None:
    kinds = sorted(d["kind"] for d in render())
    assert kinds == [
        "CustomResourceDefinition",
        "Deployment",
        "NetworkPolicy",
        "Role",
        "Role",  # the leader election's, in the release's namespace
        "RoleBinding",
        "RoleBinding",
        "Service",
        "ServiceAccount",
    ]


def test_operator_deployment() -> None:
    docs = render()
    deployment = one(docs, "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    # Never an old operator that does not elect beside a new one that leads (an upgrade).
    assert spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    container = operator_container(docs)
    assert container["image"] == "venturi:0.1.0"  # the chart's appVersion
    assert container["command"] == ["venturi-operator"]
    assert container["args"] == [
        "--namespace=jobs",
        "--max-replicas=100",
        "--metrics-port=8080",
        "--liveness=http://0.0.0.0:8081/healthz",
        "--log-level=info",
        "--log-format=text",
        "--leader-elect",
        "--leader-election-name=venturi",
    ]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env == {"POD_NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080, "healthz": 8081}
    for probe in ("livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert container["resources"]["requests"] == {"cpu": "50m", "memory": "128Mi"}
    assert container["resources"]["limits"] == {"memory": "256Mi"}


def test_security_context_is_restricted() -> None:
    docs = render()
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    container = operator_container(docs)
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    # The read-only root filesystem gets a writable /tmp.
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert any(v["name"] == "tmp" and "emptyDir" in v for v in pod["volumes"])


def test_cluster_wide_rbac_only_when_asked() -> None:
    docs = render({"operator": {"watchNamespaces": [], "watchAllNamespaces": True}})
    assert watched(docs, "Role") == [] and watched(docs, "RoleBinding") == []
    role = one(docs, "ClusterRole")
    assert flat_rules(role) == EXPECTED_RULES
    assert secrets_rule(role)["resourceNames"] == ["venturi-db"]  # by name, even cluster-wide
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    account = one(docs, "ServiceAccount")["metadata"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": NAMESPACE}
    ]
    assert "--all-namespaces" in operator_container(docs)["args"]


def secrets_rule(role: Object) -> Object:
    [rule] = [r for r in role["rules"] if "secrets" in r["resources"]]
    return dict(rule)


def test_watched_namespaces_get_roles_and_flags() -> None:
    docs = render({"operator": {"watchNamespaces": ["jobs", "batch"]}})
    assert of_kind(docs, "ClusterRole") == [] and of_kind(docs, "ClusterRoleBinding") == []
    roles = watched(docs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["batch", "jobs"]
    for role in roles:
        assert flat_rules(role) == EXPECTED_RULES
    bindings = watched(docs, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["batch", "jobs"]
    for binding in bindings:
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"][0]["namespace"] == NAMESPACE
    args = operator_container(docs)["args"]
    assert args[:2] == ["--namespace=jobs", "--namespace=batch"]
    assert "--all-namespaces" not in args


def test_secret_names_restrict_only_the_secrets_rule() -> None:
    docs = render({"rbac": {"secretNames": ["db-a", "db-b"]}})
    [role] = watched(docs, "Role")
    restricted = [r for r in role["rules"] if "resourceNames" in r]
    assert restricted == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "verbs": ["get"],
            "resourceNames": ["db-a", "db-b"],
        }
    ]
    assert flat_rules(role) == EXPECTED_RULES


def test_every_secret_only_when_asked() -> None:
    docs = render({"rbac": {"secretNames": [], "readAllSecrets": True}})
    [role] = watched(docs, "Role")
    assert "resourceNames" not in secrets_rule(role)
    assert flat_rules(role) == EXPECTED_RULES


def test_network_policy_admits_only_metrics_and_health() -> None:
    docs = render()
    policy = one(docs, "NetworkPolicy")["spec"]
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["policyTypes"] == ["Ingress"]  # egress: the API server and any database
    assert [rule["ports"] for rule in policy["ingress"]] == [
        [{"port": "metrics", "protocol": "TCP"}],
        [{"port": "healthz", "protocol": "TCP"}],
    ]
    assert all("from" not in rule for rule in policy["ingress"])
    container_ports = {p["name"] for p in operator_container(docs)["ports"]}
    assert container_ports == {"metrics", "healthz"}  # the named ports exist

    scrapers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}}]
    narrowed = one(render({"networkPolicy": {"metricsFrom": scrapers}}), "NetworkPolicy")
    assert narrowed["spec"]["ingress"][0]["from"] == scrapers
    assert "from" not in narrowed["spec"]["ingress"][1]
    assert of_kind(render({"networkPolicy": {"enabled": False}}), "NetworkPolicy") == []


def test_max_replicas_reaches_the_operator() -> None:
    args = operator_container(render({"operator": {"maxReplicas": 7}}))["args"]
    assert "--max-replicas=7" in args


def test_the_pooler_reaches_the_operator() -> None:
    args = operator_container(render({"operator": {"pooler": "transaction"}}))["args"]
    assert "--pooler=transaction" in args


def test_rbac_and_service_account_can_be_left_out() -> None:
    docs = render(
        {
            "rbac": {"create": False, "secretNames": []},
            "serviceAccount": {"create": False, "name": "mine"},
        }
    )
    for kind in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount"):
        assert of_kind(docs, kind) == []
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "mine"
    with pytest.raises(HelmError, match=r"serviceAccount\.name is required"):
        template_text({"serviceAccount": {"create": False}})


def test_metrics_service_selects_the_operator_pod() -> None:
    docs = render()
    service = one(docs, "Service")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}
    ]
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


def test_every_object_has_the_recommended_labels() -> None:
    docs = render({**ALL_MONITORING, "operator": {"watchNamespaces": ["jobs"]}})
    for doc in docs:
        labels = doc["metadata"]["labels"]
        where = f"{doc['kind']} {doc['metadata']['name']}"
        assert labels["app.kubernetes.io/name"] == "venturi", where
        assert labels["app.kubernetes.io/instance"] == "venturi", where
        assert labels["app.kubernetes.io/version"] == "0.1.0", where
        assert labels["app.kubernetes.io/managed-by"] == "Helm", where
        assert labels["app.kubernetes.io/part-of"] == "venturi", where
        assert labels["app.kubernetes.io/component"] in {"operator", "crd", "dashboard"}, where
        assert labels["helm.sh/chart"] == "venturi-0.1.0", where


def test_names_follow_the_release() -> None:
    docs = render({"fullnameOverride": "jobs-operator"})
    assert one(docs, "Deployment")["metadata"]["name"] == "jobs-operator"
    assert [r["metadata"]["name"] for r in of_kind(docs, "Role")] == [
        "jobs-operator",
        "jobs-operator-leader-election",
    ]
    assert "--leader-election-name=jobs-operator" in operator_container(docs)["args"]


def test_escape_hatches_reach_the_pod() -> None:
    values: dict[str, Any] = {
        "image": {"repository": "registry.example/venturi", "tag": "1.2.3", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "extraEnv": [
            {"name": "TZ", "value": "UTC"},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        ],
        "podAnnotations": {"example.com/team": "jobs"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}
        ],
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "1Gi"}},
        "operator": {"logLevel": "debug", "logFormat": "json"},
    }
    docs = render(values)
    template = one(docs, "Deployment")["spec"]["template"]
    pod = template["spec"]
    container = operator_container(docs)
    assert container["image"] == "registry.example/venturi:1.2.3"
    assert container["imagePullPolicy"] == "Always"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert container["env"][2:] == values["extraEnv"]  # after the election's two
    assert template["metadata"]["annotations"] == {"example.com/team": "jobs"}
    assert pod["nodeSelector"] == values["nodeSelector"]
    assert pod["tolerations"] == values["tolerations"]
    assert pod["affinity"] == values["affinity"]
    assert container["resources"] == values["resources"]
    assert "--log-level=debug" in container["args"]
    assert "--log-format=json" in container["args"]
    assert one(docs, "Deployment")["metadata"]["labels"]["app.kubernetes.io/version"] == "1.2.3"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicas": 2}, "additional properties 'replicas' not allowed"),
        ({"image": {"tga": "x"}}, "additional properties 'tga' not allowed"),
        ({"monitoring": {"serviceMonitor": {"enabld": True}}}, "'enabld' not allowed"),
        ({"securityContext": {"privilegd": True}}, "'privilegd' not allowed"),
        ({"operator": {"logLevel": "trace"}}, "logLevel"),
        ({"operator": {"logFormat": "yaml"}}, "logFormat"),
        ({"operator": {"watchNamespaces": ["Not_A_Namespace"]}}, "does not match pattern"),
        ({"crds": {"enabled": "yes"}}, "crds/enabled"),
        ({"operator": {"maxReplicas": 0}}, "maxReplicas"),
        ({"networkPolicy": {"metricsFrom": [{"podSelectr": {}}]}}, "'podSelectr' not allowed"),
    ],
)
def test_schema_rejects_unknown_keys_and_bad_values(values: Object, message: str) -> None:
    with pytest.raises(HelmError, match="schema") as failed:
        template_text(values)
    assert message in str(failed.value)


def test_service_monitor_and_pod_monitor_exclude_each_other() -> None:
    both = {"monitoring": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}}
    with pytest.raises(HelmError, match="cannot both be true"):
        template_text(both)


def notes(values: Object, tmp_path: Path) -> str:
    """NOTES.txt as `helm install` would print it (`helm template` never renders it): a copy
    of the chart renders it through `tpl` into a ConfigMap."""
    chart = tmp_path / "venturi"
    shutil.copytree(CHART, chart)
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes.txt")
    (chart / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\n"
        'data:\n  notes: {{ tpl (.Files.Get "notes.txt") . | toJson }}\n',
        encoding="utf-8",
    )
    docs = [d for d in yaml.safe_load_all(template_text(values, chart=chart)) if d]
    text: str = next(d for d in docs if d["metadata"]["name"] == "notes")["data"]["notes"]
    return text


def test_notes_print_a_ready_to_apply_jobqueue(tmp_path: Path) -> None:
    from venturi_operator.spec import parse_spec

    text = notes({"operator": {"watchNamespaces": ["jobs"]}}, tmp_path)
    assert "It watches JobQueues in: jobs." in text
    block = text.split("<<'YAML'\n", 1)[1].split("\n  YAML\n", 1)[0]
    jobqueue = yaml.safe_load("\n".join(line.removeprefix("  ") for line in block.splitlines()))
    assert jobqueue["apiVersion"] == "venturi.dev/v1alpha1" and jobqueue["kind"] == "JobQueue"
    assert jobqueue["metadata"]["namespace"] == "jobs"
    parse_spec(jobqueue["spec"])  # the operator's own backstop validation of the CRD's rules


def test_the_leader_election_may_write_its_lease_only() -> None:
    docs = render({"operator": {"watchNamespaces": ["jobs"]}})
    [role] = [r for r in of_kind(docs, "Role") if r["metadata"]["name"] == ELECTION]
    assert role["metadata"]["namespace"] == NAMESPACE  # the release's, not a watched one
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["venturi"],
            "verbs": ["get", "update"],
        },
    ]
    [binding] = [b for b in of_kind(docs, "RoleBinding") if b["metadata"]["name"] == ELECTION]
    assert binding["metadata"]["namespace"] == NAMESPACE
    assert binding["roleRef"]["name"] == ELECTION
    account = one(docs, "ServiceAccount")["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
    ]


def test_replicas_need_the_leader_election() -> None:
    docs = render({"operator": {"replicas": 2}})
    assert one(docs, "Deployment")["spec"]["replicas"] == 2
    alone = render({"operator": {"leaderElection": False}})
    assert one(alone, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    container = operator_container(alone)
    assert not any(a.startswith("--leader-elect") for a in container["args"])
    assert "env" not in container
    assert [r["metadata"]["name"] for r in of_kind(alone, "Role")] == ["venturi"]
    with pytest.raises(HelmError, match=r"replicas above 1 needs operator\.leaderElection"):
        template_text({"operator": {"replicas": 2, "leaderElection": False}})
