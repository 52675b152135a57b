"""Decode attention of one layer laid out four ways (docs/kv-cache.md, "What was measured"): a padded slot
cache in one batched SDPA, one SDPA per sequence, paged blocks with a split-softmax over them (flash
attention's log-sum-exp, combined by owner), and one SDPA over a strided view of a contiguous arena, plus
what gathering a batch's paged keys costs. The benchmark Llama's shapes (bench.hf_generate: 2 key/value
heads of 64, 6 query heads), float32, one torch thread. Each layout's output is checked against the padded
one before it is timed. Medians of --calls calls per repeat; the median of the repeats with their range.

    .venv/bin/python -m bench.attention [--quick] [--repeats N] [--calls N]
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from bench.shim_latency import cpu_model
from bench.stats import Spread

KV_HEADS, Q_HEADS, DIM = 2, 6, 64
GROUP = Q_HEADS // KV_HEADS


@dataclass(frozen=True)
class Batch:
    """One layer's decoding rows: a query each and its keys/values, in each layout under test."""

    lengths: list[int]
    q: Tensor  # [rows, q_heads, 1, dim]
    keys: list[Tensor]  # per row [1, kv_heads, length, dim], contiguous
    values: list[Tensor]

    @classmethod
    def make(cls, lengths: list[int], seed: int = 19) -> Batch:
        gen = torch.Generator().manual_seed(seed)
        q = torch.randn(len(lengths), Q_HEADS, 1, DIM, generator=gen)
        keys = [torch.randn(1, KV_HEADS, n, DIM, generator=gen) for n in lengths]
        values = [torch.randn(1, KV_HEADS, n, DIM, generator=gen) for n in lengths]
        return cls(lengths, q, keys, values)


def padded(batch: Batch) -> Callable[[], Tensor]:
    """The slot cache: every row padded to the longest, one batched SDPA under a mask."""
    longest = max(batch.lengths)
    k = torch.zeros(len(batch.lengths), KV_HEADS, longest, DIM)
    v = torch.zeros_like(k)
    for row, (kr, vr) in enumerate(zip(batch.keys, batch.values, strict=True)):
        k[row, :, : kr.shape[2]] = kr[0]
        v[row, :, : vr.shape[2]] = vr[0]
    mask = torch.arange(longest)[None, :] < torch.tensor(batch.lengths)[:, None]
    mask = mask[:, None, None, :]
    return lambda: F.scaled_dot_product_attention(batch.q, k, v, attn_mask=mask, enable_gqa=True)


def _per_row(q: Tensor, keys: list[Tensor], values: list[Tensor]) -> Tensor:
    out = [
        torch.nn.functional.scaled_dot_product_attention(q[i : i + 1], keys[i], values[i], enable_gqa=True)
        for i in range(len(keys))
    ]
    return torch.cat(out)


def per_sequence(batch: Batch) -> Callable[[], Tensor]:
    """One SDPA per sequence over its own contiguous keys (a TorchScript loop, as the server scripts)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 deprecates it; the server uses it
        loop = torch.jit.script(_per_row)
    return lambda: loop(batch.q, batch.keys, batch.values)


def strided(batch: Batch) -> Callable[[], Tensor]:
    """Rows of equal length placed one after another in an arena `[kv_heads, tokens, dim]`: one SDPA over
    a strided view, no copy (what the arena gives a burst admitted together)."""
    (n,) = set(batch.lengths)
    rows = len(batch.lengths)
    k_arena = torch.cat([k[0] for k in batch.keys], dim=1)  # [kv, rows * n, dim]
    v_arena = torch.cat([v[0] for v in batch.values], dim=1)
    shape, stride = (rows, KV_HEADS, n, DIM), (n * DIM, rows * n * DIM, DIM, 1)
    k_view, v_view = k_arena.as_strided(shape, stride), v_arena.as_strided(shape, stride)
    return lambda: F.scaled_dot_product_attention(batch.q, k_view, v_view, enable_gqa=True)


@dataclass(frozen=True)
class Paged:
    """A pool of blocks in a shuffled order (as a paged allocator leaves them), with the block table."""

    k: Tensor  # [blocks, kv, block, dim]
    v: Tensor
    owner: Tensor  # [blocks] the row each block belongs to
    valid: Tensor  # [blocks, block] which positions hold a token

    @classmethod
    def of(cls, batch: Batch, block: int, seed: int = 7) -> Paged:
        ks, vs, owners, valid = [], [], [], []
        for row, (kr, vr) in enumerate(zip(batch.keys, batch.values, strict=True)):
            n = kr.shape[2]
            for start in range(0, n, block):
                width = min(block, n - start)
                kb, vb = torch.zeros(KV_HEADS, block, DIM), torch.zeros(KV_HEADS, block, DIM)
                kb[:, :width] = kr[0, :, start : start + width]
                vb[:, :width] = vr[0, :, start : start + width]
                ks.append(kb)
                vs.append(vb)
                owners.append(row)
                valid.append(torch.arange(block) < width)
        order = torch.randperm(len(ks), generator=torch.Generator().manual_seed(seed))
        k, v, owner = torch.stack(ks)[order], torch.stack(vs)[order], torch.tensor(owners)[order]
        return cls(k, v, owner, torch.stack(valid)[order])


def split_softmax(batch: Batch, pool: Paged) -> Callable[[], Tensor]:
    """Attention over each block on its own, combined per owner by log-sum-exp (no gather of keys)."""
    rows, scale = len(batch.lengths), 1 / math.sqrt(DIM)
    minus_inf = torch.tensor(-math.inf)
    index = pool.owner.view(-1, 1, 1, 1).expand(-1, KV_HEADS, GROUP, 1)

    def call() -> Tensor:
        q = batch.q.view(rows, KV_HEADS, GROUP, DIM)[pool.owner]  # [blocks, kv, group, dim]: queries, small
        scores = (q @ pool.k.transpose(-1, -2)) * scale
        scores = torch.where(pool.valid[:, None, None, :], scores, minus_inf)
        peak = scores.amax(-1, keepdim=True)
        weights = torch.exp(scores - peak)
        total, out = weights.sum(-1, keepdim=True), weights @ pool.v
        best = torch.full((rows, KV_HEADS, GROUP, 1), -math.inf).scatter_reduce_(0, index, peak, "amax")
        rescale = torch.exp(peak - best[pool.owner])
        summed = torch.zeros(rows, KV_HEADS, GROUP, DIM).index_add_(0, pool.owner, out * rescale)
        norm = torch.zeros(rows, KV_HEADS, GROUP, 1).index_add_(0, pool.owner, total * rescale)
        return (summed / norm).view(rows, Q_HEADS, 1, DIM)

    return call


def gather_keys(pool: Paged) -> Callable[[], Tensor]:
    """A paged layout's other way: copy the batch's key blocks into one tensor first (keys only)."""
    table = torch.randperm(pool.k.shape[0], generator=torch.Generator().manual_seed(3))
    return lambda: pool.k.index_select(0, table)


def median_ms(call: Callable[[], Tensor], calls: int) -> float:
    for _ in range(3):
        call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000)
    return float(np.median(times))


def gather_64(batch: Batch) -> Callable[[], Tensor]:
    return gather_keys(Paged.of(batch, 64))


Build = Callable[[Batch], Callable[[], Tensor]]


def cases(quick: bool) -> list[tuple[str, Batch, list[tuple[str, Build]]]]:
    rng = np.random.default_rng(19)
    # Log-normal lengths with a mean near 636 (the table's), clipped to the benchmark's context.
    skewed = [int(n) for n in np.clip(rng.lognormal(6.36, 0.7, 32), 16, 4000)]
    paged_rows = [
        (f"paged blocks of {b}, split-softmax", lambda batch, b=b: split_softmax(batch, Paged.of(batch, b)))
        for b in ((64,) if quick else (16, 64, 128))
    ]
    equal: list[tuple[str, Build]] = [
        ("batched strided view (equal strides)", strided),
        ("one SDPA per sequence", per_sequence),
    ]
    equal.append(("paged blocks of 64, split-softmax", lambda b: split_softmax(b, Paged.of(b, 64))))
    return [
        (
            f"32 sequences, log-normal lengths (mean {np.mean(skewed):.0f}, max {max(skewed):,})",
            Batch.make(skewed),
            [
                ("slot cache, one padded batched SDPA", padded),
                ("one SDPA per sequence", per_sequence),
                *paged_rows,
                ("paged 64, gathering the batch's keys first (added per layer)", gather_64),
            ],
        ),
        ("32 sequences of 100 tokens", Batch.make([100] * 32), equal),
        ("8 sequences of 1,000 tokens", Batch.make([1000] * 8), equal),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.attention", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one repeat of 10 calls, blocks of 64 only")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--calls", type=int, default=40, help="timed calls per layout and repeat")
    args = parser.parse_args()
    repeats, calls = (1, 10) if args.quick else (args.repeats, args.calls)
    torch.set_num_threads(1)
    print(f"CPU: {cpu_model()}; torch {torch.__version__}, 1 thread, float32; ms per call, median [min-max]")
    print(f"of {repeats} repeats of the median of {calls} calls\n")
    print("| batch | layout and call | ms |\n|---|---|---|")
    for title, batch, layouts in cases(args.quick):
        reference = padded(batch)()
        for index, (name, build) in enumerate(layouts):
            call = build(batch)
            if "gathering" not in name:
                torch.testing.assert_close(call(), reference, rtol=1e-4, atol=1e-4)
            spread = Spread.of([median_ms(call, calls) for _ in range(repeats)])
            print(f"| {title if index == 0 else ''} | {name} | {spread.format(2)} |")


if __name__ == "__main__":
    main()
