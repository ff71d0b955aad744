"""The policies of a run, by name: venturi, KEDA's two queries and a static fleet; venturi
with one rule changed (the ablations: what that rule costs and buys); clairvoyant bounds."""

from __future__ import annotations

from collections.abc import Sequence

from bench.autoscale.traces import STEP_LEVELS

POLICIES = ("venturi", "keda (pending)", "keda (pending+running)", "static")
#: Seeds the goals are not set on: the full run repeats the policies (no ablations) on these,
#: to show which figures hold beyond the issue's seeds.
HELD_OUT = (6, 7, 8, 9, 10)
#: venturi with one rule changed, to show what that rule costs and buys (the full run only).
NO_SPARE = "venturi, busy pods not spared"
PACKED = "venturi, packed placement"
SHORT_HOLD = "venturi, 300 s hold only"
LONG_HOLD = "venturi, 900 s hold always"
NO_TREND = "venturi, no trend"
NO_LAG = "venturi, longer jobs left to the average"
NO_RETRY = "venturi, interval after a held-back scale-in"
#: The scale-in without its fence (the operator before migration 18): victims picked from a
#: read of the claims, with a moment between that read and the scale in which one may claim.
UNFENCED = "venturi, unfenced scale-in"
ABLATIONS = (NO_SPARE, PACKED, NO_RETRY, SHORT_HOLD, LONG_HOLD, NO_TREND, NO_LAG, UNFENCED)
#: The ablations repeated on the held-out seeds too (what they say about interruptions needs
#: every seed).
HELD_OUT_ABLATIONS = (UNFENCED,)
#: Policy constants each ablation replaces while ``decide`` runs.
OVERRIDES: dict[str, dict[str, float]] = {
    SHORT_HOLD: {"BRIDGE_SECONDS": 0.0},
    LONG_HOLD: {"HOLD_SECONDS": 900.0, "BRIDGE_SECONDS": 900.0},
    # A slow average of the whole history: no trend.
    NO_TREND: {"TREND_SECONDS": 1e12},
    # Never a lag: the service time only from the ten-minute average.
    NO_LAG: {"LAG_SIGMAS": 1e12},
}
#: Clairvoyant bounds, for the traces with an arrival rate (the full run only).
CLAIRVOYANT = "clairvoyant"
CLAIRVOYANT_SPARED = "clairvoyant, busy pods spared"


#: The step bound's stretches: one pod fewer for the first k eighths of a plateau.
EIGHTHS = tuple(range(1, 9))
SHORTED = "clairvoyant, one pod fewer for "


def shorted(eighths: Sequence[int]) -> str:
    """The step bound's variant with one pod fewer for the first ``eighths[i]`` eighths of
    plateau i (each plateau after its rise and before its fall)."""
    if len(eighths) != len(STEP_LEVELS) or not all(0 <= e <= 8 for e in eighths):
        raise ValueError(f"expected {len(STEP_LEVELS)} eighths in [0, 8], got {eighths}")
    return SHORTED + ", ".join(f"{e}/8" for e in eighths) + " of the plateaus"


def shorted_eighths(policy: str) -> tuple[int, ...] | None:
    """The eighths of a :func:`shorted` name; None for any other policy."""
    if not policy.startswith(SHORTED):
        return None
    body = policy.removeprefix(SHORTED).removesuffix(" of the plateaus")
    return tuple(int(part.strip().removesuffix("/8")) for part in body.split(","))


def fewer_on(plateau: int, eighths: int = 8) -> str:
    """One pod fewer for the first ``eighths`` eighths of one plateau, the others as they are."""
    return shorted([eighths if i == plateau else 0 for i in range(len(STEP_LEVELS))])


def policies_for(trace: str, ablations: bool) -> tuple[str, ...]:
    if not ablations:
        return POLICIES
    extra: tuple[str, ...] = ()
    if trace == "step":
        extra = (
            CLAIRVOYANT,
            *(fewer_on(i, e) for i in range(len(STEP_LEVELS)) for e in EIGHTHS),
        )
    elif trace == "diurnal":
        extra = (CLAIRVOYANT_SPARED,)
    return (*POLICIES, *ABLATIONS, *extra)
