"""Generate streams relayed over HTTP for every API family: reading calls no faster than the client takes
their events, with heartbeats (paced), the one consumer that turns the calls into domain events and an HTTP
answer (consumer), and the SSE response that carries a family's rendering of them (sse)."""
