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


class PiecewiseServer(RawServer):
    """Writes each response in the given pieces, pausing between them, so chunk framing is
    split across reads (inside a size line, inside data, inside the terminator)."""

    def __init__(self, pieces: list[bytes]) -> None:
        super().__init__([b"".join(pieces)])
        self.pieces = pieces

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.requests.append(head)
                for piece in self.pieces:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.01)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def test_chunks_split_across_reads_and_trailers() -> None:
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    server = PiecewiseServer(
        [head + b"5\r\nhel", b"lo\r\n1", b"0;ext=1\r\n0123456789abcdef\r\n0\r\n", b"x-t: 1\r\n\r\n"]
    )
    async with server as url, httpx.AsyncClient(transport=LeanTransport()) as client:
        for _ in range(2):
            async with client.stream("GET", url) as resp:
                chunks = [c async for c in resp.aiter_raw()]
                assert resp.extensions["kvroute_body"].at_end
            assert chunks == [b"hello", b"0123456789abcdef"]
    assert server.connections == 1  # the body was read to its end: the connection was reused


async def test_end_reported_with_the_last_chunk() -> None:
    async with (
        RawServer([CHUNKED]) as url,
        httpx.AsyncClient(transport=LeanTransport()) as client,
        client.stream("GET", url) as resp,
    ):
        body = resp.extensions["kvroute_body"]
        seen = []
        async for chunk in resp.aiter_raw():
            seen.append((chunk, body.at_end))
    # Everything arrived in one read: the last chunk already knows the body ended.
    assert seen == [(b"hello", False), (b" world!", True)]


@pytest.mark.parametrize(
    "framing",
    [b"zz\r\nhello\r\n0\r\n\r\n", b"-5\r\nhello\r\n0\r\n\r\n", b"5" * 5000],
    ids=["not-hex", "negative", "endless-size-line"],
)
async def test_malformed_chunk_framing_is_a_protocol_error(framing: bytes) -> None:
    bad = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + framing
    async with RawServer([bad]) as url, httpx.AsyncClient(transport=LeanTransport()) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            async with client.stream("GET", url) as resp:
                async for _ in resp.aiter_raw():
                    pass
