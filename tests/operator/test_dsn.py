"""What the operator may say about a DSN: host, port and database when unambiguous, else nothing."""

from __future__ import annotations

import asyncpg
import pytest

from venturi import logs
from venturi_operator.databases import _connect_error, _connection_lost
from venturi_operator.dsn import describe, the_database


@pytest.mark.parametrize(
    ("dsn", "where"),
    [
        ("postgresql://u:pw@db.example:5432/venturi", "db.example:5432/venturi"),
        ("postgres://u:p%40ss%2Fw%23rd@db/venturi?sslmode=require", "db/venturi"),
        ("postgresql://db.example/venturi?password=hush&port=6432", "db.example:6432/venturi"),
        ("postgresql://h1:5432,h2:5433/venturi", "h1:5432,h2:5433/venturi"),
        ("postgresql://[::1]:5432/venturi", "[::1]:5432/venturi"),
        ("postgresql:///venturi?host=/var/run/postgresql", "/var/run/postgresql/venturi"),
        ("postgresql://db", "db/(default database)"),
        ("host=db port=5432 dbname=venturi user=u password='a b\\'c'", "db:5432/venturi"),
        ("host=h1,h2 port=5432 dbname=q", "h1:5432,h2:5432/q"),
        ("dbname=q", "the default host/q"),
    ],
)
def test_an_unambiguous_dsn_is_described_by_host_port_and_database(dsn: str, where: str) -> None:
    assert describe(dsn) == where
    assert the_database(dsn) == f"the database at {where}"


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://u:hush#more@db/venturi",  # fragment: the port would be "hush"
        "postgresql://u:hush/more@db/venturi",  # path: the database would be "more@db/venturi"
        "postgresql://u:hush?more@db/venturi",  # query
        "postgresql://u:hu@sh@db/venturi",  # the host would be "sh@db"
        "postgresql://u:1234/hush@db/venturi",  # a valid port, and the database "hush@db..."
        "postgresql://u:12?a=hush@db/venturi",  # a valid port and a query field with the rest
        "postgresql://u:100%hush@db/venturi",  # not an escape
        "postgresql://u:pw@db/venturi?password=a&hush",  # a bad query field
        "postgresql://u:pw@db/venturi#hush",
        "postgresql://u:pw@db/ven'turi",
        "u:hush@db/venturi",  # no scheme
        "mysql://u:hush@db/venturi",
        "host=db password=hush more",  # an unquoted space
        "host=db password='hush",
        "host=db$hush dbname=q",  # not a host name
        "",
    ],
)
def test_an_ambiguous_dsn_is_never_repeated(dsn: str) -> None:
    assert describe(dsn) is None
    words = the_database(dsn)
    assert "hush" not in words and "percent-encode" in words


@pytest.mark.parametrize(
    ("error", "lost"),
    [
        (ConnectionRefusedError(111, "Connect call failed ('10.0.0.9', 5432)"), True),
        (TimeoutError(), True),
        (asyncpg.CannotConnectNowError("the database system is shutting down"), True),
        (asyncpg.ConnectionDoesNotExistError("connection was closed in the middle"), True),
        (asyncpg.AdminShutdownError("terminating connection due to administrator command"), True),
        (asyncpg.InterfaceError("connection is closed"), True),
        (asyncpg.UndefinedTableError('relation "q_jobs" does not exist'), False),
        (asyncpg.InsufficientPrivilegeError("permission denied"), False),
    ],
)
def test_a_connection_that_fails_after_it_was_made_is_one_generic_failure(
    error: Exception, lost: bool
) -> None:
    """As when connecting: the status says ConnectionFailed, never the class or the text of
    what a server at that address answered (a status must not probe the network)."""
    assert _connection_lost(error) is lost
    if lost:
        said = _connect_error("postgresql://app:s3cret@db.internal:5432/app", error)
        assert said.reason == "ConnectionFailed"
        assert type(error).__name__ not in str(said) and "s3cret" not in str(said)


def test_the_log_names_an_error_by_its_class_and_code_only() -> None:
    refused = ConnectionRefusedError(111, "Connect call failed ('10.0.0.9', 5432)")
    assert logs.error_class(refused) == "ConnectionRefusedError ECONNREFUSED"
    assert logs.error_class(asyncpg.CannotConnectNowError("x")) == (
        "CannotConnectNowError SQLSTATE 57P03"
    )
