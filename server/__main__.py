"""`python -m server [flags]`: the gRPC server alone (what `sluice serve` runs)."""

from __future__ import annotations

import sys

from server.serve import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
