"""Issue 38, acceptance 1: a GGUF file the server cannot serve (an architecture the native decoder lacks, a
quantization type the gguf package cannot dequantize) or a directory holding several is refused at start,
in one line that names it, before the port is bound. The files are written here with the gguf package from
a seeded tiny Llama; nothing is downloaded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.processes import ROOT

gguf = pytest.importorskip("gguf")

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, VOCAB = 32, 64, 1, 2, 1, 300


def tiny_llama(path: Path, *, architecture: str = "llama", quantized: str | None = None) -> Path:
    """A seeded one-layer Llama as GGUF; `quantized` writes the attention's q weight in that type."""
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(LAYERS)
    writer.add_context_length(128)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    kv_width = HIDDEN // HEADS * KV_HEADS
    shapes = {
        "token_embd.weight": (VOCAB, HIDDEN),
        "output_norm.weight": (HIDDEN,),
        "blk.0.attn_norm.weight": (HIDDEN,),
        "blk.0.attn_q.weight": (HIDDEN, HIDDEN),
        "blk.0.attn_k.weight": (kv_width, HIDDEN),
        "blk.0.attn_v.weight": (kv_width, HIDDEN),
        "blk.0.attn_output.weight": (HIDDEN, HIDDEN),
        "blk.0.ffn_norm.weight": (HIDDEN,),
        "blk.0.ffn_gate.weight": (FFN, HIDDEN),
        "blk.0.ffn_up.weight": (FFN, HIDDEN),
        "blk.0.ffn_down.weight": (HIDDEN, FFN),
    }
    for name, shape in shapes.items():
        values = rng.normal(0.0, 0.3, shape).astype(np.float32)
        if quantized and name == "blk.0.attn_q.weight":
            kind = gguf.GGMLQuantizationType[quantized]
            raw = rng.integers(0, 256, gguf.quant_shape_to_byte_shape(shape, kind), dtype=np.uint8)
            writer.add_tensor(name, raw, raw_dtype=kind)
        else:
            writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "server", "--port", "0", "--metrics-port", "-1", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


def refused_with(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "listening" not in result.stdout, result.stdout
    return lines[0]


def test_an_architecture_the_decoder_lacks_is_refused_at_start_by_name(tmp_path: Path) -> None:
    path = tiny_llama(tmp_path / "tiny.gguf", architecture="rwkv7")
    line = refused_with(serve("--hf-models", f"tiny={path}"))
    assert f"invalid setting hf_models: tiny={path}" in line and "architecture 'rwkv7'" in line, line


def test_a_quantization_type_it_cannot_dequantize_is_refused_at_start_by_name(tmp_path: Path) -> None:
    tiny_llama(tmp_path / "tiny.gguf", quantized="Q8_1")  # found as the one .gguf in the directory
    line = refused_with(serve("--hf-models", f"tiny={tmp_path}"))
    assert "cannot be dequantized: Q8_1 (tensor blk.0.attn_q.weight)" in line, line


def test_a_directory_with_several_gguf_files_is_refused_naming_them(tmp_path: Path) -> None:
    tiny_llama(tmp_path / "a.gguf")
    tiny_llama(tmp_path / "b.gguf")
    line = refused_with(serve("--hf-models", f"tiny={tmp_path}"))
    assert "holds 2 GGUF files (a.gguf, b.gguf)" in line, line
