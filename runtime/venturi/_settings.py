"""Validation of settings, as pure functions: each accepted value is in range, or the call
that set it gets a `ValueError` (a `TypeError` for a wrong type) naming the setting and the
accepted range. `Worker.__init__` checks all of its settings here in one call; `Queue` and
the enqueue path use the queue-name and lease checks.

The limits are documented in README.md ("Limits and validation").
"""

from __future__ import annotations

import ipaddress
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from venturi._shown import shown
from venturi.backoff import Backoff, Seconds, to_seconds
from venturi.outcome import PanicPolicy
from venturi.task import KIND_PATTERN, NAME_RULE
from venturi.task import check_queue_name as check_queue_name  # where the rule lives

MAX_CONCURRENCY = 10_000
"""Most jobs one worker runs at once: beyond this, run more workers."""
MIN_LEASE = 0.5
"""Seconds: a lease is renewed every third of its length, and each renewal is a round trip
to the database; a shorter lease would expire between renewals on any real network."""
MAX_LEASE = 30 * 86400.0
"""Seconds (30 days): a crashed worker's job comes back only after its lease; the lease is
renewed while the handler lives, so a long-running job never needs more."""
MIN_POLL_MAX = 0.01
"""Seconds: below this, an idle worker's timer turns into a busy poll of the database."""
MAX_POLL_MAX = 86400.0
"""Seconds (a day): the longest idle wait, which a missed notification can delay a job by."""
MAX_SHUTDOWN_TIMEOUT = 86400.0
"""Seconds (a day): the longest grace period at shutdown."""
MAX_BACKSTOP = 2**31 - 1
"""Failed executions are counted in a 32-bit column."""
MAX_PRIORITY_RATIO = 1_000_000
MAX_ATTEMPTS = 2**31 - 1
"""A task's max_attempts is compared with a 32-bit count of failed executions."""
MIN_TIMEOUT = 0.001
"""Seconds: a timeout must be positive; a millisecond is the least a timer keeps."""
MAX_TIMEOUT = 29 * 86400.0
"""Seconds (29 days): the lease of a job with a timeout is at least the timeout plus
`TIMEOUT_LEASE_MARGIN`, and a lease is at most `MAX_LEASE`."""
TIMEOUT_LEASE_MARGIN = 60.0
"""Seconds a job's lease outlasts its timeout (the claim enforces it: see the migrations)."""
DEFAULT_QUEUE = "default"
"""The named queue of a `Queue` or `Worker` not given one."""


def check_kind(value: object, *, setting: str = "kind") -> str:
    """A KIND given as text (a filter, a command-line flag): 1-200 characters, ASCII letters,
    digits and `_ . : / -`, starting with a letter or digit."""
    if not isinstance(value, str) or not KIND_PATTERN.fullmatch(value):
        raise ValueError(f"{setting}: invalid KIND {shown(value)}: expected {NAME_RULE}")
    return value


def check_lease(value: Seconds, *, setting: str) -> float:
    """A lease in seconds, from `MIN_LEASE` to `MAX_LEASE`."""
    return to_seconds(value, name=setting, low=MIN_LEASE, high=MAX_LEASE)


def check_timeout(value: Seconds, *, setting: str) -> float:
    """A per-run timeout in seconds: positive, at most `MAX_TIMEOUT`."""
    return to_seconds(value, name=setting, low=MIN_TIMEOUT, high=MAX_TIMEOUT)


def check_max_attempts(value: object, *, setting: str) -> int:
    """A count of failed executions, from 1 to `MAX_ATTEMPTS`."""
    return _int(setting, value, 1, MAX_ATTEMPTS)


def resolve_metrics_host(value: str | None, environ: Mapping[str, str] = os.environ) -> str:
    """The address /metrics binds to: an IP address (or "localhost"). By default all
    interfaces inside a Kubernetes pod (where Prometheus scrapes the pod's IP) and the
    loopback interface elsewhere, so a laptop or VM never exposes metrics by accident."""
    if value is None:
        return "0.0.0.0" if "KUBERNETES_SERVICE_HOST" in environ else "127.0.0.1"
    if not isinstance(value, str):
        raise TypeError(f"metrics_host: expected an IP address (a str), got {value!r}")
    if value != "localhost":
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(
                f"metrics_host: expected an IP address to listen on (such as 127.0.0.1, "
                f"0.0.0.0 or ::) or 'localhost', got {shown(value)}"
            ) from None
    return value


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """A worker's settings, validated and normalized (durations in float seconds)."""

    concurrency: int
    poll_max: float
    lease: float
    shutdown_timeout: float
    backoff: Backoff
    jitter_fraction: float
    backstop: int | None
    priority_ratio: int | None
    panic_policy: PanicPolicy
    queue: str
    metrics_port: int | None
    metrics_host: str


def worker_settings(
    *,
    concurrency: int,
    poll_max: Seconds,
    lease: Seconds,
    shutdown_timeout: Seconds,
    backoff: Backoff,
    jitter_fraction: float,
    backstop: int | None,
    priority_ratio: int | None,
    panic_policy: PanicPolicy,
    queue: str,
    metrics_port: int | None,
    metrics_host: str | None,
    environ: Mapping[str, str] = os.environ,
) -> WorkerSettings:
    """Validate every `Worker` setting; the first bad one raises, naming itself."""
    if not isinstance(backoff, Backoff):
        raise TypeError(f"backoff: expected a venturi.Backoff, got {backoff!r}")
    if not isinstance(panic_policy, PanicPolicy):
        raise TypeError(f"panic_policy: expected a venturi.PanicPolicy, got {panic_policy!r}")
    return WorkerSettings(
        concurrency=_int("concurrency", concurrency, 1, MAX_CONCURRENCY),
        poll_max=to_seconds(poll_max, name="poll_max", low=MIN_POLL_MAX, high=MAX_POLL_MAX),
        lease=check_lease(lease, setting="lease"),
        shutdown_timeout=to_seconds(
            shutdown_timeout, name="shutdown_timeout", high=MAX_SHUTDOWN_TIMEOUT
        ),
        backoff=backoff,
        jitter_fraction=_jitter_fraction(jitter_fraction),
        backstop=None if backstop is None else _int("backstop", backstop, 1, MAX_BACKSTOP),
        priority_ratio=(
            None
            if priority_ratio is None
            else _int("priority_ratio", priority_ratio, 1, MAX_PRIORITY_RATIO)
        ),
        panic_policy=panic_policy,
        queue=check_queue_name(queue),
        metrics_port=None if metrics_port is None else _int("metrics_port", metrics_port, 1, 65535),
        metrics_host=resolve_metrics_host(metrics_host, environ),
    )


def _int(setting: str, value: object, low: int, high: int) -> int:
    # bool is an int in Python, but `concurrency=True` is a mistake, not 1.
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{setting}: expected an int from {low} to {high:,}, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{setting}: expected an int from {low} to {high:,}, got {value!r}")
    return value


def _jitter_fraction(value: object) -> float:
    """Clamped to [0, 1] (as documented: 5 is 1, -3 is 0); NaN is refused, it has no place."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TypeError(f"jitter_fraction: expected a number in [0, 1], got {value!r}")
    if isinstance(value, float) and math.isnan(value):
        raise ValueError(
            "jitter_fraction: expected a number in [0, 1] (values outside are clamped), got nan"
        )
    return float(min(max(value, 0), 1))
