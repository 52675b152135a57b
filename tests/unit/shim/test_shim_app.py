"""app.py: CORS only when origins are configured (and then outside admission), and an unforeseen
exception answered in the error shape rather than Starlette's plain text."""

from __future__ import annotations

import pytest
from conftest import RunningShim, ShimFactory, Upstream
from fastapi import Request

pytestmark = pytest.mark.anyio

ECHO = {"model": "echo", "inputs": [{"name": "x", "dtype": "FLOAT32", "shape": [1], "data": [1]}]}
ERROR_KEYS = {"code", "message", "reason", "domain", "metadata", "field_violations", "retry_after_s"}


async def test_without_configured_origins_there_are_no_cors_headers(shim: RunningShim) -> None:
    response = await shim.client.post("/v1/infer", json=ECHO, headers={"Origin": "http://evil.example"})
    assert response.status_code == 200
    assert not [name for name in response.headers if name.startswith("access-control-")]
    preflight = await shim.client.options(
        "/v1/infer",
        headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in preflight.headers


async def test_a_cross_site_text_plain_post_starts_nothing(shim: RunningShim, upstream: Upstream) -> None:
    # What a web page's form or fetch() may send to another origin without a preflight.
    response = await shim.client.post(
        "/v1/generate",
        content=b'{"model": "gen", "prompt": "x"}',
        headers={"Content-Type": "text/plain", "Origin": "http://evil.example"},
    )
    assert response.status_code == 415
    assert set(response.json()["error"]) == ERROR_KEYS
    assert upstream.servicer.generate_attempts == 0


async def test_configured_origins_get_cors_answers_and_others_do_not(
    start_shim: ShimFactory, upstream: Upstream
) -> None:
    shim = await start_shim(cors_allow_origins=("http://app.example",))
    preflight = await shim.client.options(
        "/v1/generate",
        headers={
            "Origin": "http://app.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, x-sluice-priority",
        },
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "http://app.example"
    assert "x-sluice-priority" in preflight.headers["access-control-allow-headers"].lower()
    allowed = await shim.client.post("/v1/infer", json=ECHO, headers={"Origin": "http://app.example"})
    assert allowed.headers["access-control-allow-origin"] == "http://app.example"
    # A refusal by admission carries the CORS headers too, so the page can read why.
    refused = await shim.client.post(
        "/v1/infer", content=b"{}", headers={"Origin": "http://app.example", "Content-Type": "text/plain"}
    )
    assert refused.status_code == 415
    assert refused.headers["access-control-allow-origin"] == "http://app.example"
    other = await shim.client.options(
        "/v1/generate", headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}
    )
    assert other.status_code == 400
    assert "access-control-allow-origin" not in other.headers
    assert upstream.servicer.infer_attempts == 1


async def test_an_unforeseen_exception_is_a_500_in_the_error_shape(start_shim: ShimFactory) -> None:
    shim = await start_shim()

    async def broken(request: Request) -> None:
        raise ZeroDivisionError("a bug")

    shim.app.add_api_route("/v1/broken", broken, methods=["GET"])
    response = await shim.client.get("/v1/broken")
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == ERROR_KEYS
    assert (error["code"], error["reason"]) == ("INTERNAL", "SHIM_INTERNAL_ERROR")
    assert "ZeroDivisionError" in error["message"]
    assert "a bug" not in error["message"]  # nothing of the failure's detail is echoed
    assert shim.app.state.inflight.inflight == 0
