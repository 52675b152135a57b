"""`python -m shim` (and `sluice shim`): command line -> ShimSettings -> shim.serving.run()."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from shim.config import ShimSettings
from shim.serving import run
from shim.workers import supervise


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = ShimSettings.from_args(argv)
    except ValueError as exc:
        print(f"sluice shim: {exc}", file=sys.stderr)
        return 2
    return supervise(settings) if settings.workers > 1 else run(settings)


if __name__ == "__main__":
    sys.exit(main())
