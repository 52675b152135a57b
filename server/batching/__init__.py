"""Batching: the dynamic batcher for Infer and the continuous (iteration-level) scheduler for Generate,
with its request resolution, chunked prefill plan, KV slots, token streams and out-of-memory recovery."""
