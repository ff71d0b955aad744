"""The load traces: when jobs arrive and how long each one runs, drawn from a seed.

Every policy of one run sees exactly the same jobs (common random numbers), so differences
between policies are the policies', not the dice's. A trace is a list of *inserts*: one job
(``Queue.enqueue``: one NOTIFY per job) or a batch (``enqueue_many``: one NOTIFY per batch),
each with its jobs' service times.

Service times are log-normal (median 6 s, sigma 0.9: mean 9.0 s, 3.7 % longer than 30 s, p99
49 s): mostly short jobs with the long tail that makes scale-in dangerous -- a job still running
when its pod's ``shutdown_timeout`` ends is aborted and run again.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

#: Seconds of one full trace.
HOUR = 3600.0
FULL_DURATION = 2 * HOUR
#: The quick mode's traces: the same shapes, compressed to this many seconds.
QUICK_DURATION = 1800.0

SERVICE_MEDIAN_S = 6.0
SERVICE_SIGMA = 0.9
MEAN_SERVICE_S = SERVICE_MEDIAN_S * math.exp(SERVICE_SIGMA**2 / 2)


@dataclass(frozen=True, slots=True)
class Insert:
    """One enqueue statement: ``len(service)`` jobs at time ``at``."""

    at: float
    service: tuple[float, ...]

    @property
    def batch(self) -> bool:
        return len(self.service) > 1


@dataclass(frozen=True, slots=True)
class Trace:
    name: str
    description: str
    duration: float
    inserts: tuple[Insert, ...]
    #: The static fleet's size for this trace (sized for its peak, see ``static_size``).
    static_replicas: int
    #: The arrival rate the jobs were drawn from (jobs/s at a time), where the trace has one:
    #: what a clairvoyant policy knows (the report's bounds).
    rate: Callable[[float], float] | None = None

    @property
    def jobs(self) -> int:
        return sum(len(i.service) for i in self.inserts)


def _service(rng: random.Random) -> float:
    return rng.lognormvariate(math.log(SERVICE_MEDIAN_S), SERVICE_SIGMA)


def _poisson(
    rng: random.Random, rate: Callable[[float], float], peak: float, duration: float
) -> list[Insert]:
    """Single-job inserts from a Poisson process of rate ``rate(t)`` (thinning, Lewis-Shedler)."""
    out: list[Insert] = []
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= duration:
            return out
        if rng.random() * peak < rate(t):
            out.append(Insert(t, (_service(rng),)))


def static_size(peak_rate: float, concurrency: int = 8, utilisation: float = 0.8) -> int:
    """A fleet that carries ``peak_rate`` jobs/s at ``utilisation`` of its slots."""
    return max(1, min(100, math.ceil(peak_rate * MEAN_SERVICE_S / (concurrency * utilisation))))


#: The step trace's plateaus: (end, as a share of the trace; jobs/s).
STEP_LEVELS = ((0.125, 1.0), (0.375, 16.0), (0.625, 4.0), (0.875, 24.0), (1.0, 1.0))


def step_plateau(t: float, duration: float) -> int:
    """The index in ``STEP_LEVELS`` of the plateau at time ``t`` (the last one after the end)."""
    return next(
        (i for i, (end, _) in enumerate(STEP_LEVELS) if t < end * duration), len(STEP_LEVELS) - 1
    )


def step(seed: int, duration: float = FULL_DURATION) -> Trace:
    """Plateaus of 1, 16, 4, 24 and 1 jobs/s (an eighth, a quarter, a quarter, a quarter and an
    eighth of the trace): sudden rises and falls that then hold."""
    rng = random.Random(f"step-{seed}")

    def rate(t: float) -> float:
        return STEP_LEVELS[step_plateau(t, duration)][1]

    return Trace(
        "step",
        "plateaus of 1, 16, 4, 24, 1 jobs/s",
        duration,
        tuple(_poisson(rng, rate, 24.0, duration)),
        static_size(24.0),
        rate,
    )


def spike(seed: int, duration: float = FULL_DURATION) -> Trace:
    """2 jobs/s with a 90-second spike to 40 jobs/s every sixth of the trace (every 20 min)."""
    rng = random.Random(f"spike-{seed}")
    period = duration / 6
    width = 90.0 * duration / FULL_DURATION

    def rate(t: float) -> float:
        into = t % period
        return 40.0 if period / 2 <= into < period / 2 + width else 2.0

    return Trace(
        "spike",
        "2 jobs/s, a 90 s spike to 40 jobs/s every 20 min",
        duration,
        tuple(_poisson(rng, rate, 40.0, duration)),
        static_size(40.0),
        rate,
    )


def diurnal(seed: int, duration: float = FULL_DURATION) -> Trace:
    """One day in two hours: 1 job/s at night rising smoothly to 20 jobs/s at noon and back."""
    rng = random.Random(f"diurnal-{seed}")

    def rate(t: float) -> float:
        return 1.0 + 19.0 * (1.0 - math.cos(2 * math.pi * t / duration)) / 2

    return Trace(
        "diurnal",
        "1 -> 20 -> 1 jobs/s, a cosine over the trace",
        duration,
        tuple(_poisson(rng, rate, 20.0, duration)),
        static_size(20.0),
        rate,
    )


#: The bursty trace's mean gap between batches (a Poisson process), at full duration.
BURST_GAP_S = 360.0


def bursty(seed: int, duration: float = FULL_DURATION) -> Trace:
    """0.5 jobs/s, plus batches of 200 to 1,200 jobs enqueued at once (one statement, one
    NOTIFY) at random, on average every 6 minutes."""
    rng = random.Random(f"bursty-{seed}")
    inserts = _poisson(rng, lambda _t: 0.5, 0.5, duration)
    t = 0.0
    gap = BURST_GAP_S * duration / FULL_DURATION
    # Nothing in the last tenth: the trace ends quiet, so every policy has drained by its end.
    while (t := t + rng.expovariate(1 / gap)) < duration * 0.9:
        size = rng.randint(200, 1200)
        inserts.append(Insert(t, tuple(_service(rng) for _ in range(size))))
    inserts.sort(key=lambda i: i.at)
    return Trace(
        "bursty",
        "0.5 jobs/s plus a batch of 200-1,200 jobs every ~6 min",
        duration,
        tuple(inserts),
        static_size(12.0),
    )


#: The longer trace: its arrival rate, and how many times as long its jobs run meanwhile.
LONGER_RATE = 4.0
LONGER_FACTOR = 4.0
#: When its jobs run longer, as shares of the trace.
LONGER_FROM, LONGER_UNTIL = 0.4, 0.7


def longer(seed: int, duration: float = FULL_DURATION) -> Trace:
    """4 jobs/s throughout; the jobs enqueued between 40 % and 70 % of the trace run four times
    as long (a dependency slowing down): the work quadruples while the arrivals do not move."""
    rng = random.Random(f"longer-{seed}")
    inserts = [
        Insert(i.at, tuple(s * LONGER_FACTOR for s in i.service))
        if LONGER_FROM * duration <= i.at < LONGER_UNTIL * duration
        else i
        for i in _poisson(rng, lambda _t: LONGER_RATE, LONGER_RATE, duration)
    ]
    return Trace(
        "longer",
        "4 jobs/s; jobs 4x as long from 40 % to 70 % of the trace",
        duration,
        tuple(inserts),
        static_size(LONGER_RATE * LONGER_FACTOR),
    )


def idle(seed: int, duration: float = FULL_DURATION) -> Trace:
    """An idle trickle: one job every 10 minutes on average (a pool that mostly sleeps)."""
    rng = random.Random(f"idle-{seed}")
    gap = 600.0 * duration / FULL_DURATION
    return Trace(
        "idle",
        "one job every ~10 min",
        duration,
        tuple(_poisson(rng, lambda _t: 1 / gap, 1 / gap, duration)),
        1,
    )


TRACES: dict[str, Callable[[int, float], Trace]] = {
    "step": step,
    "spike": spike,
    "diurnal": diurnal,
    "bursty": bursty,
    "longer": longer,
    "idle": idle,
}


def constant(seed: int, duration: float, rate: float) -> Trace:
    """A constant Poisson rate (the model's tests use it; not one of the report's traces)."""
    rng = random.Random(f"constant-{rate}-{seed}")
    return Trace(
        "constant",
        f"{rate:g} jobs/s",
        duration,
        tuple(_poisson(rng, lambda _t: rate, rate, duration)),
        static_size(rate),
    )
