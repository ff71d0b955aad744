"""Pure status building: conditions in the Kubernetes shape, and the JobQueue's status body.

No I/O; `reconcile` gathers what happened and these functions say it the Kubernetes way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

CONDITION_TYPES = (
    "Ready",
    "DatabaseReachable",
    "ScalingActive",
    "ScalingLimited",
    "Fallback",
    "UnservedKinds",
)


@dataclass(frozen=True, kw_only=True)
class Condition:
    type: str
    ok: bool
    reason: str
    message: str


def conditions(
    new: Sequence[Condition],
    previous: Sequence[Mapping[str, Any]] | None,
    *,
    generation: int,
    now: datetime,
) -> list[dict[str, Any]]:
    """Render conditions, keeping `lastTransitionTime` where a condition's status held."""
    before = {c.get("type"): c for c in previous or () if isinstance(c, Mapping)}
    out = []
    for c in new:
        status = "True" if c.ok else "False"
        old = before.get(c.type)
        since = (
            old.get("lastTransitionTime")
            if old is not None and old.get("status") == status and old.get("lastTransitionTime")
            else _time(now)
        )
        out.append(
            {
                "type": c.type,
                "status": status,
                "reason": c.reason,
                "message": c.message,
                "lastTransitionTime": since,
                "observedGeneration": generation,
            }
        )
    return out


def _time(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def timestamp(t: datetime) -> str:
    """RFC 3339 in UTC, second precision, as Kubernetes writes times."""
    return _time(t)


def dropping_gone_keys(new: Mapping[str, Any], previous: object) -> dict[str, Any]:
    """`new` with, in each of its maps, the keys `previous` had and `new` has not set to None:
    in a JSON merge patch (how the status is written) None deletes a key, and a key left
    out is kept."""
    out = dict(new)
    if not isinstance(previous, Mapping):
        return out
    for field, value in new.items():
        before = previous.get(field)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            out[field] = {**{k: None for k in before if k not in value}, **value}
    return out
