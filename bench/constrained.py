"""Constrained generation's cost (issue 20, acceptance 2), on the seeded Llama of bench.hf_generate with a
byte-level BPE tokenizer of 8,192 tokens trained here (so masks run over a real vocabulary), served by the
real server and driven by the gRPC client:

- tokens/s at 32 streams with every stream under a JSON schema, against the same 32 streams unconstrained,
  side by side in each repeat (target: at least 0.9);
- 1 constrained stream among 31 unconstrained: the unconstrained streams' tokens/s against 32
  unconstrained (target: they lose under 2%);
- TTFT p50 constrained against unconstrained;
- compile time of a 50-property schema, cold (first compile, and the vocabulary's build) and cached.

Every stream samples at temperature 1 with its own seed for the same number of tokens (unconstrained ones
ignore EOS; constrained ones end where the schema does, which an untrained model almost never reaches
before max_tokens). Medians over repeats, with their range.

    .venv/bin/python -m bench.constrained [--quick] [--repeats N] [--streams N] [--tokens N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import torch
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from bench.generate import percentile, spread
from bench.hf_generate import CONFIG
from bench.stack import running

MODEL = "llama"
PROMPT = "Write a record: "
# Long strings and arrays: a schema whose output runs on, so constrained streams generate as many tokens.
SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "count": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "notes": {"type": "string"},
    },
    "required": ["title", "count", "tags", "notes"],
}
WIDE = {
    "type": "object",
    "properties": {
        f"field_{i}": [{"type": "integer"}, {"type": "string", "maxLength": 20}, {"type": "boolean"}][i % 3]
        for i in range(50)
    },
    "required": [f"field_{i}" for i in range(50)],
    "additionalProperties": False,
}


def build(directory: Path) -> Path:
    """The bench Llama with a BPE tokenizer trained on the installed transformers' model sources (sorted:
    the same files give the same vocabulary)."""
    import tokenizers
    import transformers

    sources = sorted(glob.glob(str(Path(transformers.__file__).parent / "models" / "*" / "modeling_*.py")))
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=CONFIG["vocab_size"],
        special_tokens=["</s>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train(sources[:400], trainer)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="</s>")
    tokenizer.save_pretrained(directory)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        **{**CONFIG, "vocab_size": len(tokenizer)}, eos_token_id=tokenizer.eos_token_id
    )
    transformers.LlamaForCausalLM(config).eval().save_pretrained(directory)
    return directory


class Run:
    """Per group (constrained or not): tokens, TTFTs, and the group's own span (its first start to its
    last token), so one group's rate is not stretched by the other's slowest stream."""

    def __init__(self) -> None:
        self.tokens: dict[bool, int] = {True: 0, False: 0}
        self.ttft: dict[bool, list[float]] = {True: [], False: []}
        self.start: dict[bool, float] = {True: float("inf"), False: float("inf")}
        self.end: dict[bool, float] = {True: 0.0, False: 0.0}
        self.hostile = 0

    def rate(self, constrained: bool) -> float:
        return self.tokens[constrained] / (self.end[constrained] - self.start[constrained])


async def _stream(
    stub: pb_grpc.InferenceServiceStub, seed: int, tokens: int, constrained: bool, run: Run
) -> None:
    sampling = pb.SamplingParams(max_tokens=tokens, seed=seed, temperature=1.0, ignore_eos=not constrained)
    request = pb.GenerateRequest(model=MODEL, text=PROMPT, sampling=sampling)
    if constrained:
        request.constraint.json_schema = json.dumps(SCHEMA)
    started = time.perf_counter()
    run.start[constrained] = min(run.start[constrained], started)
    first = True
    async for message in stub.Generate(request, timeout=600):
        if message.token_ids:
            now = time.perf_counter()
            if first:
                run.ttft[constrained].append(now - started)
                first = False
            run.tokens[constrained] += len(message.token_ids)
            run.end[constrained] = max(run.end[constrained], now)


# What a hostile caller sends meanwhile: refused by the limits before compiling, or compiled under them.
HOSTILE = [
    pb.Constraint(json_schema="[" * 10_000 + "]" * 10_000),
    pb.Constraint(regex="|".join(f"(a{i}b+)+c" for i in range(3000))[:60_000]),
    pb.Constraint(grammar=pb.Grammar(text="start: " + " | ".join(f'"w{i}" start' for i in range(5000)))),
]


async def _hostile(stub: pb_grpc.InferenceServiceStub, stop: asyncio.Event) -> int:
    """Sends hostile constraints one after another until `stop`; returns how many were answered."""
    answered = 0
    while not stop.is_set():
        for constraint in HOSTILE:
            request = pb.GenerateRequest(model=MODEL, text="x", sampling=pb.SamplingParams(max_tokens=4))
            request.constraint.CopyFrom(constraint)
            with contextlib.suppress(grpc.aio.AioRpcError):
                async for _ in stub.Generate(request, timeout=60):
                    pass
            answered += 1
    return answered


async def _load(target: str, streams: int, tokens: int, constrained: int, *, hostile: bool = False) -> Run:
    """`streams` streams at once, the first `constrained` of them under the schema; with `hostile`, a
    caller sends hostile constraints all the while."""
    run = Run()
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        stop = asyncio.Event()
        attacker = asyncio.create_task(_hostile(stub, stop)) if hostile else None
        await asyncio.gather(*(_stream(stub, i, tokens, i < constrained, run) for i in range(streams)))
        stop.set()
        if attacker is not None:
            run.hostile = await attacker
    return run


def compile_times(directory: Path, repeats: int) -> tuple[float, float, float]:
    """Milliseconds: the vocabulary's build, a cold compile of the 50-property schema, a cached one."""
    from server.logits.grammar import GrammarCompiler
    from server.logits.vocab import grammar_tokenizer
    from server.runtimes.hf_checkpoint import HfCheckpoint
    from wire.constraint import Constraint

    checkpoint = HfCheckpoint(directory, context_length=0)
    model: Any = SimpleNamespace(
        eos_id=checkpoint.eos_id,
        vocab_size=checkpoint.vocab_size,
        token_bytes=lambda i: checkpoint.token_bytes[i],
        encode=checkpoint.encode,
    )
    started = time.perf_counter()
    grammar_tokenizer(model)
    vocabulary_ms = 1000 * (time.perf_counter() - started)
    cold, cached = [], []
    for i in range(repeats):
        compiler = GrammarCompiler(model)
        wide = Constraint.json_schema(json.dumps({**WIDE, "description": f"repeat {i}"}))
        started = time.perf_counter()
        compiler.matcher(wide)
        cold.append(1000 * (time.perf_counter() - started))
        started = time.perf_counter()
        compiler.matcher(wide)
        cached.append(1000 * (time.perf_counter() - started))
    return vocabulary_ms, statistics.median(cold), statistics.median(cached)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="one repeat, shorter streams")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=128, help="tokens per stream")
    parser.add_argument("--torch-threads", type=int, default=1)
    args = parser.parse_args()
    repeats, tokens = (1, 32) if args.quick else (args.repeats, args.tokens)
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    name = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if "Model name" in line), "?")
    with tempfile.TemporaryDirectory() as folder:
        directory = build(Path(folder) / "llama")
        vocabulary_ms, cold_ms, cached_ms = compile_times(directory, repeats=max(repeats, 3))
        flags = [
            "--models",
            MODEL,
            "--hf-models",
            f"{MODEL}={directory}",
            "--torch-threads",
            str(args.torch_threads),
        ]
        print(
            f"CPU: {name}; seeded Llama {CONFIG}, BPE vocabulary of {CONFIG['vocab_size']}, {args.streams} "
            f"streams x {tokens} tokens, temperature 1, {repeats} repeat(s), gRPC client in-process"
        )
        free, every, one, made, beside, hostile = [], [], [], [], [], []
        ttft_free, ttft_constrained = [], []
        with running(*flags) as (server, _):
            asyncio.run(_load(server.target, args.streams, 8, args.streams))  # warm-up: compile, first steps
            for _ in range(repeats):
                plain = asyncio.run(_load(server.target, args.streams, tokens, 0))
                constrained = asyncio.run(_load(server.target, args.streams, tokens, args.streams))
                mixed = asyncio.run(_load(server.target, args.streams, tokens, 1))
                free.append(plain.rate(False))
                attacked = asyncio.run(_load(server.target, args.streams - 1, tokens, 0, hostile=True))
                beside.append(attacked.rate(False) / (free[-1] * (args.streams - 1) / args.streams))
                hostile.append(attacked.hostile)
                every.append(constrained.rate(True))
                made.append(constrained.tokens[True] / (args.streams * tokens))
                # The 31 unconstrained streams of the mixed run against 31/32 of the all-free run's rate.
                one.append(mixed.rate(False) / (free[-1] * (args.streams - 1) / args.streams))
                ttft_free.append(percentile(plain.ttft[False], 50))
                ttft_constrained.append(percentile(constrained.ttft[True], 50))
    ratios = [c / f for c, f in zip(every, free, strict=True)]
    n = args.streams
    print("\naggregate tokens/s, median [min-max] of repeats")
    print(f"  {n} unconstrained:       {spread(free)}")
    print(f"  {n} under a JSON schema: {spread(every)}   ratio {spread(ratios, digits=2)}")
    print(f"  (constrained streams made {spread(made, 100, 1)}% of max_tokens; the rest ended in the schema)")
    print(f"  1 constrained among {n - 1}, the others' rate / unconstrained: {spread(one, digits=3)}")
    print(
        f"  {n - 1} unconstrained beside a caller sending hostile constraints ({spread(hostile)} answered "
        f"per run), their rate / unconstrained: {spread(beside, digits=3)}"
    )
    ttfts = f"unconstrained {spread(ttft_free, 1000, 1)}, constrained {spread(ttft_constrained, 1000, 1)}"
    print(f"TTFT p50, ms: {ttfts}")
    print(
        f"50-property schema: vocabulary build {vocabulary_ms:.1f} ms (once per model), compile cold "
        f"{cold_ms:.2f} ms, cached {cached_ms:.3f} ms (median of {max(repeats, 3)})"
    )
    print("\ntargets:")
    print(f"  constrained >= 0.9 x unconstrained tokens/s: {statistics.median(ratios):.2f} -> "
          f"{'met' if statistics.median(ratios) >= 0.9 else 'MISSED'}")  # fmt: skip
    print(f"  1 constrained costs the others < 2%: {1 - statistics.median(one):+.1%} -> "
          f"{'met' if statistics.median(one) >= 0.98 else 'MISSED'}")  # fmt: skip


if __name__ == "__main__":
    main()
