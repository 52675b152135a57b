"""Quantization of the generic Hugging Face path: every nn.Linear of a loaded transformers model (its
lm_head included, int8 under int4: quantized.head_mode) replaced by a PackedLinear holding the packed
weight, so that transformers' own forward runs on quantized.py's kernels. Embeddings stay as the model has
them (transformers looks rows up in an nn.Embedding); a tied lm_head is a packed copy."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import Tensor, nn

from server.runtimes.quantized import head_mode, linear, nbytes, prepare, quantizable

log = logging.getLogger(__name__)


class PackedLinear(nn.Module):
    """nn.Linear's forward over a packed weight (buffers, not parameters: nothing here is trained)."""

    def __init__(self, source: nn.Linear, mode: str, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.in_features, self.out_features = source.in_features, source.out_features
        weight, scales = prepare(source.weight.detach(), mode, dtype, device)
        bias = source.bias.detach().to(device=device, dtype=dtype) if source.bias is not None else None
        self.weight: Tensor
        self.scales: Tensor
        self.bias: Tensor | None
        self.register_buffer("weight", weight)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", bias)

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.scales, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed {self.weight.dtype}"


def quantize_linears(model: nn.Module, mode: str, dtype: torch.dtype, device: torch.device) -> int:
    """Replaces each quantizable nn.Linear of `model` in place; returns how many were replaced. A Linear whose
    input width int4's groups do not divide stays dense (logged)."""
    if mode == "none":
        return 0
    replaced, kept = 0, []
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if not isinstance(child, nn.Linear):
                continue
            chosen = head_mode(mode) if child is head else mode
            if not quantizable(child.weight, chosen):
                kept.append(child_name)
                continue
            setattr(parent, child_name, PackedLinear(child, chosen, dtype, device))
            replaced += 1
    if kept:
        log.info("%d linear layers stay dense (their widths are not whole %s groups): %s", len(kept), mode,
                 ", ".join(sorted(set(kept))))  # fmt: skip
    return replaced


def resident_bytes(model: nn.Module) -> int:
    """The bytes of every parameter and buffer, each storage counted once (tied weights share one)."""
    seen: dict[int, int] = {}
    tensors: list[Any] = [*model.parameters(), *model.buffers()]
    for tensor in tensors:
        key = id(tensor) if tensor.is_mkldnn else tensor.untyped_storage().data_ptr()  # opaque: no storage
        seen[key] = nbytes([tensor])
    return sum(seen.values())
