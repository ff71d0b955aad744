"""Celery with Redis as its broker, through its public API, set up as its docs show.

* Broker: the harness's private Redis (``BENCH_REDIS_URL``, see ``bench/redis_server.py``),
  Celery's Redis transport (kombu), every setting at Celery's default except
  ``task_acks_late=True``: a message is acknowledged after its task ran, not when a worker
  takes it, which is Celery's at-least-once mode (the default acknowledges first and loses
  a job whose worker dies). No result backend (Celery's default: results are not stored).
* Durability differs from every other system here: a job is a Redis list entry, not a row
  committed with the application's own transaction, and Redis writes it to its append-only
  file fsynced once a second.
* Enqueue: ``task.delay(enqueued_at=...)``, one message per call. Celery has no batch enqueue
  (``group()`` and ``chunks()`` publish one message per task), so the bulk scenarios are
  reported as not applicable and the drain's N jobs are enqueued one by one beforehand.
* Worker: ``app.Worker(concurrency=c)`` with the default prefork pool (c child processes),
  what ``celery worker --concurrency c`` starts; every other worker setting is the default
  (prefetch multiplier 4, heartbeat, gossip, mingle). Handlers run in the pool's children, so
  the recorder lives in shared memory, and RSS/CPU are summed over the worker and its
  children (``bench/harness.py``).
* "Outstanding" = messages in the queue's list or in the transport's ``unacked`` hash.
* A fresh broker per measurement: ``install`` empties the Redis database.
* The 1,000,000-job backlog: the API writes the template (500 jobs per kind) and copies of
  those messages, each with a fresh task id and delivery tag, are pushed through a pipeline,
  as the other systems clone rows.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing
import os
import signal
import threading
import uuid
from importlib.metadata import version
from pathlib import Path
from typing import Any, TextIO

import redis
from celery import Celery, signals

from bench.adapters.base import OnStart, System, Unsupported, kind_name
from bench.harness import now

MAX_KINDS = 20
QUEUE = "celery"  # Celery's default queue; its Redis list has the same name
UNACKED = "unacked"  # kombu's Redis transport: messages delivered and not yet acknowledged
CLONE_PIPELINE = 10_000
PR_SET_PDEATHSIG = 1  # prctl(2)


def _make_app() -> Celery:
    app = Celery("bench_celery", broker=os.environ["BENCH_REDIS_URL"])
    app.conf.update(
        task_acks_late=True,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    return app


class SharedRecorder:
    """:class:`bench.harness.JobRecorder` for a pool of forked processes: the pairs and the
    count live in shared memory created before the pool forks, so every child writes into
    the same array and the parent saves it once the pool has stopped."""

    def __init__(self, capacity: int, notify_at: int, stop_at: int, proto_fd: int) -> None:
        self.capacity = capacity
        self.pairs = multiprocessing.RawArray("d", 2 * capacity)
        self.started = multiprocessing.RawValue("q", 0)
        self.lock = multiprocessing.Lock()
        self.notify_at = notify_at
        self.stop_at = stop_at
        self.proto_fd = proto_fd
        self.parent = os.getpid()

    def record(self, enqueued_at: float) -> None:
        started_at = now()
        with self.lock:
            index = self.started.value
            self.started.value = index + 1
            if index < self.capacity:
                self.pairs[2 * index] = enqueued_at
                self.pairs[2 * index + 1] = started_at
        count = index + 1
        if count == self.notify_at:
            event = {"event": "reached", "count": count, "t": now()}
            os.write(self.proto_fd, (json.dumps(event) + "\n").encode())
        if count == self.stop_at:
            os.kill(self.parent, signal.SIGTERM)  # Celery's warm shutdown

    @property
    def count(self) -> int:
        return min(int(self.started.value), self.capacity)

    def save(self, path: Path) -> None:
        with open(path, "wb") as fh:
            fh.write(memoryview(self.pairs).cast("B")[: 16 * self.count])


_recorder: SharedRecorder | None = None
app = _make_app() if "BENCH_REDIS_URL" in os.environ else Celery("bench_celery")


def _noop(enqueued_at: float) -> None:
    assert _recorder is not None, "the producer side never runs jobs"
    _recorder.record(enqueued_at)


for _kind in range(MAX_KINDS):
    app.task(name=kind_name(_kind))(_noop)


class CelerySystem(System):
    name = "celery"
    jobs_table = QUEUE

    def __init__(self) -> None:
        self._redis: redis.Redis | None = None

    def versions(self) -> dict[str, str]:
        return {
            "celery": version("celery"),
            "kombu": version("kombu"),
            "redis-py": version("redis"),
            "billiard": version("billiard"),
        }

    @property
    def redis(self) -> redis.Redis:
        assert self._redis is not None, "open() first"
        return self._redis

    async def open(self, dsn: str) -> None:
        # ``dsn`` is the harness's PostgreSQL database, unused: Celery's jobs live in Redis.
        self._redis = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=3)

    async def close(self) -> None:
        if self._redis is not None:
            self._redis.close()

    async def install(self) -> None:
        self.redis.flushdb()

    async def enqueue(self, kind: int, enqueued_at: float) -> None:
        app.tasks[kind_name(kind)].delay(enqueued_at=enqueued_at)

    async def enqueue_many(self, kind: int, count: int, enqueued_at: float) -> None:
        raise Unsupported(
            "Celery has no batch enqueue (group() and chunks() publish one message per task)"
        )

    async def sql(self, query: str) -> Any:
        raise Unsupported("Celery keeps its jobs in Redis")

    def outstanding_sql(self) -> str:
        raise Unsupported("Celery keeps its jobs in Redis")

    async def outstanding(self) -> bool:
        pipe = self.redis.pipeline(transaction=False)
        pipe.llen(QUEUE)
        pipe.hlen(UNACKED)
        queued, unacked = pipe.execute()
        return bool(queued or unacked)

    async def stats(self) -> object:
        raise Unsupported(
            "Celery has no queue-statistics call (inspect() reports only what workers hold; "
            "its users read the broker, e.g. LLEN)"
        )

    async def checkpoint(self) -> None:
        # Nothing to flush: Redis appends every write to its AOF and fsyncs it every second.
        return None

    async def clone_backlog(self, total: int) -> int:
        template: list[bytes] = self.redis.lrange(QUEUE, 0, -1)
        missing = total - len(template)
        ids = []
        for raw in template:
            message = json.loads(raw)
            ids.append((message["headers"]["id"], message["properties"]["delivery_tag"]))
        pipe = self.redis.pipeline(transaction=False)
        for i in range(max(0, missing)):
            text = template[i % len(template)].decode()
            task_id, tag = ids[i % len(template)]
            # The task id also stands in root_id and correlation_id: all get the fresh one.
            clone = text.replace(task_id, str(uuid.uuid4())).replace(tag, str(uuid.uuid4()))
            pipe.lpush(QUEUE, clone)
            if (i + 1) % CLONE_PIPELINE == 0:
                pipe.execute()
        pipe.execute()
        return int(self.redis.llen(QUEUE))

    async def run_worker(
        self,
        dsn: str,
        concurrency: int,
        kinds: int,
        on_start: OnStart,
        shutdown: Any,
    ) -> None:
        raise NotImplementedError("Celery's worker is not a coroutine: see serve_worker")

    def serve_worker(self, args: argparse.Namespace, proto: TextIO) -> None:
        global _recorder
        capacity = 2 * max(args.notify_at, args.stop_at, 1) + 10_000
        _recorder = SharedRecorder(capacity, args.notify_at, args.stop_at, proto.fileno())

        def emit(event: dict[str, Any]) -> None:
            proto.write(json.dumps(event) + "\n")
            proto.flush()

        @signals.worker_ready.connect(weak=False)
        def ready(**_kwargs: Any) -> None:
            emit({"event": "ready", "pid": os.getpid(), "t": now()})

        @signals.worker_process_init.connect(weak=False)
        def child_dies_with_parent(**_kwargs: Any) -> None:
            # A pool child must not outlive a worker that was killed outright.
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

        def watch_stdin() -> None:
            # A "stop" line, or EOF because the orchestrator went away: either way, a warm
            # shutdown (running tasks finish, reserved messages go back to the queue). Read
            # from the raw descriptor: a thread blocked in sys.stdin holds its buffer's lock,
            # which a forked pool child would then wait for forever.
            pending = b""
            while chunk := os.read(0, 4096):
                pending += chunk
                if b"stop" in pending:
                    break
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=watch_stdin, daemon=True).start()
        worker = app.Worker(
            concurrency=args.concurrency, pool="prefork", loglevel="WARNING", quiet=True
        )
        worker.start()
        _recorder.save(Path(args.timings))
        emit({"event": "stopped", "count": _recorder.count, "t": now()})


SYSTEM = CelerySystem()
