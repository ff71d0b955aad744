"""Benchmarks of the venturi operator against a real kube-apiserver (see run.py)."""
