"""Decoding of a Generate request's constraint and tools: shape checks that need no model, each naming its
field (the sampling settings check their own ranges: wire/sampling.py). Compiling a constraint against
the model's vocabulary (and its size limits) is the scheduler's (server/constraints/)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from sluice.inference.v1 import inference_pb2 as pb

from server.errors import InvalidArgument, LimitExceeded, clip
from server.logits.grammar import MAX_JSON_DEPTH, json_depth
from wire.constraint import Constraint, Tool, ToolCall, ToolChoice

MAX_TOOLS = 128  # OpenAI's limit on tools per request
MAX_TOOL_NAME = 64
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def decode_constraint(request: pb.GenerateRequest) -> Constraint | None:
    if not request.HasField("constraint"):
        return None
    constraint = Constraint.from_proto(request.constraint)
    if constraint is None:
        raise InvalidArgument("constraint is set but holds no kind", field="constraint")
    if constraint.kind == "choice":
        if not constraint.options:
            raise InvalidArgument("a choice needs at least one option", field="constraint.choice.options")
        for index, option in enumerate(constraint.options):
            if not option:
                raise InvalidArgument(
                    "choice options must not be empty", field=f"constraint.choice.options[{index}]"
                )
    elif constraint.kind != "json_object" and not constraint.text:
        field = {"grammar": "constraint.grammar.text"}.get(constraint.kind, f"constraint.{constraint.kind}")
        raise InvalidArgument(f"the {constraint.kind} constraint is empty", field=field)
    return constraint


def decode_tool_list(messages: Sequence[pb.Tool]) -> tuple[Tool, ...]:
    """The tools of a Generate or a Tokenize request: named as the format allows, schemas JSON, unique."""
    if len(messages) > MAX_TOOLS:
        raise LimitExceeded(
            f"{len(messages)} tools; at most {MAX_TOOLS} are allowed",
            field="tools",
            metadata={"max_tools": MAX_TOOLS},
        )
    tools = []
    for index, message in enumerate(messages):
        tool = Tool.from_proto(message)
        if not tool.name or len(tool.name) > MAX_TOOL_NAME or not set(tool.name) <= _NAME_CHARS:
            raise InvalidArgument(
                f"a tool's name is 1-{MAX_TOOL_NAME} letters, digits, '_' or '-', got {clip(tool.name)!r}",
                field=f"tools[{index}].name",
            )
        _check_parameters(tool, field=f"tools[{index}].parameters_json")
        tools.append(tool)
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise InvalidArgument("tool names must be unique", field="tools")
    return tuple(tools)


def decode_tools(request: pb.GenerateRequest) -> tuple[tuple[Tool, ...], ToolChoice]:
    tools = decode_tool_list(request.tools)
    names = [t.name for t in tools]
    choice = ToolChoice.from_proto(request.tool_choice, has_tools=bool(tools))
    if choice.mode != "none" and not tools and request.HasField("tool_choice"):
        raise InvalidArgument("tool_choice asks for a tool call but no tools are given", field="tool_choice")
    if choice.function is not None and choice.function not in names:
        raise InvalidArgument(
            f"tool_choice names {clip(choice.function)!r}, which is not among the tools",
            field="tool_choice.function",
        )
    if tools and request.WhichOneof("prompt") != "chat":
        raise InvalidArgument("tools need a chat prompt", field="tools")
    if choice.mode == "required" and request.HasField("constraint"):
        raise InvalidArgument("a constraint cannot be combined with a required tool call", field="constraint")
    return tools, choice


def _check_parameters(tool: Tool, *, field: str) -> None:
    """A tool's schema must be JSON: the prompt shows it and a grammar may embed it."""
    if not tool.parameters_json:
        return
    if json_depth(tool.parameters_json) > MAX_JSON_DEPTH:  # scanned first: json.loads would recurse
        raise InvalidArgument(
            f"the parameters of {clip(tool.name)!r} nest deeper than {MAX_JSON_DEPTH} levels", field=field
        )
    try:
        json.loads(tool.parameters_json)
    except ValueError:
        message = f"the parameters of {clip(tool.name)!r} are no JSON document"
        raise InvalidArgument(message, field=field) from None


def decode_tool_calls(calls: list[pb.ToolCall], field: str) -> tuple[ToolCall, ...]:
    out = []
    for index, call in enumerate(calls):
        if not call.name:
            raise InvalidArgument("a tool call needs the function's name", field=f"{field}[{index}].name")
        out.append(ToolCall.from_proto(call))
    return tuple(out)
