"""LoRA adapters in PEFT's saved format (adapter_config.json + adapter_model.safetensors), read, checked and
laid out for the native decoder's fused projections (decoder_graph.LayerStack): each adapter's rows take
x @ A @ B added to the base projection (lora_stack.py stacks a step's adapters), so sequences of several
adapters and of the base model decode in one step, with no merge into the weights.

An adapter's tensors are its own (never written into shared slots; a step's stacks are copies): a request
holds the adapter it was resolved to, so an unload never pulls weights from under a running sequence, and a
load builds a new object beside the running steps (it never blocks them)."""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from server.runtimes.lora_limits import AdapterError as AdapterError  # raised here, caught by the server
from server.runtimes.lora_limits import LoraLimits as LoraLimits  # read_adapter's, for its callers

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
#: The decoder's fused projections, in decoder_graph's order: each takes (A [in, r], B [r, out]) per layer.
PROJECTIONS = ("qkv", "out", "gate_up", "down")
_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)\.lora_([AB])\.weight$")
_UIDS = itertools.count(1)


class Layout(Protocol):
    """The module names of one decoder layer (architectures.Architecture is one)."""

    @property
    def attention(self) -> tuple[str, ...]: ...
    @property
    def attention_out(self) -> str: ...
    @property
    def mlp(self) -> tuple[str, str]: ...
    @property
    def mlp_out(self) -> str: ...


@dataclass(frozen=True, slots=True, eq=False)
class LoraAdapter:
    """One loaded adapter: per layer, (A, B) of each fused projection (empty where it adapts none of its
    parts), B already scaled by alpha / r. `uid` is unique per load: the prefix cache keys on it, so a
    reload under the same name never reads keys and values the former weights wrote."""

    name: str
    path: str
    rank: int
    targets: tuple[str, ...]
    layers: list[list[torch.Tensor]]  # per layer: [A_qkv, B_qkv, A_out, B_out, A_gate_up, B_gate_up, ...]
    uid: int = field(default_factory=lambda: next(_UIDS))
    # The generic path's instead (lora_hf.py): (A [in, r], B [r, out]) by the model's module name.
    modules: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def nbytes(self) -> int:
        tensors = [t for layer in self.layers for t in layer] + [
            t for pair in self.modules.values() for t in pair
        ]
        return sum(t.numel() * t.element_size() for t in tensors)


def read_adapter(
    name: str, path: Path, layout: Layout, shapes: Mapping[str, tuple[int, int]], layers: int,
    limits: LoraLimits, *, dtype: torch.dtype, device: torch.device,
) -> LoraAdapter:  # fmt: skip
    """The adapter at `path` for a decoder of `layers` layers of `layout`, whose modules take and give
    `shapes` (module name -> (in, out) features); AdapterError naming the file, the rank or the target
    modules it cannot serve."""
    config = config_of(path)
    weights = weights_of(path)
    modules = {
        "qkv": layout.attention, "out": (layout.attention_out,), "gate_up": layout.mlp,
        "down": (layout.mlp_out,),
    }  # fmt: skip
    servable = {m for parts in modules.values() for m in parts}
    _check_targets(config.get("target_modules"), servable, path)
    found: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in weights.items():
        match = _KEY.search(key)
        if match is None:
            raise AdapterError(f"{path / WEIGHTS_FILE}: tensor {key!r} is no decoder layer's LoRA A or B")
        layer, module, which = int(match[1]), match[2], match[3]
        if module not in servable:
            raise AdapterError(
                f"{path / CONFIG_FILE}: target module {module!r} cannot be served; the native decoder adapts "
                f"{sorted(servable)}"
            )
        if layer >= layers:
            raise AdapterError(f"{path / WEIGHTS_FILE}: {key!r} names layer {layer}; the model has {layers}")
        found.setdefault((layer, module), {})[which] = tensor
    rank = max((pair["A"].shape[0] for pair in found.values() if "A" in pair), default=0)
    if rank == 0:
        raise AdapterError(f"{path / WEIGHTS_FILE}: no LoRA weights")
    if rank > limits.max_rank:
        raise AdapterError(f"{path / CONFIG_FILE}: rank {rank} is over --max-lora-rank {limits.max_rank}")
    alpha, rslora = float(config.get("lora_alpha", 8)), bool(config.get("use_rslora", False))
    per_layer: list[list[torch.Tensor]] = []
    for layer in range(layers):
        row: list[torch.Tensor] = []
        for projection in PROJECTIONS:
            parts = []
            for module in modules[projection]:
                pair = found.get((layer, module))
                if pair is not None:
                    if set(pair) != {"A", "B"} or (
                        (pair["A"].shape[1], pair["B"].shape[0]) != shapes[module]
                        or pair["A"].shape[0] != pair["B"].shape[1]
                    ):
                        raise AdapterError(
                            f"{path / WEIGHTS_FILE}: layer {layer} {module}: lora_A and lora_B do not fit "
                            f"the model's {shapes[module][0]} -> {shapes[module][1]} projection"
                        )
                    r = pair["A"].shape[0]
                    scale = alpha / math.sqrt(r) if rslora else alpha / r
                    parts.append((pair["A"].float().t(), (pair["B"].float() * scale).t(), module))
            widths = {m: shapes[m][1] for m in modules[projection]}
            row += _fused(parts, modules[projection], widths, dtype, device)
        per_layer.append(row)
    targets = tuple(sorted({module for _, module in found}))
    return LoraAdapter(name, str(path), rank, targets, per_layer)


def _check_targets(targets: object, servable: set[str], path: Path) -> None:
    """The config's target modules, where it lists them, are projections the decoder adapts."""
    if not isinstance(targets, list):
        return  # a regular expression, or absent: the weights' own names are checked one by one
    for target in targets:
        if not any(m == target or m.endswith(f".{target}") for m in servable):
            raise AdapterError(
                f"{path / CONFIG_FILE}: target module {str(target)!r} cannot be served; the native decoder "
                f"adapts {sorted(m.rpartition('.')[2] for m in servable)}"
            )


def _fused(
    parts: list[tuple[torch.Tensor, torch.Tensor, str]],
    modules: tuple[str, ...],
    widths: dict[str, int],
    dtype: torch.dtype,
    device: torch.device,
) -> list[torch.Tensor]:
    """(A, B) of one fused projection: the parts' A side by side, their B block-diagonal (a part the adapter
    leaves alone is a zero block of its output width), so one x @ A @ B adapts each part by its own."""
    if not parts:
        empty = torch.empty(0, dtype=dtype, device=device)
        return [empty, empty]
    a = torch.cat([p[0] for p in parts], dim=1)
    b = torch.zeros(a.shape[1], sum(widths[m] for m in modules))
    offsets = dict(zip(modules, itertools.accumulate((widths[m] for m in modules), initial=0), strict=False))
    row = 0
    for a_part, b_part, module in parts:
        r = a_part.shape[1]
        b[row : row + r, offsets[module] : offsets[module] + b_part.shape[1]] = b_part
        row += r
    return [a.to(dtype=dtype, device=device).contiguous(), b.to(dtype=dtype, device=device).contiguous()]


def config_of(path: Path) -> dict[str, Any]:
    file = path / CONFIG_FILE
    if not file.is_file():
        raise AdapterError(
            f"{file}: not found (a PEFT adapter directory holds {CONFIG_FILE} and {WEIGHTS_FILE})"
        )
    try:
        config = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterError(f"{file}: not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{file}: not a JSON object")
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise AdapterError(f"{file}: peft_type {config.get('peft_type')!r} is not LORA")
    for key, why in (("use_dora", "DoRA"), ("alpha_pattern", "per-module alpha"), ("modules_to_save", "")):
        if config.get(key):
            raise AdapterError(f"{file}: {key} ({why or 'full modules'}) is not supported")
    if config.get("bias", "none") != "none":
        raise AdapterError(f"{file}: bias {config['bias']!r} is not supported (only 'none')")
    return config


def weights_of(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    file = path / WEIGHTS_FILE
    if not file.is_file():
        raise AdapterError(f"{file}: not found")
    try:
        return load_file(file)
    except (SafetensorError, OSError) as exc:
        raise AdapterError(f"{file}: not a safetensors file ({exc})") from None


class RowAdapter(Protocol):
    """A step row's extras as this module reads them (server/batching/extras.RequestExtras)."""

    @property
    def adapter(self) -> LoraAdapter | None: ...
