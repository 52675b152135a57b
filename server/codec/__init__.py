"""The one translation layer between protobuf messages and domain types (server/domain.py)."""
