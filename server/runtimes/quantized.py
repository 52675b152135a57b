"""Quantized linear layers (--quantization int8|int4|w8a8_int8): a weight's integer form (Quantized), how it
is made from a dense weight, fused with others and packed for torch's kernels, and `linear`, the one
TorchScript-able matmul the native decoder's layer stack calls for dense and packed weights alike.

Formats are torch's own (the gpt-fast kernels, no torchao): int8 is symmetric per output channel
(`_weight_int8pack_mm`: y = x @ (q * scale).T); w8a8_int8 (SGLang's name) is the same weight with each
activation row quantized symmetric int8 at run time and `torch._int_mm` (VNNI on CPU: 2.3x oneDNN's bfloat16
matmul at SmolLM2's batch-32 shapes, where a step is bound by compute, not by reading weights); int4 is
asymmetric per group of GROUP input channels
(`_weight_int4pack_mm[_for_cpu]`: w = (q - 8) * scale + zero, q in 0..15), which GGUF's Q4_0 and Q4_1 blocks
map onto exactly (gguf_quant.py). The integers stay unpacked until `pack`, so that q, k and v (or gate and
up) are fused by concatenating rows, and llama.cpp's row order undone, before the layout is fixed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import List, Optional, Union  # noqa: UP035 (TorchScript's spelling of Scalar?[], _no_scalars)

import torch
import torch.nn.functional as F
from torch import Tensor

MODES = ("none", "int8", "int4", "w8a8_int8")
GROUP = 32  # int4 group size: GGUF's Q4 block, so that Q4_0/Q4_1 files map onto it exactly


@dataclass(frozen=True)
class Quantized:
    """A [N, K] weight as integers: int8 values with scales [N], or int4 values (uint8 0..15) with scales
    and zeros [N, K / group]."""

    values: Tensor
    scales: Tensor
    zeros: Tensor | None = None
    group: int = 0

    @property
    def bits(self) -> int:
        return 4 if self.zeros is not None else 8

    @property
    def shape(self) -> torch.Size:
        return self.values.shape

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        if self.zeros is None:
            return (self.values.float() * self.scales.float()[:, None]).to(dtype)
        n, k = self.values.shape
        grouped = self.values.float().view(n, k // self.group, self.group) - 8
        dense = grouped * self.scales.float()[..., None] + self.zeros.float()[..., None]
        return dense.reshape(n, k).to(dtype)

    def rows(self, order: Tensor) -> Quantized:
        """The weight with its output rows reordered (llama.cpp's q/k interleaving undone)."""
        zeros = self.zeros[order] if self.zeros is not None else None
        return Quantized(self.values[order], self.scales[order], zeros, self.group)


def quantize(weight: Tensor, mode: str, group: int = GROUP) -> Quantized:
    """A dense [N, K] weight as `mode` (int8 or int4), rounded to nearest (no calibration data)."""
    w = weight.detach().float()
    if mode in ("int8", "w8a8_int8"):
        scales = (w.abs().amax(dim=1) / 127).clamp(min=1e-10)
        values = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
        return Quantized(values, scales)
    if mode != "int4":
        raise ValueError(f"quantization takes {', '.join(MODES)}, not {mode!r}")
    n, k = w.shape
    grouped = w.view(n, k // group, group)
    low, high = grouped.amin(dim=-1), grouped.amax(dim=-1)
    scales = ((high - low) / 15).clamp(min=1e-10)
    values = torch.round((grouped - low[..., None]) / scales[..., None]).clamp(0, 15).to(torch.uint8)
    return Quantized(values.view(n, k), scales, low + 8 * scales, group)


def head_mode(mode: str) -> str:
    """The output projection's mode. Under int4 it is int8 (as llama.cpp's Q4 files keep it in Q8_0;
    SmolLM2's perplexity costs +9.5% with an int4 lm_head) with int8 activations too: w8a8's kernel, since
    int8 weight-only slows with the batch (SmolLM2's 49,152 x 576 head at 32 rows: ~12x w8a8's time) and the
    rows' rounding costs the logits nothing measurable (perplexity 17.45 with it, 17.40 without, w8a8)."""
    return "w8a8_int8" if mode == "int4" else mode


def quantizable(weight: Tensor | Quantized, mode: str, group: int = GROUP) -> bool:
    """Whether `mode` applies to this weight: a matrix whose shape int4's packing takes (input width whole
    groups, output rows a multiple of 16: both int4 packers' constraint)."""
    if isinstance(weight, Quantized):
        return weight.zeros is None or weight.shape[0] % 16 == 0
    if mode == "none" or weight.dim() != 2:
        return False
    return mode in ("int8", "w8a8_int8") or (weight.shape[1] % group == 0 and weight.shape[0] % 16 == 0)


def fuse(parts: list[Tensor | Quantized]) -> Tensor | Quantized:
    """Row-wise concatenation (q, k and v into one projection), of dense or of like-quantized weights."""
    if all(isinstance(p, Tensor) for p in parts):
        return torch.cat([p for p in parts if isinstance(p, Tensor)]).contiguous()
    quantized = [p for p in parts if isinstance(p, Quantized)]
    if len(quantized) != len(parts) or len({(q.bits, q.group) for q in quantized}) != 1:
        raise ValueError("fused weights must all be quantized alike")
    zeros = [q.zeros for q in quantized if q.zeros is not None]
    return Quantized(
        torch.cat([q.values for q in quantized]),
        torch.cat([q.scales for q in quantized]),
        torch.cat(zeros) if zeros else None,
        quantized[0].group,
    )


def pack(
    weight: Quantized, dtype: torch.dtype, device: torch.device, activations: bool = False
) -> tuple[Tensor, Tensor]:
    """(weight, scales) as `linear` takes them on `device`: scales in bfloat16, the activations' dtype of the
    kernels (their float32 forms have no fast path on CPU: 10-20x slower, docs/quantization.md), except
    where a CUDA int8 weight is dequantized per call in `dtype`. With `activations` (w8a8_int8) the scales
    are a float32 row [1, N] (their rank tells `linear`) and the weight oneDNN's prepacked int8 on a CPU,
    else the [K, N] view of it that `torch._int_mm` takes."""
    if weight.zeros is None and activations:
        scales = weight.scales.float()[None, :].to(device)
        if device.type == "cpu" and _onednn():
            return torch.ops.onednn.qlinear_prepack(weight.values.contiguous(), None), scales
        return weight.values.contiguous().to(device).t(), scales  # column-major [K, N], as torchao passes it
    if weight.zeros is None:
        scales_dtype = dtype if device.type == "cuda" else torch.bfloat16
        return weight.values.to(device), weight.scales.to(device=device, dtype=scales_dtype)
    # [K / group, N, 2]: each group's scale and zero, as both int4 kernels read them.
    scales_and_zeros = torch.stack([weight.scales, weight.zeros], dim=-1).transpose(0, 1).contiguous()
    values = weight.values.to(device)
    if device.type == "cuda":  # two values a byte, high nibble first, then the tensor-core tiling
        paired = (values[:, ::2] << 4 | values[:, 1::2]).contiguous()
        # The tiling gpt-fast uses (8 inner k-tiles of 16) where the width allows it (SmolLM2's 576 does not).
        tiles = next(t for t in (8, 4, 2) if values.shape[1] % (16 * t) == 0)
        packed = torch.ops.aten._convert_weight_to_int4pack(paired, tiles)
        return packed, scales_and_zeros.to(device=device, dtype=torch.bfloat16)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(values.to(torch.int32), 1)
    return packed, scales_and_zeros.to(dtype=torch.bfloat16)


def _onednn() -> bool:
    return bool(torch.backends.mkldnn.is_available())  # type: ignore[no-untyped-call]


def prepacks(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a dense weight is stored in oneDNN's blocked layout: on a CPU with bfloat16 instructions, in
    bfloat16, where the reorder F.linear does on every call is done once (SmolLM2 in bfloat16, 1 thread: a
    gate/up projection 0.32 against 0.48 ms at batch 1, 0.71 against 0.94 ms at 32; identical values)."""
    return (
        device.type == "cpu"
        and dtype == torch.bfloat16
        and _onednn()
        and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    )


def prepare(
    weight: Tensor | Quantized, mode: str, dtype: torch.dtype, device: torch.device
) -> tuple[Tensor, Tensor]:
    """(weight, scales) for `linear`: packed where the weight is (or `mode` makes it) quantized, else the
    dense weight (prepacked where `prepacks`) and an empty scales tensor."""
    if isinstance(weight, Tensor) and quantizable(weight, mode):
        weight = quantize(weight, mode)
    if isinstance(weight, Quantized):
        if quantizable(weight, mode):
            return pack(weight, dtype, device, activations=mode == "w8a8_int8" and weight.zeros is None)
        weight = weight.dequantize(dtype)  # a GGUF Q4 tensor int4's packing cannot take
    dense = weight.to(device=device, dtype=dtype)
    if dense.dim() == 2 and prepacks(dtype, device):
        dense = torch.ops.mkldnn._reorder_linear_weight(dense.contiguous(), 32)
    return dense, torch.empty(0, device=device, dtype=dtype)


def linear(x: Tensor, weight: Tensor, scales: Tensor, bias: Tensor | None) -> Tensor:
    """x @ weight.T + bias for a dense weight (scales empty) or a packed one (by its dtype: int8; uint8, int4
    packed for the CPU; int32, int4 packed for CUDA; int8 with scales [1, N]: w8a8_int8; a oneDNN tensor:
    prepacked). An empty bias is none (the layer stack's weights are uniform lists: a model without biases
    would otherwise add zeros four times a layer). Scriptable: the layer stack calls it per projection."""
    if bias is not None and bias.numel() == 0:
        bias = None
    if scales.numel() == 0 and not weight.is_mkldnn:
        return F.linear(x, weight, bias)
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    y: Tensor = flat  # assigned below in every branch (declared once for TorchScript and mypy)
    if scales.numel() == 0:  # a dense weight oneDNN prepacked
        y = torch.ops.mkldnn._linear_pointwise(flat, weight, bias, "none", _no_scalars(), "")
        bias = None
    elif scales.dim() == 2:
        y = _w8a8(flat, weight, scales)
    elif weight.dtype == torch.int8 and weight.is_cuda:  # no CUDA int8 kernel in torch: dequantized per call
        y = F.linear(flat, weight.to(flat.dtype) * scales[:, None].to(flat.dtype))
    elif weight.dtype == torch.int8:
        y = torch.ops.aten._weight_int8pack_mm(flat.to(torch.bfloat16), weight, scales).to(flat.dtype)
    else:
        group = flat.shape[-1] // scales.shape[0]
        if weight.is_cuda:
            y = torch.ops.aten._weight_int4pack_mm(flat.to(torch.bfloat16), weight, group, scales)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat.to(torch.bfloat16), weight, group, scales)
        y = y.to(flat.dtype)
    shape = list(x.shape)
    shape[-1] = y.shape[-1]
    y = y.view(shape)
    if bias is not None:
        y = y + bias
    return y


def _no_scalars() -> List[Optional[Union[int, float, complex]]]:  # noqa: UP006, UP007, UP045
    return []  # oneDNN's post-op arguments: TorchScript reads Scalar?[] only in this spelling


def _w8a8(flat: Tensor, weight: Tensor, scales: Tensor) -> Tensor:
    """flat [M, K] quantized per row (symmetric: its absolute maximum to 127), times the int8 weight,
    rescaled by the row's and the channel's scales in place (a broadcast [M, 1] x [1, N] product costs a
    third of the matmul at SmolLM2's lm_head). oneDNN's CPU kernel takes the rows as uint8 around 128 (as
    int8 it falls to a reference loop 4,000x slower); CUDA's `_int_mm` takes M > 16 only: smaller batches
    are padded."""
    rows = flat.shape[0]
    # A copy (also of float32 rows), rounded in place below: 5 allocations fewer a call, 2 ms a SmolLM2 step.
    step = flat.to(torch.float32, copy=True)
    step_scale = step.abs().amax(dim=-1, keepdim=True).div_(127).clamp_(min=1e-10)
    q = step.div_(step_scale).round_()
    if weight.is_mkldnn:
        y: Tensor = torch.ops.onednn.qlinear_pointwise(
            q.add_(128).to(torch.uint8), 1.0, 128, weight, scales[0], torch.empty(0, dtype=torch.long), None,
            1.0, 0, torch.float32, "none", _no_scalars(), "",
        )  # fmt: skip
        return y.mul_(step_scale).to(flat.dtype)
    q8 = q.to(torch.int8)
    if q8.is_cuda and rows <= 16:
        q8 = torch.cat([q8, q8.new_zeros(17 - rows, q8.shape[1])])
    y = torch._int_mm(q8, weight)[:rows].float()
    return y.mul_(step_scale).mul_(scales).to(flat.dtype)


class RowTable:
    """An embedding table whose rows are looked up (embed[ids]): dense, int8 per row, or int4 per group
    with two values a byte (a GGUF Q4 token embedding stays exact and 4.5 bits a weight)."""

    def __init__(self, table: Tensor | Quantized, dtype: torch.dtype, device: torch.device) -> None:
        self.dtype = dtype
        self.dense = table.to(device=device, dtype=dtype) if isinstance(table, Tensor) else None
        self.table = table if isinstance(table, Quantized) else None
        if self.table is not None:
            values = self.table.values
            if self.table.zeros is not None:  # int4: two a byte
                values = values[:, ::2] | values[:, 1::2] << 4
            zeros = self.table.zeros.to(device) if self.table.zeros is not None else None
            self.table = Quantized(values.to(device), self.table.scales.to(device), zeros, self.table.group)

    def __getitem__(self, ids: Tensor) -> Tensor:
        if self.dense is not None:
            return self.dense[ids]
        table = self.table
        assert table is not None
        if table.zeros is None:
            return table.values[ids].to(self.dtype) * table.scales[ids][:, None].to(self.dtype)
        packed = table.values[ids]
        values = torch.stack([packed & 15, packed >> 4], dim=-1).view(packed.shape[0], -1)
        rows = Quantized(values, table.scales[ids], table.zeros[ids], table.group)
        return rows.dequantize(self.dtype)

    def nbytes(self) -> int:
        if self.dense is not None:
            return nbytes([self.dense])
        assert self.table is not None
        zeros = [self.table.zeros] if self.table.zeros is not None else []
        return nbytes([self.table.values, self.table.scales, *zeros])


def embedding_tables(embed: Tensor | Quantized, mode: str) -> tuple[Tensor | Quantized, Tensor | Quantized]:
    """(the table rows are looked up in, the output projection where it is tied) under `mode`: quantized,
    one int8 tensor for both (a quantized file's table as it is). Under w8a8_int8 the rows are looked up in
    int4 (groups of 32, rounded from the embedding as read: SmolLM2's perplexity +2.8%, from the int8 values
    +6.3%, int8 lookups +2.2%): its head is an int8 copy of its own (oneDNN's prepacked layout, which rows
    cannot be read from), a second int8 table put SmolLM2's weights at 0.305x float32's, over issue 30's
    0.3x, and sharing the table's values as the head cost ~9% of a 32-row step (docs/quantization.md)."""
    if mode == "none":
        return embed, embed
    table = embed if isinstance(embed, Quantized) else quantize(embed, "int8")
    if mode == "w8a8_int8" and table.zeros is None and table.shape[1] % GROUP == 0:
        dense = embed if isinstance(embed, Tensor) else embed.dequantize()
        return quantize(dense, "int4"), table
    return table, table


def nbytes(tensors: Sequence[Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
