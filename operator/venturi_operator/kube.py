"""The only module that calls the Kubernetes API (the official client, run in threads).

Each call is one request; errors become the few exceptions the reconciler reasons about.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextvars
import functools
import hashlib
import json
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import kopf
import urllib3
from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException

from venturi_operator.scalein import DELETION_COST

_T = TypeVar("_T")

GROUP = "venturi.dev"
VERSION = "v1alpha1"
PLURAL = "jobqueues"
SCALE_ANNOTATION = f"{GROUP}/jobqueue"
"""A Deployment's opt-in to being scaled: the name of the one JobQueue (in its namespace) that
may scale it. Only someone who may edit the Deployment can set it."""


class KubeError(Exception):
    """A Kubernetes API call failed; `reason` is a CamelCase word for conditions."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True, kw_only=True)
class PodState:
    cost: str | None
    """Its pod-deletion-cost annotation (None when unset)."""
    ready: bool
    """Its Ready condition is True (the ReplicaSet removes pods that are not ready first)."""


@dataclass(frozen=True, kw_only=True)
class DeploymentState:
    replicas: int
    """spec.replicas (what the operator scales)."""
    ready: int
    """status.readyReplicas."""
    jobqueue: str | None = None
    """The SCALE_ANNOTATION: the JobQueue the Deployment lets scale it, if any."""
    selector: str | None = None
    """spec.selector as a label selector string (None: none that can be said)."""
    template: str | None = None
    """A fingerprint of spec.template (what the pods run): it changes with a new release or
    a `kubectl rollout restart`, not with a scale."""


@dataclass(frozen=True, kw_only=True)
class LeaseState:
    """A Lease as leader election reads it."""

    holder: str | None
    version: str
    """metadata.resourceVersion: it changes with every write, so a renewal is seen as one."""
    transitions: int
    acquired: datetime | None
    """spec.acquireTime: when the holder took it."""
    seconds: int | None = None
    """spec.leaseDurationSeconds: how long it holds unrenewed, as its holder wrote it."""


REQUEST_TIMEOUT = (5.0, 20.0)
"""Seconds to connect to the API server, and to wait for its reply, per request: an API
server that accepted a connection and then stopped answering would otherwise hold the
call's thread, and the JobQueue's ticks with it, for good."""


def request_timeout(left: float | None) -> tuple[float, float]:
    """(connect, read) seconds for a request that must have reached the API server within
    `left` seconds (None: no bound): a connection that failed is tried once more (see
    `Kube`), so two connects and a wait for the reply fit in it."""
    connect, read = REQUEST_TIMEOUT
    if left is None:
        return connect, read
    return min(connect, left / 4), min(read, left / 2)


class Kube:
    def __init__(self, api: client.ApiClient, *, executor: Executor | None = None) -> None:
        """`executor`: the threads its calls run in (None: asyncio's default ones). Leader
        election gives its client threads of its own, so that a slow API server holding the
        reconcile calls' threads does not hold the Lease's renewals behind them."""
        # A request that reached the server is tried once: urllib3 would retry a timed-out
        # one three times (80 s, not 20, and a warning line each); the next tick is the retry.
        # One that could not connect (a stale kept-alive connection) is tried once more.
        api.rest_client.pool_manager.connection_pool_kw["retries"] = urllib3.Retry(
            total=1, connect=1, read=0, status=0, other=0, redirect=0
        )
        self.api = api
        self._executor = executor
        self._time_left: Callable[[], float] | None = None
        """Seconds this client's requests may still reach the API server (`within_lease`)."""
        self._busy = threading.Condition()
        self._in_flight = 0
        """Requests sent and not yet answered, also those whose caller gave up waiting (a
        cancelled task does not stop its thread)."""
        self._core = client.CoreV1Api(api)
        self._apps = client.AppsV1Api(api)
        self._autoscaling = client.AutoscalingV2Api(api)
        self._custom = client.CustomObjectsApi(api)
        self._coordination = client.CoordinationV1Api(api)

    @classmethod
    def from_environment(cls) -> Kube:
        """In a pod: the ServiceAccount; elsewhere: $KUBECONFIG or ~/.kube/config."""
        configuration = client.Configuration()
        try:
            kube_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except kube_config.ConfigException:
            kube_config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return cls(client.ApiClient(configuration))

    def within_lease(self, time_left: Callable[[], float]) -> None:
        """Bound every request of this client by `time_left()`, the seconds this replica may
        still act as the leader (`Elector.time_left`): none is sent after that, and one still
        unanswered by then is given up (its connection closed), so that none lands once a
        follower may have taken over. Each request reads it as it starts."""
        self._time_left = time_left

    async def _call(self, doing: str, method: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """`method(*args, **kwargs)` in a thread, bounded by `REQUEST_TIMEOUT` (and by the
        lease: `within_lease`); an API server that cannot be reached, or does not answer in
        time, is a `KubeError` ("ApiUnreachable"), as a refusal is one of its own (the caller
        maps `ApiException`s); a request past the lease is one too ("NotLeading")."""
        call = functools.partial(self._counted, doing, method, *args, **kwargs)
        try:
            # asyncio.to_thread's way, in this client's executor (None: the loop's default).
            context = contextvars.copy_context()
            return await asyncio.get_running_loop().run_in_executor(
                self._executor, context.run, call
            )
        except ApiException:
            raise
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeError(
                "ApiUnreachable", f"{doing}: the API server did not answer ({_describe(exc)})"
            ) from None

    def _counted(self, doing: str, method: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        # The lease's time is read here, in the thread, as the request starts: a call that
        # waited for a free thread may find it over.
        left = self._time_left() if self._time_left is not None else None
        if left is not None and left <= 0:
            raise KubeError(
                "NotLeading",
                f"{doing}: not sent: this replica no longer leads (its lease was not renewed "
                "in time)",
            )
        with self._busy:
            self._in_flight += 1
        try:
            return method(*args, _request_timeout=request_timeout(left), **kwargs)
        finally:
            with self._busy:
                self._in_flight -= 1
                self._busy.notify_all()

    async def settled(self, within: float) -> bool:
        """Wait until none of this client's requests is in flight, at most `within` seconds;
        returns whether none is. A request whose caller was cancelled (a JobQueue loop
        stopped mid-tick) may still reach the API server until its own timeout: a leader
        waits for them before it gives the Lease up."""

        def wait() -> bool:
            with self._busy:
                return self._busy.wait_for(lambda: self._in_flight == 0, within)

        return await asyncio.to_thread(wait)

    def connection_info(self) -> kopf.ConnectionInfo:
        """The same credentials for kopf's own API calls (watching, patching, Events), so
        the operator authenticates one way everywhere: in a pod, from a kubeconfig, in tests."""
        c = self.api.configuration
        token = (c.api_key or {}).get("authorization") or (c.api_key or {}).get("BearerToken")
        scheme = None
        if token and " " in token:
            scheme, token = token.split(" ", 1)
        return kopf.ConnectionInfo(
            server=c.host,
            ca_path=c.ssl_ca_cert or None,
            insecure=not c.verify_ssl,
            scheme=scheme or ("Bearer" if token else None),
            token=token or None,
            certificate_path=c.cert_file or None,
            private_key_path=c.key_file or None,
            username=c.username or None,
            password=c.password or None,
        )

    async def secret_value(self, namespace: str, name: str, key: str) -> str:
        """One value of a Secret's data, decoded."""
        try:
            secret = await self._call(
                f"reading Secret {namespace}/{name}",
                self._core.read_namespaced_secret,
                name,
                namespace,
            )
        except ApiException as exc:
            if exc.status == 404:
                raise KubeError("SecretNotFound", f"Secret {namespace}/{name} not found") from None
            if exc.status == 403:
                raise KubeError(
                    "Forbidden",
                    f"the operator may not read Secret {namespace}/{name}: add it to the "
                    "operator's Secrets (the chart's rbac.secretNames)",
                ) from None
            raise _error(exc, f"reading Secret {namespace}/{name}") from None
        data = secret.data or {}
        if key not in data:
            # The key asked for only: the other keys are not the JobQueue author's to learn.
            raise KubeError("SecretKeyMissing", f"Secret {namespace}/{name} has no key {key!r}")
        try:
            return base64.b64decode(data[key]).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise KubeError(
                "SecretKeyInvalid", f"Secret {namespace}/{name} key {key!r} is not UTF-8 text"
            ) from None

    async def deployment(self, namespace: str, name: str) -> DeploymentState:
        try:
            dep = await self._call(
                f"reading Deployment {namespace}/{name}",
                self._apps.read_namespaced_deployment,
                name,
                namespace,
            )
        except ApiException as exc:
            if exc.status == 404:
                raise KubeError(
                    "DeploymentNotFound", f"Deployment {namespace}/{name} not found"
                ) from None
            raise _error(exc, f"reading Deployment {namespace}/{name}") from None
        annotations = (dep.metadata.annotations if dep.metadata is not None else None) or {}
        return DeploymentState(
            replicas=int(dep.spec.replicas if dep.spec.replicas is not None else 1),
            ready=int(dep.status.ready_replicas or 0) if dep.status else 0,
            jobqueue=annotations.get(SCALE_ANNOTATION),
            selector=_selector(dep.spec.selector),
            template=self._fingerprint(dep.spec.template),
        )

    def _fingerprint(self, template: Any) -> str | None:
        if template is None:
            return None
        plain = self.api.sanitize_for_serialization(template)  # type: ignore[no-untyped-call]
        body = json.dumps(plain, sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    async def pods(self, namespace: str, selector: str) -> dict[str, PodState]:
        """The pods a selector matches that are neither terminating nor finished, each with
        its pod-deletion-cost annotation and readiness."""
        try:
            pods = await self._call(
                f"listing pods {selector} in {namespace}",
                self._core.list_namespaced_pod,
                namespace,
                label_selector=selector,
            )
        except ApiException as exc:
            raise _error(exc, f"listing pods {selector} in {namespace}") from None
        found: dict[str, PodState] = {}
        for pod in pods.items:
            meta = pod.metadata
            phase = pod.status.phase if pod.status is not None else None
            if meta is None or meta.name is None or meta.deletion_timestamp is not None:
                continue
            if phase in ("Succeeded", "Failed"):
                continue
            conditions = (pod.status.conditions if pod.status is not None else None) or []
            found[meta.name] = PodState(
                cost=(meta.annotations or {}).get(DELETION_COST),
                ready=any(c.type == "Ready" and c.status == "True" for c in conditions),
            )
        return found

    async def set_deletion_cost(self, namespace: str, name: str, cost: int) -> None:
        """Annotate a pod with controller.kubernetes.io/pod-deletion-cost."""
        body = {"metadata": {"annotations": {DELETION_COST: str(cost)}}}
        try:
            await self._call(
                f"annotating pod {namespace}/{name}",
                self._core.patch_namespaced_pod,
                name,
                namespace,
                body,
            )
        except ApiException as exc:
            if exc.status == 404:
                return  # gone meanwhile: nothing to spare
            raise _error(exc, f"annotating pod {namespace}/{name}") from None

    async def other_autoscalers(self, namespace: str) -> dict[str, str]:
        """Deployments in `namespace` that an HPA or a KEDA ScaledObject already scales,
        mapped to a description of that autoscaler (two autoscalers would fight)."""
        found: dict[str, str] = {}
        try:
            hpas = await self._call(
                f"listing HorizontalPodAutoscalers in {namespace}",
                self._autoscaling.list_namespaced_horizontal_pod_autoscaler,
                namespace,
            )
        except ApiException as exc:
            raise _error(exc, f"listing HorizontalPodAutoscalers in {namespace}") from None
        for hpa in hpas.items:
            ref = hpa.spec.scale_target_ref
            if ref.kind == "Deployment":
                hpa_name = hpa.metadata.name if hpa.metadata is not None else "?"
                found[ref.name] = f"HorizontalPodAutoscaler {hpa_name}"
        try:
            scaled = await self._call(
                f"listing KEDA ScaledObjects in {namespace}",
                self._custom.list_namespaced_custom_object,
                "keda.sh",
                "v1alpha1",
                namespace,
                "scaledobjects",
            )
        except ApiException as exc:
            if exc.status in (403, 404):  # KEDA not installed, or not ours to see
                return found
            raise _error(exc, f"listing KEDA ScaledObjects in {namespace}") from None
        items: list[dict[str, Any]] = scaled.get("items", []) if isinstance(scaled, dict) else []
        for obj in items:
            ref = obj.get("spec", {}).get("scaleTargetRef", {})
            if ref.get("kind", "Deployment") == "Deployment" and ref.get("name"):
                found[ref["name"]] = f"KEDA ScaledObject {obj['metadata']['name']}"
        return found

    async def scale(self, namespace: str, name: str, replicas: int) -> None:
        """Set a Deployment's replicas through its scale subresource."""
        try:
            await self._call(
                f"scaling Deployment {namespace}/{name}",
                self._apps.patch_namespaced_deployment_scale,
                name,
                namespace,
                {"spec": {"replicas": replicas}},
            )
        except ApiException as exc:
            raise _error(exc, f"scaling Deployment {namespace}/{name}") from None

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        try:
            await self._call(
                f"patching status of JobQueue {namespace}/{name}",
                self._custom.patch_namespaced_custom_object_status,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                {"status": status},
            )
        except ApiException as exc:
            if exc.status == 404:
                return  # deleted meanwhile: nothing to report on
            raise _error(exc, f"patching status of JobQueue {namespace}/{name}") from None

    async def lease(self, namespace: str, name: str) -> LeaseState | None:
        """The Lease `namespace/name` (None: there is none)."""
        doing = f"reading Lease {namespace}/{name}"
        try:
            lease = await self._call(
                doing, self._coordination.read_namespaced_lease, name, namespace
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _error(exc, doing) from None
        spec = lease.spec or client.V1LeaseSpec()
        meta = lease.metadata or client.V1ObjectMeta()
        return LeaseState(
            holder=spec.holder_identity or None,
            version=str(meta.resource_version),
            transitions=int(spec.lease_transitions or 0),
            acquired=spec.acquire_time,
            seconds=spec.lease_duration_seconds,
        )

    async def create_lease(self, namespace: str, name: str, holder: str, seconds: int) -> None:
        """Create the Lease, held by `holder` from now (409 Conflict: it exists)."""
        now = datetime.now(UTC)
        body = _lease(namespace, name, None, holder, seconds, acquired=now, transitions=0)
        doing = f"creating Lease {namespace}/{name}"
        try:
            await self._call(doing, self._coordination.create_namespaced_lease, namespace, body)
        except ApiException as exc:
            raise _error(exc, doing) from None

    async def write_lease(
        self, namespace: str, name: str, seen: LeaseState, *, holder: str | None, seconds: int
    ) -> None:
        """Write the Lease as renewed now by `holder` (None: given up), unless it changed since
        `seen` was read (409 Conflict: another replica wrote it first)."""
        taken = holder != seen.holder
        body = _lease(
            namespace,
            name,
            seen.version,
            holder,
            seconds,
            acquired=datetime.now(UTC) if taken or seen.acquired is None else seen.acquired,
            transitions=seen.transitions + (1 if taken and holder else 0),
        )
        doing = f"writing Lease {namespace}/{name}"
        try:
            await self._call(
                doing, self._coordination.replace_namespaced_lease, name, namespace, body
            )
        except ApiException as exc:
            raise _error(exc, doing) from None


def _lease(
    namespace: str,
    name: str,
    version: str | None,
    holder: str | None,
    seconds: int,
    *,
    acquired: datetime,
    transitions: int,
) -> client.V1Lease:
    """A Lease renewed now by `holder`; with `version`, written only over that version."""
    return client.V1Lease(
        metadata=client.V1ObjectMeta(name=name, namespace=namespace, resource_version=version),
        spec=client.V1LeaseSpec(
            holder_identity=holder,
            lease_duration_seconds=seconds,
            acquire_time=acquired,
            renew_time=datetime.now(UTC),
            lease_transitions=transitions,
        ),
    )


def _selector(selector: Any) -> str | None:
    """A Deployment's selector (matchLabels and matchExpressions) as a label selector string,
    what list_namespaced_pod takes; None when it selects nothing it can say (no selector, or
    an operator Kubernetes does not define)."""
    if selector is None:
        return None
    terms = [f"{k}={v}" for k, v in sorted((selector.match_labels or {}).items())]
    for expression in selector.match_expressions or []:
        key, operator, values = expression.key, expression.operator, expression.values or []
        if operator in ("In", "NotIn"):
            terms.append(f"{key} {operator.lower()} ({','.join(sorted(values))})")
        elif operator == "Exists":
            terms.append(key)
        elif operator == "DoesNotExist":
            terms.append(f"!{key}")
        else:
            return None
    return ",".join(terms) or None


def _error(exc: ApiException, doing: str) -> KubeError:
    reason = {401: "Unauthorized", 403: "Forbidden", 409: "Conflict"}.get(exc.status, "ApiError")
    return KubeError(reason, f"{doing}: HTTP {exc.status} {exc.reason}")


def _describe(exc: BaseException) -> str:
    """urllib3's errors, in one line: the innermost reason (a refused connection, a read
    timeout), not the whole retry history."""
    reason = getattr(exc, "reason", None)
    inner = reason if isinstance(reason, BaseException) else exc
    text = str(inner).strip().splitlines()
    return f"{type(inner).__name__}: {text[0]}" if text else type(inner).__name__
