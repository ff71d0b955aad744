"""The Starlette application: routes, pages, actions.

Pages are rendered on the server (Jinja2, autoescaped); `static/live.js` refreshes the parts
marked `data-live` every few seconds by fetching the page again. Links are built from the
mount path (`root_path`), so the app works under any prefix of a host app.
"""

from __future__ import annotations

import hmac
import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import jinja2
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from ulid import ULID

from venturi._settings import check_kind
from venturi._shown import shown
from venturi.codec import DEFAULT_CODEC, Codec
from venturi.dashboard import _guard, _views
from venturi.dashboard._store import BULK_LIMIT, DashboardStore
from venturi.errors import JobStateError
from venturi.jobs import JobFilter, JobStatus
from venturi.postgres import PostgresStore

PAGE_SIZE = 50
CHAINS_PAGE = 25
MAX_FORM_BYTES = 16384
_NOTICE_PARAMS = ("notice", "n", "q", "ns")

_NOTICES = {
    "retried": "Retried {n} job(s): pending again, eligible now, with every attempt again.",
    "retried_none": "Nothing retried: the job is not dead, or no longer kept (another click "
    "got there first?).",
    "retried_all": "Retried {n} dead job(s).",
    "retried_all_more": "Retried {n} dead job(s); more remain (at most {limit:,} a click): "
    "click again.",
    "forgot": "Forgot {n} job(s): deleted with their journal.",
    "forgot_none": "Nothing deleted: the job is no longer dead.",
    "paused": "Paused queue {q}: its jobs wait (running ones finish).",
    "resumed": "Resumed queue {q}: idle workers serving it were woken.",
    "resumed_none": "Queue {q} was not paused (another click, or its pause ran out?).",
    "cancelled": "Cancelled the batch: {n} job(s) not started were skipped; running ones finish.",
    "cancelled_none": "Nothing cancelled: the batch had finished (it stays as it ended).",
}

PAUSE_FOR = {
    "": None,
    "15m": timedelta(minutes=15),
    "1h": timedelta(hours=1),
    "4h": timedelta(hours=4),
}
"""The pause form's choices of how long: until resumed, or for a while."""


def app(
    store: PostgresStore | Callable[[], PostgresStore],
    *,
    gate: _guard.Gate | None = None,
    allow_local: bool = False,
    read_only: bool = False,
    refresh: float = 5.0,
    statement_timeout: float = 2.0,
    codec: Codec = DEFAULT_CODEC,
) -> Starlette:
    """The dashboard of `store`'s queue (its table prefix), as an ASGI app.

    `store` is a `PostgresStore`, or a function returning one (for a host app that opens its
    store in its lifespan, after the app is built). Closed by default: every request is
    refused (403) unless `gate(request)` returns True (it may be async), or `allow_local`
    is set and the request comes from this machine (loopback address and loopback Host).
    `read_only` hides the actions and refuses them. `refresh` is the live parts' period in
    seconds; `statement_timeout` bounds each query of a page, in seconds.
    """
    if refresh <= 0:
        raise ValueError(f"refresh: expected seconds > 0, got {refresh!r}")
    if not 0 < statement_timeout <= 60:
        raise ValueError(
            f"statement_timeout: expected 0 < seconds <= 60, got {statement_timeout!r}"
        )
    provide: Callable[[], PostgresStore] = (
        (lambda: store) if isinstance(store, PostgresStore) else store
    )
    pages = _Pages(
        provide, read_only=read_only, refresh=refresh, timeout=statement_timeout, codec=codec
    )
    routes = [
        Route("/", pages.overview, name="overview"),
        Route("/jobs", pages.jobs, name="jobs"),
        Route("/jobs/{job_id}", pages.job, name="job"),
        Route("/failed", pages.failed, name="failed"),
        Route("/queues", pages.queues, name="queues"),
        Route("/workers", pages.workers, name="workers"),
        Route("/schedules", pages.schedules, name="schedules"),
        Route("/batches", pages.batches, name="batches"),
        Route("/batches/{batch_id}", pages.batch, name="batch"),
        Route("/batches/{batch_id}/cancel", pages.cancel_batch, methods=["POST"]),
        Route("/chains", pages.chains, name="chains"),
        Route("/queues/pause", pages.pause, methods=["POST"]),
        Route("/queues/resume", pages.resume, methods=["POST"]),
        Route("/jobs/{job_id}/retry", pages.retry, methods=["POST"]),
        Route("/jobs/{job_id}/forget", pages.forget, methods=["POST"]),
        Route("/failed/retry-all", pages.retry_all, methods=["POST"]),
        Mount("/static", StaticFiles(packages=[("venturi.dashboard", "static")]), name="static"),
    ]
    return Starlette(
        routes=routes,
        middleware=[Middleware(_guard.Guard, gate=gate, allow_local=allow_local)],
        exception_handlers={
            asyncpg.PostgresError: pages.unavailable,
            OSError: pages.unavailable,
            HTTPException: pages.http_error,
        },
    )


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("venturi.dashboard", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        number=_views.number,
        duration=_views.duration,
        timestamp=_views.timestamp,
        pretty=_views.pretty,
        first_line=_views.first_line,
    )
    return env


class _Pages:
    def __init__(
        self,
        provide: Callable[[], PostgresStore],
        *,
        read_only: bool,
        refresh: float,
        timeout: float,
        codec: Codec,
    ) -> None:
        self._provide = provide
        self._read_only = read_only
        self._refresh = refresh
        self._timeout = timeout
        self._codec = codec
        self._env = _environment()
        self._stores: dict[int, DashboardStore] = {}

    def _store(self) -> DashboardStore:
        store = self._provide()
        found = self._stores.get(id(store))
        if found is None or found.store is not store:
            found = DashboardStore(store, statement_timeout=self._timeout, codec=self._codec)
            self._stores = {id(store): found}  # the one in use: a new store replaces it
        return found

    # -- rendering ------------------------------------------------------------------------

    def _render(self, request: Request, template: str, code: int = 200, **context: Any) -> Response:
        base = request.scope.get("root_path", "").rstrip("/")
        token = request.cookies.get(_guard.CSRF_COOKIE) or _guard.new_token()
        notice = _notice(request.query_params, request.cookies.get(_guard.CSRF_COOKIE))
        html = self._env.get_template(template).render(
            base=base,
            here=_here(request),
            csrf=token,
            read_only=self._read_only,
            refresh=self._refresh,
            notice=notice,
            prefix=self._provide().prefix,
            link=lambda path, **params: _link(base, path, params),
            **context,
        )
        response = HTMLResponse(html, status_code=code)
        if request.cookies.get(_guard.CSRF_COOKIE) != token:
            response.set_cookie(
                _guard.CSRF_COOKIE,
                token,
                path=(base or "") + "/",
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
            )
        return response

    async def unavailable(self, request: Request, exc: Exception) -> Response:
        if isinstance(exc, asyncpg.QueryCanceledError):
            reason = f"the database did not answer within {self._timeout:g} s"
        else:
            reason = f"the database is unavailable ({type(exc).__name__})"
        return self._render(request, "error.html", code=503, title="Unavailable", reason=reason)

    async def http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return self._render(
            request,
            "error.html",
            code=exc.status_code,
            title=str(exc.status_code),
            reason=exc.detail,
        )

    # -- pages ----------------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        async with self._store().reading() as reader:
            stats = await reader.stats()
            counts = await reader.counts()
            states = await reader.queue_states()
            minutes = await reader.per_minute()
            now = await reader.now()
        view = _views.overview(stats, counts)
        return self._render(
            request,
            "overview.html",
            page="overview",
            view=view,
            queues=_views.queue_rows(stats, states),
            chart=_views.minute_chart(minutes, now),
            now=now,
            ago=lambda at: _views.ago(at, now),
        )

    async def queues(self, request: Request) -> Response:
        async with self._store().reading() as reader:
            stats = await reader.stats()
            states = await reader.queue_states()
            now = await reader.now()
        return self._render(
            request,
            "queues.html",
            page="queues",
            queues=_views.queue_rows(stats, states),
            pause_for=PAUSE_FOR,
            now=now,
            ago=lambda at: _views.ago(at, now),
        )

    async def workers(self, request: Request) -> Response:
        async with self._store().reading() as reader:
            workers = await reader.workers()
            unserved = await reader.unserved_kinds()
            now = await reader.now()
        return self._render(
            request,
            "workers.html",
            page="workers",
            workers=_views.worker_rows(workers),
            unserved=sorted(unserved.items()),
            now=now,
            ago=lambda at: _views.ago(at, now),
        )

    async def schedules(self, request: Request) -> Response:
        async with self._store().reading() as reader:
            schedules = await reader.schedules()
            now = await reader.now()
        return self._render(
            request,
            "schedules.html",
            page="schedules",
            schedules=schedules,
            now=now,
            ago=lambda at: _views.ago(at, now),
        )

    async def batches(self, request: Request) -> Response:
        before = _ulid(request.query_params.get("before"), "before=", noun="batch")
        async with self._store().reading() as reader:
            found = await reader.batches(PAGE_SIZE + 1, before)
            now = await reader.now()
        more = len(found) > PAGE_SIZE
        found = found[:PAGE_SIZE]
        return self._render(
            request,
            "batches.html",
            page="batches",
            batches=found,
            paged=before is not None,
            older=str(found[-1].id) if more else None,
            ago=lambda at: _views.ago(at, now),
        )

    async def batch(self, request: Request) -> Response:
        batch_id = _ulid(request.path_params["batch_id"], "the path", noun="batch")
        assert batch_id is not None
        async with self._store().reading() as reader:
            status = await reader.batch(batch_id)
            if status is None:
                raise HTTPException(404, f"No batch {batch_id} (never stored, or pruned).")
            callbacks = await reader.batch_callbacks(batch_id)
            now = await reader.now()
        return self._render(
            request,
            "batch.html",
            page="batches",
            batch=status,
            callbacks=callbacks,
            ago=lambda at: _views.ago(at, now),
        )

    async def chains(self, request: Request) -> Response:
        before = _ulid(request.query_params.get("before"), "before=")
        async with self._store().reading() as reader:
            found = await reader.chains(before=before, limit=CHAINS_PAGE + 1)
            now = await reader.now()
        more = len(found) > CHAINS_PAGE
        chains = [_views.chain(head, links) for head, links in found[:CHAINS_PAGE]]
        return self._render(
            request,
            "chains.html",
            page="chains",
            chains=chains,
            paged=before is not None,
            older=str(chains[-1].head) if more else None,
            now=now,
            link_status=lambda link: _views.link_status(link, now),
            ago=lambda at: _views.ago(at, now),
        )

    async def jobs(self, request: Request) -> Response:
        params = request.query_params
        status = _status(params.get("status"))
        kind = _name(params.get("kind"), "kind")
        queue = _name(params.get("queue"), "queue")
        before = _ulid(params.get("before"), "before=")
        async with self._store().reading() as reader:
            found = await reader.jobs(
                JobFilter(
                    status=status, kind=kind, queue=queue, before_id=before, limit=PAGE_SIZE + 1
                )
            )
            counts = await reader.counts()
            now = await reader.now()
        more = len(found) > PAGE_SIZE
        found = found[:PAGE_SIZE]
        return self._render(
            request,
            "jobs.html",
            page="jobs",
            jobs=found,
            now=now,
            status=status.value if status else "",
            kind=kind or "",
            queue=queue or "",
            paged=before is not None,
            older=str(found[-1].id) if more else None,
            kinds=sorted(counts),
            # The kept counters are by kind and status: the tabs count what the kind filter
            # shows; by queue there are no counters yet (stats by queue are not built), so none.
            totals=None
            if queue
            else _views.status_totals({k: c for k, c in counts.items() if kind in (None, k)}),
            statuses=[s.value for s in JobStatus],
            shown_status=lambda j: _views.shown_status(j, now),
            ago=lambda at: _views.ago(at, now),
        )

    async def job(self, request: Request) -> Response:
        job_id = _ulid(request.path_params["job_id"], "the path")
        assert job_id is not None
        async with self._store().reading() as reader:
            found = await reader.job(job_id)
            entries = await reader.journal(job_id) if found is not None else []
            links, earlier = await reader.job_chain(job_id) if found else ([], False)
            now = await reader.now()
        if found is None:
            raise HTTPException(404, f"No job {job_id}: it never existed, or it was deleted.")
        # A link of a chain when another link points at it or it points at one.
        in_chain = len(links) > 1 or earlier
        chain = _views.chain(links[0].id, links, earlier=earlier) if in_chain else None
        place = _views.place_in(chain, job_id) if chain is not None else None
        return self._render(
            request,
            "job.html",
            page="jobs",
            job=found,
            entries=entries,
            chain=chain,
            place=place,
            now=now,
            shown=_views.shown_status(found, now),
            link_status=lambda link: _views.link_status(link, now),
            ago=lambda at: _views.ago(at, now),
        )

    async def failed(self, request: Request) -> Response:
        params = request.query_params
        kind = _name(params.get("kind"), "kind")
        before = _ulid(params.get("before"), "before=")
        async with self._store().reading() as reader:
            found = await reader.jobs(
                JobFilter(status=JobStatus.DEAD, kind=kind, before_id=before, limit=PAGE_SIZE + 1)
            )
            counts = await reader.counts()
            now = await reader.now()
        more = len(found) > PAGE_SIZE
        found = found[:PAGE_SIZE]
        dead_kinds = sorted(k for k, c in counts.items() if c.get(JobStatus.DEAD))
        dead = sum(c.get(JobStatus.DEAD, 0) for k, c in counts.items() if kind is None or k == kind)
        return self._render(
            request,
            "failed.html",
            page="failed",
            jobs=found,
            now=now,
            kind=kind or "",
            kinds=dead_kinds,
            dead=dead,
            paged=before is not None,
            older=str(found[-1].id) if more else None,
            ago=lambda at: _views.ago(at, now),
        )

    # -- actions --------------------------------------------------------------------------

    async def _form(self, request: Request) -> dict[str, str]:
        """The action's form, after the read-only, same-origin and CSRF checks."""
        if self._read_only:
            raise HTTPException(403, "This dashboard is read-only: actions are turned off.")
        if not _guard.same_origin(request.headers):
            raise HTTPException(
                403, "Refused: the request did not come from this dashboard's pages."
            )
        body = await request.body()
        if len(body) > MAX_FORM_BYTES:
            raise HTTPException(413, "Form too large.")
        form = {k: v[0] for k, v in urllib.parse.parse_qs(body.decode("utf-8", "replace")).items()}
        if not _guard.token_matches(
            request.cookies.get(_guard.CSRF_COOKIE), form.get(_guard.CSRF_FIELD)
        ):
            raise HTTPException(
                403, "Refused: the form's token is missing or stale; reload the page."
            )
        return form

    def _back(
        self,
        request: Request,
        form: dict[str, str],
        notice: str,
        n: int,
        *,
        default: str = "/failed",
        queue: str | None = None,
    ) -> Response:
        base = request.scope.get("root_path", "").rstrip("/")
        target = _safe_next(form.get("next"), base) or f"{base}{default}"
        split = urllib.parse.urlsplit(target)
        query = [(k, v) for k, v in urllib.parse.parse_qsl(split.query) if k not in _NOTICE_PARAMS]
        query += [("notice", notice), ("n", str(n))]
        if queue is not None:
            query.append(("q", queue))
        signature = _guard.notice_signature(
            request.cookies.get(_guard.CSRF_COOKIE), notice, str(n), queue or ""
        )
        if signature is not None:  # (an action always has the cookie: its token matched it)
            query.append(("ns", signature))
        return RedirectResponse(f"{split.path}?{urllib.parse.urlencode(query)}", status_code=303)

    async def retry(self, request: Request) -> Response:
        form = await self._form(request)
        job_id = _ulid(request.path_params["job_id"], "the path")
        assert job_id is not None
        try:
            done = await self._store().retry(job_id, actor=_guard.actor(request))
        except JobStateError as exc:  # a unique job whose id another job holds now
            raise HTTPException(409, f"Not retried: {exc}.") from None
        return self._back(request, form, "retried" if done else "retried_none", int(done))

    async def forget(self, request: Request) -> Response:
        form = await self._form(request)
        job_id = _ulid(request.path_params["job_id"], "the path")
        assert job_id is not None
        done = await self._store().forget(job_id)
        base = request.scope.get("root_path", "").rstrip("/")
        # The job's own page is gone: back to where the click came from, unless that was it.
        if (form.get("next") or "").split("?")[0] == f"{base}/jobs/{job_id}":
            form = {**form, "next": f"{base}/failed"}
        return self._back(request, form, "forgot" if done else "forgot_none", int(done))

    async def retry_all(self, request: Request) -> Response:
        form = await self._form(request)
        kind = _name(form.get("kind"), "kind")
        store = self._store()
        n = await store.retry_all(kind=kind, actor=_guard.actor(request))
        more = n >= BULK_LIMIT and await store.dead_count(kind) > 0
        return self._back(request, form, "retried_all_more" if more else "retried_all", n)

    async def pause(self, request: Request) -> Response:
        form = await self._form(request)
        name = form.get("queue", "")
        length = form.get("for", "")
        if length not in PAUSE_FOR:
            raise HTTPException(
                400,
                f"Not paused: for={shown(length, 40)}: expected 15m, 1h, 4h or empty "
                "(until resumed).",
            )
        span = PAUSE_FOR[length]
        until = None if span is None else datetime.now(UTC) + span
        reason = form.get("reason", "").strip() or None
        try:
            await self._store().pause(name, reason=reason, until=until)
        except (ValueError, TypeError) as exc:
            raise HTTPException(400, f"Not paused: {exc}") from None
        return self._back(request, form, "paused", 1, default="/queues", queue=name)

    async def cancel_batch(self, request: Request) -> Response:
        form = await self._form(request)
        batch_id = _ulid(request.path_params["batch_id"], "the path", noun="batch")
        assert batch_id is not None
        try:
            skipped = await self._store().cancel_batch(batch_id)
        except LookupError:
            raise HTTPException(404, f"No batch {batch_id} (never stored, or pruned).") from None
        if skipped is None:
            return self._back(request, form, "cancelled_none", 0, default=f"/batches/{batch_id}")
        return self._back(request, form, "cancelled", skipped, default=f"/batches/{batch_id}")

    async def resume(self, request: Request) -> Response:
        form = await self._form(request)
        name = form.get("queue", "")
        try:
            was = await self._store().resume(name)
        except (ValueError, TypeError) as exc:
            raise HTTPException(400, f"Not resumed: {exc}") from None
        notice = "resumed" if was else "resumed_none"
        return self._back(request, form, notice, int(was), default="/queues", queue=name)


def _status(text: str | None) -> JobStatus | None:
    if not text:
        return None
    try:
        return JobStatus(text)
    except ValueError:
        raise HTTPException(
            400,
            f"Unknown status {text!r}: expected one of {', '.join(s.value for s in JobStatus)}.",
        ) from None


def _name(text: str | None, what: str) -> str | None:
    """A kind or queue name from a filter (empty: any), or a 400 naming what is wrong: no
    job can have another, and the database would refuse some (a NUL) with its own error."""
    if not text:
        return None
    try:
        return check_kind(text)  # a queue name follows the same rule
    except ValueError:
        raise HTTPException(
            400,
            f"Not a {what}: {what}={shown(text)} (a {what} is 1-200 letters, digits and "
            "_ . : / -, starting with a letter or digit).",
        ) from None


def _ulid(text: str | None, what: str, *, noun: str = "job") -> ULID | None:
    """An id from the path (not a page there: 404) or from a parameter (a bad request: 400)."""
    if not text:
        return None
    try:
        return ULID.from_str(text)
    except ValueError:
        code = 404 if what == "the path" else 400
        raise HTTPException(code, f"Not a {noun} id: {what} must be a 26-character ULID.") from None


def _here(request: Request) -> str:
    """This page's path and query (for an action's way back), without its notice."""
    query = [(k, v) for k, v in request.query_params.multi_items() if k not in _NOTICE_PARAMS]
    path = request.url.path
    return f"{path}?{urllib.parse.urlencode(query)}" if query else path


def _safe_next(target: str | None, base: str) -> str | None:
    """An action's way back, if it is a path of this dashboard (never another site)."""
    if not target:
        return None
    split = urllib.parse.urlsplit(target)
    if split.scheme or split.netloc or target.startswith("//") or "\\" in target:
        return None
    if not (split.path == base + "/" or split.path.startswith(base + "/") or split.path == base):
        return None
    return target


def _link(base: str, path: str, params: dict[str, Any]) -> str:
    query = urllib.parse.urlencode({k: v for k, v in params.items() if v not in (None, "")})
    return f"{base}{path}" + (f"?{query}" if query else "")


def _notice(params: Any, cookie: str | None) -> str | None:
    """The banner of the action that redirected here: only if its redirect signed it for
    this browser (a link from elsewhere shows none)."""
    template = _NOTICES.get(params.get("notice", ""))
    if template is None:
        return None
    signature = _guard.notice_signature(
        cookie, params.get("notice", ""), params.get("n", ""), params.get("q", "")
    )
    if signature is None or not hmac.compare_digest(signature, params.get("ns", "")):
        return None
    try:
        n = int(params.get("n", "0"))
    except ValueError:
        return None
    if not 0 <= n <= 1_000_000_000:  # only an action's redirect writes it: not from one
        return None
    return template.format(n=n, limit=BULK_LIMIT, q=params.get("q", "")[:200])
