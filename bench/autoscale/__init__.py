"""A trace-driven, deterministic autoscaling simulator: venturi's operator against KEDA + HPA."""
