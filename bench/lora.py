"""LoRA adapters on SmolLM2-135M-Instruct (issue 32, acceptance 2), side by side in one run:

- mixed batch: 32 greedy streams spread over 4 adapters (ranks 8, 16, 8, 16: attention and MLP) against
  32 streams of the base model: tokens/s of each, and the ratio (target >= 0.8x);
- loading while decoding: 32 base streams decode; an adapter is loaded over gRPC in their midst: the
  streams' inter-token p99 in the second after the load began against their p99 before it (target <= 2x).

The adapters are written here in PEFT's saved format (adapter_config.json + adapter_model.safetensors,
seeded tensors of the model's shapes), so the bench needs no transformers model; tests/integration/
test_lora*.py check the served adapters against PEFT itself. Repeats interleave base and adapter runs.

    .venv/bin/python -m bench.lora [--quick] [--repeats N]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import torch
from safetensors.torch import save_file
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from bench.generate import percentile, spread
from bench.stack import SluiceServer
from server.runtimes.smollm2 import NAME

# SmolLM2-135M: 30 layers, hidden 576, 9 query and 3 key/value heads of 64, MLP 1536.
LAYERS, HIDDEN, Q, KV, MLP = 30, 576, 9 * 64, 3 * 64, 1536
SHAPES = {
    "self_attn.q_proj": (HIDDEN, Q), "self_attn.k_proj": (HIDDEN, KV), "self_attn.v_proj": (HIDDEN, KV),
    "self_attn.o_proj": (Q, HIDDEN), "mlp.gate_proj": (HIDDEN, MLP), "mlp.up_proj": (HIDDEN, MLP),
    "mlp.down_proj": (MLP, HIDDEN),
}  # fmt: skip
RANKS = (8, 16, 8, 16)
PROMPT = "Write a short story about a lighthouse keeper and the storm that changed everything."


def write_adapter(directory: Path, rank: int, seed: int) -> Path:
    """A PEFT-format LoRA adapter over every projection of SmolLM2, with small seeded weights."""
    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(LAYERS):
        for module, (fan_in, fan_out) in SHAPES.items():
            key = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, fan_in, generator=generator) * 0.02
            tensors[f"{key}.lora_B.weight"] = torch.randn(fan_out, rank, generator=generator) * 0.02
    save_file(tensors, directory / "adapter_model.safetensors")
    targets = sorted({m.rpartition(".")[2] for m in SHAPES})
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": targets,
        "bias": "none",
    }
    (directory / "adapter_config.json").write_text(json.dumps(config))
    return directory


@dataclass
class Streams:
    tokens: int = 0
    wall_s: float = 0.0
    arrivals: list[list[float]] = field(default_factory=list)  # per stream: each message's perf_counter
    ready_at: int = 0  # `ready` is set once every stream has this many messages (0: never)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    _reached: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s

    def gaps(self, start: float, end: float) -> list[float]:
        """Inter-token gaps (after each stream's first token) that end in [start, end)."""
        return [b - a for times in self.arrivals for a, b in itertools.pairwise(times) if start <= b < end]


async def run_streams(target: str, models: list[str], tokens: int, into: Streams | None = None) -> Streams:
    """One greedy stream per entry of `models`, all at once (their arrivals kept in `into` as they come)."""
    into = into if into is not None else Streams()

    async def one(stub: pb_grpc.InferenceServiceStub, model: str) -> None:
        request = pb.GenerateRequest(
            model=model,
            text=PROMPT,
            sampling=pb.SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True),
        )
        times: list[float] = []
        into.arrivals.append(times)
        async for message in stub.Generate(request, timeout=900):
            if message.token_ids:
                into.tokens += len(message.token_ids)
                times.append(time.perf_counter())
                if len(times) == into.ready_at:
                    into._reached += 1
                    if into._reached == len(models):
                        into.ready.set()

    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        started = time.perf_counter()
        await asyncio.gather(*(one(stub, m) for m in models))
        into.wall_s = time.perf_counter() - started
    return into


async def load_while_decoding(
    target: str, streams: int, tokens: int, path: Path, name: str
) -> tuple[float, float]:
    """The base streams' inter-token p99 before an adapter load and in the second after it began (ms)."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        seen = Streams(ready_at=max(2, tokens // 4))  # every stream decoding, a quarter of its tokens in
        decoding = asyncio.create_task(run_streams(target, [NAME] * streams, tokens, seen))
        await seen.ready.wait()
        began = time.perf_counter()
        await stub.LoadLoraAdapter(pb.LoadLoraAdapterRequest(lora_name=name, lora_path=str(path)))
        result = await decoding
        await stub.UnloadLoraAdapter(pb.UnloadLoraAdapterRequest(lora_name=name))
    before = result.gaps(0.0, began)
    after = result.gaps(began, began + 1.0)
    return percentile(before, 99) * 1000, percentile(after, 99) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="one repeat, 4 streams, 8 tokens: checks it runs"
    )
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    repeats, streams, tokens = (1, 4, 8) if args.quick else (args.repeats, 32, 64)
    from bench.smollm2 import cpu

    print(f"{cpu()}; SmolLM2-135M-Instruct in bfloat16, 1 torch thread; {repeats} repeat(s), {tokens} tokens")
    with tempfile.TemporaryDirectory() as scratch:
        paths = [write_adapter(Path(scratch) / f"a{i}", rank, i + 1) for i, rank in enumerate(RANKS)]
        extra = write_adapter(Path(scratch) / "extra", 16, 99)
        modules = ",".join(f"a{i}={p}" for i, p in enumerate(paths))
        with SluiceServer(
            "--models", NAME, "--dtype", "bfloat16", "--torch-threads", "1", "--max-sequences", str(streams),
            "--max-queue", "128", "--lora-modules", modules, "--max-loras", "5",
        ) as server:  # fmt: skip
            asyncio.run(run_streams(server.target, [NAME, "a0"], 4))  # warm both paths
            base, mixed, loads = [], [], []
            for _ in range(repeats):
                base.append(asyncio.run(run_streams(server.target, [NAME] * streams, tokens)).tokens_per_s)
                adapters = [f"a{i % len(paths)}" for i in range(streams)]
                mixed.append(asyncio.run(run_streams(server.target, adapters, tokens)).tokens_per_s)
                loads.append(asyncio.run(load_while_decoding(server.target, streams, tokens, extra, "extra")))
    ratios = [m / b for m, b in zip(mixed, base, strict=True)]
    print(
        f"\nmixed batch: {streams} streams over {len(paths)} adapters (ranks {', '.join(map(str, RANKS))}) "
        f"{spread(mixed, digits=1)} tokens/s against {streams} base streams {spread(base, digits=1)}: "
        f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}] (target >= 0.8x)"
    )
    worse = [after / before for before, after in loads]
    print(
        f"loading a rank-16 adapter while {streams} streams decode: inter-token p99 before "
        f"{spread([b for b, _ in loads], digits=1)} ms, in the second after "
        f"{spread([a for _, a in loads], digits=1)} ms: {statistics.median(worse):.2f}x "
        f"[{min(worse):.2f}-{max(worse):.2f}] (target <= 2x)"
    )


if __name__ == "__main__":
    main()
