"""Who may open the dashboard, and which POSTs are the dashboard's own.

Closed by default: every request is refused unless the app was given a gate (a callable that
sees the request) or `allow_local=True` (what `venturi dashboard` passes, serving on
127.0.0.1), which admits only loopback clients that also named a loopback host (a page on
another site cannot reach it through DNS rebinding). Actions are POSTs that must come from a
page of the same origin and carry the CSRF token of the double-submit cookie.

The checks are plain functions of the request's parts; `Guard` is the ASGI middleware that
applies them (and sets the security headers of every response).
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import ipaddress
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

Gate = Callable[[Request], bool | Awaitable[bool]]
"""Decides whether a request may see the dashboard; may be async."""

CSRF_COOKIE = "venturi_csrf"
CSRF_FIELD = "csrf"

REFUSED = (
    "venturi dashboard: closed. It opens only to requests its gate lets in: mount it with "
    "venturi.dashboard.app(store, gate=lambda request: ...), or run `venturi dashboard`, "
    "which serves it on 127.0.0.1 to local clients only.\n"
)

SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost"})


def is_loopback_address(host: str | None) -> bool:
    """True for 127.0.0.0/8 and ::1 (a client's address)."""
    if not host:
        return False
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_loopback_host(host_header: str | None) -> bool:
    """True when the Host header names this machine: `localhost`, 127.x or [::1], any
    port. A name that resolves to 127.0.0.1 elsewhere (DNS rebinding) is refused."""
    if not host_header:
        return False
    host = host_header.strip().lower()
    if host.startswith("["):  # [::1]:8080
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    return host in _LOOPBACK_NAMES or is_loopback_address(host)


def same_origin(headers: Mapping[str, str]) -> bool:
    """True when a POST comes from a page of this site: its Origin names the host the request
    was sent to, or (no Origin) the browser says Sec-Fetch-Site: same-origin. A POST with
    neither is refused (every current browser sends Origin with a form's POST)."""
    host = headers.get("host")
    origin = headers.get("origin")
    if origin is not None:
        if not host or origin == "null":
            return False
        _, sep, authority = origin.partition("://")
        return bool(sep) and authority.lower() == host.lower()
    return headers.get("sec-fetch-site") == "same-origin"


def token_matches(cookie: str | None, submitted: str | None) -> bool:
    """The double-submit check: the form's token equals the cookie's (constant time)."""
    if not cookie or not submitted:
        return False
    return hmac.compare_digest(cookie.encode(), submitted.encode())


def notice_signature(cookie: str | None, notice: str, n: str, queue: str) -> str | None:
    """What an action's redirect signs its notice with (the browser's CSRF cookie as the
    key), so that a crafted link cannot put text of its own in the dashboard's banner."""
    if not cookie:
        return None
    message = "\0".join((notice, n, queue)).encode()
    return hmac.new(cookie.encode(), message, hashlib.sha256).hexdigest()[:32]


def new_token() -> str:
    return secrets.token_urlsafe(32)


def actor(request: Request) -> str:
    """Who did an action, for the journal: the authenticated user's name when the host app
    has authentication middleware, else the client's address."""
    user = request.scope.get("user")
    if user is not None and _read(user, "is_authenticated", True):
        for attribute in ("display_name", "identity", "username", "email"):
            name = _read(user, attribute, None)
            if name:
                return str(name)
    return request.client.host if request.client else "unknown"


def _read(user: object, attribute: str, default: object) -> object:
    """An attribute of the host app's user, if it has it: Starlette's `BaseUser` raises
    NotImplementedError for what a subclass left out."""
    try:
        return getattr(user, attribute, default)
    except NotImplementedError:
        return default


class Guard:
    """ASGI middleware: refuse what the gate refuses; headers on every response; the
    server time of each response (`Server-Timing: app;dur=ms`)."""

    def __init__(self, app: ASGIApp, *, gate: Gate | None, allow_local: bool) -> None:
        self.app = app
        self.gate = gate
        self.allow_local = allow_local

    async def allowed(self, request: Request) -> bool:
        if self.allow_local and (
            is_loopback_address(request.client.host if request.client else None)
            and is_loopback_host(request.headers.get("host"))
        ):
            return True
        if self.gate is None:
            return False
        verdict: Any = self.gate(request)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        return verdict is True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {k.lower() for k, _ in headers}
                for name, value in SECURITY_HEADERS.items():
                    if name.encode() not in present:
                        headers.append((name.encode(), value.encode()))
                spent = (time.perf_counter() - started) * 1000
                headers.append((b"server-timing", f"app;dur={spent:.1f}".encode()))
                message = {**message, "headers": headers}
            await send(message)

        if not await self.allowed(Request(scope)):
            response = PlainTextResponse(REFUSED, status_code=403)
            await response(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)
