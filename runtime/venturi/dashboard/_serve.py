"""Serving the dashboard alone (`venturi dashboard`, `venturi demo --dashboard`): uvicorn on a
socket bound before it starts, until an event says stop. Signals are the caller's: uvicorn's
own handlers would re-raise SIGINT after a graceful stop, in the middle of the caller's
clean-up."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn

from venturi.dashboard._guard import is_loopback_address


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the caller stops the server (`should_exit`)


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on `host:port` (port 0: any free one). Raises OSError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


def local_only(host: str) -> bool:
    return is_loopback_address(host) or host == "localhost"


async def serve(app: Any, sock: socket.socket, shutdown: asyncio.Event) -> None:
    """Serve `app` on `sock` until `shutdown` is set, then stop gracefully."""
    server = _Server(uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    stop = asyncio.create_task(shutdown.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        server.should_exit = True
        stop.cancel()
        await task
        sock.close()
