"""Flow control middleware: runs that must not overlap, and starts that must not exceed a rate.

    from venturi.flow import rate_limited, without_overlapping

    worker.register(
        SyncStock,
        sync_stock,
        middleware=[
            without_overlapping(lambda t: f"shop:{t.shop_id}", release_after=10),
            rate_limited("supplier-api", 60, per=60),
        ],
    )

Both are ordinary middleware (`venturi.middleware`): give them to one registration as above,
or to a worker (`Worker(middleware=[...])`) to cover every kind it runs. A key is a string, or
a function of the task returning one (or None: this job is not limited). A job that may not
run now is put back without running, as a pause (`Outcome.pause_in`): it uses no attempt and
no backoff, and its journal entry says why ("overlaps job ... on key ...").

Both are enforced through the database, so they hold across every worker sharing the store:
a key is a row of `{prefix}_locks` naming the run that holds it by its claim token, and a
key's rate window is its counter row in `{prefix}_rate_windows`, taken atomically in one round
trip (both through small functions of the flow migration). Put
`without_overlapping` first (outermost) when combining them: a job that waits for its key
then takes no start of the rate window.

Called by the executor through the middleware chain; calls `PostgresStore.lock_*` and
`rate_take` with the claim the runner bound (`venturi._current`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ulid import ULID

from venturi import _current, logs
from venturi._db.failures import breaks_connection, describe, is_database_failure
from venturi._shown import shown
from venturi.backoff import Seconds, to_seconds
from venturi.context import Context
from venturi.middleware import CallNext, Middleware
from venturi.outcome import Outcome

__all__ = [
    "DEFAULT_RELEASE_AFTER",
    "KEY_MAX_CHARS",
    "Key",
    "rate_limited",
    "without_overlapping",
]

logger = logging.getLogger(__name__)

Key = str | Callable[[Any], str | None]
"""A flow key: a fixed string, or a function of the task (None: this job is not limited)."""

DEFAULT_RELEASE_AFTER = 5.0
"""Seconds a job that would overlap waits before it tries again."""
KEY_MAX_CHARS = 1000
"""Longest key: keys are index entries, not payloads."""
OUTAGE_RETRY_S = 1.0
"""Seconds a job is put back when the database cannot be asked for its key or its window (a
connection lost, a server restarting): an outage uses no attempt, as a wait does not."""


def without_overlapping(key: Key, *, release_after: Seconds = DEFAULT_RELEASE_AFTER) -> Middleware:
    """At most one run with `key` at a time, across every worker of the store.

    A job whose key another live run holds is put back for `release_after` (seconds, or a
    timedelta) without running and without using an attempt. The key is released as soon as
    the run ends; if its worker dies, the key frees itself when the job's lease is recovered
    (the holder's claim token no longer matches), with no lock expiry to tune.
    """
    key_of = _key_function(key, "without_overlapping")
    wait = to_seconds(release_after, name="without_overlapping(release_after)")

    async def without_overlapping_mw(
        task: Any, ctx: Context[Any], call_next: CallNext
    ) -> Outcome | None:
        k = key_of(task)
        if k is None:
            return await call_next()
        run = _current.current("without_overlapping")
        job = run.job
        try:
            holder = await run.store.lock_take(k, job.id, job.claim_token)
        except Exception as exc:
            # Taken with its reply lost is harmless: the key frees itself with this run's
            # claim token, which the put-back clears.
            return _put_back(exc, f"key {k!r}")
        if holder is not None:
            return Outcome.pause_in(
                wait, note=f"overlaps job {ULID.from_bytes(holder.bytes)} on key {k!r}"
            )
        try:
            return await call_next()
        finally:
            try:
                await run.store.lock_release(k, job.id, job.claim_token)
            except Exception as exc:
                # Harmless: the key frees itself once this run's settlement clears its token.
                logger.warning(
                    "job %s: releasing key %r failed (%s)", logs.ShownId(job.id), k, describe(exc)
                )

    return without_overlapping_mw


def rate_limited(key: Key, max: int, per: Seconds) -> Middleware:
    """At most `max` starts per fixed window of `per` (at least 1 s), shared by every job and
    worker using `key`.

    Windows are aligned on the Unix epoch in database time (`per=60`: each minute). A job over
    the limit is put back until its window ends, without running and without using an
    attempt. A start is taken when the job is about to run (after its claim): see the README
    on what that costs on a saturated key.
    """
    key_of = _key_function(key, "rate_limited")
    if not isinstance(max, int) or isinstance(max, bool) or max < 1:
        raise ValueError(f"rate_limited(max): expected an int >= 1, got {max!r}")
    per_s = to_seconds(per, name="rate_limited(per)")
    if per_s < 1.0:
        raise ValueError(f"rate_limited(per): expected a window of at least 1 s, got {per_s!r}")

    async def rate_limited_mw(task: Any, ctx: Context[Any], call_next: CallNext) -> Outcome | None:
        k = key_of(task)
        if k is None:
            return await call_next()
        run = _current.current("rate_limited")
        try:
            taken, reopens_in_s = await run.store.rate_take(k, max, per_s)
        except Exception as exc:  # a start taken with its reply lost is one start unused
            return _put_back(exc, f"rate limit {k!r}")
        if not taken:
            return Outcome.pause_in(
                reopens_in_s,
                note=f"rate limit {k!r}: {max} starts per {per_s:g}s reached; "
                f"window reopens in {reopens_in_s:.3f}s",
            )
        return await call_next()

    return rate_limited_mw


def _put_back(exc: Exception, what: str) -> Outcome:
    """The job back for `OUTAGE_RETRY_S` when the database could not be asked (no attempt
    used); any other error is raised, as a handler's would be."""
    if not (is_database_failure(exc) and breaks_connection(exc)):
        raise exc
    return Outcome.pause_in(
        OUTAGE_RETRY_S, note=f"{what}: the database could not be asked ({describe(exc)})"
    )


def _key_function(key: Key, what: str) -> Callable[[Any], str | None]:
    if isinstance(key, str):
        fixed = _checked_key(key, what)
        return lambda _task: fixed
    if not callable(key):
        raise TypeError(f"{what}(key): expected a str or a function of the task, got {key!r}")

    def computed(task: Any) -> str | None:
        value = key(task)
        return None if value is None else _checked_key(value, what)

    return computed


def _checked_key(key: object, what: str) -> str:
    if not isinstance(key, str):
        raise TypeError(f"{what}: a key must be a str, got {type(key).__name__} {shown(key)}")
    if not key or len(key) > KEY_MAX_CHARS or "\x00" in key:
        raise ValueError(
            f"{what}: a key must be 1-{KEY_MAX_CHARS} characters without NUL, got {shown(key)}"
        )
    return key
