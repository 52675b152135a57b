"""The frozen Settings object: every flag of `sluice serve` is generated from one of its fields (their table
is server/flag_table.py; the admission policies declare their own), parsed and checked once, at start-up;
and the parser of `sluice serve`. A model's own options are not fields: each model declares them
(server/runtimes/options.py) and `--model-options NAME.KEY=VALUE` sets them."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from process.flags import FlagParser, add_flags, values_from
from server.flag_table import ServeFlags
from server.former_flags import add_former_flags, former_options
from server.model_selection import check_hf_models, hf_directories, model_option_entries, served_models
from server.transport.tls import TlsFiles


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings(ServeFlags):
    """Server configuration: every flag's field (server/flag_table.py, and the admission policies' own,
    which each policy declares), checked once, and what derives from them."""

    def __post_init__(self) -> None:
        ServeFlags.__post_init__(self)  # each policy checks its own (super() fails in a slots class)
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
        _check(
            self.quantization in ("none", "int8", "int4", "w8a8_int8"),
            "quantization",
            "must be none, int8, int4 or w8a8_int8",
        )
        _check(0 < self.kv_cache_memory <= 1, "kv_cache_memory", "must be in (0, 1]")
        _check(
            self.prefill_chunk_tokens is None or self.prefill_chunk_tokens >= 1,
            "prefill_chunk_tokens",
            "must be >= 1",
        )
        model_option_entries(self.model_options)
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
            self.default_max_tokens is None
            or (
                self.default_max_tokens > 0
                and (self.context_length == 0 or self.default_max_tokens < self.context_length)
            ),
            "default_max_tokens",
            "must be > 0 and below context_length (unset: the context's remainder)",
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
        _check(self.infer_switch_interval_ms > 0, "infer_switch_interval_ms", "must be > 0")
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


def _is_sha256(text: str) -> bool:
    try:
        return len(bytes.fromhex(text)) == 32
    except ValueError:
        return False
