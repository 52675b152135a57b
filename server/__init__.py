"""Sluice's gRPC inference server; docs/architecture.md draws the path of a request through its packages."""
