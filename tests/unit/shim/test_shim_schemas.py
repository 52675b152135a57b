"""schemas.py: every string a body holds is valid Unicode text, dimensions fit int64 and are at most
MAX_RANK, elements are strict (no `true` as 1, no "1" as a number)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from shim.native.request_models import MAX_RANK, GenerateBody, InferBody, TensorIn

TENSOR = {"name": "x", "dtype": "FLOAT32", "shape": [1], "data": [1.0]}


@pytest.mark.parametrize(
    ("schema", "document", "field"),
    [
        (GenerateBody, {"model": "g", "prompt": "\udc80"}, ("prompt",)),
        (GenerateBody, {"model": "g\ud800", "prompt": "x"}, ("model",)),
        (GenerateBody, {"model": "g", "prompt": "x", "stop": "\udfff"}, ("stop",)),
        (GenerateBody, {"model": "g", "prompt": "x", "request_id": "r\udc80"}, ("request_id",)),
        (InferBody, {"model": "m", "inputs": [{**TENSOR, "name": "\udc80"}]}, ("inputs", 0, "name")),
        (InferBody, {"model": "m", "inputs": [TENSOR], "parameters": {"\udc80": 1}}, ("parameters",)),
        (InferBody, {"model": "m", "inputs": [{**TENSOR, "dtype": "STRING", "data": ["\udc80"]}]}, None),
    ],
)
def test_lone_surrogates_are_refused_wherever_a_string_goes(
    schema: type[GenerateBody | InferBody], document: dict[str, Any], field: tuple[Any, ...] | None
) -> None:
    with pytest.raises(ValidationError) as caught:
        schema.model_validate(document)
    errors = caught.value.errors()
    # Said by the shim's own check, or by pydantic's for a constrained string.
    assert any("lone surrogate" in error["msg"] or "unicode" in error["msg"] for error in errors), errors
    if field is not None:
        assert any(tuple(error["loc"])[: len(field)] == field for error in errors), errors


def test_text_that_is_not_ascii_is_fine() -> None:
    body = GenerateBody.model_validate({"model": "g", "prompt": "héllo 🌍", "stop": ["é"]})
    assert body.prompt == "héllo 🌍"


@pytest.mark.parametrize("shape", [[2**63], [-1], [1] * (MAX_RANK + 1), [1.5]])
def test_shapes_fit_the_wire(shape: list[Any]) -> None:
    with pytest.raises(ValidationError):
        TensorIn.model_validate({**TENSOR, "shape": shape})


def test_the_largest_shape_is_accepted() -> None:
    assert TensorIn.model_validate({**TENSOR, "shape": [2**63 - 1] * MAX_RANK}).shape[0] == 2**63 - 1


@pytest.mark.parametrize("element", [None, [1], {"a": 1}])
def test_elements_are_scalars(element: Any) -> None:
    with pytest.raises(ValidationError):
        TensorIn.model_validate({**TENSOR, "data": [element]})


def test_elements_and_parameters_keep_their_json_types() -> None:
    tensor = TensorIn.model_validate({**TENSOR, "data": [True, 1, 1.5, "1"]})
    assert [type(value) for value in tensor.data or []] == [bool, int, float, str]
    body = InferBody.model_validate({"model": "m", "inputs": [TENSOR], "parameters": {"a": True, "b": "1"}})
    assert body.parameters == {"a": True, "b": "1"}
