"""What a failed database call means: the database (or the way to it) failed, the
statement's data was refused, or venturi has a bug.

Every background loop of a worker retries the first kind forever, so no outage ends a
worker; the completer isolates the second kind (one bad row must not fail its batch); only
the third ends `Worker.run()`, with its traceback. asyncpg reports an outage through many
types (`PostgresError` subclasses, `InterfaceError`, `InternalClientError`, `OSError`,
timeouts, and the odd `AttributeError` from deep inside a connection that died mid-read),
so the test is by type *and* by origin: anything raised from inside asyncpg counts.
"""

from __future__ import annotations

import os
import ssl
import types

import asyncpg

_DATABASE_TYPES: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    EOFError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
)
_ASYNCPG_DIR = os.path.dirname(asyncpg.__file__) + os.sep

_CONNECTION_CLASSES = ("08", "57")
"""SQLSTATE classes after which a connection is not reused: connection exceptions, and
operator intervention (shutdown, termination, cancellation)."""
_DATA_CLASSES = ("22", "23", "54")
"""Data exception, integrity constraint violation, program limit exceeded: the rows are
at fault. Anything else (an outage, a lock, a missing table, a permission) is not the data's
fault, and the same rows can be written once it is mended."""


def _raised_in_asyncpg(exc: BaseException) -> bool:
    tb: types.TracebackType | None = exc.__traceback__
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    return last is not None and last.tb_frame.f_code.co_filename.startswith(_ASYNCPG_DIR)


def is_database_failure(exc: BaseException) -> bool:
    """True if `exc` came from the database or the connection to it (retry later);
    False for a bug in venturi (which must surface, with its traceback)."""
    if isinstance(exc, _DATABASE_TYPES):
        return True
    return isinstance(exc, Exception) and _raised_in_asyncpg(exc)


def _sqlstate(exc: BaseException) -> str:
    state = getattr(exc, "sqlstate", None)
    return state if isinstance(state, str) else ""


def breaks_connection(exc: BaseException) -> bool:
    """True if the connection that raised `exc` must not be used again.

    Only an error the server reported for the statement itself (a constraint, bad data)
    leaves the connection in a known state; anything else (a lost socket, a protocol
    mix-up, a timeout or cancellation mid-statement, a shutdown) may leave it half-way
    through a reply, and the next user of the connection would read that reply.
    """
    if not isinstance(exc, asyncpg.PostgresError):
        return True
    return _sqlstate(exc).startswith(_CONNECTION_CLASSES)


def is_refused_data(exc: BaseException) -> bool:
    """True if the server refused the statement for what it carried (bad data, a limit, a
    constraint): trying the same rows again fails again, so they must be isolated."""
    return isinstance(exc, asyncpg.PostgresError) and _sqlstate(exc).startswith(_DATA_CLASSES)


_ENCODING_STATES = ("22P05", "22021")
"""Untranslatable character, character not in repertoire: text the database's encoding
(LATIN1, say) cannot hold."""


def is_encoding_refusal(exc: BaseException) -> bool:
    """True if the server refused text that its encoding has no character for."""
    return isinstance(exc, asyncpg.PostgresError) and _sqlstate(exc) in _ENCODING_STATES


_CONFIGURATION_CLASSES = ("28", "3D", "42")
"""Invalid authorization, invalid catalog (no such database), access and syntax: a
deployment's mistake that no retry mends."""


def is_configuration_error(exc: BaseException) -> bool:
    """True for a refusal that says the settings are wrong (a bad password, a database that
    does not exist, no permission): at start-up it should fail, not be waited out."""
    return isinstance(exc, asyncpg.PostgresError) and _sqlstate(exc).startswith(
        _CONFIGURATION_CLASSES
    )


def waiting_cannot_mend(exc: BaseException) -> bool:
    """True for a failure to start that no wait mends: a configuration error, a server
    certificate that does not verify, a connection setting asyncpg refuses (a ValueError)."""
    return is_configuration_error(exc) or isinstance(
        exc, (ssl.SSLCertVerificationError, ValueError)
    )


def describe(exc: BaseException) -> str:
    """One line naming the failure: type and message, without a traceback."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    said = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    if isinstance(exc, asyncpg.InternalClientError) and text.startswith("cannot switch to state"):
        # asyncpg's protocol state when a connection dies between two messages: it reads
        # like a bug of ours; say what it is.
        said += " (the connection was lost mid-exchange)"
    return said


RETRY_FIRST = 0.05
"""Seconds before the first retry of a failed statement."""
RETRY_MAX = 1.0
"""Seconds; cap on the wait between retries, so work resumes within about a second of
the server accepting connections again."""


def next_delay(delay: float) -> float:
    """The capped exponential backoff between retries."""
    return min(max(delay, RETRY_FIRST) * 2, RETRY_MAX)
