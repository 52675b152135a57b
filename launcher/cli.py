"""The `sluice` command: `serve` (the gRPC server), `shim` (the HTTP/SSE shim), `up` (both), `--version`."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

USAGE = """usage: sluice {up,serve,shim} [flags]   (sluice COMMAND --help lists the flags of each)

  up      the server and the shim, serving what serve would: --models, else the --hf-models,
          else the embedded models
  serve   the gRPC server alone
  shim    the HTTP/SSE shim alone, in front of --upstream HOST:PORT"""


def _version() -> str:
    try:
        return version("sluice")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "--version":
        print(f"sluice {_version()}")
        return 0
    if command == "serve":
        from server.serve import main as serve

        return serve(rest)
    if command == "shim":
        from shim.__main__ import main as shim

        return shim(rest)
    if command == "up":
        from launcher.up import main as up

        return up(rest)
    print(f"sluice: unknown command {command!r}; use up, serve or shim (sluice --help)", file=sys.stderr)
    return 2
