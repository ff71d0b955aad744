"""Who a worker is: recorded on every claim and journal entry, so that who holds which job
is always visible (the operator uses the pod name to spare busy pods on scale-in).

Each `Worker` has an identity of its own, also when several run in one process: the claims
a worker reconciles after a reconnect are those recorded under its identity, so two workers
must never share one.
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass, field

_issued: set[str] = set()
"""Instance tags handed out in this process (kept unique)."""


def _new_instance() -> str:
    while True:
        tag = secrets.token_hex(2)
        if tag not in _issued:
            _issued.add(tag)
            return tag


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    host: str
    pid: int
    pod: str | None = None
    """The Kubernetes pod name, when running in a pod."""
    instance: str = field(default_factory=_new_instance)
    """Four hex digits telling apart the workers of one process (and a pid reused later)."""

    @classmethod
    def current(cls) -> WorkerIdentity:
        """A new identity in this process: hostname, pid, the pod name from POD_NAME (set it
        with the downward API) or, inside Kubernetes, HOSTNAME (the pod name by default),
        and a fresh instance tag."""
        pod = os.environ.get("POD_NAME")
        if pod is None and "KUBERNETES_SERVICE_HOST" in os.environ:
            pod = os.environ.get("HOSTNAME")
        return cls(socket.gethostname(), os.getpid(), pod or None)

    def __str__(self) -> str:
        """`host:pid#tag`, led by `pod/` in Kubernetes (when the pod is not the host name)."""
        base = f"{self.host}:{self.pid}#{self.instance}"
        return f"{self.pod}/{base}" if self.pod and self.pod != self.host else base
