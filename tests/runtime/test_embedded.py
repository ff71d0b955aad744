"""The embedded server is ready when it accepts connections, not when it listens: after a
crash it listens through its recovery, answering "the database system is not yet accepting
connections" (some builds of the server binaries have no `pg_isready` to tell)."""

from __future__ import annotations

import os
import shutil
import socket
import struct
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from venturi.embedded import EmbeddedPostgres, _accepts_connections, find_bindir


def _answering(first: bytes) -> Iterator[int]:
    """A TCP server on 127.0.0.1 answering each startup message with `first` (then closing)."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    seen: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                length = struct.unpack("!i", conn.recv(4))[0]
                seen.append(conn.recv(length - 4))
                conn.sendall(first)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        server.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close() alone does not)
        server.close()
        thread.join(5)
    assert seen and seen[0].startswith(struct.pack("!i", 196608)), "a protocol 3.0 startup"


@pytest.fixture
def starting_up() -> Iterator[int]:
    # What PostgreSQL sends while it recovers: an ErrorResponse ('E', SQLSTATE 57P03).
    yield from _answering(b"E\x00\x00\x00\x20SFATAL\x00C57P03\x00Mstarting up\x00\x00")


@pytest.fixture
def accepting() -> Iterator[int]:
    # AuthenticationOk ('R', 0), as a server with trust authentication answers.
    yield from _answering(b"R\x00\x00\x00\x08\x00\x00\x00\x00")


def test_a_server_that_listens_but_refuses_is_not_ready(starting_up: int) -> None:
    assert not _accepts_connections(starting_up)


@pytest.fixture
def refusing_this_user() -> Iterator[int]:
    # Up, and refusing this user (28000, as pg_hba.conf's "reject" says): pg_isready's "ok".
    yield from _answering(b"E\x00\x00\x00\x1dSFATAL\x00C28000\x00Mno entry\x00\x00")


def test_a_server_that_asks_to_authenticate_is_ready(accepting: int) -> None:
    assert _accepts_connections(accepting)


def test_a_server_that_refuses_the_user_is_up(refusing_this_user: int) -> None:
    assert _accepts_connections(refusing_this_user)


def test_nothing_listening_is_not_ready() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        assert not _accepts_connections(port)


@pytest.mark.slow
async def test_after_a_crash_launch_returns_once_connections_are_accepted(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    # Server binaries without pg_isready, as some distributions of them ship.
    bare = Path(tempfile.mkdtemp(prefix="venturi-bare-bin-"))
    os.chmod(bare, 0o755)
    for name in ("initdb", "postgres", "pg_ctl"):
        (bare / name).symlink_to(find_bindir() / name)
    monkeypatch.setenv("VENTURI_PG_BIN", str(bare))
    request.addfinalizer(lambda: shutil.rmtree(bare))
    with EmbeddedPostgres() as pg:
        conn = await asyncpg.connect(pg.dsn)
        # WAL to replay at the next start (written out at commit: the server's settings
        # skip that for speed), so that it listens a while before it accepts.
        await conn.execute("SET synchronous_commit = on")
        await conn.execute("CREATE TABLE t AS SELECT g FROM generate_series(1, 1000000) AS g")
        await conn.close()
        pg.halt("immediate")  # as a crash: the next start recovers from the WAL
        pg.launch()
        conn = await asyncpg.connect(pg.dsn)  # at once: no retry
        assert await conn.fetchval("SELECT NOT pg_is_in_recovery()")
        await conn.close()
        assert pg.log_path is not None
        assert "not properly shut down" in pg.log_path.read_text(errors="replace")
