"""What the operator may say about a DSN: host, port and database when unambiguous, else nothing."""

from __future__ import annotations

import pytest

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
