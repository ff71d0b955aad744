"""Batches: jobs that run side by side and are counted together, with callback jobs for the
end (`Queue.batch`).

    batch = queue.batch("monthly-statements")
    batch.add(*(Statement(customer) for customer in customers))
    batch.then(AllSent()).catch(TellAdmin()).finally_(Unlock())
    batch_id = await batch.enqueue()

- `then` runs if every member completed; `catch` at the first member that fails for good
  (dead), which also cancels the members not started yet, unless `allow_failures()`;
  `finally` when every member has finished, either way. Each runs exactly once: it is stored
  with the batch (status waiting) and released by the transaction that settles the member
  deciding it; one whose condition did not hold ends cancelled.
- Callbacks are jobs, not closures (a closure cannot be stored). Members and callbacks read
  their batch as `ctx.batch_id`.
- `Queue.batch_status(id)` reads progress from the batch's row (counters kept in the same
  transaction as each member's settle); `cancel_batch(id)` skips the members not started
  yet; `recent_batches(n)`; `prune_batches(older_than)` or `Retention(batches=...)` deletes
  finished batches (their jobs stay, for the jobs' own retention).

The counting is a row trigger of migration 0013; this module only gathers what to store.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal

from ulid import ULID

from venturi._shown import shown
from venturi.postgres import Connection
from venturi.task import Task

Callback = Literal["then", "catch", "finally"]
NAME_MAX_CHARS = 200
"""Longest batch name: it is shown, not searched."""


class Batch:
    """A batch being put together: `add` members, set callbacks, then `await enqueue()`.
    Made by `Queue.batch(name)`; every method but `enqueue` returns the batch, so calls chain.
    """

    def __init__(
        self,
        name: str,
        submit: Callable[[Batch, Connection | None], Awaitable[ULID]],
    ) -> None:
        if (
            not isinstance(name, str)
            or not name.strip()
            or len(name) > NAME_MAX_CHARS
            or "\x00" in name  # PostgreSQL's text cannot hold it
        ):
            raise ValueError(
                f"batch name: expected a non-blank string of at most {NAME_MAX_CHARS} "
                f"characters without NUL, got {shown(name)}"
            )
        self.name = name
        self.members: list[Task[Any]] = []
        self.callbacks: dict[Callback, Task[Any]] = {}
        self.failures_allowed = False
        self._submit = submit
        self._enqueued: ULID | None = None

    def add(self, *tasks: Task[Any]) -> Batch:
        """Add members (tasks; each in its own KIND's queue unless `Queue.batch(queue=)`)."""
        self._check_open()
        for task in tasks:
            _check_task(task, "add")
        self.members.extend(tasks)
        return self

    def then(self, task: Task[Any]) -> Batch:
        """Enqueue `task` when every member has completed (none failed or was cancelled)."""
        return self._callback("then", task)

    def catch(self, task: Task[Any]) -> Batch:
        """Enqueue `task` at the first member that fails for good."""
        return self._callback("catch", task)

    def finally_(self, task: Task[Any]) -> Batch:
        """Enqueue `task` when every member has finished (completed, failed or cancelled)."""
        return self._callback("finally", task)

    def allow_failures(self, allow: bool = True) -> Batch:
        """Keep running the other members after one fails for good (`catch` still runs at
        the first failure, and `then` only if none failed)."""
        self._check_open()
        self.failures_allowed = bool(allow)
        return self

    async def enqueue(self, *, conn: Connection | None = None) -> ULID:
        """Store the batch, its members and its callbacks in one transaction (`conn=`: the
        caller's, so the batch exists only if it commits); returns the batch's id. A batch
        is enqueued once; a batch without members finishes at once (`then` and `finally`
        are released)."""
        self._check_open()
        self._enqueued = await self._submit(self, conn)
        return self._enqueued

    def _check_open(self) -> None:
        if self._enqueued is not None:
            raise RuntimeError(
                f"batch {self.name!r} was enqueued already, as {self._enqueued}: start a new "
                "one with Queue.batch"
            )

    def _callback(self, which: Callback, task: Task[Any]) -> Batch:
        self._check_open()
        _check_task(task, which if which != "finally" else "finally_")
        if which in self.callbacks:
            raise ValueError(f"batch {self.name!r}: {which} is set already (one task each)")
        self.callbacks[which] = task
        return self


def _check_task(task: object, method: str) -> None:
    if not isinstance(task, Task):
        raise TypeError(f"Batch.{method}: expected a venturi.Task instance, got {shown(task)}")
