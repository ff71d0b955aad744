"""Loads `queries.sql` and the numbered migrations, and renders them for a table prefix.

The prefix is validated before it is ever formatted into SQL, so rendering is the only
place identifiers are substituted, and it cannot inject anything.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources

PREFIX_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,38}")

_BLOCK = re.compile(r"^-- (?P<name>[a-z_]+) --\n(?P<body>.*?)(?=^-- [a-z_]+ --\n|\Z)", re.M | re.S)
_MIGRATION_NAME = re.compile(r"(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql")


def validate_prefix(prefix: str) -> str:
    """Return `prefix` if it is a safe table prefix, else raise a ValueError naming it."""
    if not isinstance(prefix, str) or not PREFIX_PATTERN.fullmatch(prefix):
        raise ValueError(
            f"invalid table prefix {prefix!r}: expected a lowercase identifier matching "
            f"[a-z][a-z0-9_]{{0,38}} (a letter, then up to 38 letters, digits or underscores)"
        )
    return prefix


@functools.cache
def _raw_queries() -> dict[str, str]:
    text = resources.files(__package__).joinpath("queries.sql").read_text()
    queries: dict[str, str] = {}
    for match in _BLOCK.finditer(text):
        lines = [ln for ln in match["body"].splitlines() if not ln.startswith("--")]
        queries[match["name"]] = "\n".join(lines).strip()
    return queries


@functools.cache
def queries(prefix: str) -> dict[str, str]:
    """All named statements, rendered for `prefix`."""
    validate_prefix(prefix)
    return {name: body.replace("{prefix}", prefix) for name, body in _raw_queries().items()}


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


def migrations(prefix: str) -> tuple[Migration, ...]:
    """The numbered migrations, in order, rendered for `prefix`."""
    validate_prefix(prefix)
    return tuple(
        Migration(m.version, m.name, m.sql.replace("{prefix}", prefix)) for m in _raw_migrations()
    )
