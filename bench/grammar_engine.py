"""The grammar engine's own costs (docs/constrained.md, "The engine"), through the server's code
(server/logits/): llguidance's tokenizer built from a vocabulary, a cold compile of a 50-property JSON schema
(bench.constrained's), a cached one (the copy each request takes), and the mask of each token along a random
walk of --tokens tokens through that schema (a token drawn from each mask, as sampling would). Two
vocabularies: the byte LM's 257 and bench.constrained's byte-level BPE of 8,192 (trained here). Medians of
repeats with their range; the walk's masks as median and p90.

    .venv/bin/python -m bench.grammar_engine [--quick] [--repeats N] [--tokens N]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from bench.shim_latency import cpu_model
from bench.stats import Spread, percentile


def byte_vocabulary() -> Any:
    """The byte LM's vocabulary: 256 bytes and EOS."""
    return SimpleNamespace(
        eos_id=256,
        vocab_size=257,
        token_bytes=lambda i: bytes([i]) if i < 256 else b"",
        encode=lambda text: list(text.encode()),
    )


def bpe_vocabulary(directory: Path) -> Any:
    """bench.constrained's BPE tokenizer, read as the server reads a checkpoint."""
    from bench.constrained import build
    from server.runtimes.hf_checkpoint import HfCheckpoint

    checkpoint = HfCheckpoint(build(directory), context_length=0)
    return SimpleNamespace(
        eos_id=checkpoint.eos_id,
        vocab_size=checkpoint.vocab_size,
        token_bytes=lambda i: checkpoint.token_bytes[i],
        encode=checkpoint.encode,
    )


def measure(vocabulary: Any, *, repeat: int, tokens: int) -> tuple[float, float, float, list[float]]:
    """(tokenizer build ms, cold compile ms, cached ms, [mask us per token]) of one repeat."""
    from bench.constrained import WIDE
    from server.logits.grammar import GrammarCompiler
    from server.logits.vocab import grammar_tokenizer
    from wire.constraint import Constraint

    model = SimpleNamespace(**vars(vocabulary))  # a new object: the tokenizer is built again, not reused
    started = time.perf_counter()
    grammar_tokenizer(model)  # type: ignore[arg-type]
    build_ms = 1000 * (time.perf_counter() - started)
    compiler = GrammarCompiler(model)  # type: ignore[arg-type]
    schema = Constraint.json_schema(json.dumps({**WIDE, "description": f"repeat {repeat}"}))
    started = time.perf_counter()
    matcher = compiler.matcher(schema)
    cold_ms = 1000 * (time.perf_counter() - started)
    started = time.perf_counter()
    compiler.matcher(schema)
    cached_ms = 1000 * (time.perf_counter() - started)
    rng, masks = random.Random(repeat), []
    for _ in range(tokens):
        if matcher.is_stopped() or matcher.is_error():
            matcher = compiler.matcher(schema)
        started = time.perf_counter()
        bitmask = matcher.compute_bitmask()
        masks.append(1e6 * (time.perf_counter() - started))
        bits = np.unpackbits(np.frombuffer(bitmask, dtype=np.uint8), bitorder="little")[: model.vocab_size]
        allowed = np.flatnonzero(bits)
        matcher.consume_token(int(allowed[rng.randrange(len(allowed))]))
    return build_ms, cold_ms, cached_ms, masks


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.grammar_engine", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one repeat, the byte vocabulary only")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=200, help="tokens of the random walk")
    args = parser.parse_args()
    import llguidance

    repeats = 1 if args.quick else args.repeats
    print(f"CPU: {cpu_model()}; llguidance {llguidance.__version__}; {repeats} repeats, median [min-max]")
    columns = ("vocabulary", "tokenizer build", "compile, 50 properties", "compile, cached", "mask per token")
    print("\n| " + " | ".join(columns) + ", median / p90 |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="sluice-grammar-") as folder:
        vocabularies = [("257 (bytes)", byte_vocabulary())]
        if not args.quick:
            vocabularies.append(("8,192 (BPE)", bpe_vocabulary(Path(folder))))
        for name, vocabulary in vocabularies:
            runs = [measure(vocabulary, repeat=r, tokens=args.tokens) for r in range(repeats)]
            masks = [us for run in runs for us in run[3]]
            build, cold, cached = (Spread.of([run[0] for run in runs]), Spread.of([run[1] for run in runs]),
                                   Spread.of([run[2] for run in runs]))  # fmt: skip
            print(
                f"| {name} | {build.format(2)} ms | {cold.format(2)} ms | {cached.format(3)} ms | "
                f"{percentile(masks, 50):.0f} / {percentile(masks, 90):.0f} us |"
            )


if __name__ == "__main__":
    main()
