"""Lifecycle hooks the queue and worker call; the default does nothing.

`venturi.metrics` implements them with prometheus-client. Keeping this seam here means the
package never imports prometheus-client unless metrics were asked for.
"""

from __future__ import annotations

from typing import Protocol


class Hooks(Protocol):
    """An observer of the job lifecycle."""

    def enqueued(self, kind: str, count: int = 1) -> None: ...

    def merged(self, kind: str, action: str) -> None: ...

    def claimed(self, kind: str, latency_s: float) -> None: ...

    def settled(self, kind: str, outcome: str, duration_s: float | None) -> None: ...

    def recovered(self, kind: str) -> None: ...

    def running(self, kind: str, delta: int) -> None: ...


class NoHooks:
    """The default observer: does nothing."""

    def enqueued(self, kind: str, count: int = 1) -> None: ...

    def merged(self, kind: str, action: str) -> None: ...

    def claimed(self, kind: str, latency_s: float) -> None: ...

    def settled(self, kind: str, outcome: str, duration_s: float | None) -> None: ...

    def recovered(self, kind: str) -> None: ...

    def running(self, kind: str, delta: int) -> None: ...


NO_HOOKS: Hooks = NoHooks()


def metrics_hooks(enabled: bool) -> Hooks:
    """Prometheus hooks when `enabled` (imports prometheus-client), else the no-op hooks."""
    if not enabled:
        return NO_HOOKS
    try:
        from venturi.metrics import PrometheusHooks
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("metrics need prometheus-client: install venturi[metrics]") from exc
    return PrometheusHooks()
