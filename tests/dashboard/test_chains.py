"""The chains page and a link's chain on its job page, over HTTP (httpx on the ASGI app, a
real PostgreSQL, a real worker): where each chain stands, keyset paging, the links of a
long chain capped; and where a chain stands as a plain function."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from ulid import ULID

from tests.dashboard.conftest import Resize, held_chain
from tests.dashboard.test_app import client
from tests.dashboard.test_operate import row, rows
from venturi import JobStatus, PostgresStore, Queue, dashboard
from venturi._db import sql
from venturi.dashboard import _app, _views
from venturi.dashboard._store import CHAIN_LINKS, ChainLink, DashboardStore


def gated(store: PostgresStore) -> object:
    return dashboard.app(store, gate=lambda r: True)


def link_statuses(html: str) -> list[str]:
    return re.findall(r'data-link-status="([a-z]+)"', html)


async def test_the_chains_page_shows_each_link_and_where_a_chain_is_held(
    store: PostgresStore,
) -> None:
    queue = Queue(store)
    held = await held_chain(store)
    first = await queue.chain(Resize(image=10), Resize(image=11))  # no worker runs it now
    await queue.enqueue(Resize(image=99))  # not a chain: not listed
    async with client(gated(store)) as http:
        page = (await http.get("/chains")).text
    assert rows(page, "data-chain") == [str(first[0]), str(held[0])]  # newest first
    h = row(page, "data-chain", str(held[0]))
    assert re.findall(r'data-link="([0-9A-Z]+)"', h) == [str(i) for i in held]
    assert link_statuses(h) == ["completed", "dead", "waiting"]
    assert "data-chain-state>held<" in h
    assert f'href="/jobs/{held[1]}" data-held-job' in h
    assert f'action="/jobs/{held[1]}/retry"' in h  # the retry of the link it is held at
    f = row(page, "data-chain", str(first[0]))
    assert link_statuses(f) == ["pending", "waiting"]
    assert "data-chain-state>running<" in f and "/retry" not in f


async def test_a_links_job_page_shows_its_place_in_the_chain(store: PostgresStore) -> None:
    held = await held_chain(store)
    lone = await Queue(store).enqueue(Resize(image=5))
    async with client(gated(store)) as http:
        middle = (await http.get(f"/jobs/{held[1]}")).text
        last = (await http.get(f"/jobs/{held[2]}")).text
        alone = (await http.get(f"/jobs/{lone}")).text
    assert re.search(r"data-position>link 2 of 3<", middle)
    assert f'data-previous="{held[0]}"' in middle and f'data-next="{held[2]}"' in middle
    assert link_statuses(middle) == ["completed", "dead", "waiting"]
    assert re.search(r'class="link dead at current"', middle)
    assert re.search(r"data-position>link 3 of 3<", last)
    assert f'data-previous="{held[1]}"' in last and "data-next=" not in last
    assert "data-status>waiting<" in last
    assert "data-chain" not in alone


async def test_chains_page_by_keyset(store: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
    queue = Queue(store)
    heads = [(await queue.chain(Resize(image=i), Resize(image=i)))[0] for i in range(5)]
    newest = sorted(heads, reverse=True)
    monkeypatch.setattr(_app, "CHAINS_PAGE", 2)
    async with client(gated(store)) as http:
        one = (await http.get("/chains")).text
        two = (await http.get(f"/chains?before={newest[1]}")).text
        three = (await http.get(f"/chains?before={newest[3]}")).text
    assert rows(one, "data-chain") == [str(h) for h in newest[:2]]
    assert f'href="/chains?before={newest[1]}" rel="next"' in one
    assert rows(two, "data-chain") == [str(h) for h in newest[2:4]]
    assert rows(three, "data-chain") == [str(newest[4])] and 'rel="next"' not in three


async def test_a_long_chain_is_read_up_to_the_cap(store: PostgresStore) -> None:
    queue = Queue(store)
    links = await queue.chain(*(Resize(image=i) for i in range(CHAIN_LINKS + 5)))
    dash = DashboardStore(store, statement_timeout=2.0)
    async with dash.reading() as reader:
        ((head, read),) = await reader.chains(before=None, limit=10)
        far, earlier = await reader.job_chain(links[-1])
    assert head == links[0] and [link.id for link in read] == links[:CHAIN_LINKS]
    assert _views.chain(head, read).more
    # From the last link, the walk back stops at the cap: the chain starts earlier.
    assert earlier and far[-1].id == links[-1] and len(far) == CHAIN_LINKS + 1


def link(n: int, status: JobStatus, *, last: bool = False) -> ChainLink:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return ChainLink(
        id=ULID(),
        position=n,
        kind="k",
        queue="default",
        status=status,
        run_at=at,
        created_at=at,
        finished_at=None,
        failures=0,
        last_error=None,
        has_next=not last,
    )


def test_where_a_chain_stands() -> None:
    c, d, p, w = JobStatus.COMPLETED, JobStatus.DEAD, JobStatus.PENDING, JobStatus.WAITING

    def state(*statuses: JobStatus, earlier: bool = False) -> str:
        links = [link(i + 1, s, last=i == len(statuses) - 1) for i, s in enumerate(statuses)]
        return _views.chain(links[0].id, links, earlier=earlier).state

    assert state(c, c, c) == "done"
    assert state(c, p, w) == "running"
    assert state(c, JobStatus.CLAIMED, w) == "running"
    assert state(c, d, w) == "held"
    assert state(c, c, d) == "failed"
    assert state(w, w) == "orphaned"  # the link before the first was deleted while dead
    assert state(w, w, earlier=True) == "running"  # links before it were not read
    held = [link(1, c), link(2, d), link(3, w, last=True)]
    chain = _views.chain(held[0].id, held)
    assert chain.at is held[1] and chain.held and not chain.more
    place = _views.place_in(chain, held[1].id)
    assert place is not None and place.previous is held[0] and place.next is held[2]


async def test_the_chain_reads_use_the_chain_indexes(store: PostgresStore) -> None:
    """Heads off the chained jobs' id index, "nothing points at it" and the walk back off the
    chain_next index: never a scan of the jobs table (5,000 unchained jobs here, 1M in the
    benchmark)."""
    queue = Queue(store)
    await queue.enqueue_many(Resize(image=i) for i in range(5000))
    links = await queue.chain(Resize(image=1), Resize(image=2), Resize(image=3))
    pool = store._pool_or_raise()
    await pool.execute(f"ANALYZE {store.prefix}_jobs")
    q = sql.queries(store.prefix)
    plans = []
    for name, values in (
        ("dashboard_chains", {"before_id": None, "limit": 26, "max_links": CHAIN_LINKS}),
        ("dashboard_job_chain", {"id": links[1].to_uuid(), "max_links": CHAIN_LINKS}),
    ):
        stmt = q[name]
        rows = await pool.fetch("EXPLAIN " + stmt.text, *stmt.args(values))
        plans.append("\n".join(r[0] for r in rows))
    heads, walk = plans
    assert "Seq Scan" not in heads and "Seq Scan" not in walk, plans
    assert f"{store.prefix}_jobs_chain_idx" in heads, heads
    assert f"{store.prefix}_jobs_chain_next_idx" in heads, heads
    assert f"{store.prefix}_jobs_chain_next_idx" in walk, walk
