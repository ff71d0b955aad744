"""A private Redis server for Celery's broker, started only when Celery is measured.

Debian's ``redis-server`` binary (installed with apt when missing and we are root), bound to
127.0.0.1 on a free port, in a temporary directory, with no configuration file: Redis's own
defaults except persistence, which is set to the append-only file with ``appendfsync
everysec`` (Redis's documented durable setting; a crash loses at most about a second of
acknowledged writes) and no RDB snapshots (whose fork would land inside measurements at
random). Stopped by PID when the run ends, whatever happens.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.pg import free_port

SETTINGS: dict[str, str] = {
    "appendonly": "yes",
    "appendfsync": "everysec",
    "save": "",
}


def find_binary() -> str:
    found = shutil.which("redis-server")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-q"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-q", "redis-server"], check=True, env=env)
        found = shutil.which("redis-server")
    if found is None:
        raise RuntimeError("redis-server not found: install Debian's 'redis-server' package")
    return found


@dataclass
class PrivateRedis:
    binary: str
    port: int = 0
    root: Path = field(default_factory=lambda: Path("."))
    _proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="venturi-bench-redis-"))
        for _attempt in range(3):  # the free port can be taken between probe and bind
            self.port = free_port()
            args = [
                self.binary,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--dir",
                str(self.root),
                "--daemonize",
                "no",
                "--protected-mode",
                "yes",
                "--logfile",
                str(self.root / "redis.log"),
            ]
            for name, value in SETTINGS.items():
                args += [f"--{name}", value]
            self._proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                # Own session: a Ctrl-C aimed at the harness must not stop the broker before
                # the harness has stopped Celery.
                start_new_session=True,
            )
            if self._wait_ready(10.0):
                return
            self._kill()
        raise RuntimeError(f"private Redis did not start; see {self.root / 'redis.log'}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                return False
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as sock,
            ):
                sock.sendall(b"PING\r\n")
                if sock.recv(64).startswith(b"+PONG"):
                    return True
            time.sleep(0.05)
        return False

    def describe(self) -> dict[str, object]:
        version = subprocess.run(
            [self.binary, "--version"], capture_output=True, text=True
        ).stdout.strip()
        return {"version": version, "settings": dict(SETTINGS)}

    def stop(self) -> None:
        self._kill()
        with contextlib.suppress(OSError):
            shutil.rmtree(self.root)

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        for sig, grace in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)
            try:
                proc.wait(timeout=grace)
                return
            except subprocess.TimeoutExpired:
                continue
