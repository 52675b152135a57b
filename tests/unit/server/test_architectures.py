"""The native decoder's table of architectures (issue 35, item 4): a Llama-like family is one entry, its
activation, embedding scale and norm offset data the decoder reads, checked against transformers' forward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from server.runtimes import architectures
from server.runtimes.architectures import ARCHITECTURES, Architecture, architecture_of
from server.runtimes.base import Prefill
from server.runtimes.decoder_graph import compiled
from server.runtimes.llama import LlamaDecoder, unsupported
from tests.support.hf_models import configs

transformers = pytest.importorskip("transformers")
NONE = torch.empty(0, dtype=torch.long)
PROMPT = [(5 * i + 2) % 256 for i in range(24)]


def saved(directory: Path, **changes: object) -> tuple[Path, object]:
    config = configs()["llama"]
    for key, value in changes.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(directory)
    return directory, model


def native_logits(directory: Path) -> torch.Tensor:
    config = transformers.AutoConfig.from_pretrained(directory)
    decoder = LlamaDecoder(directory, config, dtype=torch.float32, device=torch.device("cpu"))
    decoder.allocate(4 * 128, 128)
    with torch.inference_mode():
        first = decoder.forward([Prefill(128, PROMPT, 0, True)], [], NONE, NONE)
        step = decoder.forward([], [128], torch.tensor([PROMPT[0]]), torch.tensor([len(PROMPT)]))
    return torch.cat([first, step])


def reference(model: object, embeds: torch.Tensor) -> torch.Tensor:
    """transformers' logits of PROMPT's last token, then of PROMPT[0] decoded after it."""
    with torch.inference_mode():
        out = model(inputs_embeds=embeds[None])  # type: ignore[operator]
        return out.logits[0, [-2, -1]]  # type: ignore[no-any-return]


def embeds_of(model: object, ids: list[int]) -> torch.Tensor:
    return model.get_input_embeddings()(torch.tensor(ids))  # type: ignore[attr-defined, no-any-return]


def test_a_gelu_llama_runs_natively_with_the_configs_activation(tmp_path: Path) -> None:
    directory, model = saved(tmp_path, hidden_act="gelu_pytorch_tanh")
    assert unsupported(transformers.AutoConfig.from_pretrained(directory), directory) is None
    expected = reference(model, embeds_of(model, [*PROMPT, PROMPT[0]]))
    torch.testing.assert_close(native_logits(directory), expected, atol=1e-4, rtol=1e-4)


def test_a_table_entry_with_an_embedding_scale_and_gelu_is_a_new_family(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dry run's family (a Llama with GELU and Gemma's embedding scale): one entry, no decoder edit."""
    entry = Architecture(activation="gelu_pytorch_tanh", embedding_scale=True)
    monkeypatch.setitem(ARCHITECTURES, "llama", entry)
    directory, model = saved(tmp_path, hidden_act="gelu_pytorch_tanh")
    scale = torch.tensor(64**0.5, dtype=torch.float32)
    expected = reference(model, embeds_of(model, [*PROMPT, PROMPT[0]]) * scale)
    torch.testing.assert_close(native_logits(directory), expected, atol=1e-4, rtol=1e-4)


def test_an_activation_the_stack_does_not_run_leaves_the_checkpoint_to_the_generic_path() -> None:
    config = configs()["llama"]
    config.hidden_act = "relu2"
    assert architecture_of(config) == "activation 'relu2'"
    config = configs()["qwen2"]
    config.use_sliding_window = True
    assert architecture_of(config) == "Qwen2's per-layer sliding windows"
    assert "gpt2" in str(architecture_of(configs()["gpt2"]))


def test_each_activation_is_a_constant_of_its_stack_which_holds_its_models_weights() -> None:
    weights = [[torch.full((2,), float(i)) for i in range(14)]]
    stacks = {name: compiled(name, weights) for name in set(architectures.ACTIVATIONS.values())}
    assert {stack.activation for stack in stacks.values()} == {"silu", "gelu", "gelu_tanh"}
    # The model's own tensors (not copies), held by the scripted module: a step passes none of them.
    held = stacks["silu"].weights
    assert all(h.data_ptr() == w.data_ptr() for h, w in zip(held[0], weights[0], strict=True))
