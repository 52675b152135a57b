"""GGUF files as Hugging Face checkpoints: finding the one file a --hf-models path names, checking at start-up
that its architecture and tensor types can be served (from the header alone, before the port is bound), and
its weights dequantized per tensor (numpy, vectorised, by the gguf package) under the names the native
decoder reads. The config, tokenizer and chat template come from the same file through transformers."""

from __future__ import annotations

import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

# The GGUF architectures the native decoder runs (a Mistral file says "llama"); transformers reads more,
# but the generic path cannot serve a GGUF file, so any other is refused at start-up by name.
SERVED_ARCHITECTURES = ("llama", "qwen2")
_MAGIC = b"GGUF"
# GGUF value types: their struct formats (8 is a string, 9 an array; neither has a fixed size).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
# GGUF tensor names -> Hugging Face Llama/Qwen2 names (blk.N. -> model.layers.N.).
_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def gguf_file(path: Path) -> Path | None:
    """The GGUF file a --hf-models path names: the path itself when it ends in .gguf, else the one .gguf file
    in that directory; None for a save_pretrained directory (no .gguf in it). ValueError where a directory
    holds several, since which one is meant cannot be guessed."""
    if path.suffix == ".gguf":
        return path
    found = sorted(path.glob("*.gguf")) if path.is_dir() else []
    if len(found) > 1:
        names = ", ".join(f.name for f in found)
        raise ValueError(f"{path} holds {len(found)} GGUF files ({names}); name one: NAME={found[0]}")
    return found[0] if found else None


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order: GGUF lists the fastest-moving dimension first
    kind: int  # a GGMLQuantizationType value
    offset: int  # from the start of the data section


@dataclass(frozen=True)
class GgufHeader:
    """What the start-up check and the weight loader need: no tokenizer arrays are kept, only skipped."""

    architecture: str
    data_offset: int
    tensors: tuple[TensorInfo, ...]


def read_header(path: Path) -> GgufHeader:
    """The header of a GGUF file (version 2 or 3); ValueError where it is not one. Reads only metadata."""
    with path.open("rb") as f:
        if f.read(4) != _MAGIC:
            raise ValueError(f"{path} is not a GGUF file (no GGUF magic number)")
        version, tensor_count, field_count = struct.unpack("<IQQ", f.read(20))
        if version not in (2, 3):
            raise ValueError(f"{path} is GGUF version {version}; versions 2 and 3 are read")
        fields: dict[str, Any] = {}
        for _ in range(field_count):
            key = _string(f)
            kind = _unpack(f, "I")
            if key in ("general.architecture", "general.alignment"):
                fields[key] = _value(f, kind)
            else:
                _skip(f, kind)
        tensors = []
        for _ in range(tensor_count):
            name = _string(f)
            dims = _dims(f)
            kind, offset = struct.unpack("<IQ", f.read(12))
            tensors.append(TensorInfo(name, tuple(reversed(dims)), kind, offset))
        alignment = int(fields.get("general.alignment", 32))
        data_offset = -(-f.tell() // alignment) * alignment
    return GgufHeader(str(fields.get("general.architecture", "")), data_offset, tuple(tensors))


def check_gguf(path: Path) -> GgufHeader:
    """ValueError naming what cannot be served: an architecture the native decoder lacks, or tensor types
    the gguf package cannot dequantize (each type once, with a tensor that has it)."""
    from gguf import GGMLQuantizationType

    header = read_header(path)
    if header.architecture not in SERVED_ARCHITECTURES:
        raise ValueError(
            f"{path} holds architecture {header.architecture!r}; GGUF files are served for "
            f"{', '.join(SERVED_ARCHITECTURES)}"
        )
    lacking: dict[str, str] = {}
    for tensor in header.tensors:
        if not _dequantizable(tensor.kind):
            known = tensor.kind in GGMLQuantizationType._value2member_map_
            kind = GGMLQuantizationType(tensor.kind).name if known else f"type {tensor.kind}"
            lacking.setdefault(kind, tensor.name)
    if lacking:
        found = ", ".join(f"{kind} (tensor {name})" for kind, name in lacking.items())
        raise ValueError(f"{path} holds quantization types that cannot be dequantized: {found}")
    return header


def read_config(path: Path) -> Any:
    """The transformers config of a served architecture, as AutoConfig.from_pretrained(gguf_file=...) builds
    it (GGUF_CONFIG_MAPPING renames the keys), from transformers' fast metadata reader, which skips the
    vocabulary: AutoConfig's own path for Llama and Qwen2 parses every token of the file (10 s of SmolLM2's
    start on a loaded 2-core machine). A file that llama.cpp names "mistral" takes that path, which renames
    the architecture."""
    from transformers import CONFIG_MAPPING, AutoConfig
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
    from transformers.integrations.gguf.reader import read_gguf_metadata

    metadata, tensors = read_gguf_metadata(str(path))
    architecture = str(metadata["general.architecture"])
    if architecture not in SERVED_ARCHITECTURES or metadata.get("general.name") == "mistral":
        return AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    config: dict[str, Any] = {"tie_word_embeddings": "output.weight" not in tensors}
    for key, value in metadata.items():
        prefix, _, rest = key.partition(".")
        if prefix in ("general", architecture, "tokenizer"):
            renames: dict[str, Any] = GGUF_CONFIG_MAPPING[prefix]  # type: ignore[assignment]
            renamed = renames.get(rest)
            if renamed is not None and renamed != -1:
                config[renamed] = value
    if "vocab_size" not in config and "tokenizer.ggml.tokens" in metadata:
        config["vocab_size"] = metadata["tokenizer.ggml.tokens"]  # the reader counts a skipped array
    return CONFIG_MAPPING[config["model_type"]].from_dict(config)


def load_weights(
    path: Path, config: Any, *, dtype: torch.dtype, device: torch.device, quantization: str = "none"
) -> dict[str, Any]:
    """Every tensor under its Hugging Face name: as quantized.Quantized where its type maps onto
    `quantization` (gguf_quant.py), else dequantized to `dtype`. The file is mapped, not read: each tensor is
    converted from its bytes in place, so peak memory is one tensor in float32 beside the result."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize
    from gguf.quants import quant_shape_to_byte_shape as byte_shape

    from server.runtimes.gguf_quant import from_blocks, kept_form, log_conversions

    header = check_gguf(path)
    weights: dict[str, Any] = {}
    kept: Counter[str] = Counter()
    dense: Counter[str] = Counter()
    data = np.memmap(path, dtype=np.uint8, mode="r")  # unmapped when the last view of it goes
    for tensor in header.tensors:
        name = _hf_name(tensor.name)
        if name is None:  # rope_freqs and the like: the config already says what they say
            continue
        kind = GGMLQuantizationType(tensor.kind)
        shape = byte_shape(tensor.shape, kind)
        start = header.data_offset + tensor.offset
        raw = data[start : start + int(np.prod(shape))].reshape(shape)
        heads = None
        if header.architecture == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = int(config.num_attention_heads if "q_proj" in name else config.num_key_value_heads)
        if kept_form(kind.name, tensor.shape, quantization):
            kept[kind.name] += 1
            quantized = from_blocks(raw, kind.name, tensor.shape)
            if heads is not None:
                order = _unpermute(np.arange(tensor.shape[0]), heads)
                quantized = quantized.rows(torch.from_numpy(order.copy()))
            weights[name] = quantized
            continue
        dense[kind.name] += 1
        values = dequantize(raw, kind).reshape(tensor.shape)
        if heads is not None:
            values = _unpermute(values, heads)
        weights[name] = torch.from_numpy(np.array(values, dtype=np.float32)).to(device=device, dtype=dtype)
    log_conversions(path.name, kept, dense, quantization)
    return weights


def _unpermute(weights: np.ndarray, heads: int) -> np.ndarray:
    """Undoes llama.cpp's conversion, which interleaves each head's rotary halves of q and k."""
    half = weights.shape[0] // heads // 2
    return weights.reshape(heads, half, 2, *weights.shape[1:]).swapaxes(2, 1).reshape(weights.shape)


def _hf_name(name: str) -> str | None:
    base, _, suffix = name.rpartition(".")
    if base in _GLOBAL:
        return f"{_GLOBAL[base]}.{suffix}"
    block, _, rest = base.partition(".")
    layer, _, part = rest.partition(".")
    if block == "blk" and layer.isdigit() and part in _LAYER:
        return f"model.layers.{layer}.{_LAYER[part]}.{suffix}"
    return None


def _dequantizable(kind: int) -> bool:
    from gguf import GGMLQuantizationType
    from gguf.quants import _type_traits  # the types with a numpy dequantizer; no public list exists

    return kind in (GGMLQuantizationType.F32, GGMLQuantizationType.F16) or kind in _type_traits


def _unpack(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(f"<{fmt}")
    return struct.unpack(f"<{fmt}", f.read(size))[0]


def _string(f: BinaryIO) -> str:
    return f.read(_unpack(f, "Q")).decode("utf-8", errors="replace")


def _dims(f: BinaryIO) -> tuple[int, ...]:
    count = _unpack(f, "I")
    return tuple(struct.unpack(f"<{count}Q", f.read(8 * count)))


def _value(f: BinaryIO, kind: int) -> Any:
    if kind == _STRING:
        return _string(f)
    if kind in _SCALARS:
        return _unpack(f, _SCALARS[kind])
    raise ValueError(f"GGUF value type {kind} where a scalar was expected")


def _skip(f: BinaryIO, kind: int) -> None:
    if kind == _STRING:
        f.seek(_unpack(f, "Q"), 1)
    elif kind in _SCALARS:
        f.seek(struct.calcsize(f"<{_SCALARS[kind]}"), 1)
    elif kind == _ARRAY:
        inner, count = struct.unpack("<IQ", f.read(12))
        if inner in _SCALARS:
            f.seek(count * struct.calcsize(f"<{_SCALARS[inner]}"), 1)
        else:  # strings (a tokenizer's 49k pieces) or nested arrays: each has its own length
            for _ in range(count):
                _skip(f, inner)
    else:
        raise ValueError(f"unknown GGUF value type {kind}")
