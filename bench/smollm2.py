"""SmolLM2-135M-Instruct (the embedded `smollm2`, a real model) served by Sluice at 1, 8 and 32 streams,
beside the raw Hugging Face batched decode loop in the same dtype (in-process, HF's own KV cache, greedy) and
the llama.cpp server a CPU user would start on the same GGUF file (`python -m llama_cpp.server`, from
`llama-cpp-python[server]`, built from PyPI source by `make bench-llamacpp` into .venv-llamacpp, never by
`make test`). Every stream writes the same number of tokens after the same chat prompt (Sluice: ignore_eos;
the raw loop: a fixed count; llama.cpp: its end-of-turn tokens banned through logit_bias). The three sides
run interleaved, repeat by repeat, so that other load on the machine hits them alike. Sluice is measured
with h2load (a C client, so that the server alone is timed, as the llama.cpp server alone is) and with the
Python gRPC client beside it.

    make bench-llamacpp   # once: builds llama-cpp-python (about 10 minutes on 2 cores)
    .venv/bin/python -m bench.smollm2 [--dtype bfloat16|float32] [--quantization none|int8|int4|w8a8_int8]
        [--repeats 3] [--tokens 128] [--quick] [--streams 1,8,32] [--no-llamacpp] [--beside none]

With --quantization int4 Sluice keeps the file's Q4_1 blocks (docs/quantization.md), as llama.cpp does; the
raw HF loop stays dense in --dtype. `--beside MODE` runs a second Sluice server in MODE (`none`: dense
--dtype) in the same repeats, timed by h2load, for issue 30's "no slower than the best unquantized dtype in
the same run" at 32 streams.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch

from bench.generate import CONCURRENCY, Load, Run, concurrent, spread
from bench.hf_generate import h2load_run
from bench.llamacpp import LlamaCppServer, llamacpp_python
from bench.stack import running
from server.runtimes.smollm2 import NAME, smollm2_gguf

BESIDE = "sluice --beside, h2load"  # the second server's side (issue 30's dense reference)
QUESTION = "Tell me a long story about a lighthouse keeper and the sea."


def load_hf(dtype: torch.dtype) -> tuple[Any, Any]:
    """transformers' LlamaForCausalLM with the GGUF file's weights dequantized to dense `dtype` tensors (as a
    user who converted the file to safetensors would load it: transformers' own GGUF loader keeps the
    weights packed and dequantizes them in every matmul, which is slower), and the file's tokenizer."""
    import transformers

    from server.runtimes.gguf_file import load_weights, read_config

    path = smollm2_gguf()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    config = read_config(path)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    weights = load_weights(path, config, dtype=dtype, device=torch.device("cpu"))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise RuntimeError(f"weights do not fit the model: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    return model.eval(), tokenizer


def raw_decode(model: Any, ids: list[int], batch: int, tokens: int) -> Run:
    """Prefill `batch` copies of the prompt in one pass, then `tokens - 1` batched greedy decode steps."""
    import time

    prompt = torch.tensor([ids] * batch)
    with torch.inference_mode():
        started = time.perf_counter()
        out = model(input_ids=prompt, use_cache=True)
        cache, next_tokens = out.past_key_values, out.logits[:, -1].argmax(dim=-1)
        for _ in range(tokens - 1):
            out = model(input_ids=next_tokens[:, None], past_key_values=cache, use_cache=True)
            next_tokens = out.logits[:, -1].argmax(dim=-1)
        next_tokens.tolist()
        wall = time.perf_counter() - started
    return Run(tokens=batch * tokens, wall_s=wall)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument(
        "--quantization", default="none", choices=("none", "int8", "int4", "w8a8_int8"), help="Sluice's"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128, help="tokens per stream")
    parser.add_argument("--quick", action="store_true", help="one repeat, 32 tokens per stream")
    # One thread each: what the server picks on these 2-core machines (all cores but one), the raw loop and
    # llama.cpp alike, so that the ratios compare the engines and not the threads they were given.
    parser.add_argument("--threads", type=int, default=1, help="torch threads and llama.cpp threads")
    parser.add_argument("--no-llamacpp", action="store_true", help="skip the llama.cpp server")
    parser.add_argument(
        "--beside", choices=("none", "int8", "int4", "w8a8_int8"), help="a second Sluice in this mode"
    )
    parser.add_argument(
        "--streams", default=",".join(map(str, CONCURRENCY)), help="concurrent streams, comma-separated"
    )
    args = parser.parse_args()
    streams = tuple(int(b) for b in args.streams.split(","))
    repeats, tokens = (1, 32) if args.quick else (args.repeats, args.tokens)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    model, tokenizer = load_hf(dtype)
    messages = [{"role": "user", "content": QUESTION}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    ends = sorted({int(t) for t in (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>"))})
    llamacpp = None if args.no_llamacpp else llamacpp_python()
    print(cpu())
    print(
        f"model: {NAME} (SmolLM2-135M-Instruct, {smollm2_gguf().name}), {args.dtype} in Sluice and the raw "
        f"loop, Sluice's weights quantized: {args.quantization}; {args.threads} thread(s) each; {tokens} "
        f"tokens per stream after a {len(ids)}-token chat prompt; {repeats} repeat(s); "
        f"llama.cpp: {llamacpp or 'not installed (make bench-llamacpp)'}"
    )
    for b in streams:  # transformers' first pass at a batch size is slow
        raw_decode(model, ids, b, 2)
    sides: dict[str, dict[int, list[Run]]] = {
        side: {b: [] for b in streams}
        for side in ("raw HF loop", "sluice, h2load", "sluice, Python", "llama.cpp server", BESIDE)
    }
    flags = ["--models", NAME, "--dtype", args.dtype, "--torch-threads", str(args.threads)]
    flags += ["--max-sequences", "32", "--max-queue", "64", "--context-length", "2048"]
    beside_flags = [*flags, "--quantization", args.beside or "none"]
    flags += ["--quantization", args.quantization]
    work = Load(model=NAME, prompt=prompt, temperature=0.0, ignore_eos=True)
    with (
        tempfile.TemporaryDirectory(prefix="sluice-bench-smollm2-") as scratch,
        running(*flags) as (server, _),
        running(*beside_flags) if args.beside else _nothing() as beside,
    ):
        asyncio.run(concurrent(server.target, 4, 8, load=work))  # warm the paths
        if beside is not None:
            asyncio.run(concurrent(beside[0].target, 4, 8, load=work))
        with LlamaCppServer(llamacpp, smollm2_gguf(), args.threads) if llamacpp else _nothing() as cpp:
            if cpp is not None:
                asyncio.run(cpp.completions(prompt, 1, 4, ends))
            for repeat in range(repeats):
                print(f"  repeat {repeat + 1} of {repeats}", flush=True)
                for b in streams:
                    sides["raw HF loop"][b].append(raw_decode(model, ids, b, tokens))
                    h2 = h2load_run(server.target, b, tokens, Path(scratch), model=NAME, text=prompt)
                    if h2 is not None:
                        sides["sluice, h2load"][b].append(h2)
                    if beside is not None:
                        target = beside[0].target
                        other = h2load_run(target, b, tokens, Path(scratch), model=NAME, text=prompt)
                        if other is not None:
                            sides[BESIDE][b].append(other)
                    sides["sluice, Python"][b].append(
                        asyncio.run(concurrent(server.target, b, tokens, load=work))
                    )
                    if cpp is not None:
                        sides["llama.cpp server"][b].append(
                            asyncio.run(cpp.completions(prompt, b, tokens, ends))
                        )
    report({side: runs for side, runs in sides.items() if runs[streams[0]]}, streams)


def report(sides: dict[str, dict[int, list[Run]]], streams: tuple[int, ...] = CONCURRENCY) -> None:
    print("\naggregate tokens/s, median [min-max] of repeats")
    print(f"{'streams':>7} " + " ".join(f"{side:>20}" for side in sides))
    for b in streams:
        print(
            f"{b:>7} "
            + " ".join(f"{spread([r.tokens_per_s for r in runs[b]]):>20}" for runs in sides.values())
        )
    sluice = sides.get("sluice, h2load") or sides["sluice, Python"]
    print("\nratios, median [min-max] over repeats (each repeat's runs side by side):")
    ratios: dict[tuple[str, int], float] = {}
    for other in ("raw HF loop", "llama.cpp server", BESIDE):
        if other not in sides or any(len(sides[other][b]) != len(sluice[b]) for b in streams):
            continue
        for b in streams:
            vs = [s.tokens_per_s / o.tokens_per_s for s, o in zip(sluice[b], sides[other][b], strict=True)]
            ratios[(other, b)] = statistics.median(vs)
            print(f"  sluice / {other} at {b:>2} streams: {spread(vs, digits=2)}")
    print("\ntargets (issue 38; Sluice timed by h2load where installed):")
    for other, bar in (("raw HF loop", 1.5), ("llama.cpp server", 5.0)):
        if (other, 32) in ratios:
            met = "met" if ratios[(other, 32)] >= bar else "MISSED"
            print(f"  sluice >= {bar} x {other} at 32 streams: {ratios[(other, 32)]:.2f} -> {met}")
    if (BESIDE, 32) in ratios:
        met = "met" if ratios[(BESIDE, 32)] >= 1.0 else "MISSED"
        print(f"  sluice >= 1.0 x {BESIDE} at 32 streams (issue 30): {ratios[(BESIDE, 32)]:.2f} -> {met}")
    if ("llama.cpp server", 1) in ratios:
        one = ratios[("llama.cpp server", 1)]
        met = "met" if one >= 1.0 else "MISSED"
        print(f"  sluice >= 1.0 x llama.cpp server at 1 stream (issue 30, quantized): {one:.2f} -> {met}")


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def cpu() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    name = next((line.split(":", 1)[1].strip() for line in out.splitlines() if "Model name" in line), "?")
    return f"CPU: {name}, {len(os.sched_getaffinity(0))} cores"


if __name__ == "__main__":
    main()
