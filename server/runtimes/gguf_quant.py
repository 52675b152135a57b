"""GGUF blocks kept quantized: a tensor whose GGML type maps onto a kernel Sluice has is read into
quantized.py's Quantized form instead of being dequantized. Q4_0 and Q4_1 (blocks of 32: w = d * (q - 8)
and w = d * q + m) are torch's int4 format exactly, (q - 8) * scale + zero with scale = d and zero = 0 or
m + 8d. Q8_0's blocks of 32 have a scale each, which torch's int8 kernel (one scale per output channel)
lacks, so they are dequantized exactly and requantized per channel, with a log line. Any other type is
dequantized (gguf_file.py) and, when --quantization asks, requantized by quantized.py, also logged.
"""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import torch

from server.runtimes.quantized import Quantized, quantize

log = logging.getLogger(__name__)

_BLOCK = 32
# GGML type name -> the --quantization mode it maps onto, kept exact (Q8_0: requantized per channel).
KEPT = {"Q4_0": "int4", "Q4_1": "int4", "Q8_0": "int8"}


def kept_form(kind: str, shape: tuple[int, ...], quantization: str) -> bool:
    """Whether a tensor of GGML type `kind` is read straight into the form `quantization` asks for."""
    return len(shape) == 2 and KEPT.get(kind) == quantization and shape[1] % _BLOCK == 0


def from_blocks(raw: np.ndarray, kind: str, shape: tuple[int, ...]) -> Quantized:
    """The [N, K] tensor of GGML type `kind` (a kept_form type) from its bytes [N, K / 32 * block size]."""
    rows, width = shape
    blocks = np.ascontiguousarray(raw).reshape(rows, width // _BLOCK, -1)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if kind == "Q8_0":
        q = blocks[..., 2:].copy().view(np.int8).astype(np.float32)
        dense = torch.from_numpy((q * d[..., None]).reshape(rows, width))
        return quantize(dense, "int8")
    if kind == "Q4_1":
        m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        packed, zero = blocks[..., 4:], m + 8 * d
    else:  # Q4_0
        packed, zero = blocks[..., 2:], np.zeros_like(d)
    # Element j of a block is the low nibble of byte j, element j + 16 the high nibble.
    values = np.concatenate([packed & 15, packed >> 4], axis=-1).reshape(rows, width)
    return Quantized(torch.from_numpy(values), torch.from_numpy(d), torch.from_numpy(zero), _BLOCK)


def log_conversions(path: object, kept: Counter[str], dense: Counter[str], quantization: str) -> None:
    """One line saying which types stayed quantized and which were dequantized (and requantized)."""
    if kept:
        how = ", ".join(f"{n} {kind}" for kind, n in sorted(kept.items()))
        log.info("%s: kept as %s: %s tensors (Q8_0 requantized per channel)", path, quantization, how)
    matrices = {kind: n for kind, n in dense.items() if kind not in ("F32", "F16")}
    if matrices:
        how = ", ".join(f"{n} {kind}" for kind, n in sorted(matrices.items()))
        then = f"then requantized to {quantization}" if quantization != "none" else "served dense"
        log.info("%s: dequantized %s tensors, %s", path, how, then)
