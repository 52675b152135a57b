"""--hf-models entries are registry entries (issue 35, item 4): each takes --model-options as any registered
model does (its dtype, the engine that runs it, the GGUF file of a directory), checked before the server
binds and applied when it loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from server.config import Settings
from server.runtimes import registry
from server.runtimes.hf_entries import HfOptions
from server.runtimes.registry import build_models, check_models, model_options, options_help
from tests.support.hf_models import save
from tests.support.packages import require

require("transformers")


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save("llama", tmp_path_factory.mktemp("llama"))


def settings(directory: Path, *flags: str) -> Settings:
    return Settings.from_args(["--hf-models", f"gen={directory}", "--models", "gen",
                               "--max-sequences", "2", *flags])  # fmt: skip


def test_an_hf_entry_takes_model_options_with_defaults_for_the_rest(llama: Path) -> None:
    given = settings(llama, "--model-options", "gen.dtype=bfloat16,gen.engine=generic")
    check_models(given)
    assert model_options(given)["gen"] == HfOptions(dtype="bfloat16", engine="generic")
    assert model_options(settings(llama))["gen"] == HfOptions()
    assert "gen" not in registry._REGISTRY  # an entry of these settings, not a lasting registration


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("gen.dtype=int8", "--model-options gen.dtype takes auto, float32, bfloat16 or float16, not 'int8'"),
        ("gen.quantise=int8", "gen has no option quantise (it has: dtype, engine, gguf, quantization)"),
        ("gen.gguf=../other.gguf", "gguf takes a .gguf file name in the entry's directory"),
    ],
)
def test_a_wrong_option_of_an_hf_entry_is_refused_before_binding(llama: Path, entry: str, says: str) -> None:
    with pytest.raises(ValueError, match="invalid setting model_options") as refused:
        check_models(settings(llama, "--model-options", entry))
    assert says in str(refused.value)


def test_a_gguf_option_naming_no_file_is_refused_naming_the_entry(llama: Path) -> None:
    with pytest.raises(ValueError, match=r"invalid setting hf_models: gen=.*missing\.gguf"):
        check_models(settings(llama, "--model-options", "gen.gguf=missing.gguf"))


def test_the_entry_loads_with_its_own_dtype_and_engine(llama: Path) -> None:
    (native,) = build_models(settings(llama, "--model-options", "gen.dtype=bfloat16"), torch.device("cpu"))
    assert "native decoder, torch.bfloat16" in native.descriptor.description
    (generic,) = build_models(settings(llama, "--model-options", "gen.engine=generic"), torch.device("cpu"))
    assert "generic transformers path" in generic.descriptor.description


def test_asking_the_native_engine_for_a_checkpoint_it_cannot_run_is_refused(tmp_path: Path) -> None:
    gpt2 = save("gpt2", tmp_path / "gpt2")
    with pytest.raises(ValueError, match=r"gen.engine=native: .*gpt2 cannot be served natively: model type"):
        check_models(settings(gpt2, "--model-options", "gen.engine=native"))  # before the server binds
    with pytest.raises(ValueError, match=r"gen=.*gpt2 cannot be served natively: model type 'gpt2'"):
        build_models(settings(gpt2, "--model-options", "gen.engine=native"), torch.device("cpu"))


def test_help_lists_the_options_every_hf_entry_takes() -> None:
    assert "HF.dtype=auto|float32|bfloat16|float16" in options_help()
