"""The leader lease's statements (`queries/leader.sql`), run on a store's runner, through
`PostgresStore.leadership`; the elector that calls them is `venturi._maintenance.leader`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from venturi._db.run import Runner
from venturi._db.sql import Statement

MAINTENANCE = "maintenance"
"""The lease of the leader-only maintenance services."""


@dataclass(frozen=True, slots=True)
class Attempt:
    term: int | None
    """The term this worker now leads (None: another worker leads)."""
    expires_in_s: float | None
    """When another leads: seconds its lease has left (None: no lease was there)."""


@dataclass(frozen=True, slots=True)
class Lease:
    leader: str
    term: int
    elected_at: datetime
    expires_at: datetime
    valid: bool


class Leadership:
    def __init__(self, run: Runner, queries: Mapping[str, Statement]) -> None:
        self._run = run
        self._q = queries

    async def attempt(
        self, *, worker: str, term: int | None, ttl_s: float, name: str = MAINTENANCE
    ) -> Attempt:
        """Take the lease `name` for `ttl_s` seconds if it is free or expired, or renew it
        if `worker` holds it (`term`: the term it believes it leads, or None)."""
        row = await self._run.fetchrow(
            self._q["leader_attempt"], name=name, worker=worker, term=term, ttl_s=ttl_s
        )
        assert row is not None
        return Attempt(row["term"], row["expires_in_s"])

    async def resign(self, *, worker: str, term: int, name: str = MAINTENANCE) -> None:
        await self._run.execute(self._q["leader_resign"], name=name, worker=worker, term=term)

    async def lease(self, name: str = MAINTENANCE) -> Lease | None:
        row = await self._run.fetchrow(self._q["leader_get"], name=name)
        if row is None:
            return None
        return Lease(row["leader"], row["term"], row["elected_at"], row["expires_at"], row["valid"])
