"""Admission control: the concurrency gate with its bounded priority queue, the memory breaker, and the
interceptor that applies them before a request body is parsed."""
