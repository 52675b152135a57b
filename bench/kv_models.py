"""The two models bench.kv_cache's issue-37 parts run on, each as the real server serves it and as the
in-process scheduler (bench/kv_inprocess.py) loads it: the seeded 8k Llama (float32, random weights: fast,
and token-identical with sharing on and off) and SmolLM2-135M-Instruct (bfloat16, the real model)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from bench import kv_inprocess
from bench.stack import SluiceServer
from server.runtimes.base import GenerativeModel


@dataclass(frozen=True)
class Target:
    name: str  # the model's name in requests
    label: str  # in printed lines
    vocab: int  # prompt token ids are drawn below this
    bytes_per_token: int  # keys and values of one token, all layers, in the served dtype
    serve: Callable[..., SluiceServer]  # (*flags) -> the real server serving it
    load: Callable[[int, int], GenerativeModel]  # (context, max_sequences) -> the runtime, in-process


def llama(directory: Path) -> Target:
    from bench.kv_cache import BYTES_PER_TOKEN, CONTEXT, MODEL, server

    def load(context: int, rows: int) -> GenerativeModel:
        return kv_inprocess.load(
            directory, name=MODEL, context=context, max_sequences=rows, dtype=torch.float32
        )

    return Target(
        MODEL, f"seeded Llama, {CONTEXT} context, float32", 8192, BYTES_PER_TOKEN,
        lambda *flags: server(directory, *flags), load,
    )  # fmt: skip


#: SmolLM2 in bfloat16: keys and values of 30 layers, 3 key/value heads of 64, 2 bytes each.
SMOLLM2_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 2


def smollm2() -> Target:
    from server.runtimes.smollm2 import NAME, smollm2_gguf

    def serve(*flags: str) -> SluiceServer:
        return SluiceServer(
            "--models", NAME, "--dtype", "bfloat16", "--torch-threads", "1", "--max-queue", "256", *flags
        )  # fmt: skip

    def load(context: int, rows: int) -> GenerativeModel:
        path = smollm2_gguf()
        return kv_inprocess.load(path, name=NAME, context=context, max_sequences=rows, dtype=torch.bfloat16)

    return Target(NAME, "SmolLM2-135M-Instruct, bfloat16", 49152, SMOLLM2_BYTES_PER_TOKEN, serve, load)
