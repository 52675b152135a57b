"""int4's output projection on a CPU as FBGEMM's dynamic int8 linear (`quantized::linear_dynamic`): the same
int8 weights as `quantized.head_mode` gives it (symmetric, one scale per output channel), each activation row
rounded to 8 bits on its own, float32 out.

Why: at one decoding row (int4's reason to be) the head is the largest single op of a SmolLM2 step. Its
49,152 x 576 int8 weights, one thread, rows of 1: oneDNN's u8 x s8 kernel (`quantized._w8a8`) 2.4 ms with
the weights in cache and 3.3 ms streamed, FBGEMM's 0.9 and 1.4-1.6 ms; every linear layer of a SmolLM2
step at 32 rows, the same kernels: 49.9 against 35.0 ms (docs/quantization.md).

FBGEMM rounds the whole input with one scale and zero point (its minimum and maximum), which would make a
row's logits depend on the rows beside it. So each row is divided by its absolute maximum first, and one
more row holding 1 and -1 fixes the input's range at [-1, 1] whatever the batch: every row is rounded with
the same parameters, to the 255 levels a symmetric int8 row has, and its output scaled back. The activations
are unsigned 8-bit at full range (`reduce_range` off), which FBGEMM's AVX2 kernel can saturate; so the head
is packed so only where the CPU has VNNI, otherwise `quantized._w8a8` stays.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from server.runtimes.quantized import Quantized, quantize

if TYPE_CHECKING:
    PackedParams = Any
else:  # a TorchBind class: TorchScript reads it as a type, mypy cannot
    PackedParams = torch.classes.quantized.LinearPackedParamsBase


def available(device: torch.device) -> bool:
    """FBGEMM in this torch build, a CPU device, and VNNI instructions (no saturation at full range)."""
    if device.type != "cpu" or "fbgemm" not in torch.backends.quantized.supported_engines:
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags


def packed_head(head: Tensor | Quantized, quantization: str, device: torch.device) -> tuple[Any, int]:
    """(FBGEMM's packed head, its bytes) for int4's int8 output projection where `available`, else
    (None, 0): the other modes keep their kernels (w8a8_int8's oneDNN one, as its layers; int8's
    activations stay in the model's dtype), and an int4 head (a GGUF Q4 output) the int4 kernel."""
    if quantization != "int4" or (isinstance(head, Quantized) and head.bits == 4) or not available(device):
        return None, 0
    return pack(head)


def pack(weight: Tensor | Quantized) -> tuple[Any, int]:
    """The [N, K] weight as int8 per channel, packed by FBGEMM; and its resident bytes. The packed buffer is
    opaque (and may be padded): for a weight of 8 MiB or more, the process's growth while packing (SmolLM2's
    head: 30-31 MiB for 27 MiB of values), at least the values, a scale and a column offset per channel."""
    q = weight if isinstance(weight, Quantized) else quantize(weight, "int8")
    assert q.zeros is None, "the head is int8"
    before = _resident()
    engine = torch.backends.quantized.engine
    with warnings.catch_warnings():  # torch 2.13 marks quantized tensors deprecated; the op is what is used
        warnings.simplefilter("ignore")
        try:
            torch.backends.quantized.engine = "fbgemm"
            qweight = torch._make_per_channel_quantized_tensor(
                q.values.contiguous(), q.scales.double(), torch.zeros(q.shape[0], dtype=torch.long), 0
            )
            packed = torch.ops.quantized.linear_prepack(qweight, None)
            del qweight
        finally:
            torch.backends.quantized.engine = engine
    floor = q.values.numel() + q.shape[0] * 12  # values; a float scale and an int32 column offset each
    # Small buffers come from the heap's free space, where the growth says nothing: those count the floor.
    grown = _resident() - before if floor >= 8 << 20 else 0
    return packed, max(grown, floor)


def project(x: Tensor, packed: PackedParams) -> Tensor:
    """x [M, K] @ weight.T through FBGEMM, each row rounded alone (module docstring); in x's dtype.
    Scriptable: the one-row layer stack calls it."""
    flat = x.to(torch.float32)
    scale = flat.abs().amax(dim=-1, keepdim=True).clamp_(min=1e-10)
    bounds = torch.zeros(1, flat.shape[1], dtype=torch.float32, device=flat.device)
    bounds[0, 0] = 1.0
    bounds[0, 1] = -1.0
    y: Tensor = torch.ops.quantized.linear_dynamic(torch.cat([flat / scale, bounds]), packed, False)
    return y[: flat.shape[0]].mul_(scale).to(x.dtype)


def _resident() -> int:
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * 4096
    except OSError:
        return 0
