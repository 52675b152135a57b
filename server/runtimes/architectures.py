"""The native decoder's table of architectures: how each model type it serves differs from Llama's, as data
(the MLP's activation, the norm's weight offset, the embedding scale, which projections are fused into one
matrix, a sliding window, the configurations it declines). A new Llama-like family is one `ARCHITECTURES`
entry; a checkpoint whose model type has none runs on the generic Hugging Face path (hf_causal.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: The activations the scripted layer stack (decoder_graph.py) runs, by the names configs give them; each
#: maps to the stack's own name, which picks its gate function once, when the stack is scripted.
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh"}


def _accepts_all(config: Any) -> str | None:
    return None


def _qwen2_declines(config: Any) -> str | None:
    return "Qwen2's per-layer sliding windows" if getattr(config, "use_sliding_window", False) else None


@dataclass(frozen=True, slots=True, kw_only=True)
class Architecture:
    """One model type as the native decoder runs it; the defaults are Llama's."""

    activation: str = "silu"  # the MLP gate's activation where the config names none (a key of ACTIVATIONS)
    norm_offset: float = 0.0  # added to every RMSNorm weight once, at load (Gemma scales by 1 + weight)
    embedding_scale: bool = False  # embeddings multiplied by sqrt(hidden_size), in the model's dtype (Gemma)
    # Fused into one matrix, in this order (q, k, v).
    attention: tuple[str, ...] = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
    attention_out: str = "self_attn.o_proj"
    mlp: tuple[str, str] = ("mlp.gate_proj", "mlp.up_proj")  # gate then up, fused into one matrix
    mlp_out: str = "mlp.down_proj"
    norms: tuple[str, str] = ("input_layernorm", "post_attention_layernorm")  # before attention, before MLP
    sliding_window: bool = False  # config.sliding_window bounds every layer's attention (Mistral)
    declines: Callable[[Any], str | None] = _accepts_all  # why a configuration of this type cannot run

    def activation_of(self, config: Any) -> str | None:
        """The stack's activation for this config (None: one the stack does not run)."""
        named = getattr(config, "hidden_act", None) or getattr(config, "hidden_activation", None)
        return ACTIVATIONS.get(named or self.activation)

    def window_of(self, config: Any) -> int | None:
        window = getattr(config, "sliding_window", None) if self.sliding_window else None
        return int(window) if window else None


ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture(),
    "mistral": Architecture(sliding_window=True),
    "qwen2": Architecture(declines=_qwen2_declines),
}


def architecture_of(config: Any) -> Architecture | str:
    """The table's entry for this config, or why the native decoder cannot run it."""
    found = ARCHITECTURES.get(config.model_type)
    if found is None:
        return f"model type {config.model_type!r} is not one of {sorted(ARCHITECTURES)}"
    rope = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope in ("dynamic", "longrope"):
        return f"rope type {rope!r} depends on the sequence length"
    declined = found.declines(config)
    if declined is not None:
        return declined
    if found.activation_of(config) is None:
        named = getattr(config, "hidden_act", None) or getattr(config, "hidden_activation", None)
        return f"activation {named!r}"
    return found
