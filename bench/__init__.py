"""Benchmark suite: venturi against its peers on one machine, one PostgreSQL, one workload.

Run it with ``python -m bench`` (see ``bench/README.md``).
"""
