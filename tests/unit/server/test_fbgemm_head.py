"""Issue 30: int4's output projection through FBGEMM (fbgemm_head.py): each row rounded alone, so a row's
logits are the same bits whatever rows share its step, close to the int8 weights' exact product, and what a
seeded int4 decoder's general and one-row paths both use."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from server.runtimes import fbgemm_head, quantized
from server.runtimes.decoder_graph import scripted

CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(not fbgemm_head.available(CPU), reason="FBGEMM with VNNI only")


@pytest.fixture(scope="module")
def weight() -> torch.Tensor:
    return torch.randn(4096, 96, generator=torch.Generator().manual_seed(5)) * 0.05


def test_a_rows_logits_do_not_depend_on_the_rows_beside_it(weight: torch.Tensor) -> None:
    packed, _ = fbgemm_head.pack(weight)
    rows = torch.randn(32, 96, generator=torch.Generator().manual_seed(6), dtype=torch.float32)
    rows[7] *= 50  # an outlier row would widen a range shared over the batch
    project = scripted(fbgemm_head.project)
    together = project(rows.to(torch.bfloat16), packed)
    for i in (0, 7, 31):
        alone = project(rows[i : i + 1].to(torch.bfloat16), packed)
        assert torch.equal(alone, together[i : i + 1])
        assert torch.equal(fbgemm_head.project(rows[i : i + 1].to(torch.bfloat16), packed), alone)


def test_it_computes_the_int8_weights_product_with_rows_rounded_to_8_bits(weight: torch.Tensor) -> None:
    packed, size = fbgemm_head.pack(weight)
    q = quantized.quantize(weight, "int8")
    assert size == q.values.numel() + 12 * weight.shape[0]  # under 8 MiB: values, a scale and offset each
    rows = torch.randn(5, 96, generator=torch.Generator().manual_seed(7))
    exact = rows @ q.dequantize().t()
    got = fbgemm_head.project(rows, packed)
    assert got.dtype == torch.float32
    # 8-bit rows: an error of a few hundredths of the largest logit, as w8a8_int8's oneDNN kernel makes.
    w8a8 = quantized.linear(rows, *quantized.pack(q, torch.float32, CPU, activations=True), None)
    error, reference = (got - exact).abs().max(), (w8a8 - exact).abs().max()
    assert error <= 2 * reference and error < 0.02 * exact.abs().max(), (error, reference)


def test_only_int4s_int8_head_is_packed_so(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from server.runtimes.llama import LlamaDecoder
    from tests.support.hf_models import save

    path = save("qwen2", tmp_path)
    config = transformers.AutoConfig.from_pretrained(path)
    for mode, packed in (("int4", True), ("w8a8_int8", False), ("int8", False), ("none", False)):
        model = LlamaDecoder(path, config, dtype=torch.bfloat16, device=CPU, quantization=mode)
        assert (model.packed_head is not None) is packed, mode
        assert (model.lm_head[0].numel() == 0) is packed, mode
