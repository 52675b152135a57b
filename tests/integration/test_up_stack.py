"""Issue 18, acceptance 4: `sluice up --auth-keys K --tls-cert C --tls-key K2 --cors-allow-origins O`, run as
written (plus free ports), configures the whole stack: the openai SDK is served with a key and refused
without one, the shim reaches the server over TLS trusting C (the gRPC port refuses plaintext, and the server
itself asks for the key), and a browser preflight from O asking for `Authorization` is allowed."""

from __future__ import annotations

import hashlib
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from clients import SluiceClient, UnauthenticatedError, UnavailableError, tls_credentials
from tests.support import byte_lm_reference
from tests.support.processes import ROOT, Process

trustme = pytest.importorskip("trustme")
SLUICE = str(Path(sys.executable).parent / "sluice")
TOKEN = "up-stack-secret-token"
ORIGIN = "https://app.example.com"


@dataclass(frozen=True)
class Stack:
    up: Process
    grpc_target: str
    http_url: str
    ca: Path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    folder = tmp_path_factory.mktemp("up-stack")
    keys = folder / "keys.toml"
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    keys.write_text(f'[[tenant]]\nname = "web"\ntoken_sha256 = "{digest}"\n')
    authority = trustme.CA()
    issued = authority.issue_cert("127.0.0.1", "localhost")
    ca, cert, key = folder / "ca.pem", folder / "cert.pem", folder / "key.pem"
    authority.cert_pem.write_to_path(ca)
    issued.cert_chain_pems[0].write_to_path(cert)
    issued.private_key_pem.write_to_path(key)
    # Exactly the acceptance's command; only the ports are free ones, so the test runs beside anything.
    command = [SLUICE, "up", "--auth-keys", str(keys), "--tls-cert", str(cert), "--tls-key", str(key)]
    command += ["--cors-allow-origins", ORIGIN, "--grpc-port", "0", "--http-port", "0"]
    up = Process("up", command, cwd=ROOT, stderr_path=folder / "stderr.log", die_with_parent=True)
    try:
        banner = up.wait_for_line(r"sluice up: gRPC on (\S+), HTTP on (\S+); Ctrl-C stops both")
        yield Stack(up, banner.group(1), banner.group(2), ca)
        up.signal(signal.SIGTERM)  # `up` stops both children and reports a clean stop
        assert up.proc.wait(90) == 0, up.diagnostics()
    finally:
        up.stop(30)


def test_the_openai_sdk_is_served_with_the_key(stack: Stack) -> None:
    messages = [{"role": "user", "content": "Once upon a time"}]
    with openai.OpenAI(base_url=f"{stack.http_url}/v1", api_key=TOKEN, max_retries=0) as client:
        reply = client.chat.completions.create(model="byte-lm", messages=messages, max_tokens=8, seed=5)  # type: ignore[arg-type]
    # What the seeded model says to that conversation: the stack served the model, not something.
    expected = byte_lm_reference.generate(byte_lm_reference.chat_prompt(messages), 8, seed=5)
    assert reply.choices[0].message.content == byte_lm_reference.text(expected)
    assert reply.usage is not None and reply.usage.completion_tokens == len(expected)


def test_a_call_without_the_key_is_refused_at_the_shim(stack: Stack) -> None:
    body = {"model": "byte-lm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    assert httpx.post(f"{stack.http_url}/v1/chat/completions", json=body, timeout=30).status_code == 401
    with (
        openai.OpenAI(base_url=f"{stack.http_url}/v1", api_key="not-a-key", max_retries=0) as client,
        pytest.raises(openai.AuthenticationError),
    ):
        client.chat.completions.create(model="byte-lm", messages=[{"role": "user", "content": "hi"}])


def test_the_grpc_port_speaks_tls_with_the_certificate_and_asks_for_the_key(stack: Stack) -> None:
    x = {"x": np.ones(512, np.float32)}
    with SluiceClient(stack.grpc_target, timeout=5) as plaintext, pytest.raises(UnavailableError):
        plaintext.list_models()
    credentials = tls_credentials(stack.ca)
    with (
        SluiceClient(stack.grpc_target, credentials=credentials) as anonymous,
        pytest.raises(UnauthenticatedError),
    ):
        anonymous.infer("mlp", x)
    with SluiceClient(stack.grpc_target, credentials=credentials, token=TOKEN) as client:
        assert client.infer("mlp", x).outputs["y"].shape == (512,)


def test_a_preflight_from_the_allowed_origin_may_send_authorization(stack: Stack) -> None:
    preflight = {
        "Origin": ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    answer = httpx.options(f"{stack.http_url}/v1/chat/completions", headers=preflight, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.headers["access-control-allow-origin"] == ORIGIN
    allowed = {h.strip().lower() for h in answer.headers["access-control-allow-headers"].split(",")}
    assert {"authorization", "content-type"} <= allowed
    other = httpx.options(
        f"{stack.http_url}/v1/chat/completions", headers={**preflight, "Origin": "https://evil.example"}
    )
    assert "access-control-allow-origin" not in other.headers


def test_the_shims_upstream_is_tls_pinned_to_the_servers_certificate(stack: Stack) -> None:
    # What `up` started: the shim got --upstream-ca C (C itself; no CA flag was given) and the keys too.
    shim_line = next(line for line in _command_lines(stack.up.pid) if " -m shim " in f" {line} ")
    assert f"--upstream-ca {stack.ca.parent / 'cert.pem'}" in shim_line
    assert f"--auth-keys {stack.ca.parent / 'keys.toml'}" in shim_line
    assert f"--cors-allow-origins {ORIGIN}" in shim_line


def _command_lines(parent: int) -> list[str]:
    lines = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            if f"PPid:\t{parent}\n" not in status.read_text():
                continue
            raw = (status.parent / "cmdline").read_bytes()
        except OSError:
            continue
        lines.append(" ".join(part.decode() for part in raw.split(b"\0") if part))
    return lines
