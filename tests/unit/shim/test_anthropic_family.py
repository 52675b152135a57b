"""The Anthropic family's pure parts: which status and type each error answers with (the server's and the
shim's overload as 529 overloaded_error, a caller's own quota as 429 rate_limit_error, both with the retry
hints), and how a conversation of blocks becomes the chat prompt's turns (tool results as tool turns naming
the call they answer, before the user's text)."""

from __future__ import annotations

import json

import grpc
import pytest

from shim.anthropic.errors import error_response
from shim.anthropic.messages import chat_messages, tool_choice_of
from shim.anthropic.request_models import MessagesRequest, ToolChoiceParam
from shim.errors import ErrorBody, ShimError
from wire import errors as reasons
from wire.constraint import ToolChoice


def answered(
    code: grpc.StatusCode, reason: str, retry_after_s: float | None = None
) -> tuple[int, dict, dict]:  # type: ignore[type-arg]
    response = error_response(ShimError(ErrorBody(code, "why", reason=reason, retry_after_s=retry_after_s)))
    return response.status_code, json.loads(response.body), dict(response.headers)


@pytest.mark.parametrize(
    ("code", "reason", "status", "kind"),
    [
        (grpc.StatusCode.RESOURCE_EXHAUSTED, reasons.QUEUE_FULL, 529, "overloaded_error"),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, reasons.OUT_OF_MEMORY, 529, "overloaded_error"),
        (grpc.StatusCode.UNAVAILABLE, reasons.SHIM_OVERLOADED, 529, "overloaded_error"),
        (grpc.StatusCode.UNAVAILABLE, reasons.UPSTREAM_UNAVAILABLE, 529, "overloaded_error"),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, reasons.TENANT_QUOTA, 429, "rate_limit_error"),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, reasons.REQUEST_TOO_LARGE, 413, "request_too_large"),
        (grpc.StatusCode.NOT_FOUND, reasons.MODEL_NOT_FOUND, 404, "not_found_error"),
        (grpc.StatusCode.UNAUTHENTICATED, reasons.UNAUTHENTICATED, 401, "authentication_error"),
        (grpc.StatusCode.PERMISSION_DENIED, reasons.MODEL_NOT_ALLOWED, 403, "permission_error"),
        (grpc.StatusCode.DEADLINE_EXCEEDED, reasons.DEADLINE_EXPIRED, 504, "timeout_error"),
        (grpc.StatusCode.INTERNAL, reasons.INTERNAL, 500, "api_error"),
    ],
)
def test_each_error_has_anthropics_status_and_type(
    code: grpc.StatusCode, reason: str, status: int, kind: str
) -> None:
    got, body, headers = answered(code, reason, retry_after_s=1.5)
    assert (got, body["type"], body["error"]["type"]) == (status, "error", kind)
    assert (headers["retry-after"], headers["retry-after-ms"]) == ("2", "1500")


def test_a_conversation_of_blocks_is_the_chat_prompts_turns() -> None:
    body = MessagesRequest.model_validate(
        {
            "model": "m",
            "max_tokens": 8,
            "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Let me look."},
                        {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Thanks."},
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "text", "text": "24C"}],
                        },
                    ],
                },
            ],
        }
    )
    turns = [(m.role, m.content, m.tool_call_id, m.name) for m in chat_messages(body)]
    assert turns == [
        ("system", "Be brief.", "", ""),
        ("user", "Weather in Paris?", "", ""),
        ("assistant", "Let me look.", "", ""),
        ("tool", "24C", "t1", "get_weather"),
        ("user", "Thanks.", "", ""),
    ]
    calls = chat_messages(body)[2].tool_calls
    assert [(c.id, c.name, json.loads(c.arguments)) for c in calls] == [
        ("t1", "get_weather", {"city": "Paris"})
    ]


def test_tool_choice_maps_to_the_contracts_modes() -> None:
    assert tool_choice_of(ToolChoiceParam(type="any")) == ToolChoice("required")
    assert tool_choice_of(ToolChoiceParam(type="tool", name="f")) == ToolChoice("required", "f")
    assert tool_choice_of(ToolChoiceParam(type="none")) == ToolChoice("none")
    assert tool_choice_of(ToolChoiceParam(type="auto")) == ToolChoice("auto")
    assert tool_choice_of(None) is None
