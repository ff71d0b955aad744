"""The `venturi` command line, run as a real subprocess against the test database."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from venturi import JobStatus, PostgresStore, Queue
from venturi.embedded import EmbeddedPostgres

from .cli_app import Boom, Echo, Nap
from .helpers import until_status

ROOT = Path(__file__).resolve().parents[2]


def venturi(
    *args: str,
    dsn: str | None,
    prefix: str = "venturi",
    pythonpath: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VENTURI_", "PG"))} | (
        env or {}
    )
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
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
    # Every figure stats() has, per queue too (scripts read them here).
    assert (stats["pending"], stats["completed"], stats["done_last_hour"]) == (1, 0, 0)
    assert stats["queues"]["default"]["pending_by_kind"] == {"echo": 1}
    assert stats["queues"]["default"]["paused"] is False
    assert stats["paused_by_kind"] == {}
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
    by_queue = venturi("jobs", "--json", "--queue", "default", dsn=pg_dsn, prefix=prefix)
    assert [j["id"] for j in json.loads(by_queue.stdout)] == [str(job_id)]
    other = venturi("jobs", "--json", "--queue", "other", dsn=pg_dsn, prefix=prefix)
    assert json.loads(other.stdout) == []
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


async def worker_process(
    dsn: str, prefix: str, factory: str = "tests.runtime.cli_app:make_worker"
) -> asyncio.subprocess.Process:
    """`venturi worker tests.runtime.cli_app:make_worker` (or `factory`) on `dsn` and
    `prefix`, its stderr piped (none of the test run's VENTURI_ or PG settings leak into it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VENTURI_", "PG"))}
    env |= {"VENTURI_DSN": dsn, "VENTURI_PREFIX": prefix}
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "venturi",
        "worker",
        factory,
        cwd=ROOT,
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )


async def terminated(proc: asyncio.subprocess.Process) -> int:
    """SIGTERM, then the process's exit status (within 30 s)."""
    proc.send_signal(signal.SIGTERM)
    return await asyncio.wait_for(proc.wait(), timeout=30)


async def reap(proc: asyncio.subprocess.Process) -> None:
    """Kill the process if a failed assertion left it running."""
    if proc.returncode is None:
        proc.kill()
        await proc.wait()


async def test_worker_command_runs_and_stops_gracefully_on_sigterm(
    queue: Queue, pg_dsn: str
) -> None:
    proc = await worker_process(pg_dsn, queue.store.prefix)
    try:
        job_id = await queue.enqueue(Echo(text="via cli"))
        await until_status(queue, job_id, JobStatus.COMPLETED)
        [entry] = await queue.job_journal(job_id)
        assert entry.note == "via cli"
        assert await terminated(proc) == 0
    finally:
        await reap(proc)
    assert proc.stderr is not None
    stderr = (await proc.stderr.read()).decode()
    assert "serving ['echo']" in stderr


async def test_a_second_signal_aborts_the_running_jobs_at_once(queue: Queue, pg_dsn: str) -> None:
    """SIGTERM gives the running jobs the shutdown timeout (10 minutes here); a second
    signal (a Ctrl-C after it, as with Celery's cold shutdown) aborts them now: the job is
    released, the process exits 0. It had no effect: the worker waited the whole grace."""
    proc = await worker_process(
        pg_dsn, queue.store.prefix, factory="tests.runtime.cli_app:make_napping_worker"
    )
    assert proc.stderr is not None
    try:
        job_id = await queue.enqueue(Nap())
        await until_status(queue, job_id, JobStatus.CLAIMED)
        proc.send_signal(signal.SIGTERM)
        while b"SIGTERM: stopping" not in await asyncio.wait_for(proc.stderr.readline(), 30):
            pass
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), timeout=30) == 0
    finally:
        await reap(proc)
    assert "SIGINT again: aborting the running jobs now" in (await proc.stderr.read()).decode()
    [entry] = await queue.job_journal(job_id)
    assert entry.outcome == "released"
    job = await queue.job(job_id)
    assert job is not None and job.status is JobStatus.PENDING


async def test_worker_command_waits_for_a_database_not_up_yet(pg_dsn: str) -> None:
    with EmbeddedPostgres() as pg:
        # The database the worker will find once it is up: migrated, a job waiting.
        async with await PostgresStore.connect(pg.dsn) as store:
            await store.migrate()
            job_id = await Queue(store).enqueue(Echo(text="late database"))
        pg.halt("fast")
        proc = await worker_process(pg.dsn, "venturi")
        assert proc.stderr is not None
        try:
            first = (await asyncio.wait_for(proc.stderr.readline(), timeout=30)).decode()
            assert "worker: the database is unavailable (connecting: " in first, first
            assert proc.returncode is None  # waiting, not exited
            pg.launch()
            async with await PostgresStore.connect(pg.dsn) as store:
                await until_status(Queue(store), job_id, JobStatus.COMPLETED)
            assert await terminated(proc) == 0
        finally:
            await reap(proc)
    rest = (await proc.stderr.read()).decode()
    assert rest.count("the database is unavailable") == 0  # logged once, when the wait began
    assert "worker: the database is back after" in rest and "serving ['echo']" in rest
    # What waiting cannot mend is not waited for: a database that does not exist.
    missing = pg_dsn.rsplit("/", 1)[0] + "/no_such_database"
    run = venturi("worker", "tests.runtime.cli_app:make_worker", dsn=missing)
    assert run.returncode == 2 and 'database "no_such_database" does not exist' in run.stderr


async def test_a_worker_waiting_for_its_database_stops_cleanly_on_sigterm() -> None:
    """It holds nothing yet: SIGTERM ends it at once, with status 0 (as a shutdown once it
    runs), not killed by the signal (143)."""
    with socket.socket() as nobody:  # a port nothing listens on: the wait goes on
        nobody.bind(("127.0.0.1", 0))
        port = nobody.getsockname()[1]
        proc = await worker_process(f"postgresql://postgres@127.0.0.1:{port}/postgres", "venturi")
        assert proc.stderr is not None
        try:
            first = (await asyncio.wait_for(proc.stderr.readline(), timeout=30)).decode()
            assert "worker: the database is unavailable (connecting: " in first, first
            assert await terminated(proc) == 0
        finally:
            await reap(proc)


async def test_demo_settles_every_job(pg_dsn: str, prefix: str) -> None:
    import io

    from venturi.demo import run_demo

    out = io.StringIO()
    await run_demo(pg_dsn, jobs=300, concurrency=4, prefix=prefix, out=out)
    text = out.getvalue()
    assert "enqueued 300 jobs" in text
    assert "all 300 jobs settled" in text
    assert "final stats: pending=0 claimed=0 dead=0" in text


def one_line(run: subprocess.CompletedProcess[str], *fragments: str) -> None:
    """Exit status 2 and a single line on stderr holding every fragment, no traceback."""
    assert run.returncode == 2, run
    assert "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    for fragment in fragments:
        assert fragment in run.stderr, run.stderr


def test_bad_arguments_are_one_line(pg_dsn: str) -> None:
    for huge in ("999999999999w", "200000w", "9" * 400 + "s"):
        run = venturi("cleanup", "--older-than", huge, dsn=pg_dsn)
        assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
        assert "--older-than" in run.stderr
    one_line(venturi("cleanup", "--older-than", "200000w", dsn=pg_dsn), "before the year 1")
    for flag, value in (("--jobs", "-5"), ("--jobs", "0"), ("--concurrency", "-1")):
        run = venturi("demo", flag, value, dsn=None)
        assert run.returncode == 2 and f"argument {flag}: expected a number >= 1" in run.stderr
    run = venturi("cleanup", "--older-than", "1d", "--kind", "bad kind", dsn=pg_dsn)
    assert run.returncode == 2 and "cleanup: --kind: invalid KIND 'bad kind'" in run.stderr
    for limit in ("0", "-5"):  # the flag named, not the API's field
        run = venturi("jobs", "--limit", limit, dsn=pg_dsn)
        assert run.returncode == 2 and "argument --limit: expected a number >= 1" in run.stderr
    run = venturi("queue", "pause", "default", "--for", "0s", dsn=pg_dsn)
    assert run.returncode == 2
    assert "argument --for: expected a duration longer than 0, got '0s'" in run.stderr
    # A negative duration reaches the check (argparse alone would take it for an option).
    for command in (["queue", "pause", "default", "--for"], ["cleanup", "--older-than"]):
        run = venturi(*command, "-1h", dsn=pg_dsn)
        assert run.returncode == 2
        assert f"argument {command[-1]}: a duration cannot be negative, got '-1h'" in run.stderr
    run = venturi("queue", "pause", "default", "--for", "--reason", dsn=pg_dsn)
    assert run.returncode == 2 and "argument --for: expected one argument" in run.stderr


def test_an_unmigrated_prefix_is_one_line(pg_dsn: str, prefix: str) -> None:
    for command in (["stats"], ["jobs"], ["worker", "tests.runtime.cli_app:make_worker"]):
        one_line(venturi(*command, dsn=pg_dsn, prefix=prefix), "run `venturi migrate`")


async def test_worker_factories_that_fail_are_one_line(
    queue: Queue, pg_dsn: str, tmp_path: Path
) -> None:
    (tmp_path / "broken_syntax.py").write_text("def make(store):\n    return (\n")
    (tmp_path / "raises_on_import.py").write_text("raise RuntimeError('no config file')\n")
    (tmp_path / "factories.py").write_text(
        "def raises(store):\n    raise KeyError('DATABASE_URL')\n"
        "def two_args(store, other):\n    return None\n"
        "NOT_CALLABLE = 42\n"
        "def not_a_worker(store):\n    return 'a string'\n"
    )
    prefix = queue.store.prefix
    cases = {
        "no_such_module:make": "cannot import module 'no_such_module': ModuleNotFoundError",
        "broken_syntax:make": "cannot import module 'broken_syntax': SyntaxError",
        "raises_on_import:make": "cannot import module 'raises_on_import': RuntimeError: no config",
        "factories:missing": "module 'factories' has no attribute 'missing'",
        "factories:raises": "factories:raises(store) failed: KeyError: 'DATABASE_URL'",
        "factories:two_args": "factories:two_args(store) failed: TypeError",
        "factories:NOT_CALLABLE": "factories:NOT_CALLABLE is not callable (int)",
        "factories:not_a_worker": "factories:not_a_worker returned 'a string', not a",
        "no_colon": "expected MODULE:FUNCTION",
    }
    for factory, message in cases.items():
        run = venturi("worker", factory, dsn=pg_dsn, prefix=prefix, pythonpath=tmp_path)
        one_line(run, f"venturi: worker: {message}" if factory != "no_colon" else message)
    debug = venturi(
        "worker", "factories:raises", "--debug", dsn=pg_dsn, prefix=prefix, pythonpath=tmp_path
    )
    assert debug.returncode == 2
    assert "Traceback" in debug.stderr and "KeyError: 'DATABASE_URL'" in debug.stderr
    assert debug.stderr.strip().splitlines()[-1].startswith("venturi: worker: factories:raises")


# --- JSON logs, and no password in any output --------------------------------------------------

RFC3339_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every line of `text` as a JSON log record with the four fields every record has."""
    records = []
    for line in text.splitlines():
        record = json.loads(line)  # fails the test on any line that is not JSON
        assert isinstance(record, dict), line
        assert RFC3339_UTC.fullmatch(record["time"]), record
        assert datetime.fromisoformat(record["time"]).tzinfo == UTC
        assert record["level"] in {"debug", "info", "warning", "error", "critical"}, record
        assert isinstance(record["logger"], str) and isinstance(record["message"], str), record
        records.append(record)
    return records


def with_password(dsn: str, password: str) -> str:
    """The test DSN with a password (the test server trusts every local connection)."""
    scheme, sep, rest = dsn.partition("://")
    user, at, where = rest.partition("@")
    if not sep or not at or ":" in user:
        pytest.skip("needs a postgresql://user@host/db DSN without a password")
    return f"{scheme}://{user}:{password}@{where}"


async def test_worker_logs_json_lines_and_never_the_password(queue: Queue, pg_dsn: str) -> None:
    marker = f"Pw{uuid.uuid4().hex}"
    dsn = with_password(pg_dsn, marker)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VENTURI_", "PG"))}
    env |= {"VENTURI_DSN": dsn, "VENTURI_PREFIX": queue.store.prefix}
    env["VENTURI_LOG_FORMAT"] = "json"  # the variable; the level by flag
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "venturi",
        "worker",
        "tests.runtime.cli_app:make_careless_worker",
        "--log-level",
        "debug",
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        echo_id = await queue.enqueue(Echo(text="via cli"))
        boom_id = await queue.enqueue(Boom())
        await until_status(queue, echo_id, JobStatus.COMPLETED)
        await until_status(queue, boom_id, JobStatus.DEAD)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=30)
    finally:
        await reap(proc)
    assert proc.returncode == 0
    out, err = stdout.decode(), stderr.decode()
    assert marker.lower() not in (out + err).lower()
    assert out == ""
    records = json_lines(err)

    [serving] = [r for r in records if r["logger"] == "venturi.cli" and "serving" in r["message"]]
    worker = serving["worker"]
    assert serving["message"] == f"worker {worker} serving ['echo', 'boom'] from ['default']"
    assert {"venturi.worker"} <= {r["logger"] for r in records}
    ours = [r for r in records if r["logger"].startswith(("venturi.", "tests."))]
    assert all(r["worker"] == worker for r in ours), "every record is the worker's"
    [stopped] = [r for r in records if r["message"].startswith(f"worker {worker} stopped")]
    assert stopped["level"] == "info"

    # The handler's own record carries its job; the DSN it logged is redacted.
    [echoed] = [r for r in records if r["logger"] == "tests.runtime.cli_app"]
    assert echoed["level"] == "debug"
    assert echoed["message"].startswith("echo via cli, connected with postgresql://")
    assert ":***@" in echoed["message"]
    assert (echoed["job_id"], echoed["kind"], echoed["queue"], echoed["run"]) == (
        str(echo_id),
        "echo",
        "default",
        1,
    )

    # The failure: the job's fields, and the traceback as a string (redacted too).
    boomed = [r for r in records if r.get("job_id") == str(boom_id)]
    [raised] = [r for r in boomed if r["message"].endswith("(boom) raised")]
    assert (raised["kind"], raised["queue"], raised["run"]) == ("boom", "default", 1)
    assert raised["exc_info"].startswith("Traceback (most recent call last):")
    assert "RuntimeError: cannot reach postgresql://" in raised["exc_info"]
    [dead] = [r for r in boomed if "(boom) dead: RuntimeError: cannot reach" in r["message"]]
    assert dead["level"] == "warning" and "exc_info" not in dead


def leaky_dsns(pg_dsn: str) -> dict[str, tuple[str, list[str]]]:
    """A DSN whose password a parser or the server would quote -> the pieces never to show."""
    where = pg_dsn.partition("@")[2]  # 127.0.0.1:PORT/postgres
    host, _, port = where.partition("/")[0].partition(":")
    return {
        "slash": (f"postgresql://postgres:Alpha1hush/Alpha2hush@{where}", ["Alpha1hush"]),
        "query-mark": (f"postgresql://postgres:Bravo1hush?Bravo2hush@{where}", ["Bravo2hush"]),
        "fragment": (f"postgresql://postgres:Charlie1hush#Charlie2hush@{where}", ["Charlie1hush"]),
        "query": (
            f"postgresql://postgres@{where}?password=Delta1hush&Delta2hush",
            ["Delta1hush", "Delta2hush"],
        ),
        "numeric": (f"postgresql://postgres:4321/Echo2hush@{where}", ["Echo2hush"]),
        "no-scheme": (f"Foxtrot1hush:Foxtrot2hush@{where}", ["Foxtrot1hush", "Foxtrot2hush"]),
        "unreachable": (f"postgresql://postgres:Golf1hush@{host}:1/postgres", ["Golf1hush"]),
        "no-database": (
            f"postgresql://postgres:Hotel1hush@{where.partition('/')[0]}/Hotel2hush",
            ["Hotel1hush"],
        ),
        "conninfo": (
            f"host={host} port={port} user=postgres password=India1hush India2hush",
            ["India1hush", "India2hush"],
        ),
    }


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_database_errors_never_show_the_password(pg_dsn: str, log_format: str) -> None:
    for name, (dsn, pieces) in leaky_dsns(pg_dsn).items():
        run = venturi("stats", "--log-format", log_format, dsn=dsn)
        assert run.returncode == 2, (name, run)
        for piece in pieces:
            assert piece.lower() not in run.stderr.lower(), (name, run.stderr)
        [line] = run.stderr.splitlines()
        if log_format == "json":
            [record] = json_lines(line)
            assert record["level"] == "error" and record["logger"] == "venturi.cli", record
            assert "exc_info" not in record  # the traceback only with --debug
        else:
            assert line.startswith("venturi: "), line
    # With --debug the traceback is there, in the record, and still without the password.
    dsn, pieces = leaky_dsns(pg_dsn)["slash"]
    run = venturi("stats", "--debug", "--log-format", log_format, dsn=dsn)
    assert "Traceback" in run.stderr and pieces[0].lower() not in run.stderr.lower()
    # The password from PGPASSWORD is redacted as well.
    run = venturi(
        "stats",
        "--log-format",
        log_format,
        dsn=leaky_dsns(pg_dsn)["no-database"][0].replace(":Hotel1hush", ""),
        env={"PGPASSWORD": "Hotel2hush"},
    )
    assert run.returncode == 2 and "does not exist" in run.stderr, run.stderr
    assert "hotel2hush" not in run.stderr.lower(), run.stderr


def test_log_options_are_checked(pg_dsn: str) -> None:
    run = venturi("stats", "--log-format", "yaml", dsn=pg_dsn)
    assert run.returncode == 2 and "--log-format: expected text or json, got 'yaml'" in run.stderr
    run = venturi("stats", dsn=pg_dsn, env={"VENTURI_LOG_LEVEL": "loud"})
    assert run.returncode == 2 and "--log-level: expected one of" in run.stderr, run.stderr


async def test_batches_commands(queue: Queue, pg_dsn: str) -> None:
    prefix = queue.store.prefix
    assert venturi("batches", "list", dsn=pg_dsn, prefix=prefix).stdout.strip() == "no batches"
    batch_id = await queue.batch("nightly").add(Echo(text="a"), Echo(text="b")).enqueue()
    listed = json.loads(venturi("batches", "list", "--json", dsn=pg_dsn, prefix=prefix).stdout)
    assert [(b["id"], b["name"], b["total"], b["state"]) for b in listed] == [
        (str(batch_id), "nightly", 2, "running")
    ]
    run = venturi("batches", "cancel", str(batch_id), dsn=pg_dsn, prefix=prefix)
    assert run.returncode == 0 and "skipped 2 jobs" in run.stdout
    shown = json.loads(
        venturi("batches", "show", str(batch_id), "--json", dsn=pg_dsn, prefix=prefix).stdout
    )
    assert (shown["cancelled"], shown["percent"], shown["state"]) == (2, 100, "cancelled")
    run = venturi("batches", "cancel", str(batch_id), dsn=pg_dsn, prefix=prefix)
    assert run.returncode == 0
    assert run.stdout.strip() == f"batch {batch_id} had finished (cancelled): nothing to cancel"
    run = venturi("batches", "prune", "--hours", "1", dsn=pg_dsn, prefix=prefix)
    assert run.returncode == 0 and run.stdout.strip() == "deleted 0 finished batches"
    run = venturi("batches", "show", "01ARZ3NDEKTSV4RRFFQ69G5FAV", dsn=pg_dsn, prefix=prefix)
    assert run.returncode != 0 and "no batch 01ARZ3NDEKTSV4RRFFQ69G5FAV" in run.stderr
    run = venturi("batches", "cancel", "nope", dsn=pg_dsn, prefix=prefix)
    assert run.returncode != 0 and "expected a ULID" in run.stderr


async def test_a_reader_that_leaves_early_is_not_a_database_error(
    queue: Queue, pg_dsn: str
) -> None:
    """`venturi jobs | head -1`: the listing outgrows the pipe, the reader goes, and the
    write that follows fails with EPIPE: the command ends as a piped command does (141),
    quietly, not with "database error: [Errno 32] Broken pipe"."""
    await queue.enqueue_many(Echo(text="x" * 40) for _ in range(3000))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VENTURI_", "PG"))}
    env |= {"VENTURI_DSN": pg_dsn, "VENTURI_PREFIX": queue.store.prefix}
    status, stderr = await asyncio.to_thread(_read_a_line_and_leave, env)
    assert (status, stderr) == (141, b"")


def _read_a_line_and_leave(env: dict[str, str]) -> tuple[int, bytes]:
    with subprocess.Popen(
        [sys.executable, "-m", "venturi", "jobs", "--limit", "3000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    ) as listing:
        assert listing.stdout is not None and listing.stderr is not None
        assert listing.stdout.readline()  # the header: the command is writing
        listing.stdout.close()
        stderr = listing.stderr.read()
        return listing.wait(60), stderr


async def test_a_statement_cut_short_by_a_setting_names_the_setting(
    queue: Queue, pg_dsn: str
) -> None:
    """The command's one line names the setting that cut the statement short (was asyncpg's
    "canceling statement due to lock timeout" alone)."""
    sep = "&" if "?" in pg_dsn else "?"
    hasty = f"{pg_dsn}{sep}options=-c%20lock_timeout%3D100"
    locker = await asyncpg.connect(pg_dsn)
    try:
        async with locker.transaction():
            await locker.execute(f"LOCK TABLE {queue.store.prefix}_counts IN ACCESS EXCLUSIVE MODE")
            run = await asyncio.to_thread(venturi, "stats", dsn=hasty, prefix=queue.store.prefix)
    finally:
        await locker.close()
    assert run.returncode == 2
    assert run.stderr.startswith("venturi: database error: canceling statement due to lock")
    assert "(a lock_timeout of the role or database (SHOW lock_timeout)" in run.stderr


async def test_a_metrics_port_in_use_is_said_as_such(queue: Queue, pg_dsn: str) -> None:
    """Not "database error: [Errno 98] Address already in use"."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = venturi(
            "worker",
            "tests.runtime.cli_app:make_metrics_worker",
            "--once",
            dsn=pg_dsn,
            prefix=queue.store.prefix,
            env={"METRICS_PORT": str(port)},
        )
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().endswith(
        f"venturi: metrics_port {port}: cannot serve /metrics on 127.0.0.1:{port}: "
        "Address already in use"
    ), run.stderr


def test_bad_flags_are_named_before_anything_connects() -> None:
    dsn = "postgresql://nobody@127.0.0.1:1/none"  # never reached: each is refused first
    cases = [
        (["jobs", "--queue", ""], "argument --queue: invalid queue name ''"),  # not every queue
        (
            ["jobs", "--limit", "99999999999"],
            "argument --limit: expected a number from 1 to 10,000",
        ),
        (["failed", "list", "--queue", "a b"], "argument --queue: invalid queue name 'a b'"),
        (
            ["worker", "m:f", "--max-time", "150"],
            "argument --max-time: expected a duration with its unit, like 90s",
        ),
        (["worker", "m:f", "--max-time", "0s"], "argument --max-time: expected a duration longer"),
    ]
    for args, message in cases:
        run = venturi(*args, dsn=dsn)
        assert run.returncode == 2 and message in run.stderr, (args, run.stderr)
        assert "database error" not in run.stderr
