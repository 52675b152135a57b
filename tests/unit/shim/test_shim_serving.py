"""serving.py: the listening socket gives accepted connections TCP_NODELAY, uvicorn runs the shim's own
connection protocol, and the process's logging lets a repeated failure through only a few times."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from shim.app import create_app
from shim.config import ShimSettings
from shim.connections import ShimProtocol
from shim.serving import ACCEPT_BURST, bind_socket, server_config
from tests.support.skips import hardware_mark, skip_for_hardware

REPO = Path(__file__).resolve().parents[3]


async def _server_side_nodelay(listener: socket.socket) -> int:
    """TCP_NODELAY as seen on the server's end of a connection accepted by asyncio from `listener`."""
    seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.set_result(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    server = await asyncio.start_server(on_client, sock=listener)
    async with server:
        host, port = listener.getsockname()[:2]
        _, writer = await asyncio.open_connection(host, port)
        try:
            return await asyncio.wait_for(seen, 10)
        finally:
            writer.close()


@pytest.mark.anyio
async def test_accepted_connections_have_tcp_nodelay() -> None:
    assert await _server_side_nodelay(bind_socket("127.0.0.1", 0)) != 0
    # Why the socket is made with IPPROTO_TCP: asyncio skips TCP_NODELAY for a listener made with 0.
    plain = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    plain.bind(("127.0.0.1", 0))
    plain.listen()
    assert await _server_side_nodelay(plain) == 0


@pytest.mark.anyio
@hardware_mark(not socket.has_ipv6, "no IPv6")
async def test_an_ipv6_listener_too() -> None:
    try:
        listener = bind_socket("::1", 0)
    except OSError:
        skip_for_hardware("no IPv6 loopback here")
    assert listener.family == socket.AF_INET6
    assert await _server_side_nodelay(listener) != 0


def test_uvicorn_runs_the_shims_protocol_with_its_limits() -> None:
    settings = ShimSettings(port=0, header_timeout_s=3, body_timeout_s=4, idle_timeout_s=1.5)
    config = server_config(create_app(settings), settings, max_connections=77)
    assert isinstance(config.http, type) and issubclass(config.http, ShimProtocol)
    assert (config.http.limits.header_timeout_s, config.http.limits.idle_timeout_s) == (3, 1.5)
    assert config.http.pool.cap == 77
    assert config.backlog == ACCEPT_BURST
    assert config.log_config is None  # the shim's own logging, with its repeat filter, stays in place


def test_a_failure_logged_in_a_loop_reaches_stderr_a_few_times_only() -> None:
    code = (
        "import logging\n"
        "from shim.serving import configure_logging\n"
        "configure_logging()\n"
        "for _ in range(5000):\n"
        "    logging.getLogger('asyncio').error('socket.accept() out of system resource')\n"
        "    logging.getLogger('uvicorn.error').warning('Invalid HTTP request received.')\n"
        "logging.getLogger('shim').info('start-up facts are shown')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "protos")])}
    command = [sys.executable, "-c", code]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert sum("out of system resource" in line for line in lines) == 5
    assert sum("Invalid HTTP request" in line for line in lines) == 5
    assert lines[-1].endswith("INFO shim: start-up facts are shown")
