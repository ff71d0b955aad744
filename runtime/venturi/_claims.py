"""Claim planning, as pure functions: what the producer asks the database for each round.

- `prefetch_depth`: how many jobs to hold ahead of free slots (short jobs only).
- `claim_groups`: which kinds to claim together and how many: the uncapped kinds in one
  request (or every kind but the capped ones, for a worker that fails unknown kinds), each
  capped kind in its own, never past its cap or the free slots (capped kinds are never
  prefetched, so their work stays pending rather than claimed-and-idle).
- `plan_slots`: weighted-slot anti-starvation, which tiers each claimed slot may take.
- `spread_order`: the order a claim's jobs start in, the reserved lower-tier ones spread.

The queues a worker serves are not planned here: one claim statement takes them in order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

PREFETCH_MAX_FACTOR = 8
"""Most jobs held ahead of free slots, as a multiple of concurrency (short jobs only)."""
PREFETCH_MAX_FLOOR = 1024
"""... but never a cap below this many (so up to concurrency 128). The buffer covers one claim
round trip, and a worker's claims go one at a time: with handlers much shorter than a claim
(no-op jobs) the claims, not the slots, set the pace, and each pays its fixed cost (round
trip, planning, commit) once per batch. A bigger batch pays it less often: a drain of no-op
jobs (in-process, fsync on) by cap, concurrency 16: 128 -> ~20,000 jobs/s, 256 -> ~23,000,
512 -> ~25,000-28,000; concurrency 1: 64 -> ~15,000, 256 -> ~23,000, 512 -> ~24,000-26,000;
in `python -m bench`, 1024 against 512: ~1.07x at concurrency 1 and 16. Whatever the cap, the
buffer holds one round trip's worth of work (see `prefetch_depth`): at this cap a claim of
~500 no-op jobs took about 13 ms. The claim spreads the lower-tier jobs its tier
reservations picked through its rows (claim_v4, v5), so a deep buffer keeps their share in
every stretch of runs."""


def prefetch_depth(concurrency: int, handler_s: float | None, claim_s: float | None) -> int:
    """How many jobs to hold ahead of free slots: enough to keep every slot busy for one
    claim round trip (at least `concurrency`; at most `PREFETCH_MAX_FACTOR` times it, or
    `PREFETCH_MAX_FLOOR` if that is more), but only while handlers run shorter than that
    round trip (then the round trip, not the work, is the limit); none for long jobs, which
    other workers should get instead."""
    if handler_s is None or claim_s is None or handler_s >= claim_s:
        return 0
    per_round_trip = math.ceil(concurrency * claim_s / max(handler_s, 1e-6))
    most = max(PREFETCH_MAX_FACTOR * concurrency, PREFETCH_MAX_FLOOR)
    return min(most, max(concurrency, per_round_trip))


def claim_room(*, free: int, depth: int, buffered: int, concurrency: int) -> int:
    """Jobs to claim now: free slots plus prefetch room, or 0 while the buffer still covers
    the next slots (it is refilled in batches, not one job per freed slot)."""
    room = free + depth - buffered
    if buffered and room < max(1, (concurrency + depth) // 4):
        return 0
    return max(room, 0)


def at_cap(kind: str, caps: Mapping[str, int | None], running: Mapping[str, int]) -> bool:
    cap = caps.get(kind)
    return cap is not None and running.get(kind, 0) >= cap


def claim_groups(
    *,
    kinds: Sequence[str],
    caps: Mapping[str, int | None],
    running: Mapping[str, int],
    free: int,
    limit: int,
    every_kind: bool = False,
) -> list[tuple[list[str] | None, int]]:
    """The claim requests of one round, as (kinds, most jobs): the uncapped kinds together
    up to `limit` (free slots plus prefetch room), then each capped kind below its cap, up
    to its remaining cap and the free slots. Kinds at their cap are left out.

    `every_kind` (a worker that fails the kinds it has no task for): the first request is
    for every kind but the capped ones (None), whether or not any uncapped kind is known."""
    groups: list[tuple[list[str] | None, int]] = []
    uncapped = [k for k in kinds if caps.get(k) is None]
    if every_kind:
        groups.append((None, limit))
    elif uncapped:
        groups.append((uncapped, limit))
    for k in kinds:
        cap = caps.get(k)
        if cap is not None and running.get(k, 0) < cap:
            groups.append(([k], min(free, cap - running.get(k, 0))))
    return [(ks, n) for ks, n in groups if n > 0]


def plan_slots(counter: int, slots: int, ratio: int | None) -> tuple[int, int]:
    """Of `slots` claims (numbered from `counter`), how many are reserved for LOW alone and
    how many for NORMAL-or-LOW: `(reserved_low, reserved_normal)`. The rest take any tier.

    With ratio r, one claim slot in r is reserved for tiers below HIGH, and one in r*r for
    LOW alone, so a flood of high-priority work never starves the lower tiers: each tier step
    down keeps roughly 1/r of the claims while it has work. A reserved slot that finds no
    lower-tier work falls back to any tier, so nothing idles. `ratio=None` is strict
    priority: nothing is reserved."""
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


def spread_order(rows: Sequence[tuple[str, int, bool]]) -> list[int]:
    """The order to start a claim's rows in, as indices into `rows`.

    `rows` are (queue, priority, reserved) in the order the claim returns them: queue by
    queue, each in priority, then FIFO order. Within each queue, the rows a tier reservation
    picked from below that queue's top claimed tier ("lower") are spread evenly among the
    others, each group keeping its order: the i-th of n rows of a group goes at (i + 0.5) / n,
    lower after the others at a tie. So a worker that holds jobs back (prefetch) keeps the
    reserved share in every stretch of runs, rather than running them all after the rest.
    Without such rows (strict priority, one tier, nothing reserved) the order is unchanged.
    """
    order: list[int] = []
    start = 0
    while start < len(rows):
        queue = rows[start][0]
        end = start
        while end < len(rows) and rows[end][0] == queue:
            end += 1
        top = max(priority for _, priority, _ in rows[start:end])
        lower = [i for i in range(start, end) if rows[i][2] and rows[i][1] < top]
        if not lower:
            order.extend(range(start, end))
        else:
            taken = set(lower)
            others = [i for i in range(start, end) if i not in taken]
            keyed = [((k + 0.5) / len(others), 0, i) for k, i in enumerate(others)]
            keyed += [((k + 0.5) / len(lower), 1, i) for k, i in enumerate(lower)]
            order.extend(i for _, _, i in sorted(keyed))
        start = end
    return order
