"""Names on the wire: gRPC metadata and trailers, the shim's HTTP headers, and the health services."""

from __future__ import annotations

# -- gRPC metadata a caller sends ---------------------------------------------------------------------
#: `Bearer <token>` of a tenant in the keys file (also the HTTP header the shim reads).
AUTHORIZATION = "authorization"
#: The caller's request id; echoed in the trailers and the access logs (also the HTTP header).
REQUEST_ID = "x-request-id"
#: The end user a gateway acts for (the shim forwards OpenAI's `user`), recorded in the access log only.
USER = "x-sluice-user"
#: W3C trace context (also the HTTP headers): the shim continues the caller's trace and sends its own span's.
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
#: The addresses a call was forwarded for, nearest last (the de facto HTTP header, as Envoy sets it; the shim
#: sets its HTTP client's). The server believes it only from a peer on its own host (server/kserve/peers.py).
FORWARDED_FOR = "x-forwarded-for"

# -- gRPC trailers (and the shim's response headers) ----------------------------------------------------
#: The tenant a call was served for.
TENANT = "x-sluice-tenant"
#: gRPC's retry pushback: how long a retrying client waits, in milliseconds (A6 of gRPC's proposals).
RETRY_PUSHBACK_MS = "grpc-retry-pushback-ms"

# -- the shim's own HTTP headers --------------------------------------------------------------------------
#: The call's priority (low, normal, high) on the native and OpenAI routes.
PRIORITY_HEADER = "x-sluice-priority"
#: The call's deadline in milliseconds.
TIMEOUT_HEADER = "x-sluice-timeout-ms"
#: Azure OpenAI's spelling of the token header, which the OpenAI SDKs send for Azure.
API_KEY_HEADER = "api-key"

# -- services ---------------------------------------------------------------------------------------------
#: The inference service, as the protos name it.
INFERENCE_SERVICE = "sluice.inference.v1.InferenceService"
#: grpc.health.v1 service that is SERVING while the server takes new work (readiness; "" is liveness).
READINESS_SERVICE = "sluice.readiness"
#: Trailing metadata of a readiness check (server/readiness.py's ReportingHealth): the replica's KV caches'
#: tokens in all, and the fraction running sequences hold (the model-server protocol's KV use), so that a
#: router polling readiness learns each replica's KV size and use without scraping /metrics.
KV_TOKENS = "x-sluice-kv-tokens"
KV_USAGE = "x-sluice-kv-usage"
