"""Every metric and label that the alerts and dashboards use exists in the code that exports
it (operator/venturi_operator/metrics.py, runtime/venturi/metrics.py): a renamed metric fails
here instead of silently emptying a panel or muting an alert."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from .rendering import CHART, REPO

SOURCES = [
    REPO / "operator" / "venturi_operator" / "metrics.py",
    REPO / "runtime" / "venturi" / "metrics.py",
]
# Labels that Prometheus adds or computes, not the code: histogram buckets and target labels.
PROMETHEUS_LABELS = {"le", "namespace", "pod", "instance", "job", "container", "service"}
DECLARATION = re.compile(
    r'\b(Counter|Gauge|Histogram|Summary|GaugeMetricFamily)\(\s*"(venturi_\w+)"'
)
STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
METRIC = re.compile(r"\bventuri_\w+")
MATCHER = re.compile(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)\s*\"")
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
LABEL_VALUES = re.compile(r"label_values\((?:[^,()]|\([^)]*\))*,\s*(\w+)\)")


def exported() -> dict[str, set[str]]:
    """Each metric name in the sources, with the series names it is exposed as."""
    names: dict[str, set[str]] = {}
    for source in SOURCES:
        for kind, name in DECLARATION.findall(source.read_text(encoding="utf-8")):
            if kind == "Histogram" or kind == "Summary":
                series = {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
            elif kind == "Counter":
                base = name.removesuffix("_total")
                series = {f"{base}_total"}
            else:
                series = {name}
            names[name] = series
    return names


def exported_labels() -> set[str]:
    """Every quoted word in a label list or tuple of the sources."""
    labels: set[str] = set()
    for source in SOURCES:
        text = source.read_text(encoding="utf-8")
        for group in re.findall(r"\[([^\[\]]*)\]|\(([^()]*)\)", text):
            for part in group:
                labels.update(re.findall(r'"([a-z_]+)"', part))
    return labels


def expressions() -> list[tuple[str, str]]:
    """(where, PromQL) of every alert rule and every dashboard query and variable."""
    out: list[tuple[str, str]] = []
    rules = yaml.safe_load((CHART / "rules" / "alerts.yaml").read_text(encoding="utf-8"))
    for group in rules["groups"]:
        for rule in group["rules"]:
            out.append((f"rules/alerts.yaml {rule['alert']}", rule["expr"]))
    for path in sorted((CHART / "dashboards").glob("*.json")):
        board = json.loads(path.read_text(encoding="utf-8"))
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                out.append((f"dashboards/{path.name} {panel['title']!r}", target["expr"]))
        for variable in board["templating"]["list"]:
            if variable["type"] == "query":
                query = variable["query"]["query"]
                out.append((f"dashboards/{path.name} ${variable['name']}", query))
    return out


def test_the_sources_declare_the_documented_metrics() -> None:
    names = exported()
    for name in (
        "venturi_jobqueue_stats_up",
        "venturi_queue_pending_jobs",
        "venturi_queue_claimed_jobs",
        "venturi_queue_dead_jobs",
        "venturi_queue_oldest_pending_age_seconds",
        "venturi_pool_pending_jobs",
        "venturi_pool_claimed_jobs",
        "venturi_pool_oldest_pending_age_seconds",
        "venturi_pool_max_oldest_pending_age_seconds",
        "venturi_pool_current_replicas",
        "venturi_pool_desired_replicas",
        "venturi_pool_min_replicas",
        "venturi_pool_max_replicas",
        "venturi_pool_scale_events_total",
        "venturi_reconcile_duration_seconds",
        "venturi_reconcile_errors_total",
        "venturi_jobs_settled_total",
    ):
        assert name in names, f"{name} is no longer declared in {[str(s) for s in SOURCES]}"
    assert {"jobqueue_namespace", "jobqueue", "kind", "pool", "direction", "reason"} <= (
        exported_labels()
    )


@pytest.mark.parametrize(("where", "expr"), expressions(), ids=lambda v: str(v)[:60])
def test_expression_uses_only_exported_metrics_and_labels(where: str, expr: str) -> None:
    series = set().union(*exported().values())
    code = STRING.sub('""', expr)  # label values and regexes are not names
    used = set(METRIC.findall(code))
    assert used, f"{where}: no venturi metric in {expr!r}"
    unknown = sorted(used - series)
    assert not unknown, f"{where}: {unknown} not exported (known: {sorted(series)})"
    labels = set(MATCHER.findall(expr)) | set(LABEL_VALUES.findall(expr))
    for group in GROUPING.findall(code):
        labels.update(part.strip() for part in group.split(",") if part.strip())
    unknown_labels = sorted(labels - exported_labels() - PROMETHEUS_LABELS)
    assert not unknown_labels, f"{where}: labels {unknown_labels} are not exported"


def test_a_renamed_metric_would_be_caught() -> None:
    series = set().union(*exported().values())
    assert "venturi_queue_pending_jobs" in series
    assert "venturi_queue_pending" not in series
    assert "venturi_reconcile_duration_seconds_bucket" in series
    assert "venturi_reconcile_duration_seconds" not in series  # a histogram is never queried bare
