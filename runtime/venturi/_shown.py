"""How a value a message refuses is shown: its repr, shortened in the middle so that a long
one still ends as it ends (a str's closing quote, a list's bracket), which a format such as
`!r:.80` cut off."""

from __future__ import annotations


def shown(value: object, limit: int = 80) -> str:
    """`repr(value)`, at most `limit` characters: a longer one keeps its start and its last
    character around an ellipsis."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return text[: max(limit - 2, 1)] + "…" + text[-1]
