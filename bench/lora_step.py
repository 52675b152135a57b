"""One decode step of SmolLM2-135M-Instruct in bfloat16 at 32 rows, in-process (issue 32): the base model's
step against the same step with the rows spread over 4 adapters (ranks 8, 16, 8, 16, every projection, as
bench.lora), its adapters banked (lora_stack.py: one masked x @ A @ B per projection) and grouped per
adapter (each adapter's rows gathered, multiplied and scattered on their own: the adapters unbanked, what
steps ran before banks). Rounds interleave the three; medians of the step's thread CPU time and wall time,
[p25-p75]; the LoRA share is (mixed - base) / mixed. No server: what the model's thread does per step.

    .venv/bin/python -m bench.lora_step [--rounds N] [--rows N] [--profile]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType, SimpleNamespace
from typing import Any

import torch

from bench.lora import RANKS, write_adapter
from server.runtimes.hf_causal import load_hf_causal
from server.runtimes.lora import LoraLimits
from server.runtimes.lora_stack import LoraStacks
from server.runtimes.smollm2 import smollm2_gguf
from server.runtimes.step_batch import StepBatch

CONTEXT = 60  # tokens each row has decoded before the step (bench.lora's prompt and some output)


def quartiles(values: list[float]) -> str:
    ordered = sorted(v * 1e3 for v in values)
    low, high = ordered[len(ordered) // 4], ordered[3 * len(ordered) // 4]
    return f"{statistics.median(ordered):.1f} [{low:.1f}-{high:.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--profile", action="store_true", help="torch.profiler's table of 5 steps of each")
    args = parser.parse_args()
    from bench.smollm2 import cpu

    torch.set_num_threads(1)
    rows = args.rows
    model: Any = load_hf_causal(
        smollm2_gguf(), name="smollm2", context_length=512, max_sequences=rows,
        device=torch.device("cpu"), dtype=torch.bfloat16,
    )  # fmt: skip
    model.allocate_cache(rows * 128)
    with tempfile.TemporaryDirectory() as scratch:
        limits = LoraLimits(max_rank=16, max_loras=len(RANKS))
        adapters = [
            model.read_adapter(f"a{i}", write_adapter(Path(scratch) / f"a{i}", rank, i + 1), limits)
            for i, rank in enumerate(RANKS)
        ]
    model.adapters = MappingProxyType({a.name: a for a in adapters})
    model.adapters_changed()
    banked: LoraStacks = model._stacks
    grouped = LoraStacks(torch.bfloat16, torch.device("cpu"))  # never restacked: every adapter on its own
    bases = [row * 128 for row in range(rows)]
    with torch.inference_mode():
        for base in bases:
            model.prefill(base, list(range(100, 100 + CONTEXT)))
    tokens = torch.full((rows,), 200, dtype=torch.long)
    positions = torch.full((rows,), CONTEXT, dtype=torch.long)
    none = [SimpleNamespace(adapter=None)] * rows
    mixed = [SimpleNamespace(adapter=adapters[row % len(adapters)]) for row in range(rows)]

    def step(extras: list[Any], stacks: LoraStacks) -> Callable[[], None]:
        def run() -> None:
            model._stacks = stacks
            with torch.inference_mode():
                model.step(StepBatch([], bases, tokens, positions, decode_extras=extras))

        return run

    runs = {"base": step(none, banked), "banked": step(mixed, banked), "grouped": step(mixed, grouped)}
    print(f"{cpu()}; SmolLM2-135M-Instruct in bfloat16, 1 torch thread; one decode step of {rows} rows")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        for name, run in runs.items():
            run()
            with profile(activities=[ProfilerActivity.CPU]) as profiled:
                for _ in range(5):
                    run()
            print(name, profiled.key_averages().table(sort_by="self_cpu_time_total", row_limit=12), sep="\n")
        return
    for run in runs.values():
        run()
    cpu_s: dict[str, list[float]] = {name: [] for name in runs}
    wall_s: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            started, busy = time.perf_counter(), time.thread_time()
            run()
            cpu_s[name].append(time.thread_time() - busy)
            wall_s[name].append(time.perf_counter() - started)
    for name in runs:
        print(f"{name:8} thread CPU {quartiles(cpu_s[name])} ms, wall {quartiles(wall_s[name])} ms")
    base = statistics.median(cpu_s["base"])
    for name in ("banked", "grouped"):
        step_s = statistics.median(cpu_s[name])
        print(
            f"{name}: base/mixed {base / step_s:.2f}x, LoRA share of the mixed step "
            f"{(step_s - base) / step_s:.0%} (thread CPU medians, {args.rounds} rounds)"
        )


if __name__ == "__main__":
    main()
