"""Constraints and tools: the one shape of what a Generate request says its output must be (a JSON schema,
any JSON object, a regex, a choice, a grammar) and which functions it may call, shared by the clients and
the shim's families (which build requests from it) and the server's codec (which decodes requests into it).
Each maps to and from the proto's Constraint, Tool, ToolChoice and ToolCall messages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sluice.inference.v1 import inference_pb2 as pb

ConstraintKind = Literal["json_schema", "json_object", "regex", "choice", "grammar"]
GrammarSyntax = Literal["lark", "gbnf"]
ToolMode = Literal["none", "auto", "required"]

_SYNTAX_TO_PROTO = {"lark": pb.GRAMMAR_SYNTAX_LARK, "gbnf": pb.GRAMMAR_SYNTAX_GBNF}
_SYNTAX_FROM_PROTO: dict[int, GrammarSyntax] = {
    pb.GRAMMAR_SYNTAX_UNSPECIFIED: "lark",
    pb.GRAMMAR_SYNTAX_LARK: "lark",
    pb.GRAMMAR_SYNTAX_GBNF: "gbnf",
}
_MODE_TO_PROTO = {
    "none": pb.TOOL_CHOICE_MODE_NONE,
    "auto": pb.TOOL_CHOICE_MODE_AUTO,
    "required": pb.TOOL_CHOICE_MODE_REQUIRED,
}


@dataclass(frozen=True, slots=True)
class Constraint:
    """One constraint: `text` is the schema's JSON, the regex or the grammar; `options` the choice's;
    `lenient`: a schema's keywords that cannot be enforced are ignored, not refused."""

    kind: ConstraintKind
    text: str = ""
    options: tuple[str, ...] = ()
    syntax: GrammarSyntax = "lark"
    lenient: bool = False

    @classmethod
    def json_schema(cls, schema_json: str, *, lenient: bool = False) -> Constraint:
        return cls("json_schema", schema_json, lenient=lenient)

    @classmethod
    def json_object(cls) -> Constraint:
        return cls("json_object")

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        return cls("regex", pattern)

    @classmethod
    def choice(cls, options: tuple[str, ...] | list[str]) -> Constraint:
        return cls("choice", options=tuple(options))

    @classmethod
    def grammar(cls, text: str, syntax: GrammarSyntax | None = None) -> Constraint:
        """GBNF where the text defines rules with `::=` (vLLM's guess), else Lark, unless stated."""
        return cls("grammar", text, syntax=syntax or ("gbnf" if "::=" in text else "lark"))

    def to_proto(self) -> pb.Constraint:
        message = pb.Constraint(lenient=self.lenient)
        if self.kind == "json_schema":
            message.json_schema = self.text
        elif self.kind == "json_object":
            message.json_object.SetInParent()
        elif self.kind == "regex":
            message.regex = self.text
        elif self.kind == "choice":
            message.choice.options.extend(self.options)
        else:
            message.grammar.text = self.text
            message.grammar.syntax = _SYNTAX_TO_PROTO[self.syntax]
        return message

    @classmethod
    def from_proto(cls, message: pb.Constraint) -> Constraint | None:
        kind = message.WhichOneof("kind")
        if kind is None:
            return None
        if kind == "json_schema":
            return cls("json_schema", message.json_schema, lenient=message.lenient)
        if kind == "json_object":
            return cls("json_object")
        if kind == "regex":
            return cls("regex", message.regex)
        if kind == "choice":
            return cls("choice", options=tuple(message.choice.options))
        syntax = _SYNTAX_FROM_PROTO.get(message.grammar.syntax, "lark")
        return cls("grammar", message.grammar.text, syntax=syntax)


@dataclass(frozen=True, slots=True)
class Tool:
    """A function the model may call; `parameters_json` is its arguments' JSON Schema ("" for any);
    `strict`: a call of it always has valid arguments, in every tool choice mode (OpenAI's strict)."""

    name: str
    description: str = ""
    parameters_json: str = ""
    strict: bool = False

    def to_proto(self) -> pb.Tool:
        return pb.Tool(
            name=self.name,
            description=self.description,
            parameters_json=self.parameters_json,
            strict=self.strict,
        )

    @classmethod
    def from_proto(cls, message: pb.Tool) -> Tool:
        return cls(message.name, message.description, message.parameters_json, message.strict)


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """A mode, or the one function that must be called (`function` set, mode "required")."""

    mode: ToolMode = "auto"
    function: str | None = None

    def to_proto(self) -> pb.ToolChoice:
        if self.function is not None:
            return pb.ToolChoice(function=self.function)
        return pb.ToolChoice(mode=_MODE_TO_PROTO[self.mode])

    @classmethod
    def from_proto(cls, message: pb.ToolChoice, *, has_tools: bool) -> ToolChoice:
        which = message.WhichOneof("choice")
        if which == "function":
            return cls("required", message.function)
        mode = message.mode if which == "mode" else pb.TOOL_CHOICE_MODE_UNSPECIFIED
        if mode == pb.TOOL_CHOICE_MODE_NONE:
            return cls("none")
        if mode == pb.TOOL_CHOICE_MODE_REQUIRED:
            return cls("required")
        if mode == pb.TOOL_CHOICE_MODE_AUTO:
            return cls("auto")
        return cls("auto" if has_tools else "none")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call the model made: its id, the function's name and the arguments as JSON text."""

    id: str
    name: str
    arguments: str

    def to_proto(self) -> pb.ToolCall:
        return pb.ToolCall(id=self.id, name=self.name, arguments=self.arguments)

    @classmethod
    def from_proto(cls, message: pb.ToolCall) -> ToolCall:
        return cls(message.id, message.name, message.arguments)
