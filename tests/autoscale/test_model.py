"""The simulator's model: the cluster, the KEDA + HPA model, the venturi driver, the metrics.

Each test pins one rule the report relies on, against a hand-checked expectation.
"""

from __future__ import annotations

import functools
import itertools

import pytest
from bench.autoscale.keda import Hpa, Keda
from bench.autoscale.metrics import flaps, measure, quantile, reversals
from bench.autoscale.model import DRAINING, Cluster, Placement, WorkerSpec
from bench.autoscale.policies import Clairvoyant, Static, VenturiOperator
from bench.autoscale.run import one
from bench.autoscale.traces import FULL_DURATION, Insert, Trace, constant, step
from bench.autoscale.variants import UNFENCED, fewer_on, shorted, shorted_eighths

WORKER = WorkerSpec()


def trace(*inserts: Insert, duration: float = 600.0) -> Trace:
    return Trace("test", "test", duration, tuple(inserts), 1)


def job(at: float, service: float = 1.0) -> Insert:
    return Insert(at, (service,))


class Scripted:
    """An autoscaler that sets given replicas at given times."""

    name = "scripted"

    def __init__(self, *steps: tuple[float, int]) -> None:
        self.steps = steps

    def start(self, cluster: Cluster) -> None:
        for at, replicas in self.steps:
            cluster.at(at, functools.partial(cluster.scale, replicas, by="test"))

    def on_notify(self, cluster: Cluster) -> None:
        pass


# --- the cluster ----------------------------------------------------------------------------


def test_a_pod_serves_after_its_startup_and_fills_its_slots_in_order() -> None:
    jobs = [job(0.0, 10.0) for _ in range(10)]
    cluster = Cluster(trace(*jobs), WORKER, seed=1)
    cluster.run(Scripted((0.0, 1)))
    # Eight slots from t=15; the ninth and tenth jobs wait for the first to finish (t=25).
    assert sorted(t for t in cluster.started if t is not None) == [15.0] * 8 + [25.0] * 2
    m = measure(cluster)
    assert (m.wait_max, m.jobs, m.unfinished) == (25.0, 10, 0)
    assert m.first_from_zero == (15.0,)


def test_replica_seconds_and_utilisation_integrate_over_the_horizon() -> None:
    cluster = Cluster(trace(job(0.0, 100.0), duration=200.0), WORKER, seed=1, initial_replicas=2)
    cluster.run(Static(2))
    m = measure(cluster)
    assert m.replica_seconds == pytest.approx(400.0)
    assert m.utilisation == pytest.approx(100.0 / (400.0 * 8))


def test_scale_in_deletes_starting_pods_then_the_cheapest() -> None:
    cluster = Cluster(trace(), WORKER, seed=1, initial_replicas=3)
    ready = list(cluster.pods)
    ready[0].cost, ready[1].cost, ready[2].cost = 5, 0, 9
    cluster.scale(5, by="test")  # two more, starting
    cluster.scale(2, by="test")
    assert sorted(p.name for p in cluster.pods) == sorted([ready[0].name, ready[2].name])


def test_packed_placement_gives_a_job_to_the_busiest_pod_with_a_free_slot() -> None:
    """Ten jobs at three idle pods of 8 slots: the race spreads them; packing fills one pod,
    then the next."""

    def holders(placement: Placement) -> list[int]:
        jobs = trace(*(job(1.0 + i / 10, 100.0) for i in range(10)))
        cluster = Cluster(jobs, WORKER, seed=1, initial_replicas=3, placement=placement)
        seen: list[int] = []
        cluster.at(50.0, lambda: seen.extend(sorted(len(p.jobs) for p in cluster.pods)))
        cluster.run(Static(3))
        return seen

    assert holders("packed") == [0, 2, 8]
    assert holders("random") != [0, 2, 8]


def test_a_drained_pod_finishes_short_jobs_and_reruns_the_rest() -> None:
    worker = WorkerSpec(shutdown_timeout_s=30.0, grace_s=45.0)
    jobs = trace(job(1.0, 10.0), job(1.0, 100.0), duration=400.0)
    cluster = Cluster(jobs, worker, seed=1, initial_replicas=1)
    cluster.run(Scripted((5.0, 0), (6.0, 1)))
    m = measure(cluster)
    assert (m.rerun, m.killed, m.unfinished) == (1, 0, 0)
    # Aborted and released when the drain ended (5 + 30 s), then taken at once by the new pod.
    assert cluster.started[1] == pytest.approx(35.0)


def test_sigkill_before_the_drain_ends_leaves_jobs_to_their_lease() -> None:
    worker = WorkerSpec(shutdown_timeout_s=30.0, grace_s=30.0, lease_s=90.0)
    cluster = Cluster(trace(job(1.0, 100.0), duration=400.0), worker, seed=1, initial_replicas=1)
    cluster.run(Scripted((5.0, 0), (6.0, 1)))
    m = measure(cluster)
    assert (m.rerun, m.killed, m.unfinished) == (0, 1, 0)
    # Killed at 35 s; back between 2/3 and all of the 90 s lease later.
    first = cluster.started[0]
    assert first is not None and 35.0 + 60.0 <= first <= 35.0 + 90.0


def test_a_draining_pod_claims_nothing_and_no_longer_counts_as_a_replica() -> None:
    cluster = Cluster(trace(job(1.0, 100.0), job(10.0, 1.0)), WORKER, seed=1, initial_replicas=1)
    cluster.run(Scripted((5.0, 0)))
    # The second job arrived at zero replicas (the first pod draining, its job released at
    # 35 s): neither runs again before the run stops at 600 s.
    m = measure(cluster)
    assert (cluster.started[1], m.rerun, m.unfinished) == (None, 1, 2)
    assert m.first_from_zero == (590.0,)


def test_draining_state_is_visible_in_the_pod_list() -> None:
    cluster = Cluster(trace(job(0.0, 100.0)), WORKER, seed=1, initial_replicas=1)
    cluster.at(1.0, lambda: cluster.scale(0, by="test"))
    cluster.at(2.0, lambda: None)
    states: list[str] = []
    cluster.at(3.0, lambda: states.extend(p.state for p in cluster.pods))
    cluster.run(Static(0))
    assert states == [DRAINING]


def test_a_fenced_pod_claims_nothing_until_unfenced() -> None:
    cluster = Cluster(trace(job(1.0, 10.0)), WORKER, seed=1, initial_replicas=1)
    [pod] = cluster.pods
    cluster.at(0.5, lambda: cluster.fence(pod))
    cluster.at(5.0, lambda: cluster.unfence(pod))
    cluster.run(Static(1))
    assert cluster.started[0] == 5.0


def test_a_fenced_scale_in_closes_the_race_of_a_claim_and_a_deletion() -> None:
    """Step, seed 8: a pod claims a long job in the 50 ms between the operator's read of the
    claims and the scale, is removed, and the job is re-run at the end of the drain. With the
    pods fenced before the scale (and their claims read again after), none is."""
    plain = one(("step", 8, UNFENCED, FULL_DURATION)).metrics
    fenced = one(("step", 8, "venturi", FULL_DURATION)).metrics
    assert (plain.rerun, plain.killed) == (1, 0)
    assert (fenced.rerun, fenced.killed) == (0, 0)


def test_runs_are_deterministic_per_seed_and_differ_across_seeds() -> None:
    a = one(("spike", 3, "venturi", 1800.0)).metrics
    b = one(("spike", 3, "venturi", 1800.0)).metrics
    c = one(("spike", 4, "venturi", 1800.0)).metrics
    assert a == b
    assert a != c


# --- metrics -------------------------------------------------------------------------------


def test_flaps_are_reversals_within_five_minutes() -> None:
    events = [(0.0, 0, 4), (60.0, 4, 8), (200.0, 8, 2), (600.0, 2, 6), (700.0, 6, 5)]
    assert flaps(events) == [200.0, 700.0]
    later = [(0.0, 0, 4), (200.0, 4, 2), (450.0, 2, 6)]
    assert reversals(events + [(e[0] + 1000.0, *e[1:]) for e in later]) == [
        (200.0, "up-down"),
        (700.0, "up-down"),
        (1200.0, "up-down"),
        (1450.0, "down-up"),
    ]


def test_quantile_is_nearest_rank() -> None:
    assert quantile([float(i) for i in range(1, 101)], 0.99) == 99.0
    assert quantile([5.0], 0.5) == 5.0


# --- the HPA and KEDA ----------------------------------------------------------------------


def test_hpa_scale_up_doubles_per_sync_with_at_least_four() -> None:
    hpa = Hpa()
    replicas, path = 1, []
    for sync in range(8):
        desired = hpa.sync(15.0 * sync, replicas, replicas, value=10_000, target=8)
        replicas = desired if desired is not None else replicas
        path.append(replicas)
    assert path == [4, 8, 16, 32, 64, 100, 100, 100]


def test_hpa_tolerance_keeps_the_count_within_ten_percent() -> None:
    hpa = Hpa()
    assert hpa.proposal(value=87, target=8, status_replicas=10) == 10
    # 88 / 80 is 1.1000000000000001 in float64, just outside: Go's HPA scales here too.
    assert hpa.proposal(value=88, target=8, status_replicas=10) == 11
    assert hpa.proposal(value=72, target=8, status_replicas=10) == 10
    assert hpa.proposal(value=71, target=8, status_replicas=10) == 9


def test_hpa_stabilization_keeps_the_highest_proposal_of_the_window() -> None:
    hpa = Hpa()
    assert hpa.sync(0.0, 10, 10, value=160, target=8) == 20
    assert hpa.sync(15.0, 20, 20, value=40, target=8) is None  # 5 wanted; 20 in the window
    assert hpa.sync(150.0, 20, 20, value=80, target=8) is None  # 10 wanted; 20 still there
    assert hpa.sync(299.0, 20, 20, value=0, target=8) is None
    # At 301 s the proposal of 0 s left the window; the highest left is 10 (at 150 s).
    assert hpa.sync(301.0, 20, 20, value=0, target=8) == 10
    assert hpa.sync(451.0, 10, 10, value=0, target=8) == 1  # minReplicas


def test_hpa_leaves_a_deployment_at_zero_to_keda() -> None:
    assert Hpa().sync(0.0, 0, 0, value=500, target=8) is None


def test_keda_activates_on_its_poll_then_the_hpa_doubles_every_15_s() -> None:
    batch = Insert(1.0, tuple(1000.0 for _ in range(2000)))
    cluster = Cluster(trace(batch, duration=300.0), WORKER, seed=1)
    keda = Keda(query="pending+running", seed=1)
    cluster.run(keda)
    events = cluster.counters.scale_events
    assert events[0][1:] == (0, 1)
    assert [e[2] for e in events[1:6]] == [4, 8, 16, 32, 64]
    gaps = {round(b[0] - a[0], 6) for a, b in itertools.pairwise(events[1:6])}
    assert gaps == {15.0}
    # Activation waits for the poll: up to pollingInterval after the insert.
    assert 1.0 < events[0][0] <= 31.0


def test_keda_pending_only_scales_in_under_running_jobs() -> None:
    """The pending-only query reads 0 once every job is claimed: KEDA's cooldown then takes
    the Deployment to zero under running jobs, the released jobs wake it again, and so on
    (kedacore/keda #356: "you can stay in that loop forever")."""
    batch = Insert(1.0, tuple(2000.0 for _ in range(8)))
    cluster = Cluster(trace(batch, duration=1500.0), WORKER, seed=1)
    cluster.run(Keda(query="pending", seed=1))
    to_zero = [e for e in cluster.counters.scale_events if e[2] == 0]
    assert len(to_zero) >= 3
    assert measure(cluster).rerun == 8 * len(to_zero)


def test_keda_cooldown_holds_the_last_replica_300_s_after_the_last_activity() -> None:
    cluster = Cluster(trace(job(1.0, 2.0), duration=1000.0), WORKER, seed=1)
    cluster.run(Keda(query="pending+running", seed=1))
    (up_at, _, _), (down_at, _, to) = cluster.counters.scale_events
    assert to == 0
    assert 300.0 < down_at - up_at <= 300.0 + 2 * 30.0


# --- the clairvoyant bound ------------------------------------------------------------------


def test_the_clairvoyant_starts_pods_a_start_up_early_and_removes_them_at_the_fall() -> None:
    """A rate of 1 job/s, 16 from 100 s to 200 s: two pods, 19 asked for at 85 s (ready at the
    rise), back to two at 200 s."""

    def replicas_at(t: float) -> int:
        return 19 if 100.0 <= t < 200.0 else 2

    cluster = Cluster(trace(duration=300.0), WORKER, seed=1, initial_replicas=2)
    cluster.run(Clairvoyant("c", replicas_at, lead=15.0, spare_busy_pods=False))
    assert cluster.counters.scale_events == [(85.0, 2, 19), (200.0, 19, 2)]


def test_the_step_bound_runs_each_plateau_at_its_fewest_stable_count() -> None:
    from bench.autoscale.run import autoscaler

    load = step(1, 7200.0)
    scaler, initial = autoscaler("clairvoyant", load, 1)
    assert isinstance(scaler, Clairvoyant)
    plateaus = [scaler.replicas_at(t) for t in (100.0, 1000.0, 3000.0, 5000.0, 7000.0)]
    assert (initial, plateaus) == (2, [2, 19, 5, 28, 2])
    fewer, _ = autoscaler(fewer_on(3), load, 1)
    assert isinstance(fewer, Clairvoyant)
    assert [fewer.replicas_at(t) for t in (3000.0, 5000.0)] == [5, 27]
    # Plateau 2 (900 s to 2700 s) one pod short for its first half only.
    half, _ = autoscaler(fewer_on(1, 4), load, 1)
    assert isinstance(half, Clairvoyant)
    assert [half.replicas_at(t) for t in (100.0, 1000.0, 1799.0, 1801.0, 5000.0)] == [
        2,
        18,
        18,
        19,
        28,
    ]
    assert shorted_eighths(shorted([0, 4, 0, 2, 8])) == (0, 4, 0, 2, 8)
    assert shorted_eighths("clairvoyant") is None


# --- venturi's operator, driven like the reconcile loop ------------------------------------


def test_venturi_wakes_from_zero_on_notify() -> None:
    cluster = Cluster(trace(job(100.0)), WORKER, seed=1)
    cluster.run(VenturiOperator())
    # NOTIFY (10 ms), the tick (50 ms), the pod's start-up (15 s).
    assert measure(cluster).first_from_zero == pytest.approx((15.06,))


def test_venturi_ticks_every_interval_after_the_previous_tick() -> None:
    cluster = Cluster(trace(duration=100.0), WORKER, seed=1)
    operator = VenturiOperator()
    cluster.run(operator)
    times = [t for t, _, _ in operator.decisions]
    assert times[:3] == pytest.approx([0.0, 15.05, 30.1])


@pytest.mark.parametrize("policy", ["venturi", "keda (pending+running)"])
def test_a_constant_load_settles(policy: str) -> None:
    """8 jobs/s of 9 s on average keep 72 slots busy: 9 pods of 8 at full use. After the first
    half hour the count stays in a narrow band and stops moving."""
    from bench.autoscale.run import autoscaler

    load = constant(1, 3600.0, 8.0)
    scaler, initial = autoscaler(policy, load, 1)
    cluster = Cluster(load, WORKER, seed=1, initial_replicas=initial)
    cluster.run(scaler)
    during = [e for e in cluster.counters.scale_events if e[0] <= load.duration]
    late = [e for e in during if e[0] > 1800.0]
    assert len(late) <= 2
    assert 9 <= during[-1][2] <= 14
