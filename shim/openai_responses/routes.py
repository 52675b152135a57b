"""The Responses family's routes: POST /v1/responses (parse -> the conversation so far -> one Generate call
run by the shim's generation serving, shim.stream.serving -> the response object or its events, kept when
`store` is true), and GET / DELETE /v1/responses/{id} on the kept ones (shim/openai_responses/store.py)."""

from __future__ import annotations

import re
import string
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from sluice.inference.v1 import inference_pb2 as pb
from starlette.responses import Response

from shim.errors import ShimError
from shim.families import FamilyRoute
from shim.jsonio import JsonResponse
from shim.openai_responses import conversation
from shim.openai_responses.answer import ResponseHead, ending, new_id, output_items
from shim.openai_responses.events import response_events
from shim.openai_responses.refusals import parse, response_not_found
from shim.openai_responses.request_models import ResponsesRequest
from shim.openai_responses.store import ResponseStore, owner
from shim.openapi import documented
from shim.request_metrics import request_metrics
from shim.stream.consumer import Choice
from shim.stream.serving import serve_generation
from wire.metadata import USER

router = APIRouter(prefix="/v1", tags=["openai-responses"], route_class=FamilyRoute)
PATH = "/v1/responses"
_USER_FORWARD_LIMIT = 256
_PRINTABLE = string.punctuation.replace("%", "") + " "
_INDEXED = re.compile(r"\[\d+\].*$")
# Server-side proto paths -> the parameter a caller of this API set.
_PARAM_BY_PROTO = {"chat.messages": "input", "sampling.max_tokens": "max_output_tokens", "tools": "tools"}


def responses_param(proto_path: str) -> str:
    if proto_path.startswith("constraint"):
        return "text.format"
    path = _INDEXED.sub("", proto_path)
    return _PARAM_BY_PROTO.get(path, path.removeprefix("sampling."))


def store_of(request: Request) -> ResponseStore:
    store: ResponseStore = request.app.state.response_store
    return store


def _metadata(body: ResponsesRequest) -> tuple[tuple[str, str], ...]:
    """`user` (or its successor, `safety_identifier`) for the server's access log, printable ASCII only."""
    user = body.user or body.safety_identifier
    return ((USER, quote(user[:_USER_FORWARD_LIMIT], safe=_PRINTABLE)),) if user else ()


@router.post("/responses", **documented(ResponsesRequest, "ResponseObject", streams=True))
async def create_response(request: Request) -> Response:
    body = parse(await request.body(), ResponsesRequest)
    store, caller = store_of(request), owner()
    earlier: conversation.Conversation = ()
    if body.previous_response_id is not None:
        kept = store.get(body.previous_response_id, owner=caller)
        if kept is None:
            raise response_not_found(body.previous_response_id, param="previous_response_id")
        earlier = kept.conversation
    turns = conversation.turns(body, earlier)
    head = ResponseHead(body, new_id("resp"), int(time.time()))

    def finished(
        response: dict[str, Any], text: str, calls: Sequence[pb.ToolCall], timings: pb.GenerateTimings
    ) -> None:
        usage = response["usage"]
        # The request's span and access-log line get its tokens and timings, as the other routes' do.
        counted = {"prompt_tokens": usage["input_tokens"], "completion_tokens": usage["output_tokens"]}
        request_metrics(counted, [timings], model=body.model)
        if body.store:
            store.put(response, conversation.answered(turns, text, calls), owner=caller)

    def answer(choices: list[Choice]) -> Response:
        choice = choices[0]
        if choice.error is not None:
            raise ShimError(choice.error)
        status, incomplete = ending(choice.finish_reason)
        output = output_items(choice.text, choice.tool_calls)
        if incomplete is not None:
            for item in output:
                item["status"] = "incomplete"
        response = head.response(status=status, output=output, usage=choice.usage, incomplete=incomplete)
        finished(response, choice.text, choice.tool_calls, choice.timings)
        return JsonResponse(response)

    return await serve_generation(
        request,
        lambda priority: [conversation.generate_request(body, turns, request_id=head.id, priority=priority)],
        stream=body.stream,
        answer=answer,
        events=lambda calls, heartbeat_s: response_events(
            head, calls, heartbeat_s=heartbeat_s, finished=finished
        ),
        metadata=_metadata(body),
        json_field=responses_param,
        timed_as=PATH,
    )


@router.get("/responses/{response_id}", **documented(None, "ResponseObject"))
async def retrieve_response(request: Request, response_id: str) -> JsonResponse:
    kept = store_of(request).get(response_id, owner=owner())
    if kept is None:
        raise response_not_found(response_id, param=None)
    return JsonResponse(kept.response)


@router.delete("/responses/{response_id}", **documented(None, "ResponseDeleted"))
async def delete_response(request: Request, response_id: str) -> JsonResponse:
    if not store_of(request).delete(response_id, owner=owner()):
        raise response_not_found(response_id, param=None)
    return JsonResponse({"id": response_id, "object": "response", "deleted": True})
