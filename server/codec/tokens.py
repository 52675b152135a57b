"""Tokenize and Detokenize messages <-> domain: the prompt (text, or a conversation and its tools, decoded
as a Generate's are, so that both name the same fields) and the answers."""

from __future__ import annotations

from sluice.inference.v1 import inference_pb2 as pb

from server.codec.constraints import decode_tool_list
from server.codec.messages import decode_chat
from server.domain import TokenizeSpec
from server.errors import InvalidArgument


def _model(request: pb.TokenizeRequest | pb.DetokenizeRequest) -> str:
    if not request.model:
        raise InvalidArgument("model must be set", field="model")
    return request.model


def decode_tokenize(request: pb.TokenizeRequest) -> TokenizeSpec:
    """An empty text is a prompt of no tokens (vLLM counts it so); tools go with a conversation only."""
    model = _model(request)
    which = request.WhichOneof("prompt")
    if which is None:
        raise InvalidArgument("set the prompt as text or chat", field="text")
    tools = decode_tool_list(request.tools)
    if tools and which != "chat":
        raise InvalidArgument("tools need a chat prompt", field="tools")
    return TokenizeSpec(
        model=model,
        text=request.text if which == "text" else None,
        chat=decode_chat(request.chat) if which == "chat" else None,
        tools=tools,
        add_special_tokens=request.add_special_tokens,
        add_generation_prompt=(
            not request.HasField("add_generation_prompt") or request.add_generation_prompt
        ),
    )


def decode_detokenize(request: pb.DetokenizeRequest) -> tuple[str, tuple[int, ...]]:
    """The model and the token ids (checked against its vocabulary where the model is known)."""
    return _model(request), tuple(request.token_ids)


def encode_tokenize(
    request: pb.TokenizeRequest, token_ids: list[int], *, context_length: int
) -> pb.TokenizeResponse:
    return pb.TokenizeResponse(
        model=request.model,
        token_ids=token_ids,
        context_length=context_length,
        request_id=request.request_id,
    )


def encode_detokenize(request: pb.DetokenizeRequest, text: str) -> pb.DetokenizeResponse:
    return pb.DetokenizeResponse(model=request.model, text=text, request_id=request.request_id)
