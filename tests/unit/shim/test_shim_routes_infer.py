"""The native routes other than /v1/generate, against the in-process fake upstream over a real uvicorn."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator

import numpy as np
import pytest
from conftest import RunningShim, ShimFactory, Upstream
from grpc_health.v1 import health_pb2
from raw_http import RawConnections, read_response, request_head
from sluice.inference.v1 import inference_pb2 as pb

pytestmark = pytest.mark.anyio

JSON_TYPE = {"Content-Type": "application/json"}
ECHO = {"model": "echo", "inputs": [{"name": "x", "dtype": "FLOAT32", "shape": [3], "data": [1, 2.5, -4]}]}
ECHO_BYTES = json.dumps(ECHO).encode()


async def test_infer_round_trip(shim: RunningShim, upstream: Upstream) -> None:
    response = await shim.client.post("/v1/infer", json={**ECHO, "request_id": "abc"})
    assert response.status_code == 200
    assert response.json() == {
        "model": "echo",
        "model_version": "7",
        "request_id": "abc",
        "outputs": [{"name": "x_x2", "dtype": "FLOAT32", "shape": [3], "data": [2.0, 5.0, -8.0]}],
        "timings": {"queue_wait_ms": 1.5, "compute_ms": 1250.0, "batch_size": 3},
    }
    sent = upstream.servicer.infer_requests[-1]
    assert np.frombuffer(sent.inputs[0].raw_contents, "<f4").tolist() == [1.0, 2.5, -4.0]
    assert sent.typed_outputs is False
    assert sent.priority == pb.PRIORITY_UNSPECIFIED


async def test_priority_from_body_then_header(shim: RunningShim, upstream: Upstream) -> None:
    await shim.client.post("/v1/infer", json=ECHO, headers={"X-Sluice-Priority": "low"})
    assert upstream.servicer.infer_requests[-1].priority == pb.PRIORITY_LOW
    await shim.client.post(
        "/v1/infer", json={**ECHO, "priority": "high"}, headers={"X-Sluice-Priority": "low"}
    )
    assert upstream.servicer.infer_requests[-1].priority == pb.PRIORITY_HIGH
    bad = await shim.client.post("/v1/infer", json=ECHO, headers={"X-Sluice-Priority": "urgent"})
    assert bad.status_code == 400
    assert bad.json()["error"]["field_violations"][0]["field"] == "X-Sluice-Priority"


async def test_timeout_header_only_shortens_the_deadline(shim: RunningShim, upstream: Upstream) -> None:
    await shim.client.post("/v1/infer", json=ECHO, headers={"X-Sluice-Timeout-Ms": "1500"})
    # Shortened from the 60 s default to 1.5 s; gRPC's wire encoding of the deadline may round it up a little.
    assert upstream.servicer.invocation_metadata[-1]["time_remaining"] < 2
    await shim.client.post("/v1/infer", json=ECHO, headers={"X-Sluice-Timeout-Ms": "99999999"})
    remaining = upstream.servicer.invocation_metadata[-1]["time_remaining"]
    # gRPC rounds deadlines on the wire, so allow a little slack above the 60 s default.
    assert 50 < remaining <= 61
    bad = await shim.client.post("/v1/infer", json=ECHO, headers={"X-Sluice-Timeout-Ms": "soon"})
    assert bad.status_code == 400


async def test_upstream_not_found_keeps_the_rich_details(shim: RunningShim) -> None:
    response = await shim.client.post("/v1/infer", json={**ECHO, "model": "missing"})
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "NOT_FOUND"
    assert error["reason"] == "MODEL_NOT_FOUND"
    assert error["domain"] == "sluice.inference.v1"


async def test_overload_is_429_with_retry_after(shim: RunningShim) -> None:
    response = await shim.client.post("/v1/infer", json={**ECHO, "model": "busy"})
    assert response.status_code == 429
    assert response.headers["retry-after"] == "3"
    assert response.json()["error"]["retry_after_s"] == pytest.approx(2.5)


async def test_upstream_request_too_large_is_413(shim: RunningShim) -> None:
    response = await shim.client.post("/v1/infer", json={**ECHO, "model": "huge"})
    assert response.status_code == 413
    assert response.json()["error"]["reason"] == "REQUEST_TOO_LARGE"


async def test_bad_request_field_violations_pass_through(shim: RunningShim) -> None:
    response = await shim.client.post("/v1/infer", json={**ECHO, "model": "bad-shape"})
    assert response.status_code == 400
    assert response.json()["error"]["field_violations"] == [
        {"field": "inputs[0].shape", "description": "expected [4]", "proto_field": "inputs[0].shape"}
    ]


async def test_unavailable_unary_call_is_retried_by_the_channel(
    shim: RunningShim, upstream: Upstream
) -> None:
    response = await shim.client.post("/v1/infer", json={**ECHO, "model": "flaky"})
    assert response.status_code == 200
    assert upstream.servicer.infer_attempts == 2


async def test_malformed_json_is_400(shim: RunningShim, upstream: Upstream) -> None:
    response = await shim.client.post(
        "/v1/infer", content=b'{"model": ', headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "INVALID_ARGUMENT"
    assert response.json()["error"]["reason"] == "MALFORMED_JSON"
    assert upstream.servicer.infer_attempts == 0


async def test_validation_failure_is_422_naming_json_fields(shim: RunningShim) -> None:
    body = {"model": "echo", "inputs": [{"name": "x", "dtype": "FLOAT8", "shape": [1], "data": [1]}]}
    response = await shim.client.post("/v1/infer", json=body)
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["reason"] == "VALIDATION_FAILED"
    assert [v["field"] for v in error["field_violations"]] == ["inputs[0].dtype"]


async def test_body_over_the_limit_is_refused_from_content_length(
    start_shim: ShimFactory, upstream: Upstream
) -> None:
    small = await start_shim(max_body_bytes=64)
    response = await small.client.post(
        "/v1/infer", content=json.dumps(ECHO).encode() + b" " * 64, headers=JSON_TYPE
    )
    assert response.status_code == 413
    assert response.json()["error"]["reason"] == "REQUEST_TOO_LARGE"
    assert upstream.servicer.infer_attempts == 0


async def test_chunked_body_over_the_limit_is_refused_while_reading(
    start_shim: ShimFactory, upstream: Upstream
) -> None:
    small = await start_shim(max_body_bytes=64)

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b" " * 16

    response = await small.client.post("/v1/infer", content=chunks(), headers=JSON_TYPE)
    assert response.status_code == 413
    assert response.json()["error"]["reason"] == "REQUEST_TOO_LARGE"
    assert upstream.servicer.infer_attempts == 0


async def test_chunked_body_within_the_limit_is_accepted(shim: RunningShim) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        document = json.dumps(ECHO).encode()
        for start in range(0, len(document), 7):
            yield document[start : start + 7]

    response = await shim.client.post("/v1/infer", content=chunks(), headers=JSON_TYPE)
    assert response.status_code == 200


async def test_list_and_get_models(shim: RunningShim) -> None:
    listed = await shim.client.get("/v1/sluice/models")
    assert listed.status_code == 200
    assert [model["name"] for model in listed.json()["models"]] == ["echo"]
    one = await shim.client.get("/v1/sluice/models/echo")
    assert one.json()["description"] == "doubles its input"
    missing = await shim.client.get("/v1/sluice/models/nope")
    assert missing.status_code == 404
    assert missing.json()["error"]["metadata"] == {"model": "nope"}


async def test_unknown_route_uses_the_same_error_shape(shim: RunningShim) -> None:
    response = await shim.client.get("/v1/nothing-here")
    assert response.status_code == 404
    assert set(response.json()["error"]) == {
        "code",
        "message",
        "reason",
        "domain",
        "metadata",
        "field_violations",
        "retry_after_s",
    }


async def test_healthz_and_readyz_follow_upstream_health(shim: RunningShim, upstream: Upstream) -> None:
    assert (await shim.client.get("/healthz")).json() == {"status": "ok"}
    ready = await shim.client.get("/readyz")
    assert ready.status_code == 200
    await upstream.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    not_ready = await shim.client.get("/readyz")
    assert not_ready.status_code == 503
    assert not_ready.json()["upstream"] == "NOT_SERVING"


async def test_readyz_is_503_when_upstream_is_unreachable(start_shim: ShimFactory) -> None:
    orphan = await start_shim(upstream="127.0.0.1:1", ready_timeout_s=0.5)
    response = await orphan.client.get("/readyz")
    assert response.status_code == 503
    assert (await orphan.client.get("/healthz")).status_code == 200


NASTY_BODIES = {
    "nested 100,000 levels": (
        "/v1/infer",
        b'{"model": "echo", "parameters": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        400,
    ),
    "an integer of 5,000 digits": (
        "/v1/generate",
        b'{"model": "gen", "prompt": "x", "seed": ' + b"7" * 5000 + b"}",
        400,
    ),
    "a dimension of 2**63": (
        "/v1/infer",
        json.dumps({**ECHO, "inputs": [{**ECHO["inputs"][0], "shape": [2**63]}]}).encode(),  # type: ignore[dict-item]
        422,
    ),
    "65 dimensions": (
        "/v1/infer",
        json.dumps({**ECHO, "inputs": [{**ECHO["inputs"][0], "shape": [1] * 65}]}).encode(),  # type: ignore[dict-item]
        422,
    ),
    "a lone surrogate in prompt": ("/v1/generate", b'{"model": "gen", "prompt": "\\udc80"}', 400),
    "a lone surrogate in stop": (
        "/v1/generate",
        b'{"model": "gen", "prompt": "x", "stop": ["\\ud800"]}',
        400,
    ),
    "a lone surrogate in request_id": (
        "/v1/infer",
        json.dumps({**ECHO, "request_id": "\udc80"}).encode(),
        400,
    ),
    "a lone surrogate as a parameter name": (
        "/v1/infer",
        json.dumps({**ECHO, "parameters": {"\udc80": 1}}).encode(),
        400,
    ),
    "non-ASCII data_b64": (
        "/v1/infer",
        json.dumps(
            {
                "model": "echo",
                "inputs": [{"name": "x", "dtype": "FLOAT32", "shape": [1], "data_b64": "AAAA\u00e9"}],
            }
        ).encode(),
        400,
    ),
    "a float element past a double": (
        "/v1/infer",
        json.dumps({**ECHO, "inputs": [{**ECHO["inputs"][0], "shape": [1], "data": [10**400]}]}).encode(),  # type: ignore[dict-item]
        400,
    ),
    "NaN": ("/v1/generate", b'{"model": "gen", "prompt": "x", "temperature": NaN}', 400),
}


@pytest.mark.parametrize("case", NASTY_BODIES)
async def test_nasty_bodies_are_4xx_in_the_error_shape_and_the_connection_stays_usable(
    shim: RunningShim, upstream: Upstream, raw: RawConnections, case: str
) -> None:
    path, body, status = NASTY_BODIES[case]
    reader, writer = await raw.open(shim.port)
    headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
    writer.write(request_head("POST", path, headers=headers) + body)
    response = await read_response(reader)
    assert response.status == status, response.body[:500]
    assert set(response.json()["error"]) == {
        "code",
        "message",
        "reason",
        "domain",
        "metadata",
        "field_violations",
        "retry_after_s",
    }
    assert len(response.body) < 16 * 1024
    assert "connection" not in response.headers
    # The same connection serves the next request.
    writer.write(
        request_head("POST", "/v1/infer", headers={**headers, "Content-Length": str(len(ECHO_BYTES))})
    )
    writer.write(ECHO_BYTES)
    assert (await read_response(reader)).status == 200
    assert upstream.servicer.infer_attempts == 1
    assert upstream.servicer.generate_attempts == 0


async def test_a_value_echoed_into_an_error_is_clipped(shim: RunningShim) -> None:
    huge = "s" * 200_000
    body = {"model": "echo", "inputs": [{"name": "x", "dtype": "FLOAT32", "shape": [1], "data": [huge]}]}
    response = await shim.client.post("/v1/infer", json=body)
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert message.startswith("inputs[0].data holds 'sss")
    original = f"inputs[0].data holds {huge!r}, which is not a FLOAT32 element"
    assert message.endswith(f"… ({len(original)} chars)")
    assert len(response.content) < 4096


async def test_a_header_echoed_into_an_error_is_clipped(shim: RunningShim) -> None:
    response = await shim.client.post("/v1/infer", json=ECHO, headers={"X-Sluice-Priority": "u" * 8000})
    assert response.status_code == 400
    assert len(response.content) < 4096
    assert "… (8" in response.json()["error"]["message"]


async def test_non_finite_outputs_are_written_as_proto3_json_strings(shim: RunningShim) -> None:
    # JSON has no literal for them, so the input travels as raw float32; the echo model doubles it.
    raw = np.array([np.inf, -np.inf, np.nan, 1], dtype="<f4").tobytes()
    tensor = {"name": "x", "dtype": "FLOAT32", "shape": [4], "data_b64": base64.b64encode(raw).decode()}
    response = await shim.client.post("/v1/infer", json={"model": "echo", "inputs": [tensor]})
    assert response.status_code == 200
    assert response.json()["outputs"][0]["data"] == ["Infinity", "-Infinity", "NaN", 2.0]


async def test_an_unreachable_upstream_is_503_upstream_unavailable_with_retry_after(
    start_shim: ShimFactory,
) -> None:
    orphan = await start_shim(upstream="127.0.0.1:1", reconnect_backoff_s=2.0)
    response = await orphan.client.post("/v1/infer", json=ECHO)
    assert response.status_code == 503
    assert response.headers["retry-after"] == "2"
    error = response.json()["error"]
    assert (error["code"], error["reason"], error["domain"]) == (
        "UNAVAILABLE",
        "UPSTREAM_UNAVAILABLE",
        "shim.sluice",
    )
    assert error["message"].startswith("the upstream server is unavailable: ")
    assert len(error["message"]) > len("the upstream server is unavailable: ") + 10  # gRPC's reason
    models = await orphan.client.get("/v1/sluice/models")
    assert (models.status_code, models.json()["error"]["reason"]) == (503, "UPSTREAM_UNAVAILABLE")
