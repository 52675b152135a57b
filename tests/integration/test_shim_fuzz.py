"""A bounded, deterministic fuzz of the shim in front of the real server: random JSON documents, near-valid
bodies with hostile values, random and truncated bytes, and the cases that once answered 500, POSTed to
/v1/infer and /v1/generate. No answer may be a 5xx, every error is in the documented shape, and afterwards
both processes serve a normal request with nothing left in flight."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.processes import ServerProcess, ShimProcess, wait_until

PATHS = ("/v1/infer", "/v1/generate")
ERROR_KEYS = {"code", "message", "reason", "domain", "metadata", "field_violations", "retry_after_s"}
JSON_HEADERS = {"content-type": "application/json"}
# Deterministic and bounded: a few hundred examples in all, no example database between runs.
FUZZ = settings(
    max_examples=120,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Text with everything JSON can spell, lone surrogates ("\udc80") included (hypothesis leaves them out
# unless asked).
texts = st.text(st.characters(exclude_categories=[]) | st.characters(categories=["Cs"]), max_size=12)
integers = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 2**31, 2**63, 2**64, -(2**63) - 1]),
    st.integers(0, 8),
)
scalars = st.one_of(
    st.none(), st.booleans(), integers, st.floats(allow_nan=False, allow_infinity=False), texts
)
json_documents = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)


def mostly(valid: st.SearchStrategy[Any], hostile: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A value that is valid seven times in eight, so that many bodies reach the server and its models."""
    return st.integers(0, 7).flatmap(lambda roll: hostile if roll == 0 else valid)


def with_extras(
    required: dict[str, st.SearchStrategy[Any]], optional: dict[str, st.SearchStrategy[Any]]
) -> st.SearchStrategy[dict[str, Any]]:
    """Documents with the required fields (now and then one left out), any of the optional ones, and now
    and then a key the schema does not know."""
    body = st.fixed_dictionaries(required, optional=optional)
    dropped = mostly(st.none(), st.sampled_from(list(required)))
    unknown = mostly(st.just({}), st.dictionaries(texts, scalars, min_size=1, max_size=1))
    return st.builds(
        lambda doc, drop, junk: {key: value for key, value in {**doc, **junk}.items() if key != drop},
        body,
        dropped,
        unknown,
    )


plain_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=16)
floats = st.floats(-1e6, 1e6, allow_nan=False)
mlp_data = st.builds(lambda value: [value] * 512, floats)
mlp_data_b64 = st.builds(
    lambda value: base64.b64encode(np.full(512, value, dtype="<f4").tobytes()).decode(), floats
)


@st.composite
def tensors(draw: st.DrawFn) -> dict[str, Any]:
    """mlp's input x (512 float32, as data or data_b64), each field hostile now and then."""
    tensor: dict[str, Any] = {
        "name": draw(mostly(st.just("x"), st.sampled_from(["y", ""]) | texts)),
        "dtype": draw(
            mostly(st.just("FLOAT32"), st.sampled_from(["FLOAT64", "INT32", "BOOL", "STRING", "FLOAT8"]))
        ),
        "shape": draw(mostly(st.just([512]), st.lists(integers, max_size=3) | scalars)),
    }
    payload = draw(mostly(st.sampled_from(["data", "data_b64"]), st.sampled_from(["both", "neither"])))
    if payload in ("data", "both"):
        tensor["data"] = draw(mostly(mlp_data, st.lists(scalars, max_size=6) | json_documents))
    if payload in ("data_b64", "both"):
        tensor["data_b64"] = draw(mostly(mlp_data_b64, st.sampled_from(["AAAA\u00e9", "%%%", ""]) | texts))
    return tensor


infer_bodies = with_extras(
    {
        "model": mostly(st.just("mlp"), st.sampled_from(["byte-lm", "nope", ""]) | texts | integers),
        "inputs": mostly(st.lists(tensors(), min_size=1, max_size=1), st.lists(tensors()) | json_documents),
    },
    {
        "parameters": mostly(st.dictionaries(plain_text, scalars, max_size=2), json_documents),
        "priority": mostly(st.sampled_from(["low", "normal", "high"]), st.just("urgent") | scalars),
        "request_id": mostly(plain_text, texts | integers),
    },
)
generate_bodies = with_extras(
    {
        "model": mostly(st.just("byte-lm"), st.sampled_from(["mlp", "nope", ""]) | texts),
        # The other way to give a prompt is among the hostile ones: both at once is refused.
        "prompt": mostly(plain_text.filter(bool), texts | integers | st.none()),
        "prompt_token_ids": mostly(st.none(), st.lists(st.integers(0, 255), max_size=4) | scalars),
        "max_tokens": mostly(st.integers(1, 8), integers | scalars),
    },
    {
        "temperature": mostly(st.floats(0, 2), floats | integers | scalars),
        "top_p": mostly(st.floats(0.01, 1), st.floats(-1, 2) | scalars),
        "top_k": mostly(st.integers(0, 50), integers),
        "seed": mostly(st.integers(0, 2**64 - 1), integers),
        "stop": mostly(st.lists(plain_text.filter(bool), max_size=2), texts | scalars),
        "stream": mostly(st.booleans(), scalars),
        "priority": mostly(st.sampled_from(["low", "normal", "high"]), scalars),
        "request_id": mostly(plain_text, texts),
    },
)


def _infer(*, request_id: str = "", **tensor: Any) -> bytes:
    """An Infer body for mlp whose one input tensor has the given fields (json.dumps escapes surrogates)."""
    fields = {"name": "x", "dtype": "FLOAT32", "shape": [1], **tensor}
    return json.dumps({"model": "mlp", "request_id": request_id, "inputs": [fields]}).encode()


def _generate(raw_field: bytes) -> bytes:
    return b'{"model": "byte-lm", "prompt": "x", ' + raw_field + b"}"


# The bodies that answered 500 before (issue 7, item 6), and their neighbours.
NASTY = [
    b"[" * 1000 + b"]" * 1000,
    _generate(b'"stop": ' + b"[" * 5000 + b"]" * 5000),
    _generate(b'"seed": ' + b"9" * 4301),
    _generate(b'"max_tokens": -' + b"9" * 4400),
    _generate(b'"temperature": Infinity'),
    _generate(b'"temperature": ' + b"9" * 400),
    _generate(b'"stop": "\\ud800"'),
    _generate(b'"request_id": "\\udfff"'),
    b'{"model": "byte-lm", "prompt": "\\udc80"}',
    b'{"model": "byte-lm", "prompt_token_ids": [' + b"1," * 3000 + b"1]}",
    _infer(shape=[2**63], data=[]),
    _infer(shape=[2**32] * 63 + [1], data=[]),
    _infer(request_id="\udc80", data=[1]),
    _infer(name="\udc80", dtype="STRING", data=["\udc80"]),
    _infer(data_b64="AAAA\u00e9"),
    _infer(data_b64="\u00e9AAA").replace(b"\\u00e9", "\u00e9".encode()),  # raw UTF-8, not an escape
    _infer(data=[10**400]),
    _infer(dtype="FLOAT64", data=[10**4000]),
    _infer(shape=[512], data=[1.0] * 511 + [float("nan")]),  # json.dumps writes NaN
    b'{"model": "mlp", "parameters": {"k": ' + b"9" * 30 + b'}, "inputs": []}',
    b"\xff\xfe\x00{",
    b"",
]


@pytest.fixture(scope="module")
def http(shim: ShimProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=shim.url, timeout=30) as client:
        yield client


def check(http: httpx.Client, path: str, body: bytes) -> None:
    """Posts `body`: below 500, and an error in the documented shape; streams are read to their end."""
    with http.stream("POST", path, content=body, headers=JSON_HEADERS) as response:
        content = response.read()
    assert response.status_code < 500, (path, body[:300], content[:500])
    if response.status_code >= 400:
        error = json.loads(content)["error"]
        assert set(error) == ERROR_KEYS, content[:500]
        assert isinstance(error["message"], str) and error["reason"], content[:500]
    elif response.headers["content-type"].startswith("application/json"):
        json.loads(content)


def encode(document: Any) -> bytes:
    # ensure_ascii writes lone surrogates as \\udXXX escapes, as a hostile client would.
    return json.dumps(document).encode()


@pytest.mark.parametrize("body", NASTY, ids=range(len(NASTY)))
@pytest.mark.parametrize("path", PATHS)
def test_nasty_bodies(http: httpx.Client, path: str, body: bytes) -> None:
    check(http, path, body)


@FUZZ
@given(path=st.sampled_from(PATHS), document=json_documents)
def test_random_json_documents(http: httpx.Client, path: str, document: Any) -> None:
    check(http, path, encode(document))


@FUZZ
@given(body=infer_bodies)
def test_near_valid_infer_bodies(http: httpx.Client, body: dict[str, Any]) -> None:
    check(http, "/v1/infer", encode(body))


@FUZZ
@given(body=generate_bodies)
def test_near_valid_generate_bodies(http: httpx.Client, body: dict[str, Any]) -> None:
    check(http, "/v1/generate", encode(body))


@FUZZ
@given(path=st.sampled_from(PATHS), data=st.data())
def test_random_and_truncated_bytes(http: httpx.Client, path: str, data: st.DataObject) -> None:
    valid = {"/v1/infer": infer_bodies, "/v1/generate": generate_bodies}[path]
    whole = encode(data.draw(valid))
    body = data.draw(st.binary(max_size=64) | st.integers(0, len(whole)).map(lambda end: whole[:end]))
    check(http, path, body)


def test_both_processes_serve_afterwards_with_nothing_in_flight(
    http: httpx.Client, server: ServerProcess
) -> None:
    wait_until(lambda: http.get("/readyz").json()["inflight"] == 0, what="the shim's in-flight count at 0")
    wait_until(
        lambda: server.metric("sluice_requests_in_flight") == 0, what="the server's in-flight count at 0"
    )
    ones = {"name": "x", "dtype": "FLOAT32", "shape": [512], "data": [1.0] * 512}
    infer = http.post("/v1/infer", json={"model": "mlp", "inputs": [ones]})
    assert infer.status_code == 200, infer.text
    generated = http.post(
        "/v1/generate", json={"model": "byte-lm", "prompt": "ok", "max_tokens": 3, "ignore_eos": True}
    )
    assert generated.status_code == 200, generated.text
    assert generated.json()["usage"]["completion_tokens"] == 3
    ready = http.get("/readyz")
    assert (ready.status_code, ready.json()["inflight"]) == (200, 0)
