"""`sluice up`: the server and the shim as two supervised children on one machine.

Every flag goes to the process it belongs to (launcher/up_flags.py); both children's settings are checked
here first (a mistake is one line and exit 2, before anything starts); both children die with this process,
even if it is killed; SIGINT and SIGTERM handlers of its own stop both, so a job started with SIGINT ignored
(any background job of a script) still stops on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from launcher.children import Child, ChildFailed
from launcher.services import START_TIMEOUT_S, ServerChild, ShimChild
from launcher.up_flags import UpArgv, shim_flags_named, split
from process.flags import FlagError
from server.config import Settings
from server.serve import settings_from
from shim.config import ShimSettings

PROG = "sluice up"
STOP_GRACE_S = 60.0  # above both children's default drain times, so a drain is never cut short
STOP_MARGIN_S = 10.0  # beyond a drain time set longer than that: the time to exit after it


class _Stopped(Exception):
    """SIGINT or SIGTERM arrived."""


def main(argv: Sequence[str]) -> int:
    try:
        lines = split(argv, prog=PROG)  # --help, and every mistyped flag, before anything starts
        for line in lines.warnings:
            print(f"{PROG}: warning: {line}", file=sys.stderr)
        settings = settings_from(lines.server, prog=PROG)
    except (FlagError, ValueError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    try:
        shim = ShimSettings.from_args(lines.shim)  # its --upstream is known once the server listens
    except ValueError as exc:
        named = shim_flags_named(str(exc))
        print(f"{PROG}: shim: {exc}" + (f" ({', '.join(named)} here)" if named else ""), file=sys.stderr)
        return 2
    return _supervise(settings, shim, lines)


def dial_address(host: str, port: int) -> str:
    """Where the shim reaches a server bound to `host`: a wildcard is dialled on loopback (a certificate
    names 127.0.0.1 or localhost, never 0.0.0.0), an IPv6 literal in brackets."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]:{port}"
    except ValueError:
        pass  # a host name
    return f"{host}:{port}"


def _raise_stopped(signum: int, _frame: FrameType | None) -> None:
    raise _Stopped(signal.Signals(signum).name)


def _relay(line: str) -> None:
    print(line, flush=True)


def _supervise(settings: Settings, shim_settings: ShimSettings, argv: UpArgv) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _raise_stopped)
    children: list[tuple[Child, float]] = []  # each with the time its drain may take
    stopped = False
    try:
        server = ServerChild(argv.server, relay=_relay, die_with_parent=True)
        children.append((server, max(STOP_GRACE_S, settings.grace_s + STOP_MARGIN_S)))
        server.wait_listening(START_TIMEOUT_S)
        # The shim starts while the server loads its models (its imports take seconds of their own); its
        # /readyz asks the server's health, NOT_SERVING until every model is loaded and warmed up.
        upstream = dial_address(settings.host, server.port)
        shim = ShimChild(["--upstream", upstream, *argv.shim], relay=_relay, die_with_parent=True)
        children.append((shim, max(STOP_GRACE_S, shim_settings.graceful_shutdown_s + STOP_MARGIN_S)))
        shim.wait_listening(START_TIMEOUT_S)
        server.wait_ready()
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
        codes = [child.stop(grace) for child, grace in reversed(children)]
    clean = all(code in (0, -signal.SIGTERM) for code in codes)
    return 0 if stopped and clean else 1
