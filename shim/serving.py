"""How the shim process serves: its logging (bounded), its descriptor budget and the connection cap
derived from it, the listening socket, and the uvicorn server running create_app() on uvloop with the
shim's connection protocol (shim.connections, on httptools). shim.workers runs serve() in several
processes."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import ssl
from collections.abc import Callable
from typing import Any

import uvicorn
import uvloop

from process.limits import RESERVED_FDS, raise_fd_limit
from process.log_limits import install_repeat_filter
from shim.app import create_app
from shim.config import ShimSettings
from shim.connections import ConnectionLimits, protocol_class

logger = logging.getLogger("shim")

# asyncio accepts up to `backlog` connections per wake-up, and each keeps its descriptor for three loop
# iterations before the pool can have closed it or another one (accepted; admitted, the longest-idle one
# closed; closed). Three bursts in flight (96) and the process's own few dozen descriptors fit well in the
# reserve kept beyond the cap, so accept() never meets EMFILE.
ACCEPT_BURST = RESERVED_FDS // 8
# asyncio also listens with `backlog`; the kernel's queue of connections not yet accepted holds no
# descriptor of ours, so it is made as long as the kernel allows (net.core.somaxconn; listen() caps a
# larger value) once serving: a burst of connections waits there instead of having its SYNs dropped (a
# second's retry each), and a connection flood takes longer to fill it while the loop is busy.
LISTEN_QUEUE = 65535


def configure_logging() -> None:
    """One stderr handler for every logger (uvicorn's and asyncio's propagate to it), behind a filter
    that lets a few records of a kind through per minute: a repeated failure cannot fill the disk."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logger.setLevel(logging.INFO)
    install_repeat_filter()


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening socket, bound here so that `--port 0` can report the port the kernel chose.

    Created with IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on accepted sockets whose protocol
    says TCP, and without it Nagle's algorithm and delayed ACKs add ~40 ms to a small response.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(LISTEN_QUEUE)
    sock.set_inheritable(True)
    return sock


def server_config(app: Any, settings: ShimSettings, *, max_connections: int) -> uvicorn.Config:
    """uvicorn's configuration for `app`: the shim's connection protocol, and no logging setup of its own."""
    limits = ConnectionLimits(
        max_connections=max_connections,
        header_timeout_s=settings.header_timeout_s,
        body_timeout_s=settings.body_timeout_s,
        idle_timeout_s=settings.idle_timeout_s,
    )
    return uvicorn.Config(
        app,
        http=protocol_class(limits),
        lifespan="on",
        log_config=None,
        log_level="warning",
        access_log=False,
        backlog=ACCEPT_BURST,
        # The protocol closes idle connections itself; uvicorn's own timer is a backstop.
        timeout_keep_alive=math.ceil(settings.idle_timeout_s),
        timeout_graceful_shutdown=math.ceil(settings.graceful_shutdown_s),
        ssl_certfile=settings.tls_cert,
        ssl_keyfile=settings.tls_key,
    )


def listening_line(settings: ShimSettings, port: int) -> str:
    """The line launchers and tests wait for."""
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    scheme = "https" if settings.tls_cert else "http"
    return f"sluice shim listening on {scheme}://{host}:{port} (upstream {settings.upstream})"


class AnnouncingServer(uvicorn.Server):
    """Calls `on_started` once uvicorn has started (a lone shim prints the listening line; a worker tells
    its supervisor)."""

    def __init__(self, config: uvicorn.Config, *, on_started: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_started = on_started
        self._reloading: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        for sock in sockets or ():
            sock.listen(LISTEN_QUEUE)  # asyncio listened with the accept burst
        if self.started:
            if self.config.ssl is not None and self.config.ssl_certfile and self.config.ssl_keyfile:
                reload = CertReload(
                    self.config.ssl, str(self.config.ssl_certfile), str(self.config.ssl_keyfile)
                )
                self._reloading = asyncio.get_running_loop().create_task(reload.run())
            self._on_started()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._reloading is not None:
            self._reloading.cancel()
        await super().shutdown(sockets)


class CertReload:
    """Reloads the HTTPS certificate into the live SSL context when its files change (checked every
    second): new connections get the new certificate, open ones keep theirs, nothing restarts. A pair that
    does not load (a half-written rotation) is skipped until it does."""

    def __init__(self, context: ssl.SSLContext, cert: str, key: str) -> None:
        self.context, self.cert, self.key = context, cert, key
        self.stamp = self._stamp()

    def _stamp(self) -> tuple[tuple[int, int], ...]:
        stats = [os.stat(self.cert), os.stat(self.key)]
        return tuple((s.st_mtime_ns, s.st_size) for s in stats)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                stamp = self._stamp()
                if stamp == self.stamp:
                    continue
                self.context.load_cert_chain(self.cert, self.key)
                logger.info("HTTPS certificate reloaded from %s", self.cert)
            except (OSError, ssl.SSLError) as exc:
                logger.warning("HTTPS certificate files changed but do not load (%s); keeping the old", exc)
            self.stamp = stamp


def serve(settings: ShimSettings, sock: socket.socket, *, on_started: Callable[[], None]) -> None:
    """Serves HTTP on the bound `sock` in this process until SIGINT or SIGTERM."""
    budget = raise_fd_limit()
    max_connections = budget.connection_cap(settings.max_connections)
    logger.info("%s; holding at most %d HTTP connections", budget.describe(), max_connections)
    config = server_config(create_app(settings), settings, max_connections=max_connections)
    server = AnnouncingServer(config, on_started=on_started)
    # uvloop's event loop and transports take ~0.3 ms less CPU per proxied request than asyncio's.
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(server.serve(sockets=[sock]))


def run(settings: ShimSettings) -> int:
    """One shim process serving until SIGINT or SIGTERM; returns the exit code."""
    configure_logging()
    sock = bind_socket(settings.host, settings.port)
    line = listening_line(settings, int(sock.getsockname()[1]))
    try:
        serve(settings, sock, on_started=lambda: print(line, flush=True))
    finally:
        sock.close()
    return 0
