"""Constrained generation (issue 20, acceptance 1 and 3): 1,000 seeded samples from the byte LM and from a
seeded Hugging Face Llama with a BPE tokenizer, through the shim with the openai SDK, under each kind of
constraint all validate
(jsonschema for schemas, re.fullmatch for regexes, membership for choices, llguidance's own parser for
grammars); required and named tool calls always parse into a declared function with schema-valid
arguments; penalties and logit_bias do what transformers' logits processors do; hostile constraints are
refused or bounded."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import llguidance
import openai
import pytest

from clients import (
    AsyncSluiceClient,
    ChatMessage,
    Constraint,
    InvalidArgumentError,
    ResourceExhaustedError,
    SluiceClient,
    Tool,
    ToolChoice,
)
from server.logits.grammar import to_grammar
from tests.support.hf_models import greedy_reference, save_with_tokenizer
from tests.support.processes import ServerProcess, ShimProcess, start_server, start_shim

transformers = pytest.importorskip("transformers")

SAMPLES = 1000
CONCURRENCY = 64
MODELS = ("byte-lm", "llama")
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pet": {"enum": ["cat", "dog", None]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["name", "age", "pet", "tags"],
    "additionalProperties": False,
}
REGEX = r"[a-z]{2,6}-[0-9]{1,3}(\.[A-Z])?"  # [0-9]: \d is Unicode digits, by versions that differ
CHOICES = ["yes", "no", "it depends", "¿quizás?"]
GRAMMAR = 'start: greeting " " name "!"?\ngreeting: "hi" | "hello" | "hey"\nname: /[A-Z][a-z]{1,5}/\n'
WEATHER = Tool(
    "get_weather",
    "The weather in a city",
    json.dumps(
        {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        }
    ),
)
CLOCK = Tool("get_time", "The time in a zone", json.dumps({
    "type": "object", "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
    "required": ["zone"], "additionalProperties": False,
}))  # fmt: skip


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_with_tokenizer(tmp_path_factory.mktemp("bpe-llama"), max_position_embeddings=2048)


@pytest.fixture(scope="module")
def shim(server: ServerProcess) -> Iterator[ShimProcess]:
    process = start_shim(server.target)
    yield process
    process.terminate()


@pytest.fixture(scope="module")
def server(llama: Path) -> Iterator[ServerProcess]:
    process = start_server(
        "--models", "byte-lm,llama", "--hf-models", f"llama={llama}", "--max-queue", "1024"
    )
    yield process
    assert process.terminate() == 0, process.diagnostics()


def _grammar_accepts(text: str, grammar: str | None = None, *, prefix: bool = False) -> bool:
    """llguidance's own parser over the text's bytes (a byte vocabulary: tokenization plays no part): the
    whole text, or (`prefix`) a beginning that can still be completed."""
    wrapper = llguidance.TokenizerWrapper.__new__(llguidance.TokenizerWrapper)
    wrapper.eos_token_id, wrapper.bos_token_id = 256, None
    wrapper.tokens = [bytes((i,)) for i in range(256)] + [b""]
    wrapper.special_token_ids = [256]
    wrapper.is_tokenizer_wrapper, wrapper._accepts_bytes = True, True
    wrapper._gtokenizer = lambda data: list(data)
    lark = grammar if grammar is not None else llguidance.LLMatcher.grammar_from_lark(GRAMMAR)
    matcher = llguidance.LLMatcher(llguidance.LLTokenizer(wrapper), lark)
    return matcher.consume_tokens(list(text.encode())) and (prefix or matcher.is_accepting())


def _valid(kind: str, text: str, finish: str = "stop") -> bool:
    if kind == "json_object":
        if finish == "length":  # any object is unbounded: one cut by max_tokens is a prefix of one
            return _grammar_accepts(text, to_grammar(Constraint.json_object()), prefix=True)
        try:
            return isinstance(json.loads(text), dict)
        except ValueError:
            return False
    if kind == "json_schema":
        try:
            jsonschema.validate(json.loads(text), SCHEMA)
        except (ValueError, jsonschema.ValidationError):
            return False
        return True
    if kind == "regex":
        return re.fullmatch(REGEX, text) is not None
    if kind == "choice":
        return text in CHOICES
    return _grammar_accepts(text)


CONSTRAINTS = {
    "json_schema": Constraint.json_schema(json.dumps(SCHEMA)),
    "regex": Constraint.regex(REGEX),
    "choice": Constraint.choice(CHOICES),
    "grammar": Constraint.grammar(GRAMMAR),
}


GUIDED: dict[str, dict[str, Any]] = {
    "json_object": {"response_format": {"type": "json_object"}},
    "json_schema": {"guided_json": SCHEMA},
    "regex": {"guided_regex": REGEX},
    "choice": {"guided_choice": CHOICES},
    "grammar": {"guided_grammar": GRAMMAR},
}
PER_REQUEST = 16  # the shim's most choices per request (n): seeds seed..seed+15


async def _samples(url: str, model: str, kind: str) -> list[tuple[str, str]]:
    """SAMPLES seeded samples through the shim with the openai SDK: (text, finish_reason) each."""
    gate = asyncio.Semaphore(CONCURRENCY // PER_REQUEST)
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as sdk:

        async def one(seed: int, n: int) -> list[tuple[str, str]]:
            async with gate:
                answer = await sdk.completions.create(
                    model=model, prompt="Answer: ", n=n, seed=seed, temperature=1.0, max_tokens=96,
                    extra_body=GUIDED[kind],
                )  # fmt: skip
            return [(c.text, c.finish_reason) for c in answer.choices]

        starts = range(0, SAMPLES, PER_REQUEST)
        batches = await asyncio.gather(*(one(s, min(PER_REQUEST, SAMPLES - s)) for s in starts))
    return [sample for batch in batches for sample in batch]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("kind", sorted(GUIDED))
def test_every_seeded_sample_validates(shim: ShimProcess, model: str, kind: str) -> None:
    """Through the shim with the openai SDK (vLLM's guided_* extras), 1,000 seeds per kind and model."""
    results = asyncio.run(_samples(shim.url, model, kind))
    assert len(results) == SAMPLES
    invalid = [(text, finish) for text, finish in results if not _valid(kind, text, finish)]
    assert not invalid, f"{len(invalid)} of {SAMPLES} invalid, e.g. {invalid[:3]}"
    # Bounded languages always end; any JSON object may go on past max_tokens (a random model's keys
    # and strings rarely close): those end `length`, as OpenAI's do, and are prefixes of an object.
    ends = {"stop"} if kind != "json_object" else {"stop", "length"}
    assert {finish for _, finish in results} <= ends
    assert sum(finish == "stop" for _, finish in results) >= SAMPLES // 4
    assert len({text for text, _ in results}) > 1  # sampled, not one forced answer


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("choice", [ToolChoice("required"), ToolChoice("required", "get_time")])
def test_required_and_named_tool_calls_always_parse(
    server: ServerProcess, model: str, choice: ToolChoice
) -> None:
    chat = [ChatMessage("user", "What's the weather in Paris, and the time?")]
    tools = (WEATHER, CLOCK)
    schemas = {t.name: json.loads(t.parameters_json) for t in tools}

    async def run() -> list[Any]:
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(client: AsyncSluiceClient, seed: int) -> Any:
            async with gate:
                stream = client.generate(
                    model, chat, tools=tools, tool_choice=choice, seed=seed, max_tokens=120
                )
                return [c async for c in stream]

        async with AsyncSluiceClient(server.target, timeout=120) as client:
            return list(await asyncio.gather(*(one(client, seed) for seed in range(200))))

    streams = asyncio.run(run())
    # Parallel calls may go on until max_tokens (an untrained model rarely stops calling): the calls
    # complete by then are still reported. A named function is called once, and the stream ends there.
    ended = {chunks[-1].finish_reason for chunks in streams}
    assert ended <= ({"tool_calls"} if choice.function else {"tool_calls", "length"})
    for chunks in streams:
        last = chunks[-1]
        assert "".join(c.text for c in chunks) == ""  # the call is not also text
        assert last.tool_calls and len({c.id for c in last.tool_calls}) == len(last.tool_calls)
        for call in last.tool_calls:
            assert call.name in schemas and (choice.function is None or call.name == choice.function)
            jsonschema.validate(json.loads(call.arguments), schemas[call.name])


def test_one_call_when_parallel_calls_are_off(server: ServerProcess) -> None:
    with SluiceClient(server.target) as client:
        for seed in range(20):
            chunks = list(client.generate(
                "byte-lm", [ChatMessage("user", "time?")], tools=[WEATHER, CLOCK],
                tool_choice=ToolChoice("required"), parallel_tool_calls=False, seed=seed, max_tokens=120,
            ))  # fmt: skip
            assert len(chunks[-1].tool_calls) == 1


def test_a_conversation_with_tool_results_continues(server: ServerProcess) -> None:
    """The assistant's call and the tool's answer go back into the prompt (the default template renders
    them); the model's next turn is then constrained like any other."""
    with SluiceClient(server.target) as client:
        first = list(client.generate(
            "llama", [ChatMessage("user", "weather?")], tools=[WEATHER],
            tool_choice=ToolChoice("required", "get_weather"), seed=3, max_tokens=120,
        ))  # fmt: skip
        call = first[-1].tool_calls[0]
        history = [
            ChatMessage("user", "weather?"),
            ChatMessage("assistant", "", tool_calls=(call,)),
            ChatMessage("tool", '{"sky": "clear"}', tool_call_id=call.id, name=call.name),
        ]
        answer = list(client.generate("llama", history, tools=[WEATHER], tool_choice=ToolChoice("none"),
                                      constraint=Constraint.choice(["sunny", "rainy"]), seed=3))  # fmt: skip
        assert "".join(c.text for c in answer) in ("sunny", "rainy")
        assert (
            answer[-1].finish_reason == "stop"
            and answer[-1].usage.prompt_tokens > first[-1].usage.prompt_tokens
        )


def test_max_tokens_inside_a_constraint_ends_with_length(server: ServerProcess) -> None:
    endless = Constraint.grammar('start: "a" start | "a"')  # only ends where it may: never forced to
    with SluiceClient(server.target) as client:
        chunks = list(client.generate("byte-lm", "x", constraint=endless, max_tokens=5, seed=1,
                                      logit_bias={256: -100}))  # fmt: skip
    assert chunks[-1].finish_reason == "length" and "".join(c.text for c in chunks) == "aaaaa"


def test_logits_settings_match_transformers(server: ServerProcess, llama: Path) -> None:
    """Greedy with repetition_penalty equals transformers' generate with the same penalty; a +100 bias
    forces its token; stop_token_ids end the stream as EOS does."""

    with SluiceClient(server.target) as client:
        prompt = [5, 9, 12, 5, 9]

        def tokens(model: str, prompt: Any, **kw: Any) -> list[int]:
            return [t for c in client.generate(model, prompt, **kw) for t in c.token_ids]

        got = tokens("llama", prompt, temperature=0, max_tokens=12, ignore_eos=True, repetition_penalty=1.8)
        forced = tokens("byte-lm", "hi", temperature=0, max_tokens=4, logit_bias={65: 100})
        stop_ids = [ord(" "), ord("e")]
        stopped = list(
            client.generate(
                "byte-lm", "hi", max_tokens=50, seed=2, stop_token_ids=stop_ids, logit_bias={101: 20}
            )
        )
    assert forced == [65] * 4
    assert stopped[-1].finish_reason == "stop" and stopped[-1].token_ids[-1] in stop_ids
    assert not {" ", "e"} & set("".join(c.text for c in stopped))
    assert got == greedy_reference(llama, prompt, 12, repetition_penalty=1.8)


@pytest.mark.parametrize(
    ("constraint", "field"),
    [
        (Constraint.json_schema("[" * 10_000 + "]" * 10_000), "constraint.json_schema"),
        (
            Constraint.json_schema('{"type": "object", "properties": {"a": {"$ref": "#/nope"}}}'),
            "constraint.json_schema",
        ),
        (Constraint.json_schema("not json"), "constraint.json_schema"),
        (Constraint.regex("(unclosed"), "constraint.regex"),
        (Constraint.grammar("start: undefined_rule"), "constraint.grammar.text"),
        (Constraint.grammar("root ::= [a-"), "constraint.grammar.text"),
        (Constraint.choice([]), "constraint.choice.options"),
        (Constraint.regex("a" * 70_000), "constraint.regex"),
    ],
)
def test_hostile_constraints_are_refused_naming_the_field(
    server: ServerProcess, constraint: Constraint, field: str
) -> None:
    with (
        SluiceClient(server.target) as client,
        pytest.raises((InvalidArgumentError, ResourceExhaustedError)) as caught,
    ):
        list(client.generate("byte-lm", "x", constraint=constraint, max_tokens=4))
    assert field in str(caught.value) or field in dict(caught.value.field_violations)


def test_a_backtracking_regex_is_bounded_and_harms_no_one(server: ServerProcess) -> None:
    """(a+)+b backtracks exponentially in a backtracking engine; llguidance's lexer is a lazy DFA, so the
    stream runs as any other, and streams running beside it get exactly what they get alone."""
    hostile = Constraint.regex("(a+)+b")
    with SluiceClient(server.target) as client:

        def plain() -> list[int]:
            return [t for c in client.generate("byte-lm", "x", max_tokens=24, seed=4) for t in c.token_ids]

        alone = plain()
        beside: list[list[int]] = []
        thread = threading.Thread(target=lambda: beside.extend(plain() for _ in range(3)))
        thread.start()
        chunks = list(client.generate("byte-lm", "x", constraint=hostile, max_tokens=64, seed=4))
        thread.join(timeout=60)
    text = "".join(c.text for c in chunks)
    assert re.fullmatch("a*", text[:-1]) and (text.endswith("b") or chunks[-1].finish_reason == "length")
    assert beside == [alone] * 3


def test_auto_shows_the_text_and_parses_the_call_the_model_writes(server: ServerProcess) -> None:
    """`auto`: the model may write text, a call, or both; a regex stands in for a model that knows the
    format, so the output is a sentence and then a call."""
    call = '<tool_call>\n{"name": "get_time", "arguments": {"zone": 3}}\n</tool_call>'
    writes = Constraint.regex(re.escape("On it. " + call))
    with SluiceClient(server.target) as client:
        chunks = list(client.generate(
            "byte-lm", [ChatMessage("user", "time?")], tools=[CLOCK], constraint=writes, max_tokens=200,
        ))  # fmt: skip
    assert "".join(c.text for c in chunks) == "On it. "
    (made,) = chunks[-1].tool_calls
    assert chunks[-1].finish_reason == "tool_calls" and made.name == "get_time"
    assert json.loads(made.arguments) == {"zone": 3} and made.id.startswith("call_")
