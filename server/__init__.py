"""Sluice's gRPC inference server."""
