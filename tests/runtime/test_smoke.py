from __future__ import annotations

from dataclasses import dataclass

from venturi import Context, JobStatus, Outcome, Queue, Task, Worker

from .helpers import running, until_status


@dataclass
class Hello(Task):
    KIND = "hello"
    name: str


async def test_enqueue_and_complete(queue: Queue) -> None:
    seen: list[str] = []

    async def handle(task: Hello, ctx: Context[None], app: None) -> Outcome:
        seen.append(task.name)
        return Outcome.completed(note="hi")

    worker = Worker(None, queue.store, concurrency=2)
    worker.register(Hello, handle)
    job_id = await queue.enqueue(Hello(name="ada"))
    async with running(worker):
        await until_status(queue, job_id, JobStatus.COMPLETED)
    assert seen == ["ada"]
    journal = await queue.job_journal(job_id)
    assert [e.outcome for e in journal] == ["completed"]
    assert journal[0].note == "hi"
