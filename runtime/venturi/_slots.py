"""Weighted-slot anti-starvation: which priority tiers each claimed slot may take.

With ratio r, one claim slot in r is reserved for tiers below HIGH, and one in r*r for
LOW alone, so a flood of high-priority work never starves the lower tiers: each tier step
down keeps roughly 1/r of the claims while it has work. A reserved slot that finds no
lower-tier work falls back to any tier, so nothing idles. Pure; the worker counts slots.
"""

from __future__ import annotations


def plan_slots(counter: int, slots: int, ratio: int | None) -> tuple[int, int]:
    """Of `slots` claims (numbered from `counter`), how many are reserved for LOW alone and
    how many for NORMAL-or-LOW: `(reserved_low, reserved_normal)`. The rest take any tier.
    `ratio=None` is strict priority: nothing is reserved."""
    if ratio is None or ratio <= 1:
        return (0, 0)
    low = normal = 0
    for i in range(counter, counter + slots):
        if i % ratio == ratio - 1:
            if (i // ratio) % ratio == ratio - 1:
                low += 1
            else:
                normal += 1
    return (low, normal)
