"""Issue 30: a step of one decoding row takes decode_row.one_row (fewer ops a layer, the int4 kernel called
directly), and its logits are the general layer stack's to the bit, for dense and packed weights, with and
without biases, in float32 and bfloat16; a sliding window keeps the general path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from server.runtimes import llama
from server.runtimes.base import Prefill
from server.runtimes.llama import LlamaDecoder
from tests.support.hf_models import save

transformers = pytest.importorskip("transformers")
NONE = torch.empty(0, dtype=torch.long)
PROMPT = [(7 * i + 3) % 256 for i in range(21)]


@pytest.fixture(scope="module", params=["llama", "qwen2", "mistral"])
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save(request.param, tmp_path_factory.mktemp(request.param))


def decode(model: LlamaDecoder, steps: int) -> torch.Tensor:
    """Prefill PROMPT in region 2, then `steps` greedy one-row steps; their logits [steps, V]."""
    model.allocate(4 * 128, 128)
    rows = []
    with torch.inference_mode():
        token = model.forward([Prefill(2 * 128, PROMPT)], [], NONE, NONE).argmax(-1)
        for i in range(steps):
            # (0, 0): no prefix held apart, as the scheduler passes a row without one.
            position = torch.tensor([len(PROMPT) + i])
            logits = model.forward([], [2 * 128], token, position, prefixes=[(0, 0)])
            rows.append(logits)
            token = logits.argmax(-1)
    return torch.cat(rows)


@pytest.mark.parametrize(
    ("mode", "dtype"),
    [
        ("none", torch.float32),
        ("none", torch.bfloat16),
        ("int8", torch.float32),
        ("int4", torch.float32),
        ("int4", torch.bfloat16),
        ("w8a8_int8", torch.bfloat16),
    ],
)
def test_one_row_steps_give_the_general_stacks_logits_to_the_bit(
    checkpoint: Path, mode: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = transformers.AutoConfig.from_pretrained(checkpoint)
    model = LlamaDecoder(checkpoint, config, dtype=dtype, device=torch.device("cpu"), quantization=mode)
    windowed = getattr(config, "sliding_window", None) is not None
    assert model._one_row is not windowed  # Mistral's window: the general path, whose plan masks it
    # The int4 kernel is called directly where every projection is int4 without a bias, in bfloat16.
    direct = mode == "int4" and dtype == torch.bfloat16 and config.model_type != "qwen2"  # no biases
    assert model._direct_group == (32 if direct else 0)
    calls = 0

    def counted(*args: object) -> torch.Tensor:
        nonlocal calls
        calls += 1
        return row(*args)  # type: ignore[arg-type]

    row = LlamaDecoder._row
    monkeypatch.setattr(LlamaDecoder, "_row", counted)
    fast = decode(model, 12)
    assert calls == (0 if windowed else 12)
    model._one_row = False
    general = decode(model, 12)
    assert torch.equal(fast, general)
    assert not torch.equal(general[0], general[1])  # the steps differ: positions and inputs move


def test_a_step_of_two_rows_or_with_a_prompt_takes_the_general_path(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = transformers.AutoConfig.from_pretrained(checkpoint)
    model = LlamaDecoder(checkpoint, config, dtype=torch.float32, device=torch.device("cpu"))
    model.allocate(4 * 128, 128)

    def refused(*args: object) -> torch.Tensor:
        raise AssertionError("one_row taken")

    monkeypatch.setattr(llama.LlamaDecoder, "_row", refused)
    with torch.inference_mode():
        model.forward([Prefill(0, PROMPT), Prefill(128, PROMPT)], [], NONE, NONE)
        two = model.forward([], [0, 128], torch.tensor([5, 6]), torch.tensor([21, 21]))
        mixed = model.forward([Prefill(256, PROMPT)], [0], torch.tensor([7]), torch.tensor([22]))
        # A row attending a prefix held in region 0 (its own tokens from position 21 on, in region 3).
        cascade = model.forward([], [3 * 128 - 21], torch.tensor([8]), torch.tensor([21]), prefixes=[(0, 21)])
    assert two.shape[0] == 2 and mixed.shape[0] == 2 and cascade.shape[0] == 1
