"""Issue 30's 32-stream point, in process: what each kernel costs a SmolLM2 step at a batch of rows, and
whether int4 weights (one resident copy) can be multiplied faster than dense bfloat16 there.

Part `kernels`: every linear layer of one SmolLM2-135M step (30 layers x qkv, o, gate/up, down; the
output projection apart), one thread, random weights of the real shapes, each arm timed in turn within
every repeat (CPU ms a step, median [min-max]). The arms: bfloat16 prepacked by oneDNN (the dense mode's
kernel), w8a8_int8 (oneDNN u8 x s8), int4's `_weight_int4pack_mm_for_cpu` (groups of 32), and the routes
that would keep only the int4 copy at a large batch: unpacking the int4 layout to int8 per layer into a
reused buffer for `torch._int_mm` (the values alone; the group scales would cost more on top), one
elementwise pass over the packed bytes (the floor of any unpack made of torch ops), and int4 values
dequantized to bfloat16 per layer (from already unpacked values: a floor too), before any matmul.

Part `steps`: the native decoder's whole step on the GGUF file at positions 150 (prefix 43 + 107), 32
rows and one, per mode (bfloat16, int4, w8a8_int8), with each mode's resident weights against float32's.

    .venv/bin/python -m bench.int4_batch [--part kernels|steps] [--rows 32] [--repeats 7]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch

from bench.smollm2 import cpu
from bench.stats import Spread
from server.runtimes.quantized import _w8a8, prepare, quantize

SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))  # [N, K]: qkv, o, gate/up, down
LAYERS = 30


def _layer(n: int, k: int) -> dict[str, torch.Tensor]:
    dense = torch.randn(n, k) * 0.05
    q8 = quantize(dense, "w8a8_int8")
    q4 = quantize(dense, "int4")
    int4, scales_zeros = prepare(q4, "int4", torch.bfloat16, torch.device("cpu"))
    w8a8, w8a8_scales = prepare(q8, "w8a8_int8", torch.bfloat16, torch.device("cpu"))
    bf16, _ = prepare(dense, "none", torch.bfloat16, torch.device("cpu"))
    return {
        "bf16": bf16, "w8a8": w8a8, "w8a8_scales": w8a8_scales, "int4": int4, "int4_sz": scales_zeros,
        "values": q4.values, "scales": q4.scales.bfloat16(), "zeros": q4.zeros.bfloat16(),  # type: ignore[union-attr]
    }  # fmt: skip


def _unpack(packed: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The CPU int4 layout ([N / 64, K, 32] bytes: low nibble column n, high nibble n + 32 of each block of
    64 rows) as int8 values - 8 into `out` [K, N], the layout `torch._int_mm` takes."""
    k, n = out.shape
    blocks = out.view(k, n // 64, 64).permute(1, 0, 2)
    signed = (packed ^ 0x88).view(torch.int8).view(n // 64, k, 32)  # q - 8 in each nibble, two's complement
    torch.bitwise_right_shift(signed, 4, out=blocks[..., 32:])
    torch.bitwise_right_shift(signed << 4, 4, out=blocks[..., :32])
    return out


def _dequantize(w: dict[str, torch.Tensor], n: int, k: int) -> torch.Tensor:
    """q * scale + zero in bfloat16 from unpacked values (a floor: the nibbles' unpack and the - 8 are
    left out; Quantized.dequantize, through float32, costs about 10x this)."""
    grouped = w["values"].view(n, k // 32, 32).to(torch.bfloat16)
    return (grouped * w["scales"][..., None]).add_(w["zeros"][..., None]).view(n, k)


def kernels(rows: int, repeats: int) -> None:
    torch.manual_seed(0)
    layers = [[_layer(n, k) for n, k in SHAPES] for _ in range(LAYERS)]
    xs = {k: torch.randn(rows, k).bfloat16() for _, k in SHAPES}
    buffers = {(n, k): torch.empty(k, n, dtype=torch.int8) for n, k in SHAPES}

    def each(call: Callable[[dict[str, torch.Tensor], torch.Tensor, int, int], object]) -> Callable[[], None]:
        def run() -> None:
            for layer in layers:
                for (n, k), w in zip(SHAPES, layer, strict=True):
                    call(w, xs[k], n, k)

        return run

    arms: dict[str, Callable[[], None]] = {
        "bfloat16 prepacked (dense mode)": each(
            lambda w, x, n, k: torch.ops.mkldnn._linear_pointwise(x, w["bf16"], None, "none", [], "")
        ),
        "w8a8_int8 oneDNN": each(lambda w, x, n, k: _w8a8(x, w["w8a8"], w["w8a8_scales"])),
        "int4 _weight_int4pack_mm_for_cpu": each(
            lambda w, x, n, k: torch.ops.aten._weight_int4pack_mm_for_cpu(x, w["int4"], 32, w["int4_sz"])
        ),
        "int4 -> int8 unpack alone": each(lambda w, x, n, k: _unpack(w["int4"], buffers[n, k])),
        "int4 -> int8 unpack + _int_mm": each(
            lambda w, x, n, k: _w8a8(x, _unpack(w["int4"], buffers[n, k]), w["w8a8_scales"])
        ),
        "one pass over the packed bytes": each(lambda w, x, n, k: torch.bitwise_and(w["int4"], 15)),
        "int4 values -> bfloat16 dequant alone": each(lambda w, x, n, k: _dequantize(w, n, k)),
    }
    title = f"every linear layer of one SmolLM2 step ({LAYERS} x 4), {rows} rows, CPU ms, {repeats} repeats:"
    _report(title, arms, repeats, base="bfloat16 prepacked (dense mode)")


def _report(title: str, arms: dict[str, Callable[[], object]], repeats: int, *, base: str) -> None:
    """Each arm once to warm, then every arm in turn within each repeat (CPU ms); the spread and the ratio
    of each median to `base`'s."""
    times: dict[str, list[float]] = {name: [] for name in arms}
    for arm in arms.values():
        arm()
    for _ in range(repeats):
        for name, arm in arms.items():
            started = time.process_time()
            arm()
            times[name].append((time.process_time() - started) * 1e3)
    base_ms = Spread.of(times[base]).median
    print(title)
    for name, values in times.items():
        spread = Spread.of(values)
        print(f"  {name:<40} {spread.format(1):>20}  {spread.median / base_ms:5.2f}x bfloat16")


def steps(repeats: int) -> None:
    from server.runtimes.gguf_file import read_config
    from server.runtimes.llama import LlamaDecoder
    from server.runtimes.smollm2 import smollm2_gguf

    path, cpu_device = smollm2_gguf(), torch.device("cpu")
    config = read_config(path)

    def load(mode: str, dtype: torch.dtype = torch.bfloat16) -> LlamaDecoder:
        return LlamaDecoder(path, config, dtype=dtype, device=cpu_device, quantization=mode)

    float32 = load("none", torch.float32).weights_bytes()
    models = {"bfloat16": load("none"), "int4": load("int4"), "w8a8_int8": load("w8a8_int8")}
    for name, model in models.items():
        size = model.weights_bytes()
        print(f"  {name:<20} weights {size / 2**20:6.1f} MiB, {size / float32:.3f}x float32's")
        model.allocate(32 * 256, 2048)
    for rows in (32, 1):
        tokens = torch.randint(0, 49152, (rows,))
        positions, bases = torch.full((rows,), 150), [i * 256 for i in range(rows)]

        def step(
            model: LlamaDecoder, *, inputs: tuple[Any, ...] = (bases, tokens, positions)
        ) -> Callable[[], object]:
            return lambda: model.forward([], *inputs)

        title = f"a whole step of {rows} decoding row(s) at position 150, CPU ms, {repeats} repeats:"
        with torch.inference_mode():
            _report(title, {name: step(model) for name, model in models.items()}, repeats, base="bfloat16")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", choices=("kernels", "steps", "all"), default="all")
    parser.add_argument("--rows", type=int, default=32, help="rows of the kernels part")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(cpu(), f"; 1 thread; torch {torch.__version__}")
    if args.part in ("kernels", "all"):
        kernels(args.rows, args.repeats)
    if args.part in ("steps", "all"):
        steps(args.repeats)


if __name__ == "__main__":
    main()
