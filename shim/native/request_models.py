"""The pydantic models of the native family's request bodies; its answers are built by translate.py and
generation.py."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_validator,
)

from clients.types import PriorityName
from shim.proto_values import Int32, Text, UInt64, utf8
from wire.constraint import Constraint
from wire.sampling import FIELDS as SAMPLING_FIELDS
from wire.sampling import Sampling

_INT64_MAX = 2**63 - 1
# numpy's limit on the number of dimensions; the shape's product is computed, so its length is bounded.
MAX_RANK = 64


_SCALAR_TYPES = frozenset((bool, int, float, str))


def _scalars(values: list[Any]) -> list[Any]:
    # One pass over the types instead of a per-element union (25 us of a 512-element list); the packing
    # in shim/native/translate.py then checks the kinds against the dtype.
    kinds = set(map(type, values))
    if not _SCALAR_TYPES.issuperset(kinds):
        raise ValueError("elements must be numbers, booleans or strings")
    if str in kinds:
        for value in values:
            if type(value) is str:
                utf8(value)
    return values


Elements = Annotated[list[Any], AfterValidator(_scalars)]
DTypeName = Literal["FLOAT32", "FLOAT64", "FLOAT16", "INT32", "INT64", "BOOL", "STRING"]
# Strict so that `true` is never read as 1 and "1" never as a number; translate.py checks per dtype.
Scalar = StrictBool | StrictInt | StrictFloat | Annotated[StrictStr, AfterValidator(utf8)]
# A dimension travels as int64.
Dim = Annotated[int, Field(ge=0, le=_INT64_MAX)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorIn(_Body):
    """One input tensor: row-major `data`, or little-endian bytes in base64 as `data_b64`."""

    name: Text = Field(min_length=1)
    dtype: DTypeName
    shape: list[Dim] = Field(max_length=MAX_RANK)
    data: Elements | None = None
    data_b64: str | None = None

    @model_validator(mode="after")
    def _one_payload(self) -> TensorIn:
        if (self.data is None) == (self.data_b64 is None):
            raise ValueError("give exactly one of data or data_b64")
        if self.data_b64 is not None and self.dtype == "STRING":
            raise ValueError("STRING tensors carry data, never data_b64")
        return self


class InferBody(_Body):
    """POST /v1/infer."""

    model: Text = Field(min_length=1)
    inputs: list[TensorIn] = Field(min_length=1)
    parameters: dict[Text, Scalar] = Field(default_factory=dict)
    priority: PriorityName | None = None
    request_id: Text | None = None


class ConstraintBody(_Body):
    """What the output must be: exactly one of the kinds (the Generate request's Constraint)."""

    json_schema: dict[str, Any] | bool | None = None
    json_object: StrictBool | None = None
    regex: Text | None = None
    choice: list[Text] | None = None
    grammar: Text | None = None
    grammar_syntax: Literal["lark", "gbnf"] | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> ConstraintBody:
        kinds = [k for k in ("json_schema", "json_object", "regex", "choice", "grammar") if getattr(self, k)]
        if len(kinds) != 1:
            raise ValueError("give exactly one of json_schema, json_object, regex, choice or grammar")
        return self

    def to_constraint(self) -> Constraint:
        if self.json_schema is not None:
            return Constraint.json_schema(json.dumps(self.json_schema))
        if self.json_object:
            return Constraint.json_object()
        if self.regex is not None:
            return Constraint.regex(self.regex)
        if self.choice is not None:
            return Constraint.choice(self.choice)
        return Constraint.grammar(self.grammar or "", self.grammar_syntax)


class GenerateBody(_Body):
    """POST /v1/generate; sampling ranges are the server's to judge, so only wire ranges are checked here."""

    model: Text = Field(min_length=1)
    prompt: Text | None = None
    prompt_token_ids: list[Int32] | None = None
    max_tokens: Int32 | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: Int32 | None = None
    seed: UInt64 | None = None
    stop: Text | list[Text] | None = None
    min_tokens: Int32 | None = None
    ignore_eos: StrictBool = False
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[Annotated[str, Field(pattern=r"^\d{1,10}$")], float] | None = None
    stop_token_ids: list[Int32] | None = None
    constraint: ConstraintBody | None = None
    stream: StrictBool = False
    priority: PriorityName | None = None
    request_id: Text | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> GenerateBody:
        if (self.prompt is None) == (self.prompt_token_ids is None):
            raise ValueError("give exactly one of prompt or prompt_token_ids")
        return self

    def to_sampling(self) -> Sampling:
        """Its sampling settings, by name: a setting the native JSON exposes is a field here and nothing
        else; unset ones stay unset."""
        return Sampling.of({name: getattr(self, name) for name in _SAMPLING})


_SAMPLING = tuple(sorted(SAMPLING_FIELDS & set(GenerateBody.model_fields)))
