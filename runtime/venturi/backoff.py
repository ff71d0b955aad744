"""Retry delays: a Fibonacci curve with deterministic, proportional jitter.

Pure functions, no I/O and no clock: the worker computes a delay in seconds and the
database adds it to its own `now()`.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from datetime import timedelta

from venturi._shown import shown

Seconds = float | timedelta
"""A duration: seconds as a number, or a `timedelta`."""

MAX_DELAY = 10 * 365.25 * 86400
"""Seconds (ten years): the longest delay anything accepts (a pause, `enqueue_in`, a retry
curve's cap) and how far from now `enqueue_at` may schedule. Far beyond any real schedule,
well inside what PostgreSQL's timestamps and intervals represent, and finite by design."""


def to_seconds(value: Seconds, *, name: str, low: float = 0.0, high: float = MAX_DELAY) -> float:
    """Normalize a duration to float seconds, or raise naming `name` and the accepted range:
    a TypeError for a non-number, a ValueError outside [low, high] (NaN and infinity too)."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:  # an int too large for a float
            seconds = math.inf
    else:
        raise TypeError(f"{name}: expected seconds (a number) or a timedelta, got {value!r}")
    if not low <= seconds <= high:  # also rejects NaN
        raise ValueError(
            f"{name}: expected a duration from {describe(low)} to {describe(high)}, "
            f"got {shown(value, 60)}"
        )
    return seconds


def describe(seconds: float) -> str:
    """A duration for messages: '0 s', '0.5 s', '1 day', '30 days', '10 years'."""
    for unit, size in (("year", 365.25 * 86400), ("day", 86400.0), ("hour", 3600.0)):
        if seconds >= size:
            n = seconds / size
            return f"{n:g} {unit}" + ("" if n == 1 else "s")
    return f"{seconds:g} s"


@dataclass(frozen=True, slots=True, init=False)
class Backoff:
    """The retry curve: `min(base * (fib(n) - 1), cap)` for the n-th failed execution.

    The multipliers run 0, 0, 1, 2, 4, 7, 12, ...: the first two retries are immediate,
    then the delay climbs to the cap. Defaults: 500 ms base, 2 minute cap.
    """

    base: float = 0.5
    """Seconds; the unit of the curve."""
    cap: float = 120.0
    """Seconds; no retry waits longer than this (before jitter, which only shortens).
    At most `MAX_DELAY`, and never below `base`."""

    def __init__(self, base: Seconds = 0.5, cap: Seconds = 120.0) -> None:
        base_s = to_seconds(base, name="Backoff.base")
        cap_s = to_seconds(cap, name="Backoff.cap")
        if base_s > cap_s:
            raise ValueError(
                f"Backoff: base ({base_s:g} s) must not exceed cap ({cap_s:g} s); "
                f"Backoff(base, cap) takes the unit first"
            )
        object.__setattr__(self, "base", base_s)
        object.__setattr__(self, "cap", cap_s)

    def delay(self, failures: int) -> float:
        """Seconds to wait after the `failures`-th failed execution, before jitter."""
        if failures < 1:
            raise ValueError(f"failures: expected >= 1, got {failures}")
        return min(self.base * (fibonacci(failures) - 1), self.cap)


DEFAULT_BACKOFF = Backoff()


def fibonacci(n: int) -> int:
    """fib(1) = fib(2) = 1. Iterative, and capped in effect by Backoff.cap's min()."""
    a, b = 1, 1
    for _ in range(min(n, 90) - 1):  # fib(90) already exceeds any sane cap / base
        a, b = b, a + b
    return a


def jitter_unit(job_id: bytes, failures: int) -> float:
    """A number in [0, 1) derived from the job id and attempt: same job, same schedule."""
    digest = hashlib.blake2b(job_id + failures.to_bytes(4, "big"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def retry_delay(backoff: Backoff, failures: int, job_id: bytes, jitter_fraction: float) -> float:
    """Seconds until the retry after the `failures`-th failed execution.

    Jitter is proportional and only shortens: the delay lands in
    `[delay * (1 - jitter_fraction), delay]`, so the cap stays a true upper bound and
    many jobs failing together (an outage) spread out instead of retrying in lockstep.
    """
    fraction = min(jitter_fraction, 1.0) if jitter_fraction > 0.0 else 0.0  # NaN too: 0
    delay = backoff.delay(failures)
    return delay * (1.0 - fraction * jitter_unit(job_id, failures))
