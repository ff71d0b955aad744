"""The dashboard app over HTTP (httpx on the ASGI app, a real PostgreSQL): closed by
default, the gate, loopback-only serving, read-only mode, the action checks, mounting under a
prefix, bounded queries."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Mount

from tests.dashboard.conftest import seed
from venturi import JobStatus, PostgresStore, Queue, dashboard


def client(
    app: Any, *, host: str = "127.0.0.1", base: str = "http://127.0.0.1:8080"
) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(host, 50000))
    return httpx.AsyncClient(transport=transport, base_url=base)


def csrf(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match, "no CSRF field on the page"
    return match[1]


async def test_without_a_gate_every_request_is_refused(store: PostgresStore) -> None:
    async with client(dashboard.app(store)) as http:
        for path in ("/", "/jobs", "/failed", "/static/dashboard.css", "/nowhere"):
            response = await http.get(path)
            assert response.status_code == 403
            assert "closed" in response.text and "gate=" in response.text
        response = await http.post("/failed/retry-all")
        assert response.status_code == 403


@pytest.mark.parametrize("verdict", [True, False])
async def test_the_gate_decides_and_may_be_async(store: PostgresStore, verdict: bool) -> None:
    seen: list[str] = []

    async def gate(request: Request) -> bool:
        seen.append(request.url.path)
        return verdict

    async with client(dashboard.app(store, gate=gate)) as http:
        response = await http.get("/jobs")
    assert response.status_code == (200 if verdict else 403)
    assert seen == ["/jobs"]


async def test_a_gate_must_say_true(store: PostgresStore) -> None:
    # A gate that returns a truthy object (a user, a request) refuses: only True opens.
    async with client(dashboard.app(store, gate=lambda request: request)) as http:  # type: ignore[arg-type,return-value]
        assert (await http.get("/")).status_code == 403


async def test_allow_local_admits_loopback_clients_that_name_a_loopback_host(
    store: PostgresStore,
) -> None:
    app = dashboard.app(store, allow_local=True)
    async with client(app) as http:
        assert (await http.get("/")).status_code == 200
    async with client(app, base="http://localhost:8080") as http:
        assert (await http.get("/")).status_code == 200
    async with client(app, host="10.1.2.3") as http:
        assert (await http.get("/")).status_code == 403
    # DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1.
    async with client(app, base="http://evil.example:8080") as http:
        assert (await http.get("/")).status_code == 403


async def test_every_response_carries_the_security_headers(store: PostgresStore) -> None:
    async with client(dashboard.app(store, gate=lambda r: True)) as http:
        response = await http.get("/")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["server-timing"].startswith("app;dur=")
    cookie = response.headers["set-cookie"].lower()
    assert "venturi_csrf=" in cookie and "httponly" in cookie and "samesite=strict" in cookie


async def test_an_action_needs_the_same_origin_and_the_token(store: PostgresStore) -> None:
    seeded = await seed(store, ready=0, scheduled=0, dead=1)
    job_id = seeded.dead[0]
    origin = {"origin": "http://127.0.0.1:8080"}
    async with client(dashboard.app(store, gate=lambda r: True)) as http:
        token = csrf((await http.get("/failed")).text)
        path = f"/jobs/{job_id}/retry"
        refused = [
            await http.post(path, data={"csrf": token}),  # no Origin
            await http.post(path, data={"csrf": token}, headers={"origin": "http://evil.example"}),
            await http.post(path, data={"csrf": "forged"}, headers=origin),
            await http.post(path, data={}, headers=origin),
        ]
        assert [r.status_code for r in refused] == [403, 403, 403, 403]
        job = await Queue(store).job(job_id)
        assert job is not None and job.status is JobStatus.DEAD

        done = await http.post(path, data={"csrf": token, "next": "/failed"}, headers=origin)
        assert done.status_code == 303
        assert done.headers["location"].startswith("/failed?notice=retried&n=1&ns=")
        # The redirect's banner shows; the same notice without this browser's signature
        # (a link crafted elsewhere) shows nothing.
        assert "Retried 1 job(s)" in (await http.get(done.headers["location"])).text
        crafted = await http.get("/failed?notice=retried&n=1&ns=" + "0" * 32)
        assert "Retried" not in crafted.text
        job = await Queue(store).job(job_id)
        assert job is not None and job.status is JobStatus.PENDING

        again = await http.post(path, data={"csrf": token, "next": "/failed"}, headers=origin)
        assert again.headers["location"].startswith("/failed?notice=retried_none&n=0&ns=")
        away = await http.post(
            path, data={"csrf": token, "next": "https://evil.example/"}, headers=origin
        )
        assert away.headers["location"].startswith("/failed?")


async def test_read_only_hides_and_refuses_the_actions(store: PostgresStore) -> None:
    seeded = await seed(store, ready=0, scheduled=0, dead=1)
    job_id = seeded.dead[0]
    async with client(dashboard.app(store, gate=lambda r: True, read_only=True)) as http:
        page = await http.get("/failed")
        assert page.status_code == 200
        assert str(job_id) in page.text
        assert '<form method="post"' not in page.text and "data-action" not in page.text
        job_page = await http.get(f"/jobs/{job_id}")
        assert "data-action" not in job_page.text
        token = http.cookies["venturi_csrf"]
        refused = await http.post(
            f"/jobs/{job_id}/retry",
            data={"csrf": token},
            headers={"origin": "http://127.0.0.1:8080"},
        )
        assert refused.status_code == 403 and "read-only" in refused.text
    job = await Queue(store).job(job_id)
    assert job is not None and job.status is JobStatus.DEAD


async def test_mounted_under_a_prefix_its_links_and_actions_keep_the_prefix(
    store: PostgresStore,
) -> None:
    seeded = await seed(store, ready=1, scheduled=0, dead=1)
    job_id = seeded.dead[0]
    host = Starlette(routes=[Mount("/ops/queue", app=dashboard.app(store, gate=lambda r: True))])
    async with client(host) as http:
        page = await http.get("/ops/queue/failed")
        assert page.status_code == 200
        hrefs = re.findall(r'\s(?:href|action|src)="([^"]+)"', page.text)
        assert hrefs and all(h.startswith("/ops/queue/") for h in hrefs), hrefs
        assert f'href="/ops/queue/jobs/{job_id}"' in page.text
        assert (await http.get("/ops/queue/static/live.js")).status_code == 200
        assert "path=/ops/queue/" in page.headers["set-cookie"].lower()
        done = await http.post(
            f"/ops/queue/jobs/{job_id}/forget",
            data={"csrf": csrf(page.text), "next": f"/ops/queue/jobs/{job_id}"},
            headers={"origin": "http://127.0.0.1:8080"},
        )
        assert done.status_code == 303
        assert done.headers["location"].startswith("/ops/queue/failed?notice=forgot&n=1&ns=")
        assert (await http.get("/ops/queue/")).status_code == 200
    assert await Queue(store).job(job_id) is None


async def test_the_store_may_be_given_late(store: PostgresStore) -> None:
    holder: dict[str, PostgresStore] = {}
    app = dashboard.app(lambda: holder["store"], gate=lambda r: True)  # built before the store
    holder["store"] = store
    async with client(app) as http:
        assert (await http.get("/")).status_code == 200


async def test_bad_input_is_a_clear_page_not_an_error(store: PostgresStore) -> None:
    seeded = await seed(store, ready=0, scheduled=0, dead=1)
    origin = {"origin": "http://127.0.0.1:8080"}
    async with client(dashboard.app(store, gate=lambda r: True)) as http:
        assert (await http.get("/jobs?status=sleeping")).status_code == 400
        assert (await http.get("/jobs?before=nope")).status_code == 400
        missing = await http.get("/jobs/01ARZ3NDEKTSV4RRFFQ69G5FAV")
        assert missing.status_code == 404 and "No job" in missing.text
        assert (await http.get("/jobs/nope")).status_code == 404
        # Filters no kind or queue can match, some of which the database itself refuses (a
        # NUL; bytes that are not UTF-8): a 400 naming the parameter, not a 500 or a 503.
        for query in ("kind=%00", "kind=%ff%fe", "kind=" + "a" * 5000, "queue=%00", "queue=a b"):
            response = await http.get(f"/jobs?{query}")
            name = query.split("=")[0]
            assert response.status_code == 400, query
            assert f"Not a {name}: {name}=" in response.text, query
        assert (await http.get("/failed?kind=%00")).status_code == 400
        forged = await http.get("/failed?notice=retried&n=-99999")
        assert forged.status_code == 200 and "Retried" not in forged.text
        token = csrf((await http.get("/failed")).text)
        bad = await http.post(
            "/failed/retry-all", data={"csrf": token, "kind": "bad kind"}, headers=origin
        )
        assert bad.status_code == 400 and "Not a kind: kind=" in bad.text
    job = await Queue(store).job(seeded.dead[0])
    assert job is not None and job.status is JobStatus.DEAD


async def test_a_query_past_the_statement_timeout_is_a_503(
    store: PostgresStore, pg_dsn: str
) -> None:
    # Hold the counters' table locked: the overview's read must give up at its timeout.
    import asyncpg

    locker = await asyncpg.connect(pg_dsn)
    try:
        async with locker.transaction():
            await locker.execute(f"LOCK TABLE {store.prefix}_counts IN ACCESS EXCLUSIVE MODE")
            app = dashboard.app(store, gate=lambda r: True, statement_timeout=0.2)
            async with client(app) as http:
                response = await http.get("/")
            assert response.status_code == 503
            assert "did not answer within 0.2 s" in response.text
    finally:
        await locker.close()


def test_venturi_never_imports_the_dashboard_stack() -> None:
    code = (
        "import sys, venturi, venturi.cli, venturi.worker; "
        "print(sorted(m for m in ('starlette', 'jinja2', 'uvicorn') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "[]"


def test_bad_settings_are_refused(store: PostgresStore) -> None:
    with pytest.raises(ValueError, match="refresh"):
        dashboard.app(store, refresh=0)
    with pytest.raises(ValueError, match="statement_timeout"):
        dashboard.app(store, statement_timeout=0)


async def test_cancelling_a_batch_that_had_finished_says_so(store: PostgresStore) -> None:
    batch_id = await Queue(store).batch("empty").enqueue()  # no members: finished at once
    origin = {"origin": "http://127.0.0.1:8080"}
    async with client(dashboard.app(store, gate=lambda r: True)) as http:
        await http.get(f"/batches/{batch_id}")  # (a stale page's form: the cookie's token)
        token = http.cookies["venturi_csrf"]
        done = await http.post(f"/batches/{batch_id}/cancel", data={"csrf": token}, headers=origin)
        assert done.status_code == 303 and "notice=cancelled_none" in done.headers["location"]
        page = (await http.get(done.headers["location"])).text
    assert "Nothing cancelled: the batch had finished" in page
    status = await Queue(store).batch_status(batch_id)
    assert status is not None and status.cancelled_at is None  # left as it ended
