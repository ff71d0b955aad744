"""The venturi Kubernetes operator: scales worker Deployments from the queue's own statistics.

It watches JobQueue objects (``crds/venturi.dev_jobqueues.yaml``), reads each queue's stats from
PostgreSQL once per tick, decides replicas per worker pool with the pure function in
:mod:`venturi_operator.policy`, and patches the Deployments' scale subresource. The operator has no
Python API of its own; this package exports only its version.
"""

__version__ = "0.1.0"
