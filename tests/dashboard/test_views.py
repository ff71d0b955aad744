"""The dashboard's pure parts: figures for people, the overview's rows, and the request
checks of the gate (loopback, same origin, CSRF token, an action's way back)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from venturi import JobStatus, Stats
from venturi.dashboard import _app, _guard, _views


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (None, "-"),
        (0.0, "0 s"),
        (0.0004, "<1 ms"),
        (0.85, "850 ms"),
        (4.21, "4.2 s"),
        (185, "3 min"),
        (9000, "2.5 h"),
        (86400 * 3, "3 d"),
        (-5, "0 s"),
    ],
)
def test_durations_read_as_people_say_them(seconds: float | None, shown: str) -> None:
    assert _views.duration(seconds) == shown


def test_numbers_read_with_thousands_separators() -> None:
    assert _views.number(1234567) == "1,234,567"


def test_ago_reads_both_ways_by_the_database_clock() -> None:
    now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    assert _views.ago(now - timedelta(minutes=3), now) == "3 min ago"
    assert _views.ago(now + timedelta(seconds=5), now) == "in 5.0 s"
    assert _views.ago(now, now) == "now"
    assert _views.ago(None, now) == "-"


def test_overview_joins_stats_and_kept_counts_per_kind() -> None:
    stats = Stats(
        pending_by_kind={"a": 5},
        scheduled_by_kind={"a": 2},
        claimed_by_kind={"b": 1},
        dead_by_kind={"b": 3},
        oldest_pending_age_by_kind={"a": 12.5},
        done_last_hour_by_kind={"a": 7, "c": 2},
        failed_last_hour_by_kind={"b": 1},
    )
    counts = {
        "a": {JobStatus.PENDING: 7, JobStatus.COMPLETED: 40},
        "b": {JobStatus.CLAIMED: 1, JobStatus.DEAD: 3},
        "c": {JobStatus.COMPLETED: 2},
    }
    view = _views.overview(stats, counts)
    assert [r.kind for r in view.kinds] == ["a", "b", "c"]
    a, b, c = view.kinds
    assert (a.ready, a.scheduled, a.running, a.done, a.dead, a.oldest_wait) == (
        5,
        2,
        0,
        40,
        0,
        12.5,
    )
    assert (b.running, b.dead, b.oldest_wait) == (1, 3, None)
    assert c.done == 2
    assert (view.ready, view.scheduled, view.running, view.dead) == (5, 2, 1, 3)
    assert view.done_total == 42 and view.oldest_wait == 12.5
    assert (view.done_hour, view.failed_hour) == (9, 1)
    assert _views.status_totals(counts) == {
        JobStatus.PENDING: 7,
        JobStatus.CLAIMED: 1,
        JobStatus.COMPLETED: 42,
        JobStatus.DEAD: 3,
        JobStatus.WAITING: 0,
        JobStatus.CANCELLED: 0,
    }


def test_long_payloads_are_cut_for_the_page() -> None:
    shown = _views.pretty({"blob": "x" * (_views.PAYLOAD_SHOWN * 2)})
    assert len(shown) < _views.PAYLOAD_SHOWN + 100
    assert shown.endswith("more characters)")
    assert _views.first_line("boom\ntraceback ...") == "boom"
    assert _views.pretty({"page": 3}) == '{"page": 3}'
    assert _views.pretty({"k": "v" * 80}).startswith('{\n  "k"')


@pytest.mark.parametrize(
    ("host", "local"),
    [
        ("127.0.0.1:8080", True),
        ("localhost:8080", True),
        ("localhost", True),
        ("[::1]:8080", True),
        ("127.3.4.5", True),
        ("evil.example:8080", False),  # a name rebound to 127.0.0.1
        ("10.0.0.5:8080", False),
        ("", False),
        (None, False),
    ],
)
def test_loopback_hosts(host: str | None, local: bool) -> None:
    assert _guard.is_loopback_host(host) is local


def test_loopback_addresses() -> None:
    assert _guard.is_loopback_address("127.0.0.1")
    assert _guard.is_loopback_address("::1")
    assert not _guard.is_loopback_address("192.168.1.2")
    assert not _guard.is_loopback_address("testclient")
    assert not _guard.is_loopback_address(None)


@pytest.mark.parametrize(
    ("headers", "same"),
    [
        ({"host": "dash.example", "origin": "https://dash.example"}, True),
        ({"host": "127.0.0.1:8080", "origin": "http://127.0.0.1:8080"}, True),
        ({"host": "127.0.0.1:8080", "origin": "http://127.0.0.1:9999"}, False),
        ({"host": "dash.example", "origin": "https://evil.example"}, False),
        ({"host": "dash.example", "origin": "null"}, False),
        ({"host": "dash.example", "sec-fetch-site": "same-origin"}, True),
        ({"host": "dash.example", "sec-fetch-site": "cross-site"}, False),
        ({"host": "dash.example"}, False),
    ],
)
def test_same_origin(headers: dict[str, str], same: bool) -> None:
    assert _guard.same_origin(headers) is same


def test_the_csrf_token_must_match_the_cookie() -> None:
    token = _guard.new_token()
    assert _guard.token_matches(token, token)
    assert not _guard.token_matches(token, token + "x")
    assert not _guard.token_matches(None, token)
    assert not _guard.token_matches(token, None)
    assert not _guard.token_matches("", "")


@pytest.mark.parametrize(
    ("target", "kept"),
    [
        ("/ops/queue/failed?kind=a", True),
        ("/ops/queue/", True),
        ("/ops/queue", True),
        ("https://evil.example/ops/queue/failed", False),
        ("//evil.example/ops/queue/failed", False),
        ("/\\evil.example", False),
        ("/elsewhere", False),
        ("/ops/queueX/failed", False),
        (None, False),
    ],
)
def test_an_action_goes_back_only_within_the_dashboard(target: str | None, kept: bool) -> None:
    back = _app._safe_next(target, "/ops/queue")
    assert back == (target if kept else None)


def test_queue_rows_join_live_figures_and_pauses() -> None:
    from venturi.jobs import QueueStats
    from venturi.pauses import QueueState

    since = datetime(2026, 1, 1, 11, 0, tzinfo=UTC)
    until = datetime(2026, 1, 1, 13, 0, tzinfo=UTC)
    stats = Stats(
        queues={
            "b": QueueStats(
                pending_by_kind={"x": 2, "y": 1},
                claimed_by_kind={"x": 1},
                oldest_pending_age_by_kind={"x": 3.0, "y": 9.0},
                done_last_hour_by_kind={"x": 40},
                failed_last_hour_by_kind={"y": 2},
                paused=True,
            ),
            "a": QueueStats(scheduled_by_kind={"x": 5}),
        },
        paused_queues=frozenset({"b", "idle"}),
    )
    states = [
        QueueState("b", True, "deploy", since, until),
        QueueState("idle", True, None, since, None),
        QueueState("was", False),  # resumed, no jobs: not shown
    ]
    a, b, idle = _views.queue_rows(stats, states)
    assert (a.name, a.scheduled, a.ready, a.paused, a.oldest_wait) == ("a", 5, 0, False, None)
    assert (b.ready, b.running, b.oldest_wait, b.done_hour, b.failed_hour) == (3, 1, 9.0, 40, 2)
    assert (b.paused, b.reason, b.since, b.until) == (True, "deploy", since, until)
    assert (idle.name, idle.ready, idle.paused, idle.until) == ("idle", 0, True, None)


def test_worker_rows_put_the_leader_then_live_workers_first() -> None:
    from venturi.registry import WorkerInfo

    at = datetime(2026, 1, 1, tzinfo=UTC)

    def info(name: str, minute: int, *, live: bool, leader: bool = False) -> WorkerInfo:
        return WorkerInfo(
            id=name,
            host="h",
            pid=1,
            pod=None,
            queues=("default",),
            kinds=("k",),
            unknown_kinds="fail" if name == "c" else "wait",
            concurrency=2,
            heartbeat=5.0,
            started_at=at + timedelta(minutes=minute),
            last_seen=at,
            live=live,
            leader=leader,
        )

    rows = _views.worker_rows(
        [info("a", 0, live=False), info("b", 1, live=True), info("c", 2, live=True, leader=True)]
    )
    assert [(r.id, r.leader, r.live) for r in rows] == [
        ("c", True, True),
        ("b", False, True),
        ("a", False, False),
    ]
    assert rows[0].any_kind and not rows[1].any_kind


def test_the_minute_chart_sums_queues_and_kinds_and_scales_to_the_busiest_minute() -> None:
    from venturi.jobs import MinuteCounts

    now = datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC)
    minute = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    counts = [
        MinuteCounts(minute - timedelta(minutes=119), "a", "x", done=1, failed=0),  # left edge
        MinuteCounts(minute - timedelta(minutes=60), "a", "x", done=6, failed=1),
        MinuteCounts(minute - timedelta(minutes=60), "b", "y", done=2, failed=1),
        MinuteCounts(minute, "a", "x", done=0, failed=5),  # this minute: the right edge
        MinuteCounts(minute - timedelta(minutes=120), "a", "x", done=99, failed=0),  # too old
        MinuteCounts(minute - timedelta(minutes=30), "a", "x", done=0, failed=0),  # nothing
    ]
    chart = _views.minute_chart(counts, now)
    assert [(b.done, b.failed) for b in chart.bars] == [(1, 0), (8, 2), (0, 5)]
    assert (chart.done, chart.failed, chart.peak) == (9, 7, 10)
    first, busiest, last = chart.bars
    slot = _views.CHART_WIDTH / _views.CHART_MINUTES
    assert first.x == 0.5 and last.x == round(119 * slot + 0.5, 2)
    assert busiest.done_h + busiest.failed_h == _views.CHART_HEIGHT  # the peak fills it
    assert busiest.failed_y == 0 and busiest.done_y == busiest.failed_h
    assert last.done_h == 0 and last.failed_h == _views.CHART_HEIGHT / 2
    empty = _views.minute_chart([], now)
    assert empty.bars == () and empty.peak == 0


def test_a_retry_note_names_who_clicked_and_stays_short() -> None:
    from venturi.dashboard._store import retry_note

    assert retry_note("ada") == "retried from the dashboard by ada"
    assert len(retry_note("x" * 5000)) < 1000  # Queue.retry(note=) takes up to 1,000


def test_who_clicked_is_read_from_whatever_user_the_host_app_has() -> None:
    from starlette.authentication import BaseUser, SimpleUser, UnauthenticatedUser
    from starlette.requests import Request

    from venturi.dashboard._guard import actor

    class IdentityOnly(BaseUser):  # display_name left out: BaseUser's raises
        @property
        def is_authenticated(self) -> bool:
            return True

        @property
        def identity(self) -> str:
            return "user-42"

    class OrmUser:  # no Starlette base at all
        email = "ada@example.com"

    def request(user: object) -> Request:
        return Request({"type": "http", "user": user, "client": ("10.0.0.9", 1234)})

    assert actor(request(SimpleUser("ada"))) == "ada"
    assert actor(request(IdentityOnly())) == "user-42"  # was a 500 (NotImplementedError)
    assert actor(request(OrmUser())) == "ada@example.com"
    assert actor(request(UnauthenticatedUser())) == "10.0.0.9"
    assert actor(Request({"type": "http", "client": ("10.0.0.9", 1234)})) == "10.0.0.9"
