"""Batched sampling: per-row randomness depends only on (seed, step), never on the other rows."""

from __future__ import annotations

import numpy as np
import torch

from server.batching.sampling import greedy_tokens, sample, uniforms


def draw(
    logits: torch.Tensor, seeds: list[int], steps: list[int], **params: list[float] | list[int]
) -> list[int]:
    n = len(seeds)
    u = torch.from_numpy(uniforms(np.array(seeds, dtype=np.uint64), np.array(steps)))
    return sample(
        logits,
        temperature=torch.tensor(params.get("temperature", [1.0] * n), dtype=torch.float32),
        top_k=torch.tensor(params.get("top_k", [0] * n)),
        top_p=torch.tensor(params.get("top_p", [1.0] * n), dtype=torch.float32),
        u=u,
    ).tolist()


def test_a_row_samples_the_same_alone_or_in_a_batch() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(32, 258, generator=gen)
    seeds = list(range(100, 132))
    together = draw(logits, seeds, [3] * 32)
    alone = [draw(logits[i : i + 1], [seeds[i]], [3])[0] for i in range(32)]
    assert together == alone


def test_different_seeds_and_steps_differ() -> None:
    u = uniforms(np.array([1, 1, 2], dtype=np.uint64), np.array([0, 1, 0]))
    assert len(set(u.tolist())) == 3 and ((u >= 0) & (u < 1)).all()


def test_temperature_zero_and_top_k_one_are_greedy() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(1))
    greedy = logits.argmax(-1).tolist()
    assert draw(logits, [1, 2, 3, 4], [0] * 4, temperature=[0.0] * 4) == greedy
    assert draw(logits, [1, 2, 3, 4], [0] * 4, top_k=[1] * 4) == greedy
    assert draw(logits, [1, 2, 3, 4], [0] * 4, top_p=[1e-6] * 4) == greedy


def test_sampling_follows_the_distribution() -> None:
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).repeat(4000, 1)
    tokens = np.array(draw(logits, list(range(4000)), [0] * 4000))
    freq = np.bincount(tokens, minlength=3) / 4000
    assert np.allclose(freq, [0.7, 0.2, 0.1], atol=0.03)


def test_top_k_never_samples_outside_the_k_best() -> None:
    logits = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0]]).repeat(500, 1)
    tokens = draw(logits, list(range(500)), [0] * 500, temperature=[5.0] * 500, top_k=[2] * 500)
    assert set(tokens) == {0, 1}


def test_the_blocked_argmax_is_torchs_argmax_ties_and_nans_included() -> None:
    gen = torch.Generator().manual_seed(1)
    for vocab in (49_152, 8_192, 258, 1_000):  # the last two: no block size divides them or fits
        for dtype in (torch.float32, torch.bfloat16):
            logits = torch.randn(32, vocab, generator=gen).to(dtype)
            logits[3, 7] = logits[3, vocab - 1] = 50.0  # a tie across blocks: the first wins
            logits[4, 100:140] = 40.0  # a tie inside a block and across its edge
            logits[5, vocab // 2] = float("nan")  # argmax's NaN is its maximum
            logits[6, 9] = logits[6, vocab - 2] = float("nan")
            logits[7] = -torch.inf
            assert torch.equal(greedy_tokens(logits), logits.argmax(dim=-1)), (vocab, dtype)
            picked = logits[::3]  # not contiguous
            assert torch.equal(greedy_tokens(picked), picked.argmax(dim=-1))
