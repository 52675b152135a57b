"""Which models a server serves, from --models and --hf-models: the one rule `sluice serve` and `sluice up`
share (both build the server's Settings, whose served_models asks here), and the text their --help shows.

The rule, as a vLLM or Triton user expects: naming Hugging Face models serves those, not the embedded
models beside them; naming models with --models serves exactly those; naming neither serves the embedded
models (a first run has something to call).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

EMBEDDED_MODELS = ("mlp", "byte-lm", "all-minilm-l6-v2")

# The --models flag's help in `sluice serve --help` and `sluice up --help` alike (up's flags are generated
# from the same Settings field).
MODELS_HELP = (
    "models to serve, comma-separated: embedded, registered by a plugin, or named in --hf-models; left out "
    "or empty (--models ''): only the --hf-models, or the embedded models when no --hf-models is given"
)
MODELS_SHOWN = "the --hf-models, else mlp,byte-lm,all-minilm-l6-v2"


def check_hf_models(hf_models: Sequence[str]) -> None:
    """Raises ValueError unless every --hf-models entry is NAME=DIRECTORY (readable is checked at start-up,
    with the registry: server/runtimes/registry.py's check_models)."""
    if not all(name and directory for name, _, directory in (entry.partition("=") for entry in hf_models)):
        raise ValueError("invalid setting hf_models: each entry is NAME=DIRECTORY")


def hf_directories(hf_models: Sequence[str]) -> dict[str, str]:
    """--hf-models entries (NAME=DIR) as NAME -> DIR."""
    return {name: directory for name, _, directory in (entry.partition("=") for entry in hf_models)}


def served_models(models: Sequence[str] | None, hf: Mapping[str, str]) -> tuple[str, ...]:
    """What is served, in order: the --models named (embedded, plugin or --hf-models names) when any are,
    each once; else, --models left out or given empty, the --hf-models; else the embedded models.

    An empty --models once meant nothing and was refused; it is read as "none named" (as left out) so that
    `--hf-models smol=DIR --models ''`, which a user writes to say "not the embedded ones", serves smol alone.
    """
    if models:
        return tuple(dict.fromkeys(models))  # a name given twice is loaded once, not twice in memory
    return tuple(hf) or EMBEDDED_MODELS
