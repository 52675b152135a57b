"""Quality and size of weight-only quantization (issue 30) on SmolLM2-135M-Instruct: for float32, bfloat16,
int8 and int4, the perplexity of a fixed held-out public-domain text shipped in the repo (Jane Austen,
Pride and Prejudice, 1813, chapters 1-2: bench/data/), the share of greedy tokens equal to float32's over
20 chat prompts, and the native decoder's resident weight bytes against float32's.

The only SmolLM2 weights in the box are the GGUF file's Q4_1, so "float32" is that file dequantized: int8
and int4 are measured against it (int4 through the native decoder keeps the file's Q4_1 blocks exactly;
here, on transformers' forward with quantized.py's kernels in every nn.Linear, they are requantized from
the float32 weights, the path a dense checkpoint takes). Greedy runs compare token by token until the
first difference counts every later token as differing, as a user reading the text would.

    .venv/bin/python -m bench.quantization [--quick] [--threads 1]
"""

from __future__ import annotations

import argparse
import copy
import math
import time
from pathlib import Path
from typing import Any

import torch

from bench.smollm2 import cpu, load_hf
from server.runtimes.hf_quantized import quantize_linears
from server.runtimes.quantized import Quantized, embedding_tables
from server.runtimes.smollm2 import smollm2_gguf

TEXT = Path(__file__).parent / "data" / "pride_and_prejudice_ch1_2.txt"
WINDOW = 1024  # tokens per forward pass of the perplexity (non-overlapping windows)
QUESTIONS = [
    "What is the capital of France?", "Write a haiku about autumn.", "Explain photosynthesis briefly.",
    "Give three tips for learning a language.", "What is 17 times 23?", "Describe a cat to a child.",
    "Why is the sky blue?", "Name the planets of the solar system.", "Write a short poem about the sea.",
    "What does a compiler do?", "How do vaccines work?", "Suggest a name for a bakery.",
    "Summarise the story of Cinderella.", "What is the boiling point of water?", "How do I make tea?",
    "Tell me a joke about computers.", "What is gravity?", "List three healthy breakfasts.",
    "Translate 'good morning' into Spanish.", "What is a prime number?",
]  # fmt: skip
SETTINGS = ("float32", "bfloat16", "int8", "int4", "w8a8_int8")


def variant(base: Any, setting: str) -> Any:
    """The float32 model as `setting`: a dtype, or float32 with its linear layers packed."""
    if setting == "bfloat16":
        return copy.deepcopy(base).to(torch.bfloat16)
    model = copy.deepcopy(base)
    quantize_linears(model, "none" if setting == "float32" else setting, torch.float32, torch.device("cpu"))
    if setting == "w8a8_int8":  # rows looked up as the native decoder does: in int4 (its head packed above)
        embedding = model.get_input_embeddings()
        rows, _ = embedding_tables(embedding.weight.detach(), setting)
        if isinstance(rows, Quantized):
            embedding.weight = torch.nn.Parameter(rows.dequantize(), requires_grad=False)
    return model


def perplexity(model: Any, ids: list[int]) -> float:
    nll, count = 0.0, 0
    with torch.inference_mode():
        for start in range(0, len(ids) - 1, WINDOW):
            window = torch.tensor([ids[start : start + WINDOW + 1]])
            logits = model(input_ids=window[:, :-1]).logits.float()
            loss = torch.nn.functional.cross_entropy(logits[0], window[0, 1:], reduction="sum")
            nll, count = nll + float(loss), count + window.shape[1] - 1
    return math.exp(nll / count)


def greedy(model: Any, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    outs = []
    with torch.inference_mode():
        for ids in prompts:
            out = model.generate(torch.tensor([ids]), max_new_tokens=tokens, do_sample=False, pad_token_id=0)
            outs.append([int(t) for t in out[0, len(ids) :]])
    return outs


def agreement(ours: list[list[int]], reference: list[list[int]]) -> float:
    equal = total = 0
    for a, b in zip(ours, reference, strict=True):
        prefix = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        equal, total = equal + prefix, total + len(b)
    return equal / total


def native_weight_bytes(setting: str) -> int:
    from server.runtimes.gguf_file import read_config
    from server.runtimes.llama import LlamaDecoder

    path = smollm2_gguf()
    dtype = torch.bfloat16 if setting == "bfloat16" else torch.float32
    mode = setting if setting in ("int8", "int4", "w8a8_int8") else "none"
    return LlamaDecoder(
        path, read_config(path), dtype=dtype, device=torch.device("cpu"), quantization=mode
    ).weights_bytes()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="512 text tokens, 8 prompts of 16 tokens")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base, tokenizer = load_hf(torch.float32)
    text = tokenizer(TEXT.read_text(), add_special_tokens=False)["input_ids"]
    questions, tokens = (QUESTIONS[:8], 16) if args.quick else (QUESTIONS, 32)
    text = text[:513] if args.quick else text
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=True, add_generation_prompt=True
        )
        for q in questions
    ]
    prompts = [p if isinstance(p, list) else p["input_ids"] for p in prompts]
    print(cpu(), f"; {args.threads} thread(s)")
    print(f"text: {TEXT.name}, {len(text)} tokens; {len(prompts)} prompts x {tokens} greedy tokens")
    columns = ("perplexity", 11), ("vs f32", 7), ("greedy = f32", 13), ("weights MiB", 12), ("vs f32", 7)
    print(f"{'setting':>9} " + " ".join(f"{name:>{width}}" for name, width in columns) + f" {'s':>6}")
    reference: list[list[int]] = []
    first_ppl = first_bytes = 0.0
    for setting in SETTINGS:
        started = time.perf_counter()
        model = variant(base, setting)
        ppl = perplexity(model, text)
        outs = greedy(model, prompts, tokens)
        reference = reference or outs
        size = native_weight_bytes(setting)
        first_ppl, first_bytes = first_ppl or ppl, first_bytes or size
        print(
            f"{setting:>9} {ppl:>11.3f} {ppl / first_ppl - 1:>+7.1%} {agreement(outs, reference):>13.1%} "
            f"{size / 2**20:>12.1f} {size / first_bytes:>7.2f} {time.perf_counter() - started:>6.0f}",
            flush=True,
        )
    print(
        "targets (issue 30): perplexity within 3% of float32 for int8, 10% for int4; weights <= 0.3x float32"
    )


if __name__ == "__main__":
    main()
