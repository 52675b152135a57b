"""The OpenAI routes take their request limits from the server (issue 35, item 6): how many stop sequences a
request may give is the server's `--max-stop-sequences`, checked there alone and refused in OpenAI's shape
(400, `param: stop`); the bound on log-probability alternatives is the one wire/ defines for both sides."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support.processes import ShimProcess, start_server, start_shim
from wire.sampling import MAX_LOGPROBS


@pytest.fixture(scope="module")
def shim_with_six_stops() -> Iterator[ShimProcess]:
    server = start_server("--models", "byte-lm", "--max-stop-sequences", "6")
    shim = start_shim(server.target)
    yield shim
    shim.terminate()
    assert server.terminate() == 0, server.diagnostics()


def completion(shim: ShimProcess, **fields: object) -> httpx.Response:
    body = {"model": "byte-lm", "prompt": "Hi", "max_tokens": 2, **fields}
    return httpx.post(f"{shim.url}/v1/completions", json=body, timeout=60)


def test_the_stop_limit_is_the_servers_setting(shim_with_six_stops: ShimProcess) -> None:
    six = completion(shim_with_six_stops, stop=["#1", "#2", "#3", "#4", "#5", "#6"])
    assert six.status_code == 200, six.text
    seven = completion(shim_with_six_stops, stop=[f"#{i}" for i in range(7)])
    assert seven.status_code == 400, seven.text
    error = seven.json()["error"]
    assert error["param"] == "stop" and error["type"] == "invalid_request_error"
    assert "at most 6" in error["message"]


def test_the_logprobs_bound_is_the_wires(shim_with_six_stops: ShimProcess) -> None:
    assert completion(shim_with_six_stops, logprobs=MAX_LOGPROBS).status_code == 200
    refused = completion(shim_with_six_stops, logprobs=MAX_LOGPROBS + 1)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "logprobs"
