"""`Task`: the payload of a job (its dataclass fields) and its enqueue-time policy.

A task class is state-free: a producer imports it to enqueue, without importing any
handler or the handlers' dependencies. Handlers are registered on a `Worker`.

    @dataclass
    class SendEmail(Task):
        KIND = "send_email"
        to: str

    @dataclass
    class SyncContacts(Task[Cursor]):     # Cursor: the typed carry, persisted across runs
        KIND = "sync_contacts"
        account_id: int
        def lease(self) -> float: return 3600
"""

from __future__ import annotations

import dataclasses
import enum
import re
import typing
from typing import Any, ClassVar, Generic

from typing_extensions import TypeVar

from venturi._shown import shown
from venturi.backoff import Backoff, Seconds
from venturi.merge import DedupKey, Merge, Pending

C = TypeVar("C", default=None)
"""The carry type; tasks that declare none carry nothing (`Task` is `Task[None]`)."""

KIND_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,199}")
"""What a KIND (and a queue name) may be: 1-200 characters, ASCII letters, digits and _ . : / -."""
NAME_RULE = "1-200 characters, ASCII letters, digits and _ . : / -, starting with a letter or digit"
"""KIND_PATTERN in words, for the errors that refuse a name."""


def check_queue_name(value: object, *, setting: str = "queue") -> str:
    """A queue name follows the rules of a KIND: 1-200 characters, ASCII letters, digits and
    `_ . : / -`, starting with a letter or digit."""
    if not isinstance(value, str):
        raise TypeError(f"{setting}: expected a queue name (a str), got {value!r}")
    if not KIND_PATTERN.fullmatch(value):
        raise ValueError(f"{setting}: invalid queue name {shown(value)}: expected {NAME_RULE}")
    return value


class Priority(enum.IntEnum):
    """Claim tiers: higher tiers are claimed first (with anti-starvation for lower ones)."""

    LOW = 0
    NORMAL = 1
    HIGH = 2


class Task(Generic[C]):
    """Base class of every task. Subclasses are dataclasses with a `KIND` string.

    `KIND` is the stable routing key stored with every job: unique per task type and
    stable across releases. `Task[Carry]` declares a typed carry (a dataclass with
    defaults) that a handler reads and mutates through `ctx.carry`.

    The methods below are enqueue-time policy, evaluated by the producer and stored with
    the job. Override them on the subclass; the defaults defer to the worker's settings.
    """

    KIND: ClassVar[str]
    ENCRYPTED: ClassVar[bool] = False
    """Store this task's payload and carry sealed with AES-256-GCM: the `Queue` and `Worker`
    then need `codec=SealedCodec(KeyRing...)` (see venturi.encryption)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        kind = cls.__dict__.get("KIND", getattr(cls, "KIND", None))
        if getattr(cls, "ENCRYPTED", False) is True and isinstance(kind, str):
            _encrypted_kinds.add(kind)

    QUEUE: ClassVar[str | None] = None
    """The named queue this task's jobs go to, unless the enqueue names one (`queue=`);
    None (the default) leaves it to the `Queue` (its `queue=`, "default" unless given).
    Validated like a KIND on the first enqueue."""

    def lease(self) -> Seconds | None:
        """How long a claim of this job lasts before another worker may recover it.

        It must exceed the handler's real runtime between lease renewals; `None` uses the
        worker's `lease` (15 minutes by default). Renewal keeps live jobs from expiring.
        From 0.5 s to 30 days; anything else fails the enqueue with a ValueError.
        """
        return None

    def backoff(self) -> Backoff | None:
        """The retry curve for this job; `None` uses the worker's."""
        return None

    def max_attempts(self) -> int | None:
        """Failed executions (errors, timeouts, expired leases) before the job fails for
        good; pauses and releases never count. `None` leaves it to the worker's `backstop`,
        which also caps this when it is lower. From 1 to 2**31 - 1."""
        return None

    def timeout(self) -> Seconds | None:
        """How long one run may take: a run still going then is cancelled (its context's
        `cancel_reason` is TIMEOUT) and counts as a failed execution, recorded as a timeout.
        `None` (the default): no limit. The job's lease is at least this plus a minute.
        Above 0, at most 29 days."""
        return None

    def priority(self) -> Priority:
        """The claim tier; `Queue.enqueue(priority=...)` overrides it per job."""
        return Priority.NORMAL

    def dedup_key(self) -> DedupKey | None:
        """A candidacy key: an enqueue colliding with a pending job of the same KIND and key
        calls `merge`. None (the default) never coalesces."""
        return None

    def merge(self, existing: Pending[Any]) -> Merge:
        """Decide what a colliding enqueue does (default: replace the pending payload)."""
        return Merge.replace()

    def unique_for(self) -> Seconds | None:
        """How long a job of this task holds its `unique_id()` at most (seconds or a
        timedelta); None (the default): jobs are not unique.

        While a job of this KIND holds the id (it is queued or running, and `unique_for` has
        not passed since its enqueue), an enqueue of the same id stores nothing and returns
        the holder's id. The hold ends when the job finishes, or after `unique_for` even if it
        still waits. Set both methods, or neither.
        """
        return None

    def unique_id(self) -> str | None:
        """What makes two jobs of this KIND the same, for `unique_for()`: a str without NUL,
        at most 2,000 bytes of UTF-8 (hash a longer identity)."""
        return None


_encrypted_kinds: set[str] = set()
"""KINDs of task classes marked ENCRYPTED (a codec seals by KIND: a carry is not a task)."""


def is_encrypted_kind(kind: str) -> bool:
    """Whether a task class with this KIND is marked ENCRYPTED."""
    return kind in _encrypted_kinds


def kind_of(task_type: type[Task[Any]]) -> str:
    """Validate a task class and return its KIND, or raise a TypeError/ValueError naming it."""
    if not isinstance(task_type, type) or not issubclass(task_type, Task):
        raise TypeError(f"expected a Task subclass, got {task_type!r}")
    kind = task_type.__dict__.get("KIND")
    if kind is None:
        inherited = getattr(task_type, "KIND", None)
        if isinstance(inherited, str):
            owner = next((k for k in task_type.__mro__ if "KIND" in vars(k)), task_type)
            raise TypeError(
                f"{task_type.__qualname__} inherits KIND {inherited!r} from "
                f"{owner.__qualname__}: each task class declares its own KIND (its jobs "
                f"would otherwise be handled as {owner.__qualname__}, without its own fields)"
            )
    if not isinstance(kind, str):
        raise TypeError(f"{task_type.__qualname__} must define KIND as a string class attribute")
    if not KIND_PATTERN.fullmatch(kind):
        raise ValueError(f"{task_type.__qualname__}.KIND {kind!r} is invalid: expected {NAME_RULE}")
    if not dataclasses.is_dataclass(task_type) and not hasattr(task_type, "__struct_fields__"):
        raise TypeError(f"{task_type.__qualname__} must be a dataclass (or a msgspec Struct)")
    return kind


def carry_type_of(task_type: type[Task[Any]]) -> type[Any] | None:
    """The `C` of `Task[C]` somewhere in the class's bases, or None for carry-less tasks."""
    for klass in task_type.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            if typing.get_origin(base) is Task:
                (arg,) = typing.get_args(base)
                if arg is type(None) or isinstance(arg, typing.TypeVar | TypeVar):
                    return None
                if not isinstance(arg, type):
                    raise TypeError(
                        f"{task_type.__qualname__}: the carry type must be a class, got {arg!r}"
                    )
                return arg
    return None
