"""A worker factory for the `venturi worker` command test."""

from __future__ import annotations

from dataclasses import dataclass

from venturi import Context, Outcome, PostgresStore, Task, Worker


@dataclass
class Echo(Task):
    KIND = "echo"
    text: str


async def echo(task: Echo, ctx: Context[None], app: None) -> Outcome:
    return Outcome.completed(note=task.text)


def make_worker(store: PostgresStore) -> Worker[None]:
    worker = Worker(None, store, concurrency=2)
    worker.register(Echo, echo)
    return worker
