"""The scaling policy as a function: every rule of venturi_operator.policy, table by table.

The HPA tables are the Kubernetes controller's own test cases (pkg/controller/podautoscaler,
TestScalingWithRules and TestNormalizeDesiredReplicasWithBehavior at v1.36.3), replayed through
``decide``: the recommendation is made to equal the HPA's "prenormalized desired replicas" by
giving each replica a target of one job and no tolerance. The properties at the end hold for any
spec, load, history and time hypothesis can build.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from venturi_operator.policy import (
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    HPA_BEHAVIOR,
    Behavior,
    Decision,
    History,
    PolicyType,
    PoolLoad,
    Reason,
    Recommendation,
    ScaleEvent,
    ScalingPolicy,
    ScalingRules,
    SelectPolicy,
    decide,
)
from venturi_operator.spec import PoolSpec

NOW = 100_000.0
#: A history started long ago, with nothing in it: no window or period sees anything.
OLD = History(started_at=0.0)


def pods(value: int, period: int = 15) -> ScalingPolicy:
    return ScalingPolicy(type=PolicyType.PODS, value=value, period_seconds=period)


def percent(value: int, period: int = 15) -> ScalingPolicy:
    return ScalingPolicy(type=PolicyType.PERCENT, value=value, period_seconds=period)


def rules(
    window: int,
    *policies: ScalingPolicy,
    select: SelectPolicy = SelectPolicy.MAX,
    tolerance: float = 0.1,
) -> ScalingRules:
    return ScalingRules(
        stabilization_window_seconds=window,
        policies=policies,
        select_policy=select,
        tolerance=tolerance,
    )


#: No stabilization and no rate limit: the recommendation goes through as it is.
FREE = Behavior(
    scale_up=rules(0, pods(1_000_000)),
    scale_down=rules(0, percent(100)),
)


def pool(**overrides: object) -> PoolSpec:
    fields: dict[str, object] = {
        "deployment": "workers",
        "max_replicas": 100,
        "target_per_replica": 10,
        "cooldown_seconds": 0,
        "behavior": FREE,
    }
    fields.update(overrides)
    return PoolSpec(**fields)  # type: ignore[arg-type]


def load(pending: int = 0, claimed: int = 0, age: float | None = None) -> PoolLoad:
    return PoolLoad(pending=pending, claimed=claimed, oldest_pending_age=age)


def ago(*pairs: tuple[float, int]) -> tuple[ScaleEvent, ...]:
    """Scale events given as (seconds ago, change)."""
    return tuple(ScaleEvent(at=NOW - seconds, change=change) for seconds, change in pairs)


def spread(changes: Sequence[int], period: int) -> tuple[ScaleEvent, ...]:
    """The HPA tests' generateEventsUniformDistribution: events centred in equal segments."""
    segment = period / len(changes)
    return tuple(
        ScaleEvent(at=NOW - (period - segment * (i + 1) + segment / 2), change=change)
        for i, change in enumerate(changes)
    )


# --- the HPA's rate policies (TestScalingWithRules) ---------------------------------------------


def hpa_rules(
    pods_value: int, pods_period: int, pct: int, pct_period: int, window: int
) -> ScalingRules:
    """The HPA tests' generateScalingRules, without tolerance (the table bypasses it)."""
    policies = []
    if pods_value:
        policies.append(pods(pods_value, pods_period))
    if pct:
        policies.append(percent(pct, pct_period))
    return rules(window, *policies, tolerance=0.0)


UP = dataclasses.replace(DEFAULT_SCALE_UP, tolerance=0.0)
DOWN = dataclasses.replace(DEFAULT_SCALE_DOWN, tolerance=0.0)
WITHIN = None  # the HPA's "DesiredWithinRange": nothing limited the recommendation

# fmt: off
HPA_RATE_CASES = [
    # name, current, desired, min, max, up rules, down rules, up events, down events, replicas, why
    ("within range", 5, 7, 3, 8, UP, DOWN, (), (), 7, WITHIN),
    ("below minReplicas", 3, 1, 2, 8, UP, DOWN, (), (), 2, Reason.TOO_FEW_REPLICAS),
    ("within range when minReplicas is 0", 1, 0, 0, 10, UP, DOWN, (), (), 0, WITHIN),
    ("more than maxReplicas", 100, 1000, 100, 150, UP, DOWN, (), (), 150, Reason.TOO_MANY_REPLICAS),
    ("user scale-up limit", 3, 1000, 1, 2000, hpa_rules(0, 0, 1, 60, 0), DOWN, (), (), 4,
     Reason.SCALE_UP_LIMIT),
    ("user scale-down limit", 1000, 3, 3, 2000, UP, hpa_rules(20, 60, 0, 0, 0), (), (), 980,
     Reason.SCALE_DOWN_LIMIT),
    ("scale-up default behavior", 10, 50, 1, 1000, UP, DOWN, (), (), 20, Reason.SCALE_UP_LIMIT),
    ("pods policy larger than percent", 10, 500, 1, 1000, hpa_rules(100, 60, 100, 60, 0), DOWN,
     (), (), 110, Reason.SCALE_UP_LIMIT),
    ("percent policy larger than pods", 10, 500, 1, 1000, hpa_rules(2, 60, 100, 60, 0), DOWN,
     (), (), 20, Reason.SCALE_UP_LIMIT),
    ("large pods policy", 10, 50, 1, 1000, hpa_rules(100, 60, 0, 0, 0), DOWN, (), (), 50, WITHIN),
    ("large percent policy", 10, 50, 1, 1000, hpa_rules(10000, 60, 0, 0, 0), DOWN, (), (), 50,
     WITHIN),
    ("pods policy limitation", 10, 50, 1, 1000, hpa_rules(30, 60, 0, 0, 0), DOWN, (), (), 40,
     Reason.SCALE_UP_LIMIT),
    ("percent policy limitation", 10, 50, 1, 1000, hpa_rules(0, 0, 200, 60, 0), DOWN, (), (), 30,
     Reason.SCALE_UP_LIMIT),
    ("scale-down percent larger than pods", 100, 2, 1, 1000, UP, hpa_rules(20, 60, 1, 60, 300),
     (), (), 80, Reason.SCALE_DOWN_LIMIT),
    ("scale-down pods larger than percent", 100, 2, 1, 1000, UP, hpa_rules(2, 60, 1, 60, 300),
     (), (), 98, Reason.SCALE_DOWN_LIMIT),
    ("scale-down to minReplicas, large pods policy", 10, 0, 1, 1000, UP,
     hpa_rules(100, 60, 0, 0, 300), (), (), 1, Reason.TOO_FEW_REPLICAS),
    ("scale-down to minReplicas, large percent policy", 10, 2, 5, 1000, UP,
     hpa_rules(0, 0, 100, 60, 300), (), (), 5, Reason.TOO_FEW_REPLICAS),
    ("scale-down pods policy limitation", 10, 2, 1, 1000, UP, hpa_rules(5, 60, 0, 0, 300), (), (),
     5, Reason.SCALE_DOWN_LIMIT),
    ("scale-down percent policy limitation", 10, 5, 1, 1000, UP, hpa_rules(0, 0, 50, 60, 300),
     (), (), 5, WITHIN),
    ("maxReplicas with large pods policy and events", 100, 500, 1, 200,
     hpa_rules(300, 60, 0, 0, 0), DOWN, spread([1, 5, 9], 120), (), 200,
     Reason.TOO_MANY_REPLICAS),
    ("maxReplicas with large percent policy and events", 100, 500, 1, 200,
     hpa_rules(0, 0, 10000, 60, 0), DOWN, spread([1, 5, 9], 120), (), 200,
     Reason.TOO_MANY_REPLICAS),
    ("many recent scale-ups block scale-up", 100, 500, 1, 1000, hpa_rules(5, 120, 0, 0, 0), DOWN,
     spread([1, 5, 9], 120), (), 100, Reason.SCALE_UP_LIMIT),
    ("pods policy and previous scale-ups", 100, 500, 1, 1000, hpa_rules(150, 120, 0, 0, 0), DOWN,
     spread([1, 5, 9], 120), (), 235, Reason.SCALE_UP_LIMIT),
    ("percent policy and previous scale-ups", 100, 500, 1, 1000, hpa_rules(0, 0, 200, 120, 0),
     DOWN, spread([1, 5, 9], 120), (), 255, Reason.SCALE_UP_LIMIT),
    ("percent policy and previous scale-ups and downs", 6, 24, 1, 1000,
     hpa_rules(0, 0, 300, 300, 0), DOWN, spread([4], 120), spread([2], 120), 16,
     Reason.SCALE_UP_LIMIT),
    ("scale-down default policy and previous events", 10, 5, 1, 1000, UP, DOWN, (),
     spread([1, 5, 9], 120), 5, WITHIN),
    ("scale-down large pods policy and events, minReplicas 1", 100, 0, 1, 1000, UP,
     hpa_rules(115, 120, 0, 0, 300), (), spread([1, 5, 9], 120), 1, Reason.TOO_FEW_REPLICAS),
    ("scale-down large pods policy and events, minReplicas 5", 100, 0, 5, 1000, UP,
     hpa_rules(130, 120, 0, 0, 300), (), spread([1, 5, 9], 120), 5, Reason.TOO_FEW_REPLICAS),
    ("scale-down large percent policy and events", 100, 2, 5, 1000, UP,
     hpa_rules(0, 0, 100, 120, 300), (), spread([1, 5, 9], 120), 5, Reason.TOO_FEW_REPLICAS),
    ("scale-down pods policy limitation and events", 100, 2, 1, 1000, UP,
     hpa_rules(5, 120, 0, 0, 300), (), spread([1, 5, 9], 120), 100, Reason.SCALE_DOWN_LIMIT),
    ("scale-down percent policy limitation and events", 100, 0, 1, 1000, UP,
     hpa_rules(0, 0, 50, 120, 300), (), spread([2, 4, 6], 120), 56, Reason.SCALE_DOWN_LIMIT),
    ("scale-down percent policy and previous ups and downs", 10, 1, 1, 1000, UP,
     hpa_rules(0, 0, 50, 180, 0), spread([2], 120), spread([4], 120), 6,
     Reason.SCALE_DOWN_LIMIT),
    ("previous scale-downs prevent further scale-down", 100, 0, 1, 1000, UP,
     hpa_rules(0, 0, 10, 120, 300), (), spread([10, 10, 10], 120), 100, Reason.SCALE_DOWN_LIMIT),
    ("previous scale-downs still allow more", 10, 5, 1, 1000, UP,
     hpa_rules(0, 0, 1000, 120, 300), (), spread([10, 10, 10], 120), 5, WITHIN),
    ("outdated up events, one policy", 100, 200, 1, 1000, hpa_rules(1000, 60, 0, 0, 0), DOWN,
     spread([8, 12, 9, 11], 120), (), 200, WITHIN),
    ("up events, two policies, longer period", 100, 200, 1, 1000,
     hpa_rules(1000, 120, 100, 60, 0), DOWN, spread([8, 12, 9, 11], 120), (), 200, WITHIN),
    ("up events, two policies, shorter period", 100, 200, 1, 1000,
     hpa_rules(1000, 30, 100, 60, 0), DOWN, spread([8, 12, 9, 11], 120), (), 200, WITHIN),
    ("outdated down events, one policy", 100, 5, 1, 1000, UP, hpa_rules(1000, 60, 0, 0, 300), (),
     spread([8, 12, 9, 11], 120), 5, WITHIN),
    ("down events, two policies, longer period", 100, 5, 1, 1000, UP,
     hpa_rules(1000, 120, 100, 60, 300), (), spread([8, 12, 9, 11], 120), 5, WITHIN),
    ("down events, two policies, shorter period", 100, 5, 1, 1000, UP,
     hpa_rules(1000, 30, 100, 60, 300), (), spread([8, 12, 9, 11], 120), 5, WITHIN),
]
# fmt: on


@pytest.mark.parametrize(
    ("current", "desired", "low", "high", "up", "down", "ups", "downs", "replicas", "why"),
    [pytest.param(*case[1:], id=case[0]) for case in HPA_RATE_CASES],
)
def test_rate_policies_match_the_hpa(
    current: int,
    desired: int,
    low: int,
    high: int,
    up: ScalingRules,
    down: ScalingRules,
    ups: tuple[ScaleEvent, ...],
    downs: tuple[ScaleEvent, ...],
    replicas: int,
    why: Reason | None,
) -> None:
    spec = pool(
        min_replicas=low,
        max_replicas=high,
        target_per_replica=1,
        behavior=Behavior(scale_up=up, scale_down=down),
    )
    history = dataclasses.replace(OLD, scale_ups=ups, scale_downs=downs)
    decision = decide(load(pending=desired), spec, history, NOW, current=current)
    assert decision.recommendation == desired
    assert decision.replicas == replicas
    if why is WITHIN:
        assert not decision.limited
    else:
        assert decision.limited
        assert decision.reason == why


def test_select_policy_min_picks_the_smallest_change() -> None:
    """The HPA's TestCalculateScale{Up,Down}Limit...: Pods 2/60s and Percent 50/60s, Min."""
    both = rules(300, pods(2, 60), percent(50, 60), select=SelectPolicy.MIN, tolerance=0.0)
    up = pool(target_per_replica=1, behavior=Behavior(scale_up=both, scale_down=FREE.scale_down))
    assert decide(load(pending=100), up, OLD, NOW, current=1).replicas == 2
    down = pool(
        min_replicas=1,
        target_per_replica=1,
        behavior=Behavior(
            scale_up=FREE.scale_up,
            scale_down=dataclasses.replace(both, stabilization_window_seconds=0),
        ),
    )
    assert decide(load(pending=1), down, OLD, NOW, current=5).replicas == 3


def test_disabled_select_policy_blocks_that_direction() -> None:
    no_up = Behavior(
        scale_up=rules(0, pods(4), select=SelectPolicy.DISABLED), scale_down=FREE.scale_down
    )
    decision = decide(load(pending=200), pool(behavior=no_up), OLD, NOW, current=3)
    assert (decision.replicas, decision.reason) == (3, Reason.SCALE_UP_DISABLED)
    no_down = Behavior(
        scale_up=FREE.scale_up, scale_down=rules(0, percent(100), select=SelectPolicy.DISABLED)
    )
    decision = decide(load(pending=10), pool(behavior=no_down), OLD, NOW, current=8)
    assert (decision.replicas, decision.reason) == (8, Reason.SCALE_DOWN_DISABLED)


def test_the_docs_worked_example_80_to_10() -> None:
    """The HPA docs: Pods 4/60s and Percent 10/60s, scaling 80 down to 10."""
    docs = Behavior(scale_up=FREE.scale_up, scale_down=rules(0, pods(4, 60), percent(10, 60)))
    spec = pool(min_replicas=1, target_per_replica=1, behavior=docs)
    current, history, now, steps = 80, OLD, NOW, []
    while current != 10:
        decision = decide(load(pending=10), spec, history, now, current=current)
        steps.append(current - decision.replicas)
        current, history, now = decision.replicas, decision.history, now + 61
    # "during the first step 8 replicas will be reduced. In the next iteration when the number of
    # replicas is 72, 10% of the pods is 7.2 but the number is rounded up to 8 ... When the number
    # of replicas falls below 40 the first policy (Pods) is applied and 4 replicas will be reduced
    # at a time."
    assert steps[:2] == [8, 8]
    assert steps[-3:] == [4, 4, 2]
    assert all(step >= 4 for step in steps[:-1])


def test_a_policy_period_forgets_older_events() -> None:
    spec = pool(
        target_per_replica=1,
        behavior=Behavior(scale_up=rules(0, pods(2, 60)), scale_down=FREE.scale_down),
    )
    recent = dataclasses.replace(OLD, scale_ups=ago((30, 2)))
    assert decide(load(pending=50), spec, recent, NOW, current=4).replicas == 4  # 2 + 2
    stale = dataclasses.replace(OLD, scale_ups=ago((60, 2)))  # exactly one period ago: out
    assert decide(load(pending=50), spec, stale, NOW, current=4).replicas == 6


# --- the HPA's stabilization (TestNormalizeDesiredReplicasWithBehavior) --------------------------

# fmt: off
HPA_STABILIZATION_CASES = [
    # name, recommendations (minutes ago, replicas), current, desired, up, down windows, result
    ("empty recommendations for scaling down", [], 100, 5, 0, 0, 5),
    ("simple scale down stabilization", [(2, 4), (1, 5)], 100, 3, 0, 180, 5),
    ("simple scale up stabilization", [(2, 4), (1, 5)], 1, 7, 300, 0, 4),
    ("no scale down stabilization", [(2, 1), (1, 2)], 100, 3, 300, 0, 3),
    ("no scale up stabilization", [(2, 4), (1, 5)], 1, 3, 0, 300, 3),
    ("no scale down stabilization, old samples", [(10, 10), (9, 9)], 100, 3, 0, 0, 3),
    ("no scale up stabilization, old samples", [(10, 10), (9, 9)], 1, 100, 0, 0, 100),
    ("scale down stabilization, some obsolete", [(10, 10), (1, 4), (2, 5), (9, 9)], 100, 3, 0, 180,
     5),
    ("scale up stabilization, some obsolete", [(100, 10), (1, 6), (2, 5), (3, 9)], 1, 100, 300, 0,
     5),
    ("no scale up when the recommendation goes down", [(100, 2), (3, 3)], 2, 1, 300, 300, 2),
    ("no scale down when the recommendation goes up", [(100, 2), (3, 1)], 2, 3, 300, 300, 2),
]
# fmt: on


@pytest.mark.parametrize(
    ("recommendations", "current", "desired", "up_window", "down_window", "replicas"),
    [pytest.param(*case[1:], id=case[0]) for case in HPA_STABILIZATION_CASES],
)
def test_stabilization_matches_the_hpa(
    recommendations: list[tuple[int, int]],
    current: int,
    desired: int,
    up_window: int,
    down_window: int,
    replicas: int,
) -> None:
    behavior = Behavior(
        scale_up=rules(up_window, pods(1_000_000), tolerance=0.0),
        scale_down=rules(down_window, percent(100), tolerance=0.0),
    )
    history = dataclasses.replace(
        OLD,
        recommendations=tuple(
            Recommendation(at=NOW - 60 * minutes, replicas=r) for minutes, r in recommendations
        ),
    )
    spec = pool(max_replicas=1000, target_per_replica=1, behavior=behavior)
    decision = decide(load(pending=desired), spec, history, NOW, current=current)
    assert decision.replicas == replicas
    if replicas != desired:
        expected = (
            Reason.SCALE_UP_STABILIZED if desired >= current else Reason.SCALE_DOWN_STABILIZED
        )
        assert decision.reason == expected


@pytest.mark.parametrize(
    ("seconds_ago", "replicas"),
    [
        pytest.param(299.0, 9, id="inside the scale-down window"),
        pytest.param(300.0, 2, id="exactly one window ago: out, as the HPA's After(cutoff)"),
    ],
)
def test_scale_down_window_edge(seconds_ago: float, replicas: int) -> None:
    behavior = Behavior(scale_up=FREE.scale_up, scale_down=rules(300, percent(100)))
    history = dataclasses.replace(
        OLD, recommendations=(Recommendation(at=NOW - seconds_ago, replicas=9),)
    )
    decision = decide(load(pending=20), pool(behavior=behavior), history, NOW, current=9)
    assert decision.replicas == replicas


@pytest.mark.parametrize(
    ("seconds_ago", "replicas"),
    [
        pytest.param(59.0, 3, id="inside the scale-up window"),
        pytest.param(60.0, 8, id="exactly one window ago: out"),
    ],
)
def test_scale_up_window_edge(seconds_ago: float, replicas: int) -> None:
    behavior = Behavior(scale_up=rules(60, pods(100)), scale_down=FREE.scale_down)
    history = dataclasses.replace(
        OLD, recommendations=(Recommendation(at=NOW - seconds_ago, replicas=3),)
    )
    decision = decide(load(pending=80), pool(behavior=behavior), history, NOW, current=2)
    assert decision.replicas == replicas


def test_recommendations_are_recorded_and_pruned() -> None:
    behavior = Behavior(scale_up=rules(60, pods(4)), scale_down=rules(120, percent(100)))
    history = dataclasses.replace(
        OLD,
        recommendations=(
            Recommendation(at=NOW - 121, replicas=9),
            Recommendation(at=NOW - 90, replicas=7),
        ),
    )
    decision = decide(load(pending=30), pool(behavior=behavior), history, NOW, current=3)
    assert decision.history.recommendations == (
        Recommendation(at=NOW - 90, replicas=7),
        Recommendation(at=NOW, replicas=3),
    )


def test_a_fresh_history_holds_the_current_count_like_the_hpa() -> None:
    """After an operator restart the current count is the first recommendation."""
    spec = pool(behavior=Behavior(scale_up=FREE.scale_up, scale_down=rules(300, percent(100))))
    decision = decide(load(pending=10), spec, History(), NOW, current=8)
    assert (decision.replicas, decision.reason) == (8, Reason.SCALE_DOWN_STABILIZED)
    assert decision.history.started_at == NOW
    later = decide(load(pending=10), spec, decision.history, NOW + 301, current=8)
    assert later.replicas == 1


# --- the recommendation: counts, tolerance, latency ---------------------------------------------


@pytest.mark.parametrize(
    ("pending", "claimed", "current", "replicas", "reason"),
    [
        pytest.param(25, 0, 1, 3, Reason.BACKLOG_ABOVE_TARGET, id="ceil of pending"),
        pytest.param(0, 30, 1, 3, Reason.BACKLOG_ABOVE_TARGET, id="claimed jobs count"),
        pytest.param(12, 19, 2, 4, Reason.BACKLOG_ABOVE_TARGET, id="pending plus claimed"),
        pytest.param(30, 0, 3, 3, Reason.AT_TARGET, id="exactly at target"),
        pytest.param(105, 0, 10, 10, Reason.WITHIN_TOLERANCE, id="5% above: tolerated"),
        pytest.param(110, 0, 10, 10, Reason.WITHIN_TOLERANCE, id="10% above: tolerated"),
        pytest.param(111, 0, 10, 12, Reason.BACKLOG_ABOVE_TARGET, id="11% above: scales"),
        pytest.param(90, 0, 10, 10, Reason.WITHIN_TOLERANCE, id="10% below: tolerated"),
        pytest.param(89, 0, 10, 9, Reason.BACKLOG_BELOW_TARGET, id="11% below: scales"),
        pytest.param(1, 0, 0, 1, Reason.ACTIVATED, id="from zero: no tolerance"),
    ],
)
def test_recommendation_counts_pending_and_claimed(
    pending: int, claimed: int, current: int, replicas: int, reason: Reason
) -> None:
    decision = decide(load(pending, claimed), pool(), OLD, NOW, current=current)
    assert (decision.replicas, decision.reason) == (replicas, reason)


def test_tolerance_is_per_direction() -> None:
    behavior = Behavior(
        scale_up=rules(0, pods(100), tolerance=0.05),
        scale_down=rules(0, percent(100), tolerance=0.5),
    )
    spec = pool(behavior=behavior)
    assert decide(load(106), spec, OLD, NOW, current=10).replicas == 11
    assert decide(load(104), spec, OLD, NOW, current=10).replicas == 10
    assert decide(load(50), spec, OLD, NOW, current=10).replicas == 10
    assert decide(load(49), spec, OLD, NOW, current=10).replicas == 5


@pytest.mark.parametrize(
    ("pending", "claimed", "age", "current", "replicas", "reason"),
    [
        pytest.param(15, 0, 61.0, 2, 3, Reason.PENDING_AGE_ABOVE_TARGET, id="one more replica"),
        pytest.param(15, 0, 60.0, 2, 2, Reason.AT_TARGET, id="at the age target: counts rule"),
        pytest.param(5, 0, 60.0, 2, 0, Reason.IDLE, id="below threshold and age: idle"),
        pytest.param(2, 1, 600.0, 3, 3, Reason.PENDING_AGE_ABOVE_TARGET, id="one per job at most"),
        pytest.param(2, 1, 600.0, 7, 3, Reason.PENDING_AGE_ABOVE_TARGET, id="down to one per job"),
        pytest.param(90, 0, 600.0, 2, 9, Reason.BACKLOG_ABOVE_TARGET, id="count wins when larger"),
        pytest.param(3, 0, 61.0, 0, 1, Reason.ACTIVATED, id="wakes a sleeping pool"),
    ],
)
def test_latency_term(
    pending: int, claimed: int, age: float, current: int, replicas: int, reason: Reason
) -> None:
    spec = pool(max_oldest_pending_age=60, activation_threshold=10)
    decision = decide(load(pending, claimed, age), spec, OLD, NOW, current=current)
    assert (decision.replicas, decision.reason) == (replicas, reason)


def test_latency_term_needs_a_target() -> None:
    decision = decide(load(5, 0, 10_000.0), pool(), OLD, NOW, current=2)
    assert decision.replicas == 1


def test_latency_term_climbs_one_replica_per_tick_and_settles() -> None:
    spec = pool(max_oldest_pending_age=60, behavior=Behavior())
    current, history, seen = 1, OLD, []
    for tick in range(40):
        decision = decide(load(6, 0, 900.0), spec, history, NOW + 15 * tick, current=current)
        current, history = decision.replicas, decision.history
        seen.append(current)
    assert seen[:5] == [2, 3, 4, 5, 6]
    assert set(seen[5:]) == {6}


# --- activation, cooldown, zero ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pending", "claimed", "replicas", "reason"),
    [
        pytest.param(0, 0, 0, Reason.IDLE, id="nothing to do"),
        pytest.param(5, 0, 0, Reason.IDLE, id="at the threshold: asleep"),
        pytest.param(6, 0, 1, Reason.ACTIVATED, id="above the threshold: wakes"),
        pytest.param(0, 1, 1, Reason.ACTIVATED, id="a claimed job wakes it"),
        pytest.param(200, 0, 20, Reason.ACTIVATED, id="no limits: what it needs at once"),
    ],
)
def test_activation_from_zero(pending: int, claimed: int, replicas: int, reason: Reason) -> None:
    spec = pool(activation_threshold=5, behavior=Behavior())
    decision = decide(load(pending, claimed), spec, OLD, NOW, current=0)
    assert (decision.replicas, decision.reason) == (replicas, reason)


def test_activation_from_zero_honours_the_users_scale_up_policies() -> None:
    spec = pool(behavior=HPA_BEHAVIOR)
    decision = decide(load(200), spec, OLD, NOW, current=0)
    assert (decision.replicas, decision.reason) == (4, Reason.ACTIVATED)


@pytest.mark.parametrize(
    "up",
    [
        pytest.param(rules(0, pods(4), select=SelectPolicy.DISABLED), id="scale-up disabled"),
        pytest.param(rules(600, pods(4)), id="scale-up window full of zeros"),
        pytest.param(rules(0, percent(100)), id="percent of zero is zero"),
    ],
)
def test_activation_wakes_whatever_the_behavior(up: ScalingRules) -> None:
    history = dataclasses.replace(
        OLD, recommendations=tuple(Recommendation(at=NOW - s, replicas=0) for s in (300, 200, 100))
    )
    spec = pool(behavior=Behavior(scale_up=up, scale_down=FREE.scale_down))
    decision = decide(load(pending=50), spec, history, NOW, current=0)
    assert decision.replicas >= 1
    assert decision.reason == Reason.ACTIVATED


def test_cooldown_applies_only_to_the_last_replica() -> None:
    """KEDA #7770: N -> 1 follows behavior; 1 -> 0 waits until idle for cooldownSeconds."""
    spec = pool(cooldown_seconds=300)
    history = dataclasses.replace(OLD, last_active=NOW - 100)
    decision = decide(load(), spec, history, NOW, current=6)
    assert (decision.replicas, decision.reason) == (1, Reason.SCALE_TO_ZERO_COOLDOWN)
    decision = decide(load(), spec, decision.history, NOW + 199, current=1)
    assert (decision.replicas, decision.reason) == (1, Reason.SCALE_TO_ZERO_COOLDOWN)
    decision = decide(load(), spec, decision.history, NOW + 200, current=1)
    assert (decision.replicas, decision.reason) == (0, Reason.IDLE)


def test_cooldown_counts_from_the_last_activity() -> None:
    spec = pool(cooldown_seconds=300)
    history = dataclasses.replace(OLD, last_active=NOW - 1000)
    busy = decide(load(pending=3), spec, history, NOW, current=1)
    assert busy.history.last_active == NOW
    assert decide(load(), spec, busy.history, NOW + 15, current=1).replicas == 1
    assert decide(load(), spec, busy.history, NOW + 300, current=1).replicas == 0


def test_cooldown_after_a_restart_counts_from_the_first_tick() -> None:
    spec = pool(cooldown_seconds=300)
    first = decide(load(), spec, History(), NOW, current=1)
    assert first.replicas == 1
    assert decide(load(), spec, first.history, NOW + 299, current=1).replicas == 1
    assert decide(load(), spec, first.history, NOW + 300, current=1).replicas == 0


def test_scale_down_policy_is_honoured_on_the_way_to_zero() -> None:
    """KEDA #7204: the last steps to zero go through the scale-down policies."""
    spec = pool(behavior=Behavior(scale_up=FREE.scale_up, scale_down=rules(0, pods(2))))
    current, history, path = 5, OLD, []
    for tick in range(5):
        decision = decide(load(), spec, history, NOW + 20 * tick, current=current)
        current, history = decision.replicas, decision.history
        path.append(current)
    assert path == [3, 1, 0, 0, 0]


@pytest.mark.parametrize("current", [1, 2, 7])
def test_never_zero_while_a_job_is_claimed(current: int) -> None:
    decision = decide(
        load(pending=0, claimed=1), pool(target_per_replica=50), OLD, NOW, current=current
    )
    assert decision.replicas == 1


def test_idle_pool_at_zero_stays_at_zero() -> None:
    decision = decide(load(), pool(), OLD, NOW, current=0)
    assert (decision.replicas, decision.reason, decision.limited) == (0, Reason.IDLE, False)


# --- bounds, fallback, pause --------------------------------------------------------------------


def test_current_above_max_goes_to_max_whatever_the_load() -> None:
    decision = decide(load(pending=10_000), pool(max_replicas=5), OLD, NOW, current=9)
    assert (decision.replicas, decision.reason) == (5, Reason.ABOVE_MAX_REPLICAS)


def test_current_below_min_goes_to_min_whatever_the_load() -> None:
    decision = decide(load(), pool(min_replicas=2), OLD, NOW, current=0)
    assert (decision.replicas, decision.reason) == (2, Reason.BELOW_MIN_REPLICAS)


@pytest.mark.parametrize(
    ("fallback", "current", "replicas", "reason"),
    [
        pytest.param(None, 4, 4, Reason.STATS_UNAVAILABLE, id="keeps current"),
        pytest.param(None, 0, 0, Reason.STATS_UNAVAILABLE, id="keeps zero"),
        pytest.param(3, 0, 3, Reason.FALLBACK_REPLICAS, id="fallback from zero (KEDA #7239)"),
        pytest.param(3, 1, 3, Reason.FALLBACK_REPLICAS, id="fallback raises"),
        pytest.param(3, 7, 7, Reason.STATS_UNAVAILABLE, id="fallback never lowers"),
        pytest.param(3, 30, 10, Reason.STATS_UNAVAILABLE, id="maxReplicas still holds"),
    ],
)
def test_fallback_when_stats_cannot_be_read(
    fallback: int | None, current: int, replicas: int, reason: Reason
) -> None:
    spec = pool(max_replicas=10, fallback_replicas=fallback)
    decision = decide(None, spec, OLD, NOW, current=current)
    assert (decision.replicas, decision.reason, decision.fallback) == (replicas, reason, True)
    assert decision.recommendation is None


def test_fallback_scale_up_counts_against_the_rate_policies() -> None:
    spec = pool(
        fallback_replicas=3,
        behavior=Behavior(scale_up=rules(0, pods(3, 60)), scale_down=FREE.scale_down),
    )
    decision = decide(None, spec, OLD, NOW, current=0)
    assert decision.history.scale_ups == (ScaleEvent(at=NOW, change=3),)
    after = decide(load(pending=1000), spec, decision.history, NOW + 30, current=3)
    assert (after.replicas, after.reason) == (3, Reason.SCALE_UP_LIMIT)


def test_paused_keeps_replicas_and_history() -> None:
    history = dataclasses.replace(OLD, last_active=NOW - 5)
    decision = decide(load(pending=500), pool(), history, NOW, current=2, paused=True)
    assert (decision.replicas, decision.reason) == (2, Reason.PAUSED)
    assert decision.history == history


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="current"):
        decide(load(), pool(), OLD, NOW, current=-1)
    with pytest.raises(ValueError, match="non-negative"):
        load(pending=-1)
    with pytest.raises(ValueError, match="oldest_pending_age"):
        load(pending=1, age=-1.0)


def test_every_reason_is_a_valid_condition_reason() -> None:
    condition_reason = re.compile(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?")
    assert all(condition_reason.fullmatch(reason.value) for reason in Reason)


# --- properties ----------------------------------------------------------------------------------

policy_strategy = st.builds(
    ScalingPolicy,
    type=st.sampled_from(PolicyType),
    value=st.integers(1, 300),
    period_seconds=st.integers(1, 300),
)
rules_strategy = st.builds(
    ScalingRules,
    stabilization_window_seconds=st.integers(0, 600),
    policies=st.lists(policy_strategy, min_size=1, max_size=3).map(tuple),
    select_policy=st.sampled_from(SelectPolicy),
    tolerance=st.sampled_from([0.0, 0.05, 0.1, 0.5]),
)


@st.composite
def pools(draw: st.DrawFn) -> PoolSpec:
    high = draw(st.integers(1, 40))
    return PoolSpec(
        deployment="workers",
        min_replicas=draw(st.integers(0, high)),
        max_replicas=high,
        target_per_replica=draw(st.integers(1, 20)),
        max_oldest_pending_age=draw(st.none() | st.integers(1, 600)),
        activation_threshold=draw(st.integers(0, 10)),
        cooldown_seconds=draw(st.integers(0, 600)),
        fallback_replicas=draw(st.none() | st.integers(1, high)),
        behavior=Behavior(scale_up=draw(rules_strategy), scale_down=draw(rules_strategy)),
    )


loads = st.builds(
    PoolLoad,
    pending=st.integers(0, 1000),
    claimed=st.integers(0, 200),
    oldest_pending_age=st.none() | st.floats(0, 3600),
)


@st.composite
def histories(draw: st.DrawFn) -> History:
    if draw(st.booleans()):
        return History()
    times = st.floats(NOW - 3600, NOW)
    recommendations = draw(
        st.lists(st.builds(Recommendation, at=times, replicas=st.integers(0, 60)), max_size=8)
    )
    events = st.lists(st.builds(ScaleEvent, at=times, change=st.integers(1, 20)), max_size=4)
    # What the pool was seen to do, edges included: no slot-seconds held though jobs finished
    # (jobs that start and finish between two ticks), no time observed, a start-up under way.
    amounts = st.sampled_from([0.0, 1e-9, 0.5, 4.0]) | st.floats(0, 1e5)
    spans = st.sampled_from([0.0, 1e-9, 15.0]) | st.floats(0, 600)
    return History(
        started_at=NOW - 3600,
        last_active=draw(st.none() | times),
        recommendations=tuple(sorted(recommendations, key=lambda r: r.at)),
        scale_ups=tuple(draw(events)),
        scale_downs=tuple(draw(events)),
        arrived=draw(amounts),
        arrival_span=draw(spans),
        arrived_slow=draw(amounts),
        arrival_span_slow=draw(spans),
        bursts=tuple(sorted(draw(st.lists(times, max_size=3)))),
        held=draw(amounts),
        finished=draw(amounts),
        finished_seen=draw(st.integers(0, 10_000)),
        startup_seconds=draw(st.none() | st.sampled_from([0.0, 15.0]) | st.floats(0, 600)),
        starting=draw(st.none() | st.tuples(times, st.integers(1, 60))),
    )


def test_jobs_that_finish_between_ticks_read_as_short_not_as_no_time() -> None:
    """The held time is sampled at ticks: a pool whose jobs start and finish between two
    ticks holds none, though many finished. A service time of 0 divided the slots' rate by
    zero, and every tick of the pool failed."""
    seen = History(
        started_at=NOW - 3600, held=0.0, finished=10.0, finished_seen=100,
        arrived=30.0, arrival_span=60.0,
    )  # fmt: skip
    assert seen.service_seconds is not None and seen.service_seconds > 0
    decision = decide(load(pending=100), pool(), seen, NOW, current=1)
    assert decision.replicas == 1  # short jobs: one replica clears the queue at once
    assert decide(load(pending=100), pool(), seen, NOW, current=0).replicas == 1


PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(pools(), st.none() | loads, histories(), st.integers(0, 80))
def test_replicas_always_within_bounds(
    spec: PoolSpec, pool_load: PoolLoad | None, history: History, current: int
) -> None:
    decision = decide(pool_load, spec, history, NOW, current=current)
    assert spec.min_replicas <= decision.replicas <= spec.max_replicas
    assert decision.fallback == (pool_load is None)


@PROPERTY
@given(pools(), loads, histories(), st.integers(0, 80))
def test_never_zero_while_claimed(
    spec: PoolSpec, pool_load: PoolLoad, history: History, current: int
) -> None:
    decision = decide(pool_load, spec, history, NOW, current=current)
    if pool_load.claimed > 0:
        assert decision.replicas >= 1


@PROPERTY
@given(pools(), histories(), st.integers(0, 80))
def test_fallback_never_scales_down_within_bounds(
    spec: PoolSpec, history: History, current: int
) -> None:
    decision = decide(None, spec, history, NOW, current=current)
    assert decision.replicas >= min(current, spec.max_replicas)
    if spec.fallback_replicas is not None:
        assert decision.replicas >= spec.fallback_replicas


@PROPERTY
@given(pools(), loads, st.integers(1, 500), st.integers(0, 50), histories(), st.integers(0, 80))
def test_more_backlog_never_means_fewer_replicas(
    spec: PoolSpec,
    pool_load: PoolLoad,
    more_pending: int,
    more_claimed: int,
    history: History,
    current: int,
) -> None:
    bigger = dataclasses.replace(
        pool_load,
        pending=pool_load.pending + more_pending,
        claimed=pool_load.claimed + more_claimed,
    )
    small = decide(pool_load, spec, history, NOW, current=current)
    large = decide(bigger, spec, history, NOW, current=current)
    assert large.replicas >= small.replicas


def _simulate(
    spec: PoolSpec, pool_load: PoolLoad, current: int, ticks: int, step: float
) -> list[Decision]:
    history, decisions = History(), []
    for tick in range(ticks):
        decision = decide(pool_load, spec, history, NOW + step * tick, current=current)
        current, history = decision.replicas, decision.history
        decisions.append(decision)
    return decisions


def _longest_memory(spec: PoolSpec) -> int:
    """Seconds after which nothing the policy remembers can change its next decision."""
    up, down = spec.behavior.scale_up, spec.behavior.scale_down
    assert up is not None and down is not None
    return (
        max(up.stabilization_window_seconds, down.stabilization_window_seconds)
        + max(p.period_seconds for r in (up, down) for p in r.policies)
        + spec.cooldown_seconds
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pools(), loads, st.integers(0, 60), st.sampled_from([15.0, 30.0]))
def test_constant_load_converges_and_stays_put(
    spec: PoolSpec, pool_load: PoolLoad, current: int, step: float
) -> None:
    """Once replicas held still for longer than the policy's memory, they hold forever.

    Within that time every window, period and cooldown has seen only this constant state, so the
    state is a fixed point; the loop then runs as long again to show it.
    """
    quiet = math.ceil(_longest_memory(spec) / step) + 2
    # Generous: every replica between here and a bound may take a whole memory to move.
    limit = quiet * (max(spec.max_replicas, current) + 3)
    history, unchanged, tick = History(), 0, 0
    while unchanged < 2 * quiet:
        assert tick < limit, f"still moving after {tick} ticks"
        decision = decide(pool_load, spec, history, NOW + step * tick, current=current)
        unchanged = unchanged + 1 if decision.replicas == current else 0
        current, history, tick = decision.replicas, decision.history, tick + 1


def test_constant_idle_load_ends_at_zero() -> None:
    decisions = _simulate(pool(behavior=Behavior(), cooldown_seconds=300), load(), 7, 60, 15.0)
    assert decisions[-1].replicas == 0
    assert all(d.replicas >= 1 for d in decisions[: 300 // 15])  # the restart and the cooldown


# --- what the pool does: rates from the finished totals ------------------------------------


def steady(
    rate: float,
    service: float,
    *,
    spec: PoolSpec | None = None,
    current: int = 10,
    ticks: int = 80,
    step: float = 15.0,
) -> tuple[History, float, int]:
    """Ticks of a pool at a steady state (``rate`` jobs/s of ``service`` s each, nothing
    pending): the history they leave, the time of the next tick, the finished total so far."""
    spec = spec or pool(target_per_replica=8, behavior=Behavior())
    history, finished = OLD, 0
    claimed = round(rate * service)
    for tick in range(ticks):
        now = NOW + step * tick
        finished = round(rate * step * tick)
        decision = decide(
            PoolLoad(pending=0, claimed=claimed, finished=finished),
            spec,
            history,
            now,
            current=current,
        )
        history = decision.history
    return history, NOW + step * ticks, finished


def test_rates_come_from_differencing_the_finished_totals() -> None:
    history, _, _ = steady(10.0, 9.0)
    assert history.arrival_rate == pytest.approx(10.0, rel=0.01)
    assert history.service_seconds == pytest.approx(9.0, rel=0.01)


def test_no_service_time_before_jobs_have_been_seen_finish() -> None:
    history, _, _ = steady(10.0, 9.0, ticks=1)
    assert history.service_seconds is None


def _longer_jobs(
    per_tick: Sequence[int], *, claimed: int = 8
) -> tuple[list[float], list[Decision]]:
    """A pool of one replica that ran 2 s jobs for ten minutes (2 jobs/s, 4 slots busy), whose
    jobs now fill its 8 slots with 40 waiting, ``per_tick[i]`` finishing in tick i: the service
    time it reads after each tick, and the decisions."""
    spec = pool(target_per_replica=8, behavior=Behavior())
    history, now, finished = steady(2.0, 2.0, spec=spec, current=1, ticks=40)
    readings: list[float] = []
    decisions: list[Decision] = []
    for done in per_tick:
        finished += done
        decision = decide(
            PoolLoad(pending=40, claimed=claimed, finished=finished), spec, history, now, current=1
        )
        history, now = decision.history, now + 15.0
        assert history.service_seconds is not None
        readings.append(history.service_seconds)
        decisions.append(decision)
    return readings, decisions


def test_jobs_that_got_longer_are_read_from_two_ticks() -> None:
    """Jobs that now run 20 s (a dependency slowing down): 6 finish a tick where the 2 s jobs
    expected 45-60. The ten-minute average, mostly the short jobs before, read 2.2, 2.3, 2.5 s
    ... (one replica kept while 40 jobs waited); two ticks as far below it are the two ticks'
    own service time (the first straddles the change), and the pool grows at once."""
    readings, decisions = _longer_jobs([6, 6, 6])
    assert readings[0] == pytest.approx(2.0, rel=0.1)  # one tick alone: maybe noise
    # Slot-seconds over the two ticks (6 then 8 busy on average) over the 12 jobs finished.
    assert readings[1] == pytest.approx((6 * 15 + 8 * 15) / 12, rel=0.01)
    assert readings[2] == pytest.approx(readings[1], rel=0.2)
    assert decisions[0].replicas == 1
    assert decisions[1].replicas >= 4, decisions[1].message


def test_a_pool_that_finishes_nothing_reads_at_most_four_times_longer_jobs() -> None:
    readings, _ = _longer_jobs([0, 0])
    assert readings[1] == pytest.approx(4 * readings[0], rel=0.01)


def test_a_tick_of_few_finishes_between_normal_ones_changes_nothing() -> None:
    """One slow tick between ticks at the usual pace (a batch of long jobs, a pause): the
    average takes it, nothing more."""
    readings, _ = _longer_jobs([6, 30, 6], claimed=4)
    assert all(r == pytest.approx(2.0, rel=0.25) for r in readings), readings


def test_a_cleanup_that_lowers_the_totals_skips_that_sample() -> None:
    history, now, finished = steady(10.0, 9.0)
    after = decide(
        PoolLoad(pending=0, claimed=90, finished=finished - 5000),
        pool(target_per_replica=8, behavior=Behavior()),
        history,
        now,
        current=10,
    ).history
    assert (after.arrived, after.finished) == (history.arrived, history.finished)
    assert after.sample is not None and after.sample.finished == finished - 5000


@pytest.mark.parametrize(
    ("current", "replicas", "reason"),
    [
        # 10 jobs/s of 9 s: 90 busy slots. Scale up below 90 + 0.75 sd (13 pods of 8), to 90 +
        # 1.25 sd (13); down above 90 + 2.5 sd (15). Ten replicas are short: the queue that
        # builds while new ones start (33 jobs) is to be worked off too, hence 14.
        pytest.param(10, 14, Reason.BACKLOG_ABOVE_TARGET, id="short: to the target at once"),
        pytest.param(13, 13, Reason.AT_TARGET, id="within the band"),
        pytest.param(15, 15, Reason.AT_TARGET, id="top of the band"),
        pytest.param(16, 13, Reason.BACKLOG_BELOW_TARGET, id="above the band: to the target"),
    ],
)
def test_capacity_recommendation_with_hysteresis(
    current: int, replicas: int, reason: Reason
) -> None:
    spec = pool(target_per_replica=8, behavior=Behavior())
    history, now, finished = steady(10.0, 9.0, spec=spec, current=current)
    decision = decide(
        PoolLoad(pending=0, claimed=90, finished=finished + 150),
        spec,
        replace(history, recommendations=()),
        now,
        current=current,
    )
    assert (decision.recommendation, decision.reason) == (replicas, reason)


def test_a_fall_two_ticks_running_is_a_new_rate_not_a_trend() -> None:
    """40 jobs/s, then 2 (a spike's end): one tick below the average is noise to wait out;
    two are the new rate, in both averages -- no trend that would extrapolate it to 0."""
    spec = pool(target_per_replica=8, behavior=Behavior())
    history, now, finished = steady(40.0, 9.0, spec=spec, current=50)
    # 30 arrivals per 15 s tick: claimed drops by 60 while 90 finish.
    first = decide(
        PoolLoad(pending=0, claimed=300, finished=finished + 90), spec, history, now, current=50
    ).history
    assert first.arrival_rate is not None and first.arrival_rate > 20.0
    second = decide(
        PoolLoad(pending=0, claimed=240, finished=finished + 180),
        spec,
        first,
        now + 15,
        current=50,
    ).history
    assert second.arrival_rate == pytest.approx(2.0, rel=0.01)
    assert second.arrival_trend == pytest.approx(0.0, abs=1e-9)


def test_a_lull_within_the_cooldown_keeps_the_replicas_the_rate_needs() -> None:
    """2 jobs/s of 9 s at 3 replicas, then a tick that finds nothing pending or claimed (a
    moment between jobs): the rate still needs 3, so 3 they stay -- the pool is not sized
    for no work until it has been idle for cooldownSeconds."""
    spec = pool(target_per_replica=8, cooldown_seconds=300, behavior=Behavior())
    history, now, finished = steady(2.0, 9.0, spec=spec, current=3)
    lull = decide(
        PoolLoad(pending=0, claimed=0, finished=finished + 48),
        spec,
        replace(history, recommendations=()),
        now,
        current=3,
    )
    assert (lull.replicas, lull.recommendation) == (3, 3)
    # Idle for the cooldown: to zero, step by step (the last replica by cooldownSeconds).
    replicas, history, total = 3, lull.history, finished + 48
    for tick in range(1, 40):
        decision = decide(
            PoolLoad(pending=0, claimed=0, finished=total),
            spec,
            history,
            now + 15 * tick,
            current=replicas,
        )
        replicas, history = decision.replicas, decision.history
    assert replicas == 0


@pytest.mark.parametrize(("bridged", "replicas"), [(False, 13), (True, 16)])
def test_a_scale_down_window_only_for_a_pool_that_bridges_its_bursts(
    bridged: bool, replicas: int
) -> None:
    """Without behavior.scaleDown a pool whose load fell goes down at once (the band is its
    hysteresis); a pool whose bursts come less than 600 s apart keeps the highest
    recommendation of the last 120 s (a burst's tail)."""
    spec = pool(target_per_replica=8, behavior=Behavior())
    history, now, finished = steady(10.0, 9.0, spec=spec, current=16)
    bursts = (now - 1300.0, now - 1000.0, now - 700.0) if bridged else ()
    history = replace(
        history, recommendations=(Recommendation(at=now - 60, replicas=20),), bursts=bursts
    )
    decision = decide(
        PoolLoad(pending=0, claimed=90, finished=finished + 150), spec, history, now, current=16
    )
    assert decision.replicas == replicas


def test_a_scale_in_needs_the_pool_too_big_for_the_rates_upper_bound() -> None:
    """0.35 jobs/s of 9 s (3 busy slots) at 2 replicas: 3.15 + 2.5 sd of its noise fits one
    replica, but the rate is a minute's count of about 21 arrivals, one standard deviation of
    which (0.08 jobs/s, 0.7 slots) takes it past one: the pool keeps its 2."""
    spec = pool(target_per_replica=8, behavior=Behavior())
    history, now, finished = steady(0.35, 9.0, spec=spec, current=2)
    decision = decide(
        PoolLoad(pending=0, claimed=3, finished=finished + 5),
        spec,
        replace(history, recommendations=()),
        now,
        current=2,
    )
    assert 3.15 + 2.5 * math.sqrt(3.15) < 8
    assert decision.replicas == 2


def test_a_backlog_starts_within_three_quarters_of_the_age_target_after_start_up() -> None:
    """520 pending jobs of 9 s at 13 ready replicas (104 slots, 90 of them the flow's): 473
    still queued when a replica asked for now is up (30 s of start-up: the 14 slots beyond the
    flow take 47 meanwhile), and their newest is to start within 45 s of now, the 15 s left
    after the start-up: 284 slots, all of the pool's throughput (first in, first out)."""
    spec = pool(target_per_replica=8, max_oldest_pending_age=60, behavior=Behavior())
    history, now, finished = steady(10.0, 9.0, spec=spec, current=13)
    decision = decide(
        PoolLoad(pending=520, claimed=90, oldest_pending_age=5.0, finished=finished + 150),
        spec,
        history,
        now,
        current=13,
    )
    queue = 520 - (13 * 8 / 9 - 10) * 30
    assert decision.replicas == math.ceil(queue * 9 / (45 - 30) / 8) == 36
    assert f"({queue:.0f} once new replicas are up, to start within 45 s)" in decision.message


def test_a_backlog_the_pool_serves_in_time_adds_only_its_drain() -> None:
    """A spike's backlog at a pool that carries the new flow: 400 slots for 40 jobs/s of 9 s
    (360 busy) and 500 pending. The whole pool starts the queue's newest job within the age
    target, so the extra slots are only those that work it off within two targets -- not, as
    a rule that clears the backlog with the spare alone would have it, 150 more (64 replicas)."""
    spec = pool(target_per_replica=8, max_oldest_pending_age=60, behavior=Behavior())
    history, now, finished = steady(40.0, 9.0, spec=spec, current=50)
    decision = decide(
        PoolLoad(pending=500, claimed=360, oldest_pending_age=5.0, finished=finished + 600),
        spec,
        history,
        now,
        current=50,
    )
    queue = 500 - (50 * 8 / 9 - 40) * 30
    slots = 360 + queue * 9 / (120 - 30)
    assert decision.replicas == math.ceil((slots + 1.25 * math.sqrt(slots)) / 8)
    assert decision.replicas < math.ceil((360 + 500 * 9 / 30) / 8)


def test_starting_replicas_count_from_when_they_will_be_ready() -> None:
    """Replicas asked for 25 s ago are ready in 5 s; asked for just now, in 30: the queue they
    find (arrivals beyond what the ready replicas take) is larger, and so is the pool."""
    spec = pool(target_per_replica=8, max_oldest_pending_age=60, behavior=Behavior())
    history, now, finished = steady(10.0, 9.0, spec=spec, current=13)
    busy = PoolLoad(pending=100, claimed=40, oldest_pending_age=5.0, finished=finished + 150)

    def asked(seconds_ago: float) -> int:
        starting = dataclasses.replace(history, starting=(now - seconds_ago, 13))
        return decide(busy, spec, starting, now, current=13, ready=5).replicas

    assert asked(25.0) < asked(0.0)
    # Late pods (asked for longer ago than a start-up) count as needing a start-up again.
    assert asked(60.0) == asked(0.0)


def test_starting_replicas_count_and_no_more_are_asked_while_they_start() -> None:
    """The counts rule asks again every tick while the pods it asked for start (and the
    backlog grows meanwhile); capacity counts the starting pods and holds."""
    spec = pool(target_per_replica=8, max_oldest_pending_age=60, behavior=Behavior())
    history, now, finished = steady(10.0, 9.0, spec=spec, current=13)
    first = decide(
        PoolLoad(pending=500, claimed=90, oldest_pending_age=5.0, finished=finished + 150),
        spec,
        history,
        now,
        current=13,
        ready=13,
    )
    asked = first.replicas
    # Five seconds later: none of the new pods ready yet, the backlog as it was (the ready
    # pods keep up with the arrivals only).
    again = decide(
        PoolLoad(pending=500, claimed=90, oldest_pending_age=10.0, finished=finished + 200),
        spec,
        first.history,
        now + 5,
        current=asked,
        ready=13,
    )
    assert again.replicas == asked
    assert math.ceil((500 + 90) / 8) > asked  # what the counts rule would ask, again


def test_a_batch_is_a_backlog_not_a_rate_but_a_sustained_rise_is_a_rate() -> None:
    spec = pool(target_per_replica=8, behavior=Behavior())
    history, now, finished = steady(2.0, 9.0, spec=spec, current=4)
    batch = decide(
        PoolLoad(pending=800, claimed=18, finished=finished + 30),
        spec,
        history,
        now,
        current=4,
    ).history
    assert batch.arrival_rate == pytest.approx(2.0, rel=0.05)
    calm = decide(
        PoolLoad(pending=800, claimed=18, finished=finished + 60),
        spec,
        batch,
        now + 15,
        current=4,
    ).history
    assert calm.arrival_rate == pytest.approx(2.0, rel=0.1)
    # 40 jobs/s for two ticks running: taken at once.
    rising = decide(
        PoolLoad(pending=600, claimed=18, finished=finished + 30),
        spec,
        history,
        now,
        current=4,
    ).history
    risen = decide(
        PoolLoad(pending=1200, claimed=18, finished=finished + 60),
        spec,
        rising,
        now + 15,
        current=4,
    ).history
    assert risen.arrival_rate is not None and risen.arrival_rate >= 30.0


def test_a_rise_two_ticks_running_is_taken_at_the_second_ticks_rate() -> None:
    """A step from 2 to 40 jobs/s three seconds before a tick: that tick sees 24.8 jobs/s, the
    next the whole 40, taken at once (not the lower of the two)."""
    spec = pool(target_per_replica=8, behavior=Behavior())
    history, now, finished = steady(2.0, 9.0, spec=spec, current=4, step=5.0, ticks=200)
    outstanding = 18

    def tick(at: float, arrived: int, done: int) -> History:
        nonlocal outstanding, finished
        outstanding += arrived - done
        finished += done
        sample = PoolLoad(pending=outstanding - 18, claimed=18, finished=finished)
        return decide(sample, spec, history, at, current=4).history

    history = tick(now, 124, 10)  # 2 s at 2 jobs/s, 3 s at 40: 24.8 jobs/s
    history = tick(now + 5, 200, 10)
    assert history.arrival_rate == pytest.approx(40.0, rel=0.01)


def test_a_rise_taken_at_once_is_at_most_twice_the_first_ticks() -> None:
    """The step a second before a tick (12 jobs/s seen, then 40): 24 at once, 40 a tick later.
    The cap keeps a tick of noise and a batch after it from reading as a rate."""
    spec = pool(target_per_replica=8, behavior=Behavior())
    history, now, finished = steady(2.0, 9.0, spec=spec, current=4, step=5.0, ticks=200)
    outstanding = 18

    def tick(at: float, arrived: int, done: int) -> History:
        nonlocal outstanding, finished
        outstanding += arrived - done
        finished += done
        sample = PoolLoad(pending=outstanding - 18, claimed=18, finished=finished)
        return decide(sample, spec, history, at, current=4).history

    history = tick(now, 60, 10)
    history = tick(now + 5, 200, 10)
    assert history.arrival_rate == pytest.approx(24.0, rel=0.01)
    history = tick(now + 10, 200, 10)
    assert history.arrival_rate == pytest.approx(40.0, rel=0.01)


def test_two_batches_one_after_the_other_are_not_a_rate() -> None:
    """889 jobs, then 609 a tick later (two inserts 5 s apart): a rise two ticks running, but
    the second well below the first, as no new rate is. The rate stays the trickle's."""
    spec = pool(target_per_replica=8, behavior=Behavior())
    history, now, finished = steady(0.5, 9.0, spec=spec, current=2, step=5.0, ticks=200)
    first = decide(
        PoolLoad(pending=889, claimed=5, finished=finished + 2),
        spec,
        history,
        now,
        current=2,
    ).history
    second = decide(
        PoolLoad(pending=889 + 609 - 14, claimed=16, finished=finished + 5),
        spec,
        first,
        now + 5,
        current=2,
    ).history
    assert second.arrival_rate is not None and second.arrival_rate < 2.0
    # A noisy tick, then a batch: not a rate of the batch's size either.
    noisy = decide(
        PoolLoad(pending=8, claimed=5, finished=finished + 2), spec, history, now, current=2
    ).history
    batch = decide(
        PoolLoad(pending=600, claimed=16, finished=finished + 5), spec, noisy, now + 5, current=2
    ).history
    assert batch.arrival_rate is not None and batch.arrival_rate < 10.0


@pytest.mark.parametrize(
    ("gap", "taken"),
    [
        pytest.param(None, True, id="no bursts seen: the second tick's rate"),
        pytest.param(300.0, False, id="bursts 5 min apart: two batches, not a rate"),
    ],
)
def test_a_pool_with_frequent_bursts_takes_a_rate_only_from_ticks_that_agree(
    gap: float | None, taken: bool
) -> None:
    """355 jobs, then 650 a tick later: the second tick at 1.8 times the first. A new rate where
    no bursts were seen; two batches at a pool whose bursts come 5 minutes apart."""
    spec = pool(target_per_replica=8, behavior=Behavior())
    history, now, finished = steady(0.5, 9.0, spec=spec, current=2, step=5.0, ticks=200)
    bursts = () if gap is None else tuple(now - 100 - gap * i for i in range(4, -1, -1))
    history = dataclasses.replace(history, bursts=bursts)
    first = decide(
        PoolLoad(pending=355, claimed=5, finished=finished + 2), spec, history, now, current=2
    ).history
    second = decide(
        PoolLoad(pending=355 + 650 - 14, claimed=16, finished=finished + 5),
        spec,
        first,
        now + 5,
        current=2,
    ).history
    assert second.arrival_rate is not None
    assert (second.arrival_rate > 100.0) is taken


def test_the_arrival_trend_is_read_from_two_averages_and_sized_for() -> None:
    """Arrivals rising by 1 job/s every 100 s: the fast average lags 60 s behind, the slow one
    180 s; their difference is the slope, and the pool is sized for the rate a replica asked
    for now will serve (the fast average's lag plus a start-up ahead: 30 s, not yet seen)."""
    spec = pool(target_per_replica=8, behavior=Behavior())
    history, slope, step = OLD, 0.01, 5.0
    for tick in range(400):
        t = step * tick
        claimed = round((2.0 + slope * t) * 9.0)  # nothing pending: every job a slot at once
        arrived = 100 + round(2.0 * t + slope * t * t / 2)
        decision = decide(
            PoolLoad(pending=0, claimed=claimed, finished=arrived - claimed),
            spec,
            history,
            NOW + t,
            current=40,
        )
        history = decision.history
    rate_now = 2.0 + slope * step * 399
    assert history.arrival_trend == pytest.approx(slope, rel=0.1)
    assert history.arrival_rate == pytest.approx(rate_now - slope * 60, rel=0.02)
    assert history.arrival_rate is not None
    sized_for = history.arrival_rate + history.arrival_trend * (60 + 30)
    assert sized_for == pytest.approx(rate_now + slope * 30, rel=0.02)
    assert decision.message.startswith(f"{sized_for:.2f} jobs/s arriving")


def test_a_batch_that_leaves_a_backlog_is_a_burst_and_noise_is_not() -> None:
    spec = pool(target_per_replica=8, behavior=Behavior())
    history, now, finished = steady(2.0, 9.0, spec=spec, current=4)
    noise = decide(
        PoolLoad(pending=5, claimed=18, finished=finished + 30),
        spec,
        history,
        now,
        current=4,
    ).history
    assert noise.bursts == ()
    batch = decide(
        PoolLoad(pending=800, claimed=18, finished=finished + 30),
        spec,
        history,
        now,
        current=4,
    ).history
    assert batch.bursts == (now,)
    # The batch's next tick sees no new rise: still one burst.
    after = decide(
        PoolLoad(pending=700, claimed=32, finished=finished + 60),
        spec,
        batch,
        now + 15,
        current=4,
    ).history
    assert after.bursts == (now,)


@pytest.mark.parametrize(
    ("gap", "held_for"),
    [
        pytest.param(None, 300.0, id="no bursts seen: five minutes"),
        pytest.param(1200.0, 300.0, id="bursts 20 min apart: five minutes"),
        pytest.param(300.0, 600.0, id="bursts 5 min apart: ten minutes, bridging the gap"),
    ],
)
def test_the_hold_after_a_scale_up_bridges_frequent_bursts(
    gap: float | None, held_for: float
) -> None:
    spec = pool(target_per_replica=8, behavior=Behavior())
    history, now, finished = steady(10.0, 9.0, spec=spec, current=14)
    bursts = () if gap is None else tuple(now - 1000 - gap * i for i in range(4, -1, -1))
    history = dataclasses.replace(history, recommendations=(), bursts=bursts)
    quiet = PoolLoad(pending=0, claimed=10, finished=finished + 50)

    def replicas(since_up: float) -> int:
        after = dataclasses.replace(history, scaled_up_at=now - since_up)
        return decide(quiet, spec, after, now, current=14).replicas

    assert replicas(held_for - 1) == 14
    assert replicas(held_for + 1) < 14


def test_the_start_up_time_is_observed() -> None:
    spec = pool(target_per_replica=8, behavior=Behavior())
    history, now, finished = steady(10.0, 9.0, spec=spec, current=10)
    up = decide(
        PoolLoad(pending=400, claimed=90, finished=finished + 150),
        spec,
        history,
        now,
        current=10,
        ready=10,
    )
    assert up.history.starting == (now, up.replicas)
    waiting = decide(
        PoolLoad(pending=100, claimed=90, finished=finished + 300),
        spec,
        up.history,
        now + 15,
        current=up.replicas,
        ready=10,
    )
    ready = decide(
        PoolLoad(pending=0, claimed=90, finished=finished + 450),
        spec,
        waiting.history,
        now + 30,
        current=up.replicas,
        ready=up.replicas,
    )
    # Ready between the ticks at +15 and +30: the middle.
    assert ready.history.startup_seconds == pytest.approx(22.5)
    assert ready.history.starting is None


def test_no_scale_down_within_five_minutes_of_a_scale_up() -> None:
    spec = pool(target_per_replica=8, behavior=Behavior())
    history, now, finished = steady(10.0, 9.0, spec=spec, current=14)
    history = dataclasses.replace(history, scaled_up_at=now - 200, recommendations=())
    quiet = PoolLoad(pending=0, claimed=10, finished=finished + 50)
    held = decide(quiet, spec, history, now, current=14)
    assert (held.replicas, held.reason) == (14, Reason.SCALE_DOWN_STABILIZED)
    assert "after the last scale-up" in held.message
    later = dataclasses.replace(history, scaled_up_at=now - 301)
    assert decide(quiet, spec, later, now, current=14).replicas < 14
    # The user's own scale-down rules replace venturi's: no hold.
    explicit = pool(target_per_replica=8, behavior=dataclasses.replace(FREE, scale_up=None))
    assert decide(quiet, explicit, history, now, current=14).replicas < 14


def test_busy_pods_are_spared() -> None:
    spec = pool(target_per_replica=8, behavior=Behavior())
    history, now, finished = steady(2.0, 9.0, spec=spec, current=12)
    history = dataclasses.replace(history, recommendations=())
    quiet = PoolLoad(pending=0, claimed=18, finished=finished + 30)
    free = decide(quiet, spec, history, now, current=12)
    spared = decide(quiet, spec, history, now, current=12, busy=9)
    assert free.replicas < 9
    assert (spared.replicas, spared.reason, spared.limited) == (9, Reason.BUSY_PODS_SPARED, True)
    assert decide(quiet, spec, history, now, current=12, busy=12).replicas == 12
    assert decide(quiet, spec, history, now, current=12, busy=0).replicas == free.replicas
    # Idle pods a scale-in could not fence are kept as busy ones are, and said to be.
    kept = decide(quiet, spec, history, now, current=12, busy=9, unfenced=2)
    assert (kept.replicas, kept.reason) == (11, Reason.BUSY_PODS_SPARED)
    assert "9 pods hold jobs and 2 idle ones could not be fenced: scaling in to 11" in kept.message
    with pytest.raises(ValueError, match="unfenced"):
        decide(quiet, spec, history, now, current=12, unfenced=1)  # busy unknown


def test_the_last_replica_goes_after_cooldown_seconds_not_the_scale_down_window() -> None:
    """cooldownSeconds 60 means 60 s, even under the HPA's 300 s scale-down window."""
    spec = pool(cooldown_seconds=60, behavior=HPA_BEHAVIOR)
    busy = decide(load(pending=3), spec, OLD, NOW, current=1)
    held = decide(load(), spec, busy.history, NOW + 59, current=1)
    assert held.replicas == 1
    gone = decide(load(), spec, held.history, NOW + 60, current=1)
    assert (gone.replicas, gone.reason) == (0, Reason.IDLE)


def test_the_age_term_adds_nothing_while_replicas_start() -> None:
    spec = pool(max_oldest_pending_age=60)
    stale = load(pending=15, age=120.0)
    assert decide(stale, spec, OLD, NOW, current=2, ready=2).replicas == 3
    assert decide(stale, spec, OLD, NOW, current=2, ready=1).replicas == 2


def test_paused_and_unserved_jobs_are_no_demand() -> None:
    spec = pool(activation_threshold=0)
    jobs = PoolLoad(pending=50, claimed=0, paused=20, unserved=30)
    assert jobs.demand == 0
    assert decide(jobs, spec, OLD, NOW, current=0).replicas == 0
    some = PoolLoad(pending=50, claimed=0, paused=20)
    decision = decide(some, spec, OLD, NOW, current=0)
    assert decision.replicas == 3
    # The JobQueue shows them as pending: its message says why they scale nothing.
    assert "; 20 more pending in paused queues (no demand)" in decision.message
    assert (
        "paused" not in decide(PoolLoad(pending=30, claimed=0), spec, OLD, NOW, current=0).message
    )
    with pytest.raises(ValueError, match="paused"):
        PoolLoad(pending=5, claimed=0, paused=4, unserved=2)


def test_jobs_a_previous_template_did_not_serve_ask_for_one_replica_to_learn() -> None:
    """After a release, what the old pods served stands until a new pod registers: the
    kinds they did not serve wake one replica (whose worker will tell), not one per N."""
    spec = pool(activation_threshold=0)
    probing = PoolLoad(pending=50, claimed=0, unserved=50, probe=True)
    woken = decide(probing, spec, OLD, NOW, current=0)
    assert (woken.replicas, woken.reason) == (1, Reason.ACTIVATED)
    assert "50 pending of kinds the workers of the pool's previous pod template" in woken.message
    assert decide(probing, spec, OLD, NOW, current=1).replicas == 1
    # Served kinds beside them are demand as ever; without a probe, none wakes the pool.
    mixed = PoolLoad(pending=50, claimed=0, unserved=20, probe=True)
    assert decide(mixed, spec, OLD, NOW, current=0).replicas == 3  # ceil(30 / 10)
    known = PoolLoad(pending=50, claimed=0, unserved=50)
    assert decide(known, spec, OLD, NOW, current=0).replicas == 0


def test_explicit_tolerance_applies_to_the_capacity_recommendation() -> None:
    behavior = Behavior(scale_up=rules(0, pods(100), tolerance=0.5), scale_down=None)
    spec = pool(target_per_replica=8, behavior=behavior)
    history, now, finished = steady(10.0, 9.0, spec=spec, current=10)
    decision = decide(
        PoolLoad(pending=0, claimed=90, finished=finished + 150),
        spec,
        dataclasses.replace(history, recommendations=()),
        now,
        current=10,
    )
    # 90 busy slots on 80: a ratio of 1.125, within the user's 50 %.
    assert (decision.replicas, decision.reason) == (10, Reason.WITHIN_TOLERANCE)


@PROPERTY
@given(pools(), loads, histories(), st.integers(0, 80), st.integers(0, 80), st.integers(0, 80))
def test_a_scale_in_never_goes_below_the_busy_pods(
    spec: PoolSpec, pool_load: PoolLoad, history: History, current: int, ready: int, busy: int
) -> None:
    ready = min(ready, current)
    decision = decide(pool_load, spec, history, NOW, current=current, ready=ready, busy=busy)
    if spec.min_replicas <= current <= spec.max_replicas:
        assert decision.replicas >= min(busy, current)
    assert spec.min_replicas <= decision.replicas <= spec.max_replicas


def test_unserved_jobs_are_no_arrivals() -> None:
    """Jobs no worker of the pool serves pile up for no one: neither demand nor part of the
    flow the pool is sized for. Ten minutes of 4 such jobs/s beside a steady 10 jobs/s leave
    the rate, and the replicas, as without them."""
    spec = pool(target_per_replica=8, behavior=Behavior())
    history, now, finished = steady(10.0, 9.0, spec=spec)
    plain = history
    for tick in range(40):
        at, done = now + 15.0 * tick, finished + 150 * tick
        waiting = 60 * tick
        piled = decide(
            PoolLoad(pending=waiting, claimed=90, finished=done, unserved=waiting),
            spec,
            history,
            at,
            current=12,
        )
        without = decide(
            PoolLoad(pending=0, claimed=90, finished=done), spec, plain, at, current=12
        )
        history, plain = piled.history, without.history
        assert piled.replicas == without.replicas
    assert history.arrival_rate == pytest.approx(10.0, rel=0.01)
