"""Measurement code shared by every system: one clock, one recorder, one way to summarise.

This module is imported both by the orchestrator (the repo's Python) and by each adapter
(inside that system's virtual environment), so it uses the standard library only. Keeping the
clock, the per-job recorder, the /proc sampling and the statistics here is what guarantees that
no system is measured differently from another.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# The one clock. Wall time, because an enqueue→start wait spans two processes: the producer
# stamps the payload and the worker stamps the handler start. Both read CLOCK_REALTIME on the
# same machine, so the difference is exact up to the clock's resolution.
now = time.time


class JobRecorder:
    """Records (enqueued_at, started_at) for each handler call, in memory, inside the worker.

    Nothing is written to the database or to disk while the worker is being measured: an
    ``array('d')`` append costs well under a microsecond. The pairs are written to a file once
    the worker has stopped.
    """

    def __init__(self) -> None:
        self._pairs = array("d")
        self.count = 0

    def record(self, enqueued_at: float) -> int:
        """Called first thing in every no-op handler; returns how many jobs have started."""
        self._pairs.append(enqueued_at)
        self._pairs.append(now())
        self.count += 1
        return self.count

    def save(self, path: Path) -> None:
        with open(path, "wb") as fh:
            self._pairs.tofile(fh)


def load_timings(path: Path) -> tuple[list[float], list[float]]:
    """Read back a recorder file: (enqueued_at, started_at) lists in handler-start order."""
    pairs = array("d")
    with open(path, "rb") as fh:
        pairs.frombytes(fh.read())
    return list(pairs[0::2]), list(pairs[1::2])


def percentile(values: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile (p in 0..100), the same definition for every figure."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def waits_ms(enqueued: Sequence[float], started: Sequence[float]) -> list[float]:
    """Each job's wait, handler start - enqueue, in milliseconds."""
    return [(s - e) * 1000.0 for e, s in zip(enqueued, started, strict=True)]


def wait_percentiles_ms(enqueued: Sequence[float], started: Sequence[float]) -> dict[str, float]:
    waits = waits_ms(enqueued, started)
    return {f"wait_p{p}_ms": percentile(waits, p) for p in (50, 90, 99)}


def clock_warning(enqueued: Sequence[float], started: Sequence[float]) -> str | None:
    """A note when a job started before it was enqueued: no queue does that, so the producer's
    and the worker's clocks disagree (they are two processes) and the waits are off by as much."""
    waits = waits_ms(enqueued, started)
    negative = [w for w in waits if w < 0]
    if not negative:
        return None
    return (
        f"{len(negative):,} of {len(waits):,} waits negative (down to {min(negative):.2f} ms): "
        "the producer's and the worker's clocks disagree"
    )


def start_rate(started: Sequence[float], count: int | None = None) -> float:
    """Jobs/s between the first and the ``count``-th handler start (all of them by default).

    Used where completion cannot be observed cheaply (a 1,000,000-row backlog): in a steady
    drain, starts and completions run at the same rate, bounded by the concurrency.
    """
    ordered = sorted(started)
    if count is not None:
        ordered = ordered[:count]
    if len(ordered) < 2 or ordered[-1] <= ordered[0]:
        return math.nan
    return (len(ordered) - 1) / (ordered[-1] - ordered[0])


@dataclass(frozen=True)
class Summary:
    """Median and spread of one metric over the repetitions of a run."""

    median: float
    low: float
    high: float
    n: int

    @property
    def spread_pct(self) -> float:
        """(max - min) / median, in percent: how much the repetitions disagree."""
        if self.n < 2 or not self.median:
            return 0.0
        return (self.high - self.low) / abs(self.median) * 100.0


def summarize(values: Sequence[float]) -> Summary | None:
    clean = [v for v in values if v is not None and not math.isnan(v)]
    if not clean:
        return None
    return Summary(statistics.median(clean), min(clean), max(clean), len(clean))


@dataclass(frozen=True)
class ProcSample:
    """What /proc says about one process and its descendants at one instant."""

    rss_peak_bytes: int  # VmHWM: the kernel's own high-water mark, so no peak is missed
    rss_bytes: int
    cpu_seconds: float  # user + system time
    processes: int = 1  # a worker with a process pool (Celery's prefork) is several


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE_KB = 1024


def _descendants(pid: int) -> list[int]:
    found = [pid]
    for current in found:
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                found += [int(child) for child in task.read_text().split()]
            except OSError:
                continue
    return found


def _read_one(pid: int) -> ProcSample:
    status: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                status[key] = int(rest.split()[0]) * _PAGE_KB
    with open(f"/proc/{pid}/stat") as fh:
        # The command name (field 2) may hold spaces; fields after the closing paren are fixed.
        fields = fh.read().rsplit(")", 1)[1].split()
    utime, stime = int(fields[11]), int(fields[12])
    return ProcSample(
        rss_peak_bytes=status.get("VmHWM", 0),
        rss_bytes=status.get("VmRSS", 0),
        cpu_seconds=(utime + stime) / _CLOCK_TICKS,
    )


def read_proc(pid: int) -> ProcSample:
    """The process ``pid`` plus every live descendant, summed. For one process this is its
    own figures; for a pool of forked processes the sum of their peaks counts the pages they
    share once per process, an upper bound of their memory."""
    samples = []
    for each in _descendants(pid):
        try:
            samples.append(_read_one(each))
        except (OSError, IndexError, ValueError):
            if each == pid:
                raise
    return ProcSample(
        rss_peak_bytes=sum(s.rss_peak_bytes for s in samples),
        rss_bytes=sum(s.rss_bytes for s in samples),
        cpu_seconds=sum(s.cpu_seconds for s in samples),
        processes=len(samples),
    )
