"""The queues, workers and schedules pages over HTTP (httpx on the ASGI app, a real
PostgreSQL, real workers): each figure checked against what the queue's API reads, and pause
/ resume through the action checks."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from tests.dashboard.conftest import Charge, Resize, resize, seed
from tests.dashboard.test_app import client, csrf
from tests.runtime.helpers import running, until
from venturi import CleanupCriteria, PostgresStore, Queue, Schedule, Worker, dashboard
from venturi.dashboard import _views

ORIGIN = {"origin": "http://127.0.0.1:8080"}


def row(html: str, attribute: str, name: str) -> str:
    """The table row of `attribute`="name" (e.g. data-queue="default")."""
    match = re.search(rf'<tr {attribute}="{re.escape(name)}"[^>]*>(.*?)</tr>', html, re.S)
    assert match, f"no row {attribute}={name!r}"
    return match[1]


def cell(html: str, col: str) -> str:
    match = re.search(rf'data-col="{col}">(.*?)</td>', html, re.S)
    assert match, f"no cell {col!r}"
    return re.sub(r"<[^>]+>", " ", match[1]).split("·")[0].strip()


def rows(html: str, attribute: str) -> list[str]:
    return re.findall(rf'<tr {attribute}="([^"]+)"', html)


async def test_the_queues_page_shows_each_queue_as_stats_reads_it(store: PostgresStore) -> None:
    await seed(store, ready=5, scheduled=2, dead=3)
    queue = Queue(store)
    await queue.enqueue_many(Resize(image=i) for i in range(4))  # default queue
    media = Queue(store, queue="media")
    await media.enqueue_many(Resize(image=i) for i in range(6))
    until = datetime.now(UTC) + timedelta(hours=2)
    await queue.pause("media", reason="disk full on the resizers", until=until)
    await queue.pause("idle")  # no jobs: listed because it is paused
    stats = await queue.stats()
    async with client(dashboard.app(store, gate=lambda r: True)) as http:
        page = (await http.get("/queues")).text
    assert rows(page, "data-queue") == ["default", "idle", "media"]
    default, media_row = row(page, "data-queue", "default"), row(page, "data-queue", "media")
    q = stats.queues["default"]
    assert cell(default, "ready") == str(q.pending) == "9"
    assert cell(default, "scheduled") == str(q.scheduled) == "2"
    assert cell(default, "running") == "0"
    assert cell(default, "dead") == str(q.dead) == "3"
    assert cell(default, "failed-hour") == str(q.failed_last_hour) == "3"
    assert cell(default, "done-hour") == "0"
    assert q.oldest_pending_age is not None and cell(default, "oldest") != "-"  # it moves
    assert "data-paused" not in default and 'data-action="pause"' in default
    assert cell(media_row, "ready") == str(stats.queues["media"].pending) == "6"
    assert "data-paused" in media_row and 'data-action="resume"' in media_row
    assert "disk full on the resizers" in media_row
    assert f"until {_views.timestamp(until)} UTC" in media_row
    idle = row(page, "data-queue", "idle")
    assert cell(idle, "ready") == "0" and cell(idle, "oldest") == "-"
    assert "until resumed" in idle

    async with client(dashboard.app(store, gate=lambda r: True)) as http:
        overview = (await http.get("/")).text
    assert rows(overview, "data-queue") == ["default", "idle", "media"]
    assert cell(row(overview, "data-queue", "default"), "ready") == "9"
    assert "data-paused" in row(overview, "data-queue", "media")


async def test_pause_and_resume_change_the_stored_pause(store: PostgresStore) -> None:
    queue = Queue(store)
    await queue.enqueue(Resize(image=1))
    async with client(dashboard.app(store, gate=lambda r: True)) as http:
        token = csrf((await http.get("/queues")).text)
        form = {"csrf": token, "queue": "default", "next": "/queues"}
        refused = [
            await http.post("/queues/pause", data=form),  # no Origin
            await http.post("/queues/pause", data={**form, "csrf": "forged"}, headers=ORIGIN),
        ]
        assert [r.status_code for r in refused] == [403, 403]
        assert [s.paused for s in await queue.queues()] == [False]

        done = await http.post(
            "/queues/pause", data={**form, "reason": "  deploy  ", "for": "1h"}, headers=ORIGIN
        )
        assert done.status_code == 303
        assert done.headers["location"].startswith("/queues?notice=paused&n=1&q=default&ns=")
        (state,) = await queue.queues()
        assert state.paused and state.reason == "deploy"
        assert state.until is not None
        left = state.until - datetime.now(UTC)
        assert timedelta(minutes=59) < left <= timedelta(hours=1)
        shown = (await http.get(done.headers["location"])).text
        assert "Paused queue default" in shown and 'data-action="resume"' in shown

        done = await http.post("/queues/resume", data=form, headers=ORIGIN)
        assert done.headers["location"].startswith("/queues?notice=resumed&n=1&q=default&ns=")
        assert [s.paused for s in await queue.queues()] == [False]
        again = await http.post("/queues/resume", data=form, headers=ORIGIN)
        assert again.headers["location"].startswith("/queues?notice=resumed_none&n=0&q=default&ns=")

        bad = await http.post(
            "/queues/pause", data={**form, "queue": "no spaces allowed"}, headers=ORIGIN
        )
        assert bad.status_code == 400 and "invalid queue name" in bad.text
        long = await http.post("/queues/pause", data={**form, "for": "forever"}, headers=ORIGIN)
        assert long.status_code == 400
    assert [s.name for s in await queue.queues() if s.paused] == []


async def test_read_only_hides_and_refuses_pause_and_resume(store: PostgresStore) -> None:
    queue = Queue(store)
    await queue.enqueue(Resize(image=1))
    await queue.pause("default", reason="kept")
    async with client(dashboard.app(store, gate=lambda r: True, read_only=True)) as http:
        for path in ("/", "/queues"):
            page = (await http.get(path)).text
            assert "data-paused" in page and "data-action" not in page
        token = http.cookies["venturi_csrf"]
        for action in ("resume", "pause"):
            refused = await http.post(
                f"/queues/{action}", data={"csrf": token, "queue": "default"}, headers=ORIGIN
            )
            assert refused.status_code == 403 and "read-only" in refused.text
    (state,) = await queue.queues()
    assert state.paused and state.reason == "kept"


async def test_the_workers_page_lists_the_registry_and_unserved_kinds(
    store: PostgresStore,
) -> None:
    queue = Queue(store)
    await queue.enqueue(Charge(order=1))  # no worker has a task for it
    await Queue(store, queue="media").enqueue(Resize(image=1))  # no worker serves "media"
    worker: Worker[None] = Worker(None, store, concurrency=3)
    worker.register(Resize, resize)
    app = dashboard.app(store, gate=lambda r: True)
    async with running(worker):

        async def leads() -> bool:
            return worker.leads

        await until(leads)
        (info,) = await queue.workers()
        async with client(app) as http:
            page = (await http.get("/workers")).text
        assert rows(page, "data-worker") == [info.id]
        listed = row(page, "data-worker", info.id)
        assert "data-leader" in listed and info.leader
        assert ">live</span>" in listed and info.live
        assert '<span class="tag">default</span>' in listed
        assert f'<span class="tag">{Resize.KIND}</span>' in listed
        assert await queue.unserved_kinds() == {
            "default": [Charge.KIND],
            "media": [Resize.KIND],
        }
        assert rows(page, "data-unserved") == ["default", "media"]
        assert f'data-kind="{Charge.KIND}"' in row(page, "data-unserved", "default")
        assert f'data-kind="{Resize.KIND}"' in row(page, "data-unserved", "media")

    # A worker gone silent (killed: its row stays until a leader sweeps it).
    await store._pool_or_raise().execute(
        f"INSERT INTO {store.prefix}_workers (id, host, pid, pod, queues, kinds, unknown_kinds,"
        " concurrency, heartbeat_s, started_at, last_seen) VALUES ('pod-a/host:1#x', 'host', 1,"
        " 'pod-a', '{default}', '{media.resize}', 'wait', 2, 5, now() - interval '2 hours',"
        " now() - interval '1 hour')"
    )
    (silent,) = await queue.workers()
    assert not silent.live and not silent.leader
    async with client(app) as http:
        page = (await http.get("/workers")).text
    listed = row(page, "data-worker", "pod-a/host:1#x")
    assert ">silent</span>" in listed and "data-leader" not in listed
    assert "0 live" in page


async def test_the_schedules_page_shows_each_schedule_as_recorded(store: PostgresStore) -> None:
    schedules = [
        Schedule("hourly-thumbs", Resize(image=1), every=timedelta(hours=1)),
        Schedule("nightly-billing", Charge(order=0), cron="30 2 * * *"),
    ]
    worker: Worker[None] = Worker(None, store, concurrency=1, schedules=schedules)
    worker.register(Resize, resize)
    queue = Queue(store)
    async with running(worker):

        async def recorded() -> bool:
            # Registered (a row each, due now), then ticked once: the next tick is ahead.
            infos = await queue.schedules()
            return len(infos) == 2 and all(i.next_tick > datetime.now(UTC) for i in infos)

        await until(recorded)
    infos = {i.name: i for i in await queue.schedules()}
    async with client(dashboard.app(store, gate=lambda r: True)) as http:
        page = (await http.get("/schedules")).text
    assert rows(page, "data-schedule") == ["hourly-thumbs", "nightly-billing"]
    for name, info in infos.items():
        shown = row(page, "data-schedule", name)
        assert cell(shown, "spec") == info.spec
        assert cell(shown, "enqueued") == str(info.enqueued)
        assert cell(shown, "skipped") == str(info.skipped)
        assert _views.timestamp(info.next_tick) in shown
        assert info.kind in shown
    assert infos["nightly-billing"].next_tick.astimezone(UTC).strftime("%H:%M") == "02:30"


async def test_the_overview_chart_draws_the_per_minute_counters(store: PostgresStore) -> None:
    await seed(store, ready=0, scheduled=0, dead=3)
    minutes = await Queue(store).finished_per_minute()
    assert sum(m.failed for m in minutes) == 3
    async with client(dashboard.app(store, gate=lambda r: True)) as http:
        page = (await http.get("/")).text
    bar = r'<g class="bar" data-minute="([^"]+)" data-done="(\d+)" data-failed="(\d+)"'
    bars = re.findall(bar, page)
    by_minute: dict[str, tuple[int, int]] = {}
    for m in minutes:
        done, failed = by_minute.get(_views.timestamp(m.minute), (0, 0))
        by_minute[_views.timestamp(m.minute)] = (done + m.done, failed + m.failed)
    assert {b[0]: (int(b[1]), int(b[2])) for b in bars} == by_minute
    assert 'data-failed="3"' in page and "3 failed" in page


async def test_done_and_failed_in_the_last_hour_come_from_the_per_minute_counters(
    store: PostgresStore,
) -> None:
    """The cards and the queue rows count what finished, as the counters kept it: a job
    forgotten or cleaned up since still counts (a scan of the jobs table would miss it)."""
    seeded = await seed(store, ready=0, scheduled=0, dead=3)
    queue = Queue(store)
    media = Queue(store, queue="media")
    done = await media.enqueue_many(Resize(image=i) for i in range(2))
    worker: Worker[None] = Worker(None, store, queue="media")
    worker.register(Resize, resize)
    await worker.run(once=True)
    for job_id in done:
        job = await queue.job(job_id)
        assert job is not None and job.status.value == "completed"
    await queue.forget(seeded.dead[0])
    await queue.cleanup(CleanupCriteria(finished_before=datetime.now(UTC) + timedelta(hours=1)))
    assert await queue.jobs() == []  # nothing finished is left in the jobs table
    stats = await queue.stats()
    assert (stats.done_last_hour, stats.failed_last_hour) == (2, 3)
    async with client(dashboard.app(store, gate=lambda r: True)) as http:
        overview = (await http.get("/")).text
        queues = (await http.get("/queues")).text
    assert re.search(r'data-figure="done-hour">2<', overview)
    assert re.search(r'data-figure="failed-hour">3<', overview)
    for page in (overview, queues):
        assert cell(row(page, "data-queue", "default"), "failed-hour") == "3"
        assert cell(row(page, "data-queue", "media"), "done-hour") == "2"
