"""Every Prometheus instrument the server exports, in one registry, served on a separate HTTP port.

Label values are only ever served model names (or "" for a call that named none): a caller cannot grow the
registry by sending made-up names."""

from __future__ import annotations

import hashlib
import hmac
import threading
from dataclasses import dataclass, field
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app, start_http_server
from prometheus_client.exposition import ThreadingWSGIServer

from auth.keys import bearer_token
from process.trace_export import DROP_REASONS
from server.protocol_metrics import ProtocolMetrics

_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        mm = ["model", "method"]
        self.admitted = Counter("sluice_requests_admitted_total", "Requests given a slot.", mm, registry=r)
        self.refused = Counter(
            "sluice_requests_refused_total",
            "Requests refused by admission control.",
            [*mm, "reason"],
            registry=r,
        )
        # Tenant names come from the keys file only, so this label is bounded too.
        self.tenant_calls = Counter(
            "sluice_tenant_requests_total",
            "Requests by tenant (--auth-keys) and outcome: admitted, or the refusal's reason.",
            ["tenant", "outcome"],
            registry=r,
        )
        self.tenant_store_up = Gauge(
            "sluice_tenant_store_up",
            "1 while the tenant store (--tenant-store) answers: tenants' rates held fleet-wide.",
            registry=r,
        )
        self.tenant_store_fallbacks = Counter(
            "sluice_tenant_store_fallbacks_total",
            "Calls whose tenant rate this replica decided alone (its share): the store did not answer.",
            registry=r,
        )
        self.slots = Gauge("sluice_admission_slots", "Requests a model runs at once.", mm, registry=r)
        self.queue_limit = Gauge(
            "sluice_admission_queue_limit", "Requests that may wait for a model's slots.", mm, registry=r
        )
        self.queued = Counter(
            "sluice_requests_queued_total",
            "Admitted requests that waited in the queue because every slot was held.",
            mm,
            registry=r,
        )
        self.in_flight = Gauge("sluice_requests_in_flight", "Requests holding a slot.", mm, registry=r)
        self.waiting = Gauge("sluice_requests_waiting", "Requests waiting for a slot.", mm, registry=r)
        self.queue_wait = Histogram(
            "sluice_queue_wait_seconds",
            "Time waiting for an admission slot.",
            mm,
            buckets=_LATENCY,
            registry=r,
        )
        # By device too: with --devices each replica of a model computes on its own.
        self.compute = Histogram(
            "sluice_compute_seconds",
            "Forward pass time per batch or decode step.",
            [*mm, "device"],
            buckets=_LATENCY,
            registry=r,
        )
        self.batch_size = Histogram(
            "sluice_batch_size",
            "Requests per forward pass.",
            [*mm, "device"],
            buckets=(1, 2, 4, 8, 16, 24, 32, 48, 64, 128),
            registry=r,
        )
        self.memory_used = Gauge(
            "sluice_memory_used_bytes", "Memory in use, per the probe.", ["probe"], registry=r
        )
        self.memory_reserved = Gauge(
            "sluice_memory_reserved_bytes", "Memory reserved (allocator caches).", ["probe"], registry=r
        )
        self.memory_budget = Gauge("sluice_memory_budget_bytes", "The memory budget.", ["probe"], registry=r)
        self.device_breaker_open = Gauge(
            "sluice_device_breaker_open",
            "1 while the memory breaker of this device's replicas is open (--devices).",
            ["device"],
            registry=r,
        )
        self.breaker_open = Gauge(
            "sluice_memory_breaker_open", "1 while the memory breaker is open (on every device).", registry=r
        )
        self.oom = Counter(
            "sluice_oom_total", "Out-of-memory errors caught and recovered from.", ["model"], registry=r
        )
        m = ["model"]
        self.tokens = Counter(
            "sluice_tokens_generated_total", "Tokens sampled by decode steps.", m, registry=r
        )
        # By cause, so that an alert on clients leaving reads `cancelled` alone: a stream that ends by EOS
        # or a stop sequence always costs one look-ahead token (server/batching/lookahead.py).
        self.tokens_discarded = Counter(
            "sluice_tokens_discarded_total",
            "Tokens computed and never sent, by reason: cancelled (the caller left while its step was in"
            " flight), finished (the look-ahead token of a stream already ended by EOS, a stop sequence or"
            " an error), preempted (recomputed when the sequence resumes).",
            [*m, "reason"],
            registry=r,
        )
        self.tokens_after_cancel = Counter(
            "sluice_tokens_after_cancel_total",
            "Tokens computed in steps that began after their sequence was cancelled (target: zero).",
            m,
            registry=r,
        )
        self.constraint_failures = Counter(
            "sluice_constraint_failures_total",
            "Generations ended with an error because their grammar's matcher failed mid-stream, by reason "
            "(CONSTRAINT_TOO_COMPLEX: a per-step limit outgrown; CONSTRAINT_FAILED: any other failure).",
            ["model", "reason"],
            registry=r,
        )
        self.sequences = Gauge("sluice_sequences_active", "Sequences in the running batch.", m, registry=r)
        self.sequences_paused = Gauge(
            "sluice_sequences_paused", "Sequences skipped because their consumer is behind.", m, registry=r
        )
        self.stalled = Counter(
            "sluice_streams_stalled_total", "Streams ended for a stalled consumer.", m, registry=r
        )
        self.write_stalled = Counter(
            "sluice_streams_write_stalled_total",
            "Streams ended because the peer accepted no data (no flow-control window) for the stall timeout.",
            m,
            registry=r,
        )
        self.kv_slots = Gauge(
            "sluice_kv_slots_in_use", "Sequences holding a region of the KV cache.", m, registry=r
        )
        self.kv_tokens = Gauge(
            "sluice_kv_tokens_in_use", "Tokens whose keys and values running sequences wrote.", m, registry=r
        )
        self.kv_reserved = Gauge(
            "sluice_kv_tokens_reserved", "Tokens of the KV cache running sequences hold as their own.", m,
            registry=r,
        )  # fmt: skip
        self.kv_shared = Gauge(
            "sluice_kv_tokens_shared",
            "Tokens of cached or running prefixes that running sequences attend in place, counted once.", m,
            registry=r,
        )  # fmt: skip
        self.kv_cached = Gauge(
            "sluice_kv_tokens_cached", "Tokens of the KV cache held by cached prefixes.", m, registry=r
        )
        self.kv_free = Gauge(
            "sluice_kv_tokens_free", "Tokens of the KV cache held by nothing.", m, registry=r
        )
        self.kv_fragmentation = Gauge(
            "sluice_kv_fragmentation", "1 - the largest free run of the KV cache / its free tokens.", m,
            registry=r,
        )  # fmt: skip
        self.prefix_hits = Counter(
            "sluice_prefix_cache_hits_total", "Sequences that reused a cached prefix.", m, registry=r
        )
        self.prefix_tokens = Counter(
            "sluice_prefix_cache_tokens_total", "Prompt tokens taken from the prefix cache.", m, registry=r
        )
        self.prefix_evictions = Counter(
            "sluice_prefix_cache_evictions_total", "Cached prefixes evicted for memory.", m, registry=r
        )
        self.preemptions = Counter(
            "sluice_preemptions_total", "Sequences preempted for a higher-priority one.", m, registry=r
        )
        self.recomputed = Counter(
            "sluice_recomputed_tokens_total", "Tokens prefilled again to resume preempted sequences.", m,
            registry=r,
        )  # fmt: skip
        self.kv_compactions = Counter(
            "sluice_kv_compactions_total",
            "Times the KV arena slid its regions down to close holes for a sequence no hole held.",
            m,
            registry=r,
        )
        # Timed on the model's thread, the device synchronised: the copies delay the step that carries them.
        self.kv_compaction = Histogram(
            "sluice_kv_compaction_seconds",
            "Time the model's thread spent copying regions for one compaction of the KV arena.",
            m,
            buckets=(1e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1),
            registry=r,
        )
        self.step_gap = Histogram(
            "sluice_step_gap_seconds",
            "Idle time of the model's thread between a decode step and the next one it was due to run.",
            m,
            buckets=(1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2),
            registry=r,
        )
        # Usage for billing and caps: label values are tenants of the keys file ("" without one) and served
        # models, so a caller cannot grow the registry.
        tm = ["tenant", "model"]
        self.prompt_tokens = Counter(
            "sluice_prompt_tokens_total", "Prompt tokens of Generate calls, by tenant and model.", tm,
            registry=r,
        )  # fmt: skip
        self.completion_tokens = Counter(
            "sluice_completion_tokens_total",
            "Tokens generated for Generate calls (sent, or ready when the caller left), by tenant and model.",
            tm,
            registry=r,
        )
        self.cached_prompt_tokens = Counter(
            "sluice_cached_prompt_tokens_total",
            "Prompt tokens taken from the prefix cache, by tenant and model.",
            tm,
            registry=r,
        )
        self.ttft = Histogram(
            "sluice_time_to_first_token_seconds",
            "Arrival to first token sent.",
            m,
            buckets=_LATENCY,
            registry=r,
        )
        # Tracing (process/trace_export.py): label values are its fixed drop reasons.
        self.trace_spans_exported = Counter(
            "sluice_trace_spans_exported_total", "Spans the trace collector accepted.", registry=r
        )
        self.trace_spans_dropped = Counter(
            "sluice_trace_spans_dropped_total",
            "Spans lost on the way to the trace collector, by where (process/trace_export.py DROP_REASONS).",
            ["reason"],
            registry=r,
        )
        for reason in DROP_REASONS:  # each shows at 0 from the start: an alert on it needs the series
            self.trace_spans_dropped.labels(reason)
        # The Inference Gateway's model-server protocol: totals an endpoint picker scrapes.
        r.register(ProtocolMetrics(self))

    def trace_export(self, outcome: str, spans: int) -> None:
        """What became of `spans` spans (the export process reports it as it happens)."""
        if outcome == "exported":
            self.trace_spans_exported.inc(spans)
        else:
            self.trace_spans_dropped.labels(outcome).inc(spans)

    def serve(self, host: str, port: int, token_sha256: bytes | None = None) -> int:
        """Starts the /metrics HTTP endpoint on its own thread; returns the bound port. With `token_sha256`
        a scrape must send `Authorization: Bearer <token>` of that hash (else 401)."""
        if token_sha256 is None:
            server, _thread = start_http_server(port, addr=host, registry=self.registry)
            return int(server.server_port)
        app = _bearer_only(make_wsgi_app(self.registry), token_sha256)
        httpd = make_server(host, port, app, ThreadingWSGIServer, handler_class=_QuietHandler)
        threading.Thread(target=httpd.serve_forever, daemon=True, name="metrics").start()
        return int(httpd.server_port)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged (prometheus_client's own server is silent too)."""


def _bearer_only(app: Any, token_sha256: bytes) -> Any:
    def guarded(environ: dict[str, Any], start_response: Any) -> Any:
        token = bearer_token(environ.get("HTTP_AUTHORIZATION"))
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest() if token else b""
        if not hmac.compare_digest(digest, token_sha256):
            start_response(
                "401 Unauthorized", [("Content-Type", "text/plain"), ("WWW-Authenticate", "Bearer")]
            )
            return [b"metrics need Authorization: Bearer <token>\n"]
        return app(environ, start_response)

    return guarded
