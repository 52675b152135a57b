"""The pydantic models of the native HTTP API's request bodies; responses are built by translate.py."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
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

_INT32_MAX = 2**31 - 1
_UINT64_MAX = 2**64 - 1

DTypeName = Literal["FLOAT32", "FLOAT64", "FLOAT16", "INT32", "INT64", "BOOL", "STRING"]
# Strict so that `true` is never read as 1 and "1" never as a number; translate.py checks per dtype.
Element = StrictBool | StrictInt | StrictFloat | StrictStr
Scalar = StrictBool | StrictInt | StrictFloat | StrictStr
Int32 = Annotated[int, Field(ge=-(2**31), le=_INT32_MAX)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorIn(_Body):
    """One input tensor: row-major `data`, or little-endian bytes in base64 as `data_b64`."""

    name: str = Field(min_length=1)
    dtype: DTypeName
    shape: list[Annotated[int, Field(ge=0)]]
    data: list[Element] | None = None
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

    model: str = Field(min_length=1)
    inputs: list[TensorIn] = Field(min_length=1)
    parameters: dict[str, Scalar] = Field(default_factory=dict)
    priority: PriorityName | None = None
    request_id: str | None = None


class GenerateBody(_Body):
    """POST /v1/generate; sampling ranges are the server's to judge, so only wire ranges are checked here."""

    model: str = Field(min_length=1)
    prompt: str | None = None
    prompt_token_ids: list[Int32] | None = None
    max_tokens: Int32 | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: Int32 | None = None
    seed: Annotated[int, Field(ge=0, le=_UINT64_MAX)] | None = None
    stop: str | list[str] | None = None
    stream: StrictBool = False
    priority: PriorityName | None = None
    request_id: str | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> GenerateBody:
        if (self.prompt is None) == (self.prompt_token_ids is None):
            raise ValueError("give exactly one of prompt or prompt_token_ids")
        return self
