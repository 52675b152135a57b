"""Acceptance 2 (gRPC half): the Python clients, sync and asyncio, against the real server."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from clients import AsyncSluiceClient, InvalidArgumentError, NotFoundError, SluiceClient
from server.config import Settings
from server.runtimes.byte_lm import DEFAULT_CONTEXT
from server.runtimes.mlp import build_mlp
from tests.support import byte_lm_reference
from tests.support.processes import ServerProcess


def reference_mlp(x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        out: np.ndarray = build_mlp(2048)(torch.from_numpy(x[None])).numpy()[0]
    return out


def test_sync_infer_matches_the_model_computed_in_process(server: ServerProcess) -> None:
    x = np.random.default_rng(0).standard_normal(512).astype(np.float32)
    with SluiceClient(server.target) as client:
        result = client.infer("mlp", {"x": x}, request_id="r-1")
    np.testing.assert_allclose(result.outputs["y"], reference_mlp(x), rtol=1e-4, atol=1e-5)
    assert result.model_version == "1" and result.batch_size >= 1 and result.request_id == "r-1"


def test_sync_generate_streams_chunks_with_exact_usage(server: ServerProcess) -> None:
    with SluiceClient(server.target) as client:
        chunks = list(client.generate("byte-lm", "Hello", max_tokens=20, seed=3))
    assert len(chunks) > 1
    assert all(c.finish_reason is None for c in chunks[:-1])
    assert chunks[-1].finish_reason == "length"
    assert chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (5, 20)
    # The tokens the seeded model itself samples (none of them EOS, or the stream would have stopped).
    assert [t for c in chunks for t in c.token_ids] == byte_lm_reference.generate("Hello", 20, seed=3)


def test_list_and_get_models(server: ServerProcess) -> None:
    with SluiceClient(server.target) as client:
        names = [m.name for m in client.list_models()]
        lm = client.get_model("byte-lm")
        with pytest.raises(NotFoundError):
            client.get_model("missing")
    assert names == ["all-minilm-l6-v2", "byte-lm", "mlp"]
    assert lm.kind == "generative" and lm.context_length > 0 and lm.max_concurrent_sequences > 0
    # The server's defaults (no --context-length, --max-sequences in the session's server).
    assert (lm.context_length, lm.max_concurrent_sequences) == (DEFAULT_CONTEXT, Settings().max_sequences)


def test_typed_errors_carry_the_code_and_field(server: ServerProcess) -> None:
    with SluiceClient(server.target) as client, pytest.raises(InvalidArgumentError) as info:
        list(client.generate("byte-lm", "Hi", max_tokens=5, temperature=-1.0))
    assert ("sampling.temperature", info.value.field_violations[0][1]) == info.value.field_violations[0]


def test_async_client_runs_concurrent_calls(server: ServerProcess) -> None:
    async def main() -> tuple[list[np.ndarray], str]:
        async with AsyncSluiceClient(server.target) as client:
            xs = [np.full(512, i / 10, dtype=np.float32) for i in range(8)]
            results = await asyncio.gather(*(client.infer("mlp", {"x": x}) for x in xs))
            text = "".join([c.text async for c in client.generate("byte-lm", "abc", max_tokens=8, seed=1)])
            return [r.outputs["y"] for r in results], text

    outputs, text = asyncio.run(main())
    for i, y in enumerate(outputs):
        np.testing.assert_allclose(
            y, reference_mlp(np.full(512, i / 10, dtype=np.float32)), rtol=1e-4, atol=1e-5
        )
    assert text == byte_lm_reference.text(byte_lm_reference.generate("abc", 8, seed=1))


def test_seeded_generation_is_reproducible(server: ServerProcess) -> None:
    with SluiceClient(server.target) as client:
        runs = [
            [t for c in client.generate("byte-lm", "seed", max_tokens=16, seed=42) for t in c.token_ids]
            for _ in range(2)
        ]
        other = [t for c in client.generate("byte-lm", "seed", max_tokens=16, seed=43) for t in c.token_ids]
    assert runs[0] == runs[1] == byte_lm_reference.generate("seed", 16, seed=42)
    assert runs[0] != other
