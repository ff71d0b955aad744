"""The reconcile loop's wake rule and the scale-in marking, as plain functions."""

from __future__ import annotations

from venturi_operator.cadence import BURST_WAKE_SECONDS, SPARED_RETRY_SECONDS, next_wait, wake_at
from venturi_operator.scalein import (
    FENCED_COST,
    busy_pods,
    deletion_costs,
    stale_costs,
    still_idle,
    takes_only,
    victims,
)


def test_a_pool_at_zero_wakes_at_once() -> None:
    assert wake_at(decided=0, last_tick=99.0, now=100.0) == 100.0


def test_a_running_pool_wakes_at_most_once_per_burst_gap() -> None:
    assert wake_at(decided=3, last_tick=100.0, now=100.0 + BURST_WAKE_SECONDS + 1) == 106.0
    # Too soon after the last tick: not dropped, deferred to the end of the gap.
    assert wake_at(decided=3, last_tick=100.0, now=101.0) == 100.0 + BURST_WAKE_SECONDS


def test_before_the_first_tick_nothing_wakes() -> None:
    assert wake_at(decided=None, last_tick=None, now=5.0) is None


def test_a_scale_in_held_back_by_busy_pods_looks_again_soon() -> None:
    assert next_wait(15.0, spared=False) == 15.0
    assert next_wait(15.0, spared=True) == SPARED_RETRY_SECONDS < 15.0
    # Never later than the interval the user asked for.
    assert next_wait(1.0, spared=True) == 1.0


def test_costs_are_the_jobs_each_pod_holds_and_idle_pods_cost_nothing() -> None:
    costs = deletion_costs(["a", "b", "c"], {"b": 3, "elsewhere": 9})
    assert costs == {"a": 0, "b": 3, "c": 0}
    assert busy_pods(costs) == 1


def test_only_costs_that_changed_are_patched() -> None:
    costs = {"a": 0, "b": 3, "c": 0, "d": 1, "e": 0}
    annotated = {"a": None, "b": "3", "c": "5", "d": None, "e": "0"}
    assert stale_costs(annotated, costs) == {"a": 0, "c": 0, "d": 1}


def test_a_scale_in_takes_idle_pods_only_in_a_fixed_order() -> None:
    costs = {"d": 0, "b": 2, "a": 0, "c": 0}
    assert victims(costs, 2) == ["a", "c"]
    assert victims(costs, 9) == ["a", "c", "d"]  # never a busy pod
    assert victims(costs, 0) == [] and victims(costs, -1) == []
    # Pods that are not ready first: the ReplicaSet removes them before any other.
    assert victims(costs, 2, unready={"d", "b"}) == ["d", "a"]


def test_a_victim_that_claimed_before_its_fence_is_kept() -> None:
    assert still_idle(["a", "c", "d"], {"c": 1, "b": 4}) == (["a", "d"], ["c"])
    assert still_idle([], {"c": 1}) == ([], [])
    assert FENCED_COST < 0  # below an idle pod's 0: the ReplicaSet takes the fenced pods


def test_a_scale_in_takes_only_pods_the_replicaset_would_take_first() -> None:
    """The ReplicaSet deletes pods that are not ready first, whatever their cost: a busy pod
    not ready goes before every ready pod, fenced (cost -1) or not."""
    costs = {"a": -1, "b": -1, "c": 0, "d": 4}
    assert takes_only(["a", "b"], costs) == 2  # all ready: the fenced pods go first
    assert takes_only(["a", "b"], costs, unready={"a"}) == 2  # a first, then b (cost -1)
    assert takes_only(["a", "b"], costs, unready={"d"}) == 0  # d (busy, not ready) first
    assert takes_only(["a", "b"], costs, unready={"a", "d"}) == 1  # a, then d: not b
    assert takes_only(["a", "b"], costs, unready={"c"}) == 0  # c (idle, unfenced) first
    # Without fences: the idle pods (cost 0), while no busy pod is not ready.
    plain = {"a": 0, "b": 0, "d": 4}
    assert takes_only(["a", "b"], plain) == 2
    assert takes_only(["a", "b"], plain, unready={"d"}) == 0
