"""Per-request records, written off the hot path, and the sinks telemetry reads them from.

The gateway hands each finished request's record (a JSON-able dict, fields in
docs/contracts.md) to `RecordWriter.submit`, which only appends to a buffer; a background
task flushes the buffer to the sink every `flush_s` (or sooner when it fills).

Sinks and their read API (for telemetry):

- `MemorySink(maxlen=...)`: an in-process ring buffer (oldest dropped when full), used when
  REDIS_URL is not set. Thread-safe.
    - `read(*, after=0, count=1000) -> list[tuple[int, dict]]`: records with id > `after`,
      oldest first, not removed. Ids are increasing ints; pass the last id back as `after`.
    - `drain(*, count=1000) -> list[dict]`: removes and returns up to `count` oldest records.
    - `__len__`.
  The gateway's sink is reachable as `routing.gateway.routing.gateway.state.records.sink`
  in the process that serves the gateway (the demo runs control plane and gateway in one).
- `RedisStreamSink(url=..., stream="kvroute:requests", maxlen=100000)`: `XADD stream
  MAXLEN ~ maxlen * r <json>`. Telemetry may read the stream directly (field `r`) or use:
    - `read(*, after="0-0", count=1000) -> list[tuple[str, dict]]` (XRANGE, exclusive of
      `after`, not removed; pass the last id back),
    - `drain(*, count=1000) -> list[dict]` (XRANGE from the start then XDEL of those ids).
  Both read methods are synchronous (for Celery tasks); writes are async (redis.asyncio).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections import deque
from collections.abc import Iterable
from typing import Any, Protocol

log = logging.getLogger(__name__)

REQUESTS_STREAM = "kvroute:requests"


class RecordSink(Protocol):
    async def write_many(self, records: list[dict[str, Any]]) -> None: ...

    async def aclose(self) -> None: ...


class MemorySink:
    def __init__(self, *, maxlen: int = 100_000) -> None:
        self._items: deque[tuple[int, dict[str, Any]]] = deque(maxlen=maxlen)
        self._next_id = 1
        self._lock = threading.Lock()

    def append_many(self, records: Iterable[dict[str, Any]]) -> None:
        with self._lock:
            for r in records:
                self._items.append((self._next_id, r))
                self._next_id += 1

    async def write_many(self, records: list[dict[str, Any]]) -> None:
        self.append_many(records)

    def read(self, *, after: int = 0, count: int = 1000) -> list[tuple[int, dict[str, Any]]]:
        with self._lock:
            return [(i, r) for i, r in self._items if i > after][:count]

    def drain(self, *, count: int = 1000) -> list[dict[str, Any]]:
        with self._lock:
            n = min(count, len(self._items))
            return [self._items.popleft()[1] for _ in range(n)]

    def __len__(self) -> int:
        return len(self._items)

    async def aclose(self) -> None:
        return None


class RedisStreamSink:
    def __init__(self, *, url: str, stream: str = REQUESTS_STREAM, maxlen: int = 100_000) -> None:
        self.url = url
        self.stream = stream
        self.maxlen = maxlen
        self._async: Any = None
        self._sync: Any = None

    async def write_many(self, records: list[dict[str, Any]]) -> None:
        if self._async is None:
            import redis.asyncio as aioredis

            self._async = aioredis.Redis.from_url(self.url)
        pipe = self._async.pipeline(transaction=False)
        for r in records:
            pipe.xadd(
                self.stream,
                {"r": json.dumps(r, separators=(",", ":"))},
                maxlen=self.maxlen,
                approximate=True,
            )
        await pipe.execute()

    def _client(self) -> Any:
        if self._sync is None:
            import redis

            self._sync = redis.Redis.from_url(self.url)
        return self._sync

    def read(self, *, after: str = "0-0", count: int = 1000) -> list[tuple[str, dict[str, Any]]]:
        rows = self._client().xrange(self.stream, min=f"({after}", max="+", count=count)
        return [(i.decode(), json.loads(f[b"r"])) for i, f in rows]

    def drain(self, *, count: int = 1000) -> list[dict[str, Any]]:
        client = self._client()
        rows = client.xrange(self.stream, min="-", max="+", count=count)
        if rows:
            client.xdel(self.stream, *[i for i, _ in rows])
        return [json.loads(f[b"r"]) for _, f in rows]

    async def aclose(self) -> None:
        if self._async is not None:
            await self._async.aclose()
            self._async = None
        if self._sync is not None:
            self._sync.close()
            self._sync = None


class RecordWriter:
    """Buffers records and flushes them from a background task; never blocks a request."""

    def __init__(
        self, sink: MemorySink | RedisStreamSink, *, flush_s: float = 0.2, max_buffer: int = 10_000
    ) -> None:
        self.sink = sink
        self.flush_s = flush_s
        self._buffer: deque[dict[str, Any]] = deque(maxlen=max_buffer)
        self._wake = asyncio.Event()
        self.dropped = 0
        self.written = 0

    def submit(self, record: dict[str, Any]) -> None:
        if len(self._buffer) == self._buffer.maxlen:
            self.dropped += 1  # the deque drops the oldest; count it so it is visible
        self._buffer.append(record)
        if len(self._buffer) >= 256:
            self._wake.set()

    async def flush(self) -> None:
        while self._buffer:
            batch = [self._buffer.popleft() for _ in range(min(500, len(self._buffer)))]
            try:
                await self.sink.write_many(batch)
                self.written += len(batch)
            except Exception:
                self.dropped += len(batch)
                log.exception("request-record sink failed; %d records dropped", len(batch))
                return

    async def run(self) -> None:
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=self.flush_s)
                self._wake.clear()
                await self.flush()
        finally:
            await self.flush()
