"""Structured outputs, tools and logits settings in OpenAI's and vLLM's request shapes, and their
translation into the Generate request's constraint, tools and sampling fields: `response_format`
(`json_object`, `json_schema` with `strict`), vLLM's `guided_json` / `guided_regex` / `guided_choice` /
`guided_grammar` and its newer `structured_outputs`, `tools` / `tool_choice` / `parallel_tool_calls`, and
`presence_penalty`, `frequency_penalty`, `repetition_penalty`, `logit_bias`, `stop_token_ids`."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from shim.proto_values import Int32, Text
from wire.constraint import Constraint, Tool, ToolChoice

Penalty = Annotated[float, Field(ge=-2, le=2)]
Bias = Annotated[float, Field(ge=-100, le=100)]


class ParamError(ValueError):
    """A parameter at odds with the rest of the request; `param` names it for the error's `param`."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class OneConstraint(ParamError):
    """Two ways of constraining the output at once; `param` names the second."""

    def __init__(self, param: str) -> None:
        super().__init__(
            param, f"{param}: only one of response_format, structured_outputs and guided_* may be set"
        )


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Text = Field(min_length=1, max_length=64)
    description: Text | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs` (its guided_* fields, grouped)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    json_: dict[str, Any] | Text | None = Field(default=None, alias="json")
    regex: Text | None = None
    choice: list[Text] | None = None
    grammar: Text | None = None
    json_object: StrictBool | None = None


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Text = Field(min_length=1, max_length=64)
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class ToolParam(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Text


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["function"]
    function: NamedFunction


class Shaping(BaseModel):
    """The fields both generation routes take (mixed into their request models)."""

    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: Annotated[float, Field(gt=0)] | None = None
    logit_bias: dict[Annotated[str, Field(pattern=r"^\d{1,10}$")], Bias] | None = None
    stop_token_ids: Annotated[list[Int32], Field(max_length=64)] | None = None
    guided_json: dict[str, Any] | Text | None = None
    guided_regex: Text | None = None
    guided_choice: Annotated[list[Text], Field(min_length=1)] | None = None
    guided_grammar: Text | None = None
    structured_outputs: StructuredOutputs | None = None
    response_format: ResponseFormat | None = None  # OpenAI's on chat; vLLM takes it on completions too

    def _constraints(self) -> list[tuple[str, Constraint]]:
        found: list[tuple[str, Constraint]] = []
        if self.guided_json is not None:
            found.append(("guided_json", _schema(self.guided_json)))
        if self.guided_regex is not None:
            found.append(("guided_regex", Constraint.regex(self.guided_regex)))
        if self.guided_choice is not None:
            found.append(("guided_choice", Constraint.choice(self.guided_choice)))
        if self.guided_grammar is not None:
            found.append(("guided_grammar", Constraint.grammar(self.guided_grammar)))
        s = self.structured_outputs
        if s is not None:
            if s.json_ is not None:
                found.append(("structured_outputs.json", _schema(s.json_)))
            if s.regex is not None:
                found.append(("structured_outputs.regex", Constraint.regex(s.regex)))
            if s.choice is not None:
                found.append(("structured_outputs.choice", Constraint.choice(s.choice)))
            if s.grammar is not None:
                found.append(("structured_outputs.grammar", Constraint.grammar(s.grammar)))
            if s.json_object:
                found.append(("structured_outputs.json_object", Constraint.json_object()))
        return found

    def constraint(self) -> Constraint | None:
        """The one constraint asked for, or None; two are refused naming the second."""
        found = [*response_constraint(self.response_format), *self._constraints()]
        if len(found) > 1:
            raise OneConstraint(found[1][0])
        return found[0][1] if found else None


def _schema(value: dict[str, Any] | str) -> Constraint:
    return Constraint.json_schema(value if isinstance(value, str) else json.dumps(value))


def response_constraint(response_format: ResponseFormat | None) -> list[tuple[str, Constraint]]:
    if response_format is None or response_format.type == "text":
        return []
    if response_format.type == "json_object":
        return [("response_format", Constraint.json_object())]
    spec = response_format.json_schema
    if spec is None:
        raise ValueError("response_format of type json_schema needs its json_schema")
    schema = spec.schema_ if spec.schema_ is not None else {"type": "object"}
    # strict is OpenAI's guarantee: what cannot be enforced is refused. Without it OpenAI takes any schema
    # and tries; here every keyword that can be enforced still is, and the rest is ignored.
    return [("response_format", Constraint.json_schema(json.dumps(schema), lenient=not spec.strict))]


def tools_of(tools: list[ToolParam] | None) -> tuple[Tool, ...]:
    return tuple(
        Tool(
            t.function.name,
            t.function.description or "",
            json.dumps(t.function.parameters) if t.function.parameters is not None else "",
            strict=bool(t.function.strict),
        )
        for t in tools or ()
    )


def tool_choice_of(choice: Literal["none", "auto", "required"] | NamedToolChoice | None) -> ToolChoice | None:
    if choice is None:
        return None
    if isinstance(choice, NamedToolChoice):
        return ToolChoice("required", choice.function.name)
    return ToolChoice(choice)
