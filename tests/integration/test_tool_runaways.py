"""What a weak model runs away with under a grammar (issue 38 item 5, acceptance 4), through the real server
and shim with the official openai SDK. SmolLM2 repeated its required call until max_tokens with parallel
calls on (OpenAI's default), and wrote `"population": 1111…` until max_tokens; here a seeded BPE Llama is
steered into the same runaways by logit_bias (never the end of text; the digit 1), and each ends by its
documented rule (docs/constrained.md): a call identical to one already made ends the calls, and an integer
the schema leaves unbounded holds a safe integer (16 digits)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import openai
import pytest

from tests.support.hf_models import save_with_tokenizer
from tests.support.processes import start_server, start_shim

SEEDS = range(3)
WEATHER = [{"role": "user", "content": "What's the weather in Paris?"}]


@dataclass(frozen=True)
class Steered:
    url: str
    eos: int  # the end-of-text token: biased away, the model never stops by itself
    one: int  # the digit 1: biased up, the model writes it wherever it may


@pytest.fixture(scope="module")
def steered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Steered]:
    import transformers

    path = save_with_tokenizer(tmp_path_factory.mktemp("runaway-llama"), max_position_embeddings=2048)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    server = start_server("--models", "llama", "--hf-models", f"llama={path}")
    try:
        shim = start_shim(server.target)
        try:
            yield Steered(shim.url, int(tokenizer.eos_token_id), int(tokenizer.convert_tokens_to_ids("1")))
        finally:
            shim.terminate()
    finally:
        assert server.terminate() == 0, server.diagnostics()


@pytest.fixture
def sdk(steered: Steered) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{steered.url}/v1", api_key="unused", max_retries=0) as client:
        yield client


def weather_tool(cities: list[str]) -> dict[str, object]:
    city = {"type": "string", "enum": cities}
    parameters = {"type": "object", "properties": {"city": city}, "required": ["city"]}
    return {"type": "function", "function": {"name": "get_weather", "parameters": parameters}}


@pytest.mark.parametrize("cities", [["Paris"], ["Paris", "Oslo"]])
def test_a_repeated_call_ends_the_calls_with_parallel_calls_on(
    sdk: openai.OpenAI, steered: Steered, cities: list[str]
) -> None:
    """Acceptance 4's rule: a model that never stops calling ends at the first call it makes again, with
    finish `tool_calls` and every distinct call it made; on 6c0ff0d it ran to max_tokens (`length`)."""
    for seed in SEEDS:
        answer = sdk.chat.completions.create(
            model="llama", messages=WEATHER, tools=[weather_tool(cities)], tool_choice="required",  # type: ignore[list-item]
            seed=seed, max_tokens=1000, logit_bias={str(steered.eos): -100},
        )  # fmt: skip
        choice = answer.choices[0]
        assert choice.finish_reason == "tool_calls", (seed, choice)
        made = [json.loads(c.function.arguments)["city"] for c in choice.message.tool_calls or []]
        assert 1 <= len(made) <= len(cities) and len(set(made)) == len(made), (seed, made)
        assert answer.usage is not None and answer.usage.completion_tokens < 1000


def test_an_integer_without_bounds_ends_within_a_safe_integer(sdk: openai.OpenAI, steered: Steered) -> None:
    """On 6c0ff0d the digit ran to max_tokens and no call was reported."""
    population = {
        "type": "object",
        "properties": {"population": {"type": "integer"}},
        "required": ["population"],
    }
    tool = {"type": "function", "function": {"name": "set_population", "parameters": population}}
    answer = sdk.chat.completions.create(
        model="llama", messages=WEATHER, tools=[tool], tool_choice="required", parallel_tool_calls=False,  # type: ignore[list-item]
        max_tokens=400, logit_bias={str(steered.one): 100},
    )  # fmt: skip
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls or []
    assert json.loads(call.function.arguments) == {"population": int("1" * 16)}
    structured = sdk.chat.completions.create(
        model="llama", messages=WEATHER, max_tokens=400, logit_bias={str(steered.one): 100},
        response_format={"type": "json_schema", "json_schema": {"name": "town", "schema": population}},  # type: ignore[typeddict-item]
    )  # fmt: skip
    assert structured.choices[0].finish_reason == "stop", structured.choices[0]
    assert json.loads(structured.choices[0].message.content or "") == {"population": int("1" * 16)}
