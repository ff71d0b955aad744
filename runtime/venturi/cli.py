"""The `venturi` command line: operate a queue from a shell.

    venturi demo [--dsn DSN]          enqueue a mix of jobs and run a worker until done
    venturi migrate                   apply the schema

Every command takes the DSN from --dsn or VENTURI_DSN, and the prefix from --prefix or
VENTURI_PREFIX. Database errors print one clear line and exit with status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

import asyncpg

from venturi.embedded import EmbeddedPostgresError
from venturi.postgres import DEFAULT_PREFIX, PostgresStore


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="venturi", description="Typed jobs on PostgreSQL.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--dsn", default=os.environ.get("VENTURI_DSN"), help="PostgreSQL DSN (env VENTURI_DSN)"
    )
    common.add_argument(
        "--prefix",
        default=os.environ.get("VENTURI_PREFIX", DEFAULT_PREFIX),
        help="table prefix (env VENTURI_PREFIX, default %(default)s)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", parents=[common], help="run the demo (embedded DB without --dsn)")
    demo.add_argument("--jobs", type=int, default=3000)
    demo.add_argument("--concurrency", type=int, default=8)
    sub.add_parser("migrate", parents=[common], help="apply pending migrations")
    return parser


async def _run(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from venturi.demo import run_demo

        prefix = args.prefix if args.prefix != DEFAULT_PREFIX else "venturi_demo"
        await run_demo(args.dsn, jobs=args.jobs, concurrency=args.concurrency, prefix=prefix)
        return 0
    if args.dsn is None and not os.environ.get("PGHOST"):
        print("venturi: no database given: pass --dsn or set VENTURI_DSN", file=sys.stderr)
        return 2
    async with await PostgresStore.connect(args.dsn, prefix=args.prefix) as store:
        if args.command == "migrate":
            applied = await store.migrate()
            print(f"applied migrations {applied}" if applied else "schema is up to date")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return asyncio.run(_run(args))
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, EmbeddedPostgresError) as exc:
        print(f"venturi: database error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"venturi: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
