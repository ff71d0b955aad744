"""Payload and carry encoding: JSON through msgspec (fast, typed decoding, clear errors).

Encoding failures name the offending field and raise `PayloadError` before anything is
stored; decoding failures at claim time become a dead job with the decoder's message
(which names the path, e.g. "Expected `int`, got `str` - at `$.account_id`").
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec

from venturi.errors import PayloadError

_encoder = msgspec.json.Encoder()


def encode(value: Any, *, role: str = "payload", kind: str = "") -> str:
    """Encode a task or carry to JSON text, or raise PayloadError naming the bad field.

    `role` and `kind` only describe the value in the error (built only on failure: this is
    the bulk-enqueue hot path)."""
    try:
        return _encoder.encode(value).decode()
    except (TypeError, ValueError, msgspec.EncodeError, OverflowError) as exc:
        what = f"{role} of {type(value).__qualname__}" + (f" ({kind})" if kind else "")
        raise PayloadError(f"cannot encode {what}: {_culprit(value)}{exc}") from None


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
        except (TypeError, ValueError, msgspec.EncodeError, OverflowError):
            return f"field {name!r} ({type(getattr(value, name)).__name__}): "
    return ""


_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {}


def decoder(target: type[Any]) -> msgspec.json.Decoder[Any]:
    """A cached, typed decoder for a task or carry class."""
    found = _decoders.get(target)
    if found is None:
        found = _decoders[target] = msgspec.json.Decoder(target)
    return found


def decode(target: type[Any], data: str | bytes) -> Any:
    """Decode JSON into `target`; raises msgspec.ValidationError / DecodeError."""
    return decoder(target).decode(data)


def decode_any(data: str | bytes | None) -> Any:
    """Decode JSON into plain Python values (for listings and attachments)."""
    if data is None:
        return None
    return msgspec.json.decode(data)
