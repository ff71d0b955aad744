"""The ceiling: pgbench doing a queue's SQL work per job, with no queue library in the way.

``pgbench/queue_cycle.sql`` inserts, claims (FOR UPDATE SKIP LOCKED) and marks done a batch
of jobs, each step its own commit. Run at 1 job and 100 jobs per pass and at 1, 4 and 16
clients, it gives the most jobs/s this PostgreSQL on this machine can move through a queue
table; every system's figure can be read as a fraction of it.

``pgbench/insert_one.sql`` is the single-row ceiling beside it: one client inserting one job
row per autocommit transaction into the same table, one after the other, which is what a
producer awaiting each enqueue does; each single-enqueue figure is read as a fraction of it.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from pathlib import Path

from bench.pg import DB_USER, PrivateServer

SCRIPTS = Path(__file__).parent / "pgbench"
_TPS = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)", re.MULTILINE)
_FAILED = re.compile(r"^number of failed transactions: (\d+)", re.MULTILINE)


def _pgbench(
    server: PrivateServer,
    dbname: str,
    batch: int,
    clients: int,
    seconds: float,
    script: str = "queue_cycle.sql",
) -> float:
    threads = max(1, min(clients, os.cpu_count() or 1))
    result = subprocess.run(
        [
            str(server.bindir / "pgbench"),
            "-n",  # no vacuum of pgbench's own tables (we use none)
            "-M",
            "prepared",
            "-c",
            str(clients),
            "-j",
            str(threads),
            "-T",
            str(max(1, round(seconds))),
            "-D",
            f"batch={batch}",
            "-f",
            str(SCRIPTS / script),
            "-h",
            "127.0.0.1",
            "-p",
            str(server.port),
            "-U",
            DB_USER,
            dbname,
        ],
        capture_output=True,
        text=True,
    )
    tps = _TPS.search(result.stdout)
    failed = _FAILED.search(result.stdout)
    if result.returncode != 0 or tps is None or (failed and int(failed.group(1))):
        raise RuntimeError(f"pgbench failed: {result.stdout[-800:]} {result.stderr[-800:]}")
    return float(tps.group(1)) * batch


def measure(
    server: PrivateServer,
    dbname: str,
    batches: tuple[int, ...],
    clients: tuple[int, ...],
    seconds: float,
) -> list[dict[str, float]]:
    """One repetition of the ceiling grid, each cell on a freshly seeded table."""
    server.create_database(dbname)
    try:
        server.psql_file(SCRIPTS / "schema.sql", dbname)
        rows = []
        for batch in batches:
            for count in clients:
                server.psql_file(SCRIPTS / "seed.sql", dbname)
                rate = _pgbench(server, dbname, batch, count, seconds)
                rows.append({"jobs_per_tx": batch, "clients": count, "jobs_per_s": rate})
        return rows
    finally:
        server.drop_database(dbname)


def measure_single(server: PrivateServer, dbname: str, seconds: float) -> float:
    """The single-row ceiling, jobs/s: one client, one row per transaction, on the same
    freshly seeded table as the batched grid (so its indexes hold the same 10,000 rows)."""
    server.create_database(dbname)
    try:
        server.psql_file(SCRIPTS / "schema.sql", dbname)
        server.psql_file(SCRIPTS / "seed.sql", dbname)
        return _pgbench(server, dbname, 1, 1, seconds, script="insert_one.sql")
    finally:
        server.drop_database(dbname)


async def measure_single_async(server: PrivateServer, dbname: str, seconds: float) -> float:
    return await asyncio.to_thread(measure_single, server, dbname, seconds)


async def measure_async(
    server: PrivateServer,
    dbname: str,
    batches: tuple[int, ...],
    clients: tuple[int, ...],
    seconds: float,
) -> list[dict[str, float]]:
    return await asyncio.to_thread(measure, server, dbname, batches, clients, seconds)
