"""The one sampling definition (wire/sampling.py): ranges and defaults declared once and used by the
server's codec, its scheduler and the shim's request models alike."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from pydantic import ValidationError
from sluice.inference.v1 import inference_pb2 as pb

from server.batching.requests import check_vocabulary
from server.codec.messages import decode_generate
from server.domain import SamplingParams
from server.errors import InvalidArgument, LimitExceeded
from shim.native.request_models import GenerateBody
from shim.openai.request_models import ChatCompletionRequest, CompletionRequest
from wire.sampling import BOUNDS, DEFAULTS, FIELDS, MAX_LOGPROBS, Sampling

# (field, value out of range, the message the codec always gave)
OUT_OF_RANGE = [
    ("max_tokens", 0, "max_tokens must be > 0, got 0"),
    ("temperature", -0.5, "temperature must be >= 0, got -0.5"),
    ("temperature", float("inf"), "temperature must be >= 0, got inf"),
    ("top_p", 0.0, "top_p must be in (0, 1], got 0.0"),
    ("top_p", 1.5, "top_p must be in (0, 1], got 1.5"),
    ("top_k", -1, "top_k must be >= 0, got -1"),
    ("logprobs", MAX_LOGPROBS + 1, f"logprobs must be between 0 and {MAX_LOGPROBS}, got {MAX_LOGPROBS + 1}"),
    ("presence_penalty", 2.5, "presence_penalty must be in [-2, 2], got 2.5"),
    ("frequency_penalty", -3.0, "frequency_penalty must be in [-2, 2], got -3.0"),
    ("repetition_penalty", 0.0, "repetition_penalty must be > 0, got 0.0"),
]


def _request(**sampling: Any) -> pb.GenerateRequest:
    return pb.GenerateRequest(model="m", text="hi", sampling=Sampling.of(sampling).to_proto())


@pytest.mark.parametrize(("name", "value", "message"), OUT_OF_RANGE)
def test_a_value_outside_its_declared_range_is_refused_naming_the_field(
    name: str, value: Any, message: str
) -> None:
    problem = Sampling.of({name: value}).violation()
    assert problem is not None and (problem.field, problem.message, problem.limit) == (name, message, None)
    with pytest.raises(InvalidArgument) as caught:
        decode_generate(_request(**{name: value}))
    assert (caught.value.field, str(caught.value)) == (f"sampling.{name}", message)
    assert type(caught.value) is InvalidArgument


def test_values_at_the_edges_of_their_ranges_hold() -> None:
    edges = {"max_tokens": 1, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "logprobs": MAX_LOGPROBS}
    edges |= {"presence_penalty": -2.0, "frequency_penalty": 2.0, "repetition_penalty": 0.5}
    assert Sampling.of(edges).violation() is None
    assert decode_generate(_request(**edges)).sampling == Sampling.of(edges)


def test_counts_past_their_limit_are_limit_exceeded_with_the_limit() -> None:
    with pytest.raises(LimitExceeded) as caught:
        decode_generate(_request(logit_bias={t: 1.0 for t in range(301)}))
    assert (caught.value.field, caught.value.metadata["max_logit_bias"]) == ("sampling.logit_bias", "300")
    with pytest.raises(LimitExceeded) as caught:
        decode_generate(_request(stop_token_ids=list(range(65))))
    assert str(caught.value) == "65 stop_token_ids; at most 64"


def test_a_bias_out_of_range_is_refused_at_its_token() -> None:
    with pytest.raises(InvalidArgument) as caught:
        decode_generate(_request(logit_bias={7: 1.0, 9: 101.0}))
    assert (caught.value.field, str(caught.value)) == (
        "sampling.logit_bias[9]",
        "logit_bias values must be in [-100, 100], got 101.0",
    )


def test_unset_fields_resolve_to_their_declared_defaults_and_set_ones_are_kept() -> None:
    resolved = SamplingParams.resolved(Sampling.of({"top_k": 0, "temperature": 0.25}), max_tokens=9)
    assert (resolved.max_tokens, resolved.top_k, resolved.temperature) == (9, 0, 0.25)
    for name, default in DEFAULTS.items():
        if name not in {"top_k", "temperature"}:
            assert getattr(resolved, name) == default, name
    # What the scheduler builds directly (tests, the step) gets the same defaults.
    assert SamplingParams(max_tokens=1).top_p == DEFAULTS["top_p"] == 1.0
    # Unset stays unset on the wire; the server's default is the declared one, not sent.
    assert not Sampling().to_proto().ListFields()


def test_every_declared_bound_is_one_the_proto_can_carry() -> None:
    assert set(BOUNDS) | set(DEFAULTS) <= FIELDS
    assert set(DEFAULTS) <= {f.name for f in dataclasses.fields(Sampling) if f.default is None}


def test_openai_models_convert_every_field_they_name_alike() -> None:
    alike = sorted(FIELDS & set(CompletionRequest.model_fields))
    assert {"temperature", "top_p", "top_k", "min_tokens", "stop", "presence_penalty", "logit_bias"} <= set(
        alike
    )
    values: dict[str, Any] = {
        "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 3, "seed": 11, "stop": "x",
        "min_tokens": 2, "ignore_eos": True, "logprobs": 2, "presence_penalty": 0.5,
        "frequency_penalty": -0.5, "repetition_penalty": 1.2, "logit_bias": {"5": 1.0},
        "stop_token_ids": [3],
    }  # fmt: skip
    assert set(values) == set(alike)
    body = CompletionRequest(model="m", prompt="p", **values)
    expected = Sampling.of({**values, "seed": 12})
    assert body.to_sampling(choice=1) == expected
    assert body.to_sampling(choice=0).seed == 11


def test_chat_names_max_tokens_and_logprobs_its_own_way() -> None:
    chat = ChatCompletionRequest(
        model="m",
        messages=[{"role": "user", "content": "hi"}],  # type: ignore[list-item]
        max_tokens=50,
        max_completion_tokens=5,
        logprobs=True,
        top_logprobs=3,
        temperature=0.0,
    )
    sampling = chat.to_sampling()
    assert (sampling.max_tokens, sampling.logprobs, sampling.temperature) == (5, 3, 0.0)
    plain = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}])  # type: ignore[list-item]
    assert plain.to_sampling() == Sampling()


@pytest.mark.parametrize(("name", "value"), [("top_p", 0.0), ("top_p", 1.01), ("temperature", -0.1)])
def test_openai_refuses_what_the_declared_range_refuses(name: str, value: float) -> None:
    with pytest.raises(ValidationError):
        CompletionRequest(model="m", prompt="p", **{name: value})
    bound = BOUNDS[name]
    assert not bound.holds(value)


def test_native_body_converts_by_name() -> None:
    body = GenerateBody(model="m", prompt="hi", top_k=0, temperature=0.0, stop=["a", "b"])
    assert body.to_sampling() == Sampling(top_k=0, temperature=0.0, stop=("a", "b"))
    assert body.to_sampling().to_proto().HasField("top_k")  # given, so sent, though it is the default


def test_out_of_vocabulary_ids_are_refused_by_position_or_by_token() -> None:
    check_vocabulary([0, 9], 10, "token_ids.ids")
    with pytest.raises(InvalidArgument) as caught:
        check_vocabulary([0, 10], 10, "token_ids.ids")
    assert (caught.value.field, str(caught.value)) == (
        "token_ids.ids[1]",
        "token id 10 is outside the vocabulary [0, 10)",
    )
    with pytest.raises(InvalidArgument) as caught:
        check_vocabulary([3, 12], 10, "sampling.logit_bias", by_token=True)
    assert caught.value.field == "sampling.logit_bias[12]"
