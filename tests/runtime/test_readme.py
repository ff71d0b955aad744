"""The README's first example ("Ten lines"), taken from README.md as it stands and run as a
reader would: saved to a file, run with a DSN, in a database of its own."""

from __future__ import annotations

import asyncio
import sys
import urllib.parse
import uuid
from pathlib import Path

import asyncpg

README = Path(__file__).resolve().parents[2] / "README.md"


def python_block(heading: str) -> str:
    """The first Python code block of the README's section `## heading`."""
    section = README.read_text().split(f"\n## {heading}\n", 1)[1]
    return section.split("```python\n", 1)[1].split("\n```", 1)[0]


async def test_the_ten_line_example_runs_as_written(pg_dsn: str, tmp_path: Path) -> None:
    database = f"readme_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(pg_dsn)
    await admin.execute(f"CREATE DATABASE {database}")
    try:
        dsn = urllib.parse.urlsplit(pg_dsn)._replace(path=f"/{database}").geturl()
        script = tmp_path / "example.py"
        script.write_text(python_block("Ten lines"))
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(script),
            dsn,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, err.decode()
        assert out.decode().splitlines() == ["sending to ada@example.com"]
        conn = await asyncpg.connect(dsn)
        try:
            rows = await conn.fetch("SELECT kind, status FROM venturi_jobs")
        finally:
            await conn.close()
        assert [tuple(r) for r in rows] == [("send_email", "completed")]
    finally:
        await admin.execute(f"DROP DATABASE {database} WITH (FORCE)")
        await admin.close()
