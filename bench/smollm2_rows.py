"""The engine's features on a real model: SmolLM2-135M-Instruct (`smollm2`: a 49,152-token vocabulary, a real
end of turn, a chat template), each row beside the same load without the feature, in one run:

- prefix cache: 32 chats sharing a long system prompt (about 1,000 tokens), a short question each, 32
  tokens each (greedy): TTFT p50 and tokens/s with --prefix-cache true against false, outputs equal;
- constrained output: 32 streams under a JSON schema against 32 free streams (sampled, seeded): each
  group's tokens/s and TTFT p50, and how many constrained answers parse and end by themselves (EOS);
- tool calls: 32 chats asking for the weather with one tool and tool_choice "required" (parallel calls at
  OpenAI's default, true) against the same chats without tools: how many end `tool_calls` with arguments
  that parse, their tokens, tokens/s against the free chats;
- preemption: LOW streams fill a KV budget that holds half of them, then HIGH calls arrive: the HIGH
  burst's TTFT p99 against the same burst on the idle server, every HIGH served, LOW output (greedy) as
  when run alone.

    .venv/bin/python -m bench.smollm2_rows [--quick] [--repeats N]
        [--part prefix|constrained|tools|preemption]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field

import grpc
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from bench.generate import percentile, spread
from bench.stack import SluiceServer
from server.runtimes.smollm2 import NAME

# SmolLM2 in bfloat16: keys and values of 30 layers, 3 key/value heads of 64, 2 bytes each.
BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 2
SYSTEM = "You are the help desk of a lighthouse museum. " + " ".join(
    f"Rule {i}: answer visitors politely, name the exhibit in room {i % 12}, and never invent opening hours."
    for i in range(40)
)
QUESTIONS = [f"Question {i}: where can I see lens number {i}, and who built it?" for i in range(32)]
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "population": {"type": "integer"},
        "river": {"type": "string"},
    },
    "required": ["city", "population", "river"],
}
WEATHER = pb.Tool(
    name="get_weather",
    description="The current weather in a city.",
    parameters_json=json.dumps(
        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    ),
)
CITIES = ["Paris", "Berlin", "Madrid", "Rome", "Lisbon", "Vienna", "Prague", "Oslo"]


@dataclass
class Streams:
    ttft: list[float] = field(default_factory=list)
    tokens: int = 0
    wall_s: float = 0.0
    outputs: dict[int, list[int]] = field(default_factory=dict)
    texts: dict[int, str] = field(default_factory=dict)
    decoding: list[tuple[int, float]] = field(default_factory=list)  # per stream: tokens after its first, s
    finished: dict[int, pb.GenerateResponse] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s

    @property
    def stream_rate(self) -> float:
        """One stream's decode speed (tokens/s after its first token), averaged over the streams."""
        return sum(n for n, _ in self.decoding) / sum(s for _, s in self.decoding)


def chat(system: str | None, user: str) -> pb.ChatPrompt:
    turns = ([pb.ChatMessage(role="system", content=system)] if system else []) + [
        pb.ChatMessage(role="user", content=user)
    ]
    return pb.ChatPrompt(messages=turns)


async def run_all(target: str, requests: list[pb.GenerateRequest]) -> Streams:
    """Every request at once; each stream's tokens, TTFT and last message."""
    into = Streams()

    async def one(stub: pb_grpc.InferenceServiceStub, index: int, request: pb.GenerateRequest) -> None:
        started, got, text = time.perf_counter(), [], []
        first = last = 0.0
        async for message in stub.Generate(request, timeout=900):
            if message.token_ids:
                last = time.perf_counter()
                if not got:
                    into.ttft.append(last - started)
                    first, after = last, len(message.token_ids)
            got.extend(message.token_ids)
            text.append(message.text)
            if message.finish_reason:
                into.finished[index] = message
        into.tokens += len(got)
        if last > first:
            into.decoding.append((len(got) - after, last - first))
        into.outputs[index] = got
        into.texts[index] = "".join(text)

    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        started = time.perf_counter()
        await asyncio.gather(*(one(stub, i, r) for i, r in enumerate(requests)))
        into.wall_s = time.perf_counter() - started
    return into


def server(*flags: str) -> SluiceServer:
    return SluiceServer(
        "--models", NAME, "--dtype", "bfloat16", "--torch-threads", "1", "--max-sequences", "32",
        "--max-queue", "128", *flags,
    )  # fmt: skip


def greedy(tokens: int, ignore_eos: bool = True) -> pb.SamplingParams:
    return pb.SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=ignore_eos)


# -- prefix cache -----------------------------------------------------------------------------------------
def prefix(repeats: int, streams: int) -> None:
    requests = [pb.GenerateRequest(model=NAME, chat=chat(SYSTEM, q), sampling=greedy(32)) for q in QUESTIONS]
    results: dict[str, list[Streams]] = {}
    for mode in ("true", "false"):
        with server("--prefix-cache", mode) as s:
            asyncio.run(run_all(s.target, requests[:1]))  # the system prompt has been seen before
            results[mode] = [asyncio.run(run_all(s.target, requests[:streams])) for _ in range(repeats)]
    on, off = results["true"], results["false"]
    # In bfloat16 a cached prefix's keys were computed in another blocking than a whole prefill's, so a
    # near-tie may fall the other way (the float32 rows of bench.kv_cache are token-identical): counted.
    same = [sum(a.outputs[i] == b.outputs[i] for i in a.outputs) for a, b in zip(on, off, strict=True)]
    ttft_on, ttft_off = [percentile(r.ttft, 50) for r in on], [percentile(r.ttft, 50) for r in off]
    tps_on, tps_off = [r.tokens_per_s for r in on], [r.tokens_per_s for r in off]
    prompt = on[0].finished[0].usage.prompt_tokens
    print(
        f"\nprefix cache (SmolLM2): {streams} chats, a shared system prompt ({prompt} tokens with the "
        f"question), 32 tokens each: TTFT p50 on {spread(ttft_on, 1000)} ms, off {spread(ttft_off, 1000)} ms "
        f"({statistics.median(ttft_off) / statistics.median(ttft_on):.1f}x lower); tokens/s on "
        f"{spread(tps_on)}, off {spread(tps_off)} "
        f"({statistics.median(tps_on) / statistics.median(tps_off):.2f}x); "
        f"outputs token-identical on and off: {min(same)}-{max(same)} of {streams}"
    )


# -- constrained output -----------------------------------------------------------------------------------
def constrained(repeats: int, streams: int) -> None:
    def request(i: int, schema: bool) -> pb.GenerateRequest:
        city = CITIES[i % len(CITIES)]
        sampling = pb.SamplingParams(max_tokens=96, temperature=0.7, seed=i, ignore_eos=not schema)
        r = pb.GenerateRequest(model=NAME, chat=chat(None, f"Describe {city} as JSON."), sampling=sampling)
        if schema:
            r.constraint.json_schema = json.dumps(SCHEMA)
        return r

    free, bound, parsed, ended = [], [], [], []
    with server() as s:
        asyncio.run(run_all(s.target, [request(0, True)]))  # the vocabulary's grammar tables are built
        for _ in range(repeats):
            plain = asyncio.run(run_all(s.target, [request(i, False) for i in range(streams)]))
            schema = asyncio.run(run_all(s.target, [request(i, True) for i in range(streams)]))
            free.append(plain)
            bound.append(schema)
            parsed.append(sum(_parses(text) for text in schema.texts.values()))
            ended.append(sum(m.finish_reason == pb.FINISH_REASON_STOP for m in schema.finished.values()))
    # Constrained answers end at EOS (a real model closes the object), free ones run to max_tokens: the
    # aggregate rates cover other spans, so one stream's decode speed is what is compared.
    ratio = [b.stream_rate / f.stream_rate for b, f in zip(bound, free, strict=True)]
    print(
        f"\nconstrained output (SmolLM2, 49,152-token masks): one stream's decode speed among {streams} "
        f"under a JSON schema {spread([r.stream_rate for r in bound], digits=1)} tokens/s against "
        f"{streams} free {spread([r.stream_rate for r in free], digits=1)} = {spread(ratio, digits=2)}x; "
        f"aggregate {spread([r.tokens_per_s for r in bound])} against "
        f"{spread([r.tokens_per_s for r in free])} tokens/s; TTFT p50 "
        f"{spread([percentile(r.ttft, 50) for r in bound], 1000)} ms against "
        f"{spread([percentile(r.ttft, 50) for r in free], 1000)} ms; answers that parse "
        f"{min(parsed)}-{max(parsed)} of {streams}, ended by EOS {min(ended)}-{max(ended)} of {streams}"
    )


def _parses(text: str) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return isinstance(value, dict) and set(value) >= {"city", "population", "river"}


# -- tool calls -------------------------------------------------------------------------------------------
def tools(repeats: int, streams: int) -> None:
    def request(i: int, tool: bool) -> pb.GenerateRequest:
        question = f"What's the weather in {CITIES[i % len(CITIES)]}?"
        r = pb.GenerateRequest(model=NAME, chat=chat(None, question), sampling=greedy(64, ignore_eos=False))
        if tool:
            r.tools.append(WEATHER)
            r.tool_choice.mode = pb.TOOL_CHOICE_MODE_REQUIRED
        return r

    free, called, calls, good, tokens, per_answer = [], [], [], [], [], []
    with server() as s:
        asyncio.run(run_all(s.target, [request(0, True)]))
        for _ in range(repeats):
            free.append(asyncio.run(run_all(s.target, [request(i, False) for i in range(streams)])))
            run = asyncio.run(run_all(s.target, [request(i, True) for i in range(streams)]))
            called.append(run)
            ends = [m for m in run.finished.values() if m.finish_reason == pb.FINISH_REASON_TOOL_CALLS]
            calls.append(len(ends))
            per_answer.extend(len(m.tool_calls) for m in ends)
            good.append(sum(_call_parses(m) for m in ends))
            tokens.extend(len(ids) for ids in run.outputs.values())
    print(
        f"\ntool calls (SmolLM2, tool_choice required, parallel calls allowed): {streams} chats, ended "
        f"`tool_calls` {min(calls)}-{max(calls)} of {streams}, get_weather with a city that parses "
        f"{min(good)}-{max(good)}, calls per answer {min(per_answer)}-{max(per_answer)}; "
        f"tokens per answer median {statistics.median(tokens):.0f}, max "
        f"{max(tokens)} (max_tokens 64); tokens/s {spread([r.tokens_per_s for r in called])} against the "
        f"same chats without tools {spread([r.tokens_per_s for r in free])}; TTFT p50 "
        f"{spread([percentile(r.ttft, 50) for r in called], 1000)} ms against "
        f"{spread([percentile(r.ttft, 50) for r in free], 1000)} ms"
    )


def _call_parses(message: pb.GenerateResponse) -> bool:
    try:
        return (
            all(
                c.name == "get_weather" and isinstance(json.loads(c.arguments).get("city"), str)
                for c in message.tool_calls
            )
            and len(message.tool_calls) > 0
        )
    except (ValueError, AttributeError):
        return False


# -- preemption -------------------------------------------------------------------------------------------
def preemption(repeats: int, quick: bool) -> None:
    low_n, high_n, tokens = (8, 4, 48) if quick else (16, 8, 96)
    lows = [pb.GenerateRequest(model=NAME, chat=chat(SYSTEM[: 600 + 7 * i], QUESTIONS[i]), priority=1,
                               sampling=greedy(tokens)) for i in range(low_n)]  # fmt: skip
    highs = [pb.GenerateRequest(model=NAME, chat=chat(None, QUESTIONS[i]), priority=3,
                                sampling=greedy(tokens)) for i in range(high_n)]  # fmt: skip
    budget = (low_n // 2) * (200 + tokens + 16)  # about half the LOW streams' prompts and outputs
    flags = ("--kv-cache-bytes", str(budget * BYTES_PER_TOKEN), "--context-length", str(budget))
    with server(*flags) as s:
        idle = [percentile(asyncio.run(run_all(s.target, highs)).ttft, 99) for _ in range(3)]
        alone = asyncio.run(run_all(s.target, lows)).outputs  # waits its turn, never preempted
        p99s, served, correct = [], [], []
        before = s.metric("sluice_preemptions_total", model=NAME)
        for _ in range(repeats):

            async def mixed() -> tuple[Streams, Streams]:
                low_task = asyncio.create_task(run_all(s.target, lows))
                while s.metric("sluice_kv_slots_in_use", model=NAME) < low_n // 2:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)  # polls the server's gauge: a metric, not a local event
                high = await run_all(s.target, highs)
                return await low_task, high

            low, high = asyncio.run(mixed())
            p99s.append(percentile(high.ttft, 99))
            served.append(len(high.outputs) == high_n)
            correct.append(sum(low.outputs[i] == alone[i] for i in alone))
        preempted = s.metric("sluice_preemptions_total", model=NAME) - before
        recomputed = s.metric("sluice_recomputed_tokens_total", model=NAME)
    idle_ttft = statistics.median(idle)
    print(
        f"\npreemption (SmolLM2): {low_n} LOW chats of about 200 + {tokens} tokens in a budget of {budget} "
        f"tokens, then {high_n} HIGH chats at once: TTFT p99 {spread(p99s, 1000)} ms vs the burst on an idle "
        f"server {idle_ttft * 1000:.0f} ms = {statistics.median(p99s) / idle_ttft:.2f}x (target < 3x); every "
        f"HIGH served: {all(served)}; LOW outputs token-identical to their run alone (bfloat16: a recomputed "
        f"prefix may break a near-tie otherwise) {min(correct)}-{max(correct)} of {low_n}; "
        f"{preempted:.0f} preemptions, {recomputed:.0f} tokens recomputed"
    )


PARTS = ("prefix", "constrained", "tools", "preemption")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="one repeat, 8 streams")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--part", choices=PARTS, action="append")
    args = parser.parse_args()
    repeats, streams = (1, 8) if args.quick else (args.repeats, 32)
    from bench.smollm2 import cpu

    print(f"{cpu()}; SmolLM2-135M-Instruct in bfloat16, 1 torch thread; {repeats} repeat(s)")
    for part in args.part or PARTS:
        if part == "preemption":
            preemption(repeats, args.quick)
        else:
            {"prefix": prefix, "constrained": constrained, "tools": tools}[part](repeats, streams)


if __name__ == "__main__":
    main()
