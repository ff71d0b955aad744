"""libpq keyword/value connection strings: parsed by libpq's rules, and accepted by a real
server that checks the password (scram-sha-256), including one with spaces and quotes."""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from venturi import PostgresStore, Queue
from venturi._dsn import ConnectArgs, connect_args, parse_keywords
from venturi.embedded import EmbeddedPostgres

from .helpers import all_migrations

PASSWORD = "s3cret pass 'quoted' \\back\\ \"dq\" #/?&=%+"


def test_keywords_follow_libpq_quoting() -> None:
    text = (
        "host = db.internal port=5433\tdbname='my db' user=app "
        "password='it\\'s a \\\\ test' application_name=un\\ quoted sslmode=require"
    )
    assert parse_keywords(text) == {
        "host": "db.internal",
        "port": "5433",
        "dbname": "my db",
        "user": "app",
        "password": "it's a \\ test",
        "application_name": "un quoted",
        "sslmode": "require",
    }
    assert parse_keywords("dbname=a dbname=b password=''") == {"dbname": "b", "password": ""}
    assert parse_keywords("  ") == {}


def test_keywords_become_what_asyncpg_takes() -> None:
    args = connect_args(
        "host=/run/postgresql dbname=app password='a b&c' connect_timeout=1 "
        "application_name=billing options='-c search_path=app,public --lock-timeout=5s' "
        "client_encoding=UTF8 user=''"
    )
    assert args.dsn == "postgresql://?host=%2Frun%2Fpostgresql&dbname=app&password=a+b%26c"
    assert args.timeout == 2.0  # libpq: the least timeout is 2 s
    assert args.server_settings == {
        "application_name": "billing",
        "search_path": "app,public",
        "lock_timeout": "5s",
    }
    assert connect_args("connect_timeout=0").timeout == math.inf  # libpq: wait indefinitely
    assert connect_args(None).dsn is None


def test_a_uris_libpq_parameters_are_read_as_the_keywords_are() -> None:
    """asyncpg would send a URI's `connect_timeout` to the server as a setting (refused:
    "unrecognized configuration parameter"); it is read as in the keyword form, and so are
    the other keywords asyncpg takes apart from its DSN."""
    uri = "postgresql://u:p%40ss@h1:5432,h2/db?sslmode=require&application_name=x"
    args = connect_args(uri + "&connect_timeout=7&options=-c%20lock_timeout%3D5s")
    assert args.dsn == uri.replace("&application_name=x", "")
    assert args.timeout == 7.0
    assert args.server_settings == {"application_name": "x", "lock_timeout": "5s"}
    # Nothing to take out: the URI as written (its other parameters are server settings,
    # asyncpg's rule, which the test suite's plan checks use).
    plain = "postgresql://u@h/db?sslmode=require&plan_cache_mode=force_generic_plan"
    assert connect_args(plain) == ConnectArgs(plain)
    with pytest.raises(ValueError, match="the libpq keyword 'keepalives' is not supported"):
        connect_args("postgresql://u@h/db?keepalives=1")
    with pytest.raises(ValueError, match="connect_timeout must be whole seconds") as caught:
        connect_args("postgresql://u@h/db?connect_timeout=soon")
    assert "soon" not in str(caught.value)


@pytest.mark.parametrize(
    ("dsn", "message"),
    [
        ("password=secret word", "a word without '=' at character 17"),
        ("password='secret", "the quoted value of 'password' has no closing quote"),
        ("keepalives=1", "the libpq keyword 'keepalives' is not supported"),
        ("secretword=1", "a keyword that libpq does not know"),
        ("client_encoding=LATIN1", "client_encoding must be UTF8"),
        ("connect_timeout=soon", "connect_timeout must be whole seconds"),
        ("options='-x'", "options must be server settings"),
    ],
)
async def test_bad_keyword_strings_are_refused_without_echoing_values(
    dsn: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        await PostgresStore.connect(dsn)  # refused before any connection is attempted
    assert "secret" not in str(caught.value) and "soon" not in str(caught.value)


@pytest.fixture(scope="module")
def hba_file() -> Iterator[Path]:
    """`postgres` is trusted; everyone else must authenticate with scram-sha-256."""
    directory = Path(tempfile.mkdtemp(prefix="venturi-hba-"))
    os.chmod(directory, 0o755)  # the server may run as another user
    hba = directory / "pg_hba.conf"
    hba.write_text(
        "local all all trust\n"
        "host all postgres 127.0.0.1/32 trust\n"
        "host all all 127.0.0.1/32 scram-sha-256\n"
    )
    os.chmod(hba, 0o644)
    yield hba
    shutil.rmtree(directory)


@pytest.fixture(scope="module")
async def scram_server(hba_file: Path) -> AsyncIterator[EmbeddedPostgres]:
    """A server of its own that checks passwords over TCP (the shared one trusts everyone,
    which would let a garbled password pass), with a role `app` and a database "app db"."""
    async with EmbeddedPostgres(settings={"hba_file": str(hba_file)}) as pg:
        conn = await asyncpg.connect(pg.dsn)
        try:
            await conn.execute('CREATE DATABASE "app db"')
            escaped = PASSWORD.replace("'", "''")
            await conn.execute(f"CREATE ROLE app LOGIN PASSWORD '{escaped}'")
            await conn.execute('GRANT ALL ON DATABASE "app db" TO app')
        finally:
            await conn.close()
        conn = await asyncpg.connect(f"postgresql://postgres@127.0.0.1:{pg.port}/app%20db")
        try:
            await conn.execute("GRANT ALL ON SCHEMA public TO app")
        finally:
            await conn.close()
        yield pg


def _quoted(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


async def test_a_keyword_dsn_connects_with_a_hard_password(scram_server: EmbeddedPostgres) -> None:
    dsn = (
        f"host=127.0.0.1 port={scram_server.port} dbname='app db' user=app "
        f"password={_quoted(PASSWORD)} application_name=kv-test connect_timeout=5 "
        f"options='-c statement_timeout=4321'"
    )
    async with await PostgresStore.connect(dsn, prefix="kv") as store:
        assert await store.migrate() == all_migrations()
        await Queue(store).stats()
        row = await store._pool.fetchrow(
            "SELECT current_user, current_database(), current_setting('application_name'), "
            "current_setting('statement_timeout')"
        )
    assert row is not None and tuple(row) == ("app", "app db", "kv-test", "4321ms")
    # The server really checks the password: a wrong one is refused.
    wrong = dsn.replace(_quoted(PASSWORD), _quoted(PASSWORD + "x"))
    with pytest.raises(asyncpg.InvalidPasswordError):
        await PostgresStore.connect(wrong)


async def test_the_callers_settings_win_over_the_dsns(scram_server: EmbeddedPostgres) -> None:
    dsn = (
        f"host=127.0.0.1 port={scram_server.port} dbname='app db' user=app "
        f"password={_quoted(PASSWORD)} application_name=from-dsn"
    )
    async with await PostgresStore.connect(dsn, application_name="explicit") as store:
        assert await store._pool.fetchval("SELECT current_setting('application_name')") == (
            "explicit"
        )
    uri = f"postgresql://postgres@127.0.0.1:{scram_server.port}/postgres?application_name=uri"
    async with await PostgresStore.connect(uri) as store:  # the URI's own name is kept
        assert await store._pool.fetchval("SELECT current_setting('application_name')") == "uri"


async def test_a_uri_with_libpq_parameters_connects(scram_server: EmbeddedPostgres) -> None:
    uri = (
        f"postgresql://postgres@127.0.0.1:{scram_server.port}/postgres"
        "?connect_timeout=5&application_name=uri&options=-c%20statement_timeout%3D4321"
    )
    async with await PostgresStore.connect(uri, prefix="uri") as store:
        row = await store._pool.fetchrow(
            "SELECT current_setting('application_name'), current_setting('statement_timeout')"
        )
    assert row is not None and tuple(row) == ("uri", "4321ms")


@pytest.mark.parametrize(
    ("option", "value", "error", "message"),
    [
        ("statement_timeout", -1, ValueError, r"statement_timeout: expected seconds from 0.001"),
        ("statement_timeout", 0.0001, ValueError, r"from 0.001 on \(or None\), got 0.0001"),
        ("connect_timeout", 0, ValueError, r"connect_timeout: expected seconds from 0.001"),
        ("connect_timeout", "10", TypeError, r"connect_timeout: expected seconds \(a number\)"),
        ("statement_timeout", float("nan"), ValueError, "got nan"),
    ],
)
async def test_bad_timeouts_are_refused_before_connecting(
    option: str, value: object, error: type[Exception], message: str
) -> None:
    options: dict[str, Any] = {option: value}
    with pytest.raises(error, match=message):
        await PostgresStore.connect("postgresql://nobody@127.0.0.1:1/none", **options)
