"""The routing snapshot (docs/contracts.md) as values, where it comes from, and its refresher.

Sources:
- `StaticSnapshotSource(doc)`: a dict (tests, benchmarks, a fixed fleet);
- `HttpSnapshotSource(url=..., token=...)`: `GET {url}/api/routing-snapshot/` on the control plane;
- `InProcessSnapshotSource()`: the control plane's own `controlplane.snapshot.routing_snapshot`
  in a worker thread (the gateway served by the same process as Django: the demo).

`SnapshotRefresher` reloads on change notices (channel-layer group `kvroute.config`, Redis
pub/sub `kvroute:config`) and also polls every `poll_s` as a safety net; the hot path only
ever reads the last `Snapshot` in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

log = logging.getLogger(__name__)

CONFIG_GROUP = "kvroute.config"
REDIS_CONFIG_CHANNEL = "kvroute:config"
ROUTABLE_STATES = frozenset({"active", "draining"})


@dataclass(frozen=True, slots=True)
class PolicyRef:
    policy: str
    type: str
    version: int | None = None
    version_id: int | None = None
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.policy}@{self.version}" if self.version is not None else self.policy

    @property
    def cache_key(self) -> tuple[Any, ...]:
        return (
            self.version_id,
            self.type,
            tuple(sorted((k, repr(v)) for k, v in self.params.items())),
        )

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> PolicyRef:
        return cls(
            policy=str(doc.get("policy") or doc.get("type")),
            type=str(doc["type"]),
            version=doc.get("version"),
            version_id=doc.get("version_id"),
            params=dict(doc.get("params") or {}),
        )


@dataclass(frozen=True, slots=True)
class Arm:
    name: str
    share: float
    ref: PolicyRef


@dataclass(frozen=True, slots=True)
class Experiment:
    id: int | None
    name: str
    sticky_key: str  # "session" | "tenant" | "request"
    arms: tuple[Arm, ...]
    shadow: PolicyRef | None = None


@dataclass(frozen=True, slots=True)
class ModelRouting:
    active: PolicyRef | None = None
    experiment: Experiment | None = None


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    id: str
    url: str
    model: str
    state: str = "active"
    healthy: bool = True
    block_size: int = 16
    capacity_blocks: int = 0
    network_ms: float = 0.0
    kv_events_endpoint: str | None = None
    replay_endpoint: str | None = None
    labels: Mapping[str, Any] = field(default_factory=dict)

    @property
    def draining(self) -> bool:
        return self.state == "draining"


@dataclass(frozen=True, slots=True)
class Snapshot:
    revision: str
    workers: tuple[WorkerSpec, ...]
    models: Mapping[str, ModelRouting]
    by_model: Mapping[str, tuple[WorkerSpec, ...]]
    loaded_at_s: float = 0.0

    @property
    def model_names(self) -> list[str]:
        return sorted(set(self.by_model) | set(self.models))


EMPTY_SNAPSHOT = Snapshot(revision="", workers=(), models={}, by_model={})


def parse_snapshot(doc: Mapping[str, Any], *, now_s: float | None = None) -> Snapshot:
    """Contract document -> `Snapshot`; workers not active/draining are left out.

    Raises `ValueError` (or `KeyError`) on a document that does not follow the contract.
    """
    workers = []
    for w in doc.get("workers") or []:
        state = str(w.get("state", "active"))
        if state not in ROUTABLE_STATES:
            continue
        workers.append(
            WorkerSpec(
                id=str(w["id"]),
                url=str(w["url"]).rstrip("/"),
                model=str(w["model"]),
                state=state,
                healthy=bool(w.get("healthy", True)),
                block_size=int(w.get("block_size") or 16),
                capacity_blocks=int(w.get("capacity_blocks") or 0),
                network_ms=float(w.get("network_ms") or 0.0),
                kv_events_endpoint=w.get("kv_events_endpoint") or None,
                replay_endpoint=w.get("replay_endpoint") or None,
                labels=dict(w.get("labels") or {}),
            )
        )
    models: dict[str, ModelRouting] = {}
    for name, m in (doc.get("models") or {}).items():
        active = PolicyRef.from_doc(m["active"]) if m.get("active") else None
        exp_doc = m.get("experiment")
        experiment = None
        if exp_doc and exp_doc.get("arms"):
            arms = tuple(
                Arm(
                    name=str(a.get("name")),
                    share=float(a.get("share", 0)),
                    ref=PolicyRef.from_doc(a),
                )
                for a in exp_doc["arms"]
            )
            shadow = PolicyRef.from_doc(exp_doc["shadow"]) if exp_doc.get("shadow") else None
            experiment = Experiment(
                id=exp_doc.get("id"),
                name=str(exp_doc.get("name", "")),
                sticky_key=str(exp_doc.get("sticky_key", "request")),
                arms=arms,
                shadow=shadow,
            )
        models[str(name)] = ModelRouting(active=active, experiment=experiment)
    by_model: dict[str, list[WorkerSpec]] = {}
    for w in workers:
        by_model.setdefault(w.model, []).append(w)
    return Snapshot(
        revision=str(doc.get("revision", "")),
        workers=tuple(workers),
        models=models,
        by_model={k: tuple(v) for k, v in by_model.items()},
        loaded_at_s=time.monotonic() if now_s is None else now_s,
    )


SnapshotSource = Callable[[], Awaitable[Mapping[str, Any]]]


class StaticSnapshotSource:
    """A fixed document; `set(doc)` swaps it (tests use that to change the fleet)."""

    def __init__(self, doc: Mapping[str, Any]) -> None:
        self.doc = doc

    def set(self, doc: Mapping[str, Any]) -> None:
        self.doc = doc

    async def __call__(self) -> Mapping[str, Any]:
        return self.doc


class HttpSnapshotSource:
    """`GET {url}/api/routing-snapshot/` with its own client (the control plane may be https)."""

    def __init__(
        self, *, url: str, token: str = "", client: httpx.AsyncClient | None = None
    ) -> None:
        self.url = f"{url.rstrip('/')}/api/routing-snapshot/"
        self._client = client
        self._own_client = client is None
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._etag: str | None = None
        self._doc: Mapping[str, Any] | None = None
        self.not_modified = 0

    async def __call__(self) -> Mapping[str, Any]:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=5.0)
        headers = dict(self._headers)
        if self._etag and self._doc is not None:
            # The control plane answers 304 when the revision (its ETag) is unchanged.
            headers["If-None-Match"] = self._etag
        resp = await self._client.get(self.url, headers=headers, timeout=5.0)
        if resp.status_code == 304 and self._doc is not None:
            self.not_modified += 1
            return self._doc
        resp.raise_for_status()
        doc: Mapping[str, Any] = resp.json()
        self._doc = doc
        self._etag = resp.headers.get("etag")
        return doc

    async def aclose(self) -> None:
        if self._own_client and self._client is not None:
            await self._client.aclose()
            self._client = None


class InProcessSnapshotSource:
    """Reads the control plane's selectors directly (same process), off the event loop."""

    async def __call__(self) -> Mapping[str, Any]:
        from channels.db import database_sync_to_async

        from controlplane.snapshot import routing_snapshot

        doc: Mapping[str, Any] = await database_sync_to_async(routing_snapshot)()
        return doc


class SnapshotRefresher:
    def __init__(
        self,
        *,
        source: SnapshotSource,
        on_snapshot: Callable[[Snapshot], None],
        poll_s: float,
        redis_url: str = "",
        listen_channel_layer: bool = False,
    ) -> None:
        self._source = source
        self._on_snapshot = on_snapshot
        self.poll_s = poll_s
        self._redis_url = redis_url
        self._listen_channel_layer = listen_channel_layer
        self._wake = asyncio.Event()
        self.revision = ""
        self.last_error = ""
        self.refreshes = 0

    async def refresh(self) -> bool:
        """Load the document; apply it when its revision changed. True on success."""
        try:
            doc = await self._source()
            snapshot = parse_snapshot(doc)
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("routing snapshot refresh failed: %s", self.last_error)
            return False
        self.last_error = ""
        self.refreshes += 1
        if snapshot.revision != self.revision or not snapshot.revision:
            self.revision = snapshot.revision
            self._on_snapshot(snapshot)
        return True

    def notify(self) -> None:
        """A change notice arrived: refresh now."""
        self._wake.set()

    async def run_poller(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.poll_s)
            self._wake.clear()
            await self.refresh()

    async def run_channel_layer_listener(self) -> None:
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        if layer is None:
            return
        channel = await layer.new_channel()
        await layer.group_add(CONFIG_GROUP, channel)
        try:
            while True:
                message = await layer.receive(channel)
                if message.get("type") == "config.changed":
                    self.notify()
        finally:
            await layer.group_discard(CONFIG_GROUP, channel)

    async def run_redis_listener(self) -> None:
        import redis.asyncio as aioredis

        while True:
            client = aioredis.Redis.from_url(self._redis_url)
            try:
                async with client.pubsub() as pubsub:
                    await pubsub.subscribe(REDIS_CONFIG_CHANNEL)
                    async for message in pubsub.listen():
                        if message.get("type") == "message":
                            self.notify()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("config pub/sub listener: %s; reconnecting", exc)
                await asyncio.sleep(1.0)
            finally:
                await client.aclose()

    def tasks(self) -> list[Callable[[], Coroutine[Any, Any, None]]]:
        runners: list[Callable[[], Coroutine[Any, Any, None]]] = [self.run_poller]
        if self._listen_channel_layer:
            runners.append(self.run_channel_layer_listener)
        if self._redis_url:
            runners.append(self.run_redis_listener)
        return runners
