"""The planner's statistics of the jobs table: when its row estimate is far below what the
counters say the table holds (a table never analysed, or a backlog enqueued since the last
ANALYZE), the leader runs ANALYZE at once rather than waiting for autovacuum (a minute or
more). Until then a generic plan of the claim expects a single matching row and sorts the
whole backlog on every claim. A maintenance service: the leader runs it, always; where its
database role may not ANALYZE the table, it says so once in the log and stops trying."""

from __future__ import annotations

import logging
import time

from venturi.postgres import PostgresStore

logger = logging.getLogger("venturi.worker")

ANALYZE_CHECK_EVERY = 10.0
"""Seconds between checks (one catalog read and one read of the counters)."""

AT_LEAST = 1000
"""Jobs the counters must hold before a stale estimate matters."""

CALM_AT_MOST = 600.0
"""Seconds at most between ANALYZEs while each leaves the estimate stale (see run_once)."""


class JobsAnalyzer:
    name = "jobs-analyze"

    def __init__(self, interval: float = ANALYZE_CHECK_EVERY) -> None:
        self.interval = interval
        self._refused = False
        self._repeats = 0  # ANALYZEs in a row, each at the first check after the one before
        self._calm_until = 0.0

    async def run_once(self, store: PostgresStore) -> None:
        if self._refused or time.monotonic() < self._calm_until:
            return
        analyzed = await store.analyze_jobs_if_stale(AT_LEAST)
        if analyzed is None:
            self._refused = True
            logger.warning(
                "jobs-analyze: the jobs table's statistics are stale and this role may not "
                "ANALYZE it (only its owner may): claims may be slow until autovacuum does"
            )
        elif analyzed:
            self._repeats += 1
            logger.info("jobs-analyze: the jobs table's statistics were stale: analysed")
            # Stale again at the next check: the table outgrows each ANALYZE, or the counters
            # disagree with it (e.g. the jobs table alone truncated), which no ANALYZE mends.
            # Either way, wait twice as long each time (10 minutes at most).
            if self._repeats > 1:
                calm = min(CALM_AT_MOST, self.interval * 2 ** (self._repeats - 1))
                self._calm_until = time.monotonic() + calm
        else:
            self._repeats = 0
