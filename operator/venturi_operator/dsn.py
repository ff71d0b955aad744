"""What the operator may say about a DSN: its host, port and database, and nothing else.

A DSN holds credentials, and a parser's error message quotes whatever it failed on: a password
with an unescaped ``#``, ``/``, ``?`` or ``@`` ends up in the port, the database name or a query
field that asyncpg's error then echoes. So the operator never puts a parser's or a driver's
message into a status, an Event, a log line or a metric; it says :func:`describe` instead.

:func:`describe` reads a DSN strictly (an RFC 3986 URL whose user information has every reserved
character percent-encoded, or a libpq ``key=value`` string) and gives ``host:port/database``
only when those parts cannot be pieces of a password, else None; :func:`the_database` words
either for a message. Stricter than asyncpg on purpose and only ever used for messages: a DSN it
cannot describe is still handed to the driver as it is. Pure: no I/O.
"""

from __future__ import annotations

import re
import urllib.parse

ENCODING_HINT = (
    "percent-encode the characters @ : / ? # [ ] % and spaces in the user name and password, "
    "@ as %40 for example"
)

_PCT = r"%[0-9A-Fa-f]{2}"
# RFC 3986: userinfo = *( unreserved / pct-encoded / sub-delims / ":" ).
_USERINFO = rf"(?:[A-Za-z0-9\-._~!$&'()*+,;=:]|{_PCT})*"
# A host list: names, IPv4, [IPv6], each with an optional port, comma-separated (libpq).
_HOSTPORT = r"(?:\[[0-9A-Fa-f:.]+\]|(?:[A-Za-z0-9\-._~]|%[0-9A-Fa-f]{2})*)(?::[0-9]{0,5})?"
_SEGMENT = rf"(?:[A-Za-z0-9\-._~!$&'()*+,;=:]|{_PCT})*"  # a path segment without "@" or "/"
_QUERY_FIELD = rf"(?:[A-Za-z0-9\-._~!$'()*+,;:/?@]|{_PCT})+"
_URL = re.compile(
    rf"(?P<scheme>postgres(?:ql)?)://"
    rf"(?:(?P<userinfo>{_USERINFO})@)?"
    rf"(?P<hosts>{_HOSTPORT}(?:,{_HOSTPORT})*)"
    rf"(?:/(?P<database>{_SEGMENT}))?"
    rf"(?:\?(?P<query>{_QUERY_FIELD}={_QUERY_FIELD}?(?:&{_QUERY_FIELD}={_QUERY_FIELD}?)*))?",
    re.ASCII,
)
# libpq's conninfo: key = value pairs, a value bare or single-quoted with backslash escapes.
_CONNINFO = re.compile(
    r"\s*(?P<key>[A-Za-z_]+)\s*=\s*(?:'(?P<quoted>(?:[^'\\]|\\.)*)'|(?P<bare>[^\s'\\]+))\s*",
    re.DOTALL,
)
_SAFE_PART = re.compile(r"[A-Za-z0-9\-._~/\[\]:,]+")
"""What a described host, port or database may consist of once decoded; anything else (a quote,
a space, a control character) is not repeated."""


def describe(dsn: str) -> str | None:
    """``host:port/database`` of a DSN, never any other part of it; None if the DSN does not
    parse strictly (most often: a reserved character in the password is not percent-encoded)."""
    parts = _url_parts(dsn) if "://" in dsn else _conninfo_parts(dsn)
    if parts is None or any(_SAFE_PART.fullmatch(p) is None for p in parts if p):
        return None
    hosts, database = parts
    return f"{hosts or 'the default host'}/{database or '(default database)'}"


def the_database(dsn: str) -> str:
    """ "the database at host:port/db", or words that say why it cannot be named."""
    where = describe(dsn)
    if where is not None:
        return f"the database at {where}"
    return (
        "the database (its DSN does not say unambiguously where it is, so it is not repeated: "
        f"{ENCODING_HINT})"
    )


def _url_parts(dsn: str) -> tuple[str, str] | None:
    match = _URL.fullmatch(dsn)
    # An "@" outside the user information, or more than one, is a password split in two.
    if match is None or dsn.count("@") > (1 if match["userinfo"] is not None else 0):
        return None
    query: dict[str, str] = {}
    if match["query"]:
        for field in match["query"].split("&"):
            key, _, value = field.partition("=")
            query[urllib.parse.unquote(key)] = urllib.parse.unquote(value)
    hosts = urllib.parse.unquote(match["hosts"])
    if not hosts:
        hosts = _join(query.get("host", ""), query.get("port", ""))
    elif "port" in query and not re.search(r":[0-9]*$", match["hosts"]):
        hosts = _join(hosts, query["port"])
    database = urllib.parse.unquote(match["database"] or "")
    return hosts, database or query.get("dbname", query.get("database", ""))


def _conninfo_parts(dsn: str) -> tuple[str, str] | None:
    values: dict[str, str] = {}
    position = 0
    while position < len(dsn):
        match = _CONNINFO.match(dsn, position)
        if match is None or match.end() == position:
            return None
        quoted = match["quoted"]
        values[match["key"]] = (
            re.sub(r"\\(.)", r"\1", quoted, flags=re.DOTALL)
            if quoted is not None
            else match["bare"]
        )
        position = match.end()
    if not values:
        return None
    host = values.get("host") or values.get("hostaddr", "")
    return _join(host, values.get("port", "")), values.get("dbname", "")


def _join(hosts: str, ports: str) -> str:
    """libpq's host and port lists ("a,b" and "5432,5433", or one port for all) as a:5432,b:5433."""
    if not ports:
        return hosts
    host_list, port_list = hosts.split(","), ports.split(",")
    if len(port_list) == 1:
        port_list *= len(host_list)
    if len(port_list) != len(host_list):
        return hosts
    pairs = zip(host_list, port_list, strict=True)
    return ",".join(f"{h or 'localhost'}:{p}" if p else h for h, p in pairs)
