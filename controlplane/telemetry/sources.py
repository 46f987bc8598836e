"""Where request records come from: the gateway's Redis stream, or its in-process sink.

A source returns entries strictly after a cursor id, oldest first, as
(entry id, raw record) pairs; the caller stores the last id it committed.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from typing import Any, Protocol

from routing.gateway.records import REQUESTS_STREAM as REQUEST_STREAM_KEY

logger = logging.getLogger(__name__)

REQUEST_STREAM_FIELD = "r"  # the field the gateway's RedisStreamSink writes each record to


class RecordSource(Protocol):
    name: str

    def read_after(self, last_id: str, *, count: int) -> list[tuple[str, Any]]: ...


def _decode(raw: bytes | str) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, TypeError):
        return None  # kept as an entry so the cursor still moves past it; counted as malformed


class RedisStreamSource:
    """Reads `kvroute:requests` (field `r`, JSON) with XREAD from a cursor id."""

    def __init__(self, *, url: str, key: str = REQUEST_STREAM_KEY) -> None:
        import redis

        self.name = f"redis:{key}"
        self._key = key
        self._client = redis.Redis.from_url(url)

    def read_after(self, last_id: str, *, count: int) -> list[tuple[str, Any]]:
        resp = self._client.xread({self._key: last_id or "0-0"}, count=count)
        out: list[tuple[str, Any]] = []
        for _stream, entries in resp or []:
            for entry_id, fields in entries:
                eid = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
                raw = fields.get(REQUEST_STREAM_FIELD.encode(), fields.get(REQUEST_STREAM_FIELD))
                out.append((eid, _decode(raw) if raw is not None else None))
        return out

    def append(self, record: Mapping[str, Any]) -> str:
        """Append one record the way the gateway does (used by tests and load scripts)."""
        eid = self._client.xadd(
            self._key,
            {REQUEST_STREAM_FIELD: json.dumps(record)},
            maxlen=100_000,
            approximate=True,
        )
        return eid.decode() if isinstance(eid, bytes) else str(eid)

    def close(self) -> None:
        self._client.close()


class MemorySinkSource:
    """Reads the gateway's in-process `routing.gateway.records.MemorySink` (integer ids).

    Used when REDIS_URL is not set and the gateway runs in this process (the demo).
    """

    def __init__(self, sink: Any, *, name: str | None = None) -> None:
        # Sink ids restart at 1 with the process, so the cursor is per sink instance.
        self.name = name or f"memory:requests:{os.getpid()}:{time.time_ns()}"
        self.sink = sink

    def read_after(self, last_id: str, *, count: int) -> list[tuple[str, Any]]:
        try:
            after = int(str(last_id).split("-")[0])
        except ValueError:
            after = 0
        return [(str(i), rec) for i, rec in self.sink.read(after=after, count=count)]
