"""The native decoder's layer stack for a step of one decoding row (one stream, no prompt chunk, no prefix
held apart, no adapter): the same arithmetic as decoder_graph.LayerStack, op for op (the logits are equal
to the bit, tested), without the step's planning and with a third fewer ops a layer.

At one row a SmolLM2 step's linear layers take 9 of its 14 ms (int4, one thread); the rest is some 40 ops a
layer whose cost is mostly the memory the weights' stream has just evicted (measured: those ops alone cost a
quarter as much when nothing streams between them), so every op dropped counts. What goes: the general
path's attention plan (its group and mask lists, the scatter of rows into a view), `quantized.linear`'s
reshapes and casts where every projection is int4 packed for the CPU and the activations are bfloat16 (the
kernel is called directly), and the scatter that writes keys and values at a list of arena tokens (here one
token, a copy into a view). A sliding window takes the general path.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from server.runtimes.decoder_graph import script
from server.runtimes.fbgemm_head import PackedParams, project
from server.runtimes.quantized import linear


def one_row(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    token: int,
    base: int,
    span: int,
    k_layers: list[Tensor],
    v_layers: list[Tensor],
    weights: list[list[Tensor]],
    heads: int,
    kv: int,
    dim: int,
    eps: float,
    group_size: int,
    gate: str,
    norm: Tensor,
    head: Tensor,
    head_scales: Tensor,
    packed_head: Optional[PackedParams],  # noqa: UP045 (TorchScript's spelling)
) -> Tensor:
    """x [1, width] through every layer: the row writes its key and value at arena token `token` of each
    layer's arena [kv, tokens, dim] and attends tokens [base, base + span). `sin` is the rotary sine with
    its first half negated (which folds the rotation's negation into the table, exactly). `group_size` > 0:
    every projection is int4 packed for the CPU in groups of it, with bfloat16 activations and no bias,
    and its kernel is called directly; 0: `linear`. Returns the logits [1, V]: the final norm and the output
    projection run in the same call (0.3 of a 14 ms step less than from Python, and the GIL stays free):
    `packed_head` where it is FBGEMM's (fbgemm_head.py), else `head` and `head_scales` through `linear`."""
    width = x.shape[1]
    qk_width, half, group = (heads + kv) * dim, dim // 2, heads // kv
    direct = group_size > 0
    for index in range(len(weights)):
        w = weights[index]  # as decoder_graph.LAYER_WEIGHTS
        h = F.rms_norm(x, [width], w[0], eps)
        if direct:
            qkv = torch.ops.aten._weight_int4pack_mm_for_cpu(h, w[1], group_size, w[10])
        else:
            qkv = linear(h, w[1], w[10], w[2])
        qk = qkv[:, :qk_width].view(heads + kv, dim)
        # LayerStack's rotary, qk * cos + cat(-second half, first half) * sin, in 4 ops instead of 7: the same
        # products and sum, rounded alike (a negation is exact).
        qk = qk * cos + qk.roll(half, 1) * sin
        k_layer, v_layer = k_layers[index], v_layers[index]
        k_layer.select(1, token).copy_(qk[heads:])
        v_layer.select(1, token).copy_(qkv[0, qk_width:].view(kv, dim))
        out = attend(
            qk[:heads].view(1, kv, group, dim),
            k_layer[None, :, base : base + span],
            v_layer[None, :, base : base + span],
        ).view(1, heads * dim)
        if direct:
            x = x + torch.ops.aten._weight_int4pack_mm_for_cpu(out, w[3], group_size, w[11])
        else:
            x = x + linear(out, w[3], w[11], w[4])
        h = F.rms_norm(x, [width], w[5], eps)
        if direct:
            gate_up = torch.ops.aten._weight_int4pack_mm_for_cpu(h, w[6], group_size, w[12])
        else:
            gate_up = linear(h, w[6], w[12], w[7])
        inner = gate_up.shape[1] // 2
        if gate == "gelu_tanh":
            mixed = F.gelu(gate_up[:, :inner], approximate="tanh") * gate_up[:, inner:]
        elif gate == "gelu":
            mixed = F.gelu(gate_up[:, :inner]) * gate_up[:, inner:]
        else:
            mixed = F.silu(gate_up[:, :inner]) * gate_up[:, inner:]
        if direct:
            x = x + torch.ops.aten._weight_int4pack_mm_for_cpu(mixed, w[8], group_size, w[13])
        else:
            x = x + linear(mixed, w[8], w[13], w[9])
    h = F.rms_norm(x, [width], norm, eps)
    if packed_head is not None:
        return project(h, packed_head)
    return linear(h, head, head_scales, None)


class RowStack(torch.nn.Module):
    """`one_row` with its model tensors held as the attributes of one scripted module (`stack`), so a call
    passes the row's few tensors only. Passed as Python lists, each call's ~500 tensors (weights, each layer's
    keys and values) took the GIL back one by one where the call's lists were freed: torch hands a tensor's
    Python object back when its C++ count falls to one, which needs the GIL (6% of a one-stream SmolLM2
    server's samples, beside the event loop that holds it)."""

    def __init__(
        self, k_layers: list[Tensor], v_layers: list[Tensor], weights: list[list[Tensor]],
        shape: tuple[int, int, int, float, int, str], norm: Tensor, head: tuple[Tensor, Tensor],
        packed_head: Optional[PackedParams],  # noqa: UP045
    ) -> None:  # fmt: skip
        super().__init__()
        self.k_layers, self.v_layers, self.weights = k_layers, v_layers, weights
        self.heads, self.kv, self.dim, self.eps, self.group_size, self.gate = shape
        self.norm, (self.head, self.head_scales), self.packed_head = norm, head, packed_head

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, token: int, base: int, span: int) -> Tensor:
        return one_row(
            x, cos, sin, token, base, span, self.k_layers, self.v_layers, self.weights, self.heads, self.kv,
            self.dim, self.eps, self.group_size, self.gate, self.norm, self.head, self.head_scales,
            self.packed_head,
        )  # fmt: skip


def stack(*args: Any) -> Any:
    """A scripted RowStack (its arguments), made again wherever the arena is."""
    return script(RowStack(*args))


def attend(q: Tensor, keys: Tensor, values: Tensor) -> Tensor:
    """F.scaled_dot_product_attention without a mask, as it computes on a CPU (its flash kernel) and on CUDA.
    On a CPU the kernel is called directly: the dispatcher's choice of backend costs 8 of its 44 us at one
    row (SmolLM2, 200 keys), times 30 layers; the output is the same tensor (tested against the general
    path)."""
    if q.is_cuda:
        return F.scaled_dot_product_attention(q, keys, values)
    out: Tensor = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, keys, values)[0]
    return out


def direct_group(weights: list[list[Tensor]], dtype: torch.dtype) -> int:
    """The int4 group size when every layer's four projections are int4 packed for the CPU (uint8) in one
    group size, without biases, and the activations are bfloat16 (what `linear` would hand the kernel
    anyway); else 0 (`one_row` then calls `linear`)."""
    if dtype != torch.bfloat16:
        return 0
    sizes: set[int] = set()
    for w in weights:
        for weight, bias, scales in ((w[1], w[2], w[10]), (w[3], w[4], w[11]), (w[6], w[7], w[12])):
            if weight.dtype != torch.uint8 or weight.is_cuda or bias.numel() or scales.dim() != 3:
                return 0
            sizes.add(_group(weight, scales))
        if w[8].dtype != torch.uint8 or w[8].is_cuda or w[9].numel() or w[13].dim() != 3:
            return 0
        sizes.add(_group(w[8], w[13]))
    return sizes.pop() if len(sizes) == 1 else 0


def _group(weight: Tensor, scales: Tensor) -> int:
    # The CPU packing keeps [N, K / 2] bytes; scales and zeros are [K / group, N, 2].
    return weight.shape[1] * 2 // scales.shape[0]
