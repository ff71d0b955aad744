"""The `venturi` command line: operate a queue from a shell.

    venturi migrate                          apply the schema (idempotent)
    venturi worker MODULE:FACTORY            run a worker built by FACTORY(store)
    venturi stats                            live counts by kind
    venturi workers                          the running workers (the registry)
    venturi jobs [--status S] [--kind K]     list jobs, newest first
    venturi journal JOB_ID                   one job's journal
    venturi cleanup --older-than 7d          delete finished jobs (and their journal)
    venturi failed list|retry|retry-all|forget|flush   the jobs that failed for good
    venturi queue pause NAME [--reason R] [--for 1h | --until TIME]
    venturi queue resume NAME                resume a paused queue (workers wake at once)
    venturi queue list                       queues with pending jobs or a pause
    venturi demo                             the demo (an embedded database without --dsn)
    venturi dashboard [--port 8080]          the web dashboard, on 127.0.0.1

Every command takes the DSN from --dsn or VENTURI_DSN and the prefix from --prefix or
VENTURI_PREFIX; `--json` prints machine-readable output. A missing or unreachable database,
an unmigrated schema, a bad argument or a worker factory that fails to load is one clear
line on stderr and exit status 2, not a traceback (`--debug` adds the traceback).

Logs go to stderr, as text or as JSON lines (--log-format / VENTURI_LOG_FORMAT), from
--log-level / VENTURI_LOG_LEVEL up (info for `worker`, warning for the rest); the DSN's
password (and PGPASSWORD) is redacted from them and from error lines.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import inspect
import json
import logging
import os
import re
import signal
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
from ulid import ULID

from venturi import _loops, logs
from venturi._db.failures import describe, is_database_failure, next_delay, waiting_cannot_mend
from venturi._dsn import secret_pieces
from venturi._outage import REFUSALS
from venturi._settings import check_kind, check_queue_name
from venturi._shown import shown
from venturi._timeouts import wait_for
from venturi.embedded import EmbeddedPostgresError
from venturi.encryption import KEYS_ENV, KeyRing, SealedCodec, new_key
from venturi.errors import JobStateError, MetricsPortError, SchemaError
from venturi.jobs import (
    BatchStatus,
    CleanupCriteria,
    FailedJob,
    Job,
    JobFilter,
    JobStatus,
    JournalEntry,
    QueueStats,
    Stats,
)
from venturi.pauses import QueueState
from venturi.postgres import DEFAULT_PREFIX, MIGRATE_LOCK_TIMEOUT, POOLERS, PostgresStore
from venturi.queue import Queue
from venturi.registry import WorkerInfo
from venturi.schedules import ScheduleInfo
from venturi.worker import Worker

_DURATION = re.compile(r"(?P<n>\d+(?:\.\d+)?)(?P<unit>s|m|h|d|w)")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


class UsageError(Exception):
    """A bad command line: printed as one line, exit status 2."""


def _negative_values_attached(argv: Sequence[str]) -> list[str]:
    """`argv` with `--for -1h` written `--for=-1h`: a negative value reaches its option's
    check (argparse alone takes `-1h` for an option, and says only "expected one
    argument"). No command takes a negative number where it does not take a value."""
    out: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg.startswith("--") and "=" not in arg and arg != "--":
            value = next(args, None)
            if value is not None and re.match(r"-[\d.]", value):
                out.append(f"{arg}={value}")
                continue
            out.append(arg)
            if value is not None:
                out.append(value)
            continue
        out.append(arg)
    return out


def parse_duration(text: str) -> timedelta:
    """'90s', '15m', '12h', '7d', '2w' -> timedelta."""
    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"a duration cannot be negative, got {text!r}")
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(
            f"expected a duration with its unit, like 90s, 15m, 12h, 7d, got {text!r}"
        )
    try:
        return timedelta(seconds=float(match["n"]) * _UNITS[match["unit"]])
    except OverflowError:  # beyond timedelta's 999,999,999 days (or an infinite float)
        raise argparse.ArgumentTypeError(f"duration {text!r} is too long") from None


def _count(n: int, one: str, many: str | None = None) -> str:
    """'1 failed job', '2 failed jobs', '1,000 runs'."""
    return f"{n:,} {one if n == 1 else (many or one + 's')}"


def positive_duration(text: str) -> timedelta:
    """A duration longer than zero (a pause for none would have ended already)."""
    value = parse_duration(text)
    if value <= timedelta(0):
        raise argparse.ArgumentTypeError(f"expected a duration longer than 0, got {text!r}")
    return value


def _lock_timeout(text: str) -> timedelta:
    """A duration (2s, 1m), or a bare number of seconds; 0 is no timeout."""
    try:
        value = timedelta(seconds=float(text))
    except (ValueError, OverflowError):
        value = parse_duration(text)
    if value < timedelta(0):
        raise argparse.ArgumentTypeError(f"expected a duration of 0 or more, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An int >= 1, for counts on the command line."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def _queue_name(text: str) -> str:
    """A queue name, checked before anything connects ('' is no queue, not every queue)."""
    try:
        return check_queue_name(text, setting="queue")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("queue: ")) from None


def _at_most(most: int) -> Callable[[str], int]:
    """`positive_int`, and at most `most` (the API's own bound, said with the flag)."""

    def parse(text: str) -> int:
        value = positive_int(text)
        if value > most:
            raise argparse.ArgumentTypeError(f"expected a number from 1 to {most:,}, got {value}")
        return value

    return parse


def parse_time(text: str) -> datetime:
    """An ISO 8601 time with its UTC offset ('2026-12-01T18:00:00+01:00', '...Z')."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO 8601 time with its offset, like 2026-12-01T18:00:00Z, got {text!r}"
        ) from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"expected a time with its UTC offset (Z or +01:00), got {text!r}"
        )
    return value


def log_format(text: str) -> str:
    """--log-format (or VENTURI_LOG_FORMAT): text or json."""
    if text not in logs.FORMATS:
        raise argparse.ArgumentTypeError(f"expected text or json, got {text!r}")
    return text


def log_level(text: str) -> str:
    """--log-level (or VENTURI_LOG_LEVEL): debug, info, warning or error."""
    if text.lower() not in logs.LEVELS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(logs.LEVELS)}, got {text!r}")
    return text.lower()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="venturi", description="Typed jobs on PostgreSQL.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--dsn", default=os.environ.get("VENTURI_DSN"), help="PostgreSQL DSN (env VENTURI_DSN)"
    )
    common.add_argument(
        "--prefix",
        default=os.environ.get("VENTURI_PREFIX", DEFAULT_PREFIX),
        help="table prefix (env VENTURI_PREFIX, default %(default)s)",
    )
    common.add_argument(
        "--pooler",
        choices=POOLERS,
        default=os.environ.get("VENTURI_POOLER", "none"),
        help="transaction: --dsn goes through PgBouncer (or another pooler) in transaction "
        "mode; keep no session state (env VENTURI_POOLER, default %(default)s)",
    )
    common.add_argument(
        "--listen-dsn",
        default=os.environ.get("VENTURI_LISTEN_DSN"),
        help="a direct connection to PostgreSQL for LISTEN, bypassing the pooler (env "
        "VENTURI_LISTEN_DSN); without it a worker behind a transaction pooler polls",
    )
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument(
        "--debug", action="store_true", help="print the traceback behind an error message"
    )
    common.add_argument(
        "--log-format",
        type=log_format,
        default=os.environ.get("VENTURI_LOG_FORMAT", "text"),
        help="text or json, one object per line (env VENTURI_LOG_FORMAT, default text)",
    )
    common.add_argument(
        "--log-level",
        type=log_level,
        default=os.environ.get("VENTURI_LOG_LEVEL"),
        help="debug, info, warning or error (env VENTURI_LOG_LEVEL; default info for "
        "worker, warning for the other commands)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    migrate = sub.add_parser("migrate", parents=[common], help="apply pending migrations")
    migrate.add_argument(
        "--lock-timeout",
        type=_lock_timeout,
        default=timedelta(seconds=MIGRATE_LOCK_TIMEOUT),
        help="how long a migration's statement waits for a table lock held by an open "
        "transaction before it gives way and tries again a little later (the queue runs "
        f"meanwhile); 0 waits as long as it takes (default {MIGRATE_LOCK_TIMEOUT:g}s)",
    )

    worker = sub.add_parser("worker", parents=[common], help="run a worker until SIGTERM/SIGINT")
    worker.add_argument("factory", help="MODULE:FUNCTION returning a Worker; called with the store")
    worker.add_argument(
        "--queue",
        help="queues to serve, in order, comma-separated (default: the factory's Worker's)",
    )
    worker.add_argument(
        "--unknown-kinds",
        choices=["wait", "fail"],
        help="a job of a kind with no task: leave it pending (wait) or fail it for good "
        "(fail); default: the factory's Worker's (wait)",
    )
    mode = worker.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="run the jobs due now, then exit")
    mode.add_argument(
        "--stop-when-empty",
        action="store_true",
        help="exit when nothing is pending (due now or later) and nothing runs",
    )
    worker.add_argument("--max-jobs", type=positive_int, help="exit after this many jobs")
    worker.add_argument(
        "--max-time", type=positive_duration, help="shut down gracefully after this long (90s, 1h)"
    )
    worker.add_argument(
        "--loop",
        choices=_loops.LOOPS,
        default=os.environ.get("VENTURI_LOOP", _loops.LOOPS[0]),
        help="the event loop: asyncio's own, or uvloop (less CPU per job; needs the "
        "venturi[uvloop] extra) (env VENTURI_LOOP; default asyncio)",
    )

    sub.add_parser("stats", parents=[common], help="live counts by kind")
    sub.add_parser(
        "workers", parents=[common], help="the running workers, and pending kinds none serves"
    )
    sub.add_parser("schedules", parents=[common], help="periodic schedules and their next run")

    jobs = sub.add_parser("jobs", parents=[common], help="list jobs, newest first")
    jobs.add_argument("--status", choices=[s.value for s in JobStatus])
    jobs.add_argument("--kind")
    jobs.add_argument("--queue", type=_queue_name, help="only this named queue's jobs")
    jobs.add_argument("--limit", type=_at_most(10_000), default=50)
    jobs.add_argument("--before", help="job id: list jobs older than this one (paging)")

    journal = sub.add_parser("journal", parents=[common], help="one job's journal")
    journal.add_argument("job_id")

    cleanup = sub.add_parser("cleanup", parents=[common], help="delete finished jobs")
    cleanup.add_argument(
        "--older-than", type=parse_duration, required=True, help="finished at least this long ago"
    )
    cleanup.add_argument("--kind")
    cleanup.add_argument("--status", choices=["completed", "dead"])

    rekey = sub.add_parser(
        "rekey", parents=[common], help="seal stored encrypted values with the current key"
    )
    rekey.add_argument(
        "--keys-env",
        default=KEYS_ENV,
        help="environment variable holding the key ring (default %(default)s)",
    )
    sub.add_parser("keygen", parents=[common], help="print a new random key for a key ring")
    new_task = sub.add_parser(
        "new-task", parents=[common], help="write a new task, its handler and a test"
    )
    new_task.add_argument("name", help="the task class, in CamelCase (SendInvoice)")
    new_task.add_argument("--module", required=True, help="where it lives (myapp.orders)")
    new_task.add_argument(
        "--root", type=Path, default=Path("."), help="project directory (default: here)"
    )
    failed = sub.add_parser("failed", help="the jobs that failed for good (status dead)")
    action = failed.add_subparsers(dest="action", required=True)
    listing = action.add_parser("list", parents=[common], help="failed jobs, newest first")
    listing.add_argument("--queue", type=_queue_name)
    listing.add_argument("--kind")
    listing.add_argument("--limit", type=positive_int, default=50)
    listing.add_argument("--before", help="job id: list jobs older than this one (paging)")
    retry = action.add_parser("retry", parents=[common], help="put failed jobs back in their queue")
    retry.add_argument("job_ids", nargs="+", metavar="JOB_ID")
    retry_all = action.add_parser("retry-all", parents=[common], help="retry every failed job")
    retry_all.add_argument("--queue", type=_queue_name)
    retry_all.add_argument("--kind")
    forget = action.add_parser("forget", parents=[common], help="delete failed jobs")
    forget.add_argument("job_ids", nargs="+", metavar="JOB_ID")
    flush = action.add_parser("flush", parents=[common], help="delete every failed job")
    flush.add_argument("--queue", type=_queue_name)
    flush.add_argument("--kind")
    flush.add_argument("--older-than", type=parse_duration, help="failed at least this long ago")
    batches = sub.add_parser("batches", help="batches: list, show, cancel and prune")
    batch_sub = batches.add_subparsers(dest="batch_command", required=True)
    batch_list = batch_sub.add_parser("list", parents=[common], help="batches, newest first")
    batch_list.add_argument("--limit", type=positive_int, default=20)
    batch_list.add_argument("--before", help="batch id: list batches older than this one")
    batch_show = batch_sub.add_parser("show", parents=[common], help="one batch's progress")
    batch_show.add_argument("batch_id", metavar="BATCH_ID")
    batch_cancel = batch_sub.add_parser(
        "cancel", parents=[common], help="skip a batch's jobs that have not started"
    )
    batch_cancel.add_argument("batch_id", metavar="BATCH_ID")
    batch_prune = batch_sub.add_parser("prune", parents=[common], help="delete finished batches")
    batch_prune.add_argument(
        "--hours", type=positive_int, required=True, help="finished at least this many hours ago"
    )
    queues = sub.add_parser("queue", help="pause, resume and list named queues")
    queue_sub = queues.add_subparsers(dest="queue_command", required=True)
    pause = queue_sub.add_parser(
        "pause", parents=[common], help="stop claims from a queue (its jobs stay pending)"
    )
    pause.add_argument("name", help="the queue (it need not have jobs yet)")
    pause.add_argument("--reason", help="why, for whoever lists the queues")
    ends = pause.add_mutually_exclusive_group()
    ends.add_argument(
        "--for", dest="for_", type=positive_duration, help="resume by itself after this long (1h)"
    )
    ends.add_argument(
        "--until", type=parse_time, help="resume by itself at this time (ISO 8601, with offset)"
    )
    resume = queue_sub.add_parser("resume", parents=[common], help="resume a paused queue")
    resume.add_argument("name")
    queue_sub.add_parser("list", parents=[common], help="queues with pending jobs or a pause")

    demo = sub.add_parser("demo", parents=[common], help="run the demo (embedded DB without --dsn)")
    demo.add_argument("--jobs", type=positive_int, default=3000)
    demo.add_argument("--concurrency", type=positive_int, default=8)
    demo.add_argument(
        "--dashboard",
        action="store_true",
        help="then keep the worker running and serve the dashboard until Ctrl-C",
    )
    demo.add_argument("--port", type=port_number, default=8080, help="the dashboard's port")

    dash = sub.add_parser("dashboard", parents=[common], help="serve the web dashboard")
    dash.add_argument("--host", default="127.0.0.1", help="address to bind (%(default)s)")
    dash.add_argument("--port", type=port_number, default=8080, help="port (%(default)s)")
    dash.add_argument("--read-only", action="store_true", help="hide and refuse the actions")
    return parser


def port_number(text: str) -> int:
    """A TCP port, 0 (any free one) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {value}")
    return value


def _ulid(text: str) -> ULID:
    try:
        return ULID.from_str(text)
    except ValueError:
        raise UsageError(f"not a job id (a 26-character ULID): {text!r}") from None


def _new_task(args: argparse.Namespace) -> int:
    from venturi import scaffold

    written = scaffold.write(scaffold.render(args.name, args.module), args.root)
    _out(
        args,
        {"written": [str(p) for p in written]},
        "\n".join(f"wrote {p}" for p in written),
    )
    return 0


async def _run(args: argparse.Namespace) -> int:
    if args.command == "keygen":
        key = new_key()
        _out(args, {"key": key}, key)
        return 0
    if args.command == "new-task":
        return _new_task(args)
    if args.command == "demo":
        from venturi.demo import run_demo

        if args.dashboard:  # before the demo runs, not after it
            try:
                import venturi.dashboard  # noqa: F401
            except ImportError as exc:
                raise UsageError(f"demo --dashboard: {exc}") from None
        prefix = args.prefix if args.prefix != DEFAULT_PREFIX else "venturi_demo"
        await run_demo(
            args.dsn,
            jobs=args.jobs,
            concurrency=args.concurrency,
            prefix=prefix,
            dashboard_port=args.port if args.dashboard else None,
        )
        return 0
    if args.dsn is None and not os.environ.get("PGHOST"):
        raise UsageError("no database given: pass --dsn or set VENTURI_DSN")

    def connect() -> Awaitable[PostgresStore]:
        return PostgresStore.connect(
            args.dsn, prefix=args.prefix, pooler=args.pooler, listen_dsn=args.listen_dsn
        )

    # A worker waits for its database (started before it, or during a failover: exiting would
    # only get it restarted, later and later); the other commands report and exit.
    waiting = _Waiting() if args.command == "worker" else None
    store = await (waiting.run("connecting", connect) if waiting else connect())
    async with store:
        queue = Queue(store)
        if args.command == "migrate":
            applied = await store.migrate(lock_timeout=args.lock_timeout.total_seconds())
            _out(
                args,
                {"applied": applied},
                f"applied migrations {applied}" if applied else "schema is up to date",
            )
        elif args.command == "worker":
            assert waiting is not None
            await _worker(args, store, waiting)
        elif args.command == "rekey":
            ring = KeyRing.from_env(args.keys_env)
            n = await Queue(store, codec=SealedCodec(ring)).rekey()
            _out(args, {"rewritten": n, "current_key": ring.current},
                 f"rekeyed {n} jobs to key {ring.current!r}")  # fmt: skip
        elif args.command == "stats":
            stats = await queue.stats()
            _out(args, _stats_json(stats), _stats_text(stats))
        elif args.command == "workers":
            workers = await queue.workers()
            unserved = await queue.unserved_kinds()
            fenced = await queue.fenced_pods()
            _out(
                args,
                {
                    "workers": [_worker_json(w) for w in workers],
                    "unserved_kinds": unserved,
                    "fenced_pods": fenced,
                },
                _workers_text(workers, unserved, fenced),
            )
        elif args.command == "schedules":
            found_schedules = await queue.schedules()
            _out(
                args,
                [_schedule_json(s) for s in found_schedules],
                _schedules_text(found_schedules),
            )
        elif args.command == "jobs":
            found = await queue.jobs(
                JobFilter(
                    status=JobStatus(args.status) if args.status else None,
                    kind=args.kind,
                    queue=args.queue,
                    limit=args.limit,
                    before_id=_ulid(args.before) if args.before else None,
                )
            )
            _out(args, [_job_json(j) for j in found], _jobs_text(found))
        elif args.command == "journal":
            job_id = _ulid(args.job_id)
            job = await queue.job(job_id)
            if job is None:
                raise UsageError(f"no job {job_id}")
            entries = await queue.job_journal(job_id)
            _out(
                args,
                {"job": _job_json(job), "journal": [_entry_json(e) for e in entries]},
                _journal_text(job, entries),
            )
        elif args.command == "cleanup":
            await _cleanup(args, store)
        elif args.command == "dashboard":
            await _dashboard(args, store)
        elif args.command == "failed":
            await _failed(args, queue)
        elif args.command == "queue":
            await _queue(args, queue)
        elif args.command == "batches":
            await _batches(args, queue)
    return 0


async def _dashboard(args: argparse.Namespace, store: PostgresStore) -> None:
    try:
        from venturi.dashboard import _serve, app
    except ImportError as exc:
        raise UsageError(
            f"dashboard: needs the dashboard extra (pip install 'venturi[dashboard]'): {exc}"
        ) from None
    await store.check_schema()
    try:
        sock = _serve.listen(args.host, args.port)
    except OSError as exc:
        raise UsageError(f"dashboard: cannot listen on {args.host}:{args.port}: {exc}") from None
    shutdown = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, shutdown.set)
    print(f"venturi: dashboard of {store.prefix!r} at {_serve.url_of(sock)}", file=sys.stderr)
    if not _serve.local_only(args.host):
        print(
            "venturi: only clients on this machine are let in (no gate); to open it to others, "
            "mount venturi.dashboard.app(store, gate=...) in your app",
            file=sys.stderr,
        )
    await _serve.serve(app(store, allow_local=True, read_only=args.read_only), sock, shutdown)


async def _failed(args: argparse.Namespace, queue: Queue) -> None:
    try:
        if args.action == "list":
            found = await queue.failed(
                queue=args.queue,
                kind=args.kind,
                limit=args.limit,
                before_id=_ulid(args.before) if args.before else None,
            )
            _out(args, [_failed_json(f) for f in found], _failed_text(found))
        elif args.action in ("retry", "forget"):
            # Every id's form is checked before any job is changed; an id given twice is one.
            ids = list(dict.fromkeys(_ulid(text) for text in args.job_ids))
            act = queue.retry if args.action == "retry" else queue.forget
            done = "retried" if args.action == "retry" else "forgotten"
            for n, job_id in enumerate(ids):
                try:
                    await act(job_id)
                except JobStateError as exc:  # say what was changed before it, and what not
                    before = ", ".join(map(str, ids[:n])) or "none"
                    after = ", ".join(map(str, ids[n + 1 :])) or "none"
                    raise UsageError(
                        f"failed {args.action}: {exc} ({done} before it: {before}; not tried: "
                        f"{after})"
                    ) from None
            _out(args, {done: [str(i) for i in ids]}, f"{done} {_count(len(ids), 'failed job')}")
        elif args.action == "retry-all":
            n = await queue.retry_all(queue=args.queue, kind=args.kind)
            _out(args, {"retried": n}, f"retried {_count(n, 'failed job')}")
        else:
            before = None
            if args.older_than is not None:
                try:
                    before = await queue.store.database_now() - args.older_than
                except OverflowError:
                    raise UsageError("--older-than reaches back before the year 1") from None
            n = await queue.flush(queue=args.queue, kind=args.kind, before=before)
            _out(args, {"deleted": n}, f"deleted {_count(n, 'failed job')}")
    except JobStateError as exc:
        raise UsageError(f"failed {args.action}: {exc}") from None
    except ValueError as exc:
        raise UsageError(f"failed {args.action}: {exc}") from None


def _failed_json(f: FailedJob) -> dict[str, Any]:
    return {
        "id": str(f.id),
        "queue": f.queue,
        "kind": f.kind,
        "failed_at": f.failed_at.isoformat(),
        "run_count": f.run_count,
        "failures": f.failures,
        "error": f.error,
        "payload": f.payload,
    }


def _failed_text(found: list[FailedJob]) -> str:
    if not found:
        return "no failed jobs"
    rows = [("ID", "QUEUE", "KIND", "FAILED AT", "RUNS", "ERROR")]
    for f in found:
        rows.append(
            (
                str(f.id),
                f.queue,
                f.kind,
                f.failed_at.strftime("%Y-%m-%d %H:%M:%S"),
                str(f.run_count),
                (f.error or "")[:80],
            )
        )
    return _table(rows)


async def _batches(args: argparse.Namespace, queue: Queue) -> None:
    try:
        if args.batch_command == "list":
            found = await queue.recent_batches(args.limit, before=args.before)
            _out(args, [_batch_json(b) for b in found], _batches_text(found))
        elif args.batch_command == "show":
            status = await queue.batch_status(args.batch_id)
            if status is None:
                raise UsageError(f"no batch {args.batch_id}")
            _out(args, _batch_json(status), _batches_text([status]))
        elif args.batch_command == "cancel":
            skipped = await queue.cancel_batch(args.batch_id)
            said = f"cancelled: skipped {_count(skipped, 'job')} not started"
            if not skipped:
                status = await queue.batch_status(args.batch_id)
                if status is not None and status.finished:
                    said = f"batch {args.batch_id} had finished ({status.state}): nothing to cancel"
            _out(args, {"skipped": skipped}, said)
        else:
            n = await queue.prune_batches(timedelta(hours=args.hours))
            _out(args, {"deleted": n}, f"deleted {_count(n, 'finished batch', 'finished batches')}")
    except (LookupError, ValueError) as exc:
        raise UsageError(f"batches {args.batch_command}: {exc}") from None


def _batch_json(b: BatchStatus) -> dict[str, Any]:
    def at(t: datetime | None) -> str | None:
        return None if t is None else t.isoformat()

    return {
        "id": str(b.id),
        "name": b.name,
        "created_at": b.created_at.isoformat(),
        "allow_failures": b.allow_failures,
        "total": b.total,
        "pending": b.pending,
        "done": b.done,
        "failed": b.failed,
        "cancelled": b.cancelled,
        "percent": b.percent,
        "state": b.state,
        "failed_at": at(b.failed_at),
        "cancelled_at": at(b.cancelled_at),
        "finished_at": at(b.finished_at),
    }


def _batches_text(found: list[BatchStatus]) -> str:
    if not found:
        return "no batches"
    rows = [("ID", "NAME", "CREATED", "DONE", "FAILED", "CANCELLED", "PENDING", "%", "STATE")]
    for b in found:
        rows.append(
            (
                str(b.id),
                b.name[:40],
                b.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                f"{b.done:,}",
                f"{b.failed:,}",
                f"{b.cancelled:,}",
                f"{b.pending:,}",
                str(b.percent),
                b.state,
            )
        )
    return _table(rows)


async def _queue(args: argparse.Namespace, queue: Queue) -> None:
    if args.queue_command == "pause":
        until = args.until
        if args.for_ is not None:
            try:
                until = datetime.now(UTC) + args.for_
            except OverflowError:
                raise UsageError(f"queue pause: --for {args.for_} is too long") from None
        state = await queue.pause(args.name, reason=args.reason, until=until)
        _out(args, _queue_json(state), f"paused {state.name}" + _pause_text(state))
    elif args.queue_command == "resume":
        was = await queue.resume(args.name)
        _out(
            args,
            {"name": args.name, "was_paused": was},
            f"resumed {args.name}" if was else f"{args.name} was not paused",
        )
    else:
        states = await queue.queues()
        _out(args, [_queue_json(s) for s in states], _queues_text(states))


def _queue_json(s: QueueState) -> dict[str, Any]:
    return {
        "name": s.name,
        "paused": s.paused,
        "reason": s.reason,
        "since": s.since.isoformat() if s.since else None,
        "until": s.until.isoformat() if s.until else None,
    }


def _pause_text(s: QueueState) -> str:
    until = f" until {s.until.isoformat(timespec='seconds')}" if s.until else ""
    reason = f": {s.reason}" if s.reason else ""
    return until + reason


def _queues_text(states: list[QueueState]) -> str:
    if not states:
        return "no queues (none has pending jobs or a pause)"
    rows = [("QUEUE", "STATE", "SINCE", "UNTIL", "REASON")]
    for s in states:
        rows.append(
            (
                s.name,
                "paused" if s.paused else "active",
                s.since.strftime("%Y-%m-%d %H:%M:%S") if s.since else "-",
                s.until.strftime("%Y-%m-%d %H:%M:%S") if s.until else "-",
                (s.reason or "")[:60],
            )
        )
    return _table(rows)


class _StoppedWaiting(Exception):
    """SIGTERM or SIGINT while `venturi worker` waited for its database: it held nothing, so
    it exits at once, and cleanly (status 0, as after a shutdown once running)."""


class _Waiting:
    """Runs a start-up step of `venturi worker` until the database answers: a database that
    is unreachable (down, restarting, out of connections, a name not resolving yet) is
    waited for, logged once when the wait begins and once when it ends; an error waiting
    cannot mend (credentials, a missing database or schema, a bug) raises at once. SIGTERM
    and SIGINT set `stop` from the start (the worker's shutdown once it runs); a second one
    calls `hurry` (the worker's `stop_now`: its running jobs aborted at once)."""

    def __init__(self) -> None:
        self._since: float | None = None
        self.stop = asyncio.Event()
        self.hurry: Callable[[], None] | None = None
        self.fields: dict[str, str] = {}
        """Fields of the records it logs (the worker's, once it runs)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._signalled, sig)

    def _signalled(self, sig: signal.Signals) -> None:
        with logs.bound(self.fields):
            if not self.stop.is_set():
                self.stop.set()
                if self.hurry is not None:
                    logger.info(
                        "worker: %s: stopping; running jobs get the shutdown timeout to end "
                        "(a second signal aborts them now)",
                        sig.name,
                    )
                return
            if self.hurry is not None:
                logger.warning("worker: %s again: aborting the running jobs now", sig.name)
                self.hurry()

    async def run(self, step: str, attempt: Callable[[], Awaitable[_T]]) -> _T:
        delay = 0.0
        while True:
            try:
                result = await attempt()
            except Exception as exc:
                if not is_database_failure(exc) or waiting_cannot_mend(exc):
                    raise
                if self._since is None:
                    self._since = time.monotonic()
                    logger.warning(
                        "worker: the database is unavailable (%s: %s); waiting for it",
                        step,
                        describe(exc),
                    )
                delay = next_delay(delay)
                with contextlib.suppress(TimeoutError):
                    await wait_for(self.stop.wait(), delay)
                if self.stop.is_set():
                    raise _StoppedWaiting from None
                continue
            if self._since is not None:
                logger.warning(
                    "worker: the database is back after %.1fs", time.monotonic() - self._since
                )
                self._since = None
            return result


async def _worker(args: argparse.Namespace, store: PostgresStore, waiting: _Waiting) -> None:
    module_name, _, attr = args.factory.partition(":")
    if not module_name or not attr:
        raise UsageError(f"worker: expected MODULE:FUNCTION, got {args.factory!r}")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, SyntaxError, or whatever the module raised
        raise UsageError(f"worker: cannot import module {module_name!r}: {_describe(exc)}") from exc
    factory = getattr(module, attr, None)
    if factory is None:
        raise UsageError(f"worker: module {module_name!r} has no attribute {attr!r}")
    if not callable(factory):
        raise UsageError(
            f"worker: {args.factory} is not callable ({type(factory).__name__}); expected a "
            f"function that returns a venturi.Worker"
        )
    try:
        takes_store = bool(inspect.signature(factory).parameters)
    except (TypeError, ValueError):  # no signature to inspect (some builtins): pass the store
        takes_store = True
    try:
        built = factory(store) if takes_store else factory()
        if inspect.isawaitable(built):
            built = await built
    except Exception as exc:
        raise UsageError(f"worker: {args.factory}(store) failed: {_describe(exc)}") from exc
    if not isinstance(built, Worker):
        raise UsageError(
            f"worker: {args.factory} returned {shown(built, 200)}, not a venturi.Worker"
        )
    if args.queue is not None:
        try:
            built.queues = tuple(
                check_queue_name(q.strip(), setting="--queue") for q in args.queue.split(",")
            )
        except (TypeError, ValueError) as exc:
            raise UsageError(f"worker: {exc}") from None
        if len(set(built.queues)) != len(built.queues):
            raise UsageError(f"worker: --queue names a queue twice: {args.queue!r}")
    if args.unknown_kinds is not None:
        built.unknown_kinds = args.unknown_kinds

    async def check() -> None:
        await store.check_privileges()
        await store.check_schema()

    await waiting.run("starting", check)  # before saying "serving" (run() checks again)
    # This process ends with run() (below), and a handler given up on with it: its job can
    # be released at once instead of left to its lease.
    built._exits_with_run = True
    waiting.hurry = built.stop_now
    waiting.fields = {"worker": str(built.identity)}
    shutdown = waiting.stop  # SIGTERM and SIGINT, since the process started
    # Every task the worker starts inherits the field: each of its records names it.
    with logs.bound(waiting.fields):
        logger.info("worker %s serving %s from %s", built.identity, built.kinds, list(built.queues))
        await built.run(
            shutdown,
            once=args.once,
            stop_when_empty=args.stop_when_empty,
            max_jobs=args.max_jobs,
            max_time=args.max_time,
        )
        if built.abandoned:
            # Their jobs were released; waiting for handlers that ignore cancellation would
            # keep the process alive forever (asyncio.run awaits every task it cancels), and
            # they must end before another worker runs their jobs.
            logger.warning("exiting without %d handlers that ignored cancellation", built.abandoned)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)


def _describe(exc: BaseException) -> str:
    """One line for an exception: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


async def _cleanup(args: argparse.Namespace, store: PostgresStore) -> None:
    try:
        cutoff = await store.database_now() - args.older_than
    except OverflowError:
        raise UsageError(
            f"cleanup: --older-than {args.older_than.days:,} days reaches back before the "
            f"year 1; nothing is that old"
        ) from None
    if args.kind is not None:
        try:
            check_kind(args.kind, setting="cleanup: --kind")
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    criteria = CleanupCriteria(
        finished_before=cutoff,
        kind=args.kind,
        status=JobStatus(args.status) if args.status else None,
    )
    show = not args.json and sys.stderr.isatty()

    def progress(total: int) -> None:
        if show:
            print(f"\r  deleted {total:,} jobs ...", end="", file=sys.stderr, flush=True)

    removed = await store.cleanup(criteria, on_batch=progress)
    if show:
        print(file=sys.stderr)
    _out(args, {"deleted": removed}, f"deleted {_count(removed, 'finished job')}")


def _out(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=2, default=str) if args.json else text)


def _counts_json(s: Stats | QueueStats) -> dict[str, Any]:
    """Every figure of `Stats` (or one queue's), by kind and summed, as `stats()` has them."""
    return {
        "pending_by_kind": dict(s.pending_by_kind),
        "scheduled_by_kind": dict(s.scheduled_by_kind),
        "claimed_by_kind": dict(s.claimed_by_kind),
        "dead_by_kind": dict(s.dead_by_kind),
        "completed_by_kind": dict(s.completed_by_kind),
        "oldest_pending_age_by_kind": dict(s.oldest_pending_age_by_kind),
        "done_last_hour_by_kind": dict(s.done_last_hour_by_kind),
        "failed_last_hour_by_kind": dict(s.failed_last_hour_by_kind),
        "pending": s.pending,
        "scheduled": s.scheduled,
        "claimed": s.claimed,
        "dead": s.dead,
        "completed": s.completed,
        "oldest_pending_age": s.oldest_pending_age,
        "done_last_hour": s.done_last_hour,
        "failed_last_hour": s.failed_last_hour,
    }


def _stats_json(s: Stats) -> dict[str, Any]:
    return {
        **_counts_json(s),
        "paused_queues": sorted(s.paused_queues),
        "paused_by_kind": dict(s.paused_by_kind),
        "queues": {
            name: {**_counts_json(q), "paused": q.paused} for name, q in sorted(s.queues.items())
        },
    }


def _stats_text(s: Stats) -> str:
    kinds = sorted(
        set(s.pending_by_kind)
        | set(s.scheduled_by_kind)
        | set(s.claimed_by_kind)
        | set(s.dead_by_kind)
    )
    paused = f"\npaused queues: {', '.join(sorted(s.paused_queues))}" if s.paused_queues else ""
    if not kinds:
        return "the queue is empty" + paused
    rows = [("KIND", "PENDING", "SCHEDULED", "CLAIMED", "DEAD", "OLDEST")]
    for k in kinds:
        age = s.oldest_pending_age_by_kind.get(k)
        rows.append(
            (
                k,
                str(s.pending_by_kind.get(k, 0)),
                str(s.scheduled_by_kind.get(k, 0)),
                str(s.claimed_by_kind.get(k, 0)),
                str(s.dead_by_kind.get(k, 0)),
                _age(age),
            )
        )
    return _table(rows) + paused


def _worker_json(w: WorkerInfo) -> dict[str, Any]:
    return {
        "id": w.id,
        "host": w.host,
        "pid": w.pid,
        "pod": w.pod,
        "queues": list(w.queues),
        "kinds": list(w.kinds),
        "unknown_kinds": w.unknown_kinds,
        "concurrency": w.concurrency,
        "heartbeat": w.heartbeat,
        "started_at": w.started_at.isoformat(),
        "last_seen": w.last_seen.isoformat(),
        "live": w.live,
        "leader": w.leader,
    }


def _workers_text(
    workers: list[WorkerInfo], unserved: dict[str, list[str]], fenced: list[str]
) -> str:
    lines = []
    if not workers:
        lines.append("no workers registered")
    else:
        now = datetime.now(UTC)
        rows = [("WORKER", "QUEUES", "KINDS", "UNKNOWN", "CONC", "STARTED", "LAST SEEN", "STATE")]
        for w in workers:
            rows.append(
                (
                    w.id,
                    ",".join(w.queues),
                    ",".join(w.kinds),
                    w.unknown_kinds,
                    str(w.concurrency),
                    w.started_at.strftime("%Y-%m-%d %H:%M:%S"),
                    _age(max(0.0, (now - w.last_seen).total_seconds())) + " ago",
                    "leader" if w.leader else "live" if w.live else "silent",
                )
            )
        lines.append(_table(rows))
    for queue, kinds in sorted(unserved.items()):
        lines.append(f"queue {queue}: pending kinds no live worker serves: {', '.join(kinds)}")
    if fenced:
        lines.append(f"pods fenced for a scale-in (claiming nothing): {', '.join(fenced)}")
    return "\n".join(lines)


def _schedule_json(s: ScheduleInfo) -> dict[str, Any]:
    return {
        "name": s.name,
        "spec": s.spec,
        "kind": s.kind or None,  # a function task's, until its first tick
        # Before its first tick, last_tick holds the schedule's start: not a tick.
        "last_tick": s.last_tick.isoformat() if s.enqueued or s.skipped else None,
        "next_tick": s.next_tick.isoformat(),
        "last_job": None if s.last_job is None else str(s.last_job),
        "enqueued": s.enqueued,
        "skipped": s.skipped,
        "seen_at": s.seen_at.isoformat(),
        "seen_by": s.seen_by,
    }


def _schedules_text(found: list[ScheduleInfo]) -> str:
    if not found:
        return "no schedules (a worker records its schedules when it starts)"
    rows = [
        ("NAME", "SPEC", "KIND", "NEXT RUN (UTC)", "LAST TICK", "ENQUEUED", "SKIPPED", "SEEN BY")
    ]
    for s in found:
        ticked = s.enqueued or s.skipped  # before its first tick, last_tick is its start
        rows.append(
            (
                s.name,
                s.spec,
                s.kind or "-",
                f"{s.next_tick:%Y-%m-%d %H:%M:%S}",
                f"{s.last_tick:%Y-%m-%d %H:%M:%S}" if ticked else "-",
                str(s.enqueued),
                str(s.skipped),
                s.seen_by or "-",
            )
        )
    return _table(rows)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _job_json(j: Job) -> dict[str, Any]:
    return {
        "id": str(j.id),
        "kind": j.kind,
        "queue": j.queue,
        "status": j.status.value,
        "priority": j.priority,
        "run_at": j.run_at.isoformat(),
        "created_at": j.created_at.isoformat(),
        "finished_at": j.finished_at.isoformat() if j.finished_at else None,
        "run_count": j.run_count,
        "failures": j.failures,
        "claimed_by": j.claimed_by,
        "claimed_pod": j.claimed_pod,
        "last_error": j.last_error,
        "payload": j.payload,
        "carry": j.carry,
    }


def _jobs_text(jobs: list[Job]) -> str:
    if not jobs:
        return "no jobs"
    rows = [("ID", "QUEUE", "KIND", "STATUS", "RUNS", "FAILS", "CREATED", "LAST ERROR")]
    for j in jobs:
        rows.append(
            (
                str(j.id),
                j.queue,
                j.kind,
                j.status.value,
                str(j.run_count),
                str(j.failures),
                j.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                (j.last_error or "")[:60],
            )
        )
    return _table(rows)


def _entry_json(e: JournalEntry) -> dict[str, Any]:
    return {
        "run": e.run,
        "outcome": e.outcome.value,
        "at": e.at.isoformat(),
        "note": e.note,
        "attachment": e.attachment,
        "duration": e.duration,
        "worker": e.worker,
        "is_failure": e.is_failure,
    }


def _journal_text(job: Job, entries: list[JournalEntry]) -> str:
    head = (
        f"job {job.id} ({job.kind}): {job.status.value}, "
        f"{_count(job.run_count, 'run')}, {_count(job.failures, 'failure')}"
    )
    if not entries:
        return head + "\n  (no journal entries yet)"
    rows = [("RUN", "OUTCOME", "AT", "DURATION", "WORKER", "NOTE")]
    for e in entries:
        rows.append(
            (
                str(e.run),
                e.outcome.value,
                e.at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3],
                f"{e.duration * 1000:.1f}ms" if e.duration is not None else "-",
                e.worker or "-",
                (e.note or "")[:60],
            )
        )
    return head + "\n" + _table(rows)


def _table(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(_negative_values_attached(sys.argv[1:] if argv is None else argv))
    # Parsers and servers quote what they failed on: never a piece of the password.
    secrets = secret_pieces(args.dsn, os.environ.get("PGPASSWORD"))
    level = args.log_level or ("info" if args.command == "worker" else "warning")
    logs.configure(args.log_format, level, redact=secrets)
    redact = logs.Redactor(secrets)
    try:
        return _loops.run(_run(args), getattr(args, "loop", _loops.LOOPS[0]))
    except (
        UsageError,
        SchemaError,
        ValueError,
        FileExistsError,
        MetricsPortError,
        _loops.LoopUnavailable,
    ) as exc:
        return _fail(args, exc, str(exc), redact)
    except _StoppedWaiting:
        logger.info("worker: stopped while waiting for the database")
        return 0
    except BrokenPipeError:
        # The reader of our output left (`venturi jobs | head`): not a database error. Python
        # would complain again when it flushes stdout at exit; point it at nothing instead.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a shell reports a command ended by SIGPIPE
    except (
        OSError,
        OverflowError,  # a port above 65535
        asyncpg.PostgresError,
        asyncpg.InterfaceError,
        EmbeddedPostgresError,
    ) as exc:
        why = REFUSALS.get(getattr(exc, "sqlstate", None) or "")
        said = f"database error: {exc}" + (f" ({why})" if why else "")
        return _fail(args, exc, said, redact)
    except KeyboardInterrupt:
        return 130


def _fail(args: argparse.Namespace, exc: BaseException, message: str, redact: logs.Redactor) -> int:
    """One line on stderr (a JSON record with --log-format json), exit status 2."""
    if args.log_format == "json":
        logger.error("%s", message, exc_info=exc if args.debug else None)
        return 2
    if args.debug:
        print(redact("".join(traceback.format_exception(exc))), end="", file=sys.stderr)
    print(redact(f"venturi: {message}"), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
