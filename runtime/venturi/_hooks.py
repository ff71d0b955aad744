"""Dispatch of lifecycle events to the configured `Hooks`.

Callers check `active` before building an event, so a worker or queue without hooks pays
one attribute read per lifecycle point, and never imports prometheus-client unless metrics
were asked for. A hook that raises is logged and skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from venturi.hooks import Claimed, Dead, Enqueued, Finished, Hooks, Recovered, Settled, Started

logger = logging.getLogger("venturi.hooks")


class HookSet:
    """The hooks of one worker or queue, called in order."""

    __slots__ = ("_hooks", "active")

    def __init__(self, hooks: Sequence[Hooks]) -> None:
        for hook in hooks:
            if not isinstance(hook, Hooks):
                raise TypeError(f"hooks: expected venturi.Hooks instances, got {hook!r}")
        self._hooks = tuple(hooks)
        self.active = bool(self._hooks)

    def _each(self, point: str, event: object) -> None:
        for hook in self._hooks:
            try:
                getattr(hook, point)(event)
            except Exception:
                logger.exception("hook %s.%s failed", type(hook).__qualname__, point)

    def enqueued(self, event: Enqueued) -> None:
        self._each("enqueued", event)

    def claimed(self, event: Claimed) -> None:
        self._each("claimed", event)

    def started(self, event: Started) -> None:
        self._each("started", event)

    def finished(self, event: Finished) -> None:
        self._each("finished", event)

    def settled(self, event: Settled) -> None:
        self._each("settled", event)

    def dead(self, event: Dead) -> None:
        self._each("dead", event)

    def recovered(self, event: Recovered) -> None:
        self._each("recovered", event)


def hook_set(hooks: Sequence[Hooks] | None, *, metrics: bool) -> HookSet:
    """The user's hooks, plus Prometheus metrics first when `metrics` (needs the extra)."""
    chosen = list(hooks or ())
    if metrics:
        try:
            from venturi.metrics import PrometheusHooks
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError("metrics need prometheus-client: install venturi[metrics]") from exc
        chosen.insert(0, PrometheusHooks())
    return HookSet(chosen)


NO_HOOKS = HookSet(())
