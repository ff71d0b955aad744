"""The worker factory that examples/worker.yaml runs: `venturi worker myapp.jobs:make_worker`.

`venturi worker` connects to VENTURI_DSN, calls `make_worker(store)` and runs the Worker until
SIGTERM, then drains (shutdown_timeout) before the pod's terminationGracePeriodSeconds ends.
"""

from __future__ import annotations

from dataclasses import dataclass

from venturi import Context, Outcome, PostgresStore, Task, Worker


@dataclass
class SendEmail(Task):
    KIND = "send_email"
    to: str
    subject: str


async def send_email(task: SendEmail, ctx: Context[None], app: None) -> Outcome:
    print(f"sending {task.subject!r} to {task.to}")
    return Outcome.completed()


def make_worker(store: PostgresStore) -> Worker[None]:
    # concurrency is what the JobQueue's targetPerReplica counts on (examples/jobqueue.yaml);
    # metrics_port serves /metrics for examples/monitoring/worker-podmonitor.yaml.
    worker = Worker(None, store, concurrency=16, shutdown_timeout=30, metrics_port=9100)
    worker.register(SendEmail, send_email)
    return worker
