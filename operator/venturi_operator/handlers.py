"""The kopf wiring: one daemon per JobQueue that reconciles every `spec.interval` seconds,
at once when the spec changes, at once when a job arrives for a pool at zero, soon
(`cadence.wake_at`) when jobs arrive at a running pool, and within seconds after a scale-in
that busy pods held back (`cadence.next_wait`).

Handlers are thin: they translate kopf's arguments and hand over to `Reconciler.tick`.
`build_registry` returns a fresh `kopf.OperatorRegistry`, so tests and `__main__` pass
their own instead of filling kopf's global one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

import kopf

from venturi_operator import cadence
from venturi_operator.kube import GROUP, PLURAL, VERSION, KubeError
from venturi_operator.reconcile import Reconciler
from venturi_operator.spec import DEFAULT_INTERVAL

logger = logging.getLogger(__name__)


def plain(value: Any) -> Any:
    """kopf's live views to plain dicts and lists (what the pure parsers expect)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def build_registry(reconciler: Reconciler) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    wakes: dict[tuple[str, str], asyncio.Event] = {}
    reconciled: dict[tuple[str, str], int] = {}
    """The generation each daemon last reconciled: a MODIFIED event of the same generation
    is only the operator's own status patch, and must not trigger another tick."""

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        # kopf adds its default login handlers only to its global registry, not to ours;
        # and kopf should act with exactly the credentials the reconciler's client uses.
        return reconciler.kube.connection_info()

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.peering.standalone = True  # no peering objects: the Lease elects (leadership)
        settings.posting.level = logging.WARNING  # our own Events only, not every log line
        settings.persistence.finalizer = f"{GROUP}/operator"
        settings.watching.server_timeout = 300
        # kopf's own requests (watches, patches, Events) bounded as the reconciler's are: an
        # API server that accepted a connection and then went silent must not hold them.
        settings.watching.client_timeout = 330
        settings.watching.connect_timeout = 10
        settings.networking.connect_timeout = 10
        settings.networking.request_timeout = 30
        # No CRD watching: the JobQueue CRD is installed before the operator (chart or
        # kubectl), and not scanning means no cluster-wide CRD permissions are needed.
        settings.scanning.disabled = True
        # A deleted JobQueue's daemon exits at once (it only waits on events): no 10 s wait.
        settings.background.instant_exit_timeout = 1.0

    @kopf.on.cleanup(registry=registry)
    async def close_databases(**_: Any) -> None:
        # On the operator's own loop, where the connections were opened.
        await reconciler.databases.close()

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def on_change(
        type: str | None, namespace: str | None, name: str | None, body: kopf.Body, **_: Any
    ) -> None:
        # Spec edits (and creation) reconcile at once instead of at the next interval.
        if type in ("ADDED", "MODIFIED") and namespace and name:
            generation = int(body.get("metadata", {}).get("generation") or 0)
            if reconciled.get((namespace, name)) == generation:
                return
            event = wakes.get((namespace, name))
            if event is not None:
                event.set()

    @kopf.daemon(GROUP, VERSION, PLURAL, registry=registry, cancellation_timeout=10.0)
    async def jobqueue(
        namespace: str | None,
        name: str,
        body: kopf.Body,
        stopped: kopf.DaemonStopped,
        **_: Any,
    ) -> None:
        if namespace is None:  # JobQueue is namespaced; kopf types allow cluster objects
            return
        key = (namespace, name)
        wake = wakes.setdefault(key, asyncio.Event())
        loop = asyncio.get_running_loop()

        def post(kind: str, reason: str, message: str) -> None:
            kopf.event(body, type=kind, reason=reason, message=message)

        deferred: list[asyncio.TimerHandle] = []

        def wake_later(delay: float) -> None:
            if not deferred:
                deferred.append(loop.call_later(delay, wake.set))

        def on_job(kind: str) -> None:
            # From the LISTEN connection: a job for a pool at zero must not wait the interval,
            # nor a burst at a running pool (cadence.wake_at: at most once per burst gap).
            delay = reconciler.wake_delay(namespace, name, kind)
            if delay is None:
                return
            if delay <= 0:
                loop.call_soon_threadsafe(wake.set)
            else:
                loop.call_soon_threadsafe(wake_later, delay)

        try:
            while not stopped:
                wake.clear()
                while deferred:  # this tick is the one a deferred wake-up was waiting for
                    deferred.pop().cancel()
                spec = plain(body.get("spec") or {})
                generation = int(body.get("metadata", {}).get("generation") or 0)
                spared = soon = False
                try:
                    result = await reconciler.tick(
                        namespace,
                        name,
                        spec,
                        generation,
                        plain(body.get("status") or {}),
                        post,
                        on_job,
                    )
                    await reconciler.kube.patch_status(namespace, name, result.status)
                    spared = result.spared
                except KubeError as exc:
                    # The API server (the status patch: the tick itself turns its failures
                    # into conditions) is away or refused: one line, and, if away, another
                    # tick soon.
                    logger.warning(
                        "%s/%s: %s",
                        namespace,
                        name,
                        exc.message,
                        extra={"namespace": namespace, "jobqueue": name},
                    )
                    reconciler.metrics.reconcile_errors.labels(namespace, name, exc.reason).inc()
                    soon = exc.reason == "ApiUnreachable"  # a refusal would refuse again
                except Exception as exc:  # one bad tick must never end the daemon
                    logger.exception(
                        "%s/%s: reconcile failed",
                        namespace,
                        name,
                        extra={"namespace": namespace, "jobqueue": name},
                    )
                    reconciler.metrics.reconcile_errors.labels(namespace, name, "Exception").inc()
                    failed = reconciler.failed(
                        namespace, name, generation, plain(body.get("status") or {}), exc, post
                    )
                    try:
                        await reconciler.kube.patch_status(namespace, name, failed)
                    except Exception:  # the API server may be what failed: the log says it
                        logger.warning(
                            "%s/%s: could not write the failed tick's status",
                            namespace,
                            name,
                            exc_info=True,
                            extra={"namespace": namespace, "jobqueue": name},
                        )
                reconciled[key] = generation
                interval = spec.get("interval") if isinstance(spec, dict) else None
                seconds = float(interval) if isinstance(interval, int) else DEFAULT_INTERVAL
                reconciler.metrics.ticked(namespace, name, at=time.time(), interval=seconds)
                # Sooner after a scale-in that busy pods held back: an idle pod is seldom idle long.
                seconds = cadence.next_wait(seconds, spared=spared)
                if soon:
                    seconds = min(seconds, cadence.RETRY_AFTER_API_FAILURE)
                await _wait(wake, stopped, seconds)  # a spec change sets `wake` (on_change)
        finally:
            while deferred:
                deferred.pop().cancel()
            wakes.pop(key, None)
            reconciled.pop(key, None)
            await reconciler.forget(namespace, name)

    return registry


async def _wait(wake: asyncio.Event, stopped: kopf.DaemonStopped, seconds: float) -> None:
    """Until the interval passes, a wake-up, or the daemon is stopped."""
    waiters = {
        asyncio.ensure_future(wake.wait()),
        asyncio.ensure_future(stopped.wait()),
    }
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
