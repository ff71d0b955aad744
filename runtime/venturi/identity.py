"""Who a worker is: recorded on every claim and journal entry, so that who holds which job
is always visible (the operator uses the pod name to spare busy pods on scale-in)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    host: str
    pid: int
    pod: str | None = None
    """The Kubernetes pod name, when running in a pod."""

    @classmethod
    def current(cls) -> WorkerIdentity:
        """This process: hostname, pid, and the pod name from POD_NAME (set it with the
        downward API) or, inside Kubernetes, HOSTNAME (which is the pod name by default)."""
        pod = os.environ.get("POD_NAME")
        if pod is None and "KUBERNETES_SERVICE_HOST" in os.environ:
            pod = os.environ.get("HOSTNAME")
        return cls(socket.gethostname(), os.getpid(), pod or None)

    def __str__(self) -> str:
        base = f"{self.host}:{self.pid}"
        return f"{self.pod}/{base}" if self.pod and self.pod != self.host else base
