"""RESULTS.md from the raw results: medians, spreads, ratios, targets, versions, machine.

Every figure is the median over the repetitions of one run, shown with its range (min-max).
Ratios are taken between medians of the same run, which is what stays meaningful on a shared,
noisy machine: absolute numbers move between runs, ratios within one run hold.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness import Summary, summarize

VENTURI = "venturi"
BASE = "venturi-base"


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    higher_is_better: bool
    digits: int = 0

    @property
    def arrow(self) -> str:
        return "↑" if self.higher_is_better else "↓"


RATE = Metric("rate", "jobs/s", True)
WAITS = [
    Metric("wait_p50_ms", "wait p50 ms", False, 1),
    Metric("wait_p90_ms", "wait p90 ms", False, 1),
    Metric("wait_p99_ms", "wait p99 ms", False, 1),
]
RESOURCES = [
    Metric("rss_peak_mb", "peak RSS MB", False, 1),
    Metric("cpu_s_per_10k", "CPU s / 10k jobs", False, 2),
]


@dataclass(frozen=True)
class Section:
    scenario: str
    title: str
    what: str
    metrics: list[Metric]


SECTIONS = [
    Section(
        "drain_c1",
        "1. Drain, concurrency 1",
        "N jobs enqueued beforehand (bulk), then one worker process at concurrency 1. jobs/s "
        "from the first handler start to the moment the database shows no outstanding job; "
        "wait = handler start - the producer's clock in the payload.",
        [RATE, *WAITS, *RESOURCES],
    ),
    Section(
        "drain_c16",
        "1. Drain, concurrency 16 (and 6. worker resources)",
        "As above at concurrency 16. Peak RSS is the worker process's VmHWM (summed over its "
        "pool's processes for Celery); CPU is its user+system time from 'ready' to the end of "
        "the drain, per 10,000 jobs.",
        [RATE, *WAITS, *RESOURCES],
    ),
    Section(
        "enqueue_sequential",
        "2. Enqueue, one by one",
        "N jobs from one producer, each enqueue awaited before the next. The single-row "
        "ceiling (`ceiling_single`, run right after in each repetition): pgbench, one client "
        "inserting one job row per autocommit transaction into the ceiling's table "
        "(`bench/pgbench/insert_one.sql`), so every commit waits for its WAL flush as each "
        "enqueue does.",
        [RATE],
    ),
    Section(
        "enqueue_bulk100",
        "2. Enqueue, batches of 100",
        "N jobs through the system's batch API, 100 per call.",
        [RATE],
    ),
    Section(
        "enqueue_bulk1000",
        "2. Enqueue, batches of 1,000",
        "N jobs through the system's batch API, 1,000 per call.",
        [RATE],
    ),
    Section(
        "pickup_c1",
        "3. Pickup latency, concurrency 1 (idle worker, steady 50 jobs/s)",
        "An idle worker (concurrency 1); one producer enqueues one job every 20 ms on an "
        "absolute schedule for the whole window; wait = handler start - enqueue call start.",
        WAITS,
    ),
    Section(
        "pickup",
        "3. Pickup latency, concurrency 16 (idle worker, steady 50 jobs/s)",
        "As above with the worker at concurrency 16.",
        WAITS,
    ),
    Section(
        "backlog",
        "4. Backlog independence and 5. stats cost",
        "A backlog over 20 kinds (API-written template, cloned by one INSERT…SELECT), analysed "
        "and checkpointed; the stats call timed (median of repeated calls); then a worker at "
        "concurrency 16 starts M = N/2 jobs: jobs/s between the first and the M-th start.",
        [
            Metric("rate_small", "jobs/s, small backlog", True),
            Metric("rate_big", "jobs/s, big backlog", True),
            Metric("rate_ratio", "big / small", True, 2),
            Metric("stats_ms_small", "stats ms, small", False, 1),
            Metric("stats_ms_big", "stats ms, big", False, 1),
            Metric("stats_ms_queues", "stats ms, big, 5 queues", False, 1),
        ],
    ),
]


class Results:
    """Index over the raw records: values per (scenario, system, metric)."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw
        self.records: list[dict[str, Any]] = raw["records"]

    def values(self, scenario: str, system: str, key: str) -> list[float]:
        return [
            r["metrics"][key]
            for r in self.records
            if r["scenario"] == scenario
            and r["system"] == system
            and key in r.get("metrics", {})
            and r["metrics"][key] is not None
        ]

    def summary(self, scenario: str, system: str, key: str) -> Summary | None:
        return summarize(self.values(scenario, system, key))

    def median(self, scenario: str, system: str, key: str) -> float | None:
        s = self.summary(scenario, system, key)
        return s.median if s else None

    def problems(self, scenario: str, system: str) -> list[str]:
        """Why figures are missing: errors and skipped metrics, deduplicated."""
        seen: list[str] = []
        for r in self.records:
            if r["scenario"] != scenario or r["system"] != system:
                continue
            notes = [f"failed: {r['error']}"] if "error" in r else []
            notes += [_skip_note(r, k, why) for k, why in r.get("skipped", {}).items()]
            info = r.get("info", {})
            rep = f"rep {r['rep'] + 1}"
            notes += [f"{rep}: warning: {info['warning']}"] if "warning" in info else []
            notes += [f"{rep}: {info['capped']}"] if "capped" in info else []
            for note in notes:
                if note not in seen:
                    seen.append(note)
        return seen

    def systems(self) -> list[str]:
        return [s for s in self.raw["meta"]["systems"] if s not in self.raw["unavailable"]]

    def peers(self) -> list[str]:
        """Every other system; venturi's own variants (venturi-uvloop) are not peers."""
        return [s for s in self.systems() if s != VENTURI and not s.startswith(f"{VENTURI}-")]

    def best_peer(self, scenario: str, metric: Metric) -> tuple[str, float] | None:
        figures = [
            (p, m) for p in self.peers() if (m := self.median(scenario, p, metric.key)) is not None
        ]
        if not figures:
            return None
        pick = max if metric.higher_is_better else min
        return pick(figures, key=lambda f: f[1])

    def ceiling(self, jobs_per_tx: int, clients: int) -> Summary | None:
        return summarize(
            [
                row["jobs_per_s"]
                for row in self.raw["ceiling"]
                if row["jobs_per_tx"] == jobs_per_tx and row["clients"] == clients
            ]
        )

    def single_ceiling(self) -> Summary | None:
        """The single-row ceiling (one client, one row per commit), when it was run."""
        return summarize([row["jobs_per_s"] for row in self.raw.get("ceiling_single", [])])

    def best_ceiling(self, jobs_per_tx: int) -> tuple[int, float] | None:
        cells = [
            (c, s.median)
            for c in self.raw["meta"]["plan"]["ceiling_clients"]
            if (s := self.ceiling(jobs_per_tx, c)) is not None
        ]
        return max(cells, key=lambda cell: cell[1]) if cells else None


def _skip_note(record: dict[str, Any], key: str, why: str) -> str:
    """A metric skipped, a scenario not run at all (``*``), or one that ran and gave no
    figure (``*`` with info: e.g. a worker that fell behind)."""
    if key != "*":
        return f"`{key}` skipped: {why}"
    if record.get("info"):
        return f"rep {record['rep'] + 1}: {why}"
    return f"not run: {why}"


def fmt(value: float | None, digits: int = 0) -> str:
    if value is None or math.isnan(value):
        return "—"
    return f"{value:,.{digits}f}"


def fmt_summary(s: Summary | None, digits: int = 0) -> str:
    if s is None:
        return "—"
    if s.n < 2:
        return fmt(s.median, digits)
    return f"{fmt(s.median, digits)} ({fmt(s.low, digits)}-{fmt(s.high, digits)})"


def fmt_ratio(r: float) -> str:
    # Two decimals hide a 300-fold difference as "0.00x"; small ratios keep two digits.
    return f"{r:.2f}x" if r >= 0.1 else f"{r:.2g}x"


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0 or math.isnan(a) or math.isnan(b):
        return None
    return a / b


def _scenario_table(res: Results, section: Section) -> list[str]:
    header = ["system", *[f"{m.label} {m.arrow}" for m in section.metrics]]
    lines = [
        f"### {section.title}",
        "",
        section.what,
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for system in res.systems():
        cells = [
            fmt_summary(res.summary(section.scenario, system, m.key), m.digits)
            for m in section.metrics
        ]
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    if VENTURI in res.systems() and res.peers():
        lines.append(_peer_ratio_row(res, section))
    if VENTURI in res.systems() and BASE in res.systems():
        lines.append(_base_ratio_row(res, section))
    if section.scenario.startswith("drain_"):
        lines += _ceiling_row(res, section)
    if section.scenario == "enqueue_sequential":
        lines += _single_ceiling_rows(res)
    notes = [
        f"- {system}: {note}"
        for system in res.systems()
        for note in res.problems(section.scenario, system)
    ]
    return [*lines, "", *notes, *([""] if notes else [])]


def _peer_ratio_row(res: Results, section: Section) -> str:
    cells = []
    for m in section.metrics:
        best = res.best_peer(section.scenario, m)
        r = ratio(res.median(section.scenario, VENTURI, m.key), best[1] if best else None)
        cells.append(f"{fmt_ratio(r)} ({best[0]})" if r is not None and best else "—")
    return "| **venturi / best peer** | " + " | ".join(cells) + " |"


def _base_ratio_row(res: Results, section: Section) -> str:
    """venturi against itself at the base commit (`--venturi-base`), metric by metric."""
    cells = []
    for m in section.metrics:
        r = ratio(
            res.median(section.scenario, VENTURI, m.key), res.median(section.scenario, BASE, m.key)
        )
        cells.append(fmt_ratio(r) if r is not None else "—")
    return "| **venturi / venturi-base** | " + " | ".join(cells) + " |"


def _ceiling_row(res: Results, section: Section) -> list[str]:
    ceiling = res.best_ceiling(100)
    r = ratio(res.median(section.scenario, VENTURI, "rate"), ceiling[1] if ceiling else None)
    if r is None or ceiling is None:
        return []
    cells = [f"{r:.0%} of the 100-per-pass ceiling ({ceiling[0]} clients)"]
    cells += [""] * (len(section.metrics) - 1)
    return ["| **venturi / ceiling** | " + " | ".join(cells) + " |"]


def _single_ceiling_rows(res: Results) -> list[str]:
    """The single-row ceiling of the same run, and each system's share of it."""
    ceiling = res.single_ceiling()
    if ceiling is None:
        return []
    shares = [
        f"{system} {r:.0%}"
        for system in res.systems()
        if (r := ratio(res.median("enqueue_sequential", system, "rate"), ceiling.median))
        is not None
    ]
    return [
        f"| **single-row ceiling (pgbench)** | {fmt_summary(ceiling)} |",
        "| **of the single-row ceiling** | " + (", ".join(shares) or "—") + " |",
    ]


def _ceiling_table(res: Results) -> list[str]:
    plan = res.raw["meta"]["plan"]
    clients = plan["ceiling_clients"]
    lines = [
        "### 7. The ceiling (pgbench)",
        "",
        "`bench/pgbench/queue_cycle.sql`: insert, claim with FOR UPDATE SKIP LOCKED and mark "
        "done, each step its own commit, on a table with a claim index; jobs/s = tps x jobs "
        f"per pass, {plan['ceiling_seconds']:.0f} s per cell, -M prepared.",
        "",
        "| jobs per pass | " + " | ".join(f"{c} client(s)" for c in clients) + " |",
        "|" + "---|" * (len(clients) + 1),
    ]
    for batch in plan["ceiling_batches"]:
        cells = [fmt_summary(res.ceiling(batch, c)) for c in clients]
        lines.append(f"| {batch} | " + " | ".join(cells) + " |")
    if not res.raw["ceiling"]:
        lines.append("")
        lines.append("- not run in this session")
    return [*lines, ""]


@dataclass(frozen=True)
class Target:
    text: str
    figure: Callable[[Results], tuple[str, bool | None]]


def _vs_best(res: Results, scenario: str, metric: Metric, need: float) -> tuple[str, bool | None]:
    best = res.best_peer(scenario, metric)
    r = ratio(res.median(scenario, VENTURI, metric.key), best[1] if best else None)
    if r is None or best is None:
        return "n/a", None
    return f"{fmt_ratio(r)} {best[0]}", r >= need


def _of_ceiling(res: Results, need: float) -> tuple[str, bool | None]:
    best = res.best_ceiling(100)
    r = ratio(res.median("drain_c16", VENTURI, "rate"), best[1] if best else None)
    if r is None or best is None:
        return "n/a", None
    return f"{r:.0%} of {fmt(best[1])} jobs/s ({best[0]} clients)", r >= need


def _below(
    res: Results, scenario: str, key: str, limit: float, digits: int = 1
) -> tuple[str, bool | None]:
    v = res.median(scenario, VENTURI, key)
    if v is None:
        return "n/a", None
    return fmt(v, digits), v < limit


def _ahead_everywhere(res: Results) -> tuple[str, bool | None]:
    """Every metric of every scenario table, venturi's median against the best peer's."""
    behind, compared = [], 0
    for section in SECTIONS:
        if section.scenario not in res.raw["meta"]["scenarios"]:
            continue
        for metric in section.metrics:
            best = res.best_peer(section.scenario, metric)
            mine = res.median(section.scenario, VENTURI, metric.key)
            if best is None or mine is None or metric.key == "rate_ratio":
                continue
            compared += 1
            ahead = mine > best[1] if metric.higher_is_better else mine < best[1]
            if not ahead:
                behind.append(f"{section.scenario} {metric.label} ({best[0]})")
    if not compared:
        return "n/a", None
    if not behind:
        return f"ahead in all {compared} figures", True
    return f"behind or tied in {len(behind)} of {compared}: " + "; ".join(behind), False


def _ratio_at_least(res: Results) -> tuple[str, bool | None]:
    v = res.median("backlog", VENTURI, "rate_ratio")
    if v is None:
        return "n/a", None
    return f"{v:.0%}", v >= 0.8


# The goals of issue 18 (and the two backlog goals before it), from this run's medians.
TARGETS = [
    Target("Every scenario ahead of every peer", _ahead_everywhere),
    Target("Drain c=16 ≥ 60% of the batched ceiling", lambda r: _of_ceiling(r, 0.60)),
    Target("Drain c=1 ≥ 1.5x the best peer", lambda r: _vs_best(r, "drain_c1", RATE, 1.5)),
    Target(
        "Single-job enqueue ≥ 1.3x the best peer",
        lambda r: _vs_best(r, "enqueue_sequential", RATE, 1.3),
    ),
    Target(
        "Bulk enqueue (100) ≥ 1.5x the best peer",
        lambda r: _vs_best(r, "enqueue_bulk100", RATE, 1.5),
    ),
    Target(
        "Bulk enqueue (1,000) ≥ 1.5x the best peer",
        lambda r: _vs_best(r, "enqueue_bulk1000", RATE, 1.5),
    ),
    Target("Pickup p99 < 5 ms, c=1", lambda r: _below(r, "pickup_c1", "wait_p99_ms", 5.0)),
    Target("Pickup p99 < 5 ms, c=16", lambda r: _below(r, "pickup", "wait_p99_ms", 5.0)),
    Target(
        "Worker peak RSS (c=16 drain) < 100 MB",
        lambda r: _below(r, "drain_c16", "rss_peak_mb", 100.0),
    ),
    Target("Drain at 1M pending ≥ 80% of at 20k", _ratio_at_least),
    Target("Stats with 1M pending < 50 ms", lambda r: _below(r, "backlog", "stats_ms_big", 50.0)),
    Target(
        "Stats with 1M pending over 20 kinds and 5 queues < 1 ms",
        lambda r: _below(r, "backlog", "stats_ms_queues", 1.0, digits=2),
    ),
]


def _targets(res: Results) -> list[str]:
    lines = [
        "## Targets (venturi, ratios from this run)",
        "",
        "| target | figure | |",
        "|---|---|---|",
    ]
    for target in TARGETS:
        figure, met = target.figure(res)
        verdict = {True: "met", False: "**missed**", None: "not measured"}[met]
        lines.append(f"| {target.text} | {figure} | {verdict} |")
    return [*lines, ""]


# How each system is set up, and why: each as its own documentation has users run it. The
# adapters' docstrings (bench/adapters/*.py, bench/river/main.go, bench/graphile/adapter.mjs)
# say the same in more detail.
SETUP: dict[str, str] = {
    "venturi": "`Worker(None, store, concurrency=c)`, every other setting at its default; "
    "asyncpg, the stock asyncio loop.",
    "venturi-uvloop": "The same venturi on uvloop in both the producer and the worker (the "
    "`venturi[uvloop]` extra; `venturi worker --loop uvloop`, or `uvloop.run(main())` in "
    "one's own program). A variant of venturi, not a peer: the ratios and targets use "
    "`venturi` on asyncio.",
    "pgqueuer": "`pgqueuer.run(...)` (the twin of `pgq run`) on uvloop, as `pgq run` and "
    "pgqueuer's benchmark tool run; asyncpg, a dedicated worker connection, `pgq autovac`. "
    "c=16: `max_concurrent_tasks=16`, `batch_size=8` (it requires max ≥ 2 x batch). c=1: "
    "no per-worker pair is valid, so the entrypoint's `concurrency_limit=1`, which its docs "
    "give for processing 'strictly one at a time', with `batch_size=1` (with its default "
    "batch of 10 the finished job stays 'picked' until the status buffer's 100 ms flush, and "
    "the limit admits ~10 jobs/s).",
    "pgqueuer-defaults": "pgqueuer with `pgq run`'s defaults, `batch_size=10` and no "
    "`max_concurrent_tasks`: no concurrency bound, a batch's jobs run side by side. This is "
    "what pgqueuer's benchmark tool measures with `--dequeue 1`, and what an outside harness "
    "reported as pgqueuer 'at concurrency 1'; shown for the c=1 drain only.",
    "procrastinate": "`app.run_worker_async(concurrency=c)`, psycopg 3 (binary), pool "
    "sized c + 2, everything else default.",
    "river": "River at its defaults: `MaxWorkers=c` on the default queue, FetchCooldown "
    "100 ms, FetchPollInterval 1 s, pgxpool defaults, `rivermigrate`; `Insert` for one job, "
    "`InsertManyFast` for batches.",
    "river-1ms": "The same River program with FetchCooldown 1 ms (River's minimum) and "
    "FetchPollInterval 50 ms, on the worker and on the inserting client (River limits insert "
    "notifications per queue by the inserter's cooldown).",
    "graphile-worker": "`run({concurrency: c, taskList})`, defaults otherwise (LISTEN/NOTIFY, "
    "no local queue, no batched completion), `maxPoolSize` raised to c above its default 10 "
    "(the runner warns otherwise); `addJob` for one job, `addJobs` for batches.",
    "celery": "Celery with Redis (Debian's redis-server, AOF with `appendfsync everysec`, no "
    "RDB snapshots), the default prefork pool at `--concurrency c`, `task_acks_late=True` "
    "for at-least-once, no result backend, every other setting default; `delay()` per job. "
    "**Its durability differs**: a job is a Redis list entry, not a row committed in a "
    "PostgreSQL transaction (it cannot commit with the application's data, and a crash can "
    "lose about a second of acknowledged enqueues). It has no batch enqueue and no stats "
    "call (shown as —). RSS and CPU sum the worker and its pool's c children.",
}


def _setup(res: Results) -> list[str]:
    lines = ["## How each system is set up", ""]
    lines += [f"- **{system}**: {SETUP[system]}" for system in res.systems() if system in SETUP]
    base = res.raw["meta"].get("venturi_base")
    if base is not None and BASE in res.systems():
        lines.append(
            f"- **{BASE}**: the same adapter and settings as venturi, on venturi built from "
            f"commit {base} (`--venturi-base`), measured interleaved with the rest of this "
            "run: the before of a before/after. Not a peer: the ratios to the best peer and "
            "the targets leave it out."
        )
    return [*lines, ""]


def _environment(raw: dict[str, Any]) -> list[str]:
    meta = raw["meta"]
    machine = meta["machine"]
    pg = meta.get("postgres", {})
    lines = [
        "## Versions and machine",
        "",
        f"- machine: {machine['cores']} cores ({machine['cpu']}), {machine['memory_gib']} GiB, "
        f"{machine['os']}",
        f"- load average (1/5/15 min) before: {_load(meta.get('load_before'))}, "
        f"after: {_load(meta.get('load_after'))}",
        f"- PostgreSQL: {pg.get('version', '?')}",
        *([f"- Redis (Celery's broker): {meta['redis']['version']}"] if "redis" in meta else []),
        "- PostgreSQL settings: "
        + ", ".join(f"`{k}={v}`" for k, v in pg.get("settings", {}).items()),
        f"- venturi commit: {meta.get('git', '?')}",
        *([f"- venturi-base commit: {meta['venturi_base']}"] if "venturi_base" in meta else []),
        f"- Python: {meta.get('versions', {}).get('python', '?')}",
    ]
    for system, versions in meta.get("versions", {}).items():
        if isinstance(versions, dict):
            lines.append(f"- {system}: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    lines += [f"- {system}: not measured ({why})" for system, why in raw["unavailable"].items()]
    return [*lines, ""]


def _load(values: list[float] | None) -> str:
    return " / ".join(f"{v:.2f}" for v in values) if values else "?"


def render(raw: dict[str, Any]) -> str:
    res = Results(raw)
    meta = raw["meta"]
    plan = meta["plan"]
    head = [
        "# venturi benchmark results",
        "",
        f"Generated by `{meta['command'].strip()}` ({meta['mode']} mode), "
        f"started {meta['started']}, "
        f"took {meta.get('duration_s', 0) / 60:.0f} min. {plan['reps']} repetition(s); every "
        f"figure is the median, with (min-max) over the repetitions. N = {plan['n']:,} jobs; "
        f"backlog = {plan['backlog_big']:,} pending jobs over {plan['backlog_kinds']} kinds. "
        "How each figure is measured: `bench/README.md`. Raw data: `results.json`.",
        "",
        "Ratios compare medians from this one run on this one machine (shared and noisy: "
        "absolute numbers move between runs, ratios within a run hold). ↑ = higher is better, "
        "↓ = lower is better; for a ↓ metric a ratio below 1 favours venturi.",
        "",
    ]
    if meta["mode"] == "quick":
        head += ["> Quick mode: tiny sizes, one repetition. These figures mean nothing.", ""]
    body: list[str] = []
    if VENTURI in res.systems():
        body += _targets(res)
    body.append("## Scenarios")
    body.append("")
    for section in SECTIONS:
        if section.scenario in meta["scenarios"]:
            body += _scenario_table(res, section)
    if "ceiling" in meta["scenarios"]:
        body += _ceiling_table(res)
    return "\n".join([*head, *body, *_setup(res), *_environment(raw)])


def write(raw: dict[str, Any], path: Path) -> None:
    path.write_text(render(raw))
