"""The native Llama-family decoder (issue 10, points 1-2) against transformers' own forward: chunked
prefill, decode rows at very different positions in scattered slots (attended in groups), and which
checkpoints it declines."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from server.runtimes import step_attention
from server.runtimes.base import Prefill
from server.runtimes.llama import LlamaDecoder, unsupported
from tests.support.hf_models import configs, save

transformers = pytest.importorskip("transformers")
NONE = torch.empty(0, dtype=torch.long)


@pytest.fixture(scope="module", params=["llama", "mistral", "qwen2"])
def checkpoint(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, object]:
    directory = save(request.param, tmp_path_factory.mktemp(request.param))
    return directory, transformers.AutoModelForCausalLM.from_pretrained(directory).eval()


def decoder(directory: Path, regions: int = 8) -> LlamaDecoder:
    """An arena of `regions` regions of 128 tokens (region r starts at token 128 r)."""
    config = transformers.AutoConfig.from_pretrained(directory)
    model = LlamaDecoder(directory, config, dtype=torch.float32, device=torch.device("cpu"))
    model.allocate(regions * 128, 128)
    return model


def hf_logits(model: object, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0]  # type: ignore[operator, no-any-return]


@pytest.mark.parametrize("cuts", [(), (1,), (7, 20), (5, 6, 30)])
def test_a_prompt_prefilled_in_chunks_ends_with_transformers_logits(
    checkpoint: tuple[Path, object], cuts: tuple[int, ...]
) -> None:
    directory, model = checkpoint
    prompt = [(7 * i + 3) % 256 for i in range(40)]
    native = decoder(directory)
    bounds = [0, *cuts, len(prompt)]
    with torch.inference_mode():
        for start, end in itertools.pairwise(bounds):
            chunk = Prefill(2 * 128, prompt[start:end], start, end == len(prompt))
            logits = native.forward([chunk], [], NONE, NONE)
            assert len(logits) == (1 if chunk.last else 0)
    torch.testing.assert_close(logits[0], hf_logits(model, prompt)[-1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("call_cost", [512, 0], ids=["one group", "a group per row"])
def test_rows_far_apart_in_scattered_slots_decode_as_each_alone(
    checkpoint: tuple[Path, object], call_cost: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(step_attention, "_CALL_COST", call_cost)
    directory, model = checkpoint
    native = decoder(directory)
    lengths = {0: 3, 3: 90, 4: 5, 7: 40}  # slot -> prompt length; slots 1, 2, 5, 6 hold nothing
    prompts = {slot: [(slot * 31 + i) % 256 for i in range(n)] for slot, n in lengths.items()}
    with torch.inference_mode():
        native.forward([Prefill(128 * slot, ids) for slot, ids in prompts.items()], [], NONE, NONE)
        slots = [7, 0, 3]  # region 4 pauses this step: in a view, not decoding
        tokens = torch.tensor([11, 12, 13])
        positions = torch.tensor([lengths[s] for s in slots])
        bases = [128 * s for s in slots]
        logits = native.forward([], bases, tokens, positions)
    groups = step_attention._groups(bases, positions.tolist(), 8 * 128)
    # Regions 0 and 3 are one stride apart, 7 is not a whole number of strides on: two views at most.
    assert len(groups) == (2 if call_cost else 3)
    for row, slot in enumerate(slots):
        expected = hf_logits(model, [*prompts[slot], int(tokens[row])])[-1]
        torch.testing.assert_close(logits[row], expected, atol=1e-4, rtol=1e-4)


def test_decode_rows_at_equal_strides_are_one_view_grouped_by_length() -> None:
    bases = [0, 128, 256, 384]
    assert step_attention._groups(bases, [100, 110, 105, 120], 1024) == [(0, 128, 4, [0, 1, 2, 3])]
    # One sequence 2,000 tokens long does not make 24 short ones attend 2,000 keys each.
    bases, positions = [128 * i for i in range(25)], [100 + i for i in range(24)] + [2000]
    assert step_attention._groups(bases, positions, 8192) == [
        (0, 128, 24, list(range(24))),
        (3072, 1, 1, [24]),
    ]
    # A view never reads past the arena: the last row's span would.
    assert len(step_attention._groups([0, 128], [10, 100], 200)) == 2


def test_only_the_llama_family_with_safetensors_runs_natively(tmp_path: Path) -> None:
    assert unsupported(configs()["gpt2"], tmp_path) is not None
    llama = configs()["llama"]
    assert unsupported(llama, tmp_path) == "no safetensors weights"
    save("llama", tmp_path)
    assert unsupported(llama, tmp_path) is None
    llama.rope_parameters = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    assert "depends on the sequence length" in str(unsupported(llama, tmp_path))
