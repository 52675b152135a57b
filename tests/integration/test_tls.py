"""Issue 11, acceptance 1 (the gRPC port): TLS and mTLS with certificates made here (trustme). The Python
client and grpcurl call a TLS server; a plaintext client gets no answer on the TLS port; under mTLS a
client without a certificate is refused; rotating the server certificate under a 32-caller load fails no
call, and new connections get the new certificate."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from clients import SluiceClient, UnavailableError, tls_credentials
from tests.support.processes import ServerProcess, start_server, wait_until

trustme = pytest.importorskip("trustme")
GRPCURL = shutil.which("grpcurl") or str(Path(sys.executable).parent / "grpcurl")
X = {"x": np.ones(512, np.float32)}


@dataclass(frozen=True)
class Pki:
    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path
    authority: object


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("sluice-test-client")
    paths = {name: folder / f"{name}.pem" for name in ("ca", "cert", "key", "client_cert", "client_key")}
    ca.cert_pem.write_to_path(paths["ca"])
    server.cert_chain_pems[0].write_to_path(paths["cert"])
    server.private_key_pem.write_to_path(paths["key"])
    client.cert_chain_pems[0].write_to_path(paths["client_cert"])
    client.private_key_pem.write_to_path(paths["client_key"])
    return Pki(**paths, authority=ca)


@pytest.fixture(scope="module")
def tls_server(pki: Pki) -> Iterator[ServerProcess]:
    server = start_server("--models", "mlp", "--tls-cert", str(pki.cert), "--tls-key", str(pki.key))
    yield server
    assert server.terminate() == 0


def test_the_python_client_and_grpcurl_call_a_tls_server(tls_server: ServerProcess, pki: Pki) -> None:
    with SluiceClient(tls_server.target, credentials=tls_credentials(pki.ca)) as client:
        assert client.infer("mlp", X).outputs["y"].shape == (512,)
    listed = subprocess.run(
        [GRPCURL, "-cacert", str(pki.ca), "-max-time", "30", tls_server.target, "list"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert "sluice.inference.v1.InferenceService" in listed.stdout


def test_a_plaintext_client_gets_no_answer_on_the_tls_port(tls_server: ServerProcess) -> None:
    with SluiceClient(tls_server.target, timeout=5) as client, pytest.raises(UnavailableError):
        client.list_models()


def test_under_mtls_only_a_client_with_a_certificate_is_served(pki: Pki) -> None:
    tls = ["--tls-cert", str(pki.cert), "--tls-key", str(pki.key), "--tls-client-ca", str(pki.ca)]
    server = start_server("--models", "mlp", *tls)
    try:
        anonymous = tls_credentials(pki.ca)
        with (
            SluiceClient(server.target, timeout=5, credentials=anonymous) as client,
            pytest.raises(UnavailableError),
        ):
            client.list_models()
        mutual = tls_credentials(pki.ca, cert=pki.client_cert, key=pki.client_key)
        with SluiceClient(server.target, credentials=mutual) as client:
            assert client.infer("mlp", X).outputs["y"].shape == (512,)
        called = subprocess.run(
            [GRPCURL, "-cacert", str(pki.ca), "-cert", str(pki.client_cert), "-key", str(pki.client_key),
             "-max-time", "30", server.target, "list"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert called.returncode == 0, called.stderr
    finally:
        assert server.terminate() == 0


def served_certificate(port: int, ca: Path) -> bytes:
    """The DER certificate a new TLS connection to the port is shown."""
    context = ssl.create_default_context(cafile=str(ca))
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def test_rotating_the_certificate_under_load_fails_no_call(pki: Pki, tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    shutil.copy(pki.cert, cert)
    shutil.copy(pki.key, key)
    server = start_server("--models", "mlp", "--tls-cert", str(cert), "--tls-key", str(key))
    failures: list[BaseException] = []
    calls = [0]
    stop = threading.Event()

    def caller() -> None:
        with SluiceClient(server.target, credentials=tls_credentials(pki.ca)) as client:
            while not stop.is_set():
                try:
                    client.infer("mlp", X)
                    calls[0] += 1
                except BaseException as exc:  # every failure is the test's business
                    failures.append(exc)
                    return

    def new_connection_calls() -> None:  # a caller that connects after the rotation
        with SluiceClient(server.target, credentials=tls_credentials(pki.ca)) as client:
            client.infer("mlp", X)

    try:
        old = served_certificate(server.port, pki.ca)
        threads = [threading.Thread(target=caller) for _ in range(32)]
        for thread in threads:
            thread.start()
        before = calls[0]
        renewed = pki.authority.issue_cert("127.0.0.1", "localhost")  # type: ignore[attr-defined]
        # As a rotation tool would: each file replaced at once (written aside, then renamed).
        for target, pem in ((key, renewed.private_key_pem), (cert, renewed.cert_chain_pems[0])):
            pem.write_to_path(target.with_suffix(".new"))
            target.with_suffix(".new").replace(target)
        new = served_certificate(server.port, pki.ca)
        new_connection_calls()
        # The load goes on across the rotation.
        wait_until(lambda: calls[0] >= before + 200 or bool(failures), what="200 calls after the rotation")
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        stop.set()
        assert server.terminate() == 0
    assert not failures, failures[:3]
    assert new != old and new == ssl.PEM_cert_to_DER_cert(cert.read_text())


def test_the_shim_calls_an_mtls_upstream_and_serves_https_with_rotation(pki: Pki, tmp_path: Path) -> None:
    import httpx

    from tests.support.processes import start_shim

    tls = ["--tls-cert", str(pki.cert), "--tls-key", str(pki.key), "--tls-client-ca", str(pki.ca)]
    server = start_server("--models", "mlp", *tls)
    cert, key = tmp_path / "shim-cert.pem", tmp_path / "shim-key.pem"
    shutil.copy(pki.cert, cert)
    shutil.copy(pki.key, key)
    upstream = ["--upstream-ca", str(pki.ca), "--upstream-cert", str(pki.client_cert)]
    upstream += ["--upstream-key", str(pki.client_key)]
    shim = start_shim(server.target, *upstream, "--tls-cert", str(cert), "--tls-key", str(key))
    body = {
        "model": "mlp",
        "inputs": [{"name": "x", "dtype": "FLOAT32", "shape": [512], "data": [1.0] * 512}],
    }
    try:
        assert shim.url.startswith("https://")
        with httpx.Client(base_url=shim.url, verify=ssl.create_default_context(cafile=str(pki.ca))) as http:
            assert http.post("/v1/infer", json=body).status_code == 200
            old = served_certificate(shim.port, pki.ca)
            renewed = pki.authority.issue_cert("127.0.0.1", "localhost")  # type: ignore[attr-defined]
            for target, pem in ((key, renewed.private_key_pem), (cert, renewed.cert_chain_pems[0])):
                pem.write_to_path(target.with_suffix(".new"))
                target.with_suffix(".new").replace(target)
            wanted = ssl.PEM_cert_to_DER_cert(cert.read_text())
            # The shim checks its files each second.
            wait_until(lambda: served_certificate(shim.port, pki.ca) == wanted, 15, "the new certificate")
            assert wanted != old
            assert http.post("/v1/infer", json=body).status_code == 200  # its open connection still works
    finally:
        shim.terminate()
        assert server.terminate() == 0


def test_the_node_client_calls_an_mtls_server(pki: Pki) -> None:
    from tests.integration.test_node_client import NODE_DIR

    if shutil.which("node") is None or not (NODE_DIR / "node_modules").is_dir():
        pytest.skip("node or clients/node/node_modules missing (make test-tools runs npm ci)")
    tls = ["--tls-cert", str(pki.cert), "--tls-key", str(pki.key), "--tls-client-ca", str(pki.ca)]
    server = start_server("--models", "mlp", *tls)
    try:
        mutual = ["--ca", str(pki.ca), "--cert", str(pki.client_cert), "--key", str(pki.client_key)]
        for flags, ok in ((mutual, True), (["--ca", str(pki.ca)], False)):
            out = subprocess.run(
                ["node", "cli.js", "--target", server.target, "--timeout", "5", *flags, "models"],
                cwd=NODE_DIR, capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert (out.returncode == 0) == ok, out.stderr
            if ok:
                assert '"mlp"' in out.stdout
    finally:
        assert server.terminate() == 0


def test_plaintext_on_a_non_loopback_interface_is_warned_about() -> None:
    server = start_server("--models", "mlp", "--host", "0.0.0.0")
    try:
        assert server.stderr_path is not None
        warned = "without TLS" in server.stderr_path.read_text()
    finally:
        assert server.terminate() == 0
    assert warned
