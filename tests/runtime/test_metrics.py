"""Prometheus metrics: recorded when asked, served on /metrics, never imported otherwise."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import urllib.request
from dataclasses import dataclass

from venturi import Context, Outcome, Queue, Task, TaskError, Worker
from venturi.embedded import free_port

from .helpers import running, until


@dataclass
class Metered(Task):
    KIND = "metered"
    fail: bool = False


def test_prometheus_client_is_not_imported_without_metrics() -> None:
    code = (
        "import sys, venturi\n"
        "from venturi import Queue, Worker\n"
        "assert 'prometheus_client' not in sys.modules, 'imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text: str = response.read().decode()
        return text


def _value(text: str, line_prefix: str) -> float:
    for line in text.splitlines():
        if line.startswith(line_prefix):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_worker_serves_lifecycle_metrics(queue: Queue) -> None:
    port = free_port()

    async def handle(task: Metered, ctx: Context[None], app: None) -> Outcome:
        if task.fail:
            raise TaskError.permanent("no")
        return Outcome.completed()

    metered = Queue(queue.store, metrics=True)
    before = await asyncio.to_thread(_scrape_or_empty, port)
    assert before == ""
    worker = Worker(None, queue.store, metrics_port=port)
    worker.register(Metered, handle)
    async with running(worker):
        start = await asyncio.to_thread(_scrape, port)
        await metered.enqueue_many([Metered() for _ in range(3)])
        await metered.enqueue(Metered(fail=True))

        async def settled() -> bool:
            s = await queue.stats()
            return s.pending == 0 and s.claimed == 0

        await until(settled)
        text = await asyncio.to_thread(_scrape, port)

    def delta(prefix: str) -> float:
        return _value(text, prefix) - _value(start, prefix)

    assert delta('venturi_jobs_enqueued_total{kind="metered"}') == 4
    assert delta('venturi_jobs_claimed_total{kind="metered"}') == 4
    assert delta('venturi_jobs_settled_total{kind="metered",outcome="completed"}') == 3
    assert delta('venturi_jobs_settled_total{kind="metered",outcome="dead"}') == 1
    assert delta('venturi_handler_duration_seconds_count{kind="metered"}') == 4
    assert delta('venturi_claim_latency_seconds_count{kind="metered"}') == 4
    assert _value(text, 'venturi_jobs_in_flight{kind="metered"}') == 0


def _scrape_or_empty(port: int) -> str:
    try:
        return _scrape(port)
    except OSError:
        return ""
