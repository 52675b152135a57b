"""process/otlp_target.py: the collector from --otlp-endpoint and the standard OTEL_EXPORTER_OTLP_* variables,
each per-signal variable over the generic one and the flag over both, parsed by the SDK's own helpers; a
value that cannot be used stops the start with a message naming the variable."""

from __future__ import annotations

import marshal
import os
from pathlib import Path

import pytest

from process.otlp_target import CollectorTarget, collector_target, resolve_endpoint


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)


def test_the_flag_wins_then_the_traces_endpoint_then_the_generic_one(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_endpoint(None) is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://generic:4317")
    assert resolve_endpoint(None) == "http://generic:4317"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:4317")
    assert resolve_endpoint(None) == "http://traces:4317"
    assert resolve_endpoint("flag:4317") == "flag:4317"
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert resolve_endpoint("flag:4317") is None and collector_target("flag:4317") is None


def test_headers_and_compression_per_signal_over_generic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20generic")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    generic = collector_target("http://collector:4317/")
    assert generic == CollectorTarget(
        "collector:4317", False, (("authorization", "Bearer generic"),), compression="gzip"
    )
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "X-Key=a,x-tenant=t1")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "none")
    target = collector_target("collector:4317")
    assert target is not None and target.headers == (("x-key", "a"), ("x-tenant", "t1"))
    assert target.compression is None and not target.secure


def test_an_unknown_compression_stops_the_start_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "brotli")
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_TRACES_COMPRESSION='brotli'"):
        collector_target("collector:4317")


@pytest.mark.parametrize("header", ["x-key=caf%C3%A9", "grpc-timeout=1S", "x-key-bin=AAAA", "x%20key=v"])
def test_a_header_grpc_cannot_send_stops_the_start(monkeypatch: pytest.MonkeyPatch, header: str) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", f"x-ok=1,{header}")
    with pytest.raises(
        ValueError, match=r"OTEL_EXPORTER_OTLP_TRACES_HEADERS: .* is not a header gRPC can send"
    ):
        collector_target("collector:4317")


def test_tls_reads_the_certificates_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_bytes(b"CA")
    (tmp_path / "client.pem").write_bytes(b"CERT")
    (tmp_path / "client.key").write_bytes(b"KEY")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(tmp_path / "missing.pem"))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", str(tmp_path / "ca.pem"))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", str(tmp_path / "client.pem"))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_CLIENT_KEY", str(tmp_path / "client.key"))
    target = collector_target("https://collector:4317")
    assert target == CollectorTarget(
        "collector:4317", True, certificate=b"CA", client_key=b"KEY", client_certificate=b"CERT"
    )
    assert CollectorTarget.from_wire(marshal.loads(marshal.dumps(target.to_wire()))) == target
    plain = collector_target("http://collector:4317")  # plaintext: no certificate is read
    assert plain is not None and not plain.secure and plain.certificate is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "false")
    bare = collector_target("collector:4317")  # a bare host:port is TLS when told it is not insecure
    assert bare is not None and bare.secure
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE")
    with pytest.raises(ValueError, match=r"OTEL_EXPORTER_OTLP_CERTIFICATE=.*missing\.pem"):
        collector_target("https://collector:4317")
