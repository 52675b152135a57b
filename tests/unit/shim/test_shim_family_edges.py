"""A family declares its edges through attach (issue 35, item 1): the headers that carry its callers' token,
what browsers may send it, a path it shares with another family (chosen by a request header), and it serves
generations through the shared orchestration (shim.stream.serving) instead of a copy of OpenAI's."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from conftest import ShimFactory, Upstream
from fastapi import APIRouter, FastAPI, Request
from sluice.inference.v1 import inference_pb2 as pb
from starlette.datastructures import Headers
from starlette.responses import Response

import shim.anthropic
import shim.app
from shim.admission.auth import BEARER, TokenHeader, check, needs
from shim.cors import CorsHeaders
from shim.errors import ShimError
from shim.families import Families, FamilyRoute, families_of
from shim.jsonio import JsonResponse
from shim.stream.consumer import Choice
from shim.stream.serving import serve_generation

pytestmark = pytest.mark.anyio

TOKEN = "edge-secret"
X_API_KEY = TokenHeader("x-api-key")
SELECTOR = "anthropic-version"
ORIGIN = "http://app.example"


def stub_shape(error: ShimError) -> JsonResponse:
    return JsonResponse({"type": "error", "error": error.body.message}, status_code=error.status)


async def _no_events(calls: Any, heartbeat_s: float) -> Any:  # pragma: no cover - the stub never streams
    yield b""


def stub_router() -> APIRouter:
    """A family in the shape of Anthropic's: its own /v1/messages, and its own view of /v1/models."""
    router = APIRouter(prefix="/v1", route_class=FamilyRoute)

    @router.post("/messages")
    async def messages(request: Request) -> Response:
        def answer(choices: list[Choice]) -> Response:
            return JsonResponse({"type": "message", "content": [{"type": "text", "text": choices[0].text}]})

        return await serve_generation(
            request,
            lambda priority: [pb.GenerateRequest(model="gen", text="hello")],
            stream=False,
            answer=answer,
            events=_no_events,
        )

    @router.get("/models")
    async def stub_models(request: Request) -> JsonResponse:
        return JsonResponse({"data": [], "has_more": False, "first_id": None, "last_id": None})

    return router


class StubFamily:
    """A family folder's __init__, as shim.app's FAMILIES sees it."""

    @staticmethod
    def attach(app: FastAPI) -> None:
        families_of(app).attach(
            app,
            stub_router(),
            error_shape=stub_shape,
            token_headers=(X_API_KEY,),
            cors=CorsHeaders(allow_prefixes=("anthropic-",)),
            selected_by=SELECTOR,
        )


@pytest.fixture
def with_stub_family(monkeypatch: pytest.MonkeyPatch) -> None:
    # In place of the real Anthropic family (shim/anthropic), whose paths and selector it takes.
    families = tuple(family for family in shim.app.FAMILIES if family is not shim.anthropic)
    monkeypatch.setattr(shim.app, "FAMILIES", (*families, StubFamily))


@pytest.fixture
def keys(tmp_path: Path) -> str:
    path = tmp_path / "keys.toml"
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    path.write_text(f'[[tenant]]\nname = "edge"\ntoken_sha256 = "{digest}"\n')
    return str(path)


@pytest.mark.usefixtures("with_stub_family")
async def test_each_family_reads_the_token_headers_it_declares(start_shim: ShimFactory, keys: str) -> None:
    running = await start_shim(auth_keys=keys)
    client = running.client
    served = await client.post("/v1/messages", json={}, headers={"x-api-key": TOKEN})
    assert served.status_code == 200, served.text
    assert served.json()["content"][0]["text"] == "hello"
    missing = await client.post("/v1/messages", json={}, headers={"authorization": f"Bearer {TOKEN}"})
    assert missing.status_code == 401
    assert missing.json() == {"type": "error", "error": "this API needs `x-api-key: <token>`"}
    # The native family declares none: the default headers, and not the stub family's.
    echo = {"model": "echo", "inputs": [{"name": "x", "dtype": "FLOAT32", "shape": [1], "data": [1]}]}
    assert (await client.post("/v1/infer", json=echo, headers={"x-api-key": TOKEN})).status_code == 401
    assert (await client.post("/v1/infer", json=echo, headers={"api-key": TOKEN})).status_code == 200
    bearer = await client.post("/v1/infer", json=echo, headers={"authorization": f"Bearer {TOKEN}"})
    assert bearer.status_code == 200
    # A path no family serves: a token the shim knows, in any family's header, gets as far as the 404.
    unknown = await client.get("/v1/nothing", headers={"x-api-key": TOKEN})
    assert unknown.status_code == 404


@pytest.mark.usefixtures("with_stub_family")
async def test_a_shared_path_goes_to_the_family_its_header_selects(
    start_shim: ShimFactory, upstream: Upstream
) -> None:
    client = (await start_shim()).client
    openai = await client.get("/v1/models")
    assert openai.status_code == 200 and openai.json()["object"] == "list"
    selected = await client.get("/v1/models", headers={SELECTOR: "2023-06-01"})
    assert selected.json() == {"data": [], "has_more": False, "first_id": None, "last_id": None}
    # Refused before routing (a wrong method), each in its own family's shape.
    assert set((await client.post("/v1/models", json={})).json()["error"]) == {
        "message",
        "type",
        "param",
        "code",
    }
    selected_refusal = await client.post("/v1/models", json={}, headers={SELECTOR: "2023-06-01"})
    assert selected_refusal.status_code == 405 and selected_refusal.json()["type"] == "error"
    # Only the shared path and method are split: OpenAI still answers its other model routes.
    assert (await client.get("/v1/models/echo", headers={SELECTOR: "x"})).json()["id"] == "echo"
    document = (await client.get("/openapi.json")).json()
    assert "ModelList" in str(document["paths"]["/v1/models"]["get"]["responses"]["200"])


@pytest.mark.usefixtures("with_stub_family")
async def test_browsers_may_send_what_the_families_declare(start_shim: ShimFactory) -> None:
    client = (await start_shim(cors_allow_origins=(ORIGIN,))).client

    async def preflight(headers: str) -> int:
        answer = await client.options(
            "/v1/messages",
            headers={
                "Origin": ORIGIN,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": headers,
            },
        )
        return int(answer.status_code)

    assert await preflight("content-type, x-api-key, anthropic-version, anthropic-beta") == 200
    assert await preflight("authorization, api-key, x-stainless-lang, openai-project") == 200  # OpenAI's
    assert await preflight("x-api-key, x-undeclared") == 400


def test_a_token_header_reads_its_scheme_and_names_itself_in_the_refusal() -> None:
    basic = TokenHeader("Authorization", scheme="Basic")
    assert basic.token("Basic abc ") == "abc" and basic.token("Bearer abc") is None
    assert BEARER.token("bearer  tok") == "tok" and BEARER.token("Bearer ") is None
    assert X_API_KEY.token(" tok") == " tok"
    assert needs((BEARER, TokenHeader("api-key"))) == (
        "this API needs `Authorization: Bearer <token>` (or `api-key: <token>`)"
    )
    with pytest.raises(ShimError, match="x-api-key"):
        check([], Headers({"authorization": f"Bearer {TOKEN}"}), (X_API_KEY,))


def test_sharing_a_path_needs_family_routes_on_both_sides() -> None:
    app, families = FastAPI(), Families()
    plain = APIRouter(prefix="/v1")

    @plain.get("/models")
    async def listing() -> None:  # pragma: no cover - never called
        return None

    families.attach(app, plain, error_shape=stub_shape)
    with pytest.raises(ValueError, match="FamilyRoute"):
        families.attach(app, stub_router(), error_shape=stub_shape, selected_by=SELECTOR)
    with pytest.raises(ValueError, match="token"):
        families.attach(app, stub_router(), error_shape=stub_shape, token_headers=())
