"""Batching: the dynamic batcher for Infer and the continuous (iteration-level) scheduler for Generate."""
