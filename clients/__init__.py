"""Sluice client libraries."""
