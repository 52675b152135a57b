"""Admission control: the interceptor and the ordered policies it runs (policies/) before a request body is
parsed, the reader of the raw bytes, each model's gate (slots, bounded priority queue, deadline estimate),
the handlers that hold a slot until the call ends, the write watchdog, tenants and devices."""
