"""Encrypted payloads against the real PostgreSQL: sealed at rest (payload and carry), opened
only by a worker with the key, bound to the job and kind, rotated and rekeyed; listings,
the journal and logs never see the plaintext; unencrypted tasks are stored as before."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Literal

import msgspec
import pytest
from ulid import ULID

from venturi import (
    Context,
    DedupKey,
    JobStatus,
    KeyRing,
    Merge,
    Outcome,
    PayloadError,
    Pending,
    PostgresStore,
    Queue,
    SealedCodec,
    Task,
    Worker,
)
from venturi.encryption import MARKER, new_key

from .helpers import running, until_status

SECRET = "4111-1111-1111-1111"  # a card number: must never be stored or shown in the clear


@dataclass
class Seen:
    runs: list[str] = field(default_factory=list)


@dataclass
class Charge(Task[Seen]):
    KIND = "charge"
    ENCRYPTED = True
    card: str
    times: int = 1


@dataclass
class Refund(Task[Seen]):
    KIND = "refund_enc"
    ENCRYPTED = True
    order: int
    card: str

    def dedup_key(self) -> DedupKey | None:
        return DedupKey(self.order)

    def merge(self, existing: Pending[Refund]) -> Merge:
        return Merge.replace()


@dataclass
class Plain(Task):
    KIND = "plain_note"
    text: str


def ring(*ids: str) -> KeyRing:
    return KeyRing({i: KEYS[i] for i in ids})


KEYS = {"k1": new_key(), "k2": new_key(), "k3": new_key()}


async def raw(store: PostgresStore, job_id: object, column: str = "payload") -> str | None:
    value: str | None = await store._pool_or_raise().fetchval(
        f"SELECT {column}::text FROM {store.prefix}_jobs WHERE id = $1", job_id
    )
    return value


def key_of(text: str | None) -> str:
    assert text is not None
    envelope = msgspec.json.decode(text)
    assert set(envelope) == {MARKER}
    return str(envelope[MARKER]).partition(":")[0]


async def charge_worker(
    store: PostgresStore, codec: SealedCodec, seen: list[tuple[str, list[str]]]
) -> Worker[None]:
    async def handle(task: Charge, ctx: Context[Seen], app: None) -> Outcome:
        seen.append((task.card, list(ctx.carry.runs)))
        ctx.carry.runs.append(f"{task.card}#{len(ctx.carry.runs)}")
        if len(ctx.carry.runs) < task.times:
            return Outcome.pause_in(0)
        return Outcome.completed()

    worker: Worker[None] = Worker(None, store, concurrency=2, codec=codec)
    worker.register(Charge, handle)
    return worker


async def test_payload_and_carry_are_sealed_at_rest_and_open_in_the_worker(
    store: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    codec = SealedCodec(ring("k1"))
    queue = Queue(store, codec=codec)
    job_id = await queue.enqueue(Charge(SECRET, times=2))
    stored = await raw(store, job_id.to_uuid())
    assert SECRET not in (stored or "") and key_of(stored) == "k1"

    seen: list[tuple[str, list[str]]] = []
    caplog.set_level(logging.DEBUG, logger="venturi")
    async with running(await charge_worker(store, codec, seen)):
        await until_status(queue, job_id, JobStatus.COMPLETED)
    assert seen == [(SECRET, []), (SECRET, [f"{SECRET}#0"])]  # the carry came back opened

    carry = await raw(store, job_id.to_uuid(), "carry")
    assert SECRET not in (carry or "") and key_of(carry) == "k1"
    for listing in (queue, Queue(store)):  # the sealing codec, and plain JSON
        job = await listing.job(job_id)
        assert job is not None
        assert job.payload == {MARKER: "k1"} and job.carry == {MARKER: "k1"}  # never opened
    journal = await queue.job_journal(job_id)
    assert SECRET not in repr(journal)
    assert SECRET not in caplog.text


async def test_a_value_copied_to_another_job_does_not_open(store: PostgresStore) -> None:
    codec = SealedCodec(ring("k1"))
    queue = Queue(store, codec=codec)
    victim = await queue.enqueue(Charge(SECRET))
    thief = await queue.enqueue(Charge("0000"))
    await store._pool_or_raise().execute(
        f"UPDATE {store.prefix}_jobs SET payload = (SELECT payload FROM {store.prefix}_jobs "
        "WHERE id = $1) WHERE id = $2",
        victim.to_uuid(),
        thief.to_uuid(),
    )
    seen: list[tuple[str, list[str]]] = []
    async with running(await charge_worker(store, codec, seen)):
        await until_status(queue, thief, JobStatus.DEAD)
        await until_status(queue, victim, JobStatus.COMPLETED)
    assert seen == [(SECRET, [])]  # only the victim's own job ran with its card
    job = await queue.job(thief)
    assert job is not None and job.run_count == 1  # dead at once, not retried
    assert "sealed for another job or kind" in (job.last_error or "")


async def test_a_key_the_ring_lacks_fails_the_job_for_good_at_once(store: PostgresStore) -> None:
    job_id = await Queue(store, codec=SealedCodec(ring("k1"))).enqueue(Charge(SECRET))
    queue = Queue(store, codec=SealedCodec(ring("k2")))
    seen: list[tuple[str, list[str]]] = []
    async with running(await charge_worker(store, SealedCodec(ring("k2")), seen)):
        await until_status(queue, job_id, JobStatus.DEAD)
    job = await queue.job(job_id)
    assert job is not None and job.run_count == 1 and seen == []
    assert "key 'k1', which is not in the key ring (it has 'k2')" in (job.last_error or "")
    assert SECRET not in (job.last_error or "")


@dataclass
class NarrowedCharge(Task[Seen]):
    """`Charge` as the next release declares it: the card's field narrowed to a Literal,
    which a stored value no longer fits."""

    KIND = "charge"
    ENCRYPTED = True
    card: Literal["visa", "amex"]
    times: int = 1


async def test_a_payload_that_no_longer_fits_fails_without_quoting_the_plaintext(
    store: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    codec = SealedCodec(ring("k1"))
    queue = Queue(store, codec=codec)
    job_id = await queue.enqueue(Charge(SECRET))
    worker: Worker[None] = Worker(None, store, codec=codec)
    worker.register(NarrowedCharge, lambda task, ctx, app: None)  # type: ignore[arg-type,return-value]
    caplog.set_level(logging.DEBUG, logger="venturi")
    async with running(worker):
        await until_status(queue, job_id, JobStatus.DEAD)
    job = await queue.job(job_id)
    assert job is not None and job.last_error is not None
    # msgspec's own message quotes the value ("Invalid enum value '4111-...'"): withheld.
    assert "does not fit the task class at `$.card`" in job.last_error
    assert SECRET not in job.last_error
    assert SECRET not in repr(await queue.job_journal(job_id))
    assert SECRET not in caplog.text


async def test_a_worker_without_keys_says_so(store: PostgresStore) -> None:
    job_id = await Queue(store, codec=SealedCodec(ring("k1"))).enqueue(Charge(SECRET))

    @dataclass
    class SameKind(Task):  # a plain task class reading the same KIND, with a JSON codec
        KIND = "charge"
        card: str

    async def handle(task: SameKind, ctx: Context[None], app: None) -> None:
        raise AssertionError("must not run")

    worker: Worker[None] = Worker(None, store, concurrency=1)
    worker.register(SameKind, handle)
    queue = Queue(store)
    async with running(worker):
        await until_status(queue, job_id, JobStatus.DEAD)
    job = await queue.job(job_id)
    assert job is not None
    assert "encrypted, and this codec has no key ring" in (job.last_error or "")


async def test_an_encrypted_task_needs_a_sealing_codec(store: PostgresStore) -> None:
    with pytest.raises(PayloadError, match="charge is an encrypted task"):
        await Queue(store).enqueue(Charge(SECRET))
    with pytest.raises(PayloadError, match="charge is an encrypted task"):
        await Queue(store).enqueue_many([Charge(SECRET), Charge(SECRET)])
    assert await Queue(store).jobs() == []  # nothing was stored
    with pytest.raises(TypeError, match="needs the Worker's codec=SealedCodec"):
        Worker(None, store).register(Charge)


async def test_unencrypted_tasks_are_stored_as_before(store: PostgresStore) -> None:
    queue = Queue(store, codec=SealedCodec(ring("k1")))
    ids = await queue.enqueue_many([Plain("a"), Plain("b")])
    one = await queue.enqueue(Plain("c"))
    for job_id in [*ids, one]:
        assert MARKER not in (await raw(store, job_id.to_uuid()) or "")
    job = await queue.job(one)
    assert job is not None and job.payload == {"text": "c"}


async def test_a_merge_seals_for_the_job_that_keeps_the_payload(store: PostgresStore) -> None:
    codec = SealedCodec(ring("k1"))
    queue = Queue(store, codec=codec)
    holder = await queue.enqueue(Refund(1, "old-card"))
    assert await queue.enqueue(Refund(1, SECRET)) == holder  # replace: the new card wins
    seen: list[str] = []

    async def handle(task: Refund, ctx: Context[Seen], app: None) -> None:
        seen.append(task.card)

    worker: Worker[None] = Worker(None, store, concurrency=1, codec=codec)
    worker.register(Refund, handle)
    async with running(worker):
        await until_status(queue, holder, JobStatus.COMPLETED)
    assert seen == [SECRET]


async def rekey(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "venturi", "rekey", "--json"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


async def test_rotation_then_rekey_retires_the_old_key(store: PostgresStore, pg_dsn: str) -> None:
    old = await Queue(store, codec=SealedCodec(ring("k1"))).enqueue(Charge(SECRET, times=5))
    rotated = SealedCodec(ring("k2", "k1"))  # k2 current, k1 still opens
    queue = Queue(store, codec=rotated)
    new = await queue.enqueue(Charge("5500-0000"))
    assert key_of(await raw(store, new.to_uuid())) == "k2"
    assert key_of(await raw(store, old.to_uuid())) == "k1"

    env = {
        **os.environ,
        "VENTURI_DSN": pg_dsn,
        "VENTURI_PREFIX": store.prefix,
        "VENTURI_KEYS": f"k2={KEYS['k2']},\nk1={KEYS['k1']}",
    }
    done = await rekey(env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"rewritten": 1, "current_key": "k2"}
    assert key_of(await raw(store, old.to_uuid())) == "k2"
    again = await rekey(env)
    assert json.loads(again.stdout)["rewritten"] == 0

    seen: list[tuple[str, list[str]]] = []
    async with running(await charge_worker(store, SealedCodec(ring("k2")), seen)):  # k1 gone
        await until_status(queue, old, JobStatus.PENDING, JobStatus.COMPLETED)
        await until_status(queue, new, JobStatus.COMPLETED)
    assert (SECRET, []) in seen


async def test_rekey_goes_past_a_value_that_does_not_open_and_names_it(
    store: PostgresStore,
) -> None:
    lost = await Queue(store, codec=SealedCodec(ring("k3"))).enqueue(Charge(SECRET))  # k3 dropped
    old = [await Queue(store, codec=SealedCodec(ring("k1"))).enqueue(Charge(SECRET)) for _ in "ab"]
    queue = Queue(store, codec=SealedCodec(ring("k2", "k1")))
    with pytest.raises(ValueError, match="did not open") as raised:
        await queue.rekey(batch_size=1)
    message = str(raised.value)
    assert "rewrote 2 jobs with key 'k2', but 1 did not open" in message
    assert f"job {lost} (charge): sealed with key 'k3'" in message
    assert SECRET not in message
    assert [key_of(await raw(store, j.to_uuid())) for j in old] == ["k2", "k2"]
    assert key_of(await raw(store, lost.to_uuid())) == "k3"  # left as it was


def test_key_ring_errors_name_the_key_never_its_bytes() -> None:
    short = base64.b64encode(b"x" * 16).decode()
    with pytest.raises(ValueError, match="key 'k1' is 16 bytes; AES-256 needs 32") as info:
        KeyRing({"k1": short})
    assert short not in str(info.value)
    with pytest.raises(ValueError, match="key 'k1' is not valid base64"):
        KeyRing({"k1": "not base64!"})
    with pytest.raises(ValueError, match="key id 'k1' appears twice"):
        KeyRing.parse(f"k1={KEYS['k1']},k1={KEYS['k2']}")
    with pytest.raises(ValueError, match="entry 2 is not id=base64key"):
        KeyRing.parse(f"k1={KEYS['k1']},oops")
    with pytest.raises(ValueError, match="the id of key 1 is not 1-64 letters") as info:
        KeyRing({"a b": KEYS["k1"]})
    assert "a b" not in str(info.value)
    # A bare key (as `venturi keygen` prints it), where an id=key entry belongs: its text,
    # taken for an id, is never echoed, with or without its padding.
    for bare in (KEYS["k1"], KEYS["k1"].rstrip("=")):
        with pytest.raises(ValueError, match="entry 1 is not id=base64key \\(a bare key") as info:
            KeyRing.parse(bare)
        assert KEYS["k1"].rstrip("=")[:8] not in str(info.value)
    with pytest.raises(ValueError, match="the id of key 1 is not") as info:
        KeyRing({KEYS["k1"]: KEYS["k2"]})
    assert KEYS["k1"][:8] not in str(info.value)
    with pytest.raises(ValueError, match=r"\$VENTURI_KEYS_UNSET is not set"):
        KeyRing.from_env("VENTURI_KEYS_UNSET")
    os.environ["VENTURI_KEYS_EMPTY"] = " "
    try:
        with pytest.raises(ValueError, match=r"\$VENTURI_KEYS_EMPTY is empty"):
            KeyRing.from_env("VENTURI_KEYS_EMPTY")
    finally:
        del os.environ["VENTURI_KEYS_EMPTY"]


def test_a_malformed_envelope_is_named_as_such() -> None:
    codec = SealedCodec(ring("k1"))
    with pytest.raises(ValueError, match="malformed encrypted envelope"):
        codec.decode(Charge, '{"venturi:sealed": 5}', kind="charge", job_id=ULID())
