"""The application of the end-to-end scenario: `venturi worker e2e.app:make_worker`.

Two job kinds, both served by the scenario's one pool (e2e/test_scenario.py):

- `e2e_sleep` (`Sleep`): sleeps `seconds`, then completes; the backlog the pool scales for.
- `e2e_fail` (`Fail`): fails permanently, so the job goes dead (dead-job metrics and alerts).

The worker records venturi's Prometheus metrics and serves them on 127.0.0.1 at
`$E2E_WORKER_METRICS_PORT` (the runtime's `Worker(metrics_port=...)` would bind 0.0.0.0);
`$E2E_WORKER_CONCURRENCY` sets its concurrency (default 2).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from venturi import Context, Outcome, PostgresStore, Task, TaskError, Worker
from venturi import metrics as venturi_metrics

SLEEP_KIND = "e2e_sleep"
FAIL_KIND = "e2e_fail"
KINDS = (SLEEP_KIND, FAIL_KIND)


@dataclass
class Sleep(Task):
    KIND = SLEEP_KIND
    seconds: float


@dataclass
class Fail(Task):
    KIND = FAIL_KIND
    reason: str


async def sleep(task: Sleep, ctx: Context[None], app: None) -> Outcome:
    await asyncio.sleep(task.seconds)
    return Outcome.completed()


async def fail(task: Fail, ctx: Context[None], app: None) -> Outcome:
    raise TaskError.permanent(task.reason)


def make_worker(store: PostgresStore) -> Worker[None]:
    concurrency = int(os.environ.get("E2E_WORKER_CONCURRENCY", "2"))
    worker = Worker(None, store, concurrency=concurrency, shutdown_timeout=10, metrics=True)
    worker.register(Sleep, sleep)
    worker.register(Fail, fail)
    if port := os.environ.get("E2E_WORKER_METRICS_PORT"):
        venturi_metrics.serve(int(port), "127.0.0.1")
    return worker
