"""The schema of a prefix: applying the migrations (`migrations/`), and checking, before a
worker claims anything, that the tables are this release's and that its role may use them.
Run on a store's runner, through `PostgresStore.migrate`, `check_schema` and
`check_privileges`; `missing_schema` says plainly what an unmigrated prefix's "relation
does not exist" means."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import re
import time
from collections.abc import Mapping

import asyncpg

from venturi._db import sql
from venturi._db.failures import is_database_failure
from venturi._db.run import Runner
from venturi._db.sql import Statement
from venturi.errors import SchemaError

MIGRATE_LOCK_TIMEOUT = 2.0
"""Seconds a migration's statement waits for a lock on a table before the migration gives way
and tries again (see `PostgresStore.migrate`)."""
MIGRATE_PATIENCE = 600.0
"""Seconds `PostgresStore.migrate` keeps trying to get its locks before it gives up."""

# The store's logger, which users know these warnings by.
logger = logging.getLogger("venturi.postgres")


def _lock_key(prefix: str) -> int:
    digest = hashlib.blake2b(f"venturi:migrate:{prefix}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class Schema:
    def __init__(
        self, run: Runner, queries: Mapping[str, Statement], prefix: str, *, bound: bool
    ) -> None:
        self._run = run
        self._q = queries
        self._prefix = prefix
        self._bound = bound
        """On the caller's connection (`PostgresStore.using`): its transaction's settings
        are left alone."""

    async def migrate(
        self, *, lock_timeout: float = MIGRATE_LOCK_TIMEOUT, patience: float = MIGRATE_PATIENCE
    ) -> list[int]:
        """`PostgresStore.migrate`: each try in one transaction under the prefix's advisory
        lock; a try that waited `lock_timeout` for a table's lock gives way and tries again."""
        for name, value in (("lock_timeout", lock_timeout), ("patience", patience)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"migrate({name}): expected seconds >= 0, got {value!r}")
        started = time.monotonic()
        pause = 1.0
        while True:
            try:
                return await self._migrate_once(lock_timeout)
            except asyncpg.LockNotAvailableError:
                holders = await self._lock_holders()
                waited = time.monotonic() - started
                if waited + pause > patience:
                    raise SchemaError(
                        f"migrate: gave up after {waited:.0f}s: a migration of prefix "
                        f"{self._prefix!r} needs a lock on its tables, which {holders} held "
                        f"each time it waited {lock_timeout:g}s; nothing was applied, and the "
                        f"queue ran meanwhile. Migrate at a quieter moment, or with a longer "
                        f"lock timeout (0: wait as long as it takes)"
                    ) from None
                logger.warning(
                    "migrate: a migration of prefix %r waited %gs for a lock on its tables, "
                    "held by %s; it gave way (the queue runs meanwhile) and tries again in %gs",
                    self._prefix,
                    lock_timeout,
                    holders,
                    pause,
                )
                await asyncio.sleep(pause)
                pause = min(pause * 2, 30.0)

    async def _migrate_once(self, lock_timeout: float) -> list[int]:
        q = self._q
        applied_now: list[int] = []
        known = sql.migrations(self._prefix)
        if await self._run.fetchval(q["migration_table_exists"]):
            done = {r["version"] for r in await self._run.fetch(q["migration_list"])}
            self._refuse_newer(done)
            if all(m.version in done for m in known):
                return applied_now  # nothing to do: no lock, no DDL, no CREATE privilege
        elif (elsewhere := await self._prefix_elsewhere()) is not None:
            logger.warning(
                "migrate: prefix %r is installed in schema %s, off this session's search_path "
                "(%s): making a second, separate queue in the first schema of that path (its "
                "workers will not see the other's jobs); to use the existing one, put its "
                "schema on the search_path instead",
                self._prefix,
                ", ".join(elsewhere[1]),
                elsewhere[0],
            )
        encoding = await self._run.fetchval(q["server_encoding"])
        if encoding not in ("UTF8", "SQL_ASCII"):
            logger.warning(
                "migrate: this database's encoding is %s, not UTF8: a payload, key, queue "
                "name or result holding a character %s has none for is refused (a note or "
                "an error message is written with backslash escapes instead); create the "
                "database with ENCODING 'UTF8' to store any text",
                encoding,
                encoding,
            )
        async with self._run.transaction() as tx:
            await tx.execute(q["lock_migrations"], key=_lock_key(self._prefix))
            await tx.execute(q["migration_table_create"])
            done = {r["version"] for r in await tx.fetch(q["migration_list"])}
            self._refuse_newer(done)
            if lock_timeout > 0 and not self._bound:  # never the caller's transaction's
                await tx.execute(q["migration_lock_timeout"], ms=f"{lock_timeout * 1000:.0f}ms")
            for migration in known:
                if migration.version in done:
                    continue
                try:
                    await tx.script(migration.sql)
                except (asyncpg.DuplicateTableError, asyncpg.DuplicateObjectError) as exc:
                    raise self._taken_name(migration, exc) from None
                await tx.execute(
                    q["migration_record"], version=migration.version, name=migration.name
                )
                applied_now.append(migration.version)
        return applied_now

    async def _lock_holders(self) -> str:
        """Who holds locks on the prefix's tables now, for a migration that could not get
        one: "pid 123 (app, idle in transaction for 20s)", or "another session"."""
        tables = [f"{self._prefix}_{suffix}" for suffix in sql.table_suffixes()]
        try:
            rows = await self._run.fetch(self._q["lock_holders"], tables=tables)
        except Exception as exc:  # only a description: the caller's error is the news
            if not is_database_failure(exc):
                raise
            rows = []
        if not rows:
            return "another session"
        return ", ".join(
            f"pid {r['pid']} ({r['application_name'] or 'no application_name'}, "
            f"{r['state']}, in its transaction for {r['xact_s']:.0f}s)"
            for r in rows
        )

    def _taken_name(self, migration: sql.Migration, exc: asyncpg.PostgresError) -> SchemaError:
        """A migration that found one of its names taken: most likely by another prefix
        whose tables' names overlap (prefix 'shop' has 'shop_hour_counts', which is also
        prefix 'shop_hour''s counts table)."""
        found = re.search(r'"([^"]+)"', str(exc))
        name = found.group(1) if found else ""
        owners = [
            f"table {suffix!r} of prefix {name[: -len(suffix) - 1]!r}"
            for suffix in sql.table_suffixes()
            if name.endswith(f"_{suffix}") and len(name) > len(suffix) + 1
        ]
        why = (
            f": {name!r} is the name of {' and of '.join(owners)}, so those prefixes cannot "
            f"share a schema; choose a prefix whose tables' names no other prefix uses"
            if len(owners) > 1
            else ""
        )
        return SchemaError(
            f"migration {migration.version} ({migration.name}) of prefix {self._prefix!r}: "
            f"{exc}{why}; nothing was applied"
        )

    async def check_schema(self) -> None:
        """`PostgresStore.check_schema`."""
        try:
            rows = await self._run.fetch(self._q["migration_list"])
        except asyncpg.UndefinedTableError as exc:
            raise await self.missing_schema(exc) from None
        done = {r["version"] for r in rows}
        self._refuse_newer(done)
        missing = sorted({m.version for m in sql.migrations(self._prefix)} - done)
        if missing:
            raise SchemaError(
                f"the schema of prefix {self._prefix!r} lacks migrations {missing}: run "
                f"`venturi migrate` (or `await store.migrate()`) before starting workers"
            )

    async def check_privileges(self) -> None:
        """`PostgresStore.check_privileges`."""
        tables = [f"{self._prefix}_{suffix}" for suffix in sql.table_suffixes()]
        rows = await self._run.fetch(self._q["privileges_missing"], tables=tables)
        if not rows:
            return
        who = await self._run.fetchrow(self._q["session_role"])
        assert who is not None
        role, schema = who["role"], who["schema"]
        lacking = "; ".join(f"{r['name']} ({', '.join(r['missing'])})" for r in rows)
        raise SchemaError(
            f"the role {role} lacks privileges a worker needs on the tables of prefix "
            f"{self._prefix!r}: {lacking}. Grant them, e.g. GRANT SELECT, INSERT, UPDATE, DELETE "
            f"ON ALL TABLES IN SCHEMA {schema} TO {role}; GRANT USAGE ON ALL SEQUENCES IN "
            f"SCHEMA {schema} TO {role}; and, so that the tables a later migration adds are "
            f"granted too, ALTER DEFAULT PRIVILEGES as the role that migrates (README: "
            f"Migrations, privileges and upgrades)"
        )

    def _refuse_newer(self, done: set[int]) -> None:
        unknown = sorted(done - {m.version for m in sql.migrations(self._prefix)})
        if unknown:
            raise SchemaError(
                f"the schema of prefix {self._prefix!r} has migrations {unknown} that this "
                f"release of venturi does not know: a newer release migrated it; upgrade "
                f"venturi here (running against a schema it does not know could corrupt jobs)"
            )

    async def missing_schema(self, exc: asyncpg.UndefinedTableError) -> SchemaError:
        """asyncpg's "relation ... does not exist" on an unmigrated prefix, said plainly (the
        cause is kept: the operator matches "does not exist"). Where the prefix's tables are
        in a schema off this session's search_path, it says so: migrating would make a
        second, empty queue beside them, which no worker of the first would serve."""
        elsewhere = await self._prefix_elsewhere()
        if elsewhere is not None:
            path, schemas = elsewhere
            return SchemaError(
                f"{exc}: the tables of prefix {self._prefix!r} are in schema "
                f"{', '.join(schemas)}, which is not on this session's search_path ({path}): "
                f"put it there (ALTER ROLE ... SET search_path, or options=-c search_path=... "
                f"in the DSN); `venturi migrate` would make a second, separate queue instead"
            )
        return SchemaError(
            f"{exc}: the tables of prefix {self._prefix!r} are missing, or older than this "
            f"release of venturi; run `venturi migrate` (or `await store.migrate()`) first"
        )

    async def _prefix_elsewhere(self) -> tuple[str, list[str]] | None:
        """(search_path, schemas) when the prefix's tables are in schemas this session does
        not see; None when they are nowhere, or this cannot be read (the caller's
        transaction, aborted by the error, refuses any statement)."""
        try:
            row = await self._run.fetchrow(self._q["prefix_elsewhere"])
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, ValueError):
            return None
        if row is None or not row["schemas"]:
            return None
        return row["search_path"], list(row["schemas"])
