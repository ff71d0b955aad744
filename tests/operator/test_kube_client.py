"""The operator's Kubernetes client against API servers that misbehave at the socket: every
call is bounded, and a server that is away or silent is a `KubeError` the reconciler turns
into a condition, not a thread blocked for good or a traceback per tick."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
from kubernetes import client

from venturi_operator import kube as kube_module
from venturi_operator.kube import Kube, KubeError, _selector


@pytest.fixture
async def silent_server() -> AsyncIterator[tuple[int, list[asyncio.StreamWriter]]]:
    """A port that accepts connections and never answers (an API server host that froze),
    and the connections it accepted."""
    held: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # read nothing, say nothing

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], held
    finally:
        server.close()
        for writer in held:
            writer.close()
        await server.wait_closed()


def _kube_at(port: int) -> Kube:
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    return Kube(client.ApiClient(configuration))


async def test_a_silent_api_server_is_a_kube_error_within_the_request_timeout(
    silent_server: tuple[int, list[asyncio.StreamWriter]], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, accepted = silent_server
    monkeypatch.setattr(kube_module, "REQUEST_TIMEOUT", (1.0, 0.5))
    kube = _kube_at(port)
    with pytest.raises(KubeError) as raised:
        await asyncio.wait_for(kube.deployment("ns", "mailer"), 10)  # not the call's own bound
    assert raised.value.reason == "ApiUnreachable"
    assert raised.value.message.startswith(
        "reading Deployment ns/mailer: the API server did not answer (ReadTimeoutError"
    ), raised.value.message
    # Tried once: urllib3's default retries would wait out the timeout four times.
    assert len(accepted) == 1


async def test_an_api_server_that_is_away_is_a_kube_error() -> None:
    with socket.socket() as sock:  # a free port, closed again: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(KubeError) as raised:
        await _kube_at(port).scale("ns", "mailer", 3)
    assert raised.value.reason == "ApiUnreachable"
    assert raised.value.message.startswith("scaling Deployment ns/mailer: the API server did not")


def test_selectors_with_expressions_are_said_as_kubernetes_reads_them() -> None:
    selector = client.V1LabelSelector(
        match_labels={"app": "mailer"},
        match_expressions=[
            client.V1LabelSelectorRequirement(key="tier", operator="In", values=["jobs", "b"]),
            client.V1LabelSelectorRequirement(key="track", operator="NotIn", values=["canary"]),
            client.V1LabelSelectorRequirement(key="managed", operator="Exists"),
            client.V1LabelSelectorRequirement(key="legacy", operator="DoesNotExist"),
        ],
    )
    assert _selector(selector) == (
        "app=mailer,tier in (b,jobs),track notin (canary),managed,!legacy"
    )
    assert _selector(client.V1LabelSelector(match_labels={"b": "2", "a": "1"})) == "a=1,b=2"
    assert _selector(None) is None
    assert _selector(client.V1LabelSelector()) is None


async def test_settled_waits_for_requests_whose_caller_gave_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cancelled call's thread still holds its request until the request's own timeout:
    `settled` says so, and waits for it (what a stopping leader does before it gives up the
    Lease)."""
    reached, held = asyncio.Event(), list[asyncio.StreamWriter]()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # a silent API server: never answers
        reached.set()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    monkeypatch.setattr(kube_module, "REQUEST_TIMEOUT", (1.0, 1.0))
    kube = _kube_at(server.sockets[0].getsockname()[1])
    try:
        assert await kube.settled(0)  # nothing in flight
        call = asyncio.create_task(kube.deployment("ns", "mailer"))
        await asyncio.wait_for(reached.wait(), 10)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert not await kube.settled(0)  # cancelled, yet still in flight
        assert await kube.settled(10)  # until its read timeout ended it
    finally:
        server.close()
        for writer in held:
            writer.close()
        await server.wait_closed()
