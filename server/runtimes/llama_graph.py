"""The Llama-family layer stack of one step as a TorchScript function: the whole stack runs in C++ with the
GIL released once, instead of re-taking it after each of some 150 ops while the event loop is busy (which
slowed a batch-8 step by 11-18% in the server; the same reason runtimes/mlp.py traces the MLP).

TorchScript is deprecated (hence the silenced warning) but is still the one in-process way to run a graph
without the GIL; torch.compile needs a C++ toolchain at run time and recompiles as batch shapes change.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

#: Each layer's weights, in this order; absent biases are zeros, so that every layer has the same shape.
LAYER_WEIGHTS = ("attn_norm", "qkv", "qkv_bias", "out", "out_bias", "mlp_norm", "gate_up", "gate_up_bias",
                 "down", "down_bias")  # fmt: skip


def _attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    kv: int,
    dim: int,
    chunks: list[list[int]],  # [offset, n, slot, end] per prefill chunk
    chunk_masks: list[Tensor],
    decode_offset: int,
    groups: list[list[int]],  # [lo, hi, span, direct] per group of decoding rows
    members: list[Tensor],
    rows: list[Tensor],
    group_masks: list[Tensor],
) -> Tensor:
    group = q.shape[1] // kv
    parts: list[Tensor] = []
    for i in range(len(chunks)):
        offset, n, slot, end = chunks[i][0], chunks[i][1], chunks[i][2], chunks[i][3]
        grouped = q[offset : offset + n].view(n, kv, group, dim).permute(1, 2, 0, 3).reshape(1, kv, -1, dim)
        out = F.scaled_dot_product_attention(
            grouped,
            k_cache[slot : slot + 1, :, :end],
            v_cache[slot : slot + 1, :, :end],
            attn_mask=chunk_masks[i],
        )
        parts.append(out.view(kv, group, n, dim).permute(2, 0, 1, 3).reshape(n, -1))
    if len(groups) > 0:
        decoding = q[decode_offset:].view(-1, kv, group, dim)
        count = decoding.shape[0]
        out_rows = q.new_empty(count, kv * group * dim)
        for i in range(len(groups)):
            lo, hi, span, direct = groups[i][0], groups[i][1], groups[i][2], groups[i][3]
            if direct == 1:  # the group is the whole slot range, in step order: no scatter, no gather
                grouped = decoding
            else:
                grouped = decoding.new_zeros(hi - lo, kv, group, dim)
                grouped[rows[i]] = decoding[members[i]]
            out = F.scaled_dot_product_attention(
                grouped, k_cache[lo:hi, :, :span], v_cache[lo:hi, :, :span], attn_mask=group_masks[i]
            )
            if direct == 1:
                out_rows = out.reshape(count, -1)
            else:
                out_rows[members[i]] = out[rows[i]].reshape(members[i].shape[0], -1)
        parts.append(out_rows)
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _layers(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    flat_slot: Tensor,
    flat_pos: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    weights: list[list[Tensor]],
    heads: int,
    kv: int,
    dim: int,
    eps: float,
    chunks: list[list[int]],
    chunk_masks: list[Tensor],
    decode_offset: int,
    groups: list[list[int]],
    members: list[Tensor],
    rows: list[Tensor],
    group_masks: list[Tensor],
) -> Tensor:
    total, width = x.shape[0], x.shape[1]
    qk_width, half = (heads + kv) * dim, dim // 2
    for index in range(len(weights)):
        w = weights[index]  # as LAYER_WEIGHTS (TorchScript takes no module constants)
        h = F.rms_norm(x, [width], w[0], eps)
        qkv = F.linear(h, w[1], w[2])
        qk = qkv[:, :qk_width].view(total, heads + kv, dim)
        qk = (
            qk * cos + torch.cat([-qk[:, :, half:], qk[:, :, :half]], dim=-1) * sin
        )  # rotary, q and k at once
        k_cache[index][flat_slot, :, flat_pos] = qk[:, heads:]
        v_cache[index][flat_slot, :, flat_pos] = qkv[:, qk_width:].view(total, kv, dim)
        out = _attention(
            qk[:, :heads], k_cache[index], v_cache[index], kv, dim,
            chunks, chunk_masks, decode_offset, groups, members, rows, group_masks,
        )  # fmt: skip
        x = x + F.linear(out, w[3], w[4])
        h = F.rms_norm(x, [width], w[5], eps)
        gate, up = F.linear(h, w[6], w[7]).chunk(2, dim=-1)
        x = x + F.linear(F.silu(gate) * up, w[8], w[9])
    return x


def compiled() -> Any:
    """The scripted layer stack (compiled once per process, on first use)."""
    global _COMPILED
    if _COMPILED is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            _COMPILED = torch.jit.script(_layers)
    return _COMPILED


_COMPILED: Any = None
