"""Per-request timings (issue 22, item 2): a Generate stream's last message carries GenerateTimings (queue
wait, time to first token, decode time, tokens, the step it joined and that step's size); the shim renders
them as `timings` in native JSON and as vLLM's `metrics` beside OpenAI's `usage`; both access logs write
them with the token counts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import openai
import pytest
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from tests.support.processes import ServerProcess, ShimProcess, start_server, start_shim, wait_until

METRIC_KEYS = {
    "queue_time_ms",
    "time_to_first_token_ms",
    "generation_time_ms",
    "mean_itl_ms",
    "tokens_per_second",
}


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[ServerProcess, ShimProcess]]:
    server = start_server("--access-log", "1", "--models", "byte-lm")
    shim = start_shim(server.target, "--access-log", "1")
    yield server, shim
    shim.terminate()
    assert server.terminate() == 0, server.diagnostics()


def log_lines(path: Path | None) -> list[dict[str, object]]:
    assert path is not None
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def ms(duration: object) -> float:
    assert hasattr(duration, "ToNanoseconds")
    return float(duration.ToNanoseconds()) / 1e6


def test_the_last_generate_message_carries_the_timings(stack: tuple[ServerProcess, ShimProcess]) -> None:
    server, _ = stack
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        request = pb.GenerateRequest(
            model="byte-lm",
            text="Once upon a time",
            request_id="timed-1",
            sampling=pb.SamplingParams(max_tokens=12, ignore_eos=True, seed=3),
        )
        replies = list(stub.Generate(request, timeout=30))
    *earlier, last = replies
    assert all(not reply.HasField("timings") for reply in earlier)
    timings = last.timings
    assert timings.tokens == last.usage.completion_tokens == 12
    queue, first, decode = ms(timings.queue_wait), ms(timings.time_to_first_token), ms(timings.decode)
    assert 0 <= queue < first  # the prefill lies between the join and the first token
    assert decode > 0
    assert timings.first_step >= 0 and timings.batch_size >= 1
    wait_until(
        lambda: any(x.get("request_id") == "timed-1" for x in log_lines(server.stderr_path)), what="log"
    )
    line = next(x for x in log_lines(server.stderr_path) if x.get("request_id") == "timed-1")
    assert line["queue_ms"] == round(queue, 3) and line["ttft_ms"] == round(first, 3)
    assert line["decode_ms"] == round(decode, 3)
    assert (line["prompt_tokens"], line["tokens"]) == (last.usage.prompt_tokens, 12)


def test_native_json_has_timings_collected_and_streamed(stack: tuple[ServerProcess, ShimProcess]) -> None:
    _, shim = stack
    body = {"model": "byte-lm", "prompt": "Hello", "max_tokens": 6, "ignore_eos": True, "seed": 1}
    with httpx.Client(base_url=shim.url, timeout=30) as client:
        whole = client.post("/v1/generate", json=body).json()
        with client.stream("POST", "/v1/generate", json={**body, "stream": True}) as response:
            events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert set(whole["timings"]) == METRIC_KEYS
    assert 0 <= whole["timings"]["queue_time_ms"] < whole["timings"]["time_to_first_token_ms"]
    assert whole["timings"]["tokens_per_second"] > 0
    done = json.loads(events[-1].removeprefix("data: "))
    assert set(done["timings"]) == METRIC_KEYS and done["usage"]["completion_tokens"] == 6


def test_openai_answers_carry_metrics_beside_usage(stack: tuple[ServerProcess, ShimProcess]) -> None:
    _, shim = stack
    messages = [{"role": "user", "content": "Tell me about rivers."}]
    with openai.OpenAI(base_url=f"{shim.url}/v1", api_key="unused", max_retries=0) as client:
        answer = client.chat.completions.create(
            model="byte-lm",
            messages=messages,
            max_tokens=8,
            extra_body={"ignore_eos": True},  # type: ignore[arg-type]
        )
        chunks = list(
            client.chat.completions.create(
                model="byte-lm",
                messages=messages,  # type: ignore[arg-type]
                max_tokens=8,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
        )
        text = client.completions.create(model="byte-lm", prompt="Hi", max_tokens=4, n=2)
    metrics = (answer.model_extra or {})["metrics"]
    assert set(metrics) == METRIC_KEYS
    assert 0 <= metrics["queue_time_ms"] < metrics["time_to_first_token_ms"] and metrics["mean_itl_ms"] > 0
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    assert set((chunks[-1].model_extra or {})["metrics"]) == METRIC_KEYS
    assert all("metrics" not in (c.model_extra or {}) for c in chunks[:-1])
    assert set((text.model_extra or {})["metrics"]) == METRIC_KEYS
    wait_until(lambda: sum("ttft_ms" in x for x in log_lines(shim.stderr_path)) >= 3, what="shim log lines")
    logged = next(x for x in log_lines(shim.stderr_path) if x.get("path") == "/v1/chat/completions")
    assert (logged["model"], logged["prompt_tokens"], logged["completion_tokens"]) == (
        "byte-lm",
        answer.usage.prompt_tokens if answer.usage else None,
        8,
    )
    assert logged["ttft_ms"] == metrics["time_to_first_token_ms"]
    assert logged["queue_ms"] == metrics["queue_time_ms"]
