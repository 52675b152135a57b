"""The `sluice` command: `serve` (gRPC server), `shim` (HTTP/SSE shim), `up` (both, on the defaults)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence

from server.config import Settings, add_arguments, from_namespace


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print("usage: sluice {up,serve,shim} [flags]   (sluice COMMAND --help for flags)")
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "serve":
        return serve(rest)
    if command == "shim":
        from shim.__main__ import main as shim_main

        return shim_main(rest)
    if command == "up":
        return up(rest)
    print(f"sluice: unknown command {command!r}; use up, serve or shim", file=sys.stderr)
    return 2


def serve(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="sluice serve", description="Run the Sluice gRPC server.")
    add_arguments(parser)
    parser.add_argument("--log-level", default="INFO")
    ns = parser.parse_args(argv)
    logging.basicConfig(level=ns.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = from_namespace(ns)
    except ValueError as exc:
        print(f"sluice serve: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_serve(settings))


async def _serve(settings: Settings) -> int:
    from server.app import SluiceServer

    try:
        server = SluiceServer(settings)
    except ValueError as exc:
        print(f"sluice serve: {exc}", file=sys.stderr)
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    starting = asyncio.create_task(server.start())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if starting.done():
        starting.result()
        await stopping
    else:
        starting.cancel()
    await server.drain()
    print("sluice server stopped", flush=True)
    return 0


def up(argv: Sequence[str]) -> int:
    """Starts server and shim as two processes; Ctrl-C (or SIGTERM) stops both cleanly."""
    parser = argparse.ArgumentParser(
        prog="sluice up", description="Run server and shim on the embedded models."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--grpc-port", type=int, default=50051)
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--models", default="mlp,byte-lm")
    ns, extra = parser.parse_known_args(argv)
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "server",
            "--host",
            ns.host,
            "--port",
            str(ns.grpc_port),
            "--models",
            ns.models,
            *extra,
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    children = [server]
    pumps: list[threading.Thread] = []
    try:
        grpc_port = _relay_until(server, r"listening on [^:]+:(\d+)")
        _relay_until(server, r"sluice server ready")
        shim = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "shim",
                "--upstream",
                f"{ns.host}:{grpc_port}",
                "--host",
                ns.host,
                "--port",
                str(ns.http_port),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        children.append(shim)
        _relay_until(shim, r"listening on")
        pumps += [threading.Thread(target=_pump, args=(child,), daemon=True) for child in children]
        for pump in pumps:
            pump.start()
        print(
            f"sluice up: gRPC on {ns.host}:{grpc_port}, HTTP on the shim above; Ctrl-C stops both", flush=True
        )
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        while all(child.poll() is None for child in children):
            try:
                children[0].wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                continue
    except KeyboardInterrupt:
        pass
    finally:
        for child in reversed(children):
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        codes = [child.wait(timeout=30) for child in reversed(children)]
        for pump in pumps:
            pump.join(timeout=5)
    return 0 if all(code in (0, -signal.SIGTERM) for code in codes) else 1


def _pump(child: subprocess.Popen[str]) -> None:
    """Relays the rest of a child's stdout once it is up."""
    if child.stdout is not None:
        for line in child.stdout:
            print(line, end="", flush=True)


def _relay_until(child: subprocess.Popen[str], pattern: str) -> str:
    """Copies the child's stdout to ours until a line matches; returns the first group (or the line)."""
    assert child.stdout is not None
    for line in child.stdout:
        print(line, end="", flush=True)
        match = re.search(pattern, line)
        if match:
            return match.group(1) if match.groups() else line
    raise RuntimeError(f"the process exited before printing /{pattern}/ (exit code {child.wait()})")
