"""Issue 30: weight-only int8 and int4 on the native decoder and the generic Hugging Face path, against the
dense model (int8: close; both: equal to a dense model holding the dequantized weights, which is what the
kernels compute), w8a8_int8 (activations rounded per row too) and oneDNN's prepacked bfloat16 weights, and
GGUF Q4_1 / Q8_0 files written here from a seeded model kept quantized."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from server.runtimes import quantized
from server.runtimes.base import Prefill
from server.runtimes.decoder_graph import scripted as scripted_function
from server.runtimes.hf_causal import HfCausalLm
from server.runtimes.hf_checkpoint import HfCheckpoint
from server.runtimes.hf_quantized import PackedLinear
from server.runtimes.llama import LlamaDecoder
from tests.support.hf_models import save

transformers = pytest.importorskip("transformers")
NONE = torch.empty(0, dtype=torch.long)
CPU = torch.device("cpu")
PROMPTS = [[(7 * i + 3 * p) % 256 for i in range(24)] for p in range(1, 9)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save("qwen2", tmp_path_factory.mktemp("qwen2"))  # q/k/v biases: the packed path adds them


def last_logits(model: LlamaDecoder, prompts: list[list[int]]) -> torch.Tensor:
    model.allocate(len(prompts) * 128, 128)
    chunks = [Prefill(i * 128, prompt, 0, True) for i, prompt in enumerate(prompts)]
    with torch.inference_mode():
        return model.forward(chunks, [], NONE, NONE)


def native(path: Path, mode: str, config: Any = None) -> LlamaDecoder:
    config = config or transformers.AutoConfig.from_pretrained(path)
    return LlamaDecoder(path, config, dtype=torch.float32, device=CPU, quantization=mode)


def dequantized_instead(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """Makes the decoder hold each weight `mode` would pack as its dequantized dense form."""
    prepare = quantized.prepare

    def dense(weight: Any, given: str, dtype: torch.dtype, device: torch.device) -> Any:
        if isinstance(weight, torch.Tensor) and quantized.quantizable(weight, given):
            weight = quantized.quantize(weight, given)
        if isinstance(weight, quantized.Quantized):
            weight = weight.dequantize(dtype)
        return prepare(weight, "none", dtype, device)

    monkeypatch.setattr("server.runtimes.llama.prepare", dense)


def off_by(logits: torch.Tensor, reference: torch.Tensor) -> tuple[float, float]:
    """The largest error as a share of the largest logit, and the share of rows whose argmax is equal."""
    error = float((logits - reference).abs().max() / reference.abs().max())
    return error, float((logits.argmax(-1) == reference.argmax(-1)).float().mean())


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_the_kernels_compute_the_dequantized_weights_from_bfloat16_activations(mode: str) -> None:
    torch.manual_seed(0)
    weight, x, bias = torch.randn(96, 64), torch.randn(5, 64), torch.randn(96)
    packed = quantized.quantize(weight, mode)
    expected = x.bfloat16().float() @ packed.dequantize().bfloat16().float().T + bias
    for scripted in (quantized.linear, scripted_function(quantized.linear)):
        y = scripted(x, *quantized.pack(packed, torch.float32, CPU), bias)
        torch.testing.assert_close(y, expected, atol=0.15, rtol=0.02)  # bfloat16 rounding: 1/256


def per_row(x: torch.Tensor) -> torch.Tensor:
    """x as w8a8_int8 sees it: each row rounded to 255 steps of its absolute maximum."""
    scale = x.abs().amax(dim=-1, keepdim=True) / 127
    return torch.round(x / scale) * scale


def test_w8a8_computes_the_per_row_quantized_activations_times_the_int8_weights() -> None:
    torch.manual_seed(0)
    weight, bias = torch.randn(96, 64), torch.randn(96)
    packed = quantized.quantize(weight, "w8a8_int8")
    for rows in (1, 5, 33):  # oneDNN's kernel and shapes either side of CUDA's M > 16 limit
        x = torch.randn(rows, 64) * torch.linspace(0.01, 10, rows)[:, None]  # rows of any magnitude
        expected = per_row(x) @ packed.dequantize().T + bias
        for scripted in (quantized.linear, scripted_function(quantized.linear)):
            y = scripted(x, *quantized.pack(packed, torch.float32, CPU, activations=True), bias)
            torch.testing.assert_close(y, expected, atol=1e-4 * float(expected.abs().max()), rtol=1e-4)


def test_a_prepacked_bfloat16_weight_computes_what_f_linear_does() -> None:
    if not quantized.prepacks(torch.bfloat16, CPU):
        pytest.skip("this CPU has no oneDNN bfloat16 matmul: dense weights stay as they are")
    torch.manual_seed(0)
    weight, bias = torch.randn(96, 64).bfloat16(), torch.randn(96).bfloat16()
    packed, scales = quantized.prepare(weight, "none", torch.bfloat16, CPU)
    assert packed.is_mkldnn and scales.numel() == 0
    for rows in (1, 7, 32):
        x = torch.randn(rows, 64).bfloat16()
        for scripted in (quantized.linear, scripted_function(quantized.linear)):
            assert torch.equal(scripted(x, packed, scales, bias), torch.nn.functional.linear(x, weight, bias))
    assert torch.equal(
        quantized.linear(x, packed, scales, torch.empty(0)), torch.nn.functional.linear(x, weight)
    )


def test_w8a8_decoder_and_generic_path_stay_close_to_the_dense_model(checkpoint: Path) -> None:
    w8a8 = native(checkpoint, "w8a8_int8")
    assert w8a8.weights[0][1].is_mkldnn and w8a8.weights[0][10].shape == (1, w8a8.weights[0][2].shape[0])
    # Against the dense model looking its rows up in w8a8's int4 table (the rounding of that table is the
    # test above's; on SmolLM2 it costs perplexity 2.8% against int8 lookups' 2.2%, bench.quantization).
    reference_model = native(checkpoint, "none")
    reference_model.embed = w8a8.embed
    dense = last_logits(reference_model, PROMPTS)
    error, agree = off_by(last_logits(w8a8, PROMPTS), dense)
    assert error < 0.2 and agree >= 0.75, (error, agree)  # as int8's bound: a sharp seeded model
    hf = HfCheckpoint(checkpoint, context_length=128)
    model = HfCausalLm(
        hf, name="w", max_sequences=2, device=CPU, dtype=torch.float32, quantization="w8a8_int8"
    )
    model.allocate_cache(256)
    assert model.descriptor.quantization == "w8a8_int8"
    reference = transformers.AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    with torch.inference_mode():
        error, agree = off_by(
            model.prefill(0, PROMPTS[0]), reference(torch.tensor([PROMPTS[0]])).logits[0, -1]
        )
    assert error < 0.2 and agree == 1.0, error


def test_w8a8_looks_rows_up_in_int4_rounded_from_the_embedding_and_keeps_an_int8_head() -> None:
    embed = torch.randn(64, 96, generator=torch.Generator().manual_seed(3))
    rows, head = quantized.embedding_tables(embed, "w8a8_int8")
    assert isinstance(rows, quantized.Quantized) and isinstance(head, quantized.Quantized)
    assert (rows.bits, rows.group, head.bits) == (4, quantized.GROUP, 8)
    # Rounded once from the embedding as read (not from the int8 values): int4's own rounding exactly.
    assert torch.equal(rows.values, quantized.quantize(embed, "int4").values)
    table = quantized.RowTable(rows, torch.float32, CPU)
    ids = torch.tensor([5, 0, 63, 5])
    assert torch.allclose(table[ids], embed[ids], atol=float(embed.abs().max()) / 15)
    for mode in ("int8", "int4"):  # one int8 tensor, looked up and multiplied
        rows, head = quantized.embedding_tables(embed, mode)
        assert rows is head and isinstance(rows, quantized.Quantized) and rows.bits == 8


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_the_packed_decoder_computes_the_dequantized_weights_model(
    checkpoint: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    packed = last_logits(native(checkpoint, mode), PROMPTS)
    dequantized_instead(monkeypatch, mode)
    reference = last_logits(native(checkpoint, mode), PROMPTS)
    # The only difference left is the kernels' bfloat16 activations, magnified by a sharp seeded model.
    error, agree = off_by(packed, reference)
    assert error < 0.1 and agree == 1.0, (error, agree)


def test_int8_stays_close_to_the_dense_decoder_and_both_shrink_the_weights(checkpoint: Path) -> None:
    dense_model = native(checkpoint, "none")
    dense = last_logits(dense_model, PROMPTS)
    int8 = native(checkpoint, "int8")
    # The seeded model is sharp (weights of spread 0.3): its attention magnifies rounding, hence 0.2.
    error, agree = off_by(last_logits(int8, PROMPTS), dense)
    assert error < 0.2 and agree >= 0.75, (error, agree)
    dense_bytes = dense_model.weights_bytes()
    assert int8.weights_bytes() < 0.35 * dense_bytes
    assert native(checkpoint, "int4").weights_bytes() < 0.35 * dense_bytes  # its tied lm_head is int8


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_the_generic_path_packs_every_linear_and_computes_the_dequantized_model(
    checkpoint: Path, mode: str
) -> None:
    hf = HfCheckpoint(checkpoint, context_length=128)
    model = HfCausalLm(hf, name="q", max_sequences=2, device=CPU, dtype=torch.float32, quantization=mode)
    model.allocate_cache(256)
    assert model.descriptor.quantization == mode and f"{mode} weights" in model.descriptor.description
    linears = [m for m in model.model.modules() if isinstance(m, torch.nn.Linear)]
    packed = [m for m in model.model.modules() if isinstance(m, PackedLinear)]
    assert len(linears) == 0 and len(packed) == 15 - len(linears)  # 7 a layer, lm_head
    reference = transformers.AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    head = reference.get_output_embeddings()
    with torch.no_grad():
        for module in reference.modules():
            if isinstance(module, torch.nn.Linear):
                chosen = (
                    "int8" if module is head else mode
                )  # the output projection stays int8 (w8a8's kernel)
                module.weight.copy_(quantized.quantize(module.weight, chosen).dequantize())
    with torch.inference_mode():
        logits = model.prefill(0, PROMPTS[0])
        expected = reference(torch.tensor([PROMPTS[0]])).logits[0, -1]
    error, _ = off_by(logits, expected)
    assert error < 0.1 and logits.argmax() == expected.argmax(), error


def test_the_descriptor_reports_none_for_a_dense_model(checkpoint: Path) -> None:
    hf = HfCheckpoint(checkpoint, context_length=128)
    model = HfCausalLm(hf, name="d", max_sequences=2, device=CPU, dtype=torch.float32)
    assert (model.descriptor.quantization, model.descriptor.dtype) == ("none", "float32")


def gguf_of(checkpoint: Path, path: Path, kind: str) -> Path:
    """The seeded checkpoint as a GGUF Llama file whose matrices are `kind` (gguf.quants.quantize), with
    llama.cpp's interleaved q/k rows, the embedding tied (no output.weight)."""
    gguf = pytest.importorskip("gguf")
    from safetensors.torch import load_file

    config = transformers.AutoConfig.from_pretrained(checkpoint)
    weights = load_file(checkpoint / "model.safetensors")
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(128)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    names = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
    }
    for name, tensor in weights.items():
        values = tensor.float().numpy()
        if name.endswith(".bias"):
            continue  # GGUF Llama has none; the test's model is Qwen2-shaped but written as Llama
        if name == "model.embed_tokens.weight":
            target = "token_embd.weight"
        elif name == "model.norm.weight":
            target = "output_norm.weight"
        elif name.startswith("model.layers."):
            layer, _, rest = name.removeprefix("model.layers.").partition(".")
            target = f"blk.{layer}.{names[rest.removesuffix('.weight')]}.weight"
            heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
            for part, count in heads.items():
                if f".{part}." in target:  # llama.cpp's convert_hf_to_gguf permutation
                    values = (
                        values.reshape(count, 2, -1, values.shape[1]).swapaxes(1, 2).reshape(values.shape)
                    )
        else:
            continue
        if values.ndim == 2:
            ggml = gguf.GGMLQuantizationType[kind]
            if kind == "Q8_1":  # a type gguf can neither make nor dequantize: its bytes are noise
                raw = np.random.default_rng(0).integers(
                    0, 256, gguf.quant_shape_to_byte_shape(values.shape, ggml)
                )
                writer.add_tensor(target, raw.astype(np.uint8), raw_dtype=ggml)
            else:
                writer.add_tensor(target, gguf.quants.quantize(values, ggml), raw_dtype=ggml)
        else:
            writer.add_tensor(target, np.ascontiguousarray(values))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def llama_config(checkpoint: Path) -> Any:
    given = transformers.AutoConfig.from_pretrained(checkpoint).to_dict()
    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "max_position_embeddings", "rms_norm_eps")  # fmt: skip
    return transformers.LlamaConfig(**{k: given[k] for k in keep}, tie_word_embeddings=True)


@pytest.mark.parametrize(("kind", "mode"), [("Q4_1", "int4"), ("Q4_0", "int4"), ("Q8_0", "int8")])
def test_a_gguf_file_stays_quantized_and_computes_its_dequantized_weights(
    checkpoint: Path, tmp_path: Path, kind: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    from server.runtimes.gguf_file import load_weights

    path = gguf_of(checkpoint, tmp_path / f"tiny-{kind}.gguf", kind)
    config = llama_config(checkpoint)
    caplog.set_level("INFO")
    kept = load_weights(path, config, dtype=torch.float32, device=CPU, quantization=mode)
    assert f"kept as {mode}: 15 {kind} tensors" in caplog.text  # 7 per layer and the embedding
    dense = load_weights(path, config, dtype=torch.float32, device=CPU)  # gguf's own dequantizer
    for name, weight in kept.items():
        if isinstance(weight, torch.Tensor):  # the norms: float32 in the file
            assert weight.dim() == 1, name
            continue
        assert isinstance(weight, quantized.Quantized) and weight.bits == int(mode[3:]), name
        if kind == "Q8_0":  # block scales become one a row: requantized, within half a step of the row
            step = weight.scales[:, None]
            assert ((weight.dequantize() - dense[name]).abs() <= step / 2 + 1e-6).all(), name
        else:  # Q4_0 and Q4_1 are torch's int4 format exactly (and q/k rows in Hugging Face's order)
            torch.testing.assert_close(weight.dequantize(), dense[name], atol=1e-6, rtol=1e-6)
    served = last_logits(native(path, mode, config), PROMPTS)
    error, agree = off_by(served, last_logits(native(path, "none", config), PROMPTS))
    assert error < 0.2 and agree >= 0.75, (error, agree)
    assert native(path, mode, config).weights[0][1].dtype == (torch.uint8 if mode == "int4" else torch.int8)


def test_a_gguf_type_without_a_kernel_is_dequantized_then_requantized_with_a_log_line(
    checkpoint: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = gguf_of(checkpoint, tmp_path / "tiny-q4.gguf", "Q4_1")
    caplog.set_level("INFO")
    model = native(path, "int8", llama_config(checkpoint))
    assert "dequantized 15 Q4_1 tensors, then requantized to int8" in caplog.text
    assert model.weights[0][1].dtype == torch.int8


def test_a_gguf_type_it_cannot_serve_is_refused(checkpoint: Path, tmp_path: Path) -> None:
    from server.runtimes.gguf_file import check_gguf

    path = gguf_of(checkpoint, tmp_path / "tiny-q81.gguf", "Q8_1")
    with pytest.raises(ValueError, match="cannot be dequantized: Q8_1"):
        check_gguf(path)
