"""The LoRA delta of one projection over a step's rows, as TorchScript the decoder's layer stack calls
(decoder_graph.LayerStack): per stack of adapters in the step (lora_stack.py), x @ A masked to each row's
own adapter's columns, @ B, added into the projection's output (punica's BGMV, in torch). Rows of no adapter
are in no stack: their output is the base projection's, bit for bit."""

from __future__ import annotations

import torch
from torch import Tensor

from server.runtimes.quantized import linear


def lora_delta(
    x: Tensor, y: Tensor, stacks: list[list[list[Tensor]]], rows: list[Tensor], layer: int, slot: int
) -> Tensor:
    """`y` (the projection of `x`, [tokens, out]) with each stack's delta added in place: stack s's layer
    `layer` holds A at `slot`, B at `slot + 1` (empty where no adapter of it adapts this projection), and
    its rows' mask at 8 + slot / 2 (empty where it holds one adapter: no mask). A and B are [in, r] and
    [r, out], or a bank's, oneDNN-prepacked as linear weights (lora_stack.py): bfloat16 matmuls this small
    cost mostly their call, which prepacking shortens (SmolLM2 at 32 rows: LoRA's time a step -20%)."""
    for s in range(len(rows)):
        weights = stacks[s][layer]
        a = weights[slot]
        if a.numel() > 0:
            picked = rows[s]
            mask = weights[8 + slot // 2]
            every = picked.shape[0] == x.shape[0]  # every row is this stack's (rows ascend): no gather
            part = x if every else x.index_select(0, picked)
            shrunk = linear(part, a, mask[:0], None) if a.is_mkldnn else torch.mm(part, a)
            if mask.numel() > 0:
                shrunk.mul_(mask)
            b = weights[slot + 1]
            if every and not b.is_mkldnn:
                y.addmm_(shrunk, b)
            else:
                delta = linear(shrunk, b, mask[:0], None) if b.is_mkldnn else torch.mm(shrunk, b)
                if every:
                    y.add_(delta)
                else:
                    y.index_add_(0, picked, delta)
    return y
