"""The flag table of `sluice serve`: one field per flag (its type, default, unit and help), from which the
flags of `sluice serve` and `sluice up` are generated. server/config.py's Settings is this table checked, with
what derives from it; the admission policies' own flags are declared by each policy (PolicySettings)."""

from __future__ import annotations

from dataclasses import dataclass

from process.flags import setting
from server.admission.policies import PolicySettings
from server.lora_flags import LoraFlags
from server.model_selection import MODELS_HELP, MODELS_SHOWN


@dataclass(frozen=True, kw_only=True)
class ServeFlags(PolicySettings, LoraFlags):
    """Every flag of `sluice serve`, in --help's order; None for a capacity setting means "derive it from
    measurement". Not slotted: Settings, slotted, adds the checks (slotted bases could not be combined)."""

    host: str = setting("127.0.0.1", help="interface the gRPC port binds")
    port: int = setting(50051, help="gRPC port; 0 picks a free one")
    tls_cert: str | None = setting(
        None, help="PEM certificate (chain) of the gRPC port; TLS when set", shown="plaintext"
    )
    tls_key: str | None = setting(None, help="PEM private key of --tls-cert", shown="none")
    tls_client_ca: str | None = setting(
        None, help="PEM CA that clients' certificates must chain to (mTLS)", shown="no client certificates"
    )
    auth_keys: str | None = setting(
        None, help="TOML file of tenants (server/admission/tenants.py): callers need a bearer token from it",
        shown="no authentication",
    )  # fmt: skip
    metrics_token_sha256: str | None = setting(
        None, help="sha256 (hex) of the bearer token /metrics scrapes must send", shown="open"
    )
    metrics_host: str | None = setting(None, help="interface of the Prometheus port", shown="--host")
    metrics_port: int = setting(0, help="Prometheus /metrics port; 0 picks a free one, -1 turns it off")
    models: tuple[str, ...] | None = setting(None, help=MODELS_HELP, shown=MODELS_SHOWN)
    plugins: tuple[str, ...] = setting(
        (), help="modules to import first, by name or .py path; they call register_model()"
    )
    hf_models: tuple[str, ...] = setting(
        (),
        help="Hugging Face causal LMs as NAME=PATH (a save_pretrained directory, a .gguf file or a directory "
        "holding one), served by that NAME",
    )
    device: str = setting("auto", help="auto, cpu, cuda or cuda:N")
    devices: tuple[str, ...] | None = setting(
        None,
        help="one replica of every model on each of these devices, comma-separated (cuda:0,cuda:1; cpu,cpu "
        "in tests); each gets its own slots and memory breaker, and a call goes to the least loaded",
        shown="--device alone",
    )
    dtype: str = setting(
        "auto",
        help="weights and KV cache of Hugging Face generative models: auto, float32, bfloat16 or float16",
        shown="auto: bfloat16 on CUDA, float32 on CPU",
    )
    quantization: str = setting(
        "none",
        help="quantization of generative models' linear layers: none, int8 (weights per channel), int4 "
        "(weights, groups of 32) or w8a8_int8 (int8 weights and activations: the fastest at large batches on "
        "a CPU); GGUF Q4_0/Q4_1 and Q8_0 weights stay quantized (docs/quantization.md)",
    )
    torch_threads: int = setting(0, help="torch intra-op threads; 0 = all cores but one", unit="threads")
    model_options: tuple[str, ...] = setting(
        (),
        help="options each model declares, as NAME.KEY=VALUE, comma-separated (byte-lm.size=small,"
        "mlp.width=256; a later one for the same key wins); sluice serve --help lists them at its end",
    )
    warmup_steps: int = setting(2, help="warm-up passes per model before serving", unit="passes")
    reflection: bool = setting(True, help="serve gRPC reflection (v1 and v1alpha)")
    # Admission.
    max_concurrency: int | None = setting(
        None, help="Infer slots per model", unit="requests", shown="what measured memory allows"
    )
    max_queue: int = setting(64, help="callers that may wait for a model's slots", unit="requests")
    max_connections: int | None = setting(
        None, help="client connections held at once", shown="the descriptor limit less a reserve"
    )
    max_streams_per_connection: int = setting(
        1024, help="concurrent calls on one connection (at least a shim's --max-inflight)", unit="calls"
    )
    max_connection_idle_s: float = setting(
        300.0, help="a connection with no call this long is closed", unit="seconds"
    )
    max_connection_age_s: float = setting(
        3600.0, help="a connection this old is asked to reconnect (GOAWAY)", unit="seconds"
    )
    max_connection_age_grace_s: float = setting(
        600.0, help="time an aged connection's calls get to finish", unit="seconds"
    )
    handshake_timeout_s: float = setting(
        10.0, help="a connection that has not started HTTP/2 by then is closed", unit="seconds"
    )
    memory_probe: str = setting(
        "auto", help="auto, host, cuda or fake:PATH (tests; with --devices, device N reads PATH.N)"
    )
    memory_budget_mb: int = setting(0, help="memory the breaker and capacity plan count; 0 = all", unit="MiB")
    high_watermark: float = setting(0.92, help="the memory breaker opens at this used fraction")
    low_watermark: float = setting(0.85, help="the memory breaker closes at this used fraction")
    probe_interval_s: float = setting(0.05, help="memory sampling period", unit="seconds")
    capacity_margin: float = setting(0.2, help="fraction of the measured capacity kept in reserve")
    # Dynamic batching (Infer).
    max_batch_size: int = setting(32, help="items per forward pass", unit="items")
    # 0, as Triton's max_queue_delay: an idle model takes what is queued at once; under load the next batch
    # fills while the previous one computes, so a delay only made a lone caller wait (158 vs 238+ calls/s).
    max_delay_ms: float = setting(0.0, help="how long a partial batch may wait for company", unit="ms")
    # Continuous batching (Generate).
    # vLLM's max_num_seqs: memory, counted by the token (docs/kv-cache.md), limits them before this does.
    max_sequences: int = setting(256, help="sequences running at once per generative model", unit="sequences")
    context_length: int = setting(
        0, help="longest sequence, prompt + max_tokens", unit="tokens", shown="the model's own (its config's)"
    )
    kv_cache_bytes: int = setting(
        0,
        help="KV cache of each generative model",
        unit="bytes",
        shown="--kv-cache-memory of the free memory; on CPU at most 4 GiB",
    )
    kv_cache_memory: float = setting(
        0.9, help="fraction of the memory free at start-up the KV cache may take (see --kv-cache-bytes)"
    )
    # On CPU the arena is mapped lazily: pages become resident as sequences first write them. Prefaulting
    # makes it resident at start (as a GPU's is), so the memory is counted from the start and a host that
    # cannot hold it fails then, not under load.
    kv_cache_prefault: bool = setting(
        False, help="write the whole KV cache at start-up (CPU: make it resident)"
    )
    prefix_cache: bool = setting(True, help="reuse the keys and values of cached prompt prefixes")
    kv_events_endpoint: str | None = setting(
        None, help="ZMQ endpoint publishing the prefix cache's changes as vLLM's KV events (tcp://*:5557)",
        shown="none",
    )  # fmt: skip
    kv_events_replay_endpoint: str | None = setting(
        None, help="ZMQ endpoint resending KV events a subscriber missed (tcp://*:5558)", shown="none"
    )
    prefix_sharing: bool = setting(
        True, help="attend a cached prefix where it lies instead of copying it (runtimes that can)"
    )
    # vLLM's chunked prefill: a long prompt joining is prefilled a chunk per step, so the running streams'
    # next tokens wait for at most this many prompt tokens. On CPU a 64-token chunk already costs about two
    # batch-24 decode steps of a 12 M-parameter Llama (bench.hf_generate); a GPU prefills hundreds meanwhile.
    prefill_chunk_tokens: int | None = setting(
        None,
        help="prompt tokens prefilled per step, beside the running streams",
        unit="tokens",
        shown="32 on CPU, 512 on CUDA",
    )
    # OpenAI's and vLLM's default is the rest of the context: memory grows as the output is written (issue
    # 37), so an unset max_tokens reserves nothing up front; an operator may still cap it.
    default_max_tokens: int | None = setting(
        None, help="max_tokens of a request that sets none", unit="tokens", shown="the context's remainder"
    )
    max_stop_sequences: int = setting(4, help="stop sequences a request may give", unit="sequences")
    max_stop_chars: int = setting(128, help="length of one stop sequence", unit="characters")
    stream_buffer: int = setting(32, help="chunks buffered for a stream before it pauses", unit="chunks")
    stall_timeout_s: float = setting(
        10.0,
        help="a stream paused this long is ended (one unable to write, after twice this)",
        unit="seconds",
    )
    # Transport and lifecycle.
    frontends: int = setting(
        1, help="gRPC front-end processes sharing the port (docs/frontends.md); 1 = this process alone",
        unit="processes",
    )  # fmt: skip
    max_message_bytes: int = setting(4 * 1024 * 1024, help="largest request message", unit="bytes")
    # KServe v2 system shared memory (server/kserve/shm.py): off unless asked for; callers on this host only.
    kserve_shm: bool = setting(False, help="serve KServe v2 system shared memory to callers on this host")
    kserve_shm_max_regions: int = setting(16, help="shared-memory regions one tenant holds", unit="regions")
    kserve_shm_max_bytes: int = setting(1 << 30, help="shared memory one tenant registers", unit="bytes")
    grace_s: float = setting(10.0, help="time in-flight calls get to finish on SIGTERM", unit="seconds")
    switch_interval_ms: float = setting(
        0.1, help="the GIL switch interval (CPython's default is 5 ms)", unit="ms"
    )
    infer_switch_interval_ms: float = setting(
        0.01,
        help="the GIL switch interval while an Infer batch computes (eager ops win it back sooner)",
        unit="ms",
    )
    log_level: str = setting("INFO", help="DEBUG, INFO, WARNING or ERROR")
    access_log: float = setting(
        0.0, help="fraction of calls that write a JSON access-log line to stderr: 0 none, 1 every call"
    )
    otlp_endpoint: str | None = setting(
        None, help="OpenTelemetry collector (OTLP/gRPC, host:port or http(s)://host:port) traces are sent to",
        shown="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else OTEL_EXPORTER_OTLP_ENDPOINT, else no tracing",
    )  # fmt: skip
    otlp_sampling_ratio: float = setting(
        1.0, help="fraction of traces begun here that are sampled; a caller's traceparent decides for its own"
    )
