"""One Generate step of bench.hf_generate's Llama on the server's own code (server/batching/step.py's
run_step over the native decoder), batch 8 decoding at --position, alone and beside a thread that holds
the GIL (as the event loop does while it delivers): each torch call the model thread makes from Python
gives the GIL up and waits to take it back. Two kinds of step: the fast path (every row decodes on from the
step before, all greedy: no input gather, no sampling tensors) and the general one (temperature 1, one row
whose input is not the step before's: the gather and the sampling tensors). Milliseconds per step, the
median of repeats with their range; the server's GIL switch interval (0.1 ms), one torch thread.

    .venv/bin/python -m bench.step_gil [--quick] [--repeats N] [--steps N] [--position N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.shim_latency import cpu_model
from bench.stats import Spread

ROWS = 8


def model_of(directory: Path, room: int) -> Any:
    from bench.hf_generate import CONFIG, build
    from server.runtimes.hf_causal import load_hf_causal

    model = load_hf_causal(
        build(directory), name="llama", context_length=CONFIG["max_position_embeddings"],
        max_sequences=ROWS, device=torch.device("cpu"), dtype=torch.float32,
    )  # fmt: skip
    model.allocate_cache(ROWS * room)
    return model


def steps_ms(model: Any, *, general: bool, position: int, steps: int, room: int) -> list[float]:
    """Prefill ROWS prompts of `position` tokens, then time `steps` decode steps through run_step."""
    from server.batching.step import StepChain, StepPlan, run_step
    from server.domain import SamplingParams
    from server.runtimes.base import Prefill

    bases = [row * room for row in range(ROWS)]
    prompt = [
        int(t) for t in torch.randint(1, model.vocab_size - 1, (position,), generator=torch.Generator())
    ]
    first = model.prefill_many([Prefill(base, prompt, 0) for base in bases]).argmax(dim=-1).tolist()
    params = [
        SamplingParams(max_tokens=steps, temperature=1.0 if general else 0.0, seed=row) for row in range(ROWS)
    ]
    chain, times = StepChain(), []
    chain.tokens = torch.tensor(first, dtype=torch.long)
    for step in range(steps):
        plan = StepPlan(
            moves=[], compactions=[], prefills=[], bases=bases, last_tokens=first,
            prev_rows=[*range(ROWS - 1), -1] if general else list(range(ROWS)),
            positions=[position + step] * ROWS, params=params,
            uniforms=np.random.default_rng(step).random(ROWS), eos_masked=[], logprob_rows=[], processed=[],
            greedy=not general,
        )  # fmt: skip
        result = run_step(model, plan, chain)
        times.append(1000 * (result.finished - result.started))
    return times


class GilHolder:
    """A thread that runs Python bytecode without pause, so the GIL is taken from it only at the switch
    interval (as the event loop's delivery burst holds it)."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self) -> None:
        count = 0
        while not self.stop.is_set():
            for _ in range(1000):
                count += 1

    def __enter__(self) -> GilHolder:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.step_gil", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one repeat of 20 steps")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40, help="timed decode steps per repeat")
    parser.add_argument("--position", type=int, default=200, help="tokens already in each row's cache")
    args = parser.parse_args()
    repeats, steps = (1, 20) if args.quick else (args.repeats, args.steps)
    torch.set_num_threads(1)
    sys.setswitchinterval(0.0001)  # the server's --switch-interval-ms default
    room = args.position + steps + 16
    print(f"CPU: {cpu_model()}; batch {ROWS} at position {args.position}; {repeats} repeats of {steps} steps")
    print("ms per step (median of the steps), median [min-max] of the repeats\n")
    print("| step | alone | beside a GIL-holding thread |\n|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="sluice-step-") as folder:
        model = model_of(Path(folder), room)
        steps_ms(model, general=False, position=args.position, steps=5, room=room)  # warm-up
        for general in (False, True):
            alone, beside = [], []
            for _ in range(repeats):
                alone.append(statistics.median(steps_ms(model, general=general, position=args.position,
                                                        steps=steps, room=room)))  # fmt: skip
                with GilHolder():
                    beside.append(statistics.median(steps_ms(model, general=general, position=args.position,
                                                             steps=steps, room=room)))  # fmt: skip
            name = (
                "general (sampling tensors, input gather)" if general else "fast path (greedy, rows continue)"
            )
            print(f"| {name} | {Spread.of(alone).format(2)} | {Spread.of(beside).format(2)} |")


if __name__ == "__main__":
    main()
