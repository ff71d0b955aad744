"""The policies of a run, by name: venturi, KEDA's two queries and a static fleet; venturi
with one rule changed (the ablations: what that rule costs and buys); clairvoyant bounds."""

from __future__ import annotations

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
ABLATIONS = (NO_SPARE, PACKED, SHORT_HOLD, LONG_HOLD, NO_TREND)
#: Policy constants each ablation replaces while ``decide`` runs.
OVERRIDES: dict[str, dict[str, float]] = {
    SHORT_HOLD: {"BRIDGE_SECONDS": 0.0},
    LONG_HOLD: {"HOLD_SECONDS": 900.0, "BRIDGE_SECONDS": 900.0},
    # A slow average of the whole history: no trend.
    NO_TREND: {"TREND_SECONDS": 1e12},
}
#: Clairvoyant bounds, for the traces with an arrival rate (the full run only).
CLAIRVOYANT = "clairvoyant"
CLAIRVOYANT_SPARED = "clairvoyant, busy pods spared"


def fewer_on(plateau: int) -> str:
    """The step bound's variant with one pod fewer on one plateau."""
    rate = STEP_LEVELS[plateau][1]
    return f"clairvoyant, one pod fewer on plateau {plateau + 1} ({rate:g} jobs/s)"


def policies_for(trace: str, ablations: bool) -> tuple[str, ...]:
    if not ablations:
        return POLICIES
    extra: tuple[str, ...] = ()
    if trace == "step":
        extra = (CLAIRVOYANT, *(fewer_on(i) for i in range(len(STEP_LEVELS))))
    elif trace == "diurnal":
        extra = (CLAIRVOYANT_SPARED,)
    return (*POLICIES, *ABLATIONS, *extra)
