"""A private PostgreSQL server for one benchmark run.

The suite never touches the test database or any server it did not start: it runs ``initdb``
into a fresh temporary directory, binds 127.0.0.1 on a free port, and stops the postmaster by
its PID when the run ends (the caller wraps it in ``try/finally``).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# PostgreSQL refuses to run as root; when we are root we drop to this OS user for the server.
SERVER_OS_USER = "postgres"
DB_USER = "bench"

# Settings applied to every run, written into RESULTS.md. Everything else is the PostgreSQL
# default. Durability stays at its defaults (fsync, synchronous_commit, full_page_writes on):
# every system pays the same commit cost, and the pgbench ceiling pays it too.
SERVER_SETTINGS: dict[str, str] = {
    "max_connections": "200",
    # The 1,000,000-job tables (~0.5 GB each) fit in memory, as they would on a real host.
    "shared_buffers": "1GB",
    # Loading 1,000,000 rows must not force checkpoints in the middle of a measurement; the
    # harness runs an explicit CHECKPOINT between phases instead.
    "max_wal_size": "8GB",
    "checkpoint_timeout": "30min",
    # A JIT compile (tens of ms) on a count over 1,000,000 rows would measure LLVM, not the queue.
    "jit": "off",
    "log_min_messages": "warning",
    "log_checkpoints": "off",
}

# Settings read back from the live server for the report.
REPORTED_SETTINGS = (
    "shared_buffers",
    "max_connections",
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_level",
    "max_wal_size",
    "checkpoint_timeout",
    "jit",
    "autovacuum",
    "work_mem",
    "effective_io_concurrency",
    "max_parallel_workers_per_gather",
)


def find_bindir() -> Path:
    """Locate the PostgreSQL server binaries, installing Debian's package on a bare machine."""
    override = os.environ.get("VENTURI_BENCH_PG_BINDIR")
    if override:
        return Path(override)
    found = _newest_bindir()
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-q"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-q", "postgresql"], check=True, env=env)
        found = _newest_bindir()
    if found is None:
        raise RuntimeError(
            "PostgreSQL server binaries not found: install the 'postgresql' package "
            "or set VENTURI_BENCH_PG_BINDIR"
        )
    return found


def _newest_bindir() -> Path | None:
    candidates = [Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/postgres")]
    candidates.sort(key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    if candidates:
        return candidates[-1]
    on_path = shutil.which("postgres")
    return Path(on_path).parent if on_path else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PrivateServer:
    """One postmaster in a temporary directory; start() then stop() exactly once."""

    bindir: Path
    port: int = 0
    root: Path = field(default_factory=lambda: Path("."))
    _proc: subprocess.Popen[bytes] | None = None
    _uid: int | None = None
    _gid: int | None = None

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    @property
    def logfile(self) -> Path:
        return self.root / "server.log"

    def dsn(self, dbname: str) -> str:
        return f"postgresql://{DB_USER}@127.0.0.1:{self.port}/{dbname}"

    def start(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="venturi-bench-pg-"))
        if os.geteuid() == 0:
            pw = pwd.getpwnam(SERVER_OS_USER)
            self._uid, self._gid = pw.pw_uid, pw.pw_gid
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        self._as_server_user(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(self.datadir),
                "-U",
                DB_USER,
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ]
        )
        last_error = ""
        for _attempt in range(3):  # the free port can be taken between probe and bind
            self.port = free_port()
            args = [
                str(self.bindir / "postgres"),
                "-D",
                str(self.datadir),
                "-p",
                str(self.port),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                f"unix_socket_directories={self.root}",
            ]
            for name, value in SERVER_SETTINGS.items():
                args += ["-c", f"{name}={value}"]
            log = open(self.logfile, "ab")  # noqa: SIM115 - handed to the child, closed below
            try:
                self._proc = subprocess.Popen(
                    args,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    user=self._uid,
                    group=self._gid,
                    # Own session: a Ctrl-C aimed at the harness must not kill the server
                    # before the harness has stopped its clients.
                    start_new_session=True,
                )
            finally:
                log.close()
            if self._wait_ready(timeout=30.0):
                return
            last_error = self.logfile.read_text(errors="replace")[-2000:]
            self._kill()
        raise RuntimeError(f"private PostgreSQL did not start:\n{last_error}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                return False
            probe = subprocess.run(
                [str(self.bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                capture_output=True,
            )
            if probe.returncode == 0:
                return True
            time.sleep(0.1)
        return False

    def stop(self) -> None:
        """Fast shutdown by PID (SIGINT), escalating if the postmaster does not exit."""
        self._kill()
        with contextlib.suppress(OSError):
            shutil.rmtree(self.root)

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        for sig, grace in ((signal.SIGINT, 60.0), (signal.SIGQUIT, 10.0), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)
            try:
                proc.wait(timeout=grace)
                return
            except subprocess.TimeoutExpired:
                continue

    def _as_server_user(self, args: list[str]) -> None:
        result = subprocess.run(
            args, capture_output=True, text=True, user=self._uid, group=self._gid
        )
        if result.returncode != 0:
            raise RuntimeError(f"{args[0]} failed: {result.stderr.strip()}")

    def psql(self, sql: str, dbname: str = "postgres") -> str:
        """Run one SQL command through psql (the orchestrator needs no driver); return its
        unaligned output."""
        return self._psql(["-c", sql], dbname, what=repr(sql))

    def psql_file(self, path: Path, dbname: str) -> str:
        """Run a SQL file statement by statement (so VACUUM and CHECKPOINT may appear in it)."""
        return self._psql(["-f", str(path)], dbname, what=str(path))

    def _psql(self, args: list[str], dbname: str, what: str) -> str:
        result = subprocess.run(
            [
                str(self.bindir / "psql"),
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                self.dsn(dbname),
                *args,
            ],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise RuntimeError(f"psql failed on {what}: {result.stderr.strip()}")
        return result.stdout.strip()

    def create_database(self, name: str) -> str:
        self.psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.psql(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        # WITH (FORCE): a client that crashed mid-scenario must not keep the database alive.
        self.psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def describe(self) -> dict[str, object]:
        version = self.psql("SELECT version()")
        names = ", ".join(f"'{n}'" for n in REPORTED_SETTINGS)
        rows = self.psql(
            "SELECT name || '=' || current_setting(name) FROM pg_settings "
            f"WHERE name IN ({names}) ORDER BY name"
        )
        settings = dict(line.split("=", 1) for line in rows.splitlines() if "=" in line)
        return {"version": version, "settings": settings}
