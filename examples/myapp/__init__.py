"""An example venturi application: task types and the worker factory (see examples/README.md)."""
