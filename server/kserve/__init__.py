"""The Open Inference Protocol (KServe v2) on the server's port: `inference.GRPCInferenceService` beside
Sluice's own service, behind the same admission, batcher, scheduler and metrics. The codec here turns v2
messages into the server's domain types; the servicer submits them as Sluice's own servicer does."""
