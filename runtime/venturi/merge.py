"""Deduplication: a candidacy key on the task, and a merge decision when an enqueue collides
with a *pending* job of the same (KIND, key).

    @dataclass
    class FetchBookmark(Task):
        KIND = "fetch_bookmark"
        bookmark_id: int
        def dedup_key(self) -> DedupKey | None:
            return DedupKey(self.bookmark_id)          # at most one pending fetch per bookmark
        def merge(self, existing: Pending[FetchBookmark]) -> Merge:
            return Merge.keep()                         # the pending one will do

`Keep`, `Replace` and `With` act on the existing row (its journal is preserved and a `merged`
entry records the decision; `enqueue` returns the existing id). `Independent` stores a new,
separate row: the candidacy index is not unique. Pure values; the store applies them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ulid import ULID

from venturi._shown import shown
from venturi.jobs import JournalEntry

T = TypeVar("T")


DEDUP_KEY_MAX_BYTES = 2000
"""The longest dedup key, in bytes of UTF-8: with a KIND and a queue name (200 characters
each, at most) it stays within what one entry of the candidacy index can hold (2,704 bytes)."""


@dataclass(frozen=True, slots=True)
class DedupKey:
    """A candidacy key: any value, compared by its string form within one KIND and queue.

    The string form must hold no NUL character and at most 2,000 bytes of UTF-8 (a
    ValueError otherwise): hash a longer identity yourself if you need one.
    """

    value: str

    def __init__(self, value: object) -> None:
        text = str(value)
        if "\x00" in text:
            raise ValueError(
                f"DedupKey: the key holds a NUL character (\\x00), which PostgreSQL cannot "
                f"store: {shown(text)}"
            )
        size = len(text)
        if not text.isascii():
            try:
                size = len(text.encode())
            except UnicodeEncodeError:
                raise ValueError(
                    f"DedupKey: the key is not valid Unicode (a lone surrogate): {shown(text)}"
                ) from None
        if size > DEDUP_KEY_MAX_BYTES:
            raise ValueError(
                f"DedupKey: the key is {size:,} bytes of UTF-8, over the "
                f"{DEDUP_KEY_MAX_BYTES:,}-byte limit (hash a long identity, e.g. with hashlib)"
            )
        object.__setattr__(self, "value", text)


class MergeAction(enum.StrEnum):
    KEEP = "keep"
    REPLACE = "replace"
    WITH = "with"
    INDEPENDENT = "independent"


@dataclass(frozen=True, slots=True)
class Merge:
    """What an enqueue that collides with a pending job does."""

    action: MergeAction
    task: Any = None
    carry: Any = None

    @classmethod
    def keep(cls) -> Merge:
        """The incoming task is redundant: leave the existing job untouched."""
        return cls(MergeAction.KEEP)

    @classmethod
    def replace(cls) -> Merge:
        """The default: the existing job takes the incoming payload, its carry is reset."""
        return cls(MergeAction.REPLACE)

    @classmethod
    def with_(cls, task: Any, carry: Any = None) -> Merge:
        """The existing job takes a computed payload and carry (None resets the carry):
        escalate priority, union payloads, advance a cursor."""
        return cls(MergeAction.WITH, task, carry)

    @classmethod
    def independent(cls) -> Merge:
        """Not really a duplicate: store the incoming task as a new, separate job."""
        return cls(MergeAction.INDEPENDENT)


@dataclass(frozen=True, slots=True)
class Pending(Generic[T]):
    """The pending job an enqueue collided with, as `Task.merge` sees it."""

    id: ULID
    task: T
    """The existing job's payload, decoded into the task class."""
    carry: Any
    """The existing job's carry, decoded into the task's carry type (None for carry-less
    tasks); `Any` to a type checker, which cannot tie it to `T`."""
    run_count: int
    journal: tuple[JournalEntry, ...]
