"""A worker factory for `venturi worker tests.faults.leader_app:make_worker`: a plain worker
whose one extra maintenance service records every run it makes, with what the database says
about the lease at that moment, in `{prefix}_led` (created by the test with `LED_DDL`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import asyncpg

from venturi import Context, Outcome, PostgresStore, Task, Worker

LED_DDL = """
CREATE TABLE {prefix}_led (
    id      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    worker  text        NOT NULL,   -- who ran the service
    leader  text,                   -- who held the lease, by the database, as it ran
    term    bigint,
    valid   boolean,                -- whether that lease was unexpired
    at      timestamptz NOT NULL
)
"""

RECORD = """
INSERT INTO {prefix}_led (worker, leader, term, valid, at)
SELECT $1, l.leader, l.term, l.expires_at > clock_timestamp(), clock_timestamp()
FROM (SELECT 1) AS one LEFT JOIN {prefix}_leader AS l ON l.name = 'maintenance'
"""


@dataclass
class Noop(Task):
    KIND = "leader.noop"


async def noop(task: Noop, ctx: Context[None], app: None) -> Outcome:
    return Outcome.completed()


class Recorder:
    name = "recorder"
    interval = 0.1

    def __init__(self) -> None:
        self.worker = ""
        self._conn: asyncpg.Connection | None = None

    async def run_once(self, store: PostgresStore) -> None:
        if self._conn is None or self._conn.is_closed():
            self._conn = await asyncpg.connect(os.environ["VENTURI_DSN"])
        await self._conn.execute(RECORD.format(prefix=store.prefix), self.worker)


def make_worker(store: PostgresStore) -> Worker[None]:
    recorder = Recorder()
    worker = Worker(None, store, concurrency=2, maintenance=[recorder])
    recorder.worker = str(worker.identity)
    worker.register(Noop, noop)
    return worker
