"""`venturi dashboard`: serves the dashboard alone on 127.0.0.1, open to local clients only,
until SIGTERM."""

from __future__ import annotations

import asyncio
import re
import signal
import sys

import httpx

from venturi import PostgresStore


async def test_venturi_dashboard_serves_local_clients_until_sigterm(
    store: PostgresStore, pg_dsn: str
) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "venturi", "dashboard", "--dsn", pg_dsn,
        "--prefix", store.prefix, "--port", "0", "--read-only",
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
        match = re.search(r"at (http://127\.0\.0\.1:\d+/)", line)
        assert match, line
        async with httpx.AsyncClient() as http:
            page = await http.get(match[1] + "failed")
            assert page.status_code == 200 and "Failed jobs" in page.text
            assert "data-action" not in page.text  # --read-only
            rebound = await http.get(match[1], headers={"host": "evil.example"})
            assert rebound.status_code == 403
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0


async def test_venturi_dashboard_says_when_it_cannot_listen(
    store: PostgresStore, pg_dsn: str
) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "venturi", "dashboard", "--dsn", pg_dsn,
        "--prefix", store.prefix, "--host", "192.0.2.1", "--port", "8080",
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert "cannot listen on 192.0.2.1:8080" in err.decode()
