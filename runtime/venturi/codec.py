"""Payload and carry encoding: JSON through msgspec (fast, typed decoding, clear errors).

Encoding failures name the offending field and raise `PayloadError` before anything is
stored: numbers JSON cannot hold (NaN, infinity: msgspec would write `null`), strings with
a NUL character (PostgreSQL's jsonb refuses them) and nesting too deep to encode are refused,
never silently changed. Decoding failures at claim time become a dead job with the decoder's
message (which names the path, e.g. "Expected `int`, got `str` - at `$.account_id`").
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec

from venturi._storable import json_problem
from venturi.errors import PayloadError

_encoder = msgspec.json.Encoder()


def encode(value: Any, *, role: str = "payload", kind: str = "") -> str:
    """Encode a task or carry to JSON text, or raise PayloadError naming the bad field.

    `role` and `kind` only describe the value in the error (built only on failure: this is
    the bulk-enqueue hot path)."""
    try:
        data = _encoder.encode(value)
    except RecursionError:
        raise PayloadError(
            f"cannot encode {_what(value, role, kind)}: {_culprit(value)}nested too deeply "
            f"(more levels than Python's recursion limit allows)"
        ) from None
    except (TypeError, ValueError, msgspec.EncodeError, OverflowError) as exc:
        raise PayloadError(
            f"cannot encode {_what(value, role, kind)}: {_culprit(value)}{exc}"
        ) from None
    # NaN and infinity are written as null, a NUL as \u0000: scan (fast) before looking.
    if data.find(b"null") != -1 or 92 in data:  # 92: a backslash
        problem = json_problem(data, value)
        if problem is not None:
            raise PayloadError(f"cannot encode {_what(value, role, kind)}: {problem}")
    return data.decode()


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
