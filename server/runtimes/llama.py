"""LlamaDecoder: the native decoder of Llama-like families (architectures.py's table: Llama, Mistral, Qwen2)
run over the server's KV arena.

It loads the checkpoint's safetensors itself, as TGI and vLLM do, and runs one flat batch per step: every
prefill chunk's tokens and every decoding row's one token go through the projections and the MLP together
(no padding), keys and values are written into the preallocated KV arena in place, and attention reads
that cache as views (step_attention.py): no cache is copied or concatenated per step.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from server.kv.tensors import KvTensors
from server.runtimes.architectures import Architecture, architecture_of
from server.runtimes.base import Prefill
from server.runtimes.decode_row import direct_group
from server.runtimes.decode_row import stack as row_stack
from server.runtimes.decoder_graph import compiled
from server.runtimes.fbgemm_head import packed_head, project
from server.runtimes.quantized import (
    RowTable,
    embedding_tables,
    fuse,
    head_mode,
    linear,
    nbytes,
    prepare,
)
from server.runtimes.step_attention import Heads, StepAttention


def unsupported(config: Any, path: Path) -> str | None:
    """Why this checkpoint cannot run natively (then the generic Hugging Face path serves it), or None."""
    found = architecture_of(config)
    if isinstance(found, str):
        return found
    if not _weight_files(path):
        return "no safetensors weights"
    return None


def _architecture(config: Any) -> Architecture:
    found = architecture_of(config)
    if isinstance(found, str):
        raise ValueError(f"the native decoder cannot run this checkpoint: {found}")
    return found


class LlamaDecoder:
    """Weights, rotary tables and the KV arena [layers, kv_heads, tokens, head_dim] of one model."""

    def __init__(
        self, path: Path, config: Any, *, dtype: torch.dtype, device: torch.device, quantization: str = "none"
    ) -> None:
        self.device, self.dtype, self.quantization = device, dtype, quantization
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.eps = float(config.rms_norm_eps)
        architecture = _architecture(config)
        self.activation = architecture.activation_of(config) or "silu"
        self.geometry = Heads(self.heads, self.kv_heads, self.head_dim, architecture.window_of(config))
        weights = _load(path, config, dtype=dtype, device=device, quantization=quantization)
        prefix = "model." if "model.embed_tokens.weight" in weights else ""
        embed = weights[f"{prefix}embed_tokens.weight"]
        # Quantized, the embedding is looked up by row and the output projection packed for the matmul (in
        # int8 under int4 too: quantized.head_mode); tied (no lm_head), both are made from one int8 tensor.
        rows, tied = embedding_tables(embed, quantization)
        head = weights.get("lm_head.weight", tied)
        self.embed = RowTable(rows, dtype, device)
        # int4's head (int8) is FBGEMM's on a CPU that allows it: 1-2 ms less a one-row step (fbgemm_head.py).
        self.packed_head, self._packed_head_bytes = packed_head(head, quantization, device)
        empty = (torch.empty(0, device=device), torch.empty(0, device=device))
        self.lm_head = (
            empty if self.packed_head is not None else prepare(head, head_mode(quantization), dtype, device)
        )
        # Gemma's scale is cast to the model's dtype before it multiplies, as its own forward does.
        scale = torch.tensor(float(config.hidden_size) ** 0.5, dtype=dtype)
        self.embedding_scale = scale.to(device) if architecture.embedding_scale else None
        self.norm = _norm(weights[f"{prefix}norm.weight"], architecture)
        # Per layer, in decoder_graph.LAYER_WEIGHTS order: one list the scripted stack walks.
        self.weights = [
            _layer(weights, f"{prefix}layers.{i}.", architecture, quantization, dtype, device)
            for i in range(int(config.num_hidden_layers))
        ]
        self._inv_freq, self._rope_scale = _rope(config)
        # A step of one decoding row takes decode_row.one_row (not with a sliding window: the general path's).
        self._one_row = architecture.window_of(config) is None
        self._direct_group = direct_group(self.weights, dtype)
        self._stack = compiled(self.activation, self.weights)
        self.kv = KvTensors(len(self.weights), self.kv_heads, self.head_dim, dtype=dtype, device=device)
        self.context_length = 0
        self._cos = self._sin = self._sin_signed = torch.empty(0, device=device)
        # one_row's scripted holder of the model's tensors and each layer's keys and values (views), made
        # again where the arena is.
        self._row_stack: tuple[torch.Tensor, Any] = (self._cos, None)

    def weights_bytes(self) -> int:
        """The resident bytes of the weights (packed ones as packed), for the start-up log and the bench."""
        table = self.embed.dense if self.embed.table is None else self.embed.table.values
        head = self.lm_head[0]  # a prepacked (oneDNN) head is its own copy: it has no data pointer
        shared = table is not None and not head.is_mkldnn and head.data_ptr() == table.data_ptr()
        layers = sum(nbytes(layer) for layer in self.weights)
        head_bytes = self._packed_head_bytes + (0 if shared else nbytes(self.lm_head))
        return self.embed.nbytes() + head_bytes + layers + nbytes([self.norm])

    def allocate(self, tokens: int, context_length: int) -> int:
        """The arena of `tokens` tokens, and rotary tables for positions up to `context_length`."""
        self.context_length = context_length
        positions = torch.arange(context_length, device=self.device, dtype=torch.float32)
        freqs = positions[:, None] * self._inv_freq.to(self.device)[None, :]
        angles = torch.cat([freqs, freqs], dim=-1)
        self._cos = (angles.cos() * self._rope_scale).to(self.dtype)
        self._sin = (angles.sin() * self._rope_scale).to(self.dtype)
        self._sin_signed = self._sin.clone()
        self._sin_signed[:, : self._sin.shape[1] // 2] *= -1
        return self.kv.allocate(tokens)

    def forward(
        self,
        prefills: Sequence[Prefill],
        bases: Sequence[int],
        tokens: torch.Tensor,
        positions: torch.Tensor,
        *,
        computing: Callable[[], None] = lambda: None,
        prefixes: Sequence[tuple[int, int]] = (),
        lora: tuple[list[list[list[torch.Tensor]]], list[torch.Tensor]] = ([], []),
    ) -> torch.Tensor:
        """One step over prefill chunks and decoding rows; logits [N, V] for the chunks that end their
        prompt, then for every decoding row. `computing` runs where the scripted stack starts
        (GenerativeModel.forward); `prefixes`, per decoding row, a prefix it attends apart; `lora`, the
        step's adapters and their token rows (lora.segments)."""
        # One row with no prefix held apart ((0, 0), as the scheduler passes every row without one).
        held = bool(prefixes) and prefixes[0][1] > 0
        if self._one_row and not prefills and len(bases) == 1 and not held and not lora[1]:
            return self._row(bases[0], tokens, int(positions[0]), computing)
        device = self.device
        decoded = torch.as_tensor(bases, dtype=torch.long, device=device) + positions
        if prefills:
            ids: list[int] = [t for p in prefills for t in p.token_ids]
            pos: list[int] = []
            for p in prefills:
                pos.extend(range(p.start, p.start + len(p.token_ids)))
            where = [p.base + at for p in prefills for at in range(p.start, p.start + len(p.token_ids))]
            flat_ids = torch.cat([torch.tensor(ids, dtype=torch.long, device=device), tokens])
            flat_pos = torch.cat([torch.tensor(pos, dtype=torch.long, device=device), positions])
            flat_token = torch.cat([torch.tensor(where, dtype=torch.long, device=device), decoded])
        else:  # decode only: three concatenations fewer (each a GIL round trip: server/batching/step.py)
            flat_ids, flat_pos, flat_token = tokens, positions, decoded
        arena = self.kv.k.shape[2]
        attention = StepAttention.plan(
            self.geometry, device, arena, prefills, bases, positions.tolist(), prefixes
        )
        cos, sin = self._cos[flat_pos][:, None, :], self._sin[flat_pos][:, None, :]
        embedded = self.embed[flat_ids]
        if self.embedding_scale is not None:
            embedded = embedded * self.embedding_scale
        computing()
        x = self._stack(
            embedded, cos, sin, flat_token, self.kv.k, self.kv.v,
            self.heads, self.kv_heads, self.head_dim, self.eps, *attention.graph_args(), *lora,
        )  # fmt: skip
        last = attention.last_rows()
        h = F.rms_norm(x[last], (x.shape[-1],), self.norm, self.eps)
        if self.packed_head is not None:
            return project(h, self.packed_head)
        logits: torch.Tensor = linear(h, self.lm_head[0], self.lm_head[1], None)
        return logits

    def _row(
        self, base: int, tokens: torch.Tensor, position: int, computing: Callable[[], None]
    ) -> torch.Tensor:
        """One decoding row's step (decode_row.py): the general path's logits, to the bit, with fewer ops."""
        embedded = self.embed[tokens]
        if self.embedding_scale is not None:
            embedded = embedded * self.embedding_scale
        if self._row_stack[0] is not self.kv.k:
            shape = (self.heads, self.kv_heads, self.head_dim, self.eps, self._direct_group, self.activation)
            layers = (list(self.kv.k.unbind(0)), list(self.kv.v.unbind(0)))
            held = row_stack(*layers, self.weights, shape, self.norm, self.lm_head, self.packed_head)
            self._row_stack = (self.kv.k, held)
        computing()
        logits: torch.Tensor = self._row_stack[1](
            embedded, self._cos[position : position + 1], self._sin_signed[position : position + 1],
            base + position, base, position + 1,
        )  # fmt: skip
        return logits


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def _rope(config: Any) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and attention scaling, as the model's own rotary embedding computes them."""
    parameters = getattr(config, "rope_parameters", None) or {}
    kind = parameters.get("rope_type", "default")
    if kind != "default":
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        inv_freq, scale = ROPE_INIT_FUNCTIONS[kind](config, torch.device("cpu"))
        return inv_freq.float(), float(scale)
    theta = float(parameters.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
    dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)), 1.0


def _norm(weight: torch.Tensor, architecture: Architecture) -> torch.Tensor:
    return weight + architecture.norm_offset if architecture.norm_offset else weight


def _layer(
    weights: dict[str, Any],
    prefix: str,
    architecture: Architecture,
    quantization: str,
    dtype: torch.dtype,
    device: torch.device,
) -> list[torch.Tensor]:
    def fused(names: tuple[str, ...], suffix: str) -> Any:
        parts = [weights.pop(f"{prefix}{name}.{suffix}", None) for name in names]
        if any(p is None for p in parts):
            return None
        return fuse([p for p in parts if p is not None])

    attn, mlp = architecture.attention, architecture.mlp
    qkv, gate_up = fused(attn, "weight"), fused(mlp, "weight")
    out_name, down_name = f"{prefix}{architecture.attention_out}", f"{prefix}{architecture.mlp_out}"
    out, down = weights.pop(f"{out_name}.weight", None), weights.pop(f"{down_name}.weight", None)
    attn_norm, mlp_norm = (f"{prefix}{norm}.weight" for norm in architecture.norms)
    if qkv is None or gate_up is None or out is None or down is None:
        raise ValueError(f"the checkpoint lacks the attention or MLP weights of {prefix.rstrip('.')}")

    def bias(found: torch.Tensor | None) -> torch.Tensor:
        if found is None:  # none: empty, which `linear` skips (LAYER_WEIGHTS are uniform lists)
            return torch.empty(0, device=device, dtype=dtype)
        return found.to(device=device, dtype=dtype)

    qkv_bias, out_bias = bias(fused(attn, "bias")), bias(weights.get(f"{out_name}.bias"))
    gate_up_bias, down_bias = bias(fused(mlp, "bias")), bias(weights.get(f"{down_name}.bias"))

    # Each projection is packed here, once its dense form (if any) is no longer held: peak memory stays one
    # layer's dense weights above the packed model.
    (qkv, qkv_scales), (out_w, out_scales), (gate_up_w, gate_up_scales), (down_w, down_scales) = (
        prepare(weight, quantization, dtype, device) for weight in (qkv, out, gate_up, down)
    )
    return [
        _norm(weights[attn_norm], architecture),
        qkv,
        qkv_bias,
        out_w,
        out_bias,
        _norm(weights[mlp_norm], architecture),
        gate_up_w,
        gate_up_bias,
        down_w,
        down_bias,
        qkv_scales,
        out_scales,
        gate_up_scales,
        down_scales,
    ]


def _weight_files(path: Path) -> list[Path]:
    if path.suffix == ".gguf":
        return [path]
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / shard for shard in shards]
    single = path / "model.safetensors"
    return [single] if single.is_file() else []


def _load(
    path: Path, config: Any, *, dtype: torch.dtype, device: torch.device, quantization: str
) -> dict[str, Any]:
    """Dense tensors by name; from a GGUF file, Quantized ones where its type maps onto `quantization`."""
    from safetensors.torch import load_file

    if path.suffix == ".gguf":
        from server.runtimes.gguf_file import load_weights

        return load_weights(path, config, dtype=dtype, device=device, quantization=quantization)
    weights: dict[str, torch.Tensor] = {}
    for file in _weight_files(path):
        for name, tensor in load_file(file).items():
            weights[name] = tensor.to(device=device, dtype=dtype)
    return weights
