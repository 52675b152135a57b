"""The flags of model options that were server settings before each model declared its own (issue 18),
--lm-size and --mlp-width: they still parse, into the --model-options entry they stand for, with a warning
that names it (`sluice serve` and `sluice up` alike; 0.1.0's factories read them as settings fields)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from process.flags import flag_name

FORMER_FLAGS: Mapping[str, str] = {"lm_size": "byte-lm.size", "mlp_width": "mlp.width"}


def add_former_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--lm-size and --mlp-width, absent from the namespace unless given (from_namespace translates them)."""
    for dest, option in FORMER_FLAGS.items():
        parser.add_argument(
            flag_name(dest),
            dest=dest,
            default=argparse.SUPPRESS,
            metavar="VALUE",
            help=f"deprecated: --model-options {option}=VALUE",
        )


def former_options(given: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The --model-options entries that FORMER_FLAGS in `given` (dest -> value) stand for, and for each a
    warning line naming it; a --model-options for the same key, put after these, wins."""
    used = [(dest, f"{option}={given[dest]}") for dest, option in FORMER_FLAGS.items() if dest in given]
    warnings = tuple(f"{flag_name(dest)} is deprecated; use --model-options {entry}" for dest, entry in used)
    return tuple(entry for _, entry in used), warnings
