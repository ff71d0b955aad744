"""Payload and carry encoding: a `Codec` turns tasks and carries into the JSON text stored in
the jobs table and back. `JsonCodec`, the default, is JSON through msgspec (fast, typed
decoding, clear errors); another codec (encryption, say) wraps or replaces it and is given to
`Queue(store, codec=...)` and `Worker(..., codec=...)`, which must agree.

`JsonCodec`'s encoding failures name the offending field and raise `PayloadError` before anything is
stored: numbers JSON cannot hold (NaN, infinity: msgspec would write `null`), strings with
a NUL character (PostgreSQL's jsonb refuses them) and nesting too deep to encode are refused,
never silently changed. Decoding failures at claim time become a dead job with the decoder's
message (which names the path, e.g. "Expected `int`, got `str` - at `$.account_id`").
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any, Protocol, TypeVar

import msgspec
from ulid import ULID

from venturi._storable import json_problem, surrogate_problem
from venturi.errors import PayloadError
from venturi.task import is_encrypted_kind

T = TypeVar("T")

_encoder = msgspec.json.Encoder()


class Codec(Protocol):
    """How payloads and carries are stored: as JSON text (the columns are `jsonb`, so a codec
    that hides the value, such as encryption, stores a JSON envelope, e.g. a string).

    `encode` raises `PayloadError` for a value it cannot store, before anything is written;
    `decode` raises `ValueError` (msgspec's errors are ValueErrors) or `TypeError` for data
    that does not decode into `target`, which sends a claimed job dead with that message.
    """

    def encode(
        self,
        value: Any,
        *,
        role: str = "payload",
        kind: str = "",
        job_id: ULID | uuid.UUID | None = None,
    ) -> str:
        """Encode a task or carry of the job `job_id` of `kind` (a codec may bind the value
        to them, as encryption does; JSON uses them only to describe the value in errors)."""
        ...

    def decode(
        self,
        target: type[T],
        data: str | bytes,
        *,
        kind: str = "",
        job_id: ULID | uuid.UUID | None = None,
    ) -> T:
        """Decode stored text of the job `job_id` of `kind` into `target` (a task or carry
        class)."""
        ...

    def decode_any(self, data: str | bytes) -> Any:
        """Decode stored text into plain Python values (dicts, lists...), for listings."""
        ...


class JsonCodec:
    """JSON through msgspec: a task's fields as a JSON object, exactly or not at all."""

    def encode(
        self,
        value: Any,
        *,
        role: str = "payload",
        kind: str = "",
        job_id: ULID | uuid.UUID | None = None,
    ) -> str:
        """Encode a task or carry to JSON text, or raise PayloadError naming the bad field.

        `role` and `kind` only describe the value in the error (built only on failure: this
        is the bulk-enqueue hot path)."""
        try:
            data = _encoder.encode(value)
        except RecursionError:
            raise PayloadError(
                f"cannot encode {_what(value, role, kind)}: {_culprit(value)}nested too deeply "
                f"(more levels than Python's recursion limit allows)"
            ) from None
        except UnicodeEncodeError:  # a lone surrogate: say where it is, not only whose field
            found = surrogate_problem(value) or "a string is not valid Unicode"
            raise PayloadError(f"cannot encode {_what(value, role, kind)}: {found}") from None
        except (TypeError, ValueError, msgspec.EncodeError, OverflowError) as exc:
            raise PayloadError(
                f"cannot encode {_what(value, role, kind)}: {_culprit(value)}{exc}"
            ) from None
        if len(data) > MAX_JSON_BYTES:
            raise PayloadError(
                f"cannot encode {_what(value, role, kind)}: {len(data):,} bytes of JSON, more "
                f"than PostgreSQL's jsonb holds ({MAX_JSON_BYTES:,}); store large data "
                "elsewhere and pass a reference"
            )
        # NaN and infinity are written as null, a NUL as \u0000: scan (fast) before looking.
        if data.find(b"null") != -1 or 92 in data:  # 92: a backslash
            problem = json_problem(data, value)
            if problem is not None:
                raise PayloadError(f"cannot encode {_what(value, role, kind)}: {problem}")
        # A field whose value does not fit its annotation (an "42" for an int) encodes, and
        # would send the job dead when a worker decodes it: decoded here as a worker will
        # (about 0.2-0.6 us a job), it fails the call that made it instead.
        checker = _checkers.get(type(value), _UNSEEN)
        if checker is _UNSEEN:
            checker = _checkers[type(value)] = _checker(type(value))
        if checker is not None:
            try:
                checker.decode(data)
            except Exception as exc:  # a ValidationError, or what the class's __post_init__ raised
                raise PayloadError(
                    f"cannot encode {_what(value, role, kind)}: "
                    f"{_unfit(exc, is_encrypted_kind(kind))}"
                ) from None
        return data.decode()

    def decode(
        self,
        target: type[T],
        data: str | bytes,
        *,
        kind: str = "",
        job_id: ULID | uuid.UUID | None = None,
    ) -> T:
        """Decode JSON into `target`; raises msgspec.ValidationError / DecodeError."""
        found = _decoders.get(target)
        if found is None:
            found = _decoders[target] = msgspec.json.Decoder(target)
        try:
            result: T = found.decode(data)
        except msgspec.ValidationError:
            if looks_sealed(data):
                raise ValueError(
                    "the value is encrypted, and this codec has no key ring: give the Worker "
                    "codec=SealedCodec(KeyRing...) (see venturi.encryption)"
                ) from None
            raise
        return result

    def decode_any(self, data: str | bytes) -> Any:
        """Decode JSON into plain Python values; an encrypted value is shown by its key id
        only (`{"venturi:sealed": "k1"}`), as `SealedCodec` shows it."""
        value = msgspec.json.decode(data)
        key_id = sealed_key(value) if looks_sealed(data) else None
        return value if key_id is None else {SEALED_MARKER: key_id}


def stored_text(codec: Codec, text: object, *, role: str, kind: str) -> str:
    """What `codec.encode` returned, checked as JSON's own codecs guarantee it when the codec
    is one of your own: JSON text that PostgreSQL's jsonb stores (a str, valid JSON, no NUL),
    else a `PayloadError` before anything is stored, not the database's error. `JsonCodec`'s
    and `SealedCodec`'s output passes unread (the enqueue's hot path)."""
    if type(codec) is JsonCodec or getattr(codec, "seals", False):
        return text  # type: ignore[return-value]
    name = f"{type(codec).__qualname__}.encode()"
    if not isinstance(text, str):
        raise PayloadError(
            f"{name} returned {type(text).__name__} for the {role} of {kind}, not JSON text (a str)"
        )
    try:
        value = msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise PayloadError(
            f"{name} returned text that is not JSON for the {role} of {kind}: {exc}"
        ) from None
    data = text.encode()
    problem = json_problem(data, value) if 92 in data else None  # 92: a backslash
    if problem is not None:
        raise PayloadError(
            f"{name} returned JSON that cannot be stored for the {role} of {kind}: {problem}"
        )
    return text


MAX_JSON_BYTES = 0x0FFFFFFF
"""The most JSON a payload or carry may be (268,435,455 bytes): the most a jsonb value's
contents may take in PostgreSQL, which refuses more with an error that names neither the task
nor the field."""

SEALED_MARKER = "venturi:sealed"
"""The one key of an encrypted value's JSON envelope (see venturi.encryption)."""
_SEALED = f'"{SEALED_MARKER}"'.encode()


def looks_sealed(data: str | bytes) -> bool:
    """Whether stored text starts like an encrypted envelope (cheap: no parse)."""
    return _SEALED in (data.encode() if isinstance(data, str) else data)[:24]


def sealed_key(value: Any) -> str | None:
    """The key id of a decoded encrypted envelope, None for any other value."""
    if isinstance(value, dict) and len(value) == 1:
        sealed = value.get(SEALED_MARKER)
        if isinstance(sealed, str):
            return sealed.partition(":")[0]
    return None


DEFAULT_CODEC = JsonCodec()
"""The codec of a `Queue` or `Worker` not given one."""


def _what(value: Any, role: str, kind: str) -> str:
    return f"{role} of {type(value).__qualname__}" + (f" ({kind})" if kind else "")


def _culprit(value: Any) -> str:
    """Find the first field that fails to encode, for the error message."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = [f.name for f in dataclasses.fields(value)]
    elif hasattr(value, "__struct_fields__"):
        names = list(value.__struct_fields__)
    else:
        return ""
    for name in names:
        try:
            _encoder.encode(getattr(value, name))
        except (TypeError, ValueError, msgspec.EncodeError, OverflowError, RecursionError):
            return f"field {name!r} ({type(getattr(value, name)).__name__}): "
    return ""


_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {}
"""Typed decoders by task or carry class, built once (they hold no state)."""

_UNSEEN: Any = object()
_checkers: dict[type[Any], msgspec.json.Decoder[Any] | None] = {}
"""The decoder that checks an encoded value of each class against its fields' types (None:
not a class with typed fields, such as a dict), built once per class."""


def _checker(cls: type[Any]) -> msgspec.json.Decoder[Any] | None:
    if not (dataclasses.is_dataclass(cls) or issubclass(cls, msgspec.Struct)):
        return None
    found = _decoders.get(cls)
    if found is None:
        try:
            found = _decoders[cls] = msgspec.json.Decoder(cls)
        except Exception:  # a field type msgspec cannot decode: nothing to check it with
            return None
    return found


def _unfit(exc: Exception, encrypted: bool) -> str:
    """msgspec's message naming the field (`Expected `int`, got `str` - at `$.order_id``),
    or what the class's own check raised, but of an encrypted task only where it went wrong:
    some messages quote the value."""
    message = str(exc)
    if not isinstance(exc, msgspec.ValidationError):
        if encrypted:
            return f"{type(exc).__name__} (its message is withheld: it may quote the value)"
        return f"{type(exc).__name__}: {message} (the task class's own check)"
    if not encrypted:
        return f"{message} (a field's value does not fit its type)"
    at = message.rpartition(" - at ")[2] if " - at " in message else ""
    where = f" at {at}" if at else ""
    return (
        f"a field's value does not fit its type{where} (the message is withheld: it may "
        "quote the value)"
    )
