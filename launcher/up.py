"""`sluice up`: the server and the shim as two supervised children on one machine.

The server's flags are checked here first (a mistake is one line and exit 2, before anything starts); both
children die with this process, even if it is killed; SIGINT and SIGTERM handlers of its own stop both, so a
job started with SIGINT ignored (any background job of a script) still stops on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from launcher.children import Child, ChildFailed
from launcher.services import START_TIMEOUT_S, ServerChild, ShimChild
from process.flags import FlagError, FlagParser, add_flags
from server.config import Settings
from server.serve import settings_from

PROG = "sluice up"
STOP_GRACE_S = 60.0  # above the server's default --grace-s, so a drain is never cut short


class _Stopped(Exception):
    """SIGINT or SIGTERM arrived."""


def _own_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--grpc-port", type=int, default=50051, help="gRPC port; 0 picks a free one (default: 50051)"
    )
    parser.add_argument(
        "--http-port", type=int, default=8000, help="HTTP port; 0 picks a free one (default: 8000)"
    )
    parser.add_argument(
        "--shim-workers",
        type=int,
        default=1,
        help="shim processes serving the HTTP port (see sluice shim --workers) (default: 1)",
    )


def parser() -> FlagParser:
    out = FlagParser(
        prog=PROG,
        description="Run the Sluice server and the HTTP/SSE shim in front of it. Every flag but "
        "--grpc-port, --http-port and --shim-workers is the server's (see sluice serve) and is forwarded to "
        "it; the shim listens on --host too.",
    )
    _own_flags(out)
    add_flags(out, Settings, skip=("port",))
    return out


def main(argv: Sequence[str]) -> int:
    try:
        parser().parse_args(argv)  # --help, and every mistyped flag, before anything starts
        own = argparse.ArgumentParser(add_help=False)
        _own_flags(own)
        ports, server_flags = own.parse_known_args(argv)
        settings = settings_from(["--port", str(ports.grpc_port), *server_flags], prog=PROG)
    except (FlagError, ValueError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    if ports.shim_workers < 1:
        print(f"{PROG}: --shim-workers must be at least 1, got {ports.shim_workers}", file=sys.stderr)
        return 2
    return _supervise(settings, ports, server_flags)


def _raise_stopped(signum: int, _frame: FrameType | None) -> None:
    raise _Stopped(signal.Signals(signum).name)


def _relay(line: str) -> None:
    print(line, flush=True)


def _supervise(settings: Settings, ports: argparse.Namespace, server_flags: Sequence[str]) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _raise_stopped)
    children: list[Child] = []
    stopped = False
    try:
        server = ServerChild(
            ["--port", str(settings.port), *server_flags], relay=_relay, die_with_parent=True
        )
        children.append(server)
        server.wait_listening(START_TIMEOUT_S)
        server.wait_ready()
        upstream = f"{settings.host}:{server.port}"
        shim_flags = ["--upstream", upstream, "--host", settings.host, "--port", str(ports.http_port)]
        shim_flags += ["--workers", str(ports.shim_workers)]
        shim = ShimChild(shim_flags, relay=_relay, die_with_parent=True)
        children.append(shim)
        shim.wait_listening(START_TIMEOUT_S)
        print(f"sluice up: gRPC on {upstream}, HTTP on {shim.url}; Ctrl-C stops both", flush=True)
        # Until either child exits (not reaped here: Popen collects its status) or a signal raises _Stopped.
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
        print(f"{PROG}: a child exited on its own; stopping the other", file=sys.stderr, flush=True)
    except _Stopped:
        stopped = True
    except ChildFailed as exc:
        print(f"{PROG}: {exc}", file=sys.stderr, flush=True)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C must not cut the drain short
            signal.signal(sig, signal.SIG_IGN)
        codes = [child.stop(STOP_GRACE_S) for child in reversed(children)]
    clean = all(code in (0, -signal.SIGTERM) for code in codes)
    return 0 if stopped and clean else 1
