"""The Kubernetes test harness itself: real round trips through the official client and kopf.

Every test talks HTTP to the emulator in kube_harness.py: the sync `kubernetes` client runs in
threads (asyncio.to_thread), kopf in a thread with its own loop; the tests observe the results
through the emulator's state and await them with timeouts, never with sleeps.
"""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import Callable
from typing import Any

import kmock
import kopf
import kubernetes.client
import kubernetes.watch
import pytest
import urllib3
from kube_harness import (
    DEPLOYMENTS,
    HPAS,
    JOBQUEUES,
    SECRETS,
    KubeHarness,
    kube_fixture,
    kube_harness,
    run_operator,
)
from kubernetes.client.exceptions import ApiException

kube = pytest.fixture(kube_fixture, name="kube")
Watch: Any = kubernetes.watch.Watch  # untyped

NS = "apps"
KOPF_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"
JQ_SPEC = {"database": {"secretRef": {"name": "db"}}, "pools": [{"deployment": "workers"}]}


async def call(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """A call of the sync client, in a thread; what it returns is read as the server sent it
    (the client's models type every field Optional)."""
    return await asyncio.to_thread(fn, *args, **kwargs)


async def test_kubeconfig_points_the_client_at_the_emulator(kube: KubeHarness) -> None:
    configuration = kube.configuration()
    assert configuration.host == kube.url
    assert kube.url.startswith("http://127.0.0.1:")
    assert kubernetes.client.Configuration.get_default_copy().host != kube.url  # not global

    with kube.api_client() as api:
        groups = await call(kubernetes.client.ApisApi(api).get_api_versions)
        core = await call(kubernetes.client.CoreApi(api).get_api_versions)
        resources = await call(
            kubernetes.client.CustomObjectsApi(api).get_api_resources, "venturi.dev", "v1alpha1"
        )

    assert {"apps", "autoscaling", "venturi.dev"} <= {group.name for group in groups.groups}
    assert core.versions == ["v1"]
    assert {r.name for r in resources.resources} == {"jobqueues", "jobqueues/status"}
    jobqueues = next(r for r in resources.resources if r.name == "jobqueues")
    assert (jobqueues.kind, jobqueues.namespaced) == ("JobQueue", True)
    assert jobqueues.short_names == ["jq"]


async def test_reads_a_seeded_secret(kube: KubeHarness) -> None:
    kube.secret(NS, "db", string_data={"dsn": "postgresql://venturi@db/venturi"})

    with kube.api_client() as api:
        secret = await call(kubernetes.client.CoreV1Api(api).read_namespaced_secret, "db", NS)

    assert base64.b64decode(secret.data["dsn"]) == b"postgresql://venturi@db/venturi"
    assert secret.string_data is None  # folded into data on write, as a real server does
    assert kube.get(SECRETS, NS, "db")["metadata"]["uid"] == secret.metadata.uid


async def test_scale_subresource_reads_and_writes_the_deployments_replicas(
    kube: KubeHarness,
) -> None:
    seeded = kube.deployment(NS, "workers", replicas=1)

    with kube.api_client() as api:
        apps = kubernetes.client.AppsV1Api(api)
        scale = await call(apps.read_namespaced_deployment_scale, "workers", NS)
        patched = await call(
            apps.patch_namespaced_deployment_scale, "workers", NS, {"spec": {"replicas": 3}}
        )
        deployment = await call(apps.read_namespaced_deployment, "workers", NS)
        stale_version = scale.metadata.resource_version
        stale = {"metadata": {"name": "workers", "resourceVersion": stale_version}}
        with pytest.raises(ApiException) as conflict:
            await call(
                apps.replace_namespaced_deployment_scale,
                "workers",
                NS,
                {**stale, "spec": {"replicas": 5}},
            )

    assert (scale.kind, scale.spec.replicas, scale.status.selector) == ("Scale", 1, "app=workers")
    assert patched.spec.replicas == 3
    assert deployment.spec.replicas == 3
    stored = kube.get(DEPLOYMENTS, NS, "workers")
    assert stored["spec"]["replicas"] == 3
    assert stored["metadata"]["generation"] == seeded["metadata"]["generation"] + 1
    assert int(stored["metadata"]["resourceVersion"]) > int(seeded["metadata"]["resourceVersion"])
    assert stored["status"]["replicas"] == 1  # no controller: the status stays as seeded
    assert conflict.value.status == 409
    assert kube.get(DEPLOYMENTS, NS, "workers")["spec"]["replicas"] == 3


async def test_lists_hpas_in_a_namespace(kube: KubeHarness) -> None:
    kube.hpa(NS, "workers", target="workers", max_replicas=7)
    kube.hpa(NS, "emails", target="emails")
    kube.hpa("elsewhere", "workers", target="workers")

    with kube.api_client() as api:
        hpas = await call(
            kubernetes.client.AutoscalingV2Api(api).list_namespaced_horizontal_pod_autoscaler, NS
        )

    assert [hpa.metadata.name for hpa in hpas.items] == ["emails", "workers"]
    assert hpas.items[1].spec.max_replicas == 7
    assert hpas.items[1].spec.scale_target_ref.name == "workers"
    assert int(hpas.metadata.resource_version) == kube.revision
    assert {hpa["metadata"]["namespace"] for hpa in kube.list_objects(HPAS)} == {NS, "elsewhere"}


async def test_status_subresource_merges_into_status_only(kube: KubeHarness) -> None:
    seeded = kube.jobqueue(NS, "jq", JQ_SPEC, status={"replicas": 1, "desiredReplicas": 1})
    assert seeded["spec"]["interval"] == 15  # the CRD's defaults are applied on writes

    with kube.api_client() as api:
        custom = kubernetes.client.CustomObjectsApi(api)
        patched = await call(
            custom.patch_namespaced_custom_object_status,
            "venturi.dev",
            "v1alpha1",
            NS,
            "jobqueues",
            "jq",
            {"status": {"desiredReplicas": 4}, "spec": {"paused": True}},
        )
        ignored = await call(
            custom.patch_namespaced_custom_object,
            "venturi.dev",
            "v1alpha1",
            NS,
            "jobqueues",
            "jq",
            {"status": {"replicas": 99}},
        )
        with pytest.raises(ApiException) as refused:
            await call(
                custom.patch_namespaced_custom_object,
                "venturi.dev",
                "v1alpha1",
                NS,
                "jobqueues",
                "jq",
                {"spec": {"paused": True}},
                _content_type="application/strategic-merge-patch+json",
            )

    assert patched["status"] == {"replicas": 1, "desiredReplicas": 4}
    assert patched["spec"]["paused"] is False  # /status ignores everything but .status
    assert patched["metadata"]["generation"] == 1
    assert ignored["status"] == patched["status"]  # the main endpoint ignores .status
    assert ignored["metadata"]["resourceVersion"] == patched["metadata"]["resourceVersion"]
    assert refused.value.status == 415  # custom resources take no strategic merge patches
    assert kube.get(JOBQUEUES, NS, "jq")["status"] == {"replicas": 1, "desiredReplicas": 4}


async def test_created_events_are_recorded(kube: KubeHarness) -> None:
    jq = kube.jobqueue(NS, "jq", JQ_SPEC)
    involved = kubernetes.client.V1ObjectReference(
        api_version="venturi.dev/v1alpha1",
        kind="JobQueue",
        name="jq",
        namespace=NS,
        uid=jq["metadata"]["uid"],
    )
    event = kubernetes.client.CoreV1Event(
        metadata=kubernetes.client.V1ObjectMeta(generate_name="jq-", namespace=NS),
        involved_object=involved,
        reason="Scaled",
        message="workers: 1 -> 3",
        type="Normal",
    )

    with kube.api_client() as api:
        created = await call(kubernetes.client.CoreV1Api(api).create_namespaced_event, NS, event)

    assert created.metadata.name.startswith("jq-")
    [recorded] = kube.events(NS, involved="jq")
    assert recorded["metadata"]["name"] == created.metadata.name
    assert (recorded["reason"], recorded["message"]) == ("Scaled", "workers: 1 -> 3")
    assert recorded["involvedObject"]["uid"] == jq["metadata"]["uid"]


async def test_json_patches_and_deletion_follow_the_api(kube: KubeHarness) -> None:
    jq = kube.jobqueue(NS, "jq", JQ_SPEC)
    version = jq["metadata"]["resourceVersion"]
    add_finalizer = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": version},
        {"op": "add", "path": "/metadata/finalizers", "value": ["venturi.dev/test"]},
    ]

    with kube.api_client() as api:
        custom = kubernetes.client.CustomObjectsApi(api)
        args = ("venturi.dev", "v1alpha1", NS, "jobqueues", "jq")
        patch = custom.patch_namespaced_custom_object
        json_patch = "application/json-patch+json"
        await call(patch, *args, add_finalizer, _content_type=json_patch)
        with pytest.raises(ApiException) as stale:  # the same `test` op now fails
            await call(patch, *args, add_finalizer, _content_type=json_patch)
        unchanged = await call(patch, *args, {"spec": {"interval": 15}})
        deleting = await call(custom.delete_namespaced_custom_object, *args)
        await call(patch, *args, {"metadata": {"finalizers": None}})
        with pytest.raises(ApiException) as gone:
            await call(custom.get_namespaced_custom_object, *args)

    assert stale.value.status == 422  # what kopf expects from a failed `test`
    assert unchanged["metadata"]["resourceVersion"] == str(int(version) + 1)  # a no-op
    assert deleting["metadata"]["deletionTimestamp"]
    assert deleting["metadata"]["finalizers"] == ["venturi.dev/test"]
    assert gone.value.status == 404
    assert kube.find(JOBQUEUES, NS, "jq") is None


async def test_kmock_reactions_inject_faults_and_see_the_requests(kube: KubeHarness) -> None:
    kube.deployment(NS, "workers")
    scale_patches = kube.emulator[
        kmock.method.PATCH, kmock.resource(DEPLOYMENTS), kmock.subresource("scale")
    ]
    unavailable = kmock.KubernetesError(status=503, reason="ServiceUnavailable", message="later")
    scale_patches[:1] << unavailable  # only the first such request fails

    with kube.api_client() as api:
        apps = kubernetes.client.AppsV1Api(api)
        scale = apps.patch_namespaced_deployment_scale
        with pytest.raises(ApiException) as failed:
            await call(scale, "workers", NS, {"spec": {"replicas": 2}})
        assert kube.get(DEPLOYMENTS, NS, "workers")["spec"]["replicas"] == 1  # no state change
        await call(scale, "workers", NS, {"spec": {"replicas": 2}})

    assert failed.value.status == 503
    assert kube.get(DEPLOYMENTS, NS, "workers")["spec"]["replicas"] == 2
    assert len(scale_patches) == 2
    second = list(scale_patches)[1]  # (kmock types an int index as a filter)
    assert second.data == {"spec": {"replicas": 2}}
    assert second.headers["Content-Type"] == "application/strategic-merge-patch+json"


async def test_watches_replay_from_a_resource_version(kube: KubeHarness) -> None:
    kube.deployment(NS, "first")

    def first_event(**kwargs: Any) -> dict[str, Any]:
        with kube.api_client() as api:
            apps = kubernetes.client.AppsV1Api(api)
            watch: Any = Watch()
            stream = watch.stream(apps.list_namespaced_deployment, NS, timeout_seconds=10, **kwargs)
            for event in stream:
                watch.stop()
                return dict(event)
        raise AssertionError("the watch ended without events")

    with kube.api_client() as api:
        listed = await call(kubernetes.client.AppsV1Api(api).list_namespaced_deployment, NS)
    kube.deployment(NS, "second")
    kube.patch(DEPLOYMENTS, NS, "second", {"spec": {"replicas": 2}})

    replayed = await call(first_event, resource_version=listed.metadata.resource_version)
    snapshot = await call(first_event)
    kube.expire_watch_history()
    with pytest.raises(ApiException) as expired:
        await call(first_event, resource_version=listed.metadata.resource_version)

    assert (replayed["type"], replayed["object"].metadata.name) == ("ADDED", "second")
    assert replayed["object"].spec.replicas == 1  # the state at the time of that change
    assert (snapshot["type"], snapshot["object"].metadata.name) == ("ADDED", "first")
    assert expired.value.status == 410
    await kube.wait_until(lambda: kube.open_watches() == 0, what="the watches to close")


async def test_a_kopf_daemon_sees_a_seeded_jobqueue_and_stops_cleanly(kube: KubeHarness) -> None:
    kube.jobqueue(NS, "jq", JQ_SPEC)
    registry = kopf.OperatorRegistry()
    daemon_exited = threading.Event()

    @kopf.daemon("venturi.dev", "v1alpha1", "jobqueues", registry=registry)
    async def observe(
        body: kopf.Body,
        name: str,
        namespace: str | None,
        spec: kopf.Spec,
        stopped: kopf.DaemonStopped,
        **_: Any,
    ) -> None:
        def report() -> None:
            with kube.api_client() as api:
                kubernetes.client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
                    "venturi.dev",
                    "v1alpha1",
                    namespace or NS,
                    "jobqueues",
                    name,
                    {"status": {"observedInterval": spec["interval"]}},
                )

        try:
            await call(report)
            kopf.info(body, reason="Observing", message=f"every {spec['interval']}s")
            await stopped.wait()
        finally:
            daemon_exited.set()

    def settled(jq: dict[str, Any]) -> bool:
        # kopf adds its finalizer concurrently with the daemon's first patch, and when that one
        # wins, kopf's JSON patch fails its resourceVersion test and is retried: await both.
        finalized = KOPF_FINALIZER in jq["metadata"].get("finalizers", [])
        return finalized and "observedInterval" in jq.get("status", {})

    async with run_operator(kube, registry) as operator:
        await kube.wait_watching(JOBQUEUES)
        observed = await kube.wait_for(JOBQUEUES, NS, "jq", settled)
        [event] = await kube.wait_until(lambda: kube.events(NS, involved="jq"))
        assert operator.running

    assert (event["reason"], event["message"], event["type"]) == (
        "Observing",
        "every 15s",
        "Normal",
    )
    assert event["involvedObject"]["uid"] == observed["metadata"]["uid"]

    assert observed["status"] == {"observedInterval": 15}
    assert daemon_exited.is_set()
    assert not operator.running and operator.error is None
    await kube.wait_until(lambda: kube.open_watches() == 0, what="kopf's watches to close")


async def test_the_harness_cleans_up_after_itself() -> None:
    async with kube_harness() as harness:
        kubeconfig = harness.kubeconfig_path
        configuration = harness.configuration()
        configuration.retries = 0
        with kubernetes.client.ApiClient(configuration) as api:
            await call(kubernetes.client.CoreV1Api(api).list_namespace)
        assert kubeconfig.exists()

    assert not kubeconfig.exists()
    assert not kubeconfig.parent.exists()
    refused = pytest.raises(urllib3.exceptions.MaxRetryError, match="Connection refused")
    with kubernetes.client.ApiClient(configuration) as api, refused:
        await call(kubernetes.client.CoreV1Api(api).list_namespace)
