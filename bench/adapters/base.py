"""The adapter contract and the process that serves it, shared by every system.

An adapter process runs inside one system's virtual environment, in one of two roles:

* ``control``: a producer/inspector. It reads one JSON command per line on stdin and answers
  with one JSON line on stdout (install the schema, enqueue, preload, wait for a drain, time
  the stats call). The orchestrator keeps it open for a whole scenario.
* ``worker``: the system's worker, alone in its process so that /proc shows its own RSS and
  CPU. Every no-op handler calls :meth:`JobRecorder.record` first; events (``ready``,
  ``reached``, ``stopped``) go to stdout as JSON lines; a ``stop`` line or EOF on stdin stops it.

Each Python system only supplies the thin :class:`System` subclass: how to install, enqueue,
run a worker and read its own table. The loops, clocks and timings are here, identical for all.
The peers that are not Python (``bench/river/main.go``, ``bench/graphile/adapter.mjs``)
implement this same protocol, the same commands and loops, in their own language, so that
their enqueue loop and handler clock run in their own process as these do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, ClassVar, TextIO

from bench.harness import JobRecorder, now

# Job kinds are named the same way in every system: noop0 .. noop19.
KIND_PREFIX = "noop"
# Largest batch handed to a bulk API while preloading a backlog.
PRELOAD_BATCH = 1000


def kind_name(index: int) -> str:
    return f"{KIND_PREFIX}{index}"


def queue_name(index: int) -> str:
    """Named queues, for the systems that have them: q0 .. q4."""
    return f"q{index}"


OnStart = Callable[[float], None]


class Unsupported(Exception):
    """The system has no public API for what a scenario asks; the run reports a skip."""


class System(ABC):
    """What the harness needs from one job queue. Subclasses use only the system's public API,
    except :attr:`jobs_table` / :meth:`outstanding_sql`, which read the system's own table to
    see when a drain has finished and to clone rows for a large preload."""

    name: ClassVar[str]
    # The table the system's enqueue API writes one row per job into.
    jobs_table: ClassVar[str]
    # Columns that must not be copied verbatim when cloning rows (e.g. a client-generated
    # primary key): column -> SQL expression producing a fresh value.
    clone_overrides: ClassVar[dict[str, str]] = {}

    @abstractmethod
    def versions(self) -> dict[str, str]: ...

    @abstractmethod
    async def open(self, dsn: str) -> None:
        """Connect the producer side (used by the control role)."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def install(self) -> None:
        """Create the schema, with the settings the system's docs recommend."""

    @abstractmethod
    async def enqueue(self, kind: int, enqueued_at: float) -> None:
        """Enqueue one no-op job whose payload carries ``enqueued_at``."""

    @abstractmethod
    async def enqueue_many(self, kind: int, count: int, enqueued_at: float) -> None:
        """Enqueue ``count`` jobs in one call of the system's batch API."""

    async def enqueue_many_in(self, queue: int, kind: int, count: int, enqueued_at: float) -> None:
        """:meth:`enqueue_many` into the named queue ``queue_name(queue)``."""
        raise Unsupported(f"{self.name}: no named queues in this adapter")

    @abstractmethod
    async def sql(self, query: str) -> Any:
        """Run SQL on the producer connection; return the first column of the first row."""

    @abstractmethod
    def outstanding_sql(self) -> str:
        """A query returning true while any job is not yet completed."""

    async def stats(self) -> object:
        """The system's own queue-statistics call (counts by kind/status)."""
        raise Unsupported(f"{self.name} has no queue statistics API")

    async def outstanding(self) -> bool:
        """True while any job is not yet completed (a drain's end is seen through this)."""
        return bool(await self.sql(self.outstanding_sql()))

    async def checkpoint(self) -> None:
        """Flush what setup wrote, so that no checkpoint lands inside a measurement."""
        await self.sql("CHECKPOINT")

    async def clone_backlog(self, total: int) -> int:
        """Clone the rows the API wrote until the jobs table holds ``total``; return the
        count. One INSERT ... SELECT (see :meth:`Control.cmd_preload`)."""
        table = self.jobs_table
        have = int(await self.sql(f"SELECT count(*) FROM {table}"))
        missing = total - have
        if missing > 0:
            columns = await self._clonable_columns(table)
            targets = ", ".join(columns)
            sources = ", ".join(self.clone_overrides.get(c, f"t.{c}") for c in columns)
            copies = -(-missing // have)  # ceil
            await self.sql(
                f"INSERT INTO {table} ({targets}) SELECT {sources} FROM {table} AS t "
                f"CROSS JOIN generate_series(1, {copies}) AS g ORDER BY g, t.ctid "
                f"LIMIT {missing}"
            )
        rows = int(await self.sql(f"SELECT count(*) FROM {table}"))
        await self._analyze_filled_tables()
        await self.checkpoint()
        return rows

    async def _analyze_filled_tables(self) -> None:
        """ANALYZE the tables that hold rows, as autovacuum would have done for a backlog
        this size, and leave empty ones alone: autovacuum never analyses a table nobody
        wrote to, and "empty" statistics on a table about to grow (a journal, a log) would
        steer plans in a way no real deployment with this backlog would see."""
        names = json.loads(
            await self.sql(
                "SELECT coalesce(json_agg(quote_ident(schemaname) || '.' || quote_ident(relname)),"
                " '[]')::text FROM pg_stat_user_tables"
            )
        )
        for name in names:
            if await self.sql(f"SELECT EXISTS (SELECT 1 FROM {name})"):
                await self.sql(f"ANALYZE {name}")

    async def _clonable_columns(self, table: str) -> list[str]:
        raw = await self.sql(
            "SELECT coalesce(json_agg(column_name ORDER BY ordinal_position), '[]')::text "
            "FROM information_schema.columns "
            f"WHERE table_name = '{table}' AND table_schema = current_schema() "
            "AND is_identity = 'NO' AND is_generated = 'NEVER' "
            "AND left(coalesce(column_default, ''), 8) <> 'nextval('"
        )
        columns: list[str] = json.loads(raw)
        overridden = [c for c in self.clone_overrides if c not in columns]
        return columns + overridden

    def run_loop(self, main: Coroutine[Any, Any, None]) -> None:
        """Run the adapter's coroutine on the event loop the system's users get."""
        asyncio.run(main)

    def serve_worker(self, args: argparse.Namespace, proto: TextIO) -> None:
        """The worker role. Systems whose worker is not an asyncio coroutine (Celery's
        prefork pool) override this whole method."""
        self.run_loop(_serve_worker(self, args, proto))

    @abstractmethod
    async def run_worker(
        self,
        dsn: str,
        concurrency: int,
        kinds: int,
        on_start: OnStart,
        shutdown: asyncio.Event,
    ) -> None:
        """Run the system's worker with no-op handlers for ``kinds`` kinds until ``shutdown``
        is set, then stop it gracefully and return. Each handler calls ``on_start`` with the
        payload's ``enqueued_at`` before anything else."""


# --- control role -------------------------------------------------------------------------


class Control:
    """Executes control commands for one system; one method per command."""

    def __init__(self, system: System) -> None:
        self.system = system

    async def cmd_info(self) -> dict[str, Any]:
        return {"versions": self.system.versions()}

    async def cmd_install(self) -> dict[str, Any]:
        await self.system.install()
        return {}

    async def cmd_enqueue(
        self, mode: str, n: int, batch: int = 1, fallback: bool = False
    ) -> dict[str, Any]:
        """Sequential: n single enqueues, awaited one after the other. Bulk: n jobs in calls of
        ``batch``. The time covers the calls only (the producer is already connected). A
        system without a batch API answers ``unsupported`` for bulk, or with ``fallback``
        (setting up a drain, not measured) enqueues one by one instead."""
        started = time.perf_counter()
        if mode == "sequential":
            for _ in range(n):
                await self.system.enqueue(0, now())
        elif mode == "bulk":
            try:
                for offset in range(0, n, batch):
                    await self.system.enqueue_many(0, min(batch, n - offset), now())
            except Unsupported as exc:
                if not fallback:
                    return {"unsupported": str(exc)}
                for _ in range(n):
                    await self.system.enqueue(0, now())
        else:
            raise ValueError(f"unknown enqueue mode {mode!r}")
        return {"seconds": time.perf_counter() - started, "jobs": n}

    async def cmd_pace(self, rate: float, seconds: float) -> dict[str, Any]:
        """Enqueue one job every 1/rate s against an absolute schedule, so a slow enqueue
        does not shift the following ones (no coordinated omission on the producer side)."""
        total = round(rate * seconds)
        start = now() + 0.05
        max_lag = 0.0
        for i in range(total):
            delay = start + i / rate - now()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                max_lag = max(max_lag, -delay)
            await self.system.enqueue(0, now())
        return {"jobs": total, "max_lag_ms": max_lag * 1000.0}

    async def cmd_preload(
        self, total: int, kinds: int, template_per_kind: int, queues: int = 0
    ) -> dict[str, Any]:
        """Build a backlog of ``total`` pending jobs over ``kinds`` kinds.

        The system's own bulk API writes a template (``template_per_kind`` jobs per kind), then
        one INSERT ... SELECT clones those rows until the table holds ``total`` jobs. The rows
        are therefore exactly what the API writes (same payloads, same defaults, the same
        triggers fire), at a fraction of the time 1,000,000 API calls would take.

        With ``queues`` > 0 the template spreads each kind over that many named queues (a
        system without named queues answers ``unsupported``).
        """
        started = time.perf_counter()
        if queues > 0:
            per_cell = max(1, min(template_per_kind, total // kinds) // queues)
            try:
                for queue in range(queues):
                    for kind in range(kinds):
                        for offset in range(0, per_cell, PRELOAD_BATCH):
                            count = min(PRELOAD_BATCH, per_cell - offset)
                            await self.system.enqueue_many_in(queue, kind, count, now())
            except Unsupported as exc:
                return {"unsupported": str(exc)}
            rows = await self.system.clone_backlog(total)
            return {"seconds": time.perf_counter() - started, "rows": rows}
        per_kind = max(1, min(template_per_kind, total // kinds))
        for kind in range(kinds):
            for offset in range(0, per_kind, PRELOAD_BATCH):
                count = min(PRELOAD_BATCH, per_kind - offset)
                try:
                    await self.system.enqueue_many(kind, count, now())
                except Unsupported:
                    for _ in range(count):
                        await self.system.enqueue(kind, now())
        rows = await self.system.clone_backlog(total)
        return {"seconds": time.perf_counter() - started, "rows": rows}

    async def cmd_checkpoint(self) -> dict[str, Any]:
        """Flush what setup wrote, so no checkpoint lands inside the measurement."""
        await self.system.checkpoint()
        return {}

    async def cmd_wait_drained(self, limit_s: float, poll_s: float) -> dict[str, Any]:
        """Poll until no job is outstanding; return the wall time it was first seen so.
        The orchestrator calls this only after the worker has started the last job, so the
        polling load covers just the completion tail."""
        deadline = time.monotonic() + limit_s
        polls = 0
        while await self.system.outstanding():
            polls += 1
            if time.monotonic() > deadline:
                raise TimeoutError(f"jobs still outstanding after {limit_s:.0f}s")
            await asyncio.sleep(poll_s)
        return {"t_done": now(), "polls": polls}

    async def cmd_stats(self, calls: int) -> dict[str, Any]:
        try:
            await self.system.stats()  # warm-up: connection state, plan cache
        except Unsupported as exc:
            return {"unsupported": str(exc)}
        timings = []
        for _ in range(calls):
            started = time.perf_counter()
            await self.system.stats()
            timings.append((time.perf_counter() - started) * 1000.0)
        return {"ms": timings}


async def _serve_control(system: System, dsn: str, proto: TextIO) -> None:
    control = Control(system)
    await system.open(dsn)
    try:
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            request = json.loads(line)
            name = request.pop("cmd")
            try:
                reply = await getattr(control, f"cmd_{name}")(**request)
                reply["ok"] = True
            except Exception as exc:
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            proto.write(json.dumps(reply) + "\n")
            proto.flush()
    finally:
        await system.close()


# --- worker role --------------------------------------------------------------------------


async def _serve_worker(system: System, args: argparse.Namespace, proto: TextIO) -> None:
    recorder = JobRecorder()
    shutdown = asyncio.Event()
    loop = asyncio.get_running_loop()

    def emit(event: dict[str, Any]) -> None:
        proto.write(json.dumps(event) + "\n")
        proto.flush()

    def on_start(enqueued_at: float) -> None:
        count = recorder.record(enqueued_at)
        if count == args.notify_at:
            emit({"event": "reached", "count": count, "t": now()})
        if count == args.stop_at:
            shutdown.set()

    def watch_stdin() -> None:
        # A "stop" line, or EOF because the orchestrator went away: either way, stop.
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        loop.call_soon_threadsafe(shutdown.set)

    threading.Thread(target=watch_stdin, daemon=True).start()
    emit({"event": "ready", "pid": os.getpid(), "t": now()})
    await system.run_worker(args.dsn, args.concurrency, args.kinds, on_start, shutdown)
    recorder.save(Path(args.timings))
    emit({"event": "stopped", "count": recorder.count, "t": now()})


def serve(system: System) -> None:
    """Run one adapter process: ``python -m bench.adapters SYSTEM {control|worker} ...``."""
    parser = argparse.ArgumentParser(prog=f"bench.adapters ({system.name})")
    parser.add_argument("role", choices=("control", "worker"))
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--kinds", type=int, default=1)
    parser.add_argument("--notify-at", type=int, default=0, help="emit 'reached' at this count")
    parser.add_argument("--stop-at", type=int, default=0, help="stop by itself at this count")
    parser.add_argument("--timings", default="timings.bin")
    args = parser.parse_args()

    # The protocol owns the real stdout; anything a library prints goes to stderr (the log).
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    if args.role == "control":
        system.run_loop(_serve_control(system, args.dsn, proto))
    else:
        system.serve_worker(args, proto)
