"""Sluice's HTTP/SSE shim: FastAPI in front of the gRPC server."""
