"""The frozen Settings object: every flag is parsed and validated here, once, at start-up."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, fields

DEFAULT_MODELS = ("mlp", "byte-lm")


@dataclass(frozen=True, slots=True)
class Settings:
    """Server configuration; None for a capacity setting means "derive it from measurement"."""

    host: str = "127.0.0.1"
    port: int = 50051
    metrics_port: int = 0
    models: tuple[str, ...] = DEFAULT_MODELS
    plugins: tuple[str, ...] = ()
    hf_models: tuple[str, ...] = ()  # NAME=DIRECTORY of a Hugging Face causal LM (the `hf` extra)
    device: str = "auto"
    torch_threads: int = 0
    lm_size: str = "tiny"
    mlp_width: int = 2048
    warmup_steps: int = 2
    # Admission.
    max_concurrency: int | None = None
    max_queue: int = 64
    memory_probe: str = "auto"
    memory_budget_mb: int = 0
    high_watermark: float = 0.92
    low_watermark: float = 0.85
    probe_interval_s: float = 0.05
    capacity_margin: float = 0.2
    # Dynamic batching (Infer).
    max_batch_size: int = 32
    # 0, as Triton's max_queue_delay: an idle model takes what is queued at once; under load the next batch
    # fills while the previous one computes, so a delay only made a lone caller wait (158 vs 238+ calls/s).
    max_delay_ms: float = 0.0
    # Continuous batching (Generate).
    max_sequences: int = 32
    context_length: int = 1024
    default_max_tokens: int = 128
    max_stop_sequences: int = 4
    max_stop_chars: int = 128
    stream_buffer: int = 32
    stall_timeout_s: float = 10.0
    # Transport and lifecycle.
    max_message_bytes: int = 4 * 1024 * 1024
    grace_s: float = 10.0
    switch_interval_ms: float = 0.1  # the GIL switch interval (CPython's default is 5 ms)

    def __post_init__(self) -> None:
        _check(1 <= self.port <= 65535 or self.port == 0, "port", "must be 0..65535")
        _check(self.metrics_port >= -1, "metrics_port", "must be -1 (off), 0 (any) or a port")
        _check(bool(self.models) or bool(self.hf_models), "models", "name at least one model")
        _check(all("=" in spec for spec in self.hf_models), "hf_models", "each entry is NAME=DIRECTORY")
        _check(
            self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:"),
            "device",
            "must be auto, cpu, cuda or cuda:N",
        )
        _check(self.lm_size in ("tiny", "small", "bench"), "lm_size", "must be tiny, small or bench")
        _check(self.max_concurrency is None or self.max_concurrency > 0, "max_concurrency", "must be > 0")
        _check(self.max_queue >= 0, "max_queue", "must be >= 0")
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
        _check(self.context_length >= 16, "context_length", "must be >= 16")
        _check(
            0 < self.default_max_tokens < self.context_length,
            "default_max_tokens",
            "must be > 0 and below context_length",
        )
        _check(self.max_stop_sequences >= 0, "max_stop_sequences", "must be >= 0")
        _check(self.max_stop_chars >= 1, "max_stop_chars", "must be >= 1")
        _check(self.stream_buffer >= 2, "stream_buffer", "must be >= 2")
        _check(self.stall_timeout_s > 0, "stall_timeout_s", "must be > 0")
        _check(self.max_message_bytes >= 1024, "max_message_bytes", "must be >= 1024")
        _check(self.grace_s >= 0, "grace_s", "must be >= 0")
        _check(self.switch_interval_ms > 0, "switch_interval_ms", "must be > 0")
        _check(self.warmup_steps >= 0, "warmup_steps", "must be >= 0")
        _check(self.torch_threads >= 0, "torch_threads", "must be >= 0 (0 = all cores but one)")

    @classmethod
    def from_args(cls, argv: Sequence[str] | None = None) -> Settings:
        """Parses command-line flags (`--max-queue 8`, ...); raises ValueError naming a bad setting."""
        parser = argparse.ArgumentParser(prog="sluice serve", description="Run the Sluice gRPC server.")
        add_arguments(parser)
        return from_namespace(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds one flag per Settings field, typed from the field's default."""
    for f in fields(Settings):
        flag = "--" + f.name.replace("_", "-")
        default = f.default
        if f.name == "models":
            parser.add_argument(flag, default=",".join(DEFAULT_MODELS), help="comma-separated model names")
        elif f.name == "plugins":
            parser.add_argument(flag, default="", help="comma-separated modules that call register_model()")
        elif f.name == "hf_models":
            parser.add_argument(flag, default="", help="comma-separated NAME=DIR of Hugging Face causal LMs")
        elif f.name == "max_concurrency":
            parser.add_argument(flag, type=int, default=None, help="slots (default: derived from memory)")
        else:
            parser.add_argument(flag, type=type(default), default=default)


def from_namespace(ns: argparse.Namespace) -> Settings:
    values = {f.name: getattr(ns, f.name) for f in fields(Settings)}
    for name in ("models", "plugins", "hf_models"):
        values[name] = tuple(m.strip() for m in str(values[name]).split(",") if m.strip())
    return Settings(**values)


def _check(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise ValueError(f"invalid setting {name}: {message}")
