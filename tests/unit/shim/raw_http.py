"""HTTP/1.1 spoken by hand over asyncio streams, for tests that must send what httpx never would:
partial headers, a body that never comes, a connection that stays silent."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any

WITHIN_S = 10.0  # every wait below is for a condition; this only bounds a test that went wrong


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class RawConnections:
    """Opens raw connections and closes every one of them at the end, whatever the test did."""

    def __init__(self) -> None:
        self._writers: list[asyncio.StreamWriter] = []

    async def open(self, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        self._writers.append(writer)
        return reader, writer

    async def close_all(self) -> None:
        for writer in self._writers:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


async def read_response(reader: asyncio.StreamReader) -> RawResponse:
    """One response with a Content-Length body (every response the shim sends outside SSE)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WITHIN_S)
    status_line, *lines = head.decode("latin-1").rstrip("\r\n").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", "0"))), WITHIN_S)
    return RawResponse(status=int(status_line.split()[1]), headers=headers, body=body)


async def read_until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the peer still sends, once it has closed the connection."""
    return await asyncio.wait_for(reader.read(), WITHIN_S)


def request_head(method: str, path: str, *, headers: dict[str, str] | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: shim"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()
