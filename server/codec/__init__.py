"""The one translation layer between protobuf and the server's domain (server/domain.py): messages and
tensors, reading raw bytes without parsing them (wire.py), and domain errors -> gRPC status (status.py)."""
