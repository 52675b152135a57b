"""Issue 32: LoRA adapters served as models of their own (--lora-modules, PEFT's saved format). Four seeded
adapters of ranks 2-16 and different target modules decode in the same steps as base-model sequences, with
the prefix cache on (each prompt sent twice), and every one's greedy tokens equal PEFT's merged model's
generate. Load, use, unload and reload over gRPC; unknown and malformed adapters refused by name."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from clients import SluiceClient
from clients.errors import NotFoundError
from tests.support.hf_models import save
from tests.support.lora_adapters import SHAPES, base_model, merged_greedy, save_adapter
from tests.support.packages import require
from tests.support.processes import ServerProcess, start_server

require("peft")

PROMPTS = ["hello there, general", "The quick brown fox jumps over"]
TOKENS = 24


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    root = tmp_path_factory.mktemp("lora")
    base_dir = save("llama", root / "base")
    base = base_model(base_dir)
    adapters = {
        f"ad{rank}": save_adapter(base, root / f"ad{rank}", rank, alpha, targets, seed=rank)
        for rank, alpha, targets in SHAPES
    }
    return base_dir, adapters


@pytest.fixture(scope="module")
def server(built: tuple[Path, dict[str, Path]]) -> Iterator[ServerProcess]:
    base_dir, adapters = built
    modules = ",".join(f"{name}={path}" for name, path in adapters.items())
    process = start_server(
        "--hf-models", f"llama={base_dir}", "--lora-modules", modules, "--prefill-chunk-tokens", "8",
        "--context-length", "256", "--max-lora-rank", "16", "--max-loras", "6",
    )  # fmt: skip
    yield process
    assert process.terminate() == 0


def tokens(server: ServerProcess, model: str, prompt: str) -> list[int]:
    with SluiceClient(server.target) as client:
        chunks = client.generate(model, prompt, ignore_eos=True, max_tokens=TOKENS, temperature=0.0)
        return [t for c in chunks for t in c.token_ids]


def test_adapters_and_base_decode_together_as_peft_merged_generate(
    server: ServerProcess, built: tuple[Path, dict[str, Path]]
) -> None:
    base_dir, adapters = built
    models = ["llama", *adapters]
    results: dict[tuple[str, str, int], list[int]] = {}
    errors: list[BaseException] = []

    def run(model: str, prompt: str, turn: int) -> None:
        try:
            results[model, prompt, turn] = tokens(server, model, prompt)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    # Each prompt twice under every model, all at once: the second of each pair may hit the prefix cache,
    # which must hold one adapter's keys apart from another's and from the base model's.
    for turn in (0, 1):
        threads = [threading.Thread(target=run, args=(m, p, turn)) for m in models for p in PROMPTS]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
    assert not errors, errors
    base = base_model(base_dir)
    ids = [list(p.encode()) for p in PROMPTS]
    for model in models:
        expected = merged_greedy(base, adapters.get(model), ids, TOKENS)
        for prompt, want in zip(PROMPTS, expected, strict=True):
            assert results[model, prompt, 0] == want, (model, prompt)
            assert results[model, prompt, 1] == want, (model, prompt, "cached")
        if model != "llama":  # alone in its steps, every row is the adapter's (lora_graph's other branch)
            assert tokens(server, model, PROMPTS[1]) == expected[1], (model, "alone")
    assert len({tuple(results[m, PROMPTS[0], 0]) for m in models}) == len(models)  # each adapter adapts
    # The second wave read cached prompts (its own adapter's only, or its tokens above would differ).
    assert server.metric("sluice_prefix_cache_hits_total", model="llama") >= len(models)


def test_adapters_are_listed_with_their_base(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.target) as channel:
        listed = pb_grpc.InferenceServiceStub(channel).ListModels(pb.ListModelsRequest()).models
    by_name = {m.name: m for m in listed}
    assert by_name["ad8"].parent == "llama" and by_name["ad8"].lora_rank == 8
    assert by_name["llama"].parent == ""


def test_load_use_unload_reload_over_grpc(server: ServerProcess, built: tuple[Path, dict[str, Path]]) -> None:
    _, adapters = built
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        before = tokens(server, "ad4", PROMPTS[0])
        stub.UnloadLoraAdapter(pb.UnloadLoraAdapterRequest(lora_name="ad4"))
        with pytest.raises(NotFoundError, match="model 'ad4' is not loaded"):
            tokens(server, "ad4", PROMPTS[0])
        with pytest.raises(grpc.RpcError) as twice:
            stub.UnloadLoraAdapter(pb.UnloadLoraAdapterRequest(lora_name="ad4"))
        assert twice.value.code() == grpc.StatusCode.NOT_FOUND and "ad4" in (twice.value.details() or "")
        loaded = stub.LoadLoraAdapter(
            pb.LoadLoraAdapterRequest(lora_name="again", lora_path=str(adapters["ad4"]))
        )
        assert loaded.model.parent == "llama" and loaded.model.lora_rank == 4
        assert tokens(server, "again", PROMPTS[0]) == before
        stub.UnloadLoraAdapter(pb.UnloadLoraAdapterRequest(lora_name="again"))
    with SluiceClient(server.target) as client:  # the Python client's helpers, the same RPCs
        info = client.load_lora_adapter("ad4", str(adapters["ad4"]))
        assert (info.parent, info.lora_rank) == ("llama", 4)
        assert {m.name: m.parent for m in client.list_models()}["ad4"] == "llama"
    assert tokens(server, "ad4", PROMPTS[0]) == before


def test_malformed_adapters_are_refused_naming_the_file(
    server: ServerProcess, built: tuple[Path, dict[str, Path]], tmp_path: Path
) -> None:
    base_dir, _ = built
    base = base_model(base_dir)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text("{not json")
    wide = tmp_path / "wide"
    wide.mkdir()
    (wide / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 8}))
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    (garbage / "adapter_model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not json")
    cases = {
        "garbage": (garbage, "adapter_model.safetensors"),
        "missing": (tmp_path / "nowhere", "adapter_config.json"),
        "broken": (broken, "adapter_config.json"),
        "weightless": (wide, "adapter_model.safetensors"),
        "too-wide": (save_adapter(base, tmp_path / "r32", 32, 32, ("q_proj",), 1), "rank 32 is over"),
        "head": (save_adapter(base, tmp_path / "head", 4, 4, ("lm_head",), 1), "target module 'lm_head'"),
    }
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        for name, (path, named) in cases.items():
            with pytest.raises(grpc.RpcError) as refused:
                stub.LoadLoraAdapter(pb.LoadLoraAdapterRequest(lora_name=name, lora_path=str(path)))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
            assert named in (refused.value.details() or ""), (name, refused.value.details())
        with pytest.raises(grpc.RpcError) as named:  # a name that could not be a metric label's list item
            stub.LoadLoraAdapter(pb.LoadLoraAdapterRequest(lora_name="a,b c", lora_path=str(wide)))
        assert named.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "lora_name" in str(
            named.value.details()
        )
        with grpc.insecure_channel(server.target) as other:
            listed = pb_grpc.InferenceServiceStub(other).ListModels(pb.ListModelsRequest()).models
        assert not {m.name for m in listed} & set(cases)
