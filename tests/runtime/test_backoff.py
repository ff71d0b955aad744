"""The retry curve and its jitter, as pure functions."""

from __future__ import annotations

from datetime import timedelta

import pytest
from ulid import ULID

from venturi import Backoff
from venturi.backoff import fibonacci, retry_delay


def test_multipliers_follow_fibonacci_minus_one() -> None:
    backoff = Backoff(1, 1000)
    assert [backoff.delay(n) for n in range(1, 9)] == [0, 0, 1, 2, 4, 7, 12, 20]


def test_defaults_and_cap() -> None:
    backoff = Backoff()
    assert (backoff.base, backoff.cap) == (0.5, 120.0)
    assert backoff.delay(5) == 2.0  # 0.5 * (5 - 1)
    assert backoff.delay(40) == 120.0
    assert Backoff(timedelta(milliseconds=500), timedelta(minutes=2)) == backoff


def test_fibonacci_is_bounded_for_huge_attempts() -> None:
    assert fibonacci(10_000) == fibonacci(90)


@pytest.mark.parametrize("bad", [-1, float("nan"), "1"])
def test_invalid_durations_are_rejected(bad: object) -> None:
    with pytest.raises((TypeError, ValueError), match=r"Backoff\.base"):
        Backoff(bad)  # type: ignore[arg-type]


def test_jitter_is_deterministic_per_job_and_attempt() -> None:
    job = ULID().bytes
    backoff = Backoff(1, 1000)
    first = [retry_delay(backoff, n, job, 0.5) for n in range(3, 10)]
    again = [retry_delay(backoff, n, job, 0.5) for n in range(3, 10)]
    assert first == again
    other = [retry_delay(backoff, n, ULID().bytes, 0.5) for n in range(3, 10)]
    assert first != other


def test_jitter_only_shortens_within_the_fraction() -> None:
    backoff = Backoff(1, 1000)
    for _ in range(200):
        job = ULID().bytes
        for n in range(3, 12):
            full = backoff.delay(n)
            delay = retry_delay(backoff, n, job, 0.5)
            assert full * 0.5 <= delay <= full


def test_jitter_fraction_is_clamped() -> None:
    backoff = Backoff(1, 1000)
    job = ULID().bytes
    assert retry_delay(backoff, 6, job, 0.0) == 7.0
    assert retry_delay(backoff, 6, job, -3) == 7.0
    assert retry_delay(backoff, 6, job, 5) == retry_delay(backoff, 6, job, 1.0)
    assert 0.0 <= retry_delay(backoff, 6, job, 1.0) <= 7.0


def test_spread_is_real() -> None:
    backoff = Backoff(1, 1000)
    delays = {round(retry_delay(backoff, 8, ULID().bytes, 0.5), 6) for _ in range(100)}
    assert len(delays) > 90
