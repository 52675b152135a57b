"""Issue 31, acceptance 1: the OpenAI Agents SDK (`openai-agents`, pinned) runs an agent with one function
tool against Sluice through the Responses API, unchanged: OpenAIResponsesModel over an AsyncOpenAI client
pointed at the shim, tracing export off. SmolLM2 calls the tool with the city asked about, the SDK runs it
and sends its output back as a function_call_output item, and the agent's final answer is made from it;
streamed (Runner.run_streamed, the Responses events) and not."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.support.packages import require
from tests.support.processes import ServerProcess, ShimProcess, start_server, start_shim

# The SDK is imported where it is used, not at collection (tests/support/packages.py).
require("agents", "transformers", "gguf")

if TYPE_CHECKING:
    from agents import Agent
    from openai import AsyncOpenAI

QUESTION = "What's the weather in Paris?"


@pytest.fixture(scope="module")
def shim() -> Iterator[ShimProcess]:
    server: ServerProcess = start_server("--models", "smollm2")
    from agents import set_tracing_disabled

    shim = start_shim(server.target)
    set_tracing_disabled(True)  # nothing is exported to OpenAI's trace endpoint (none is reachable)
    yield shim
    set_tracing_disabled(False)
    shim.terminate()
    assert server.terminate() == 0, server.diagnostics()


def weather_agent(url: str, asked: list[str]) -> tuple[Agent[None], AsyncOpenAI]:
    from agents import Agent, ModelSettings, function_tool
    from agents.models.openai_responses import OpenAIResponsesModel
    from openai import AsyncOpenAI

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        asked.append(city)
        return "22 degrees and sunny"

    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    agent: Agent[None] = Agent(
        name="weather",
        instructions="Answer questions about the weather with the get_weather tool.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model="smollm2", openai_client=client),
        # The first turn must call the tool; the SDK resets tool_choice after a tool ran (reset_tool_choice).
        model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=60),
    )
    return agent, client


def test_an_agent_calls_its_function_tool_and_answers_from_it(shim: ShimProcess) -> None:
    asked: list[str] = []
    agent, client = weather_agent(shim.url, asked)

    async def run() -> str:
        from agents import Runner

        try:
            result = await Runner.run(agent, QUESTION, max_turns=4)
            return str(result.final_output)
        finally:
            await client.close()

    answer = asyncio.run(run())
    assert asked == ["Paris"]
    assert "22" in answer, answer


def test_a_streamed_agent_run_calls_the_tool_too(shim: ShimProcess) -> None:
    asked: list[str] = []
    agent, client = weather_agent(shim.url, asked)

    async def run() -> tuple[str, list[str]]:
        from agents import Runner

        try:
            streamed = Runner.run_streamed(agent, QUESTION, max_turns=4)
            kinds = [
                event.data.type
                async for event in streamed.stream_events()
                if event.type == "raw_response_event"
            ]
            return str(streamed.final_output), kinds
        finally:
            await client.close()

    answer, kinds = asyncio.run(run())
    assert asked == ["Paris"]
    assert "response.function_call_arguments.done" in kinds and "response.output_text.delta" in kinds
    assert kinds.count("response.completed") == 2  # the call's turn and the answer's
    assert "22" in answer, answer
