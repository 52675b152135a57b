"""The generate extension: `{"text_input": ..., "parameters": {...}}` to a Generate model through the
server's ModelStreamInfer, answered whole (/generate) or as SSE events, one per streamed response
(/generate_stream). The client leaving ends the SSE body, which cancels the gRPC stream and so frees the
server's slot. An error the stream reports becomes the HTTP status its code maps to (before any text) or
a final `{"error": ...}` event."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import orjson
from sluice.kserve.v2 import grpc_service_pb2 as v2
from sluice.kserve.v2 import grpc_service_pb2_grpc as v2_grpc
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from shim.admission.request_body import parse_json
from shim.errors import ErrorBody, ShimError, upstream_errors
from shim.jsonio import JsonResponse
from shim.kserve.translate import set_parameter
from shim.refusals import invalid_argument
from shim.upstream.channel import settings_of
from wire import errors as reasons
from wire.kserve import parse_stream_error

TEXT_INPUT, TEXT_OUTPUT = "text_input", "text_output"
_LENGTH_PREFIX = 4


def generate_request(model: str, version: str, body: bytes) -> v2.ModelInferRequest:
    """Top-level fields other than text_input, id and parameters are parameters too (as Triton's
    generate endpoint takes `max_tokens` beside the prompt)."""
    document = parse_json(body)
    if not isinstance(document, dict) or not isinstance(document.get(TEXT_INPUT), str):
        raise invalid_argument(
            f"the body must be an object with a string {TEXT_INPUT!r}", reason=reasons.INVALID_ARGUMENT
        )
    message = v2.ModelInferRequest(model_name=model, model_version=version, id=str(document.get("id", "")))
    text = document[TEXT_INPUT].encode()
    message.inputs.add(name=TEXT_INPUT, datatype="BYTES", shape=[1])
    message.raw_input_contents.append(len(text).to_bytes(_LENGTH_PREFIX, "little") + text)
    parameters = document.get("parameters", {})
    if not isinstance(parameters, dict):
        raise invalid_argument("parameters must be an object", reason=reasons.INVALID_ARGUMENT)
    extra = {k: v for k, v in document.items() if k not in (TEXT_INPUT, "id", "parameters")}
    for name, value in {**extra, **parameters}.items():
        set_parameter(message.parameters, name, value)
    set_parameter(message.parameters, "triton_enable_empty_final_response", True)
    return message


def _text(response: v2.ModelInferResponse) -> str:
    for index, output in enumerate(response.outputs):
        if output.name == TEXT_OUTPUT and index < len(response.raw_output_contents):
            return response.raw_output_contents[index][_LENGTH_PREFIX:].decode(errors="replace")
    return ""


def _stream_error(text: str) -> ShimError:
    code, reason, message = parse_stream_error(text)
    status_code = grpc.StatusCode[code] if code in grpc.StatusCode.__members__ else grpc.StatusCode.UNKNOWN
    return ShimError(ErrorBody(code=status_code, message=message, reason=reason or None))


def _event(response: v2.ModelInferResponse) -> dict[str, Any]:
    event: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    event[TEXT_OUTPUT] = _text(response)
    if response.id:
        event["id"] = response.id
    finish = response.parameters.get("finish_reason")
    if finish is not None:
        event["finish_reason"] = finish.string_param
    return event


def _is_final(response: v2.ModelInferResponse) -> bool:
    flag = response.parameters.get("triton_final_response")
    return flag is not None and flag.bool_param


async def answer(
    request: Request,
    stub: v2_grpc.GRPCInferenceServiceAsyncStub,
    message: v2.ModelInferRequest,
    *,
    timeout_s: float,
) -> Response:
    settings = settings_of(request)
    call = stub.ModelStreamInfer(iter([message]), timeout=min(timeout_s, settings.generate_timeout_s))
    pieces, last = [], None
    try:
        with upstream_errors(reconnect_s=settings.reconnect_backoff_s):
            async for streamed in call:
                if streamed.error_message:
                    raise _stream_error(streamed.error_message)
                pieces.append(_text(streamed.infer_response))
                last = streamed.infer_response
                if _is_final(last):
                    break
    finally:
        call.cancel()
    if last is None:
        raise _stream_error("UNAVAILABLE UPSTREAM_PROTOCOL_ERROR: the stream ended without an answer")
    whole = _event(last)
    whole[TEXT_OUTPUT] = "".join(pieces)
    return JsonResponse(whole)


def events(
    request: Request,
    stub: v2_grpc.GRPCInferenceServiceAsyncStub,
    message: v2.ModelInferRequest,
    *,
    timeout_s: float,
) -> Response:
    settings = settings_of(request)

    async def body() -> AsyncIterator[bytes]:
        call = stub.ModelStreamInfer(iter([message]), timeout=min(timeout_s, settings.generate_timeout_s))
        try:
            async for streamed in call:
                if streamed.error_message:
                    yield _sse({"error": parse_stream_error(streamed.error_message)[2]})
                    return
                yield _sse(_event(streamed.infer_response))
                if _is_final(streamed.infer_response):
                    return
        except grpc.aio.AioRpcError as exc:
            yield _sse({"error": exc.details() or exc.code().name})
        finally:
            call.cancel()  # the client left (the body is cancelled) or the answer is complete

    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _sse(event: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(event) + b"\n\n"
