"""A network partition between one worker and the database: the worker runs in a network
namespace of the test's own, joined to the host by a veth pair, and the host side of the
link is taken down for longer than the jobs' lease. The partitioned worker aborts its jobs
before their leases end (it cannot renew them), the other worker recovers and runs them,
nothing runs twice at once, and once the link is back the partitioned worker carries on:
it never exits.

Needs root and iproute2 (`ip netns`); skipped otherwise. Traffic never leaves the machine:
the server listens on 127.0.0.1 and on the veth's host address only.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from venturi import PostgresStore, Queue
from venturi.embedded import EmbeddedPostgres

from .harness import FIGURES, Run, fleet, journals, overlaps, read_runs, stalls, wait_until
from .worker import Work

LEASE = 3.0
PARTITION = 8.0
"""Seconds the link stays down: longer than a lease, so the jobs must change hands."""
JOBS = 16
JOB_MS = 4000
"""Longer than a lease: only renewal keeps a job, so the partitioned worker must abort its."""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def netns() -> Iterator[tuple[str, str, str, str]]:
    """(namespace, host-side link, host address, namespace address), removed afterwards."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("a network namespace needs root and iproute2")
    tag = uuid.uuid4().hex[:6]
    ns, host_if, ns_if = f"vt{tag}", f"vth{tag}", f"vtn{tag}"
    octet = random.randint(0, 255)
    host_ip, ns_ip = f"10.253.{octet}.1", f"10.253.{octet}.2"
    try:
        _ip("netns", "add", ns)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot create a network namespace here: {exc.stderr.decode().strip()}")
    try:
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _ip("link", "set", ns_if, "netns", ns)
        _ip("addr", "add", f"{host_ip}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("-n", ns, "addr", "add", f"{ns_ip}/30", "dev", ns_if)
        _ip("-n", ns, "link", "set", ns_if, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        yield ns, host_if, host_ip, ns_ip
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


@pytest.mark.slow
async def test_partitioned_worker_neither_exits_nor_double_runs(
    netns: tuple[str, str, str, str], tmp_path: Path
) -> None:
    ns, host_if, host_ip, ns_ip = netns
    pg = EmbeddedPostgres(
        settings={"synchronous_commit": "on"},
        listen_addresses=f"127.0.0.1,{host_ip}",
        hba=[f"host all all {ns_ip}/32 trust"],
    )
    await asyncio.to_thread(pg.start)
    try:
        await _scenario(pg, ns, host_if, host_ip, tmp_path)
    finally:
        await asyncio.to_thread(pg.stop)


async def _scenario(
    pg: EmbeddedPostgres, ns: str, host_if: str, host_ip: str, tmp_path: Path
) -> None:
    prefix = f"p_{uuid.uuid4().hex[:8]}"
    async with await PostgresStore.connect(pg.dsn, prefix=prefix) as store:
        await store.migrate()
        queue = Queue(store)
        args = ["--concurrency", "4", "--lease", str(LEASE)]
        far_dsn = pg.dsn.replace("127.0.0.1", host_ip)
        async with stalls() as stalled, fleet(pg.dsn, prefix, tmp_path, args) as workers:
            workers.wrapper = ["ip", "netns", "exec", ns]
            far = await workers.start(dsn=far_dsn)
            workers.wrapper = []
            await queue.enqueue_many(Work(i, JOB_MS) for i in range(JOBS))

            def far_runs() -> list[Run]:
                return [r for r in read_runs(tmp_path) if r.pid == far.pid]

            async def far_busy() -> bool:
                return len(far_runs()) >= 4

            await wait_until(far_busy, 30, "the partitioned worker running jobs")
            await workers.start()
            _ip("link", "set", host_if, "down")
            cut = time.time()
            await asyncio.sleep(PARTITION)  # the outage itself, not a synchronization
            _ip("link", "set", host_if, "up")
            healed = time.time()

            # Once back, the partitioned worker claims again: more jobs, until it runs one.
            await queue.enqueue_many(Work(JOBS + i, JOB_MS) for i in range(8))

            async def far_resumed() -> bool:
                return any(r.start > healed for r in far_runs())

            await wait_until(far_resumed, 60, "the partitioned worker running jobs again")

            async def all_done() -> bool:
                n = await store._pool.fetchval(
                    f"SELECT count(*) FROM {prefix}_jobs WHERE status = 'completed'"
                )
                return bool(n == JOBS + 8)

            await wait_until(all_done, 120, "every job completed")
            assert far.alive, f"the partitioned worker exited:\n{far.stderr()}"
            assert workers.exited() == []
            codes = await workers.stop()
            assert codes == [0, 0], [p.stderr() for p in workers.procs]
        pool: asyncpg.Pool = store._pool_or_raise()
        journal = await journals(pool, prefix)

    runs = read_runs(tmp_path)
    clashes = overlaps(runs, {})
    aborted = [r for r in runs if r.pid == far.pid and r.how == "cancelled"]
    after = [r for r in runs if r.pid == far.pid and r.start > healed]
    recovered = sum(1 for es in journal.values() for e in es if e["outcome"] == "stale_recovered")
    FIGURES.append(
        f"partition ({PARTITION:.0f}s, lease {LEASE:.0f}s): the partitioned worker aborted "
        f"{len(aborted)} jobs before their leases ended, {recovered} recovered elsewhere, "
        f"{len(after)} runs by it after the link came back, overlaps {len(clashes)}"
        + (
            f"; the machine stood still {sum(g for _, g in stalled.gaps):.1f}s"
            if stalled.gaps
            else ""
        )
    )
    assert clashes == []
    assert aborted, "the partitioned worker should have stopped the jobs it could not renew"
    # By the wall clock, allowing for the time the whole machine stood still (seen once in
    # CI: four runs "cancelled" 12 s after the cut, though a 4 s sleep would have ended
    # them 3.6 s after it had their loop run at all).
    late = [
        (r.job, r.start - cut, (r.end or 0) - cut, stalled.within(cut, r.end or 0))
        for r in aborted
        if not cut < (r.end or 0) < cut + LEASE + stalled.within(cut, r.end or 0)
    ]
    assert late == [], (
        "aborted runs (job, start, end: seconds after the cut, seconds this test's own loop "
        f"stood still meanwhile); every stall: {stalled.gaps}"
    )
    assert recovered >= len(aborted)
    assert after
