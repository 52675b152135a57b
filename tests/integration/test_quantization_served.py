"""Issue 30: --quantization and NAME.quantization served end to end. GetModel, ListModels and the shim's
/v1/models report each model's quantization, and a quantized model generates as the same decoder built in
process with that quantization does (greedy, one stream alone)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from clients import SluiceClient
from server.runtimes.base import Prefill
from server.runtimes.llama import LlamaDecoder
from tests.support.hf_models import save
from tests.support.processes import ServerProcess, start_server, start_shim

transformers = pytest.importorskip("transformers")
PROMPT = "quantized weights"
TOKENS = 6


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save("llama", tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def server(llama_dir: Path) -> Iterator[ServerProcess]:
    process = start_server(
        "--models", "tiny4,tiny8,dense",
        "--hf-models", f"tiny4={llama_dir},tiny8={llama_dir},dense={llama_dir}",
        "--quantization", "int4", "--model-options", "tiny8.quantization=int8,dense.quantization=none",
        "--context-length", "128", "--default-max-tokens", "16",
    )  # fmt: skip
    yield process
    assert process.terminate() == 0


def in_process(directory: Path, mode: str) -> list[int]:
    config = transformers.AutoConfig.from_pretrained(directory)
    model = LlamaDecoder(
        directory, config, dtype=torch.float32, device=torch.device("cpu"), quantization=mode
    )
    model.allocate(256, 128)
    ids, out = list(PROMPT.encode()), []
    none = torch.empty(0, dtype=torch.long)
    with torch.inference_mode():
        token = int(model.forward([Prefill(0, ids, 0, True)], [], none, none)[0].argmax())
        for position in range(len(ids), len(ids) + TOKENS - 1):
            out.append(token)
            step = model.forward([], [0], torch.tensor([token]), torch.tensor([position]))
            token = int(step[0].argmax())
    return [*out, token]


def test_each_model_reports_its_quantization(server: ServerProcess) -> None:
    with SluiceClient(server.target) as client:
        reported = {info.name: (info.quantization, info.dtype) for info in client.list_models()}
        assert reported == {
            "tiny4": ("int4", "float32"),
            "tiny8": ("int8", "float32"),
            "dense": ("none", "float32"),
        }
        assert "int4 weights" in client.get_model("tiny4").description
    shim = start_shim(server.target)
    try:
        listed = httpx.get(f"{shim.url}/v1/models", timeout=30).json()["data"]
        assert {m["id"]: m["quantization"] for m in listed} == {
            "tiny4": "int4",
            "tiny8": "int8",
            "dense": "none",
        }
        native = httpx.get(f"{shim.url}/v1/models/tiny8", timeout=30).json()
        assert native.get("quantization", "int8") == "int8"
    finally:
        shim.terminate()


@pytest.mark.parametrize(("name", "mode"), [("tiny4", "int4"), ("tiny8", "int8"), ("dense", "none")])
def test_a_quantized_model_generates_as_its_decoder_in_process(
    server: ServerProcess, llama_dir: Path, name: str, mode: str
) -> None:
    with SluiceClient(server.target) as client:
        served = [
            t
            for c in client.generate(name, PROMPT, max_tokens=TOKENS, temperature=0, ignore_eos=True)
            for t in c.token_ids
        ]
    assert served == in_process(llama_dir, mode)
