"""POST /v1/load_lora_adapter and /v1/unload_lora_adapter, as vLLM serves them: one unary call each to the
server (shim/upstream/unary.py), answered `Success: ...` as text; a refusal in OpenAI's error shape, an
adapter not loaded a 404 naming it."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sluice.inference.v1 import inference_pb2 as pb
from starlette.responses import PlainTextResponse, Response

from shim.admission.request_body import parse_json, validation_error
from shim.errors import ShimError
from shim.families import FamilyRoute
from shim.openapi import documented
from shim.upstream.call_options import CallOptions
from shim.upstream.unary import call_unary

router = APIRouter(tags=["lora"], route_class=FamilyRoute)
_ANSWER = {"type": "string"}


class LoadLoraAdapterRequest(BaseModel):
    """vLLM's body: the adapter's model name and its PEFT directory on the server's file system."""

    model_config = ConfigDict(extra="forbid")
    lora_name: str = Field(min_length=1, max_length=256)
    lora_path: str = Field(min_length=1, max_length=4096)
    base_model_name: str | None = Field(default=None, max_length=256)


class UnloadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str = Field(min_length=1, max_length=256)
    lora_int_id: int | None = None  # vLLM's body may carry it; the name decides


def _parse(raw: bytes, schema: type[BaseModel]) -> Any:
    document = parse_json(raw)
    try:
        return schema.model_validate(document)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        raise ShimError(validation_error(errors, document=document).body, status=400) from None


@router.post("/v1/load_lora_adapter", **documented(LoadLoraAdapterRequest, None, media=("text/plain",)))
async def load_lora_adapter(request: Request) -> Response:
    body: LoadLoraAdapterRequest = _parse(await request.body(), LoadLoraAdapterRequest)

    def start(stub: Any, options: CallOptions) -> Any:
        message = pb.LoadLoraAdapterRequest(
            lora_name=body.lora_name, lora_path=body.lora_path, base_model_name=body.base_model_name or ""
        )
        return stub.LoadLoraAdapter(message, timeout=options.timeout_s)

    answer = await call_unary(request, start, timed_as="/v1/load_lora_adapter")
    if isinstance(answer, Response):
        return answer
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@router.post("/v1/unload_lora_adapter", **documented(UnloadLoraAdapterRequest, None, media=("text/plain",)))
async def unload_lora_adapter(request: Request) -> Response:
    body: UnloadLoraAdapterRequest = _parse(await request.body(), UnloadLoraAdapterRequest)

    def start(stub: Any, options: CallOptions) -> Any:
        message = pb.UnloadLoraAdapterRequest(lora_name=body.lora_name)
        return stub.UnloadLoraAdapter(message, timeout=options.timeout_s)

    answer = await call_unary(request, start, timed_as="/v1/unload_lora_adapter")
    if isinstance(answer, Response):
        return answer
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
