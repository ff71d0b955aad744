"""The dashboard in a real browser: headless Chromium (Debian's) driven by Playwright, against
the dashboard served by uvicorn on 127.0.0.1 and a real PostgreSQL. Each page's figures are
checked against the database; clicks change the database; the live refresh shows a job
enqueued after the page loaded; an ungated app and a cross-origin POST are refused."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Route

from tests.dashboard.conftest import Charge, Resize, held_chain, resize, screenshot, seed
from tests.runtime.helpers import running, until, until_status
from venturi import (
    JobFilter,
    JobStatus,
    JournalOutcome,
    PostgresStore,
    Queue,
    Schedule,
    Worker,
    dashboard,
)
from venturi.dashboard import _views

FAST = 0.25
"""The live parts' period in these tests (seconds): the default is 5."""


def opened(store: PostgresStore, **options: Any) -> Any:
    return dashboard.app(store, gate=lambda request: True, refresh=FAST, **options)


async def click_confirmed(page: Any, selector: str, *, accept: bool = True) -> list[str]:
    """Click an action that asks first (its form's data-confirm), answering the browser's
    dialog; returns what the dialog said."""
    said: list[str] = []
    answering: list[asyncio.Future[None]] = []

    def answer(dialog: Any) -> None:
        said.append(dialog.message)
        answering.append(asyncio.ensure_future(dialog.accept() if accept else dialog.dismiss()))

    page.once("dialog", answer)
    await page.click(selector)
    await asyncio.gather(*answering)
    return said


async def text(page: Any, selector: str) -> str:
    value: str = await page.locator(selector).inner_text()
    return value.strip()


async def test_overview_shows_the_queue_figures(
    store: PostgresStore, serve: Any, page: Any, tmp_path: Any
) -> None:
    await seed(store)
    stats = await Queue(store).stats()
    async with serve(opened(store)) as url:
        response = await page.goto(url + "/")
        assert response.status == 200
        assert await text(page, "[data-figure=ready]") == str(stats.pending) == "7"
        assert await text(page, "[data-figure=scheduled]") == "3"
        assert await text(page, "[data-figure=running]") == "0"
        assert await text(page, "[data-figure=dead]") == str(stats.dead) == "4"
        assert await text(page, "[data-figure=failed-hour]") == "4"
        assert await text(page, "[data-figure=done-hour]") == "0"
        row = "tr[data-kind='media.resize']"
        assert await text(page, f"{row} [data-col=ready]") == "7"
        assert await text(page, f"{row} [data-col=scheduled]") == "3"
        assert await text(page, "tr[data-kind='billing.charge'] [data-col=dead]") == "4"
        minutes = await Queue(store).finished_per_minute()
        chart = page.locator("#chart svg")
        assert await chart.get_attribute("data-failed") == str(sum(m.failed for m in minutes))
        assert await chart.get_attribute("data-failed") == "4"
        assert await chart.get_attribute("data-done") == "0"
        assert await page.locator("#chart rect.failed").count() >= 1
        await screenshot(page, "overview", tmp_path)


async def test_jobs_page_filters_and_pages_by_keyset(
    store: PostgresStore, serve: Any, page: Any, tmp_path: Any
) -> None:
    seeded = await seed(store, ready=57, dead=2)
    queue = Queue(store)
    newest = await queue.jobs(JobFilter(status=JobStatus.PENDING, kind=Resize.KIND, limit=100))
    assert len(newest) == 60
    async with serve(opened(store)) as url:
        await page.goto(url + "/jobs")
        assert await text(page, "[data-status=pending]") == "60"
        assert await text(page, "[data-status=dead]") == "2"
        await page.click("nav.tabs a:has-text('pending')")
        await page.wait_for_url("**/jobs?status=pending")
        await page.select_option("select[name=kind]", Resize.KIND)
        await page.click("form.filters button")
        await page.wait_for_url("**/jobs?status=pending&kind=media.resize&queue=")
        assert await text(page, "[data-status=dead]") == "0"  # the tabs count this kind
        shown = await page.locator("tr[data-job]").evaluate_all(
            "rows => rows.map(r => r.dataset.job)"
        )
        assert shown == [str(j.id) for j in newest[:50]]
        scheduled = await page.locator(f"tr[data-job='{seeded.scheduled[0]}'] .badge").inner_text()
        assert scheduled == "scheduled"
        await screenshot(page, "jobs", tmp_path)
        # Wait for the next page itself: a click only starts the navigation, and rows read
        # before it lands are the old page's, or none.
        await page.click("a[rel=next]")
        await page.wait_for_url(lambda url: "before=" in url)
        shown = await page.locator("tr[data-job]").evaluate_all(
            "rows => rows.map(r => r.dataset.job)"
        )
        assert shown == [str(j.id) for j in newest[50:]]
        assert await page.locator("a[rel=next]").count() == 0


async def test_job_page_shows_payload_error_and_journal(
    store: PostgresStore, serve: Any, page: Any, tmp_path: Any
) -> None:
    seeded = await seed(store, dead=1)
    job_id = seeded.dead[0]
    journal = await Queue(store).job_journal(job_id)
    async with serve(opened(store)) as url:
        await page.goto(f"{url}/jobs/{job_id}")
        assert await text(page, "[data-status]") == "dead"
        assert '"order": 0' in await text(page, "[data-payload]")
        assert "card declined for order 0" in await text(page, "pre.error-text")
        outcomes = await page.locator("[data-outcome]").evaluate_all(
            "items => items.map(i => i.dataset.outcome)"
        )
        assert outcomes == [e.outcome.value for e in journal] == ["dead"]
        await screenshot(page, "job", tmp_path)
        missing = await page.goto(f"{url}/jobs/01ARZ3NDEKTSV4RRFFQ69G5FAV")
        assert missing.status == 404


async def test_retry_forget_and_retry_all_change_the_database(
    store: PostgresStore, serve: Any, page: Any, tmp_path: Any
) -> None:
    seeded = await seed(store, ready=0, scheduled=0, dead=4)
    queue = Queue(store)
    first, second, *rest = seeded.dead
    async with serve(opened(store)) as url:
        await page.goto(url + "/failed")
        assert await text(page, "#dead-count") == "4"
        await screenshot(page, "failed", tmp_path)

        await page.click(f"tr[data-job='{first}'] [data-action=retry]")
        await page.wait_for_url("**/failed?notice=retried&n=1&ns=*")
        assert "Retried 1 job" in await text(page, ".notice")
        job = await queue.job(first)
        assert job is not None and job.status is JobStatus.PENDING
        journal = await queue.job_journal(first)
        assert [e.outcome for e in journal] == [JournalOutcome.DEAD, JournalOutcome.RETRIED]
        assert journal[-1].note is not None and "retried from the dashboard" in journal[-1].note
        assert await page.locator(f"tr[data-job='{first}']").count() == 0

        await click_confirmed(page, f"tr[data-job='{second}'] [data-action=forget]")
        await page.wait_for_url("**/failed?notice=forgot&n=1&ns=*")
        assert await queue.job(second) is None
        assert await queue.job_journal(second) == []

        await click_confirmed(page, "[data-action=retry-all]")
        await page.wait_for_url("**/failed?notice=retried_all&n=2&ns=*")
        for job_id in rest:
            job = await queue.job(job_id)
            assert job is not None and job.status is JobStatus.PENDING
        assert (await queue.stats()).dead == 0
        assert await text(page, "#dead-count") == "0"


async def test_live_refresh_shows_a_job_enqueued_after_the_page_loaded(
    store: PostgresStore, serve: Any, page: Any
) -> None:
    await seed(store, ready=1, scheduled=0, dead=0)
    async with serve(opened(store)) as url:
        await page.goto(url + "/jobs")
        await page.evaluate("window.loadedOnce = true")  # gone if the page reloads
        job_id = await Queue(store).enqueue(Resize(image=999))
        await page.wait_for_selector(f"tr[data-job='{job_id}']", timeout=10_000)
        assert await page.evaluate("window.loadedOnce") is True

        await page.goto(url + "/")
        await page.evaluate("window.loadedOnce = true")
        before = await text(page, "[data-figure=ready]")
        await Queue(store).enqueue(Resize(image=1000))
        await page.wait_for_function(
            "n => document.querySelector('[data-figure=ready]').textContent.trim() === n",
            arg=str(int(before) + 1),
            timeout=10_000,
        )
        assert await page.evaluate("window.loadedOnce") is True


async def test_forget_asks_first_and_a_no_keeps_the_job(
    store: PostgresStore, serve: Any, page: Any
) -> None:
    seeded = await seed(store, ready=0, scheduled=0, dead=1)
    job_id = seeded.dead[0]
    async with serve(opened(store)) as url:
        await page.goto(url + "/failed")
        said = await click_confirmed(
            page, f"tr[data-job='{job_id}'] [data-action=forget]", accept=False
        )
        assert said and str(job_id) in said[0] and "deleted with its journal" in said[0]
        await page.wait_for_timeout(300)  # a bounded look: no request must have gone out
        assert page.url.endswith("/failed")
    job = await Queue(store).job(job_id)
    assert job is not None and job.status is JobStatus.DEAD


async def test_rows_do_not_move_under_the_pointer(
    store: PostgresStore, serve: Any, page: Any
) -> None:
    """The live refresh leaves a part alone while the pointer is over it: a job that dies
    meanwhile must not slide another job's Forget under a click aimed at this one."""
    seeded = await seed(store, ready=0, scheduled=0, dead=2)
    async with serve(opened(store)) as url:
        await page.goto(url + "/failed")
        aimed = seeded.dead[-1]  # the newest: the first row, which a new death pushes down
        button = page.locator(f"tr[data-job='{aimed}'] [data-action=forget]")
        await button.hover()
        box = await button.bounding_box()
        assert box is not None
        x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        await page.evaluate(
            "() => { window.refreshes = 0;"
            " document.addEventListener('venturi:refreshed', () => window.refreshes++); }"
        )
        newer = (await seed(store, ready=0, scheduled=0, dead=1)).dead[0]
        await page.wait_for_function("() => window.refreshes >= 3", timeout=10_000)
        under = "([x, y]) => document.elementFromPoint(x, y).closest('tr').dataset.job"
        assert await page.evaluate(under, [x, y]) == str(aimed)
        await page.mouse.move(1, 1)  # away: the part catches up
        await page.wait_for_selector(f"tr[data-job='{newer}']", timeout=10_000)


async def test_an_ungated_app_refuses_every_request(
    store: PostgresStore, serve: Any, page: Any
) -> None:
    async with serve(dashboard.app(store)) as url:
        for path in ("/", "/jobs", "/failed", "/static/live.js"):
            response = await page.goto(url + path)
            assert response.status == 403
        assert "closed" in await page.inner_text("body")
        assert "gate=" in await page.inner_text("body")


async def test_a_cross_origin_post_is_refused(store: PostgresStore, serve: Any, page: Any) -> None:
    seeded = await seed(store, ready=0, scheduled=0, dead=1)
    job_id = seeded.dead[0]
    async with serve(opened(store)) as url:
        await page.goto(url + "/failed")  # the browser now holds the dashboard's CSRF cookie
        cookies = await page.context.cookies()
        token = next(c["value"] for c in cookies if c["name"] == "venturi_csrf")

        # Another origin (another port), with a form that posts to the dashboard; it even
        # knows the token, which only the Origin check can stop.
        async def attack(request: Any) -> HTMLResponse:
            return HTMLResponse(
                f"<form id=f method=post action='{url}/jobs/{job_id}/retry'>"
                f"<input name=csrf value='{token}'><input name=next value='/failed'></form>"
                "<script>document.getElementById('f').submit()</script>"
            )

        async with serve(Starlette(routes=[Route("/", attack)])) as evil:
            async with page.expect_navigation(url=f"{url}/jobs/{job_id}/retry") as navigation:
                await page.goto(evil + "/")
            response = await navigation.value
            assert response.status == 403
            assert "did not come from this dashboard" in await page.inner_text("body")
        job = await Queue(store).job(job_id)
        assert job is not None and job.status is JobStatus.DEAD


async def test_queues_page_pauses_and_resumes_a_queue(
    store: PostgresStore, serve: Any, page: Any, tmp_path: Any
) -> None:
    await seed(store, ready=5, scheduled=2, dead=3)
    queue = Queue(store)
    await Queue(store, queue="media").enqueue_many(Resize(image=i) for i in range(6))
    await queue.pause("reports", reason="month-end freeze")
    stats = await queue.stats()
    async with serve(opened(store)) as url:
        await page.goto(url + "/queues")
        names = await page.locator("tr[data-queue]").evaluate_all(
            "rows => rows.map(r => r.dataset.queue)"
        )
        assert names == ["default", "media", "reports"]
        for name, q in stats.queues.items():
            row = f"tr[data-queue='{name}']"
            assert await text(page, f"{row} [data-col=ready]") == str(q.pending)
            assert await text(page, f"{row} [data-col=scheduled]") == str(q.scheduled)
            assert await text(page, f"{row} [data-col=dead]") == str(q.dead)
            assert await text(page, f"{row} [data-col=failed-hour]") == str(q.failed_last_hour)
        assert await text(page, "tr[data-queue='reports'] [data-reason]") == "month-end freeze"

        media = "tr[data-queue='media']"
        await page.fill(f"{media} input[name=reason]", "resizer out of disk")
        await page.select_option(f"{media} select[name=for]", "1h")
        await screenshot(page, "queues-before", tmp_path)
        await page.click(f"{media} [data-action=pause]")
        await page.wait_for_url("**/queues?notice=paused&n=1&q=media&ns=*")
        assert "Paused queue media" in await text(page, ".notice")
        states = {s.name: s for s in await queue.queues()}
        assert states["media"].paused and states["media"].reason == "resizer out of disk"
        assert states["media"].until is not None
        assert await text(page, f"{media} [data-reason]") == "resizer out of disk"
        assert not states["default"].paused
        await screenshot(page, "queues", tmp_path)

        await page.click(f"{media} [data-action=resume]")
        await page.wait_for_url("**/queues?notice=resumed&n=1&q=media&ns=*")
        states = {s.name: s for s in await queue.queues()}
        assert not states["media"].paused and states["reports"].paused
        assert await page.locator(f"{media} [data-paused]").count() == 0


async def test_workers_page_shows_the_registry(
    store: PostgresStore, serve: Any, page: Any, tmp_path: Any
) -> None:
    queue = Queue(store)
    await queue.enqueue(Charge(order=1))
    worker: Worker[None] = Worker(None, store, concurrency=3)
    worker.register(Resize, resize)
    async with running(worker), serve(opened(store)) as url:

        async def leads() -> bool:
            return worker.leads

        await until(leads)
        (info,) = await queue.workers()
        await page.goto(url + "/workers")
        row = f"tr[data-worker='{info.id}']"
        assert await page.locator(f"{row} [data-leader]").count() == 1
        assert await text(page, f"{row} [data-state]") == "live"
        assert await text(page, "tr[data-unserved='default'] [data-kind]") == Charge.KIND
        await screenshot(page, "workers", tmp_path)


async def test_schedules_page_shows_next_runs(
    store: PostgresStore, serve: Any, page: Any, tmp_path: Any
) -> None:
    worker: Worker[None] = Worker(
        None,
        store,
        concurrency=1,
        schedules=[
            Schedule("hourly-thumbs", Resize(image=1), every=timedelta(hours=1)),
            Schedule("nightly-resize", Resize(image=2), cron="30 2 * * *"),
        ],
    )
    worker.register(Resize, resize)
    queue = Queue(store)
    async with running(worker):

        async def recorded() -> bool:
            return len(await queue.schedules()) == 2

        await until(recorded)
    infos = await queue.schedules()
    async with serve(opened(store)) as url:
        await page.goto(url + "/schedules")
        for info in infos:
            row = f"tr[data-schedule='{info.name}']"
            assert await text(page, f"{row} [data-col=spec]") == info.spec
            assert await text(page, f"{row} [data-col=enqueued]") == str(info.enqueued)
            assert _views.timestamp(info.next_tick) in await text(page, f"{row} [data-col=next]")
        await screenshot(page, "schedules", tmp_path)


async def test_batches_pages_show_progress_and_cancel(
    store: PostgresStore, serve: Any, page: Any, tmp_path: Any
) -> None:
    queue = Queue(store)
    done = await queue.batch("thumbnails").add(*(Resize(image=i) for i in range(8))).enqueue()
    worker: Worker[None] = Worker(None, store, concurrency=4)
    worker.register(Resize, resize)
    async with running(worker):

        async def finished() -> bool:
            status = await queue.batch_status(done)
            return status is not None and status.finished

        await until(finished)
    live = await (
        queue.batch("invoices")
        .add(*(Charge(order=i) for i in range(40)))
        .then(Resize(image=0))
        .finally_(Resize(image=1))
        .enqueue()
    )
    async with serve(opened(store)) as url:
        await page.goto(url + "/batches")
        ids = await page.locator("tr[data-batch]").evaluate_all(
            "rows => rows.map(r => r.dataset.batch)"
        )
        assert ids == [str(live), str(done)]  # newest first
        for batch_id in (live, done):
            status = await queue.batch_status(batch_id)
            assert status is not None
            row = f"tr[data-batch='{batch_id}']"
            assert await text(page, f"{row} [data-col=done]") == str(status.done)
            assert await text(page, f"{row} [data-col=pending]") == str(status.pending)
            assert await text(page, f"{row} [data-state]") == status.state
            percent = await page.locator(f"{row} .progress").get_attribute("data-percent")
            assert percent == str(status.percent)
        assert await page.locator(f"tr[data-batch='{done}'] [data-action=cancel]").count() == 0
        await screenshot(page, "batches", tmp_path)

        await page.click(f"tr[data-batch='{live}'] a.name")
        await page.wait_for_url(f"**/batches/{live}")
        assert await text(page, "[data-callback=then] [data-status]") == "waiting"
        await click_confirmed(page, "[data-action=cancel]")
        await page.wait_for_url(f"**/batches/{live}?notice=cancelled&n=40&ns=*")
        status = await queue.batch_status(live)
        assert status is not None and (status.cancelled, status.state) == (40, "cancelled")
        assert await text(page, "[data-col=cancelled]") == "40"
        assert await text(page, "[data-callback=then] [data-status]") == "cancelled"
        assert await text(page, "[data-callback=finally] [data-status]") == "pending"
        assert await page.locator("[data-action=cancel]").count() == 0
        await screenshot(page, "batch", tmp_path)

        member = (await queue.jobs(JobFilter(kind=Charge.KIND, limit=1)))[0]
        await page.goto(f"{url}/jobs/{member.id}")
        await page.click("[data-batch-link]")
        await page.wait_for_url(f"**/batches/{live}")


async def test_a_held_chain_resumes_when_its_dead_link_is_retried(
    store: PostgresStore, serve: Any, page: Any, tmp_path: Any
) -> None:
    queue = Queue(store)
    done = await queue.chain(Resize(image=7), Resize(image=8))
    worker: Worker[None] = Worker(None, store, concurrency=2)
    worker.register(Resize, resize)
    async with running(worker):
        await until_status(queue, done[1], JobStatus.COMPLETED)
    links = await held_chain(store)  # link 1 done, link 2 dead, link 3 waiting
    async with serve(opened(store)) as url:
        await page.goto(url + "/chains")
        held = f"tr[data-chain='{links[0]}']"
        assert await text(page, f"{held} [data-chain-state]") == "held"
        statuses = await page.locator(f"{held} [data-link]").evaluate_all(
            "items => items.map(i => i.dataset.linkStatus)"
        )
        assert statuses == ["completed", "dead", "waiting"]
        assert await text(page, f"tr[data-chain='{done[0]}'] [data-chain-state]") == "done"
        await screenshot(page, "chains", tmp_path)

        await page.click(f"{held} [data-held-job]")  # the dead link's page
        await page.wait_for_url(f"**/jobs/{links[1]}")
        assert await text(page, "[data-position]") == "link 2 of 3"
        await page.go_back()

        await page.click(f"{held} [data-action=retry]")
        await page.wait_for_url("**/chains?notice=retried&n=1&ns=*")
        job = await queue.job(links[1])
        assert job is not None and job.status is JobStatus.PENDING
        waiting = await queue.job(links[2])
        assert waiting is not None and waiting.status is JobStatus.WAITING
        assert await text(page, f"{held} [data-chain-state]") == "running"

        # A worker that now gets the charge through: the chain runs on to its end.
        async def charged(task: Charge, ctx: Any, app: None) -> None:
            return None

        fixed: Worker[None] = Worker(None, store, concurrency=2)
        fixed.register(Resize, resize)
        fixed.register(Charge, charged)
        async with running(fixed):
            await until_status(queue, links[2], JobStatus.COMPLETED)
        await page.wait_for_function(
            "sel => document.querySelector(sel)?.textContent.trim() === 'done'",
            arg=f"{held} [data-chain-state]",
            timeout=10_000,
        )
