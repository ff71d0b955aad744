"""A codec of one's own: the queue encodes with it, the worker decodes with it, listings and
merges read through it."""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
import pytest
from ulid import ULID

import venturi.codec
from venturi import (
    Codec,
    Context,
    DedupKey,
    JobStatus,
    JsonCodec,
    Merge,
    Outcome,
    PayloadError,
    Pending,
    PostgresStore,
    Queue,
    Task,
    Worker,
)

from .helpers import running, until_status

T = TypeVar("T")


class Envelope:
    """Stores every value as {"$b64": "<base64 of its JSON>"}: what an encrypting codec does,
    without the key."""

    def __init__(self) -> None:
        self.inner = JsonCodec()

    def encode(
        self,
        value: Any,
        *,
        role: str = "payload",
        kind: str = "",
        job_id: ULID | uuid.UUID | None = None,
    ) -> str:
        text = self.inner.encode(value, role=role, kind=kind)
        return msgspec.json.encode({"$b64": base64.b64encode(text.encode()).decode()}).decode()

    def decode(
        self,
        target: type[T],
        data: str | bytes,
        *,
        kind: str = "",
        job_id: ULID | uuid.UUID | None = None,
    ) -> T:
        return self.inner.decode(target, self._open(data))

    def decode_any(self, data: str | bytes) -> Any:
        return self.inner.decode_any(self._open(data))

    @staticmethod
    def _open(data: str | bytes) -> bytes:
        envelope = msgspec.json.decode(data)
        if not isinstance(envelope, dict) or "$b64" not in envelope:
            raise ValueError("not an envelope")
        return base64.b64decode(envelope["$b64"])


@dataclass
class Steps:
    done: list[int] = field(default_factory=list)


@dataclass
class Walk(Task[Steps]):
    KIND = "walk"
    user: int
    steps: int

    def dedup_key(self) -> DedupKey | None:
        return DedupKey(self.user)

    def merge(self, existing: Pending[Walk]) -> Merge:
        return Merge.with_(Walk(self.user, existing.task.steps + self.steps))


async def test_a_codec_of_ones_own_is_used_end_to_end(store: PostgresStore) -> None:
    codec: Codec = Envelope()
    queue = Queue(store, codec=codec)
    job_id = await queue.enqueue(Walk(7, 1))
    assert await queue.enqueue(Walk(7, 1)) == job_id  # the merge decoded the stored task
    stored = await store._pool.fetchval(
        f"SELECT payload::text FROM {store.prefix}_jobs WHERE id = $1", job_id.to_uuid()
    )
    assert set(msgspec.json.decode(stored)) == {"$b64"}  # no field is stored in the clear
    job = await queue.job(job_id)
    assert job is not None and job.payload == {"user": 7, "steps": 2}

    seen: list[tuple[int, list[int]]] = []

    async def handle(task: Walk, ctx: Context[Steps], app: None) -> Outcome:
        seen.append((task.steps, list(ctx.carry.done)))
        ctx.carry.done.append(len(ctx.carry.done))
        if len(ctx.carry.done) < task.steps:
            return Outcome.pause_in(0)
        return Outcome.completed()

    worker = Worker(None, store, codec=codec)
    worker.register(Walk, handle)
    async with running(worker):
        await until_status(queue, job_id, JobStatus.COMPLETED)
    assert seen == [(2, []), (2, [0])]  # the carry went through the codec and back
    job = await queue.job(job_id)  # the carry as the pause saved it (completing keeps it)
    assert job is not None and job.carry == {"done": [0]}
    carry = await store._pool.fetchval(
        f"SELECT carry::text FROM {store.prefix}_jobs WHERE id = $1", job_id.to_uuid()
    )
    assert set(msgspec.json.decode(carry)) == {"$b64"}


async def test_a_worker_with_another_codec_cannot_read_the_jobs(store: PostgresStore) -> None:
    queue = Queue(store, codec=Envelope())
    job_id = await queue.enqueue(Walk(1, 1))

    async def handle(task: Walk, ctx: Context[Steps], app: None) -> None:
        raise AssertionError("decoded with the wrong codec")

    worker = Worker(None, store)  # the default JSON codec: sees an envelope, not a Walk
    worker.register(Walk, handle)
    async with running(worker):
        await until_status(queue, job_id, JobStatus.DEAD)
    job = await queue.job(job_id)
    assert job is not None and job.last_error is not None
    assert job.last_error.startswith("undecodable payload for kind 'walk'")


def test_a_payload_larger_than_jsonb_holds_is_a_payload_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The real bound is 268,435,455 bytes; a small one here spares the test the memory.
    monkeypatch.setattr(venturi.codec, "MAX_JSON_BYTES", 1000)
    with pytest.raises(PayloadError, match=r"payload of Big \(big\): 2,0\d\d bytes of JSON, more"):
        JsonCodec().encode(Big("x" * 2000), kind="big")
    JsonCodec().encode(Big("x" * 900), kind="big")  # under it: fine


@dataclass
class Big(Task):
    KIND = "big"
    blob: str
