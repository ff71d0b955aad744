"""Encrypted payloads: tasks marked `ENCRYPTED = True` are stored sealed with AES-256-GCM.

A `KeyRing` holds named 256-bit keys; the first is current (new jobs are sealed with it), the
others only open what they sealed earlier, so keys rotate without a flag day: put a new key
first, deploy, run `venturi rekey`, then drop the old key. Each sealed value names its key id
and binds the job's id and KIND as associated data, so a ciphertext copied to another job or
kind does not open.

`SealedCodec(ring)` is the codec to give the `Queue` and the `Worker` (`codec=`). It seals the
payload and carry of encrypted tasks only: other tasks go through the inner codec untouched.
Listings (`queue.job()`, `jobs()`, the CLI, a dashboard) never decrypt: a sealed value is shown
as `{"venturi:sealed": "<key id>"}`.

Stored form: the JSON object `{"venturi:sealed": "<key id>:<base64 of nonce + ciphertext>"}`.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import secrets
import uuid
from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec
from ulid import ULID

from venturi.codec import DEFAULT_CODEC, SEALED_MARKER, Codec, looks_sealed, sealed_key
from venturi.errors import PayloadError
from venturi.task import is_encrypted_kind

T = TypeVar("T")

KEYS_ENV = "VENTURI_KEYS"
"""The environment variable `KeyRing.from_env()` reads: `id=base64key,id=base64key`, the
current key first."""

MARKER = SEALED_MARKER
_KEY_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_NONCE = 12


def _aesgcm() -> Any:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        raise ImportError(
            "encrypted payloads need the cryptography package: pip install venturi[encryption]"
        ) from None
    return AESGCM


def new_key() -> str:
    """A fresh random 256-bit key, base64-encoded (what a key ring entry holds)."""
    return base64.b64encode(secrets.token_bytes(32)).decode()


class KeyRing:
    """Named AES-256 keys: `current` seals, every key opens what it sealed."""

    def __init__(self, keys: Mapping[str, str | bytes], *, current: str | None = None) -> None:
        """`keys` maps a key id to its 32 bytes (or their base64); `current` defaults to the
        first. Errors name the key id, never the key."""
        if not keys:
            raise ValueError("KeyRing: expected at least one key")
        aesgcm = _aesgcm()
        self._ciphers: dict[str, Any] = {}
        for n, (key_id, key) in enumerate(keys.items(), start=1):
            if not isinstance(key_id, str) or not _KEY_ID.fullmatch(key_id):
                # Not echoed: an id that is not one is most often a key put in its place.
                raise ValueError(
                    f"KeyRing: the id of key {n} is not 1-64 letters, digits or _ . - "
                    "(ids name keys, as in k1=KEY)"
                )
            raw = _key_bytes(key_id, key)
            self._ciphers[key_id] = aesgcm(raw)
        self.current = next(iter(keys)) if current is None else current
        if self.current not in self._ciphers:
            raise ValueError(f"KeyRing: current key {self.current!r} is not in the ring")

    @classmethod
    def from_env(cls, var: str = KEYS_ENV) -> KeyRing:
        """The ring in environment variable `var`: `id=base64key,id=base64key`, current
        first (commas or newlines between entries, as a Kubernetes Secret may hold them)."""
        text = os.environ.get(var)
        if text is None:
            raise ValueError(f"KeyRing: ${var} is not set (expected id=base64key,...)")
        if not text.strip():
            raise ValueError(f"KeyRing: ${var} is empty (expected id=base64key,...)")
        return cls.parse(text, source=f"${var}")

    @classmethod
    def parse(cls, text: str, *, source: str = "key ring") -> KeyRing:
        keys: dict[str, str] = {}
        for n, entry in enumerate(re.split(r"[,\n]", text), start=1):
            entry = entry.strip()
            if not entry:
                continue
            key_id, sep, key = entry.partition("=")
            key_id, key = key_id.strip(), key.strip()
            if not sep or not key_id or not key:
                # Never echoed: a bare key (what `venturi keygen` prints) lands here; an id
                # that is not one is refused by __init__, which does not echo it either.
                raise ValueError(
                    f"KeyRing: {source}: entry {n} is not id=base64key (a bare key? name it: "
                    "k1=KEY; an id is 1-64 letters, digits or _ . -)"
                )
            if key_id in keys:
                raise ValueError(f"KeyRing: {source}: key id {key_id!r} appears twice")
            keys[key_id] = key
        return cls(keys)

    @property
    def key_ids(self) -> list[str]:
        return list(self._ciphers)

    def seal(self, plaintext: bytes, aad: bytes) -> str:
        """The sealed text of `plaintext` under the current key (a fresh random nonce)."""
        nonce = secrets.token_bytes(_NONCE)
        sealed = self._ciphers[self.current].encrypt(nonce, plaintext, aad)
        return f"{self.current}:{base64.b64encode(nonce + sealed).decode()}"

    def open(self, value: str, aad: bytes) -> bytes:
        """The plaintext of a sealed text, or a ValueError saying why it does not open."""
        key_id, sep, body = value.partition(":")
        cipher = self._ciphers.get(key_id)
        if not sep or cipher is None:
            raise ValueError(
                f"sealed with key {key_id!r}, which is not in the key ring "
                f"(it has {', '.join(repr(k) for k in self._ciphers)})"
            )
        try:
            raw = base64.b64decode(body, validate=True)
        except binascii.Error:
            raise ValueError(f"sealed value (key {key_id!r}) is not valid base64") from None
        from cryptography.exceptions import InvalidTag

        try:
            return bytes(cipher.decrypt(raw[:_NONCE], raw[_NONCE:], aad))
        except (InvalidTag, ValueError):
            raise ValueError(
                f"sealed value does not open with key {key_id!r}: tampered with, or "
                "sealed for another job or kind"
            ) from None


def _key_bytes(key_id: str, key: str | bytes) -> bytes:
    if isinstance(key, str):
        try:
            raw = base64.b64decode(key.strip(), validate=True)
        except binascii.Error:
            raise ValueError(f"KeyRing: key {key_id!r} is not valid base64") from None
    else:
        raw = bytes(key)
    if len(raw) != 32:
        raise ValueError(f"KeyRing: key {key_id!r} is {len(raw)} bytes; AES-256 needs 32")
    return raw


def aad_for(job_id: ULID | uuid.UUID, kind: str) -> bytes:
    """What a sealed value is bound to: its job and KIND."""
    return b"venturi\0" + job_id.bytes + b"\0" + kind.encode()


def sealed_key_id(data: str | bytes) -> str | None:
    """The key id of a stored sealed value, None for any other value (cheap: no parse
    unless the marker is there)."""
    if not looks_sealed(data):
        return None
    try:
        return sealed_key(msgspec.json.decode(data))
    except msgspec.DecodeError:
        return None


class SealedCodec:
    """Seals the payloads and carries of encrypted tasks (`ENCRYPTED = True` on the task
    class) with a `KeyRing`; everything else goes through `inner` (JSON) unchanged."""

    seals = True
    """Queues and workers refuse encrypted tasks with a codec that does not seal."""

    def __init__(self, ring: KeyRing, inner: Codec = DEFAULT_CODEC) -> None:
        self.ring = ring
        self.inner = inner

    def encode(
        self,
        value: Any,
        *,
        role: str = "payload",
        kind: str = "",
        job_id: ULID | uuid.UUID | None = None,
    ) -> str:
        text = self.inner.encode(value, role=role, kind=kind)
        if not is_encrypted_kind(kind):
            return text
        if job_id is None:
            raise PayloadError(f"cannot seal the {role} of {kind}: no job id to bind it to")
        return self._envelope(text.encode(), job_id, kind)

    def _envelope(self, plain: bytes, job_id: ULID | uuid.UUID, kind: str) -> str:
        sealed = self.ring.seal(plain, aad_for(job_id, kind))
        return msgspec.json.encode({MARKER: sealed}).decode()

    def decode(
        self,
        target: type[T],
        data: str | bytes,
        *,
        kind: str = "",
        job_id: ULID | uuid.UUID | None = None,
    ) -> T:
        return self.inner.decode(target, self.unseal(data, kind=kind, job_id=job_id))

    def unseal(
        self, data: str | bytes, *, kind: str, job_id: ULID | uuid.UUID | None
    ) -> str | bytes:
        """The inner text of a stored value: opened if sealed, else as it is (a job stored
        before its task was marked encrypted still runs; `venturi rekey` seals it)."""
        if sealed_key_id(data) is None:
            if looks_sealed(data):
                raise ValueError(
                    f"the value is a malformed encrypted envelope (its {MARKER!r} holds no "
                    "sealed text): it was not written by venturi, and cannot be opened"
                )
            return data
        if job_id is None or not kind:
            raise ValueError("a sealed value opens only with its job id and kind")
        envelope = msgspec.json.decode(data.encode() if isinstance(data, str) else data)
        return self.ring.open(envelope[MARKER], aad_for(job_id, kind))

    def reseal(self, data: str, *, kind: str, job_id: ULID | uuid.UUID) -> str | None:
        """`data` sealed with the current key, or None when it is already (or is not sealed:
        rekey re-seals, it never decides what to encrypt)."""
        key_id = sealed_key_id(data)
        if key_id is None or key_id == self.ring.current:
            return None
        plain = self.unseal(data, kind=kind, job_id=job_id)
        return self._envelope(plain.encode() if isinstance(plain, str) else plain, job_id, kind)

    def decode_any(self, data: str | bytes) -> Any:
        """Listings never decrypt: a sealed value is shown by its key id only."""
        key_id = sealed_key_id(data)
        if key_id is not None:
            return {MARKER: key_id}
        return self.inner.decode_any(data)
