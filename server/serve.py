"""The server process: flags -> Settings -> checked models -> SluiceServer, until SIGTERM or SIGINT.

Every configuration mistake (a mistyped flag, a bad value, an unknown model, a plugin that does not import, an
unreadable --hf-models directory or TLS file, a busy port) is one line on stderr naming the setting and its
fix, exit 2, with nothing left listening.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from process.flags import FlagError
from process.log_limits import install_repeat_filter
from server.admission.tenants import Keys
from server.config import Settings, from_namespace, parser
from server.runtimes.registry import check_models, log_deprecations

PROG = "sluice serve"


def settings_from(argv: Sequence[str], prog: str = PROG) -> Settings:
    """Parsed, validated Settings with their models checked; raises FlagError or ValueError."""
    settings = from_namespace(parser(prog).parse_args(argv), prog=prog)
    if settings.tls is not None:
        settings.tls.check()
    if settings.auth_keys is not None:
        Keys.load(Path(settings.auth_keys))  # a mistake in the file stops the server before it listens
    check_models(settings)
    return settings


def main(argv: Sequence[str]) -> int:
    try:
        settings = settings_from(argv)
    except (FlagError, ValueError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # A failure that repeats every few milliseconds (a probe at the descriptor limit) logs a few lines a
    # minute, not megabytes.
    install_repeat_filter()
    log_deprecations()
    return asyncio.run(_serve(settings))


async def _serve(settings: Settings) -> int:
    from server.app import SluiceServer  # torch and grpc load only once the flags are known to be good

    try:
        server = SluiceServer(settings)
        await server.listen()
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loading = asyncio.create_task(server.load())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if loading.done():
        loading.result()
        await stopping
    else:
        loading.cancel()
    await server.drain()
    print("sluice server stopped", flush=True)
    return 1 if server.failed else 0
