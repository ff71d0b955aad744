"""What PostgreSQL can store: checks for JSON data and a safe form for text.

Two rules, applied where values are created:

- JSON data (payloads, carries, attachments) is stored exactly or refused. msgspec encodes
  NaN and infinity as `null` (JSON has no such numbers: the value would silently change), and
  PostgreSQL's jsonb rejects the `\\u0000` escape of a NUL character; `json_problem` finds
  either and names where it is.
- Text for people (notes, error messages) is made safe instead: a NUL becomes the four
  characters `\\x00` and a lone surrogate its backslash escape (`safe_text`), so a handler's
  odd exception message can never make its settlement fail.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import msgspec

_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
"""A real `\\u0000` escape in JSON text (not an escaped backslash followed by `u0000`)."""


def safe_text(text: str) -> str:
    """`text` with NUL escaped as `\\x00` and lone surrogates backslash-escaped."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            text = text.encode("utf-8", "backslashreplace").decode()
    return text


def ascii_text(text: str) -> str:
    """`text` with every character outside ASCII written as its backslash escape (`\\u20ac`):
    storable in a database of any encoding."""
    return text.encode("ascii", "backslashreplace").decode("ascii")


def json_problem(encoded: bytes, value: Any) -> str | None:
    """Why `encoded` (msgspec's JSON of `value`) would not store `value` faithfully, or None.

    Fast checks first, in C: NaN and infinity are written as `null` (as None is), so only
    JSON holding `null` is looked at again, as msgpack (which keeps every float's bits); a
    NUL is written as the escape `\\u0000`. Only a real culprit is then searched for by path.
    """
    nan = encoded.find(b"null") != -1 and _holds_non_finite(value)
    nul = (  # 92: a backslash; the regex rules out an escaped backslash before "u0000"
        92 in encoded and encoded.find(b"\\u0000") != -1 and _NUL_ESCAPE.search(encoded) is not None
    )
    if not (nan or nul):
        return None
    found = _walk(value, nan=nan, nul=nul)
    if found is not None:
        return found
    if nul:  # a type the walk does not open (an enum's value, say): still refuse it
        return "it holds a NUL character (\\x00), which PostgreSQL cannot store in JSON"
    return None  # a msgpack false positive (bytes that look like a float's): all is well


_json = msgspec.json.Encoder()


def encode_json(value: Any, *, what: str, cap: int, too_large: type[Exception]) -> bytes:
    """`value` as JSON that stores faithfully and fits `cap` bytes, or the error saying why
    not: a TypeError (not JSON-serializable), a ValueError (NaN, a NUL, nesting too deep),
    `too_large` (over the cap). `what` names the call in the message."""
    try:
        encoded = _json.encode(value)
    except (TypeError, msgspec.EncodeError) as exc:
        raise TypeError(f"{what}: value is not JSON-serializable: {exc}") from None
    except RecursionError:
        raise ValueError(f"{what}: value is nested too deeply to encode") from None
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"{what}: value cannot be encoded: {exc}") from None
    problem = json_problem(encoded, value)
    if problem is not None:
        raise ValueError(f"{what}: {problem}")
    if len(encoded) > cap:
        raise too_large(f"{what}: value is {len(encoded)} bytes of JSON, over the {cap}-byte cap")
    return encoded


_msgpack = msgspec.msgpack.Encoder()
_NON_FINITE = re.compile(rb"\xcb[\x7f\xff][\xf0-\xff]")
"""A msgpack float64 (0xcb) whose 11 exponent bits are all set: NaN or an infinity."""


def _holds_non_finite(value: Any) -> bool:
    """Whether `value` may hold NaN or an infinity (never a false "no")."""
    try:
        packed = _msgpack.encode(value)
    except Exception:  # a type msgpack does not take, though JSON did: walk instead
        return True
    return 0xCB in packed and _NON_FINITE.search(packed) is not None


def surrogate_problem(value: Any) -> str | None:
    """Where `value` holds a string that is not valid Unicode (a lone surrogate, which UTF-8
    cannot encode), by path; None if it holds none."""
    return _walk(value, nan=False, nul=False, surrogates=True)


def _not_unicode(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode()
    except UnicodeEncodeError:
        return True
    return False


def _walk(value: Any, *, nan: bool, nul: bool, surrogates: bool = False) -> str | None:
    """The first non-finite float (when `nan`), string with a NUL (when `nul`) or string that
    is not valid Unicode (when `surrogates`), by path."""
    stack: list[tuple[str, Any]] = [("", value)]
    seen: set[int] = set()
    while stack:
        path, v = stack.pop()
        if isinstance(v, float):
            if nan and not math.isfinite(v):
                return (
                    f"{_where(path)} is {v!r}: NaN and infinity cannot be stored "
                    f"(JSON has no such numbers; they would become null)"
                )
        elif isinstance(v, str):
            if nul and "\x00" in v:
                return (
                    f"{_where(path)} holds a NUL character (\\x00), which PostgreSQL cannot store"
                )
            if surrogates and _not_unicode(v):
                return f"{_where(path)} is not valid Unicode (it holds a lone surrogate)"
        elif isinstance(v, bool | int | bytes | None) or id(v) in seen:
            continue
        else:
            seen.add(id(v))
            children: list[tuple[str, Any]] = []
            if isinstance(v, dict):
                for key, item in v.items():
                    if nul and isinstance(key, str) and "\x00" in key:
                        return (
                            f"a key of {_where(path)} holds a NUL character (\\x00), "
                            f"which PostgreSQL cannot store"
                        )
                    if surrogates and isinstance(key, str) and _not_unicode(key):
                        return f"a key of {_where(path)} is not valid Unicode (a lone surrogate)"
                    children.append((f"{path}[{key!r}]", item))
            elif isinstance(v, list | tuple | set | frozenset):
                children = [(f"{path}[{i}]", item) for i, item in enumerate(v)]
            elif dataclasses.is_dataclass(v) and not isinstance(v, type):
                names = [f.name for f in dataclasses.fields(v)]
                children = [(_join(path, n), getattr(v, n, None)) for n in names]
            elif hasattr(v, "__struct_fields__"):
                children = [(_join(path, n), getattr(v, n, None)) for n in v.__struct_fields__]
            stack.extend(reversed(children))  # depth-first, in field order
    return None


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _where(path: str) -> str:
    return f"field {path!r}" if path else "the value"
