"""LoRA adapters on the generic Hugging Face path (hf_causal.HfCausalLm): a PEFT adapter's A and B by the
model's own module names, and forward hooks on those modules that add each row's x @ A @ B to the module's
output for the rows of that adapter (the batched delta, grouped by adapter; nothing merged into the
weights). The hooks are installed with the first adapter; before it the model runs untouched."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from server.runtimes.lora import CONFIG_FILE, WEIGHTS_FILE, LoraAdapter, config_of, weights_of
from server.runtimes.lora_limits import AdapterError, LoraLimits

_PREFIX = "base_model.model."


def read_hf_adapter(
    name: str,
    path: Path,
    model: torch.nn.Module,
    limits: LoraLimits,
    *,
    dtype: torch.dtype,
    device: torch.device,
) -> LoraAdapter:
    """The adapter at `path` over `model`'s modules (Linear, or GPT-2's Conv1D); AdapterError naming the
    file, the rank or a module the model lacks or whose shape differs."""
    config = config_of(path)
    modules = dict(model.named_modules())
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in weights_of(path).items():
        stem, _, which = key.removeprefix(_PREFIX).rpartition(".lora_")
        if which not in ("A.weight", "B.weight") or stem not in modules:
            raise AdapterError(
                f"{path / WEIGHTS_FILE}: tensor {key!r} is no LoRA A or B of this model's modules"
            )
        pairs.setdefault(stem, {})[which[0]] = tensor
    if not pairs:
        raise AdapterError(f"{path / WEIGHTS_FILE}: no LoRA weights")
    rank = max(pair["A"].shape[0] for pair in pairs.values() if "A" in pair)
    if rank > limits.max_rank:
        raise AdapterError(f"{path / CONFIG_FILE}: rank {rank} is over --max-lora-rank {limits.max_rank}")
    alpha, rslora = float(config.get("lora_alpha", 8)), bool(config.get("use_rslora", False))
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for stem, pair in pairs.items():
        fan_in, fan_out = _shape(modules[stem], stem, path)
        a, b = pair.get("A"), pair.get("B")
        if (
            a is None
            or b is None
            or a.shape[1] != fan_in
            or b.shape[0] != fan_out
            or a.shape[0] != b.shape[1]
        ):
            raise AdapterError(
                f"{path / WEIGHTS_FILE}: {stem}: lora_A and lora_B do not fit its {fan_in} -> {fan_out} "
                "projection"
            )
        r = a.shape[0]
        scale = alpha / math.sqrt(r) if rslora else alpha / r
        out[stem] = (
            a.float().t().to(dtype=dtype, device=device).contiguous(),
            (b.float() * scale).t().to(dtype=dtype, device=device).contiguous(),
        )
    targets = tuple(sorted({stem.rpartition(".")[2] for stem in out}))
    return LoraAdapter(name, str(path), rank, targets, [], modules=out)


def _shape(module: torch.nn.Module, stem: str, path: Path) -> tuple[int, int]:
    if isinstance(module, torch.nn.Linear):
        return module.in_features, module.out_features
    if type(module).__name__ == "Conv1D":  # GPT-2's: weight [in, out]
        weight: Any = module.weight
        return int(weight.shape[0]), int(weight.shape[1])
    raise AdapterError(
        f"{path / CONFIG_FILE}: target module {stem!r} ({type(module).__name__}) cannot be served"
    )


class LoraHooks:
    """The rows of the model call in progress, by adapter (None: the base model), read by every hook."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.rows: Sequence[LoraAdapter | None] = ()
        self.adapted: set[str] = set()  # the modules some row's adapter adapts: the others return at once
        for stem, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D":
                module.register_forward_hook(self._hook(stem))

    def _hook(self, stem: str) -> Any:
        def add(
            module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor
        ) -> torch.Tensor | None:
            if stem not in self.adapted:
                return None
            rows, x = self.rows, inputs[0]
            for adapter in {id(r): r for r in rows if r is not None and stem in r.modules}.values():
                a, b = adapter.modules[stem]
                picked = [i for i, r in enumerate(rows) if r is adapter]
                index = torch.tensor(picked, device=output.device)
                output = output.index_add(0, index, torch.matmul(torch.matmul(x[index], a), b))
            return output

        return add

    def set(self, rows: Sequence[LoraAdapter | None]) -> None:
        """The next model call's rows (its batch dimension), each with its adapter or None."""
        self.rows = rows
        self.adapted = {stem for r in rows if r is not None for stem in r.modules}
