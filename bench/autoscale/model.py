"""The cluster and the queue as a deterministic discrete-event model.

What is modelled, and how (each rule is the one the real part follows):

- **Jobs** arrive as the trace says (one insert = one NOTIFY). A job that finds a ready pod with
  a free slot is claimed at once by one of them, chosen at random (every worker gets the NOTIFY
  and races for the row with ``SKIP LOCKED``); otherwise it waits in FIFO order. A pod that
  frees a slot claims the oldest waiting job. (``placement="packed"`` instead gives a new job
  to the busiest pod with a free slot: what workers that let busier ones claim first would
  do -- the runtime does not; an ablation of what it would buy.)
- **Pods** of the worker Deployment: created when ``spec.replicas`` rises, ready (serving)
  ``startup_s`` later, ``concurrency`` slots each.
- **Scale-in** picks victims as the ReplicaSet controller does (``ActivePodsWithRanks`` in
  kubernetes ``pkg/controller/controller_utils.go``): not-ready pods first, then the lower
  ``controller.kubernetes.io/pod-deletion-cost``, then the pod ready for the shorter time on a
  log2 scale (``LogarithmicScaleDown``, on by default since 1.22), then a pseudo-random order
  (by UID). Node co-location and restarts are the same for every pod here.
- **SIGTERM drain** of a victim: the worker stops claiming; jobs that finish within
  ``shutdown_timeout_s`` complete; the rest are aborted and released (they run again from the
  start: *re-run*). If ``grace_s`` (``terminationGracePeriodSeconds``) ends first, SIGKILL: the
  running jobs are *killed* and stay claimed until their lease (``lease_s``, renewed every third
  of it while running) expires, then wait again.
- **Stats** are what ``Queue.stats()`` reads: pending (eligible, unclaimed), claimed (including
  jobs held by killed pods until their lease expires), the oldest pending job's age, and the
  running totals of finished jobs.

Metrics accumulate over ``[0, horizon]``: provisioned replica-seconds (every pod that exists,
starting and draining included), busy slot-seconds; waits are per job (from its enqueue to the
start of the run that completed it), including jobs still waiting when the run stops.
"""

from __future__ import annotations

import functools
import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from bench.autoscale.traces import Trace

STARTING, READY, DRAINING, GONE = "starting", "ready", "draining", "gone"

#: Which ready pod with a free slot claims a new job: any, at random (the workers' race, as
#: the runtime does it), or the busiest (packing: an ablation).
Placement = Literal["random", "packed"]


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSpec:
    """The worker Deployment and the worker process in it."""

    #: Slots per pod (``Worker(concurrency=8)``).
    concurrency: int = 8
    #: Seconds from ``spec.replicas`` rising to the pod claiming jobs.
    startup_s: float = 15.0
    #: The worker's ``shutdown_timeout``: the drain on SIGTERM.
    shutdown_timeout_s: float = 30.0
    #: The pod's ``terminationGracePeriodSeconds`` (examples/worker.yaml: 45).
    grace_s: float = 45.0
    #: The job lease (the worker's default, 15 min).
    lease_s: float = 900.0


class Pod:
    __slots__ = ("cost", "created", "fenced", "jobs", "name", "ready_at", "slot", "state", "uid")

    def __init__(self, name: str, created: float, uid: int) -> None:
        self.name = name
        self.created = created
        self.ready_at: float | None = None
        self.state = STARTING
        self.jobs: set[int] = set()
        #: controller.kubernetes.io/pod-deletion-cost; 0 when not annotated.
        self.cost = 0
        self.uid = uid
        #: Index in Cluster._avail, or -1.
        self.slot = -1
        #: Fenced for a scale-in (a proposed mechanism, an ablation): it claims no job.
        self.fenced = False


class Autoscaler(Protocol):
    """A policy plugged into the cluster: it schedules its own loops."""

    @property
    def name(self) -> str: ...

    def start(self, cluster: Cluster) -> None: ...

    def on_notify(self, cluster: Cluster) -> None:
        """A NOTIFY on the queue's channel (one per insert statement)."""
        ...


@dataclass
class Counters:
    replica_seconds: float = 0.0
    busy_slot_seconds: float = 0.0
    completed: int = 0
    rerun: int = 0
    killed: int = 0
    #: (time, from, to) of every change of spec.replicas.
    scale_events: list[tuple[float, int, int]] = field(default_factory=list)
    #: Job ids that arrived first at a Deployment of zero replicas (one per period at zero).
    first_from_zero: list[int] = field(default_factory=list)
    peak_replicas: int = 0


class Cluster:
    """One worker Deployment and its queue, driven by one autoscaler over one trace."""

    def __init__(
        self,
        trace: Trace,
        worker: WorkerSpec,
        *,
        seed: int,
        initial_replicas: int = 0,
        horizon: float | None = None,
        drain_limit: float = 3600.0,
        placement: Placement = "random",
    ) -> None:
        self.trace = trace
        self.worker = worker
        self.placement = placement
        self.horizon = trace.duration if horizon is None else horizon
        self.drain_limit = drain_limit
        self.now = 0.0
        self._last = 0.0
        self._seq = 0
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        # Placement and victim tie-breaks: their own stream, the same for every policy.
        self.rng = random.Random(f"cluster-{trace.name}-{seed}")
        self.counters = Counters()
        # Jobs, as parallel arrays indexed by job id.
        self.arrival: list[float] = []
        self.service: list[float] = []
        self.started: list[float | None] = []
        self.run_id: list[int] = []
        self.pod_of: list[Pod | None] = []
        self.done: list[bool] = []
        self.pending: deque[int] = deque()
        #: Jobs held by killed pods: claimed until the lease runs out.
        self.orphaned = 0
        self.running = 0
        self.completed_total = 0
        # Pods.
        self.pods: list[Pod] = []
        self._avail: list[Pod] = []
        self._uid = 0
        self.spec_replicas = 0
        self._zero_open = True
        self._existing = 0
        self.scale(initial_replicas, by="initial", ready=True)
        self.counters.scale_events.clear()

    # --- the clock ----------------------------------------------------------------------------

    def at(self, when: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` at time ``when`` (never before now)."""
        self._seq += 1
        heapq.heappush(self._events, (max(when, self.now), self._seq, fn))

    def _advance(self, t: float) -> None:
        end = min(t, self.horizon)
        if end > self._last:
            span = end - self._last
            self.counters.replica_seconds += self._existing * span
            self.counters.busy_slot_seconds += self.running * span
            self._last = end
        self.now = t

    def run(self, autoscaler: Autoscaler) -> None:
        inserts = self.trace.inserts
        i, n = 0, len(inserts)
        autoscaler.start(self)
        stop = self.horizon + self.drain_limit
        while True:
            next_insert = inserts[i].at if i < n else math.inf
            next_event = self._events[0][0] if self._events else math.inf
            t = min(next_insert, next_event)
            if t > stop or (t > self.horizon and self.outstanding == 0):
                break
            self._advance(t)
            if next_insert <= next_event:
                self._insert(inserts[i].service)
                i += 1
                autoscaler.on_notify(self)
            else:
                heapq.heappop(self._events)[2]()
        self._advance(max(self.now, self.horizon))

    # --- jobs ---------------------------------------------------------------------------------

    @property
    def outstanding(self) -> int:
        return len(self.pending) + self.running + self.orphaned

    @property
    def claimed(self) -> int:
        return self.running + self.orphaned

    def oldest_pending_age(self) -> float | None:
        if not self.pending:
            return None
        # Released jobs go back to the front with their old enqueue time: the front is oldest.
        return self.now - self.arrival[self.pending[0]]

    def _insert(self, services: Sequence[float]) -> None:
        if self.spec_replicas == 0 and self._zero_open:
            self.counters.first_from_zero.append(len(self.arrival))
            self._zero_open = False
        for s in services:
            job = len(self.arrival)
            self.arrival.append(self.now)
            self.service.append(s)
            self.started.append(None)
            self.run_id.append(0)
            self.pod_of.append(None)
            self.done.append(False)
            if not self._avail:
                self.pending.append(job)
            elif self.placement == "packed":
                self._claim(max(self._avail, key=lambda p: (len(p.jobs), p.uid)), job)
            else:
                self._claim(self._avail[self.rng.randrange(len(self._avail))], job)

    def _claim(self, pod: Pod, job: int) -> None:
        pod.jobs.add(job)
        self.pod_of[job] = pod
        self.started[job] = self.now
        self.run_id[job] += 1
        self.running += 1
        if len(pod.jobs) >= self.worker.concurrency:
            self._unavail(pod)
        run = self.run_id[job]
        self.at(self.now + self.service[job], lambda: self._complete(job, run))

    def _complete(self, job: int, run: int) -> None:
        pod = self.pod_of[job]
        if pod is None or self.run_id[job] != run:
            return  # aborted or killed meanwhile
        pod.jobs.discard(job)
        self.pod_of[job] = None
        self.done[job] = True
        self.running -= 1
        self.completed_total += 1
        self.counters.completed += 1
        if pod.state == DRAINING:
            if not pod.jobs:
                self._gone(pod)
        else:
            self._fill(pod)

    def _fill(self, pod: Pod) -> None:
        """A ready pod takes waiting jobs into its free slots."""
        if pod.fenced:
            return
        while self.pending and len(pod.jobs) < self.worker.concurrency:
            self._claim(pod, self.pending.popleft())
        if len(pod.jobs) < self.worker.concurrency and pod.slot < 0:
            pod.slot = len(self._avail)
            self._avail.append(pod)

    def fence(self, pod: Pod) -> None:
        """From now on the pod claims no job (the claim refuses it: atomic with the record)."""
        pod.fenced = True
        self._unavail(pod)

    def unfence(self, pod: Pod) -> None:
        if not pod.fenced:
            return
        pod.fenced = False
        if pod.state == READY:
            self._fill(pod)

    def _unavail(self, pod: Pod) -> None:
        if pod.slot < 0:
            return
        last = self._avail.pop()
        if last is not pod:
            self._avail[pod.slot] = last
            last.slot = pod.slot
        pod.slot = -1

    # --- pods ---------------------------------------------------------------------------------

    def live_pods(self) -> list[Pod]:
        """Pods the Deployment counts (status.replicas): starting or ready, not terminating."""
        return [p for p in self.pods if p.state in (STARTING, READY)]

    def ready_pods(self) -> int:
        return sum(1 for p in self.pods if p.state == READY)

    def claimed_by_pod(self) -> dict[str, int]:
        """What ``Queue.claimed_by_pod()`` returns: claimed jobs per pod name."""
        return {p.name: len(p.jobs) for p in self.pods if p.jobs}

    def scale(self, replicas: int, *, by: str, ready: bool = False) -> None:
        """Set the Deployment's spec.replicas; the ReplicaSet creates or deletes pods at once."""
        if replicas == self.spec_replicas:
            return
        self.counters.scale_events.append((self.now, self.spec_replicas, replicas))
        self.spec_replicas = replicas
        # A job that arrives from now on waits for a pod to start: a "first job from zero".
        self._zero_open = replicas == 0
        live = self.live_pods()
        if replicas > len(live):
            for _ in range(replicas - len(live)):
                self._create(ready)
        elif replicas < len(live):
            for pod in sorted(live, key=self._deletion_rank)[: len(live) - replicas]:
                self._terminate(pod)
        self.counters.peak_replicas = max(self.counters.peak_replicas, replicas)

    def _create(self, ready: bool) -> None:
        self._uid += 1
        pod = Pod(f"worker-{self._uid}", self.now, self.rng.getrandbits(64))
        self.pods.append(pod)
        self._existing += 1
        if ready:
            self._ready(pod)
        else:
            self.at(self.now + self.worker.startup_s, lambda: self._ready(pod))

    def _ready(self, pod: Pod) -> None:
        if pod.state != STARTING:
            return  # deleted while starting
        pod.state = READY
        pod.ready_at = self.now
        self._fill(pod)

    def _deletion_rank(self, pod: Pod) -> tuple[int, int, int, int]:
        ready = pod.state == READY
        bucket = -1
        if ready and pod.ready_at is not None and self.now > pod.ready_at:
            bucket = int(math.log2((self.now - pod.ready_at) * 1e9))  # nanoseconds, as Go
        return (1 if ready else 0, pod.cost, bucket, pod.uid)

    def _terminate(self, pod: Pod) -> None:
        if pod.state == STARTING:
            self._gone(pod)
            return
        self._unavail(pod)
        pod.state = DRAINING
        if not pod.jobs:
            self._gone(pod)
            return
        w = self.worker
        if w.shutdown_timeout_s < w.grace_s:
            self.at(self.now + w.shutdown_timeout_s, lambda: self._abort(pod))
        else:
            self.at(self.now + w.grace_s, lambda: self._kill(pod))

    def _abort(self, pod: Pod) -> None:
        """shutdown_timeout is over: abort and release what still runs; the worker exits."""
        if pod.state != DRAINING:
            return
        for job in sorted(pod.jobs, key=lambda j: self.arrival[j], reverse=True):
            self.pod_of[job] = None
            self.running -= 1
            self.counters.rerun += 1
            self.pending.appendleft(job)
        pod.jobs.clear()
        self._gone(pod)
        self._place_released()

    def _kill(self, pod: Pod) -> None:
        """terminationGracePeriodSeconds is over: SIGKILL; leases bring the jobs back later."""
        if pod.state != DRAINING:
            return
        for job in list(pod.jobs):
            self.pod_of[job] = None
            self.running -= 1
            self.orphaned += 1
            self.counters.killed += 1
            # Renewed every third of the lease while it ran: 2/3 to all of it is left.
            left = self.worker.lease_s * (2 / 3 + self.rng.random() / 3)
            self.at(self.now + left, functools.partial(self._recover, job))
        pod.jobs.clear()
        self._gone(pod)

    def _recover(self, job: int) -> None:
        self.orphaned -= 1
        self.pending.appendleft(job)
        self._place_released()

    def _place_released(self) -> None:
        for pod in list(self._avail):
            if not self.pending:
                return
            self._fill(pod)

    def _gone(self, pod: Pod) -> None:
        self._unavail(pod)
        pod.state = GONE
        self.pods.remove(pod)
        self._existing -= 1
