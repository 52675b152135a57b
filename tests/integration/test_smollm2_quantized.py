"""Issue 30 on the real model: SmolLM2's Q4_1 file served by the native decoder under int4 keeps its own
blocks (every Q4_1 tensor, none requantized), its resident weights are at most 0.3x float32's, and its
cross-entropy on the held-out text stays within 10% of float32's (bench.quantization gives the figures); the
same for w8a8_int8 (int8 weights and activations, issue 38's many-stream mode)."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
import torch

from server.runtimes.base import Prefill
from server.runtimes.llama import LlamaDecoder
from server.runtimes.smollm2 import smollm2_gguf
from tests.support.packages import require

transformers = pytest.importorskip("transformers")
require("gguf")
TEXT = Path(__file__).parents[2] / "bench" / "data" / "pride_and_prejudice_ch1_2.txt"
TOKENS = 96


def decoder(mode: str) -> LlamaDecoder:
    from server.runtimes.gguf_file import read_config

    path = smollm2_gguf()
    model = LlamaDecoder(
        path, read_config(path), dtype=torch.float32, device=torch.device("cpu"), quantization=mode
    )
    model.allocate(256, 256)
    return model


def perplexity(model: LlamaDecoder, ids: list[int]) -> float:
    """Every position's logits in one step: one single-token chunk per position, each marked last."""
    none = torch.empty(0, dtype=torch.long)
    chunks = [Prefill(0, [token], start, True) for start, token in enumerate(ids[:-1])]
    with torch.inference_mode():
        logits = model.forward(chunks, [], none, none)
    loss = torch.nn.functional.cross_entropy(logits.float(), torch.tensor(ids[1:]))
    return math.exp(float(loss))


@pytest.fixture(scope="module")
def ids() -> list[int]:
    from server.runtimes.hf_checkpoint import HfCheckpoint

    return HfCheckpoint(smollm2_gguf(), context_length=256).encode(TEXT.read_text())[:TOKENS]


@pytest.fixture(scope="module")
def dense(ids: list[int]) -> tuple[int, float]:
    """float32's resident weight bytes and perplexity."""
    model = decoder("none")
    return model.weights_bytes(), perplexity(model, ids)


def test_int4_keeps_the_files_blocks_shrinks_the_weights_and_keeps_the_perplexity(
    caplog: pytest.LogCaptureFixture, ids: list[int], dense: tuple[int, float]
) -> None:
    caplog.set_level(logging.INFO)
    int4 = decoder("int4")
    assert "kept as int4: 210 Q4_1 tensors" in caplog.text
    assert int4.weights_bytes() <= 0.3 * dense[0]
    quantized = perplexity(int4, ids)
    assert quantized <= 1.1 * dense[1], (quantized, dense[1])


def test_w8a8_shrinks_the_weights_and_keeps_the_perplexity(ids: list[int], dense: tuple[int, float]) -> None:
    w8a8 = decoder("w8a8_int8")  # requantized from the file's Q4_1 blocks (dequantized first)
    assert w8a8.weights_bytes() <= 0.3 * dense[0]  # int8 layers and head; rows looked up in int4
    quantized = perplexity(w8a8, ids)
    assert quantized <= 1.1 * dense[1], (quantized, dense[1])
