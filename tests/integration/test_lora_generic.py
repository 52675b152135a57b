"""Issue 32 on the generic Hugging Face path: a seeded GPT-2 (the architecture the native decoder does not
run) serves two PEFT adapters (its fused Conv1D attention, its MLP) beside the base model in the same
steps, and each one's greedy tokens equal PEFT's merged model's generate."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from clients import SluiceClient
from tests.support.hf_models import save
from tests.support.lora_adapters import base_model, merged_greedy, save_adapter
from tests.support.packages import require
from tests.support.processes import ServerProcess, start_server

require("peft")

PROMPTS = ["hello there, general", "The quick brown fox jumps over"]
TOKENS = 16
SHAPES = {"attn": (4, 8, ("c_attn",)), "mlp": (8, 16, ("c_fc", "c_proj"))}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    root = tmp_path_factory.mktemp("lora-gpt2")
    base_dir = save("gpt2", root / "base")
    base = base_model(base_dir)
    adapters = {
        name: save_adapter(base, root / name, rank, alpha, targets, seed=rank)
        for name, (rank, alpha, targets) in SHAPES.items()
    }
    return base_dir, adapters


@pytest.fixture(scope="module")
def server(built: tuple[Path, dict[str, Path]]) -> Iterator[ServerProcess]:
    base_dir, adapters = built
    modules = ",".join(f"{name}={path}" for name, path in adapters.items())
    process = start_server(
        "--hf-models", f"gpt2={base_dir}", "--lora-modules", modules, "--context-length", "256"
    )
    yield process
    assert process.terminate() == 0


def test_adapters_on_the_generic_path_equal_peft_merged(
    server: ServerProcess, built: tuple[Path, dict[str, Path]]
) -> None:
    base_dir, adapters = built
    models = ["gpt2", *adapters]
    results: dict[tuple[str, str], list[int]] = {}
    errors: list[BaseException] = []

    def run(model: str, prompt: str) -> None:
        try:
            with SluiceClient(server.target) as client:
                chunks = client.generate(model, prompt, ignore_eos=True, max_tokens=TOKENS, temperature=0.0)
                results[model, prompt] = [t for c in chunks for t in c.token_ids]
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(m, p)) for m in models for p in PROMPTS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors
    base = base_model(base_dir)
    ids = [list(p.encode()) for p in PROMPTS]
    for model in models:
        for prompt, want in zip(PROMPTS, merged_greedy(base, adapters.get(model), ids, TOKENS), strict=True):
            assert results[model, prompt] == want, (model, prompt)
    assert len({tuple(results[m, PROMPTS[0]]) for m in models}) == len(models)
