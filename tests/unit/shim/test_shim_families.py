"""families.py: a refusal is answered in the shape of the family whose route serves the request (before
routing too), whatever its path; which requests are the API follows the families' router prefixes."""

from __future__ import annotations

import pytest
from conftest import RunningShim, ShimFactory
from fastapi import APIRouter, FastAPI, Request

from shim.errors import ShimError
from shim.families import Families, families_of
from shim.jsonio import JsonResponse

pytestmark = pytest.mark.anyio

SHIM_KEYS = {"code", "message", "reason", "domain", "metadata", "field_violations", "retry_after_s"}
OPENAI_KEYS = {"message", "type", "param", "code"}
NOT_JSON = {"content": b"{}", "headers": {"Content-Type": "text/plain"}}


def stub_shape(error: ShimError) -> JsonResponse:
    return JsonResponse({"stub": error.body.reason}, status_code=error.status, headers=error.headers)


def stub_router(prefix: str) -> APIRouter:
    router = APIRouter(prefix=prefix)

    @router.post("/stub")
    async def stub(request: Request) -> JsonResponse:
        return JsonResponse({"ok": True})

    return router


async def test_a_refusal_before_routing_takes_the_shape_of_the_route_it_is_for(shim: RunningShim) -> None:
    openai = await shim.client.post("/v1/chat/completions", **NOT_JSON)  # type: ignore[arg-type]
    native = await shim.client.post("/v1/infer", **NOT_JSON)  # type: ignore[arg-type]
    assert (openai.status_code, native.status_code) == (415, 415)
    assert set(openai.json()["error"]) == OPENAI_KEYS
    assert set(native.json()["error"]) == SHIM_KEYS


async def test_a_wrong_method_is_the_routes_family_and_an_unknown_path_no_familys(shim: RunningShim) -> None:
    wrong_method = await shim.client.get("/v1/chat/completions")
    assert wrong_method.status_code == 405
    assert set(wrong_method.json()["error"]) == OPENAI_KEYS
    # A path no route serves belongs to no family, whatever it begins with.
    unknown = await shim.client.get("/v1/chat/nothing")
    assert unknown.status_code == 404
    assert set(unknown.json()["error"]) == SHIM_KEYS
    assert "x-request-id" in unknown.headers  # still the API's: under a family's prefix


async def test_a_family_attached_later_has_its_shape_and_prefix(start_shim: ShimFactory) -> None:
    shim = await start_shim(max_body_bytes=64)
    families_of(shim.app).attach(shim.app, stub_router("/v2"), error_shape=stub_shape)
    assert (await shim.client.post("/v2/stub", json={})).json() == {"ok": True}
    too_large = await shim.client.post("/v2/stub", json={"x": "y" * 100})  # refused by admission
    assert too_large.status_code == 413
    assert too_large.json() == {"stub": "REQUEST_TOO_LARGE"}
    assert "x-request-id" in too_large.headers


def test_api_roots_are_the_family_prefixes_and_a_family_needs_one() -> None:
    app, families = FastAPI(), Families()
    families.attach(app, stub_router("/v1"), error_shape=stub_shape)
    families.attach(app, stub_router("/v1"), error_shape=stub_shape)
    assert families.api_roots == ("/v1/",)
    assert families.in_api("/v1/anything") and not families.in_api("/healthz")
    assert not families.in_api("/v10/x")
    with pytest.raises(ValueError, match="prefix"):
        families.attach(app, stub_router(""), error_shape=stub_shape)


async def test_openapi_holds_every_familys_component_schemas(shim: RunningShim) -> None:
    document = (await shim.client.get("/openapi.json")).json()
    assert {"ChatCompletionRequest", "ErrorResponse"} <= set(document["components"]["schemas"])
    assert "/v1/infer" in document["paths"]


async def test_openapi_documents_every_error_a_route_can_answer_in_its_familys_shape(
    shim: RunningShim,
) -> None:
    document = (await shim.client.get("/openapi.json")).json()
    paths = document["paths"]

    def error_schema(path: str, method: str, status: int) -> object:
        return paths[path][method]["responses"][str(status)]["content"]["application/json"]["schema"]

    # Every status the gRPC-code table maps to, and the body refusals on a route that reads a body.
    for path, method in [
        ("/v1/chat/completions", "post"),
        ("/v1/infer", "post"),
        ("/v2/models/{name}/infer", "post"),
    ]:
        documented = {int(status) for status in paths[path][method]["responses"]}
        assert {400, 401, 403, 404, 408, 413, 415, 422, 429, 500, 503, 504} <= documented, path
    assert "413" not in paths["/v1/models"]["get"]["responses"]  # no body, no body refusal
    assert error_schema("/v1/chat/completions", "post", 429) == {"$ref": "#/components/schemas/ErrorResponse"}
    assert error_schema("/v1/infer", "post", 404) == {"$ref": "#/components/schemas/SluiceError"}
    assert error_schema("/v2/models/{name}/infer", "post", 404)["properties"] == {"error": {"type": "string"}}
    # FastAPI's own 422 body is not what the shim answers.
    assert error_schema("/v1/infer", "post", 422) == {"$ref": "#/components/schemas/SluiceError"}
    # A probe's 503 has a shape of its own; /metrics is Prometheus' text.
    assert "503" in paths["/readyz"]["get"]["responses"]
    assert set(paths["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
