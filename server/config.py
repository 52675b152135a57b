"""The frozen Settings object: every flag of `sluice serve` is generated from a field here (its type, default,
unit and help), parsed and validated once, at start-up. A model's own options are not fields here: each model
declares them (server/runtimes/options.py) and `--model-options NAME.KEY=VALUE` sets them."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from process.flags import FlagParser, add_flags, flag_name, setting, values_from
from server.admission.policies import PolicySettings
from server.model_selection import MODELS_HELP, MODELS_SHOWN, check_hf_models, hf_directories, served_models
from server.transport.tls import TlsFiles

# Flags of model options that were server settings before each model declared its own (issue 18): they still
# parse, into the --model-options entry they stand for, with a warning that names it.
FORMER_FLAGS: Mapping[str, str] = {"lm_size": "byte-lm.size", "mlp_width": "mlp.width"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings(PolicySettings):
    """Server configuration; None for a capacity setting means "derive it from measurement". The admission
    policies' own settings (--max-request-bytes-in-flight, ...) are inherited: each policy declares them."""

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
        (), help="Hugging Face causal LMs as NAME=DIR (a save_pretrained directory), served by that NAME"
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
    # vLLM's chunked prefill: a long prompt joining is prefilled a chunk per step, so the running streams'
    # next tokens wait for at most this many prompt tokens. On CPU a 64-token chunk already costs about two
    # batch-24 decode steps of a 12 M-parameter Llama (bench.hf_generate); a GPU prefills hundreds meanwhile.
    prefill_chunk_tokens: int | None = setting(
        None,
        help="prompt tokens prefilled per step, beside the running streams",
        unit="tokens",
        shown="32 on CPU, 512 on CUDA",
    )
    default_max_tokens: int = setting(128, help="max_tokens of a request that sets none", unit="tokens")
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
    log_level: str = setting("INFO", help="DEBUG, INFO, WARNING or ERROR")
    access_log: float = setting(
        0.0, help="fraction of calls that write a JSON access-log line to stderr: 0 none, 1 every call"
    )
    otlp_endpoint: str | None = setting(
        None, help="OpenTelemetry collector (OTLP/gRPC, host:port or http(s)://host:port) traces are sent to",
        shown="no tracing",
    )  # fmt: skip
    otlp_sampling_ratio: float = setting(
        1.0, help="fraction of traces begun here that are sampled; a caller's traceparent decides for its own"
    )

    def __post_init__(self) -> None:
        PolicySettings.__post_init__(self)  # each policy checks its own (super() fails in a slots class)
        _check(1 <= self.port <= 65535 or self.port == 0, "port", "must be 0..65535")
        _check(
            (self.tls_cert is None) == (self.tls_key is None),
            "tls_cert",
            "--tls-cert and --tls-key go together",
        )
        _check(self.tls_client_ca is None or self.tls_cert is not None, "tls_client_ca", "needs --tls-cert")
        _check(1 <= self.frontends <= 64, "frontends", "must be 1..64")
        _check(self.max_streams_per_connection >= 1, "max_streams_per_connection", "must be >= 1")
        for name in ("max_connection_idle_s", "max_connection_age_s", "max_connection_age_grace_s"):
            _check(getattr(self, name) > 0, name, "must be > 0")
        _check(
            self.metrics_token_sha256 is None or _is_sha256(self.metrics_token_sha256),
            "metrics_token_sha256",
            "must be 64 hex digits (printf %s TOKEN | sha256sum)",
        )
        _check(self.metrics_port >= -1, "metrics_port", "must be -1 (off), 0 (any) or a port")
        check_hf_models(self.hf_models)
        _check(
            self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:"),
            "device",
            "must be auto, cpu, cuda or cuda:N",
        )
        _check(
            self.devices is None or all(d in ("cpu", "cuda") or d.startswith("cuda:") for d in self.devices),
            "devices",
            "each must be cpu, cuda or cuda:N",
        )
        _check(
            self.dtype in ("auto", "float32", "bfloat16", "float16"),
            "dtype",
            "must be auto, float32, bfloat16 or float16",
        )
        _check(0 < self.kv_cache_memory <= 1, "kv_cache_memory", "must be in (0, 1]")
        _check(
            self.prefill_chunk_tokens is None or self.prefill_chunk_tokens >= 1,
            "prefill_chunk_tokens",
            "must be >= 1",
        )
        _check(
            all(_is_model_option(entry) for entry in self.model_options),
            "model_options",
            "each entry is NAME.KEY=VALUE (byte-lm.size=small); the models check their values",
        )
        _check(self.max_concurrency is None or self.max_concurrency > 0, "max_concurrency", "must be > 0")
        _check(self.max_queue >= 0, "max_queue", "must be >= 0")
        _check(self.max_connections is None or self.max_connections > 0, "max_connections", "must be > 0")
        _check(self.handshake_timeout_s > 0, "handshake_timeout_s", "must be > 0")
        _check(
            0.0 < self.low_watermark < self.high_watermark <= 1.0,
            "low_watermark",
            f"needs 0 < low_watermark ({self.low_watermark}) < high_watermark ({self.high_watermark}) <= 1",
        )
        _check(self.probe_interval_s > 0, "probe_interval_s", "must be > 0")
        _check(0.0 <= self.capacity_margin < 1.0, "capacity_margin", "must be in [0, 1)")
        _check(self.memory_budget_mb >= 0, "memory_budget_mb", "must be >= 0 (0 = all memory)")
        _check(
            self.memory_probe in ("auto", "host", "cuda") or self.memory_probe.startswith("fake:"),
            "memory_probe",
            "must be auto, host, cuda or fake:PATH",
        )
        _check(self.max_batch_size > 0, "max_batch_size", "must be > 0")
        _check(self.max_delay_ms >= 0, "max_delay_ms", "must be >= 0")
        _check(self.max_sequences > 0, "max_sequences", "must be > 0")
        _check(self.context_length == 0 or self.context_length >= 16, "context_length", "must be 0 or >= 16")
        _check(self.kv_cache_bytes >= 0, "kv_cache_bytes", "must be >= 0 (0 = from free memory)")
        _check(
            self.default_max_tokens > 0
            and (self.context_length == 0 or self.default_max_tokens < self.context_length),
            "default_max_tokens",
            "must be > 0 and below context_length",
        )
        _check(self.max_stop_sequences >= 0, "max_stop_sequences", "must be >= 0")
        _check(self.max_stop_chars >= 1, "max_stop_chars", "must be >= 1")
        _check(self.stream_buffer >= 2, "stream_buffer", "must be >= 2")
        _check(self.stall_timeout_s > 0, "stall_timeout_s", "must be > 0")
        _check(self.max_message_bytes >= 1024, "max_message_bytes", "must be >= 1024")
        _check(self.kserve_shm_max_regions >= 1, "kserve_shm_max_regions", "must be >= 1")
        _check(self.kserve_shm_max_bytes >= 1, "kserve_shm_max_bytes", "must be >= 1")
        # A front end forwards a call's bytes, not its peer's address: shared memory could not tell who calls.
        _check(not self.kserve_shm or self.frontends == 1, "kserve_shm", "needs --frontends 1")
        _check(self.grace_s >= 0, "grace_s", "must be >= 0")
        _check(self.switch_interval_ms > 0, "switch_interval_ms", "must be > 0")
        _check(self.warmup_steps >= 0, "warmup_steps", "must be >= 0")
        _check(
            self.log_level in ("DEBUG", "INFO", "WARNING", "ERROR"),
            "log_level",
            "DEBUG, INFO, WARNING or ERROR",
        )
        _check(0.0 <= self.access_log <= 1.0, "access_log", "must be a fraction in [0, 1]")
        _check(0.0 <= self.otlp_sampling_ratio <= 1.0, "otlp_sampling_ratio", "must be a fraction in [0, 1]")
        _check(self.torch_threads >= 0, "torch_threads", "must be >= 0 (0 = all cores but one)")

    @property
    def tls(self) -> TlsFiles | None:
        """--tls-cert/--tls-key/--tls-client-ca as files, or None for plaintext."""
        if self.tls_cert is None or self.tls_key is None:
            return None
        ca = Path(self.tls_client_ca) if self.tls_client_ca else None
        return TlsFiles(Path(self.tls_cert), Path(self.tls_key), ca)

    @property
    def hf_directories(self) -> dict[str, str]:
        """--hf-models as NAME -> DIR."""
        return hf_directories(self.hf_models)

    @property
    def served_models(self) -> tuple[str, ...]:
        """What is served (server/model_selection.py: the rule `serve` and `up` share)."""
        return served_models(self.models, self.hf_directories)

    @property
    def metrics_interface(self) -> str:
        return self.metrics_host or self.host

    @classmethod
    def from_args(cls, argv: Sequence[str] | None = None) -> Settings:
        """Parses command-line flags (`--max-queue 8`, ...); raises ValueError naming a bad setting."""
        return from_namespace(parser().parse_args(argv))


class _ServeParser(FlagParser):
    """The parser of `sluice serve`, whose help ends with every registered model's options: read from the
    registry only when help is shown, as the registry imports torch and every model."""

    def format_help(self) -> str:
        from server.runtimes.registry import options_help

        self.epilog = options_help()
        return super().format_help()


def parser(prog: str = "sluice serve", *, skip: tuple[str, ...] = ()) -> argparse.ArgumentParser:
    """The argument parser of `sluice serve`: one flag per Settings field (less `skip`), and FORMER_FLAGS."""
    out = _ServeParser(
        prog=prog,
        description="Run the Sluice gRPC server.",
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the model options' help is one a line
    )
    add_flags(out, Settings, skip=skip)
    add_former_flags(out)
    return out


def add_former_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--lm-size and --mlp-width, absent from the namespace unless given (from_namespace translates them)."""
    for dest, option in FORMER_FLAGS.items():
        parser.add_argument(
            flag_name(dest),
            dest=dest,
            default=argparse.SUPPRESS,
            metavar="VALUE",
            help=f"deprecated: --model-options {option}=VALUE",
        )


def former_options(given: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The --model-options entries that FORMER_FLAGS in `given` (dest -> value) stand for, and for each a
    warning line naming it; a --model-options for the same key, put after these, wins."""
    used = [(dest, f"{option}={given[dest]}") for dest, option in FORMER_FLAGS.items() if dest in given]
    warnings = tuple(f"{flag_name(dest)} is deprecated; use --model-options {entry}" for dest, entry in used)
    return tuple(entry for _, entry in used), warnings


def from_namespace(ns: argparse.Namespace, *, prog: str = "sluice serve") -> Settings:
    """Settings from parsed flags; a former flag becomes its --model-options entry, with a warning."""
    values = dict(values_from(ns, Settings))
    former, warnings = former_options(vars(ns))
    for line in warnings:
        print(f"{prog}: warning: {line}", file=sys.stderr)
    if former:
        values["model_options"] = (*former, *values.get("model_options", ()))
    return Settings(**values)


def _check(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise ValueError(f"invalid setting {name}: {message}")


def _is_model_option(entry: str) -> bool:
    target, equals, _ = entry.partition("=")
    name, dot, key = target.rpartition(".")
    return bool(equals and dot and name and key)


def _is_sha256(text: str) -> bool:
    try:
        return len(bytes.fromhex(text)) == 32
    except ValueError:
        return False
