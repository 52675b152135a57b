"""The native decoder's layer stack of one step as TorchScript (its MLP activation fixed when scripted, one
stack per activation of architectures.py's table): the whole stack runs in C++ with the GIL released once,
instead of re-taking it after each of some 150 ops while the event loop is busy (which slowed a batch-8
step by 11-18% in the server; the same reason runtimes/mlp.py traces the MLP).

TorchScript is deprecated (hence the silenced warning) but is still the one in-process way to run a graph
without the GIL; torch.compile needs a C++ toolchain at run time and recompiles as batch shapes change.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from server.runtimes.lora_graph import lora_delta
from server.runtimes.quantized import linear

#: Each layer's weights, in this order; absent biases are empty, so that every layer has the same shape. A
#: projection's scales are empty where it is dense, else it is packed (quantized.py's `linear`).
LAYER_WEIGHTS = ("attn_norm", "qkv", "qkv_bias", "out", "out_bias", "mlp_norm", "gate_up", "gate_up_bias",
                 "down", "down_bias",
                 "qkv_scales", "out_scales", "gate_up_scales", "down_scales")  # fmt: skip


def _cascade(
    grouped: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    base: int,
    held: int,
    keys: Tensor,
    values: Tensor,
    mask: Tensor,
) -> Tensor:
    """Rows [rows, kv, group, dim] attend a shared prefix (arena tokens [base, base + held), in one batched
    call for them all) and their own keys [rows, kv, span, dim] (`mask` [rows, 1, 1, span]); the two are
    merged by their log-sum-exp (FlashInfer's and vLLM's cascade attention), in float32."""
    rows, kv, group, dim = grouped.shape[0], grouped.shape[1], grouped.shape[2], grouped.shape[3]
    scale = 1.0 / float(dim) ** 0.5
    q = grouped.float() * scale
    shared = q.permute(1, 0, 2, 3).reshape(kv, rows * group, dim)
    scores = torch.matmul(shared, k_cache[:, base : base + held].float().transpose(1, 2))
    lse_prefix = torch.logsumexp(scores, dim=-1, keepdim=True)
    prefix = torch.matmul(torch.exp(scores - lse_prefix), v_cache[:, base : base + held].float())
    prefix = prefix.view(kv, rows, group, dim).permute(1, 0, 2, 3)
    lse_prefix = lse_prefix.view(kv, rows, group, 1).permute(1, 0, 2, 3)
    own_scores = torch.matmul(q, keys.float().transpose(2, 3)).masked_fill(~mask, float("-inf"))
    lse_own = torch.logsumexp(own_scores, dim=-1, keepdim=True)
    own = torch.matmul(torch.exp(own_scores - lse_own), values.float())
    top = torch.maximum(lse_prefix, lse_own)
    w_prefix, w_own = torch.exp(lse_prefix - top), torch.exp(lse_own - top)
    return ((prefix * w_prefix + own * w_own) / (w_prefix + w_own)).to(grouped.dtype)


def _attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    kv: int,
    dim: int,
    chunks: list[list[int]],  # [offset, n, base, end, prefix base, prefix tokens] per prefill chunk
    chunk_masks: list[Tensor],
    decode_offset: int,
    groups: list[list[int]],  # [lo, stride, count, span, direct, prefix base, prefix tokens] per group
    members: list[Tensor],
    rows: list[Tensor],
    group_masks: list[Tensor],
) -> Tensor:
    # k_cache, v_cache: one layer's arena, [kv, tokens, dim]; a region is a run of its tokens.
    group = q.shape[1] // kv
    tokens = k_cache.shape[1]
    parts: list[Tensor] = []
    for i in range(len(chunks)):
        offset, n, base, end, at, held = (
            chunks[i][0],
            chunks[i][1],
            chunks[i][2],
            chunks[i][3],
            chunks[i][4],
            chunks[i][5],
        )
        grouped = q[offset : offset + n].view(n, kv, group, dim).permute(1, 2, 0, 3).reshape(1, kv, -1, dim)
        if held > 0:  # positions [0, held) are the prefix's, the rest its own region's
            keys = torch.cat([k_cache[:, at : at + held], k_cache[:, base + held : base + end]], dim=1)
            values = torch.cat([v_cache[:, at : at + held], v_cache[:, base + held : base + end]], dim=1)
        else:
            keys, values = k_cache[:, base : base + end], v_cache[:, base : base + end]
        out = F.scaled_dot_product_attention(grouped, keys[None], values[None], attn_mask=chunk_masks[i])
        parts.append(out.view(kv, group, n, dim).permute(2, 0, 1, 3).reshape(n, -1))
    if q.shape[0] > decode_offset:
        decoding = q[decode_offset:].view(-1, kv, group, dim)
        count = decoding.shape[0]
        out_rows = q.new_empty(count, kv * group * dim)
        for i in range(len(groups)):
            g = groups[i]
            lo, stride, rows_in_view, span, direct, at, held = g[0], g[1], g[2], g[3], g[4], g[5], g[6]
            if direct == 1:  # the group is every decoding row, the view's rows, in step order: no scatter
                grouped = decoding
            else:
                grouped = decoding.new_zeros(rows_in_view, kv, group, dim)
                grouped[rows[i]] = decoding[members[i]]
            # Row r of the view reads tokens [lo + r * stride, + span) of the arena: zero-copy.
            size, step = [rows_in_view, kv, span, dim], [stride * dim, tokens * dim, dim, 1]
            keys = k_cache.as_strided(size, step, k_cache.storage_offset() + lo * dim)
            values = v_cache.as_strided(size, step, v_cache.storage_offset() + lo * dim)
            if held > 0:
                out = _cascade(grouped, k_cache, v_cache, at, held, keys, values, group_masks[i])
            else:
                out = _decode_attention(grouped, keys, values, group_masks[i])
            if direct == 1:
                out_rows = out.reshape(count, -1)
            else:
                out_rows[members[i]] = out[rows[i]].reshape(members[i].shape[0], -1)
        parts.append(out_rows)
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _decode_attention(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> Tensor:
    """Decoding rows' attention: a few queries a row against that row's keys. On a CPU in bfloat16 or
    float16, torch's fused kernel costs more than the layer's four projections at these shapes (SmolLM2, 32
    rows at position 150: a decode step 156-163 ms this way against 203-238 ms through it, p10 of 40, on a
    loaded 2-core EPYC), so there the scores are two matmuls with the softmax in float32, as transformers'
    eager attention computes them. float32 (token-exact parity with transformers), CUDA and up to 4 rows keep
    the kernel (at one row it is 3.4x the matmuls' speed, 0.026 against 0.088 ms a layer; they cross between
    4 and 8 rows)."""
    if q.device.type != "cpu" or q.dtype == torch.float32 or q.shape[0] <= 4:
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
    # keys @ q^T, then transposed: the arena's strided keys as the left operand copy as rows, 3x cheaper
    # than the transposed copy q @ keys^T makes (0.55 against 0.72 ms a layer, same values to the bit).
    scores = torch.matmul(keys, (q * (q.shape[-1] ** -0.5)).transpose(-1, -2)).transpose(-1, -2).float()
    scores = scores.masked_fill(mask.logical_not(), float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1).to(q.dtype), values)


def _write_and_attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    k_layer: Tensor,
    v_layer: Tensor,
    flat_token: Tensor,
    kv: int,
    dim: int,
    chunks: list[list[int]],
    chunk_masks: list[Tensor],
    decode_offset: int,
    groups: list[list[int]],
    members: list[Tensor],
    rows: list[Tensor],
    group_masks: list[Tensor],
) -> Tensor:
    """Writes one layer's new keys and values [total, kv, dim] at their arena tokens, then attends."""
    k_layer[:, flat_token] = k.transpose(0, 1)
    v_layer[:, flat_token] = v.transpose(0, 1)
    return _attention(
        q, k_layer, v_layer, kv, dim, chunks, chunk_masks, decode_offset, groups, members, rows, group_masks
    )


class LayerStack(torch.nn.Module):
    """One model's layer stack; `activation` (a key of ACTIVATIONS' values) is a TorchScript constant, so the
    gate's function is chosen once, when the stack is scripted, not per call. The weights are its attribute:
    passed per call as a Python list, each of their ~400 tensors took the GIL back when the call's list was
    freed (torch hands a tensor's Python object back when its C++ count falls to one: decode_row.RowStack)."""

    __constants__ = ["activation"]

    def __init__(self, activation: str, weights: list[list[Tensor]]) -> None:
        super().__init__()
        self.activation = activation
        self.weights = weights

    def _gate(self, gate: Tensor) -> Tensor:
        if self.activation == "gelu_tanh":
            return F.gelu(gate, approximate="tanh")
        if self.activation == "gelu":
            return F.gelu(gate)
        return F.silu(gate)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        flat_token: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
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
        lora: list[list[list[Tensor]]],  # per adapter in the step, per layer: (A, B) of each projection
        lora_rows: list[Tensor],  # per adapter in the step: its token rows (lora.segments)
    ) -> Tensor:
        total, width = x.shape[0], x.shape[1]
        adapted = len(lora_rows) > 0  # no adapter in the step: the base model's ops and nothing more
        qk_width, half = (heads + kv) * dim, dim // 2
        weights = self.weights
        for index in range(len(weights)):
            w = weights[index]  # as LAYER_WEIGHTS (TorchScript takes no module constants)
            h = F.rms_norm(x, [width], w[0], eps)
            qkv = linear(h, w[1], w[10], w[2])
            if adapted:
                qkv = lora_delta(h, qkv, lora, lora_rows, index, 0)
            qk = qkv[:, :qk_width].view(total, heads + kv, dim)
            qk = (
                qk * cos + torch.cat([-qk[:, :, half:], qk[:, :, :half]], dim=-1) * sin
            )  # rotary, q and k at once
            values = qkv[:, qk_width:].view(total, kv, dim)
            out = _write_and_attend(
                qk[:, :heads], qk[:, heads:], values, k_cache[index], v_cache[index], flat_token, kv, dim,
                chunks, chunk_masks, decode_offset, groups, members, rows, group_masks,
            )  # fmt: skip
            projected = linear(out, w[3], w[11], w[4])
            if adapted:
                projected = lora_delta(out, projected, lora, lora_rows, index, 2)
            x = x + projected
            h = F.rms_norm(x, [width], w[5], eps)
            gate_up = linear(h, w[6], w[12], w[7])
            if adapted:
                gate_up = lora_delta(h, gate_up, lora, lora_rows, index, 4)
            gate, up = gate_up.chunk(2, dim=-1)
            mixed = self._gate(gate) * up
            down = linear(mixed, w[8], w[13], w[9])
            if adapted:
                down = lora_delta(mixed, down, lora, lora_rows, index, 6)
            x = x + down
        return x


def compiled(activation: str, weights: list[list[Tensor]]) -> Any:
    """A model's scripted layer stack with this MLP activation, holding its weights (one per model)."""
    return script(LayerStack(activation, weights))


def scripted(function: Any) -> Any:
    """`function` as TorchScript, compiled once per process (other runtimes' stacks call _attention)."""
    if function not in _COMPILED:
        _COMPILED[function] = script(function)
    return _COMPILED[function]


def script(target: Any) -> Any:
    """torch.jit.script with its deprecation warning silenced (a module instance or a function)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.script(target)


_COMPILED: dict[Any, Any] = {}
