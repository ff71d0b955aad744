"""ServiceMonitor, PodMonitor, PrometheusRule and the Grafana dashboards: only when enabled,
labelled for the Prometheus Operator and Grafana's sidecar, and valid (promtool, JSON)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from .rendering import CHART, Object, of_kind, one, render

MONITORING_KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap")
DASHBOARDS = sorted(p.name for p in (CHART / "dashboards").glob("*.json"))


def enabled(**parts: Object) -> Object:
    return {"monitoring": {name: {"enabled": True, **extra} for name, extra in parts.items()}}


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert shutil.which("promtool"), "promtool is installed by scripts/test (Debian: prometheus)"
    return subprocess.run(
        ["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def rule_groups(values: Object | None = None) -> list[Object]:
    rule = one(render(values or enabled(prometheusRule={})), "PrometheusRule")
    groups: list[Object] = rule["spec"]["groups"]
    return groups


def test_nothing_for_monitoring_by_default() -> None:
    docs = render()
    for kind in MONITORING_KINDS:
        assert of_kind(docs, kind) == [], kind


@pytest.mark.parametrize("kind", ["serviceMonitor", "podMonitor"])
def test_monitor_scrapes_the_metrics_port_with_extra_labels(kind: str) -> None:
    docs = render(enabled(**{kind: {"additionalLabels": {"release": "kps"}, "interval": "15s"}}))
    monitor = one(docs, kind[0].upper() + kind[1:])
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["metadata"]["labels"]["app.kubernetes.io/name"] == "venturi"
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["venturi-system"]}
    endpoints = monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"]
    assert endpoints == [
        {"port": "metrics", "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s"}
    ]
    others = {"ServiceMonitor", "PodMonitor"} - {monitor["kind"]}
    assert all(of_kind(docs, other) == [] for other in others)


def test_prometheus_rule_has_the_alerts_and_labels() -> None:
    values = enabled(
        prometheusRule={"additionalLabels": {"release": "kps"}, "alertLabels": {"team": "jobs"}}
    )
    rule = one(render(values), "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kps"
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert sorted(alerts) == [
        "VenturiDeadJobsGrowing",
        "VenturiJobQueueNotReconciled",
        "VenturiJobQueueStatsUnavailable",
        "VenturiOldestPendingAgeAboveTarget",
        "VenturiPoolAtMaxReplicas",
        "VenturiReconcileErrors",
    ]
    for name, alert in alerts.items():
        assert alert["labels"] == {"severity": "warning", "team": "jobs"}, name
        assert {"summary", "description"} <= alert["annotations"].keys(), name
        # Prometheus' own templates reach it untouched (not eaten by Helm).
        assert "{{ $labels." in alert["annotations"]["summary"], name


def test_rendered_rules_pass_promtool_check(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups()}))
    result = promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 6 rules found" in result.stdout


JQ = 'jobqueue_namespace="jobs",jobqueue="myapp"'
OP = 'namespace="venturi-system",pod="venturi-0"'  # target labels Prometheus adds


def series(name: str, labels: str, values: str) -> Object:
    return {"series": f"{name}{{{JQ},{OP}{',' + labels if labels else ''}}}", "values": values}


def alert(name: str, at: str, *expected: dict[str, str]) -> Object:
    return {
        "eval_time": at,
        "alertname": name,
        "exp_alerts": [{"exp_labels": {"severity": "warning", **labels}} for labels in expected],
    }


def test_alerts_fire_on_the_operators_series(tmp_path: Path) -> None:
    """promtool's rule unit tests, on series shaped like the operator's /metrics."""
    groups = rule_groups()
    for group in groups:
        for rule in group["rules"]:
            rule.pop("annotations")  # the expressions are under test, not the prose
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    jq = {"jobqueue_namespace": "jobs", "jobqueue": "myapp"}
    tests: dict[str, Any] = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    series("venturi_jobqueue_stats_up", "", "1x3 0x30"),
                    # Ticks every minute until minute 5, then no more (interval 15 s).
                    series("venturi_jobqueue_last_tick_timestamp_seconds", "", "0+60x5 300x30"),
                    series("venturi_jobqueue_interval_seconds", "", "15x40"),
                    # pool "slow": oldest job 120 s over its 60 s target; pool "ok" under it.
                    series("venturi_pool_oldest_pending_age_seconds", 'pool="slow"', "120x30"),
                    series("venturi_pool_max_oldest_pending_age_seconds", 'pool="slow"', "60x30"),
                    series("venturi_pool_oldest_pending_age_seconds", 'pool="ok"', "10x30"),
                    series("venturi_pool_max_oldest_pending_age_seconds", 'pool="ok"', "60x30"),
                    # "slow" wants its 10 max replicas with work pending; "ok" is below max,
                    # "fixed" is at max (min == max) with nothing pending.
                    series("venturi_pool_desired_replicas", 'pool="slow"', "10x30"),
                    series("venturi_pool_max_replicas", 'pool="slow"', "10x30"),
                    series("venturi_pool_pending_jobs", 'pool="slow"', "500x30"),
                    series("venturi_pool_desired_replicas", 'pool="ok"', "3x30"),
                    series("venturi_pool_max_replicas", 'pool="ok"', "10x30"),
                    series("venturi_pool_pending_jobs", 'pool="ok"', "40x30"),
                    series("venturi_pool_desired_replicas", 'pool="fixed"', "2x30"),
                    series("venturi_pool_max_replicas", 'pool="fixed"', "2x30"),
                    series("venturi_pool_pending_jobs", 'pool="fixed"', "0x30"),
                    # send_email jobs die from minute 2 on; report's dead count stays put.
                    series("venturi_queue_dead_jobs", 'kind="send_email"', "0 0 1+1x30"),
                    series("venturi_queue_dead_jobs", 'kind="report"', "7x30"),
                    # An error every tick (4 a minute) from minute 3 on.
                    series(
                        "venturi_reconcile_errors_total", 'reason="SecretNotFound"', "0x3 4+4x30"
                    ),
                ],
                "alert_rule_test": [
                    alert("VenturiJobQueueStatsUnavailable", "6m"),  # down 3 min: pending
                    alert("VenturiJobQueueStatsUnavailable", "10m", jq),
                    # Stale from 6m45s on (105 s after its last tick), firing 5 min later.
                    alert("VenturiJobQueueNotReconciled", "5m"),
                    alert("VenturiJobQueueNotReconciled", "10m"),
                    alert("VenturiJobQueueNotReconciled", "13m", jq),
                    alert("VenturiOldestPendingAgeAboveTarget", "9m"),
                    alert("VenturiOldestPendingAgeAboveTarget", "12m", {**jq, "pool": "slow"}),
                    alert("VenturiPoolAtMaxReplicas", "14m"),
                    alert("VenturiPoolAtMaxReplicas", "20m", {**jq, "pool": "slow"}),
                    alert("VenturiDeadJobsGrowing", "12m", {**jq, "kind": "send_email"}),
                    alert("VenturiReconcileErrors", "10m"),
                    alert("VenturiReconcileErrors", "25m", {**jq, "reason": "SecretNotFound"}),
                ],
            }
        ],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    result = promtool("test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def dashboard_configmaps(values: Object | None = None) -> list[Object]:
    return of_kind(render(values or enabled(grafanaDashboards={})), "ConfigMap")


def test_dashboards_are_configmaps_for_the_grafana_sidecar() -> None:
    assert DASHBOARDS == ["queue.json", "scaling.json"]
    maps = dashboard_configmaps()
    assert sorted(m["metadata"]["name"] for m in maps) == ["venturi-queue", "venturi-scaling"]
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["labels"]["app.kubernetes.io/component"] == "dashboard"
        ((key, text),) = cm["data"].items()
        assert key in DASHBOARDS
        # Byte for byte the file (Helm templating never touches Grafana's {{legend}} syntax).
        assert text == (CHART / "dashboards" / key).read_text(encoding="utf-8").rstrip("\n")
    custom = dashboard_configmaps(
        enabled(
            grafanaDashboards={
                "labels": {"grafana_dashboard": None, "dashboards": "venturi"},
                "annotations": {"grafana_folder": "Jobs"},
                "namespace": "monitoring",
            }
        )
    )
    for cm in custom:
        assert cm["metadata"]["namespace"] == "monitoring"
        assert cm["metadata"]["labels"]["dashboards"] == "venturi"
        assert "grafana_dashboard" not in cm["metadata"]["labels"]
        assert cm["metadata"]["annotations"] == {"grafana_folder": "Jobs"}


def load_dashboard(name: str) -> Object:
    board: Object = json.loads((CHART / "dashboards" / name).read_text(encoding="utf-8"))
    return board


def panels(board: Object) -> list[Object]:
    out: list[Object] = []
    for panel in board["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


@pytest.mark.parametrize("name", DASHBOARDS)
def test_dashboard_json_uses_the_datasource_and_jobqueue_variables(name: str) -> None:
    board = load_dashboard(name)
    assert board["uid"] == "venturi-" + name.removesuffix(".json")
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for var in ("jobqueue_namespace", "jobqueue"):
        assert variables[var]["type"] == "query"
        assert variables[var]["datasource"]["uid"] == "${datasource}"
        assert var in variables[var]["query"]["query"]
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    targets = [t for p in panels(board) for t in p.get("targets", [])]
    assert targets
    for panel in panels(board):
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            expr = target["expr"]
            # Operator series are filtered by JobQueue; workers' by the pods' namespace.
            assert '=~"$jobqueue_namespace"' in expr, panel["title"]


def test_dashboard_expressions_parse(tmp_path: Path) -> None:
    """promtool checks every dashboard query as a recording rule, variables filled in."""
    rules = []
    for name in DASHBOARDS:
        for panel in panels(load_dashboard(name)):
            for i, target in enumerate(panel.get("targets", [])):
                expr = (
                    target["expr"]
                    .replace("$__rate_interval", "5m")
                    .replace("$jobqueue_namespace", ".*")
                    .replace("$jobqueue", ".*")
                )
                assert "$" not in expr, expr
                rules.append({"record": f"dashboard:panel{panel['id']}_{i}:check", "expr": expr})
    rules_file = tmp_path / "dashboards.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = promtool("check", "rules", rules_file.name, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
