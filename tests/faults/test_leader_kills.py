"""Leaders SIGKILLed: three real `venturi worker` processes elect a leader; the leader is
killed, twice; each time another worker leads within a few seconds (its lease lapses, the
followers take it), every run of a leader-only service happens while the database says
that worker holds a valid lease (never two at once), each term has one leader and terms
follow each other in time; the killed workers' registry rows are swept, and the last
worker's clean exit removes its row and resigns its lease."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator
from itertools import pairwise
from pathlib import Path

import asyncpg
import pytest

from venturi import PostgresStore

from .harness import FIGURES, ROOT, wait_until
from .leader_app import LED_DDL

HANDOVER_LIMIT = 30.0
"""Seconds a handover may take before the test fails (the lease is 5 s: expect about that)."""
SWEEP_LIMIT = 60.0


@pytest.fixture
async def pool(pg_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=4)
    try:
        yield pool
    finally:
        await pool.close()


async def spawn(dsn: str, prefix: str, log: Path) -> asyncio.subprocess.Process:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VENTURI_", "PG"))}
    env |= {
        "VENTURI_DSN": dsn,
        "VENTURI_PREFIX": prefix,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "runtime"), str(ROOT)]),
    }
    with log.open("wb") as err:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "venturi",
            "worker",
            "tests.faults.leader_app:make_worker",
            cwd=ROOT,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=err,
        )


_PID = re.compile(r":(\d+)#")


def pid_of(identity: str) -> int:
    match = _PID.search(identity)
    assert match, identity
    return int(match[1])


@pytest.mark.slow
async def test_leadership_moves_after_the_leader_is_killed(
    pg_dsn: str, store: PostgresStore, pool: asyncpg.Pool, prefix: str, tmp_path: Path
) -> None:
    await pool.execute(LED_DDL.format(prefix=prefix))
    procs: dict[int, asyncio.subprocess.Process] = {}
    try:
        for i in range(3):
            proc = await spawn(pg_dsn, prefix, tmp_path / f"stderr-{i}.log")
            procs[proc.pid] = proc

        async def registered() -> bool:
            rows = await pool.fetch(f"SELECT pid FROM {prefix}_workers")
            return {r["pid"] for r in rows} == set(procs)

        await wait_until(registered, 60, "three workers registered")

        delays = []
        killed: list[int] = []
        for _ in range(2):

            async def led_by_a_live_worker() -> bool:
                lease = await store.leadership.lease()
                return (
                    lease is not None
                    and lease.valid
                    and pid_of(lease.leader) in procs
                    and pid_of(lease.leader) not in killed
                    and await pool.fetchval(
                        f"SELECT count(*) FROM {prefix}_led WHERE worker = $1", lease.leader
                    )
                    > 0
                )

            await wait_until(led_by_a_live_worker, HANDOVER_LIMIT, "a live worker leads")
            lease = await store.leadership.lease()
            assert lease is not None
            victim = procs[pid_of(lease.leader)]
            killed_at = time.time()
            victim.send_signal(signal.SIGKILL)
            await victim.wait()
            killed.append(victim.pid)

            async def another_ran(old: str = lease.leader, killed_at: float = killed_at) -> bool:
                at = await pool.fetchval(
                    f"SELECT extract(epoch FROM min(at))::float8 FROM {prefix}_led "
                    f"WHERE worker <> $1 AND at > to_timestamp($2)",
                    old,
                    killed_at,
                )
                if at is not None:
                    delays.append(at - killed_at)
                return at is not None

            await wait_until(another_ran, HANDOVER_LIMIT, "another worker leads after the kill")

        # The killed workers' rows are swept by the leader once they have gone silent.
        [survivor] = [p for p in procs if p not in killed]

        async def swept() -> bool:
            rows = await pool.fetch(f"SELECT pid FROM {prefix}_workers")
            return [r["pid"] for r in rows] == [survivor]

        await wait_until(swept, SWEEP_LIMIT, "the killed workers' rows swept")

        # A clean exit removes the row and resigns the lease.
        procs[survivor].send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(procs[survivor].wait(), 60) == 0
        assert await pool.fetchval(f"SELECT count(*) FROM {prefix}_workers") == 0
        lease = await store.leadership.lease()
        assert lease is not None and not lease.valid
    finally:
        for proc in procs.values():
            if proc.returncode is None:
                proc.kill()
                await proc.wait()

    runs = await pool.fetch(f"SELECT worker, leader, term, valid, at FROM {prefix}_led ORDER BY id")
    assert runs
    wrong = [dict(r) for r in runs if r["leader"] != r["worker"] or not r["valid"]]
    assert not wrong, f"service runs while the database said another leads: {wrong[:5]}"
    leaders: dict[int, set[str]] = {}
    spans: dict[int, tuple[float, float]] = {}
    for r in runs:
        leaders.setdefault(r["term"], set()).add(r["worker"])
        at = r["at"].timestamp()
        first, last = spans.get(r["term"], (at, at))
        spans[r["term"]] = (min(first, at), max(last, at))
    assert all(len(ws) == 1 for ws in leaders.values()), leaders
    terms = sorted(spans)
    assert len(terms) >= 3, terms  # the first leader and two successors
    for a, b in pairwise(terms):
        assert spans[a][1] < spans[b][0], f"term {a} ran until after term {b} began"
    FIGURES.append(
        f"leader killed: new leader's first service run {', '.join(f'{d:.1f}s' for d in delays)} "
        f"after the SIGKILL (lease 5s); terms {terms}"
    )
