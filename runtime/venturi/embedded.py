"""A private, throwaway PostgreSQL server: for the demo, for tests, for trying venturi out.

It uses the PostgreSQL server binaries installed on the machine (found through
`VENTURI_PG_BIN`, `pg_config --bindir`, /usr/lib/postgresql/<version>/bin, or PATH),
initializes a cluster in a temporary directory, listens on 127.0.0.1 on a free port,
and removes everything on stop. PostgreSQL refuses to run as root, so when run as root
it runs the server as the `postgres` user (or creates a system user `venturi-pg`).

    async with EmbeddedPostgres() as pg:
        store = await PostgresStore.connect(pg.dsn)

`EmbeddedPgBouncer` puts a private PgBouncer (the machine's `pgbouncer` binary), in
transaction pooling mode, in front of such a server: for tests and measurements of
`pooler="transaction"`.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import pwd
import re
import shutil
import signal
import socket
import struct
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


def _accepts_connections(port: int) -> bool:
    """What `pg_isready` tells (some builds of the server binaries come without it): whether
    the server answers a startup message, with anything but SQLSTATE 57P03 ("the database
    system is starting up", or "not yet accepting connections": in recovery after a crash, it
    listens long before it accepts them)."""
    params = b"user\0postgres\0database\0postgres\0\0"
    startup = struct.pack("!ii", 8 + len(params), 196608) + params  # protocol 3.0
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(startup)
            answer = s.recv(1)
            if answer != b"E":
                return answer != b""  # an authentication request ('R'): it takes connections
            # An ErrorResponse: its length, then fields of a type byte and a string each ('C'
            # is the SQLSTATE).
            with s.makefile("rb") as reply:
                (length,) = struct.unpack("!i", reply.read(4))
                message = reply.read(length - 4)
    except (OSError, struct.error):
        return False
    return b"\0C57P03\0" not in b"\0" + message


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


def _children(pid: int) -> list[int]:
    """Process ids whose parent is `pid` (Linux /proc)."""
    found = []
    for entry in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(entry).read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry.split("/")[2]))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class EmbeddedPostgres:
    """A PostgreSQL server in a temporary directory, owned by this process.

    `halt(mode)` and `launch()` stop and start the same cluster again (same port and data),
    for tests that take the database away under a running worker.
    """

    def __init__(
        self,
        *,
        settings: dict[str, str] | None = None,
        port: int | None = None,
        listen_addresses: str = "127.0.0.1",
        hba: list[str] | None = None,
    ) -> None:
        self.settings = {**FAST_SETTINGS, **(settings or {})}
        self.port = port or free_port()
        self.listen_addresses = listen_addresses
        self.hba = list(hba or [])
        """Extra pg_hba.conf lines (e.g. `host all all 10.0.0.0/30 trust`)."""
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def pid(self) -> int | None:
        """The postmaster's process id while the server runs."""
        return self._proc.pid if self._proc and self._proc.poll() is None else None

    @property
    def log_path(self) -> Path | None:
        return self._dir / "postgres.log" if self._dir else None

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
            user=user.pw_uid if user else None,
            group=user.pw_gid if user else None,
        )
        if init.returncode != 0:
            self._cleanup()
            raise EmbeddedPostgresError(f"initdb failed: {init.stderr.strip() or init.stdout}")
        if self.hba:
            with (data / "pg_hba.conf").open("a") as conf:
                conf.write("".join(f"{line}\n" for line in self.hba))
        self.launch()

    def launch(self) -> None:
        """Start the server on its existing cluster; blocks until it accepts connections."""
        if self._dir is None:
            raise EmbeddedPostgresError("launch() needs an initialized cluster: call start()")
        if self.pid is not None:
            return
        bindir = find_bindir()
        user = _server_user()
        args = [
            str(bindir / "postgres"),
            "-D",
            str(self._dir / "data"),
            "-p",
            str(self.port),
            "-c",
            f"listen_addresses={self.listen_addresses}",
            "-c",
            f"unix_socket_directories={self._dir / 'sock'}",
        ]
        for key, value in self.settings.items():
            args += ["-c", f"{key}={value}"]
        log = open(self._dir / "postgres.log", "ab")  # noqa: SIM115 - lives with the server
        self._proc = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self._dir,
            start_new_session=True,
            user=user.pw_uid if user else None,
            group=user.pw_gid if user else None,
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                text = (self._dir / "postgres.log").read_text(errors="replace")
                self._proc = None
                raise EmbeddedPostgresError(f"postgres exited at start:\n{text[-2000:]}")
            if _accepts_connections(self.port):
                return
            time.sleep(0.05)
        self.stop()
        raise EmbeddedPostgresError(f"postgres did not accept connections in {START_TIMEOUT}s")

    def halt(self, mode: str = "fast") -> None:
        """Stop the server but keep its cluster, as an outage would: "fast" (sessions are
        told and ended, a clean shutdown), "immediate" (no clean shutdown; crash recovery at
        the next start) or "kill" (SIGKILL of the postmaster; its backends, orphaned, exit
        on their own, and any still there after 10 s are killed too)."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            self._proc = None
            return
        signals = {"fast": signal.SIGINT, "immediate": signal.SIGQUIT, "kill": signal.SIGKILL}
        if mode not in signals:
            raise ValueError(f"halt(mode): expected fast, immediate or kill, got {mode!r}")
        children = _children(proc.pid) if mode == "kill" else []
        proc.send_signal(signals[mode])
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        deadline = time.monotonic() + 10
        while children and time.monotonic() < deadline:
            children = [pid for pid in children if _alive(pid)]
            time.sleep(0.02)
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._proc = None

    def stop(self) -> None:
        """Stop the server (fast shutdown) and delete its directory. Safe to call twice."""
        self.halt("fast")
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


def find_pgbouncer() -> Path:
    """The `pgbouncer` binary (`VENTURI_PGBOUNCER`, else PATH), or an error saying how to get it."""
    found = os.environ.get("VENTURI_PGBOUNCER") or shutil.which("pgbouncer")
    if not found:
        for candidate in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"):
            if os.access(candidate, os.X_OK):
                found = candidate
                break
    if not found:
        raise EmbeddedPostgresError(
            "pgbouncer not found: install it (Debian: apt-get install pgbouncer) or set "
            "VENTURI_PGBOUNCER to the binary"
        )
    return Path(found)


def pgbouncer_version(output: str) -> tuple[int, ...] | None:
    """The version `pgbouncer --version` printed ("PgBouncer 1.18.0" on its first line), or
    None if it says none."""
    match = re.match(r"\s*PgBouncer\s+(\d+(?:\.\d+)*)", output)
    return tuple(int(part) for part in match.group(1).split(".")) if match else None


def pgbouncer_settings(version: tuple[int, ...] | None) -> str:
    """Settings for the [pgbouncer] section that depend on its version: from 1.21 it can
    track prepared statements in transaction mode (`max_prepared_statements`, on by default
    from 1.24); turned off, so that the pooler behaves as every transaction pooler does (a
    prepared statement is gone in the next transaction), which is what `pooler="transaction"`
    is built and tested for."""
    return "max_prepared_statements = 0\n" if version is not None and version >= (1, 21) else ""


class EmbeddedPgBouncer:
    """A PgBouncer in a temporary directory, owned by this process, pooling connections to
    `server_port` on 127.0.0.1 (every database, trust authentication for `users`).

    `pool_mode` is "transaction" by default: a server connection is a client's only for the
    length of a transaction, which is what venturi's `pooler="transaction"` is for (with
    prepared-statement tracking off, see `pgbouncer_settings`). PgBouncer refuses to run as
    root, so as root it runs as the same unprivileged user as `EmbeddedPostgres`.
    """

    def __init__(
        self,
        server_port: int,
        *,
        pool_mode: str = "transaction",
        pool_size: int = 20,
        port: int | None = None,
        users: tuple[str, ...] = ("postgres",),
    ) -> None:
        self.server_port = server_port
        self.pool_mode = pool_mode
        self.pool_size = pool_size
        self.port = port or free_port()
        self.users = users
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def dsn(self) -> str:
        return f"postgresql://{self.users[0]}@127.0.0.1:{self.port}/postgres"

    @property
    def log_path(self) -> Path | None:
        return self._dir / "pgbouncer.log" if self._dir else None

    def start(self) -> None:
        """Write its configuration and start it; blocks until it accepts connections."""
        binary = find_pgbouncer()
        version = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
        user = _server_user()
        self._dir = Path(tempfile.mkdtemp(prefix="venturi-pgbouncer-"))
        (self._dir / "users.txt").write_text("".join(f'"{u}" ""\n' for u in self.users))
        (self._dir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={self.server_port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self._dir / 'users.txt'}\n"
            f"pool_mode = {self.pool_mode}\n"
            f"default_pool_size = {self.pool_size}\n"
            "max_client_conn = 1000\n"
            f"logfile = {self._dir / 'pgbouncer.log'}\n"
            f"pidfile = {self._dir / 'pgbouncer.pid'}\n"
            + pgbouncer_settings(pgbouncer_version(version))
        )
        if user is not None:
            os.chmod(self._dir, 0o755)
            for path in self._dir.iterdir():
                os.chown(path, user.pw_uid, user.pw_gid)
            os.chown(self._dir, user.pw_uid, user.pw_gid)
        self._proc = subprocess.Popen(
            [str(binary), str(self._dir / "pgbouncer.ini")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            cwd=self._dir,
            start_new_session=True,
            user=user.pw_uid if user else None,
            group=user.pw_gid if user else None,
        )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                log = self._dir / "pgbouncer.log"
                text = log.read_text(errors="replace") if log.exists() else ""
                self._proc = None
                self._cleanup()
                raise EmbeddedPostgresError(f"pgbouncer exited at start:\n{text[-2000:]}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        self.stop()
        raise EmbeddedPostgresError(f"pgbouncer did not accept connections in {START_TIMEOUT}s")

    def stop(self) -> None:
        """Stop it (SIGTERM: PgBouncer's immediate shutdown; a test's clients are done) and
        delete its directory. Safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
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
