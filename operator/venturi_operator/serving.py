"""Which kinds a pool's workers serve, from the worker registry: a job whose kind no worker of
its pool registers is a condition (``UnservedKinds``), not demand.

Such a job (a producer released ahead of its workers, a misspelt kind, a task removed) waits
for a worker that knows its kind. Counted as demand it would keep the pool up, and the age
target would add a replica per tick, for a job none of the new pods can take. But the
registry only speaks for workers that write to it, and a pool at zero has none: the rule must
not take their silence for "serves nothing". Per pool, the kinds served are read from:

1. the live registry rows of the Deployment's pods (neither terminating nor finished): a
   (queue, kind) is served when some such worker lists the queue and the kind, or fails
   unknown kinds (it takes every kind of its queues);
2. when no pod of the pool has a live row (at zero, pods starting, a database outage), what
   (1) last found for the same pod template: scaled to zero, the pool stays asleep for a kind
   its workers did not serve, and wakes for every kind they did. A new template (a release,
   ``kubectl rollout restart``) may serve more: until one of its pods registers, what the
   previous one served stands as a ``probe``: the kinds it served are demand as before, and
   the others ask for one replica, whose worker will say (not one per N jobs of a kind the
   new pods may not serve either);
3. otherwise nothing is known, and every kind counts, as if there were no registry: a pool
   whose workers write no rows, or one the operator has not yet seen running (it was
   restarted), scales as it always did.

Pure: the caller lists the pods, reads the registry, and keeps what this returns for the
next tick (in memory: a restarted operator wakes a sleeping pool once for such a kind).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

__all__ = ["Coverage", "Registration", "pool_coverage"]


@dataclass(frozen=True, slots=True)
class Registration:
    """One live worker's registry row, as the rule reads it."""

    pod: str
    queues: tuple[str, ...]
    kinds: tuple[str, ...]
    #: It fails the jobs of kinds it has no task for (``unknown_kinds="fail"``): it takes
    #: every kind of its queues.
    every_kind: bool = False

    def serves(self, queue: str, kind: str) -> bool:
        return queue in self.queues and (self.every_kind or kind in self.kinds)


@dataclass(frozen=True, slots=True)
class Coverage:
    """What one pool's registered workers serve, and the pod template they were read under."""

    template: str | None
    registrations: tuple[Registration, ...]
    #: True when read from the pool's pods this tick; False when remembered (rule 2).
    live: bool = True
    #: Remembered from another pod template than the pool's now (rule 2): the kinds it did
    #: not serve may be served by the new one, which one replica will tell.
    probe: bool = False

    def serves(self, queue: str, kind: str) -> bool:
        return any(r.serves(queue, kind) for r in self.registrations)

    def registers(self, kind: str) -> bool:
        """Whether some worker takes ``kind`` in some queue (a NOTIFY names no queue: a kind
        that is no worker's in any queue wakes the pool for nothing); while probing, any may
        be the new pods'."""
        return self.probe or any(r.every_kind or kind in r.kinds for r in self.registrations)


def pool_coverage(
    pods: Collection[str],
    workers: Iterable[Registration],
    *,
    template: str | None,
    remembered: Coverage | None,
) -> Coverage | None:
    """The coverage that holds for a pool this tick (None: nothing known, every kind counts).

    ``pods`` are the Deployment's pods, ``workers`` the live registry rows (of any pool),
    ``template`` a fingerprint of the Deployment's pod template (None: unknown, so nothing is
    remembered across it), ``remembered`` what this returned at the last tick. Keep the result
    for the next tick."""
    mine = tuple(sorted((w for w in workers if w.pod in pods), key=lambda w: w.pod))
    if mine:
        return Coverage(template=template, registrations=mine)
    if remembered is None or template is None:
        return None
    # Kept under the template it was read from: the probe lasts until a new pod registers.
    return Coverage(
        template=remembered.template,
        registrations=remembered.registrations,
        live=False,
        probe=remembered.template != template,
    )
