"""Issue 4, point 6: a Hugging Face causal LM (tiny GPT-2, random weights, save_pretrained to a temporary
directory) served through the same continuous scheduler; its output equals transformers' own generate."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from clients import SluiceClient
from tests.support.processes import ServerProcess, start_server

transformers = pytest.importorskip("transformers")

PROMPTS = ["Hello there", "ab", "a longer prompt for the batch"]


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = transformers.GPT2Config(
        vocab_size=258,
        n_positions=128,
        n_embd=64,
        n_layer=2,
        n_head=4,
        bos_token_id=257,
        eos_token_id=256,
        initializer_range=0.3,
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    path = tmp_path_factory.mktemp("tiny-gpt2")
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def hf_server(gpt2_dir: Path) -> Iterator[ServerProcess]:
    server = start_server(
        "--models", "byte-lm,tiny-gpt2", "--hf-models", f"tiny-gpt2={gpt2_dir}", "--context-length", "512"
    )
    yield server
    assert server.terminate() == 0


def reference(gpt2_dir: Path, prompt: str, n: int) -> list[int]:
    model = transformers.GPT2LMHeadModel.from_pretrained(gpt2_dir).eval()
    ids = torch.tensor([list(prompt.encode())])
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=0, eos_token_id=None)
    return [int(t) for t in out[0, ids.shape[1] :]]


def generate(server: ServerProcess, prompt: str, **kw: object) -> list[int]:
    with SluiceClient(server.target) as client:
        return [t for c in client.generate("tiny-gpt2", prompt, **kw) for t in c.token_ids]  # type: ignore[arg-type]


def test_model_is_listed_with_its_limits(hf_server: ServerProcess) -> None:
    with SluiceClient(hf_server.target) as client:
        info = client.get_model("tiny-gpt2")
    assert info.kind == "generative"
    assert info.context_length == 128  # the model's n_positions caps the server's 512


def test_greedy_output_matches_transformers_generate_while_batched(
    hf_server: ServerProcess, gpt2_dir: Path
) -> None:
    results: dict[str, list[int]] = {}

    def run(prompt: str) -> None:
        results[prompt] = generate(hf_server, prompt, max_tokens=24, temperature=0.0)

    threads = [threading.Thread(target=run, args=(p,)) for p in PROMPTS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    for prompt in PROMPTS:
        assert results[prompt] == reference(gpt2_dir, prompt, 24), prompt


def test_seeded_sampling_is_reproducible(hf_server: ServerProcess) -> None:
    first = generate(hf_server, "seed", max_tokens=16, seed=5)
    assert first == generate(hf_server, "seed", max_tokens=16, seed=5)
    assert len(first) == 16
