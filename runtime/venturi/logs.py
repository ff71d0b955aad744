"""Log output for the command lines (`venturi worker`, `venturi-operator`): plain text, or
one JSON object per line for a log pipeline (`--log-format json`, `VENTURI_LOG_FORMAT=json`).

    {"time": "2026-05-01T12:00:00.123456Z", "level": "warning", "logger": "venturi._executor",
     "message": "job 0190... (mail) raised", "worker": "host:7#1a2b", "job_id": "01J9...",
     "kind": "mail", "queue": "default", "run": 2, "exc_info": "Traceback ..."}

A JSON line has `time` (RFC 3339, UTC), `level`, `logger` and `message`; the fields bound for
the code that logged (`bound()`: the worker around its run, each job around its handler, so a
handler's own records carry its job too); the known job fields a record's `extra` sets; and
`exc_info` / `stack_info` as text. Nothing else of a record is written: a library's `extra`
(kopf puts its settings object there) never spills into the output.

Both formatters take `redact`, strings never to be written (the command line passes every
piece of the DSN's password): each becomes `***` wherever it stands as a word of its own.

An application that runs a Worker itself can use them the same way:

    handler = logging.StreamHandler()
    handler.addFilter(PoolRetriesInOneLine(quote=quote_errors))
    handler.setFormatter(venturi.logs.JsonFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[handler])
"""

from __future__ import annotations

import contextlib
import errno
import logging
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextvars import ContextVar, Token
from datetime import UTC, datetime

import msgspec
from ulid import ULID

FORMATS = ("text", "json")
LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
REDACTED = "***"

RECORD_FIELDS = ("job_id", "kind", "queue", "run", "worker")
"""The attributes a record's `extra` may set that the JSON line carries."""

_bound: ContextVar[tuple[Mapping[str, object], ...]] = ContextVar("venturi_log_fields", default=())
"""The field sets bound around the running code, outermost first (merged only when a record
is formatted: most runs log nothing)."""
_encoder = msgspec.json.Encoder(enc_hook=str)  # a ULID, a path, anything else: its str()


@contextlib.contextmanager
def bound(fields: Mapping[str, object]) -> Iterator[None]:
    """Add `fields` to every JSON record logged inside the block, in this task and the tasks
    it starts (a context variable)."""
    token = bind(fields)
    try:
        yield
    finally:
        unbind(token)


def bind(fields: Mapping[str, object]) -> Token[tuple[Mapping[str, object], ...]]:
    """`bound` without the block, for the worker's hot path: add `fields` until
    `unbind(token)`."""
    return _bound.set((*_bound.get(), fields))


def unbind(token: Token[tuple[Mapping[str, object], ...]]) -> None:
    _bound.reset(token)


def bound_fields() -> dict[str, object]:
    """The fields bound where this is called, the innermost binding of a name winning."""
    merged: dict[str, object] = {}
    for fields in _bound.get():
        merged.update(fields)
    return merged


class JobFields(Mapping[str, object]):
    """A job's fields, for a record's `extra` (or `bound`): job_id, kind, queue and run. The
    id reads as a ULID, the form `venturi journal` and the API take, also where the store's
    record holds a UUID; it is rendered only when read, as every run binds these and most
    log nothing."""

    __slots__ = ("_id", "_kind", "_queue", "_run")
    _KEYS = ("job_id", "kind", "queue", "run")

    def __init__(self, job_id: uuid.UUID | ULID, kind: str, queue: str, run: int) -> None:
        self._id: uuid.UUID | ULID | str = job_id
        self._kind = kind
        self._queue = queue
        self._run = run

    def __getitem__(self, key: str) -> object:
        if key == "job_id":
            if not isinstance(self._id, str):
                self._id = id_text(self._id)
            return self._id
        if key == "kind":
            return self._kind
        if key == "queue":
            return self._queue
        if key == "run":
            return self._run
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._KEYS)

    def __len__(self) -> int:
        return len(self._KEYS)

    def __repr__(self) -> str:
        return f"JobFields({dict(self)!r})"


def job_fields(job_id: uuid.UUID | ULID, kind: str, queue: str, run: int) -> JobFields:
    """A job's fields, for a record's `extra` (or `bound`): see `JobFields`."""
    return JobFields(job_id, kind, queue, run)


def id_text(job_id: uuid.UUID | ULID) -> str:
    """A job id as logs show it: the ULID `enqueue` returns and `venturi journal` takes, also
    where the store's record holds a UUID, so one job reads the same everywhere."""
    return str(ULID.from_bytes(job_id.bytes) if isinstance(job_id, uuid.UUID) else job_id)


class ShownId:
    """A job id for a log message's `%s` (see `id_text`), rendered only if the record is
    formatted."""

    __slots__ = ("_id",)

    def __init__(self, job_id: uuid.UUID | ULID) -> None:
        self._id = job_id

    def __str__(self) -> str:
        return id_text(self._id)


class Redactor:
    """Replaces each secret with `***` where it stands as a word of its own (not inside a
    longer run of letters and digits), ignoring case."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        words = sorted({s for s in secrets if s}, key=len, reverse=True)
        self._pattern = (
            re.compile(
                r"(?<![A-Za-z0-9])(?:" + "|".join(map(re.escape, words)) + r")(?![A-Za-z0-9])",
                re.IGNORECASE,
            )
            if words
            else None
        )

    def __call__(self, text: str) -> str:
        return self._pattern.sub(REDACTED, text) if self._pattern is not None else text


class TextFormatter(logging.Formatter):
    """`TEXT_FORMAT` lines, redacted."""

    def __init__(self, fmt: str = TEXT_FORMAT, *, redact: Iterable[str] = ()) -> None:
        super().__init__(fmt)
        self._redact = Redactor(redact)

    def format(self, record: logging.LogRecord) -> str:
        return self._redact(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (see the module's docstring)."""

    def __init__(self, *, redact: Iterable[str] = ()) -> None:
        super().__init__()
        self._redact = Redactor(redact)

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": _rfc3339(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": self._redact(_message(record)),
        }
        for key, value in bound_fields().items():
            line.setdefault(key, value)
        attrs = record.__dict__
        for key in RECORD_FIELDS:
            if attrs.get(key) is not None:
                line[key] = attrs[key]
        line.update(self.fields(record))
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exc_info"] = self._redact(record.exc_text)
        if record.stack_info:
            line["stack_info"] = self._redact(self.formatStack(record.stack_info))
        return _encoder.encode(line).decode()

    def fields(self, record: logging.LogRecord) -> Mapping[str, object]:
        """More fields for `record`: none here (the operator adds the JobQueue's)."""
        return {}


class PoolRetriesInOneLine(logging.Filter):
    """asyncpg's pool logs a traceback each time it fails to reconnect its floor connections
    (every 1, 2, 4 ... 60 s while the database is away): during an outage, most of a
    worker's log, on top of the worker's own line that says the database is unavailable and
    when it is back. This keeps each such record, with its exception in one line: its class
    and message, or with `quote=False` its class and errno or SQLSTATE only (the operator's:
    a server at an address a Secret names may say anything)."""

    def __init__(self, *, quote: bool = True) -> None:
        super().__init__()
        self._quote = quote

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "asyncpg.pool" and record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            said = error_text(exc) if self._quote else error_class(exc)
            record.msg = f"{_message(record)} ({said})"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


def configure(
    format: str = "text",
    level: str = "info",
    *,
    redact: Iterable[str] = (),
    json_formatter: type[JsonFormatter] = JsonFormatter,
    quote_errors: bool = True,
) -> logging.Handler:
    """Log to stderr in `format` ("text" or "json") from `level` up, replacing the root
    logger's handlers (a command line's own set-up, done once at start); asyncpg's pool
    reconnect retries in one line each (`PoolRetriesInOneLine`, quoting the error's message
    unless `quote_errors` is False)."""
    if format not in FORMATS:
        raise ValueError(f"log format: expected one of {', '.join(FORMATS)}, got {format!r}")
    if level not in LEVELS:
        raise ValueError(f"log level: expected one of {', '.join(LEVELS)}, got {level!r}")
    handler = logging.StreamHandler()
    handler.addFilter(PoolRetriesInOneLine(quote=quote_errors))
    handler.setFormatter(
        json_formatter(redact=redact) if format == "json" else TextFormatter(redact=redact)
    )
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(LEVELS[level])
    return handler


def error_text(exc: BaseException) -> str:
    """An exception in one line: its class and message."""
    return f"{type(exc).__name__}: {exc}"


def error_class(exc: BaseException) -> str:
    """An exception as its class and code (errno or SQLSTATE), never its message, which may
    quote a DSN, its password, or what some server said."""
    cause = type(exc).__name__
    code = getattr(exc, "errno", None)
    if isinstance(code, int) and code in errno.errorcode:
        cause += f" {errno.errorcode[code]}"
    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(sqlstate, str) and _SQLSTATE.fullmatch(sqlstate):
        cause += f" SQLSTATE {sqlstate}"
    return cause


_SQLSTATE = re.compile(r"[0-9A-Z]{5}")


def _rfc3339(created: float) -> str:
    return datetime.fromtimestamp(created, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _message(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except Exception as exc:  # a bad %-format in someone's log call: keep the line JSON
        return f"{record.msg!r} (its arguments did not format: {type(exc).__name__})"
