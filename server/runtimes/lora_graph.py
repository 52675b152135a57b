"""The LoRA delta of one projection over a step's rows, as TorchScript the decoder's layer stack calls
(decoder_graph.LayerStack): per adapter in the step, its rows' x @ A @ B added into the projection's output
(punica's SGMV, segment by segment, in torch). Rows of no adapter are in no segment: their output is the
base projection's, bit for bit."""

from __future__ import annotations

import torch
from torch import Tensor


def lora_delta(
    x: Tensor, y: Tensor, adapters: list[list[list[Tensor]]], rows: list[Tensor], layer: int, slot: int
) -> Tensor:
    """`y` (the projection of `x`, [tokens, out]) with each segment's delta added in place: adapter s's
    layer `layer` holds A at `slot`, B at `slot + 1` (empty where it adapts none of this projection)."""
    for s in range(len(rows)):
        a = adapters[s][layer][slot]
        if a.numel() > 0:
            picked = rows[s]
            b = adapters[s][layer][slot + 1]
            if picked.shape[0] == x.shape[0]:  # every row is this adapter's (rows are disjoint): no gather
                y.add_(torch.matmul(torch.matmul(x, a), b))
            else:
                y.index_add_(0, picked, torch.matmul(torch.matmul(x.index_select(0, picked), a), b))
    return y
