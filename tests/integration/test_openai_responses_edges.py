"""Issue 31, item 4 for the Responses family: its routes go through what every route goes through. Behind a
keys file a caller without a token is refused (401, OpenAI's shape); a stored response is another token's
404; the request's id and tenant reach both access logs, with its tokens in the shim's; /metrics counts the
routes by template; one trace spans shim and server, the shim's span with the GenAI usage."""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.otlp import OtlpReceiver, otlp_receiver
from tests.support.processes import ServerProcess, ShimProcess, start_server, start_shim, wait_until

ALPHA, BETA = "responses-alpha-token", "responses-beta-token"
CALL = "sluice.inference.v1.InferenceService/Generate"


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with otlp_receiver() as running:
        yield running


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, receiver: OtlpReceiver
) -> Iterator[tuple[ServerProcess, ShimProcess]]:
    keys = tmp_path_factory.mktemp("responses") / "keys.toml"
    keys.write_text(
        "".join(
            f'[[tenant]]\nname = "{name}"\ntoken_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n'
            for name, token in (("alpha", ALPHA), ("beta", BETA))
        )
    )
    common = ("--auth-keys", str(keys), "--access-log", "1", "--otlp-endpoint", receiver.endpoint)
    server = start_server("--models", "byte-lm", *common)
    shim = start_shim(server.target, *common)
    yield server, shim
    shim.terminate()
    assert server.terminate() == 0, server.diagnostics()


def logged(path: Path | None, request_id: str) -> dict[str, object]:
    assert path is not None

    def found() -> list[dict[str, object]]:
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]
        return [line for line in lines if line.get("request_id") == request_id]

    wait_until(lambda: bool(found()), what=request_id)
    return found()[0]


def test_tokens_access_logs_metrics_and_traces(
    stack: tuple[ServerProcess, ShimProcess], receiver: OtlpReceiver
) -> None:
    server, shim = stack
    url = f"{shim.url}/v1/responses"
    body = {"model": "byte-lm", "input": "hi", "max_output_tokens": 4}
    refused = httpx.post(url, json=body, timeout=30)
    assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"

    trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    headers = {
        **bearer(ALPHA),
        "x-request-id": "resp-edge-1",
        "traceparent": f"00-{trace_id}-{caller_span}-01",
    }
    answer = httpx.post(url, json=body, headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    made = answer.json()
    assert made["id"] == "resp_resp-edge-1" and answer.headers["x-sluice-tenant"] == "alpha"

    # Stored per token: the other tenant's token sees nothing, neither by id nor as previous_response_id.
    assert httpx.get(f"{url}/{made['id']}", headers=bearer(BETA), timeout=30).status_code == 404
    chained = httpx.post(
        url, json={**body, "previous_response_id": made["id"]}, headers=bearer(BETA), timeout=30
    )
    assert chained.status_code == 404 and chained.json()["error"]["param"] == "previous_response_id"
    kept = httpx.get(f"{url}/{made['id']}", headers=bearer(ALPHA), timeout=30)
    assert kept.status_code == 200 and kept.json() == made

    in_shim = logged(shim.stderr_path, "resp-edge-1")
    assert (in_shim["tenant"], in_shim["path"], in_shim["status"]) == ("alpha", "/v1/responses", 200)
    assert in_shim["completion_tokens"] == made["usage"]["output_tokens"] and in_shim["model"] == "byte-lm"
    in_server = logged(server.stderr_path, "resp_resp-edge-1")
    assert (in_server["tenant"], in_server["method"]) == ("alpha", "Generate")

    counted = httpx.get(f"{shim.url}/metrics", timeout=30).text
    assert 'route="/v1/responses",status="200"' in counted
    assert 'route="/v1/responses/{response_id}",status="404"' in counted

    wait_until(
        lambda: {"POST /v1/responses", CALL} <= {s.name for s in receiver.spans(trace_id)}, what="spans"
    )
    spans = receiver.spans(trace_id)
    edge = next(s for s in spans if s.name == "POST /v1/responses")
    call = next(s for s in spans if s.name == CALL)
    assert edge.parent_span_id == caller_span and call.parent_span_id == edge.span_id
    assert edge.attributes["http.route"] == "/v1/responses"
    assert edge.attributes["gen_ai.usage.output_tokens"] == made["usage"]["output_tokens"]
