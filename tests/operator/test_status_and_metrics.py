"""Status conditions and the metrics exposition, as pure values."""

from __future__ import annotations

import shutil
import subprocess
from datetime import UTC, datetime

from prometheus_client import generate_latest

from venturi_operator.metrics import OperatorMetrics, PoolSnapshot, Snapshot
from venturi_operator.status import Condition, conditions

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
T1 = datetime(2026, 11, 29, 12, 5, 0, tzinfo=UTC)


def test_transition_time_moves_only_when_status_changes() -> None:
    first = conditions(
        [Condition(type="Ready", ok=True, reason="Reconciled", message="ok")],
        None,
        generation=1,
        now=T0,
    )
    assert first == [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Reconciled",
            "message": "ok",
            "lastTransitionTime": "2026-11-29T12:00:00Z",
            "observedGeneration": 1,
        }
    ]
    same = conditions(
        [Condition(type="Ready", ok=True, reason="Reconciled", message="still ok")],
        first,
        generation=2,
        now=T1,
    )
    assert same[0]["lastTransitionTime"] == "2026-11-29T12:00:00Z"
    assert same[0]["observedGeneration"] == 2
    flipped = conditions(
        [Condition(type="Ready", ok=False, reason="SecretNotFound", message="gone")],
        same,
        generation=2,
        now=T1,
    )
    assert flipped[0]["lastTransitionTime"] == "2026-11-29T12:05:00Z"
    assert flipped[0]["status"] == "False"


def _metrics() -> OperatorMetrics:
    m = OperatorMetrics()
    pool = PoolSnapshot(
        pending=12,
        claimed=3,
        oldest_pending_age=4.5,
        current_replicas=2,
        desired_replicas=4,
        min_replicas=0,
        max_replicas=10,
        max_oldest_pending_age=30,
    )
    m.update(
        "jobs",
        "emails",
        Snapshot(
            stats_up=True,
            pending_by_kind={"send_email": 12},
            claimed_by_kind={"send_email": 3},
            dead_by_kind={"send_email": 1},
            oldest_pending_age_by_kind={"send_email": 4.5},
            pools={"mailer": pool},
        ),
    )
    m.update("jobs", "other", Snapshot(stats_up=False))
    m.ticked("jobs", "emails", at=1764417600.5, interval=15.0)
    m.scale_events.labels("jobs", "emails", "mailer", "up").inc()
    m.reconcile_duration.labels("jobs", "emails").observe(0.02)
    m.reconcile_errors.labels("jobs", "other", "SecretNotFound").inc()
    return m


def test_exposition_has_the_cached_values() -> None:
    text = generate_latest(_metrics().registry).decode()
    emails = 'jobqueue="emails",jobqueue_namespace="jobs"'
    assert f'venturi_queue_pending_jobs{{{emails},kind="send_email"}} 12.0' in text
    assert f'venturi_pool_desired_replicas{{{emails},pool="mailer"}} 4.0' in text
    assert 'venturi_jobqueue_stats_up{jobqueue="other",jobqueue_namespace="jobs"} 0.0' in text
    assert 'venturi_pool_scale_events_total{direction="up",jobqueue="emails"' in text
    assert f"venturi_jobqueue_last_tick_timestamp_seconds{{{emails}}} 1.7644176005e+09" in text
    assert f"venturi_jobqueue_interval_seconds{{{emails}}} 15.0" in text
    assert "namespace=" not in text.replace("jobqueue_namespace=", "")


def test_forget_drops_every_series_of_a_jobqueue() -> None:
    m = _metrics()
    m.forget("jobs", "emails")
    text = generate_latest(m.registry).decode()
    assert 'jobqueue="emails"' not in text
    assert 'jobqueue="other"' in text


def test_exposition_passes_promtool() -> None:
    assert shutil.which("promtool"), "promtool is installed by scripts/test"
    text = generate_latest(_metrics().registry)
    result = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, timeout=30
    )
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()


def test_fallback_does_not_say_stats_are_available_when_they_are_not() -> None:
    """No pool opted in and the database unreadable: nothing is held at a fallback, and the
    condition must not claim that decisions are based on current stats."""
    from venturi_operator.reconcile import _conditions
    from venturi_operator.spec import parse_spec

    spec = parse_spec(
        {
            "database": {"secretName": "db"},
            "pools": [{"deployment": "w", "maxReplicas": 3, "targetPerReplica": 8}],
        }
    )
    conditions = {
        c.type: c
        for c in _conditions(spec, ("SecretKeyMissing", "no key"), [("NotOptedIn", "x")], [])
    }
    fallback = conditions["Fallback"]
    assert (fallback.ok, fallback.reason) == (False, "NoPoolToHold")
    assert "current stats" not in fallback.message
    readable = {c.type: c for c in _conditions(spec, None, [("NotOptedIn", "x")], [])}
    assert readable["Fallback"].reason == "StatsAvailable"
