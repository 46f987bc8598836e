"""The lean upstream transport against a real (minimal, raw-socket) HTTP/1.1 server:
framing, keep-alive reuse, a server that silently drops idle connections, and httpx's
error types for refused connections and timeouts."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httpx
import pytest

from routing.gateway.transport import LeanTransport


class RawServer:
    """Answers every request with `responses[i % n]` (raw bytes); may close after each."""

    def __init__(
        self, responses: list[bytes], *, close_after_each: bool = False, delay_s: float = 0.0
    ) -> None:
        self.responses = responses
        self.close_after_each = close_after_each
        self.delay_s = delay_s
        self.requests: list[bytes] = []
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                await asyncio.sleep(self.delay_s)
                writer.write(self.responses[(len(self.requests) - 1) % len(self.responses)])
                await writer.drain()
                if self.close_after_each:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: Any) -> None:
        self.server.close()


CHUNKED = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-type: text/event-stream\r\n\r\n5\r\nhello\r\n7\r\n world!\r\n0\r\n\r\n"
LENGTH = b"HTTP/1.1 201 Created\r\ncontent-length: 4\r\nx-a: b\r\n\r\nbody"
UNTIL_CLOSE = b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil close"


async def test_framing_and_keep_alive_reuse() -> None:
    server = RawServer([CHUNKED, LENGTH])
    async with server as url, httpx.AsyncClient(transport=LeanTransport()) as client:
        r1 = await client.post(
            url + "/v1/x?q=1", content=b'{"a":1}', headers={"x-request-id": "r1"}
        )
        r2 = await client.get(url + "/metrics")
        r3 = await client.post(url + "/v1/x", json={"b": 2})
    assert (r1.status_code, r1.content) == (200, b"hello world!")
    assert (r2.status_code, r2.content, r2.headers["x-a"]) == (201, b"body", "b")
    assert r3.content == b"hello world!"
    assert server.connections == 1  # one keep-alive connection for all three
    first = server.requests[0]
    assert first.startswith(b"POST /v1/x?q=1 HTTP/1.1\r\n")
    assert b"x-request-id: r1" in first and first.endswith(b'\r\n\r\n{"a":1}')


async def test_streamed_chunks_arrive_separately() -> None:
    async with (
        RawServer([CHUNKED]) as url,
        httpx.AsyncClient(transport=LeanTransport()) as client,
        client.stream("GET", url) as resp,
    ):
        chunks = [c async for c in resp.aiter_raw()]
    assert chunks == [b"hello", b" world!"]


async def test_body_until_close_and_a_server_that_drops_idle_connections() -> None:
    server = RawServer([UNTIL_CLOSE, LENGTH], close_after_each=True)
    async with server as url, httpx.AsyncClient(transport=LeanTransport()) as client:
        r1 = await client.get(url)
        r2 = await client.get(url)  # r1's connection was closed: a fresh one is used
        r3 = await client.get(url)  # r2's (keep-alive by its headers) was dropped by the server
    assert [r1.content, r2.content, r3.content] == [b"until close", b"body", b"until close"]
    assert server.connections == 3


async def test_refused_connection_and_timeouts_raise_httpx_errors() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    async with httpx.AsyncClient(transport=LeanTransport()) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://127.0.0.1:{port}/")
        async with RawServer([LENGTH], delay_s=1.0) as url:
            with pytest.raises(httpx.ReadTimeout):
                await client.get(url, timeout=httpx.Timeout(5.0, read=0.1))
        with pytest.raises(httpx.UnsupportedProtocol):
            await client.get("https://127.0.0.1:1/")


async def test_abandoned_body_closes_the_connection() -> None:
    server = RawServer([CHUNKED])
    async with server as url, httpx.AsyncClient(transport=LeanTransport()) as client:
        async with client.stream("GET", url) as resp:
            async for _ in resp.aiter_raw():
                break  # the client went away mid-body
        await client.get(url)
    assert server.connections == 2  # the abandoned connection was not reused
