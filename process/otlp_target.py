"""Where and how the server's spans are sent (CollectorTarget): `--otlp-endpoint` and OpenTelemetry's standard
`OTEL_EXPORTER_OTLP_*` variables, read once at start-up into a frozen object the export process is handed
(process/trace_export.py), so that the server's spans reach the same collector, with the same headers,
compression and certificates, as the shim's (whose SDK exporter reads the same variables itself).

The variables' names are the SDK's (opentelemetry.sdk.environment_variables); headers are parsed by the
SDK's own parser and compression by its exporter's. Each setting is the per-signal variable
(`OTEL_EXPORTER_OTLP_TRACES_HEADERS`) if set, else the generic one (`OTEL_EXPORTER_OTLP_HEADERS`); the
endpoint is `--otlp-endpoint`, else `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else `OTEL_EXPORTER_OTLP_ENDPOINT`
(the SDK's own order: an explicit argument, then the signal's variable, then the generic one).

TLS: an `https://` endpoint, or a bare `host:port` with `OTEL_EXPORTER_OTLP_[TRACES_]INSECURE=false`;
`http://` and a bare `host:port` are plaintext (Sluice's rule before these variables were read)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

from opentelemetry.sdk import environment_variables as names

# What gRPC sends as metadata (validate_metadata.cc); "-bin" keys would need bytes.
_METADATA_KEY = re.compile(r"[0-9a-z_.-]+(?<!-bin)")
_METADATA_VALUE = re.compile(r"[\x20-\x7e]*")

EXPORT_TIMEOUT_S = 5.0  # a collector that takes longer loses that attempt, not the process's time


@dataclass(frozen=True, slots=True)
class CollectorTarget:
    """A collector's OTLP/gRPC TraceService, as the export process dials it."""

    target: str  # host:port, as grpc dials it
    secure: bool
    headers: tuple[tuple[str, str], ...] = ()  # gRPC metadata sent with every export
    compression: str | None = None  # "gzip" or None
    # PEM contents, read at start-up (a missing file stops the start, not the spans later).
    certificate: bytes | None = None
    client_key: bytes | None = None
    client_certificate: bytes | None = None
    timeout_s: float = EXPORT_TIMEOUT_S

    def to_wire(self) -> tuple[Any, ...]:
        """Plain values for the export process's first frame (marshal): headers never go on a command line."""
        return astuple(self)

    @classmethod
    def from_wire(cls, values: tuple[Any, ...]) -> CollectorTarget:
        target, secure, headers, *rest = values
        return cls(target, secure, tuple(tuple(pair) for pair in headers), *rest)


def resolve_endpoint(flag: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """`--otlp-endpoint`, else the traces endpoint variable, else the generic one; None (tracing off) when
    none is set or `OTEL_SDK_DISABLED=true`."""
    environ = os.environ if environ is None else environ
    if environ.get(names.OTEL_SDK_DISABLED, "").strip().lower() == "true":
        return None
    for value in (
        flag,
        environ.get(names.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT),
        environ.get(names.OTEL_EXPORTER_OTLP_ENDPOINT),
    ):
        if value and value.strip():
            return value.strip()
    return None


def collector_target(flag: str | None) -> CollectorTarget | None:
    """The collector the server's spans go to, from `--otlp-endpoint` and the environment; None when tracing
    is off. Raises ValueError naming the variable whose value cannot be used."""
    endpoint = resolve_endpoint(flag)
    if endpoint is None:
        return None
    # The exporter's parsers load with tracing only: a server without it imports none of the SDK's exporter.
    from opentelemetry.exporter.otlp.proto.grpc.exporter import (
        InvalidCompressionValueException,
        environ_to_compression,
    )
    from opentelemetry.util.re import parse_env_headers

    target = endpoint.partition("://")[2] or endpoint
    target = target.split("/", 1)[0]  # OTLP/gRPC has no path
    secure = tls(endpoint)
    headers_name, headers = _pick(names.OTEL_EXPORTER_OTLP_TRACES_HEADERS, names.OTEL_EXPORTER_OTLP_HEADERS)
    compression_name, compression = _pick(
        names.OTEL_EXPORTER_OTLP_TRACES_COMPRESSION, names.OTEL_EXPORTER_OTLP_COMPRESSION
    )
    gzip = False
    if compression and compression.strip().lower() != "none":  # the spec's "none"; the SDK knows only gzip
        try:
            gzip = environ_to_compression(compression_name) is not None
        except InvalidCompressionValueException as exc:
            raise ValueError(f"{compression_name}={compression!r}: OTLP/gRPC takes gzip or none") from exc
    pems = [
        _pem(*_pick(signal, generic)) if secure else None
        for signal, generic in (
            (names.OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE, names.OTEL_EXPORTER_OTLP_CERTIFICATE),
            (names.OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY, names.OTEL_EXPORTER_OTLP_CLIENT_KEY),
            (names.OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE, names.OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE),
        )
    ]
    pairs = tuple(parse_env_headers(headers, liberal=True).items())
    for key, value in pairs:  # gRPC would fail every export (INTERNAL): the start fails instead
        if (
            not _METADATA_KEY.fullmatch(key)
            or key.startswith("grpc-")
            or not _METADATA_VALUE.fullmatch(value)
        ):
            raise ValueError(
                f"{headers_name}: {key!r} is not a header gRPC can send (a name of lower-case letters, "
                "digits and '-_.', not grpc-* or *-bin; a value of printable ASCII)"
            )
    return CollectorTarget(
        target,
        secure,
        headers=pairs,
        compression="gzip" if gzip else None,
        certificate=pems[0],
        client_key=pems[1],
        client_certificate=pems[2],
    )


def tls(endpoint: str) -> bool:
    """Whether the collector at `endpoint` is dialled with TLS (this module's rule, the shim's too)."""
    scheme, separator, _ = endpoint.partition("://")
    if separator:
        return scheme == "https"
    _, insecure = _pick(names.OTEL_EXPORTER_OTLP_TRACES_INSECURE, names.OTEL_EXPORTER_OTLP_INSECURE)
    return insecure.strip().lower() == "false"


def _pick(signal: str, generic: str) -> tuple[str, str]:
    """(name, value) of the per-signal variable if set, else of the generic one ("" when neither is)."""
    if signal in os.environ:
        return signal, os.environ[signal]
    return generic, os.environ.get(generic, "")


def _pem(name: str, path: str) -> bytes | None:
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{name}={path!r} cannot be read: {exc.strerror}") from exc
