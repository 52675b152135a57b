"""Memory: probes that read it (CUDA, host, a fake file for tests), the breaker that refuses work above a
watermark, and the capacity plan that sizes slots and batches from what is free."""
