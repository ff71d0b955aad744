"""The orchestrator's handles on adapter processes: spawn, talk JSON lines, stop, always.

Every process started here is stopped here: ``close()``/``stop()`` end it politely (EOF or a
``stop`` line), then by SIGTERM and SIGKILL to its PID if it does not exit in time, and the
scenario code calls them from ``finally`` blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from bench.harness import ProcSample, read_proc


class AdapterError(RuntimeError):
    """An adapter process failed, answered with an error, or went silent."""


class EventTimeout(AdapterError):
    """A worker is alive but has not sent the awaited event in time."""


@dataclass(frozen=True)
class SystemEnv:
    """How to start one system's adapter: a command (a venv's ``python -m bench.adapters
    SYSTEM``, a Go binary, ``node adapter.mjs``) that takes the role and its options after it,
    plus the environment variables it needs beside the harness's own."""

    name: str
    command: tuple[str, ...]
    logdir: Path
    extra_env: tuple[tuple[str, str], ...] = ()

    @classmethod
    def python(
        cls,
        name: str,
        python: Path,
        pythonpath: Path,
        logdir: Path,
        *,
        adapter: str | None = None,
        extra_env: tuple[tuple[str, str], ...] = (),
    ) -> SystemEnv:
        # ``pythonpath`` is a directory holding only a ``bench`` link, so nothing else of the
        # repository can shadow a module inside the venv.
        return cls(
            name,
            (str(python), "-m", "bench.adapters", adapter or name),
            logdir,
            (("PYTHONPATH", str(pythonpath)), ("PYTHONDONTWRITEBYTECODE", "1"), *extra_env),
        )

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env.update(self.extra_env)
        return env


def _open_log(env: SystemEnv, log_name: str) -> BinaryIO:
    env.logdir.mkdir(parents=True, exist_ok=True)
    return open(env.logdir / f"{log_name}.log", "ab")


async def _spawn(env: SystemEnv, args: list[str], log_name: str) -> asyncio.subprocess.Process:
    # The child's stderr (library logs, tracebacks) goes to a per-process log file.
    log = _open_log(env, log_name)
    try:
        return await asyncio.create_subprocess_exec(
            *env.command,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
            env=env.env(),
            cwd=str(env.logdir),
        )
    finally:
        log.close()


async def _end(proc: asyncio.subprocess.Process, grace: float) -> None:
    """Wait up to ``grace`` for a voluntary exit, then SIGTERM, then SIGKILL, by PID."""
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        if sig is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)
        try:
            await asyncio.wait_for(proc.wait(), timeout=grace)
            return
        except TimeoutError:
            continue


class ControlProcess:
    """A long-lived control adapter: one request line in, one reply line out."""

    def __init__(self, proc: asyncio.subprocess.Process, name: str) -> None:
        self._proc = proc
        self._name = name

    @classmethod
    async def start(cls, env: SystemEnv, dsn: str, log_name: str) -> ControlProcess:
        proc = await _spawn(env, ["control", "--dsn", dsn], log_name)
        return cls(proc, env.name)

    async def call(self, cmd: str, within: float, **params: Any) -> dict[str, Any]:
        """Send one command; its reply must arrive ``within`` seconds."""
        assert self._proc.stdin is not None
        assert self._proc.stdout is not None
        self._proc.stdin.write((json.dumps({"cmd": cmd, **params}) + "\n").encode())
        await self._proc.stdin.drain()
        try:
            line = await asyncio.wait_for(self._proc.stdout.readline(), timeout=within)
        except TimeoutError:
            raise AdapterError(f"{self._name}: '{cmd}' took more than {within:.0f}s") from None
        if not line:
            raise AdapterError(f"{self._name}: control process exited during '{cmd}'")
        reply: dict[str, Any] = json.loads(line)
        if not reply.pop("ok", False):
            raise AdapterError(f"{self._name}: '{cmd}' failed: {reply.get('error')}")
        return reply

    async def close(self) -> None:
        if self._proc.stdin is not None and not self._proc.stdin.is_closing():
            self._proc.stdin.close()
        await _end(self._proc, grace=15.0)


class WorkerProcess:
    """A system's worker in its own process, measured from the outside through /proc."""

    def __init__(self, proc: asyncio.subprocess.Process, name: str) -> None:
        self._proc = proc
        self._name = name
        self.events: list[dict[str, Any]] = []

    @property
    def pid(self) -> int:
        return self._proc.pid

    @classmethod
    async def start(
        cls,
        env: SystemEnv,
        dsn: str,
        *,
        concurrency: int,
        kinds: int,
        timings: Path,
        log_name: str,
        notify_at: int = 0,
        stop_at: int = 0,
    ) -> WorkerProcess:
        args = [
            "worker",
            "--dsn",
            dsn,
            "--concurrency",
            str(concurrency),
            "--kinds",
            str(kinds),
            "--notify-at",
            str(notify_at),
            "--stop-at",
            str(stop_at),
            "--timings",
            str(timings),
        ]
        return cls(await _spawn(env, args, log_name), env.name)

    async def wait_event(self, name: str, within: float) -> dict[str, Any]:
        """Read events until ``name`` arrives; fail if the worker exits or stays silent."""
        assert self._proc.stdout is not None
        deadline = asyncio.get_running_loop().time() + within
        while True:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise EventTimeout(f"{self._name}: no '{name}' from the worker in {within:.0f}s")
            try:
                line = await asyncio.wait_for(self._proc.stdout.readline(), timeout=remaining)
            except TimeoutError:
                continue
            if not line:
                raise AdapterError(f"{self._name}: worker exited before '{name}'")
            event: dict[str, Any] = json.loads(line)
            self.events.append(event)
            if event.get("event") == name:
                return event

    def sample(self) -> ProcSample:
        # The worker and every process it started (Celery's prefork pool).
        return read_proc(self._proc.pid)

    async def stop(self, within: float = 60.0) -> dict[str, Any]:
        """Ask for a graceful stop and wait for the worker's final event."""
        assert self._proc.stdin is not None
        try:
            # The worker may already be stopping by itself (--stop-at): a closed pipe is fine.
            with contextlib.suppress(ConnectionError):
                if not self._proc.stdin.is_closing():
                    self._proc.stdin.write(b"stop\n")
                    await self._proc.stdin.drain()
            return await self.wait_event("stopped", within)
        finally:
            await self.kill()

    async def kill(self) -> None:
        if self._proc.stdin is not None and not self._proc.stdin.is_closing():
            self._proc.stdin.close()
        await _end(self._proc, grace=10.0)
