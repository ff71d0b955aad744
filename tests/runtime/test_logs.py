"""The log formatters as plain functions: the JSON line's fields, bound fields, redaction,
and which pieces of a DSN are redacted."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from ulid import ULID

from venturi import Backoff, Context, JobStatus, Outcome, Queue, Task, Worker, logs
from venturi._dsn import secret_pieces

from .helpers import running, until_status


def record(msg: str = "hello %s", *args: Any, **extra: Any) -> logging.LogRecord:
    rec = logging.LogRecord("venturi.test", logging.WARNING, __file__, 1, msg, args or ("x",), None)
    rec.__dict__.update(extra)
    return rec


def line(rec: logging.LogRecord, **kwargs: Any) -> dict[str, Any]:
    text = logs.JsonFormatter(**kwargs).format(rec)
    assert "\n" not in text
    parsed = json.loads(text)
    assert isinstance(parsed, dict)
    return parsed


def test_a_json_line_has_the_fields_and_nothing_else_of_the_record() -> None:
    rec = record(
        job_id="01J0000000000000000000000",
        kind="mail",
        queue="default",
        run=2,
        worker="pod/host:1#abcd",
        settings=object(),  # kopf's extra: never written
        password="hunter2",  # nor any other attribute
    )
    rec.created = 1_700_000_000.25
    assert line(rec) == {
        "time": "2023-11-14T22:13:20.250000Z",
        "level": "warning",
        "logger": "venturi.test",
        "message": "hello x",
        "job_id": "01J0000000000000000000000",
        "kind": "mail",
        "queue": "default",
        "run": 2,
        "worker": "pod/host:1#abcd",
    }


def test_exceptions_and_stacks_are_strings() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        rec = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    rec.stack_info = "Stack (most recent call last):\n  here"
    out = line(rec)
    assert out["exc_info"].startswith("Traceback (most recent call last):")
    assert out["exc_info"].endswith("RuntimeError: boom")
    assert out["stack_info"] == rec.stack_info


def test_a_log_call_with_bad_arguments_still_makes_a_json_line() -> None:
    out = line(record("%d jobs", "many"))
    assert out["message"] == "'%d jobs' (its arguments did not format: TypeError)"


def test_values_json_cannot_hold_become_strings() -> None:
    ulid = ULID()
    assert line(record(job_id=ulid, run=uuid.UUID(int=1)))["job_id"] == str(ulid)


async def test_bound_fields_reach_the_tasks_started_inside_and_end_with_the_block() -> None:
    formatter = logs.JsonFormatter()
    seen: list[dict[str, Any]] = []

    async def child() -> None:
        seen.append(json.loads(formatter.format(record())))

    with logs.bound({"worker": "w1"}):
        with logs.bound({"job_id": "J", "kind": "k"}):
            await asyncio.create_task(child())
        await asyncio.create_task(child())
    await child()
    assert [{k: s.get(k) for k in ("worker", "job_id", "kind")} for s in seen] == [
        {"worker": "w1", "job_id": "J", "kind": "k"},
        {"worker": "w1", "job_id": None, "kind": None},
        {"worker": None, "job_id": None, "kind": None},
    ]
    # A record's own fields win over bound ones; bound ones never replace the core four.
    with logs.bound({"kind": "bound", "message": "not this", "tenant": "t1"}):
        out = json.loads(formatter.format(record(kind="own")))
    assert (out["kind"], out["message"], out["tenant"]) == ("own", "hello x", "t1")


def test_job_fields_name_a_job_by_its_ulid() -> None:
    ulid = ULID()
    as_uuid = uuid.UUID(bytes=ulid.bytes)
    assert logs.job_fields(as_uuid, "mail", "q", 3) == {
        "job_id": str(ulid),
        "kind": "mail",
        "queue": "q",
        "run": 3,
    }
    assert logs.job_fields(ulid, "mail", "q", 3)["job_id"] == str(ulid)


@dataclass
class Flaky(Task):
    KIND = "logs.flaky"


async def test_messages_name_a_job_as_enqueue_returned_it(
    queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    """Every message about a job names it by the id `enqueue` returned (a ULID), the form
    the journal, the hooks and `venturi journal` use: before, the worker's messages printed
    the store's UUID of the same job, so a search for the id found only some of them."""

    async def flaky(task: Flaky, ctx: Context[None], app: None) -> Outcome:
        if ctx.run_count == 1:
            raise RuntimeError("first run fails")
        return Outcome.completed()

    worker = Worker(None, queue.store, concurrency=1, backoff=Backoff(0, 0))
    worker.register(Flaky, flaky)
    job_id = await queue.enqueue(Flaky())
    with caplog.at_level(logging.INFO, logger="venturi"):
        async with running(worker):
            await until_status(queue, job_id, JobStatus.COMPLETED)
    about_it = [r.getMessage() for r in caplog.records if str(job_id) in r.getMessage()]
    assert any("raised" in m for m in about_it), [r.getMessage() for r in caplog.records]
    assert not [r for r in caplog.records if str(job_id.to_uuid()) in r.getMessage()]


async def test_enqueue_and_claim_log_at_debug(
    queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    async def done(task: Flaky, ctx: Context[None], app: None) -> Outcome:
        return Outcome.completed()

    worker = Worker(None, queue.store, concurrency=1)
    worker.register(Flaky, done)
    with caplog.at_level(logging.DEBUG, logger="venturi"):
        job_id = await queue.enqueue(Flaky())
        async with running(worker):
            await until_status(queue, job_id, JobStatus.COMPLETED)
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG]
    enqueued = [r for r in debug if r.getMessage() == f"enqueued job {job_id} (logs.flaky)"]
    claimed = [
        r for r in debug if r.getMessage().startswith(f"claimed job {job_id} (logs.flaky), run 1")
    ]
    assert enqueued and claimed, [r.getMessage() for r in debug]
    fields = claimed[0].__dict__
    assert (fields["job_id"], fields["kind"], fields["queue"], fields["run"]) == (
        str(job_id),
        "logs.flaky",
        "default",
        1,
    )


def test_redaction_takes_whole_words_in_any_case() -> None:
    redact = logs.Redactor(["s3cr3t", "ab"])
    assert redact("postgresql://u:S3CR3T@h/db") == "postgresql://u:***@h/db"
    assert redact("port 'ab' in table abc, crab") == "port '***' in table abc, crab"
    assert redact("line\ns3cr3t") == "line\n***"
    assert logs.Redactor([])("s3cr3t") == "s3cr3t"


def test_both_formatters_redact_messages_and_tracebacks() -> None:
    try:
        raise ValueError("bad port 'Pw1'")
    except ValueError:
        rec = logging.LogRecord("x", logging.ERROR, __file__, 1, "dsn %s", ("u:Pw1@h",), None)
        rec.exc_info = sys.exc_info()
    text = logs.TextFormatter(redact=["Pw1"]).format(rec)
    assert "Pw1" not in text and "dsn u:***@h" in text and "bad port '***'" in text
    rec.exc_text = None
    out = line(rec, redact=["Pw1"])
    assert out["message"] == "dsn u:***@h" and "bad port '***'" in out["exc_info"]


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield root
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def test_configure_leaves_one_handler_on_the_root(root_logger: logging.Logger) -> None:
    root_logger.addHandler(logging.StreamHandler(io.StringIO()))
    handler = logs.configure("json", "debug")
    assert root_logger.handlers == [handler] and root_logger.level == logging.DEBUG
    assert isinstance(handler.formatter, logs.JsonFormatter)
    assert isinstance(logs.configure("text", "error").formatter, logs.TextFormatter)
    with pytest.raises(ValueError, match="log format: expected one of text, json, got 'xml'"):
        logs.configure("xml")
    with pytest.raises(ValueError, match="log level"):
        logs.configure("text", "trace")


def _log_with_traceback(logger: str, exc: BaseException) -> None:
    try:
        raise exc
    except type(exc):
        logging.getLogger(logger).warning(
            "Failed to restore the pool connection floor; retrying", exc_info=True
        )


def test_the_pool_s_reconnect_retries_are_one_line_each(
    root_logger: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.configure("text", "info", redact=["s3cret"])
    refused = ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 5432)")
    _log_with_traceback("asyncpg.pool", refused)
    _log_with_traceback("asyncpg.pool", OSError("password s3cret rejected"))
    _log_with_traceback("venturi.worker", refused)  # anyone else's traceback stays whole
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].endswith(
        "WARNING asyncpg.pool: Failed to restore the pool connection floor; retrying "
        "(ConnectionRefusedError: [Errno 111] Connect call failed ('127.0.0.1', 5432))"
    )
    assert lines[1].endswith("retrying (OSError: password *** rejected)")
    assert (
        "WARNING venturi.worker:" in lines[2] and lines[3] == "Traceback (most recent call last):"
    )
    assert not any("Traceback" in line for line in lines[:2])
    # The operator's: the class and the code, not what the server said.
    logs.configure("text", "info", quote_errors=False)
    _log_with_traceback("asyncpg.pool", refused)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith("retrying (ConnectionRefusedError ECONNREFUSED)")


WHERE = "127.0.0.1:5432/app"


@pytest.mark.parametrize(
    ("dsn", "password", "pieces"),
    [
        (f"postgresql://app:s3cret@{WHERE}", None, ["s3cret"]),
        (f"postgresql://app:a%2Fb@{WHERE}", None, ["a%2Fb", "a/b"]),  # encoded: never cut
        (f"postgresql://app:pa:ss@{WHERE}", None, ["pa:ss"]),  # ":" is fine in a password
        # An unencoded character that breaks parsing: every piece a parser could quote.
        (f"postgresql://app:Ab1/Cd2@{WHERE}", None, ["Ab1/Cd2", "Ab1", "Cd2"]),
        (f"postgresql://app:Ab1?Cd2@{WHERE}", None, ["Ab1?Cd2", "Ab1", "Cd2"]),
        (f"postgresql://app:Ab1@Cd2@{WHERE}", None, ["Ab1@Cd2", "Ab1", "Cd2"]),
        (f"postgresql://app@{WHERE}?password=Ab1&Cd2", None, ["Ab1&Cd2", "Ab1", "Cd2"]),
        (f"postgresql://app@{WHERE}?password=Ab1&sslmode=require", None, ["Ab1"]),
        (f"Ab1:Cd2@{WHERE}", None, ["Ab1:Cd2", "Ab1", "Cd2"]),  # no scheme: the user too
        ("host=db password='it\\'s' sslmode=require", None, ["'it\\'s'", "it's", "it", "s"]),
        ("host=db user=app password=Ab1 Cd2", None, ["Ab1 Cd2", "Ab1", "Cd2"]),
        ("host=db user=me@corp", None, []),
        (f"postgresql://app@{WHERE}", "from-env", ["from-env"]),
        (None, None, []),
    ],
)
def test_the_pieces_of_a_password(dsn: str | None, password: str | None, pieces: list[str]) -> None:
    assert sorted(secret_pieces(dsn, password)) == sorted(pieces)


async def test_a_worker_an_application_runs_names_itself_in_every_record(queue: Queue) -> None:
    """Not only under `venturi worker`: `Worker.run` binds its identity for its tasks."""
    formatter = logs.JsonFormatter()
    lines: list[dict[str, Any]] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(json.loads(formatter.format(record)))

    handler = Collect(logging.DEBUG)
    log = logging.getLogger("venturi")
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        job_id = await queue.enqueue(Flaky())
        worker: Worker[None] = Worker(None, queue.store)
        worker.register(Flaky, lambda task, ctx, app: asyncio.sleep(0))
        async with running(worker):
            await until_status(queue, job_id, JobStatus.COMPLETED)
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    mine = [line for line in lines if line["logger"] in ("venturi.worker", "venturi._executor")]
    assert mine and all(line.get("worker") == str(worker.identity) for line in mine), mine
