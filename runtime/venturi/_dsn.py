"""Connection strings: libpq's two forms, made into what asyncpg takes.

asyncpg parses URIs (`postgresql://user:pw@host:5432/db?sslmode=require`) only. Many users
have libpq's keyword/value form (`host=db port=5432 dbname=app password='it\\'s'`), the one
`psql`, psycopg and most tooling accept. `connect_args` parses it by libpq's rules and
rewrites it as a URI whose every setting is a query parameter (asyncpg reads host, port,
dbname, user, password, the ssl* keywords and a few more from the query), plus the keywords
asyncpg takes separately: `connect_timeout`, `application_name` and `options`.

Errors name the keyword and never quote a value: a value may be the password.
"""

from __future__ import annotations

import math
import re
import urllib.parse
from dataclasses import dataclass, field

URI_PREFIXES = ("postgresql://", "postgres://")

_QUERY_KEYWORDS = frozenset(
    {
        "host",
        "port",
        "dbname",
        "user",
        "password",
        "passfile",
        "service",
        "sslmode",
        "sslcert",
        "sslkey",
        "sslrootcert",
        "sslcrl",
        "sslpassword",
        "sslnegotiation",
        "ssl_min_protocol_version",
        "ssl_max_protocol_version",
        "target_session_attrs",
        "krbsrvname",
        "gsslib",
    }
)
"""libpq keywords asyncpg reads from a URI's query string, with libpq's meaning."""
_SEPARATE_KEYWORDS = frozenset(
    {
        "connect_timeout",
        "application_name",
        "fallback_application_name",
        "options",
        "client_encoding",
    }
)
"""libpq keywords turned into asyncpg's own arguments."""


@dataclass(frozen=True, slots=True)
class ConnectArgs:
    """What to pass asyncpg: a DSN it parses, and settings the DSN named outside of it."""

    dsn: str | None
    timeout: float | None = None
    """Seconds from the DSN's connect_timeout (math.inf: wait indefinitely); None: not set."""
    server_settings: dict[str, str] = field(default_factory=dict)


def connect_args(dsn: str | None) -> ConnectArgs:
    """A libpq keyword/value string is converted; a URI keeps its form, its query parameters
    read by the same rules (asyncpg would send `connect_timeout` or `keepalives` to the server
    as a setting, which refuses it); None (the PG* environment variables) stays None."""
    if dsn is None:
        return ConnectArgs(None)
    if not isinstance(dsn, str):
        raise TypeError(f"dsn: expected a connection string (a str) or None, got {type(dsn)}")
    if dsn.startswith(URI_PREFIXES):
        return _from_uri(dsn)
    return _from_keywords(parse_keywords(dsn))


def _from_uri(dsn: str) -> ConnectArgs:
    """The URI with the libpq parameters asyncpg takes separately moved out of its query,
    checked as in the keyword form. Parameters libpq does not know stay: asyncpg sends them
    to the server as settings (`?search_path=app`), as it documents."""
    parts = urllib.parse.urlsplit(dsn)
    pairs = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    separate = {k: v for k, v in pairs if k in _SEPARATE_KEYWORDS}
    for keyword, _ in pairs:
        if keyword in _LIBPQ_OTHERS:
            raise _unsupported(keyword)
    if not separate:
        return ConnectArgs(dsn)  # as written: nothing to take out
    timeout, settings = _separate(separate)
    kept = urllib.parse.urlencode([(k, v) for k, v in pairs if k not in _SEPARATE_KEYWORDS])
    return ConnectArgs(urllib.parse.urlunsplit(parts._replace(query=kept)), timeout, settings)


def parse_keywords(text: str) -> dict[str, str]:
    """Parse libpq's `keyword = value` string: whitespace separates pairs and may surround
    `=`; a value is single-quoted to hold spaces or be empty, and a backslash escapes the next
    character (`\\'`, `\\\\`) quoted or not. A keyword given twice keeps its last value."""
    pairs: dict[str, str] = {}
    i, n = 0, len(text)
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i == n:
            return pairs
        start = i
        while i < n and text[i] != "=" and not text[i].isspace():
            i += 1
        keyword = text[start:i]
        while i < n and text[i].isspace():
            i += 1
        if i == n or text[i] != "=":
            raise ValueError(
                f"invalid connection string: a word without '=' at character {start + 1} "
                f"(expected a postgresql:// URI, or libpq keyword=value pairs with values "
                f"that hold spaces in single quotes)"
            )
        i += 1
        while i < n and text[i].isspace():
            i += 1
        value: list[str] = []
        if i < n and text[i] == "'":
            i += 1
            while True:
                if i == n:
                    raise ValueError(
                        f"invalid connection string: the quoted value of "
                        f"{repr(keyword) if _is_libpq(keyword) else 'a keyword'} has no "
                        f"closing quote"
                    )
                if text[i] == "\\" and i + 1 < n:
                    value.append(text[i + 1])
                    i += 2
                elif text[i] == "'":
                    i += 1
                    break
                else:
                    value.append(text[i])
                    i += 1
        else:
            while i < n and not text[i].isspace():
                if text[i] == "\\":  # escapes the next character (a trailing one is dropped)
                    value.append(text[i + 1 : i + 2])
                    i += 2
                else:
                    value.append(text[i])
                    i += 1
        pairs[keyword] = "".join(value)


def _from_keywords(pairs: dict[str, str]) -> ConnectArgs:
    for keyword in pairs:
        if keyword in _QUERY_KEYWORDS or keyword in _SEPARATE_KEYWORDS:
            continue
        elif keyword in _LIBPQ_OTHERS:
            raise _unsupported(keyword)
        else:  # maybe part of an unquoted value (a password with a space): never quoted
            raise ValueError(
                "connection string: a keyword that libpq does not know (a value that holds "
                "spaces must be in single quotes)"
            )
    timeout, settings = _separate(pairs)
    # Empty values mean "not set" to libpq (the default applies).
    query = {k: v for k, v in pairs.items() if k in _QUERY_KEYWORDS and v != ""}
    return ConnectArgs(
        "postgresql://?" + urllib.parse.urlencode(query) if query else "postgresql://",
        timeout,
        settings,
    )


def _unsupported(keyword: str) -> ValueError:
    return ValueError(
        f"connection string: the libpq keyword {keyword!r} is not supported (venturi "
        f"connects with asyncpg, which implements host, port, dbname, user, password, "
        f"passfile, service, the ssl* keywords, target_session_attrs, krbsrvname, "
        f"gsslib, connect_timeout, application_name and options)"
    )


def _separate(pairs: dict[str, str]) -> tuple[float | None, dict[str, str]]:
    """The connect timeout and server settings from the keywords asyncpg takes apart from
    its DSN (`_SEPARATE_KEYWORDS`; any others in `pairs` are ignored here)."""
    encoding = pairs.get("client_encoding")
    # Accepted as long as it asks for what asyncpg does.
    if encoding is not None and encoding.replace("-", "").lower() != "utf8":
        raise ValueError("connection string: client_encoding must be UTF8 (asyncpg's only)")
    settings: dict[str, str] = {}
    name = pairs.get("application_name") or pairs.get("fallback_application_name")
    if name:
        settings["application_name"] = name
    if pairs.get("options"):
        settings.update(_options(pairs["options"]))
    timeout: float | None = None
    if pairs.get("connect_timeout"):
        try:
            seconds = int(pairs["connect_timeout"])
        except ValueError:
            raise ValueError("connection string: connect_timeout must be whole seconds") from None
        # libpq: zero or negative waits indefinitely; the least timeout is 2 s.
        timeout = math.inf if seconds <= 0 else float(max(seconds, 2))
    return timeout, settings


_LIBPQ_OTHERS = frozenset(
    {
        "hostaddr",
        "keepalives",
        "keepalives_idle",
        "keepalives_interval",
        "keepalives_count",
        "tcp_user_timeout",
        "replication",
        "gssencmode",
        "gssdelegation",
        "channel_binding",
        "requirepeer",
        "require_auth",
        "requiressl",
        "sslcompression",
        "sslsni",
        "sslcertmode",
        "load_balance_hosts",
        "min_protocol_version",
        "max_protocol_version",
    }
)
"""libpq's other keywords, which asyncpg does not implement (named in errors)."""


def _is_libpq(keyword: str) -> bool:
    return keyword in _QUERY_KEYWORDS or keyword in _SEPARATE_KEYWORDS or keyword in _LIBPQ_OTHERS


def _options(text: str) -> dict[str, str]:
    """libpq's `options`: server settings as command-line arguments, `-c name=value` or
    `--name=value`, separated by spaces (a backslash escapes a space or a backslash)."""
    args: list[str] = []
    current: list[str] = []
    escaped = False
    for ch in text:
        if escaped:
            current.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch.isspace():
            if current:
                args.append("".join(current))
                current = []
        else:
            current.append(ch)
    if current:
        args.append("".join(current))
    settings: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "-c" and i + 1 < len(args):
            setting, i = args[i + 1], i + 2
        elif (arg.startswith("-c") and len(arg) > 2) or arg.startswith("--"):
            setting, i = arg[2:], i + 1
        else:
            raise ValueError(
                "connection string: options must be server settings "
                "('-c name=value' or '--name=value')"
            )
        name, eq, value = setting.partition("=")
        if not eq or not name:
            raise ValueError("connection string: each option must be name=value")
        settings[name.replace("-", "_")] = value
    return settings


_BREAKS = re.compile(r"[\s/?#@\[\]&'\"\\]")
"""Characters that cut a password into pieces a parser then quotes (as a port, a database
name, a query field) when they are not percent-encoded."""
_SPLIT = re.compile(r"[\s/?#@\[\]&'\"\\:=;,%]+")
_PASSWORD_VALUE = re.compile(r"(?:^|[\s?&])(?:ssl)?password\s*=\s*", re.IGNORECASE)
_NEXT_PARAMETER = re.compile(r"(?:&|\s+)[A-Za-z_]+\s*=")


def secret_pieces(dsn: str | None, password: str | None = None) -> list[str]:
    """What a message about `dsn` (and a password given apart, PGPASSWORD) must never
    repeat: the password, as written and percent-decoded, and, when characters that break parsing
    are in it, every piece a parser could have cut it into. Generous on purpose (for
    redacting messages, never used to connect): a URI's password runs from the user name to
    the last "@", and without a scheme all before it counts; a `password=` or `sslpassword=`
    value (keyword form, or a URI's query) also runs to the next parameter."""
    spans: list[tuple[str, bool]] = []  # (text, always cut into pieces)
    if password:
        spans.append((password, False))
    if dsn:
        _, sep, rest = dsn.partition("://")
        try:
            pairs = {} if sep else parse_keywords(dsn)
        except ValueError:
            pairs = {}
        if pairs:
            spans.extend((pairs[k], False) for k in ("password", "sslpassword") if pairs.get(k))
        elif "@" in (body := rest if sep else dsn):
            userinfo = body[: body.rfind("@")]
            # No scheme: a parser may take the user name for one, and quote it.
            spans.append((userinfo.partition(":")[2], False) if sep else (userinfo, True))
        for match in _PASSWORD_VALUE.finditer(dsn):
            tail = dsn[match.end() :]
            end = _NEXT_PARAMETER.search(tail)
            spans.append((tail[: end.start()] if end else tail, False))
    pieces: set[str] = set()
    for text, cut in spans:
        pieces.update((text, urllib.parse.unquote(text)))
        if cut or _BREAKS.search(text):  # parsers cut the text as written, not decoded
            pieces.update(_SPLIT.split(text))
    pieces.discard("")
    return sorted(pieces, key=len, reverse=True)
