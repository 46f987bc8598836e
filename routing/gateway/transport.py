"""A lean HTTP/1.1 transport for the gateway's `httpx.AsyncClient`.

httpx's default transport (httpcore + anyio + h11) spends most of the gateway's per-request
CPU in its layers and writes a request's head and body as two packets. Upstreams here are
plain-HTTP engines on a trusted network, so this transport keeps only what the proxy needs:
keep-alive connections per host, one write per request, chunked / content-length /
until-close bodies streamed as they arrive, and httpx's exception types (ConnectError,
ConnectTimeout, ReadTimeout, ReadError, RemoteProtocolError) so retries work the same. A
body abandoned before its end (client went away) closes its connection, which is how an
engine learns to abort the request. TLS is not supported: use httpx's default transport
(`GatewayConfig.upstream_transport = "httpx"`) for https upstreams.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx

# Timeouts use `asyncio.timeout`, never `asyncio.wait_for`: on Python 3.11 wait_for can
# swallow a cancellation that races with the read completing, and a cancelled proxy task
# that keeps streaming is exactly the client-disconnect leak this transport must not have.
_READ_CHUNK = 64 * 1024
# A chunk-size line longer than this is not HTTP/1.1 chunked framing.
_MAX_CHUNK_LINE = 4096

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def _timeout(request: httpx.Request, kind: str) -> float | None:
    value = request.extensions.get("timeout", {}).get(kind)
    return None if value is None else float(value)


class _Body(httpx.AsyncByteStream):
    def __init__(
        self,
        transport: LeanTransport,
        key: tuple[str, int],
        conn: Conn,
        request: httpx.Request,
        *,
        chunked: bool,
        length: int | None,
        keep_alive: bool,
    ) -> None:
        self._transport = transport
        self._key = key
        self._conn = conn
        self._request = request
        self._chunked = chunked
        self._length = length
        self._keep_alive = keep_alive
        self._done = False
        self._closed = False
        # True once the whole body has been read off the connection (see `_chunks`).
        self.at_end = False

    async def _read(self, coro: Any) -> Any:
        try:
            async with asyncio.timeout(_timeout(self._request, "read")):
                return await coro
        except TimeoutError:
            raise httpx.ReadTimeout("upstream read timed out", request=self._request) from None
        except asyncio.IncompleteReadError:
            raise httpx.RemoteProtocolError(
                "upstream closed the connection mid-body", request=self._request
            ) from None
        except (ConnectionError, OSError) as exc:
            raise httpx.ReadError(str(exc) or type(exc).__name__, request=self._request) from None
        except (asyncio.LimitOverrunError, ValueError) as exc:
            raise httpx.RemoteProtocolError(
                f"malformed body framing: {exc}", request=self._request
            ) from None

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks(self._conn[0]) if self._chunked else self._plain(self._conn[0])

    async def _plain(self, reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
        if self._length is not None:
            left = self._length
            while left > 0:
                data = await self._read(reader.read(min(left, _READ_CHUNK)))
                if not data:
                    raise httpx.RemoteProtocolError(
                        "upstream closed the connection mid-body", request=self._request
                    )
                left -= len(data)
                yield data
        else:
            while True:
                data = await self._read(reader.read(_READ_CHUNK))
                if not data:
                    break
                yield data
            self._keep_alive = False
        self._done = True
        await self.aclose()

    async def _chunks(self, reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
        """Decodes chunked framing over bulk reads (one read and one timeout per batch of
        bytes that arrived together, not two awaited reads per chunk), yielding each chunk on
        its own as soon as it is complete; nothing waits for more data than the next
        incomplete chunk needs. `at_end` is set before the last chunk is yielded when the
        terminating chunk came with it, so a proxy can end its own answer in the same write."""
        buf = b""
        while True:
            data = await self._read(reader.read(_READ_CHUNK))
            if not data:
                raise httpx.RemoteProtocolError(
                    "upstream closed the connection mid-body", request=self._request
                )
            buf = buf + data if buf else data
            pieces: list[bytes] = []
            pos = 0
            end = -1
            while True:
                nl = buf.find(b"\r\n", pos)
                if nl < 0:
                    if len(buf) - pos > _MAX_CHUNK_LINE:
                        raise httpx.RemoteProtocolError(
                            "malformed body framing: chunk size line too long",
                            request=self._request,
                        )
                    break
                try:
                    size = int(buf[pos:nl].split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise httpx.RemoteProtocolError(
                        f"malformed body framing: bad chunk size {buf[pos:nl][:40]!r}",
                        request=self._request,
                    ) from None
                if size < 0:
                    raise httpx.RemoteProtocolError(
                        "malformed body framing: negative chunk size", request=self._request
                    )
                if size == 0:
                    # Trailers (none in practice) end with an empty line.
                    if buf.startswith(b"\r\n", nl + 2):
                        end = nl + 4
                    else:
                        t = buf.find(b"\r\n\r\n", nl + 2)
                        if t >= 0:
                            end = t + 4
                    break
                stop = nl + 2 + size
                if stop + 2 > len(buf):
                    break
                pieces.append(buf[nl + 2 : stop])
                pos = stop + 2
            if end >= 0:
                if end != len(buf):
                    self._keep_alive = False  # bytes past the body: never reuse this connection
                for piece in pieces[:-1]:
                    yield piece
                self.at_end = True
                self._done = True
                if pieces:
                    yield pieces[-1]
                await self.aclose()
                return
            buf = buf[pos:]
            for piece in pieces:
                yield piece

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._done and self._keep_alive:
            self._transport._release(self._key, self._conn)
        else:
            self._conn[1].close()


class LeanTransport(httpx.AsyncBaseTransport):
    def __init__(self, *, max_idle_per_host: int = 256) -> None:
        self._idle: dict[tuple[str, int], list[Conn]] = {}
        self._max_idle = max_idle_per_host

    def _release(self, key: tuple[str, int], conn: Conn) -> None:
        idle = self._idle.setdefault(key, [])
        if len(idle) < self._max_idle and not conn[1].is_closing():
            idle.append(conn)
        else:
            conn[1].close()

    def _take_idle(self, key: tuple[str, int]) -> Conn | None:
        idle = self._idle.get(key)
        while idle:
            reader, writer = conn = idle.pop()
            if not writer.is_closing() and not reader.at_eof():
                return conn
            writer.close()
        return None

    async def _connect(self, request: httpx.Request, key: tuple[str, int]) -> Conn:
        try:
            async with asyncio.timeout(_timeout(request, "connect")):
                return await asyncio.open_connection(*key)
        except TimeoutError:
            raise httpx.ConnectTimeout(
                f"connect to {key[0]}:{key[1]} timed out", request=request
            ) from None
        except OSError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__, request=request) from None

    def _head(self, request: httpx.Request, body: bytes) -> bytes:
        url = request.url
        target = url.raw_path.decode("ascii")
        lines = [f"{request.method} {target} HTTP/1.1"]
        has_length = False
        for name, value in request.headers.raw:
            lname = name.lower()
            if lname == b"transfer-encoding":
                continue  # the body is sent whole, with a content-length
            if lname == b"content-length":
                has_length = True
            lines.append(f"{name.decode('latin-1')}: {value.decode('latin-1')}")
        if body and not has_length:
            lines.append(f"content-length: {len(body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != "http":
            raise httpx.UnsupportedProtocol(
                f"the lean transport speaks plain http only, not {request.url.scheme}",
                request=request,
            )
        key = (request.url.host, request.url.port or 80)
        body = await request.aread()
        payload = self._head(request, body)
        # A pooled connection may have been closed by the server meanwhile (keep-alive
        # timeout): skip the ones known dead, and retry once on a fresh connection.
        for attempt in range(2):
            conn = self._take_idle(key) if attempt == 0 else None
            reused = conn is not None
            if conn is None:
                conn = await self._connect(request, key)
            reader, writer = conn
            try:
                writer.write(payload)
                async with asyncio.timeout(_timeout(request, "read")):
                    head = await reader.readuntil(b"\r\n\r\n")
                break
            except TimeoutError:
                writer.close()
                raise httpx.ReadTimeout(
                    "upstream did not answer in time", request=request
                ) from None
            except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
                writer.close()
                if reused and attempt == 0:
                    continue
                raise httpx.RemoteProtocolError(
                    f"upstream closed the connection: {exc}", request=request
                ) from None
            except asyncio.LimitOverrunError:
                writer.close()
                raise httpx.RemoteProtocolError(
                    "response head too large", request=request
                ) from None
            except BaseException:
                # Cancelled (the client went away): closing tells the engine to abort.
                writer.close()
                raise
        status_line, _, header_block = head[:-4].partition(b"\r\n")
        parts = status_line.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            writer.close()
            raise httpx.RemoteProtocolError(
                f"bad status line {status_line[:80]!r}", request=request
            )
        status = int(parts[1])
        headers: list[tuple[bytes, bytes]] = []
        chunked = False
        length: int | None = None
        keep_alive = parts[0] == b"HTTP/1.1"
        for line in header_block.split(b"\r\n"):
            name, sep, value = line.partition(b":")
            if not sep:
                continue
            name, value = name.strip(), value.strip()
            lname = name.lower()
            if lname == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
            elif lname == b"content-length":
                length = int(value)
            elif lname == b"connection":
                keep_alive = b"close" not in value.lower()
            headers.append((name, value))
        if request.method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            length, chunked = 0, False
        assert conn is not None  # the loop above either broke with a connection or raised
        stream = _Body(
            self, key, conn, request, chunked=chunked, length=length, keep_alive=keep_alive
        )
        return httpx.Response(
            status,
            headers=headers,
            stream=stream,
            extensions={"http_version": b"HTTP/1.1", "kvroute_body": stream},
        )

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for _, writer in conns:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
        self._idle.clear()
