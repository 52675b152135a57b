"""LoraFlags: the LoRA adapters' flags of `sluice serve` (vLLM's names), one base of the flag table
(server/flag_table.py), checked here."""

from __future__ import annotations

from dataclasses import dataclass

from process.flags import setting
from server.admission.policy_context import PolicySettingsBase, check_setting
from server.model_selection import named_value
from server.runtimes.lora_limits import LoraLimits


@dataclass(frozen=True, kw_only=True)
class LoraFlags(PolicySettingsBase):
    lora_modules: tuple[str, ...] = setting(
        (),
        help="LoRA adapters as NAME=PATH (a PEFT directory: adapter_config.json, adapter_model.safetensors), "
        "each served as model NAME over the one generative model (docs/lora.md)",
    )
    max_loras: int = setting(
        4, help="LoRA adapters loaded at once (any of them may share a step)", unit="adapters"
    )
    max_lora_rank: int = setting(16, help="the highest LoRA rank an adapter may have")
    max_cpu_loras: int | None = setting(
        None,
        help="adapters kept in host memory; every loaded adapter stays on the device here, so it must be "
        ">= --max-loras",
        shown="--max-loras",
    )

    def __post_init__(self) -> None:
        check_setting(self.max_loras >= 1, "max_loras", "must be >= 1")
        check_setting(self.max_lora_rank >= 1, "max_lora_rank", "must be >= 1")
        check_setting(
            self.max_cpu_loras is None or self.max_cpu_loras >= self.max_loras, "max_cpu_loras",
            "must be >= --max-loras",
        )  # fmt: skip
        check_setting(
            len(self.lora_modules) <= self.max_loras,
            "lora_modules",
            f"more than --max-loras {self.max_loras}",
        )
        parse_lora_modules(self.lora_modules)
        super().__post_init__()

    @property
    def lora_limits(self) -> LoraLimits:
        return LoraLimits(max_rank=self.max_lora_rank, max_loras=self.max_loras)


def parse_lora_modules(entries: tuple[str, ...]) -> list[tuple[str, str]]:
    """--lora-modules NAME=PATH entries; ValueError naming the setting."""
    pairs = []
    for entry in entries:
        name, path = (part.strip() for part in named_value(entry) or ("", ""))
        check_setting(bool(name and path), "lora_modules", f"{entry!r} is not NAME=PATH")
        pairs.append((name, path))
    names = [n for n, _ in pairs]
    check_setting(len(set(names)) == len(names), "lora_modules", "adapter names repeat")
    return pairs
