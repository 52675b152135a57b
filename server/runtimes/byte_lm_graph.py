"""The byte LM's layer stack of one step as a TorchScript function, as decoder_graph.py is the native
decoder's: the stack runs with the GIL released once, so the event loop's delivery and planning of the next
step, which now run while a step computes, do not make each of its small ops wait for the GIL."""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor

from server.runtimes.decoder_graph import _write_and_attend, scripted

#: Each layer's weights, in this order.
LAYER_WEIGHTS = ("ln1.weight", "ln1.bias", "qkv.weight", "qkv.bias", "proj.weight", "proj.bias", "ln2.weight",
                 "ln2.bias", "mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias")  # fmt: skip


def _layers(
    x: Tensor,
    flat_token: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    weights: list[list[Tensor]],
    heads: int,
    dim: int,
    chunks: list[list[int]],
    chunk_masks: list[Tensor],
    decode_offset: int,
    groups: list[list[int]],
    members: list[Tensor],
    rows: list[Tensor],
    group_masks: list[Tensor],
) -> Tensor:
    total, width = x.shape[0], x.shape[1]
    for index in range(len(weights)):
        w = weights[index]  # as LAYER_WEIGHTS
        h = F.layer_norm(x, [width], w[0], w[1])
        qkv = F.linear(h, w[2], w[3]).view(total, 3, heads, dim)
        out = _write_and_attend(
            qkv[:, 0], qkv[:, 1], qkv[:, 2], k_cache[index], v_cache[index], flat_token, heads, dim,
            chunks, chunk_masks, decode_offset, groups, members, rows, group_masks,
        )  # fmt: skip
        x = x + F.linear(out, w[4], w[5])
        h = F.layer_norm(x, [width], w[6], w[7])
        x = x + F.linear(F.gelu(F.linear(h, w[8], w[9])), w[10], w[11])
    return x


def compiled() -> Any:
    """The scripted byte LM stack (compiled once per process, on first use)."""
    return scripted(_layers)
