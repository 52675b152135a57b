"""The answers of the Responses routes as pydantic models: the schemas /openapi.json publishes (generated
clients and schemathesis check answers against them) and tests validate answers with. The routes build
plain dicts (shim/openai_responses/answer.py); these say what those dicts hold."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

Status = Literal["in_progress", "completed", "incomplete"]


class OutputTextPart(BaseModel):
    type: Literal["output_text"]
    text: str
    annotations: list[Any]
    logprobs: list[Any]


class OutputMessage(BaseModel):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    status: Status
    content: list[OutputTextPart]


class FunctionCallOut(BaseModel):
    id: str
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    status: Status


class InputTokensDetails(BaseModel):
    cached_tokens: int  # prompt tokens the server's prefix cache held


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class ResponseError(BaseModel):
    code: str
    message: str


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseObject(BaseModel):
    """A response, as POST /v1/responses answers it and GET /v1/responses/{id} gives it back."""

    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    error: ResponseError | None
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[Annotated[OutputMessage | FunctionCallOut, Field(discriminator="type")]]
    parallel_tool_calls: bool
    previous_response_id: str | None
    store: bool
    temperature: float | None
    top_p: float | None
    text: dict[str, Any]
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    truncation: Literal["disabled"]
    background: bool
    metadata: dict[str, str]
    user: str | None
    usage: ResponseUsage | None


class ResponseDeleted(BaseModel):
    id: str
    object: Literal["response"]
    deleted: bool
