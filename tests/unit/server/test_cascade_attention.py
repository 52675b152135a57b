"""Issue 37, items 1-2: a sequence attends a prefix held in another region in place. Its prefill chunks read
the prefix's keys and their own; its decode rows, batched with others sharing the prefix, attend the
prefix in one call and their own parts apart, merged by log-sum-exp (cascade attention). The logits equal
those of the same sequence holding its whole prompt in its own region, for the byte LM and the native
Llama-family decoder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from server.runtimes.base import Prefill
from server.runtimes.byte_lm import ByteLm
from server.runtimes.llama import LlamaDecoder
from tests.support.hf_models import save

NONE = torch.empty(0, dtype=torch.long)
SHARED = [(7 * i + 3) % 251 for i in range(48)]  # three blocks, in the region at 0
HELD = 32  # the two blocks the sharers take from it


def byte_lm(_: Path) -> Any:
    model = ByteLm(size="tiny", context_length=256, max_sequences=8, device=torch.device("cpu"))
    model.allocate_cache(4096)
    return model


def llama(directory: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.from_pretrained(directory)
    model = LlamaDecoder(directory, config, dtype=torch.float32, device=torch.device("cpu"))
    model.allocate(4096, 256)
    return model


@pytest.fixture(scope="module")
def directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    return save("llama", tmp_path_factory.mktemp("llama"))


@pytest.mark.parametrize("build", [byte_lm, llama], ids=["byte-lm", "llama"])
def test_sharers_attend_the_prefix_in_place_and_their_logits_are_a_whole_regions(
    build: Callable[[Path], Any], directory: Path
) -> None:
    model = build(directory)
    suffixes = [[5, 6, 7, 8, 9], [11, 12, 13], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]
    with torch.inference_mode():
        model.forward([Prefill(0, SHARED)], [], NONE, NONE)
        # Sharers: own regions at 1024 + 256 s hold positions HELD..; position p sits at base + p.
        own = [1024 + 256 * s - HELD for s in range(len(suffixes))]
        chunks = [
            Prefill(base, SHARED[HELD:] + suffix, HELD, True, 0, HELD)
            for base, suffix in zip(own, suffixes, strict=True)
        ]
        shared_first = model.forward(chunks, [], NONE, NONE)
        # The same prompts, each whole in its own region at 2048 + 256 s.
        whole = [2048 + 256 * s for s in range(len(suffixes))]
        alone = model.forward(
            [Prefill(base, SHARED + suffix) for base, suffix in zip(whole, suffixes, strict=True)],
            [],
            NONE,
            NONE,
        )
        torch.testing.assert_close(shared_first, alone, atol=1e-4, rtol=1e-4)
        # Decode steps: the sharers in one cascade, beside a row with no prefix (the region at 0).
        tokens = shared_first.argmax(-1)
        positions = [len(SHARED) + len(s) for s in suffixes]
        for _ in range(3):
            at = torch.tensor([*positions, len(SHARED)])
            plain = torch.tensor([42])
            prefixes = [(0, HELD)] * len(suffixes) + [(0, 0)]
            shared = model.forward([], [*own, 0], torch.cat([tokens, plain]), at, prefixes=prefixes)
            # The reference rows: whole regions; the row at 0 again, rewriting the same key.
            reference = model.forward([], [*whole, 0], torch.cat([tokens, plain]), at)
            torch.testing.assert_close(shared, reference, atol=1e-4, rtol=1e-4)
            tokens = reference[: len(suffixes)].argmax(-1)
            positions = [p + 1 for p in positions]
