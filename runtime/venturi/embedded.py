"""A private, throwaway PostgreSQL server: for the demo, for tests, for trying venturi out.

It uses the PostgreSQL server binaries installed on the machine (found through
`VENTURI_PG_BIN`, `pg_config --bindir`, /usr/lib/postgresql/<version>/bin, or PATH),
initializes a cluster in a temporary directory, listens on 127.0.0.1 on a free port,
and removes everything on stop. PostgreSQL refuses to run as root, so when run as root
it runs the server as the `postgres` user (or creates a system user `venturi-pg`).

    async with EmbeddedPostgres() as pg:
        store = await PostgresStore.connect(pg.dsn)
"""

from __future__ import annotations

import asyncio
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

START_TIMEOUT = 60.0
"""Seconds to wait for the server to accept connections."""

FAST_SETTINGS = {
    # Durability is irrelevant for a throwaway server; these make tests several times faster.
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "300",
    "shared_buffers": "128MB",
}


class EmbeddedPostgresError(RuntimeError):
    """The embedded server could not be found, initialized or started."""


def find_bindir() -> Path:
    """The directory holding `initdb` and `postgres`, or an error that says how to get them."""
    candidates: list[str] = []
    if env := os.environ.get("VENTURI_PG_BIN"):
        candidates.append(env)
    if pg_config := shutil.which("pg_config"):
        try:
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, check=True, timeout=10
            )
            candidates.append(out.stdout.strip())
        except (OSError, subprocess.SubprocessError):
            pass
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates.extend(versions)
    if initdb := shutil.which("initdb"):
        candidates.append(str(Path(initdb).resolve().parent))
    for candidate in candidates:
        path = Path(candidate)
        if (path / "initdb").exists() and (path / "postgres").exists():
            return path
    raise EmbeddedPostgresError(
        "no PostgreSQL server binaries found (initdb, postgres): install them "
        "(Debian/Ubuntu: `apt-get install postgresql`) or set VENTURI_PG_BIN to their directory"
    )


def _server_user() -> pwd.struct_passwd | None:
    """None when not root; else the unprivileged user that will own and run the server."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "venturi-pg"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "venturi-pg"],
        check=True,
        capture_output=True,
    )
    return pwd.getpwnam("venturi-pg")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class EmbeddedPostgres:
    """A PostgreSQL server in a temporary directory, owned by this process."""

    def __init__(self, *, settings: dict[str, str] | None = None, port: int | None = None) -> None:
        self.settings = {**FAST_SETTINGS, **(settings or {})}
        self.port = port or free_port()
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> None:
        """Initialize and start the server; blocks until it accepts connections."""
        bindir = find_bindir()
        user = _server_user()
        self._dir = Path(tempfile.mkdtemp(prefix="venturi-pg-"))
        data, sockets = self._dir / "data", self._dir / "sock"
        sockets.mkdir()
        if user is not None:
            os.chmod(self._dir, 0o755)
            for path in (self._dir, sockets):
                os.chown(path, user.pw_uid, user.pw_gid)
        uid = user.pw_uid if user else None
        gid = user.pw_gid if user else None
        init = subprocess.run(
            [
                str(bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ],
            capture_output=True,
            text=True,
            cwd=self._dir,
            user=uid,
            group=gid,
        )
        if init.returncode != 0:
            self._cleanup()
            raise EmbeddedPostgresError(f"initdb failed: {init.stderr.strip() or init.stdout}")
        args = [
            str(bindir / "postgres"),
            "-D",
            str(data),
            "-p",
            str(self.port),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            f"unix_socket_directories={sockets}",
        ]
        for key, value in self.settings.items():
            args += ["-c", f"{key}={value}"]
        log = open(self._dir / "postgres.log", "wb")  # noqa: SIM115 - lives with the server
        self._proc = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self._dir,
            start_new_session=True,
            user=uid,
            group=gid,
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                text = (self._dir / "postgres.log").read_text(errors="replace")
                self._cleanup()
                raise EmbeddedPostgresError(f"postgres exited at start:\n{text[-2000:]}")
            ready = (
                subprocess.run(
                    [str(bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-q"],
                    capture_output=True,
                )
                if (bindir / "pg_isready").exists()
                else None
            )
            if ready is not None and ready.returncode == 0:
                return
            if ready is None:
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", self.port)) == 0:
                        return
            time.sleep(0.1)
        self.stop()
        raise EmbeddedPostgresError(f"postgres did not accept connections in {START_TIMEOUT}s")

    def stop(self) -> None:
        """Stop the server (fast shutdown) and delete its directory. Safe to call twice."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)  # fast shutdown: abort sessions, clean stop
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        self._cleanup()

    def _cleanup(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)
