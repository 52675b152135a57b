"""The LoRA delta of one projection over a step's rows, as TorchScript the decoder's layer stack calls
(decoder_graph.LayerStack): per stack of adapters in the step (lora_stack.py), x @ A masked to each row's
own adapter's columns, @ B, added into the projection's output (punica's BGMV, in torch). Rows of no adapter
are in no stack: their output is the base projection's, bit for bit."""

from __future__ import annotations

import torch
from torch import Tensor


def lora_delta(
    x: Tensor, y: Tensor, stacks: list[list[list[Tensor]]], rows: list[Tensor], layer: int, slot: int
) -> Tensor:
    """`y` (the projection of `x`, [tokens, out]) with each stack's delta added in place: stack s's layer
    `layer` holds A at `slot`, B at `slot + 1` (empty where no adapter of it adapts this projection), and
    its rows' mask at 8 + slot / 2 (empty where it holds one adapter: no mask)."""
    for s in range(len(rows)):
        weights = stacks[s][layer]
        a = weights[slot]
        if a.numel() > 0:
            picked = rows[s]
            mask = weights[8 + slot // 2]
            if picked.shape[0] == x.shape[0]:  # every row is this stack's (rows ascend): no gather
                shrunk = torch.mm(x, a)
                if mask.numel() > 0:
                    shrunk.mul_(mask)
                y.addmm_(shrunk, weights[slot + 1])
            else:
                shrunk = torch.mm(x.index_select(0, picked), a)
                if mask.numel() > 0:
                    shrunk.mul_(mask)
                y.index_add_(0, picked, torch.mm(shrunk, weights[slot + 1]))
    return y
