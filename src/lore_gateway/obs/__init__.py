"""Observability: structured logs (``obs.logging``) and Prometheus metrics (``obs.metrics``)."""
