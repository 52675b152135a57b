"""Operational endpoints: /healthz, /readyz, /metrics."""
