"""A job's journal as the store reads it back: from its rows (`journal`), and from the JSON
array a statement aggregates them into (`history`: a claim's reply carries a re-run's, a
failure step's carries its job's), into `JournalEntry` records."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg
import msgspec

from venturi.jobs import JournalEntry, JournalOutcome


class _HistoryRow(msgspec.Struct):
    run: int
    outcome: str
    at: datetime
    note: str | None = None
    attachment: Any = None
    duration_s: float | None = None
    worker: str | None = None


_history_decoder = msgspec.json.Decoder(list[_HistoryRow])


def history(text: str | None) -> tuple[JournalEntry, ...]:
    """A journal aggregated to JSON by the statement (None: no entries)."""
    if text is None:
        return ()
    return tuple(
        JournalEntry(
            run=row.run,
            outcome=JournalOutcome(row.outcome),
            at=row.at,
            note=row.note,
            attachment=row.attachment,
            duration=row.duration_s,
            worker=row.worker,
        )
        for row in _history_decoder.decode(text)
    )


def journal(rows: Sequence[asyncpg.Record]) -> tuple[JournalEntry, ...]:
    """A journal read row by row."""
    # Attachments are JSON written by `ctx.attach`, not by a task codec.
    return tuple(
        JournalEntry(
            run=r["run"],
            outcome=JournalOutcome(r["outcome"]),
            at=r["at"],
            note=r["note"],
            attachment=None if r["attachment"] is None else msgspec.json.decode(r["attachment"]),
            duration=r["duration_s"],
            worker=r["worker"],
        )
        for r in rows
    )
