"""Issue 7, item 3, from outside: connections that send headers and a trickle of body, half their headers,
or nothing at all cannot pin the shim. While they hold their sockets a bystander is served within its
normal latency and /readyz stays 200; then each of them is answered 408 (in the error shape) or closed."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.processes import ServerProcess, ShimProcess, start_shim

MAX_INFLIGHT = 4
HEADER_TIMEOUT_S = 1.5
BODY_TIMEOUT_S = 2.0
IDLE_TIMEOUT_S = 1.0
BYSTANDER = {
    "model": "mlp",
    "inputs": [{"name": "x", "dtype": "FLOAT32", "shape": [512], "data": [1.0] * 512}],
}
BODY = json.dumps(BYSTANDER).encode()
ERROR_KEYS = {"code", "message", "reason", "domain", "metadata", "field_violations", "retry_after_s"}
# A socket read that has not seen its answer by then has failed; every wait below ends well before.
READ_TIMEOUT_S = 10.0


@pytest.fixture
def guarded(server: ServerProcess) -> Iterator[ShimProcess]:
    shim = start_shim(
        server.target,
        f"--max-inflight={MAX_INFLIGHT}",
        f"--header-timeout-s={HEADER_TIMEOUT_S}",
        f"--body-timeout-s={BODY_TIMEOUT_S}",
        f"--idle-timeout-s={IDLE_TIMEOUT_S}",
    )
    try:
        yield shim
    finally:
        shim.terminate()


@pytest.fixture
def attack(guarded: ShimProcess) -> Iterator[Attack]:
    hostile = Attack(guarded.port)
    try:
        yield hostile
    finally:
        hostile.close()


class Attack:
    """Hostile sockets to the shim, and a trickle of bytes into some of them; all closed at the end."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sockets: list[socket.socket] = []

    def open(self, first_bytes: bytes = b"") -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=READ_TIMEOUT_S)
        self.sockets.append(sock)
        if first_bytes:
            sock.sendall(first_bytes)
        return sock

    def trickle(self, sockets: list[socket.socket], *, for_s: float) -> threading.Thread:
        """Sends one byte to each socket every 0.2 s for `for_s` seconds (a bounded loop), in a thread."""

        def run() -> None:
            ends = time.monotonic() + for_s
            while time.monotonic() < ends:
                for sock in sockets:
                    sock.sendall(b" ")
                time.sleep(0.2)  # the attacker's pace, not a wait for a condition

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    while len(body) < int(headers.get("content-length", "0")):
        chunk = sock.recv(65536)
        assert chunk, "closed inside a response body"
        body += chunk
    return int(status_line.split()[1]), headers, body


def closed_by_the_shim(sock: socket.socket) -> bool:
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True


def bystander(shim: ShimProcess) -> float:
    """One Infer through the shim on a new connection; returns its latency."""
    started = time.monotonic()
    response = httpx.post(f"{shim.url}/v1/infer", json=BYSTANDER, timeout=READ_TIMEOUT_S)
    assert response.status_code == 200, response.text
    return time.monotonic() - started


def normal_latency(shim: ShimProcess) -> float:
    """What a bystander may take while the attack goes on: its slowest unloaded call, with headroom."""
    return max(0.5, 5 * max(bystander(shim) for _ in range(5)))


def head(method: str, path: str, **headers: str) -> bytes:
    lines = [
        f"{method} {path} HTTP/1.1",
        "Host: shim",
        *(f"{k.replace('_', '-')}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@pytest.mark.serial  # compares a bystander's latency against a normal one: run alone
def test_slow_bodies_hold_no_slot_and_are_answered_408(guarded: ShimProcess, attack: Attack) -> None:
    limit = normal_latency(guarded)
    post = head("POST", "/v1/infer", content_type="application/json", content_length=str(len(BODY)))
    slow = [attack.open(post + BODY[:20]) for _ in range(8 * MAX_INFLIGHT)]
    started = time.monotonic()
    trickling = attack.trickle(slow, for_s=BODY_TIMEOUT_S - 0.5)
    # While every slow sender is inside its body: more of them than there are slots.
    for _ in range(5):
        assert bystander(guarded) < limit
    ready = httpx.get(f"{guarded.url}/readyz", timeout=READ_TIMEOUT_S)
    assert ready.status_code == 200, ready.text
    assert ready.json()["inflight"] == 0
    trickling.join()
    for sock in slow:
        status, headers, body = read_response(sock)
        assert status == 408
        assert headers["connection"] == "close"
        error = json.loads(body)["error"]
        assert set(error) == ERROR_KEYS
        assert error["reason"] == "REQUEST_TIMEOUT"
        assert closed_by_the_shim(sock)
    assert time.monotonic() - started < BODY_TIMEOUT_S + 5


@pytest.mark.serial  # compares a bystander's latency against a normal one: run alone
def test_silent_half_sent_and_idle_connections_are_closed(guarded: ShimProcess, attack: Attack) -> None:
    limit = normal_latency(guarded)
    started = time.monotonic()
    silent = [attack.open() for _ in range(32)]
    slowloris = [attack.open(b"POST /v1/generate HTTP/1.1\r\nHost: shim\r\nX-Pad: ") for _ in range(16)]
    kept_alive = attack.open(head("GET", "/healthz"))
    assert read_response(kept_alive)[0] == 200
    trickling = attack.trickle(slowloris, for_s=HEADER_TIMEOUT_S - 0.5)
    for _ in range(5):
        assert bystander(guarded) < limit
    assert httpx.get(f"{guarded.url}/readyz", timeout=READ_TIMEOUT_S).status_code == 200
    trickling.join()
    for sock in silent:
        assert closed_by_the_shim(sock)
    assert closed_by_the_shim(kept_alive)
    for sock in slowloris:
        status, _, body = read_response(sock)
        assert status == 408
        assert json.loads(body)["error"]["reason"] == "REQUEST_TIMEOUT"
        assert closed_by_the_shim(sock)
    assert time.monotonic() - started < max(IDLE_TIMEOUT_S, HEADER_TIMEOUT_S) + 5
