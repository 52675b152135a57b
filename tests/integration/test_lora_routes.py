"""Issue 32 over HTTP and with a keys file: vLLM's POST /v1/load_lora_adapter and /v1/unload_lora_adapter
through the shim, the adapter used by the official `openai` SDK under its own model name and listed by
GET /v1/models with its `parent`; an unloaded adapter is a 404 naming it; with --auth-keys, loading needs
an `admin = true` entry, and a tenant's `models` list names adapters as it names models."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import openai
import pytest
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from clients import SluiceClient
from tests.support.hf_models import save
from tests.support.lora_adapters import SHAPES, base_model, save_adapter
from tests.support.packages import require
from tests.support.processes import ServerProcess, ShimProcess, start_server, start_shim

require("peft")

PROMPT = "hello there, general"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("lora-routes")
    base_dir = save("llama", root / "base")
    rank, alpha, targets = SHAPES[2]
    return base_dir, save_adapter(base_model(base_dir), root / "adapter", rank, alpha, targets, seed=3)


@pytest.fixture(scope="module")
def served(built: tuple[Path, Path]) -> Iterator[tuple[ServerProcess, ShimProcess]]:
    base_dir, _ = built
    server = start_server("--hf-models", f"llama={base_dir}", "--context-length", "256")
    shim = start_shim(server.target)
    yield server, shim
    shim.terminate()
    assert server.terminate() == 0


def grpc_text(server: ServerProcess, model: str, token: str | None = None) -> str:
    with SluiceClient(server.target, token=token) as client:
        chunks = client.generate(model, PROMPT, ignore_eos=True, max_tokens=12, temperature=0.0)
        return "".join(c.text for c in chunks)


def test_load_use_list_unload_through_the_http_routes(
    served: tuple[ServerProcess, ShimProcess], built: tuple[Path, Path]
) -> None:
    server, shim = served
    _, adapter = built
    load = {"lora_name": "tuned", "lora_path": str(adapter)}
    answer = httpx.post(f"{shim.url}/v1/load_lora_adapter", json=load, timeout=60)
    assert answer.status_code == 200 and "tuned" in answer.text, answer.text
    again = httpx.post(f"{shim.url}/v1/load_lora_adapter", json=load, timeout=60)
    assert again.status_code == 400 and "tuned" in again.json()["error"]["message"]
    listed = {m.id: m for m in openai.OpenAI(base_url=f"{shim.url}/v1", api_key="x").models.list()}
    assert listed["tuned"].model_extra["parent"] == "llama"
    assert listed["llama"].model_extra["parent"] is None
    client = openai.OpenAI(base_url=f"{shim.url}/v1", api_key="x")
    completion = client.completions.create(model="tuned", prompt=PROMPT, max_tokens=12, temperature=0.0)
    assert completion.choices[0].text == grpc_text(server, "tuned") != grpc_text(server, "llama")
    # KServe v2's generate names the adapter as its model, as every API does.
    v2 = {"text_input": PROMPT, "parameters": {"max_tokens": 12, "temperature": 0, "ignore_eos": True}}
    answer = httpx.post(f"{shim.url}/v2/models/tuned/generate", json=v2, timeout=60)
    assert answer.status_code == 200 and answer.json()["text_output"] == completion.choices[0].text, (
        answer.text
    )
    # What a gateway routes by (vLLM's lora_requests_info): the model with adapters, its limit; none running.
    info = server.metric("sluice_lora_requests_info", model="llama", max_lora="4", running_lora_adapters="")
    assert info > 0
    # Metrics by model carry the adapter's name: its calls and tokens are its own, not its base's.
    assert server.metric("sluice_requests_admitted_total", model="tuned") >= 2
    assert server.metric("sluice_completion_tokens_total", model="tuned") >= 24
    gone = httpx.post(f"{shim.url}/v1/unload_lora_adapter", json={"lora_name": "tuned"}, timeout=60)
    assert gone.status_code == 200, gone.text
    with pytest.raises(openai.NotFoundError, match="tuned"):
        client.completions.create(model="tuned", prompt=PROMPT, max_tokens=4)
    twice = httpx.post(f"{shim.url}/v1/unload_lora_adapter", json={"lora_name": "tuned"}, timeout=60)
    assert twice.status_code == 404 and "tuned" in twice.json()["error"]["message"]
    missing = httpx.post(
        f"{shim.url}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/nowhere"}, timeout=60
    )
    assert missing.status_code == 400 and "adapter_config.json" in missing.json()["error"]["message"]


def test_loading_needs_an_admin_entry_and_tenants_name_adapters(
    built: tuple[Path, Path], tmp_path: Path
) -> None:
    base_dir, adapter = built
    keys = tmp_path / "keys.toml"
    keys.write_text(
        f'[[tenant]]\nname = "ops"\ntoken_sha256 = "{digest("ops")}"\nadmin = true\n'
        f'[[tenant]]\nname = "user"\ntoken_sha256 = "{digest("user")}"\nmodels = ["tuned"]\n'
    )
    server = start_server(
        "--hf-models", f"llama={base_dir}", "--context-length", "256", "--auth-keys", str(keys)
    )
    try:
        with grpc.insecure_channel(server.target) as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            request = pb.LoadLoraAdapterRequest(lora_name="tuned", lora_path=str(adapter))
            with pytest.raises(grpc.RpcError) as refused:
                stub.LoadLoraAdapter(request, metadata=[("authorization", "Bearer user")])
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "admin" in (refused.value.details() or "")
            stub.LoadLoraAdapter(request, metadata=[("authorization", "Bearer ops")])
        assert grpc_text(server, "tuned", token="user")
        with pytest.raises(Exception, match="may not call model 'llama'"):
            grpc_text(server, "llama", token="user")
    finally:
        assert server.terminate() == 0
