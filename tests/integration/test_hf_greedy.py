"""Issue 10, acceptance 1: greedy output equals transformers' generate token for token for seeded Llama,
Mistral, Qwen2 (the native decoder) and GPT-2 (the generic path) while sequences at different positions
share steps, long prompts go in a chunk per step beside running streams, and others join and leave; a
seeded sampled stream is the same whatever runs beside it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from clients import SluiceClient
from clients.errors import InvalidArgumentError
from tests.support.hf_models import greedy_reference, save
from tests.support.packages import require
from tests.support.processes import ServerProcess, start_server

require("transformers")

KINDS = ("llama", "mistral", "qwen2", "gpt2")
# Prompts of different lengths (several longer than the 8-token prefill budget, so they are chunked) and
# different lengths of output, so that sequences leave while others still run; the second wave joins then.
FIRST = [("a", 40), ("The quick brown fox jumps", 12), ("x" * 37, 30), ("hello there, general", 6)]
SECOND = [("joining later with a long prompt of forty tokens", 20), ("b", 9)]


@pytest.fixture(scope="module")
def directories(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {kind: save(kind, tmp_path_factory.mktemp(kind)) for kind in KINDS}


@pytest.fixture(scope="module")
def server(directories: dict[str, Path]) -> Iterator[ServerProcess]:
    models = ",".join(f"{kind}={path}" for kind, path in directories.items())
    process = start_server("--hf-models", models, "--prefill-chunk-tokens", "8", "--context-length", "256")
    yield process
    assert process.terminate() == 0


def tokens(server: ServerProcess, model: str, prompt: str, **kw: object) -> list[int]:
    with SluiceClient(server.target) as client:
        return [t for c in client.generate(model, prompt, ignore_eos=True, **kw) for t in c.token_ids]  # type: ignore[arg-type]


def test_the_llama_family_runs_on_the_native_decoder(server: ServerProcess) -> None:
    with SluiceClient(server.target) as client:
        described = {name: client.get_model(name).description for name in KINDS}
    assert all("native decoder" in described[kind] for kind in ("llama", "mistral", "qwen2")), described
    assert "generic" in described["gpt2"]


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_output_equals_generate_while_sequences_join_and_leave(
    server: ServerProcess, directories: dict[str, Path], kind: str
) -> None:
    results: dict[str, list[int]] = {}
    errors: list[BaseException] = []

    def run(prompt: str, n: int) -> None:
        try:
            results[prompt] = tokens(server, kind, prompt, max_tokens=n, temperature=0.0)
        except BaseException as exc:  # surfaced below, with the prompt that failed
            errors.append(exc)

    first = [threading.Thread(target=run, args=case) for case in FIRST]
    for thread in first:
        thread.start()
    # The second wave joins when the shortest of the first has left and the others still run.
    first[-1].join(timeout=120)
    second = [threading.Thread(target=run, args=case) for case in SECOND]
    for thread in second:
        thread.start()
    for thread in first + second:
        thread.join(timeout=120)
    assert not errors, errors
    for prompt, n in FIRST + SECOND:
        expected = greedy_reference(directories[kind], list(prompt.encode()), n)
        assert results[prompt] == expected, (kind, prompt)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_a_seeded_sampled_stream_is_the_same_whatever_runs_beside_it(
    server: ServerProcess, kind: str
) -> None:
    alone = tokens(server, kind, "seeded", max_tokens=24, seed=7, temperature=0.9, top_p=0.95)
    crowd: list[list[int]] = []
    company = [
        threading.Thread(
            target=lambda i=i: crowd.append(tokens(server, kind, "x" * (5 + 9 * i), max_tokens=30))
        )
        for i in range(5)
    ]
    for thread in company:
        thread.start()
    beside = tokens(server, kind, "seeded", max_tokens=24, seed=7, temperature=0.9, top_p=0.95)
    for thread in company:
        thread.join(timeout=120)
    assert len(crowd) == 5
    assert beside == alone and len(alone) == 24


def test_a_prompt_longer_than_the_context_is_refused_naming_the_field(server: ServerProcess) -> None:
    with SluiceClient(server.target) as client, pytest.raises(InvalidArgumentError) as refused:
        list(client.generate("llama", "z" * 300, max_tokens=4))
    assert [f for f, _ in refused.value.field_violations] == ["text"]
    assert "context_length is 256" in str(refused.value)
