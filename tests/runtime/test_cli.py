"""The `venturi` command line, run as a real subprocess against the test database."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from venturi import JobStatus, Queue

from .cli_app import Echo
from .helpers import until_status

ROOT = Path(__file__).resolve().parents[2]


def venturi(
    *args: str, dsn: str | None, prefix: str = "venturi"
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VENTURI_", "PG"))}
    if dsn is not None:
        env["VENTURI_DSN"] = dsn
    env["VENTURI_PREFIX"] = prefix
    return subprocess.run(
        [sys.executable, "-m", "venturi", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )


async def test_operations_commands(queue: Queue, pg_dsn: str) -> None:
    prefix = queue.store.prefix
    run = venturi("migrate", dsn=pg_dsn, prefix=prefix)
    assert run.returncode == 0 and run.stdout.strip() == "schema is up to date"
    assert venturi("stats", dsn=pg_dsn, prefix=prefix).stdout.strip() == "the queue is empty"

    job_id = await queue.enqueue(Echo(text="hello"))
    stats = json.loads(venturi("stats", "--json", dsn=pg_dsn, prefix=prefix).stdout)
    assert stats["pending_by_kind"] == {"echo": 1}
    text = venturi("stats", dsn=pg_dsn, prefix=prefix).stdout
    assert text.splitlines()[0].split() == [
        "KIND",
        "PENDING",
        "SCHEDULED",
        "CLAIMED",
        "DEAD",
        "OLDEST",
    ]
    assert text.splitlines()[1].split()[:5] == ["echo", "1", "0", "0", "0"]

    listed = json.loads(
        venturi("jobs", "--json", "--kind", "echo", dsn=pg_dsn, prefix=prefix).stdout
    )
    assert [j["id"] for j in listed] == [str(job_id)]
    assert listed[0]["payload"] == {"text": "hello"}
    journal = json.loads(
        venturi("journal", str(job_id), "--json", dsn=pg_dsn, prefix=prefix).stdout
    )
    assert journal["job"]["status"] == "pending" and journal["journal"] == []

    bad = venturi("journal", "not-an-id", dsn=pg_dsn, prefix=prefix)
    assert bad.returncode == 2 and "not a job id" in bad.stderr
    cleaned = venturi("cleanup", "--older-than", "0s", "--json", dsn=pg_dsn, prefix=prefix)
    assert json.loads(cleaned.stdout) == {"deleted": 0}  # pending jobs are never deleted


def test_missing_and_unreachable_database_are_one_line() -> None:
    missing = venturi("stats", dsn=None)
    assert missing.returncode == 2
    assert missing.stderr.strip() == "venturi: no database given: pass --dsn or set VENTURI_DSN"
    down = venturi("stats", dsn="postgresql://nobody@127.0.0.1:1/none")
    assert down.returncode == 2
    assert down.stderr.startswith("venturi: database error:")
    assert "Traceback" not in down.stderr and len(down.stderr.strip().splitlines()) == 1
    bad_prefix = venturi("stats", dsn="postgresql://x@127.0.0.1:1/x", prefix="Bad-Prefix")
    assert bad_prefix.returncode == 2 and "invalid table prefix" in bad_prefix.stderr


async def test_worker_command_runs_and_stops_gracefully_on_sigterm(
    queue: Queue, pg_dsn: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VENTURI_")}
    env |= {"VENTURI_DSN": pg_dsn, "VENTURI_PREFIX": queue.store.prefix}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "venturi",
        "worker",
        "tests.runtime.cli_app:make_worker",
        cwd=ROOT,
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        job_id = await queue.enqueue(Echo(text="via cli"))
        await until_status(queue, job_id, JobStatus.COMPLETED)
        [entry] = await queue.job_journal(job_id)
        assert entry.note == "via cli"
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), timeout=30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.stderr is not None
    stderr = (await proc.stderr.read()).decode()
    assert "serving ['echo']" in stderr


async def test_demo_settles_every_job(pg_dsn: str, prefix: str) -> None:
    import io

    from venturi.demo import run_demo

    out = io.StringIO()
    await run_demo(pg_dsn, jobs=300, concurrency=4, prefix=prefix, out=out)
    text = out.getvalue()
    assert "enqueued 300 jobs" in text
    assert "all 300 jobs settled" in text
    assert "final stats: pending=0 claimed=0 dead=0" in text
