"""Loads the statements (`queries/*.sql`) and the numbered migrations, and renders them for a
table prefix.

Statements name their parameters (`:queue`, `:kinds::text[]`); loading compiles them to
asyncpg's `$1, $2 ...` and records the order, so the store passes keyword arguments and a
statement that gains a parameter cannot silently shift the others. A statement is a block
`-- name --` (full-line comments after it are its documentation); names are one namespace
across the files, and a name defined twice is an error at load.

The prefix is validated before it is ever formatted into SQL, so rendering is the only
place identifiers are substituted, and it cannot inject anything.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

PREFIX_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,38}")

_BLOCK = re.compile(r"^-- (?P<name>[a-z_]+) --\n(?P<body>.*?)(?=^-- [a-z_]+ --\n|\Z)", re.M | re.S)
_TOKEN = re.compile(
    r"""'(?:[^']|'')*'           # a string literal: left alone
      | "(?:[^"]|"")*"           # a quoted identifier
      | --[^\n]*                 # a comment
      | ::                       # a cast, not a parameter
      | :(?P<param>[a-z_][a-z0-9_]*)
      | (?P<positional>\$\d+)""",
    re.X,
)
_MIGRATION_NAME = re.compile(r"(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql")


def validate_prefix(prefix: str) -> str:
    """Return `prefix` if it is a safe table prefix, else raise a ValueError naming it."""
    if not isinstance(prefix, str) or not PREFIX_PATTERN.fullmatch(prefix):
        raise ValueError(
            f"invalid table prefix {prefix!r}: expected a lowercase identifier matching "
            f"[a-z][a-z0-9_]{{0,38}} (a letter, then up to 38 letters, digits or underscores)"
        )
    return prefix


@dataclass(frozen=True, slots=True)
class Statement:
    """One named statement: asyncpg's text, and which keyword fills each `$n`."""

    name: str
    text: str
    params: tuple[str, ...]
    """The parameter names in `$1, $2 ...` order."""
    _pick: Callable[[Mapping[str, Any]], Any] = dataclasses.field(repr=False, compare=False)

    def args(self, values: Mapping[str, Any]) -> tuple[Any, ...]:
        """The positional arguments for `values` (every parameter, and nothing else)."""
        if len(values) == len(self.params):
            try:
                picked = self._pick(values)
            except KeyError:
                pass
            else:
                return picked if len(self.params) != 1 else (picked,)
        missing = sorted(set(self.params) - set(values))
        unknown = sorted(set(values) - set(self.params))
        raise TypeError(
            f"statement {self.name!r}: "
            + "; ".join(
                part
                for part in (
                    f"missing parameters {missing}" if missing else "",
                    f"unknown parameters {unknown}" if unknown else "",
                )
                if part
            )
        )


def compile_statement(name: str, body: str) -> Statement:
    """Compile `:name` placeholders to `$n` (strings, quoted identifiers, comments and `::`
    casts are left alone); positional `$n` placeholders are refused, so a statement never
    mixes the two."""
    order: dict[str, int] = {}

    def replace(match: re.Match[str]) -> str:
        if match["positional"]:
            raise ValueError(
                f"statement {name!r}: positional placeholder {match['positional']}; "
                f"name it (`:name`)"
            )
        param = match["param"]
        if param is None:
            return match[0]
        return f"${order.setdefault(param, len(order) + 1)}"

    text = _TOKEN.sub(replace, body)
    params = tuple(order)
    pick: Callable[[Mapping[str, Any]], Any] = (
        operator.itemgetter(*params) if params else (lambda _values: ())
    )
    return Statement(name, text, params, pick)


def parse(files: Mapping[str, str]) -> dict[str, Statement]:
    """Every statement of `files` (file name -> SQL text), by name.

    Raises ValueError for a name defined twice (in one file or across files) and for text
    outside a block (a statement without a name would be silently lost)."""
    found: dict[str, Statement] = {}
    where: dict[str, str] = {}
    for file, text in sorted(files.items()):
        first = _BLOCK.search(text)
        head = text[: first.start()] if first else text
        if any(ln.strip() and not ln.lstrip().startswith("--") for ln in head.splitlines()):
            raise ValueError(f"{file}: SQL before the first `-- name --` block")
        for match in _BLOCK.finditer(text):
            name = match["name"]
            if name in found:
                places = (
                    f"twice in {file}" if where[name] == file else f"in {where[name]} and {file}"
                )
                raise ValueError(f"statement {name!r} is defined {places}")
            lines = [ln for ln in match["body"].splitlines() if not ln.lstrip().startswith("--")]
            found[name] = compile_statement(name, "\n".join(lines).strip())
            where[name] = file
    return found


@functools.cache
def _raw_queries() -> dict[str, Statement]:
    folder = resources.files(__package__).joinpath("queries")
    return parse(
        {entry.name: entry.read_text() for entry in folder.iterdir() if entry.name.endswith(".sql")}
    )


@functools.cache
def queries(prefix: str) -> Mapping[str, Statement]:
    """All named statements, rendered for `prefix`."""
    validate_prefix(prefix)
    return {
        name: dataclasses.replace(stmt, text=stmt.text.replace("{prefix}", prefix))
        for name, stmt in _raw_queries().items()
    }


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


@functools.cache
def _raw_migrations() -> tuple[Migration, ...]:
    found = []
    for entry in resources.files(__package__).joinpath("migrations").iterdir():
        match = _MIGRATION_NAME.fullmatch(entry.name)
        if match:
            found.append(Migration(int(match["version"]), match["name"], entry.read_text()))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migrations must be numbered 1..n without gaps, got {versions}")
    return tuple(found)


_TABLE_DDL = re.compile(r"\b(CREATE|DROP) TABLE (?:IF (?:NOT )?EXISTS )?\{prefix\}_([a-z_]+)")


@functools.cache
def table_suffixes() -> tuple[str, ...]:
    """The names, after "<prefix>_", of the tables the migrations leave (in order of
    creation): what a role needs privileges on."""
    tables: dict[str, None] = {"migrations": None}
    for m in _raw_migrations():
        for verb, name in _TABLE_DDL.findall(m.sql):
            if verb == "CREATE":
                tables[name] = None
            else:
                tables.pop(name, None)
    return tuple(tables)


def migrations(prefix: str) -> tuple[Migration, ...]:
    """The numbered migrations, in order, rendered for `prefix`."""
    validate_prefix(prefix)
    return tuple(
        Migration(m.version, m.name, m.sql.replace("{prefix}", prefix)) for m in _raw_migrations()
    )
