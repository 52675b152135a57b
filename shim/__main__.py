"""Command line -> ShimSettings -> uvicorn serving create_app() on a socket bound here, so that
`--port 0` can report the port the kernel chose."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import Sequence

import uvicorn

from shim.app import create_app
from shim.config import ShimSettings


class AnnouncingServer(uvicorn.Server):
    """Prints the listening line once uvicorn has started; launchers and tests wait for it."""

    def __init__(self, config: uvicorn.Config, *, settings: ShimSettings, port: int) -> None:
        super().__init__(config)
        self._settings = settings
        self._port = port

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            host = f"[{self._settings.host}]" if ":" in self._settings.host else self._settings.host
            print(
                f"sluice shim listening on http://{host}:{self._port} (upstream {self._settings.upstream})",
                flush=True,
            )


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = ShimSettings.from_args(argv)
    except ValueError as exc:
        print(f"sluice shim: {exc}", file=sys.stderr)
        return 2
    sock = bind_socket(settings.host, settings.port)
    port = int(sock.getsockname()[1])
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=int(settings.graceful_shutdown_s),
    )
    server = AnnouncingServer(config, settings=settings, port=port)
    try:
        asyncio.run(server.serve(sockets=[sock]))
    finally:
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
