"""Fault injection: real PostgreSQL servers the tests stop, restart and kill, real worker
processes, nothing mocked. `VENTURI_SOAK=1` runs the longer soak (more jobs and kills)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from venturi.embedded import EmbeddedPostgres

from .harness import FIGURES

SOAK = os.environ.get("VENTURI_SOAK", "") not in ("", "0")


@pytest.fixture(scope="module")
def restartable_pg() -> Iterator[EmbeddedPostgres]:
    """A server of this module's own: the tests take it away, which others must not see.

    Commits are synchronous here: with `synchronous_commit=off` (the embedded server's fast
    default) a crash loses the last commits, and the suite would see the database forget
    settlements it had acknowledged, which is not venturi's to survive."""
    with EmbeddedPostgres(settings={"synchronous_commit": "on"}) as pg:
        yield pg


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FIGURES:
        terminalreporter.section("fault injection figures")
        for line in FIGURES:
            terminalreporter.write_line(line)
