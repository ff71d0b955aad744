"""The scenarios: the same steps, in the same order, for every system.

Each scenario gets a fresh database per system and repetition, drives the system only through
its adapter processes, and returns plain metrics (floats) for one repetition. All timing
decisions (what starts and stops a clock) are made here or in :mod:`bench.harness`, never in
an adapter.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.harness import clock_warning, load_timings, start_rate, wait_percentiles_ms
from bench.pg import PrivateServer
from bench.processes import (
    AdapterError,
    ControlProcess,
    EventTimeout,
    SystemEnv,
    WorkerProcess,
)

MB = 1024 * 1024


@dataclass(frozen=True)
class Plan:
    """Sizes of one run. ``full()`` is what the issue specifies; ``quick()`` only proves the
    harness works end to end (CI), its figures mean nothing."""

    n: int = 20_000  # jobs per drain / enqueue measurement
    reps: int = 3
    concurrencies: tuple[int, ...] = (1, 16)
    bulk_batches: tuple[int, ...] = (100, 1000)
    pickup_rate: float = 50.0  # jobs/s
    pickup_seconds: float = 20.0
    pickup_concurrency: int = 16
    # How long after the last paced enqueue the worker may take to start the last job.
    pickup_grace_s: float = 60.0
    # A drain that has not started its N-th job by then is stopped, and its rate is the start
    # rate of the jobs it did start (River at its defaults runs about 10 jobs/s at c=1).
    # 240 s: pgqueuer's strict c=1 (~150-250 jobs/s here) must finish its 20,000 within it.
    drain_budget_s: float = 240.0
    backlog_big: int = 1_000_000
    backlog_kinds: int = 20
    backlog_concurrency: int = 16
    backlog_queues: int = 5  # the stats call timed once more: the big backlog over 5 queues
    template_per_kind: int = 500  # rows per kind written by the API before cloning
    stats_calls: int = 10
    ceiling_seconds: float = 10.0
    ceiling_clients: tuple[int, ...] = (1, 4, 16)
    ceiling_batches: tuple[int, ...] = (1, 100)

    @property
    def backlog_small(self) -> int:
        return self.n

    @property
    def backlog_measure(self) -> int:
        """Jobs timed in the backlog scenario: half the small backlog, so neither run
        reaches the end of its queue (no tail effect on either side of the ratio)."""
        return self.n // 2

    @classmethod
    def full(cls) -> Plan:
        return cls()

    @classmethod
    def quick(cls) -> Plan:
        return cls(
            n=500,
            reps=1,
            pickup_seconds=2.0,
            pickup_grace_s=5.0,
            drain_budget_s=30.0,
            backlog_big=5_000,
            template_per_kind=50,
            stats_calls=3,
            ceiling_seconds=2.0,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Outcome:
    """One system's result for one scenario repetition."""

    metrics: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # metric -> why it is missing
    info: dict[str, Any] = field(default_factory=dict)  # context, not compared


class Runner:
    def __init__(
        self, server: PrivateServer, envs: dict[str, SystemEnv], plan: Plan, workdir: Path
    ) -> None:
        self.server = server
        self.envs = envs
        self.plan = plan
        self.workdir = workdir
        self._seq = 0

    def _name(self, system: str, label: str) -> str:
        self._seq += 1
        return f"{self._seq:04d}_{system}_{label}"

    @contextlib.asynccontextmanager
    async def _database(self, system: str, label: str) -> AsyncIterator[tuple[str, str]]:
        """A fresh database for one system and one measurement, dropped afterwards."""
        name = self._name(system, label)
        dsn = await asyncio.to_thread(self.server.create_database, name)
        try:
            yield dsn, name
        finally:
            await asyncio.to_thread(self.server.drop_database, name)

    @contextlib.asynccontextmanager
    async def _control(self, system: str, dsn: str, name: str) -> AsyncIterator[ControlProcess]:
        control = await ControlProcess.start(self.envs[system], dsn, f"{name}_control")
        try:
            await control.call("install", within=120)
            yield control
        finally:
            await control.close()

    @contextlib.asynccontextmanager
    async def _worker(
        self, system: str, dsn: str, name: str, **options: Any
    ) -> AsyncIterator[tuple[WorkerProcess, Path]]:
        timings = self.workdir / f"{name}.timings"
        worker = await WorkerProcess.start(
            self.envs[system], dsn, timings=timings, log_name=f"{name}_worker", **options
        )
        try:
            yield worker, timings
        finally:
            await worker.kill()

    # -- 1 and 6: drain, with the worker's RSS and CPU -------------------------------------

    async def drain(self, system: str, concurrency: int) -> Outcome:
        """N jobs already enqueued; one worker at ``concurrency``; rate from the first
        handler start to the moment no job is outstanding in the database. A drain still
        short of its N-th start after ``drain_budget_s`` is stopped there and rated by its
        start rate instead (said in the report)."""
        n = self.plan.n
        capped = False
        async with (
            self._database(system, f"drain_c{concurrency}") as (dsn, name),
            self._control(system, dsn, name) as control,
        ):
            await control.call("enqueue", within=600, mode="bulk", n=n, batch=1000, fallback=True)
            await control.call("checkpoint", within=120)
            async with self._worker(
                system, dsn, name, concurrency=concurrency, kinds=1, notify_at=n
            ) as (worker, timings):
                await worker.wait_event("ready", within=60)
                before = worker.sample()
                try:
                    await worker.wait_event("reached", within=self.plan.drain_budget_s)
                except EventTimeout:
                    capped = True
                if not capped:
                    done = await control.call("wait_drained", within=150, limit_s=120, poll_s=0.002)
                after = worker.sample()
                stopped = await worker.stop()
            enqueued, started = load_timings(timings)
        first = min(started)
        out = Outcome()
        out.metrics["start_rate"] = start_rate(started)
        if capped:
            out.metrics["rate"] = out.metrics["start_rate"]
            out.info = {
                "handler_starts": stopped["count"],
                "capped": f"stopped after {self.plan.drain_budget_s:.0f} s with "
                f"{len(started):,} of {n:,} jobs started; jobs/s is their start rate",
            }
        else:
            out.metrics["rate"] = n / (done["t_done"] - first)
            out.info = {"handler_starts": stopped["count"], "completion_polls": done["polls"]}
        warnings = []
        if not capped and stopped["count"] != n:
            warnings.append(f"{stopped['count']} handler starts for {n} jobs")
        if clock := clock_warning(enqueued, started):
            warnings.append(clock)
        if warnings:
            out.info["warning"] = "; ".join(warnings)
        out.metrics.update(wait_percentiles_ms(enqueued, started))
        out.metrics["rss_peak_mb"] = after.rss_peak_bytes / MB
        out.metrics["cpu_s_per_10k"] = (
            (after.cpu_seconds - before.cpu_seconds) / max(1, len(started)) * 10_000
        )
        out.info["processes"] = after.processes
        return out

    # -- 2: enqueue ---------------------------------------------------------------------------

    async def enqueue(self, system: str, batch: int) -> Outcome:
        """N jobs from one producer: one by one (batch 1) or through the batch API."""
        n = self.plan.n
        mode = "sequential" if batch == 1 else "bulk"
        async with (
            self._database(system, f"enqueue_{batch}") as (dsn, name),
            self._control(system, dsn, name) as control,
        ):
            await control.call("checkpoint", within=120)
            reply = await control.call("enqueue", within=1800, mode=mode, n=n, batch=batch)
        if "unsupported" in reply:
            return Outcome(skipped={"rate": str(reply["unsupported"])})
        return Outcome(metrics={"rate": n / reply["seconds"]})

    # -- 3: pickup latency --------------------------------------------------------------------

    async def pickup(self, system: str, concurrency: int) -> Outcome:
        """An idle worker; jobs enqueued one by one at a steady rate; enqueue→start waits."""
        plan = self.plan
        total = round(plan.pickup_rate * plan.pickup_seconds)
        async with (
            self._database(system, f"pickup_c{concurrency}") as (dsn, name),
            self._control(system, dsn, name) as control,
            self._worker(system, dsn, name, concurrency=concurrency, kinds=1, notify_at=total) as (
                worker,
                timings,
            ),
        ):
            await worker.wait_event("ready", within=60)
            # Let the worker reach its idle state (LISTEN set up, first empty poll done).
            await asyncio.sleep(2.0)
            paced = await control.call(
                "pace",
                within=plan.pickup_seconds + 60,
                rate=plan.pickup_rate,
                seconds=plan.pickup_seconds,
            )
            behind = False
            try:
                await worker.wait_event("reached", within=plan.pickup_grace_s)
            except EventTimeout:
                behind = True
            await worker.stop()
            enqueued, started = load_timings(timings)
        waits = wait_percentiles_ms(enqueued, started)
        info: dict[str, Any] = {"jobs": len(started), "producer_max_lag_ms": paced["max_lag_ms"]}
        if warning := clock_warning(enqueued, started):
            info["warning"] = warning
        if not behind:
            return Outcome(metrics=waits, info=info)
        # A worker slower than the offered rate: its queue grows, and the waits of the jobs it
        # did start understate what the rest would see, so no figure is given for it.
        lower = ", ".join(f"{k.split('_')[1]} {v:,.0f} ms" for k, v in waits.items())
        why = (
            f"fell behind the {plan.pickup_rate:.0f} jobs/s offered: {len(started):,} of "
            f"{total:,} jobs started by {plan.pickup_grace_s:.0f} s after the last enqueue "
            f"(their waits, a lower bound: {lower})"
        )
        return Outcome(skipped={"*": why}, info=info)

    # -- 4 and 5: backlog independence and stats cost -------------------------------------

    async def backlog(self, system: str) -> Outcome:
        """The same drain (M jobs, c=16, 20 kinds) from a small and from a 1,000,000-job
        backlog, and the system's stats call timed on both."""
        out = Outcome()
        for label, pending in (("small", self.plan.backlog_small), ("big", self.plan.backlog_big)):
            rate, stats_ms, skip, rows = await self._backlog_once(system, label, pending)
            out.metrics[f"rate_{label}"] = rate
            out.info[f"rows_{label}"] = rows
            if stats_ms is None:
                out.skipped[f"stats_ms_{label}"] = skip
            else:
                out.metrics[f"stats_ms_{label}"] = stats_ms
        out.metrics["rate_ratio"] = out.metrics["rate_big"] / out.metrics["rate_small"]
        stats_ms, skip = await self._stats_by_queue_once(system)
        if stats_ms is None:
            out.skipped["stats_ms_queues"] = skip
        else:
            out.metrics["stats_ms_queues"] = stats_ms
        return out

    async def _stats_by_queue_once(self, system: str) -> tuple[float | None, str]:
        """The stats call on the big backlog spread over named queues (no drain)."""
        plan = self.plan
        async with (
            self._database(system, "backlog_queues") as (dsn, name),
            self._control(system, dsn, name) as control,
        ):
            loaded = await control.call(
                "preload",
                within=3600,
                total=plan.backlog_big,
                kinds=plan.backlog_kinds,
                template_per_kind=plan.template_per_kind,
                queues=plan.backlog_queues,
            )
            if "unsupported" in loaded:
                return None, str(loaded["unsupported"])
            if loaded["rows"] != plan.backlog_big:
                raise AdapterError(
                    f"{system}: preload made {loaded['rows']} rows, not {plan.backlog_big}"
                )
            stats = await control.call("stats", within=600, calls=plan.stats_calls)
        if "unsupported" in stats:
            return None, str(stats["unsupported"])
        ms = sorted(stats["ms"])
        return (ms[len(ms) // 2] if ms else math.nan), ""

    async def _backlog_once(
        self, system: str, label: str, pending: int
    ) -> tuple[float, float | None, str, int]:
        plan = self.plan
        measure = plan.backlog_measure
        async with (
            self._database(system, f"backlog_{label}") as (dsn, name),
            self._control(system, dsn, name) as control,
        ):
            loaded = await control.call(
                "preload",
                within=3600,
                total=pending,
                kinds=plan.backlog_kinds,
                template_per_kind=plan.template_per_kind,
            )
            if loaded["rows"] != pending:
                raise AdapterError(f"{system}: preload made {loaded['rows']} rows, not {pending}")
            stats = await control.call("stats", within=600, calls=plan.stats_calls)
            async with self._worker(
                system,
                dsn,
                name,
                concurrency=plan.backlog_concurrency,
                kinds=plan.backlog_kinds,
                notify_at=measure,
                stop_at=measure,
            ) as (worker, timings):
                await worker.wait_event("ready", within=60)
                await worker.wait_event("reached", within=max(300.0, measure / 20))
                await worker.stop()
            _, started = load_timings(timings)
        rate = start_rate(started, count=measure)
        if "unsupported" in stats:
            return rate, None, str(stats["unsupported"]), loaded["rows"]
        ms = sorted(stats["ms"])
        return rate, ms[len(ms) // 2] if ms else math.nan, "", loaded["rows"]
