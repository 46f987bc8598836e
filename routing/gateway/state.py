"""The gateway's composition root: every long-lived part, built once, plus the routing step.

`build_gateway_state(config, ...)` wires the shared `httpx.AsyncClient` (transport
injectable), the prefix index, the load tracker, circuit breakers, per-version policy
objects, tokenizer adapters, the metrics scraper, one KV-event subscriber per worker that
publishes events, the request-record writer and the snapshot refresher. `await
state.start()` loads the first snapshot and starts the background tasks; `await
state.aclose()` stops them. The ASGI app holds exactly one state; tests build their own.

`state.plan(...)` is the per-request routing step (no I/O except a `remote` tokenizer):
features -> index match -> worker views -> policy (experiment arm or active version,
shadow too) -> a `RoutePlan` the proxy executes.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import httpx
import xxhash
import zmq.asyncio

from routing.core.blocks import text_block_keys, token_block_keys
from routing.core.errors import NoRoutableWorker
from routing.core.index import PrefixIndex
from routing.core.load import LoadTracker, metrics_age_s
from routing.core.policies.base import Policy
from routing.core.registry import build_policy
from routing.core.types import Decision, RequestFeatures, WorkerView
from routing.gateway import metrics as m
from routing.gateway.breaker import CircuitBreakers
from routing.gateway.config import GatewayConfig
from routing.gateway.errors import GatewayError
from routing.gateway.kv_events import FALLBACK_STATES, KvEventSubscriber
from routing.gateway.records import MemorySink, RecordWriter, RedisStreamSink
from routing.gateway.scraper import MetricsScraper, WorkerMetrics
from routing.gateway.snapshot import (
    EMPTY_SNAPSHOT,
    Arm,
    HttpSnapshotSource,
    InProcessSnapshotSource,
    PolicyRef,
    Snapshot,
    SnapshotRefresher,
    SnapshotSource,
    StaticSnapshotSource,
    WorkerSpec,
)
from routing.gateway.tokenization import (
    CHARS_PER_TOKEN_ESTIMATE,
    Encoded,
    TextAdapter,
    TokenizerAdapter,
    build_adapter,
)
from routing.gateway.transport import LeanTransport

log = logging.getLogger(__name__)

# Used for a model that has workers but no active policy version yet.
DEFAULT_POLICY = PolicyRef(policy="default", type="kv_score", version=None, version_id=None)
# Consecutive failed scrapes after which a worker is treated as unhealthy.
SCRAPE_FAILURES_UNHEALTHY = 3


@dataclass(frozen=True, slots=True)
class RoutePlan:
    """Everything the proxy needs to send one request and record it."""

    model: str
    features: RequestFeatures
    decision: Decision
    policy_ref: PolicyRef
    arm: str | None
    experiment_id: int | None
    shadow: dict[str, Any] | None
    workers: Mapping[str, WorkerSpec]
    keys_by_worker: Mapping[str, tuple[int, ...]]
    cached_tokens_by_worker: Mapping[str, int]

    @property
    def candidates(self) -> list[str]:
        return [c.worker_id for c in self.decision.ranked]


class GatewayState:
    def __init__(
        self,
        *,
        config: GatewayConfig,
        snapshot_source: SnapshotSource,
        transport: httpx.AsyncBaseTransport | None = None,
        record_sink: MemorySink | RedisStreamSink | None = None,
        clock: Callable[[], float] = time.monotonic,
        seed: int | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.client = httpx.AsyncClient(
            transport=transport,
            timeout=httpx.Timeout(
                connect=config.connect_timeout_s,
                read=config.read_timeout_s,
                write=30.0,
                pool=10.0,
            ),
            limits=httpx.Limits(
                max_connections=4096, max_keepalive_connections=1024, keepalive_expiry=30.0
            ),
        )
        # The proxy hands requests straight to the lean transport: the client's send layers
        # (auth, redirects, cookie jar, event hooks, logging) do nothing for an upstream call
        # but cost CPU on every request. Requests are still built by `client.build_request`.
        self.lean_transport = transport if isinstance(transport, LeanTransport) else None
        # What `client.build_request` would add to every upstream request, computed once for
        # the lean path: the client's default headers (the proxy sets its own encoding and
        # content type) and its timeouts; upstream URLs are parsed once each.
        self.upstream_base_headers: list[tuple[bytes, bytes]] = [
            (k, v)
            for k, v in self.client.headers.raw
            if k.lower() not in (b"accept-encoding", b"content-type", b"x-request-id")
        ]
        self.upstream_extensions: dict[str, Any] = {"timeout": self.client.timeout.as_dict()}
        self.upstream_urls: dict[str, httpx.URL] = {}
        self.index = PrefixIndex(
            max_entries=config.index_max_entries, approx_ttl_s=config.approx_ttl_s
        )
        self.load = LoadTracker()
        self.breakers = CircuitBreakers(
            failures_to_open=config.breaker_failures, cooldown_s=config.breaker_cooldown_s
        )
        self.metrics = m.GatewayMetrics()
        self.rng = random.Random(seed)
        self.snapshot: Snapshot = EMPTY_SNAPSHOT
        if record_sink is None:
            record_sink = (
                RedisStreamSink(url=config.redis_url, maxlen=config.records_maxlen)
                if config.redis_url
                else MemorySink(maxlen=config.records_maxlen)
            )
        self.records = RecordWriter(record_sink, flush_s=config.records_flush_s)
        self.scraper = MetricsScraper(
            client=self.client,
            targets=self._scrape_targets,
            interval_s=config.metrics_interval_s,
            on_scrape=self._on_scrape,
            clock=clock,
        )
        self.refresher = SnapshotRefresher(
            source=snapshot_source,
            on_snapshot=self.apply_snapshot,
            poll_s=config.snapshot_poll_s,
            redis_url=config.redis_url,
            listen_channel_layer=config.listen_channel_layer,
        )
        self.subscribers: dict[str, KvEventSubscriber] = {}
        self._sub_tasks: dict[str, asyncio.Task[None]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._policies: dict[tuple[Any, ...], Policy] = {}
        self._adapters: dict[str, TokenizerAdapter] = {}
        self._zmq: zmq.asyncio.Context | None = None
        self.started = False
        self.metrics.add_collector(self._collect)

    # -- lifecycle ------------------------------------------------------------------------------

    def _spawn(self, fn: Callable[[], Coroutine[Any, Any, None]], name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(fn(), name=name)
        self._tasks.append(task)
        return task

    async def start(self) -> None:
        if self.started:
            return
        self.started = True
        await self.refresher.refresh()
        for runner in self.refresher.tasks():
            self._spawn(runner, f"kvroute-{runner.__name__}")
        if self.config.metrics_interval_s > 0:
            self._spawn(self.scraper.run, "kvroute-metrics-scraper")
        self._spawn(self.records.run, "kvroute-records")

    async def aclose(self) -> None:
        tasks = [*self._tasks, *self._sub_tasks.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self._sub_tasks.clear()
        await self.client.aclose()
        await self.records.sink.aclose()
        source_close = getattr(self.refresher._source, "aclose", None)
        if source_close is not None:
            await source_close()
        if self._zmq is not None:
            self._zmq.term()
            self._zmq = None
        self.started = False

    # -- snapshot -------------------------------------------------------------------------------

    def apply_snapshot(self, snapshot: Snapshot) -> None:
        old = {w.id: w for w in self.snapshot.workers}
        new = {w.id: w for w in snapshot.workers}
        self.snapshot = snapshot
        for gone in set(old) - set(new):
            self.index.remove_worker(gone)
            self.load.forget_worker(gone)
            self.breakers.forget(gone)
        for w in snapshot.workers:
            if w.capacity_blocks > 0:
                self.index.set_capacity(w.id, w.capacity_blocks)
        self._reconcile_subscribers(new)
        # Adapters depend on worker labels; rebuild lazily.
        self._adapters.clear()
        log.info(
            "routing snapshot %s: %d workers, %d models",
            snapshot.revision[:10],
            len(new),
            len(snapshot.models),
        )

    def _reconcile_subscribers(self, workers: Mapping[str, WorkerSpec]) -> None:
        try:
            loop_running = asyncio.get_running_loop() is not None
        except RuntimeError:
            loop_running = False
        wanted = {w.id: w for w in workers.values() if w.kv_events_endpoint}
        for wid in list(self.subscribers):
            sub = self.subscribers[wid]
            spec = wanted.get(wid)
            if (
                spec is None
                or spec.kv_events_endpoint != sub.endpoint
                or spec.replay_endpoint != sub.replay_endpoint
            ):
                task = self._sub_tasks.pop(wid, None)
                if task is not None:
                    task.cancel()
                    # Awaited at shutdown: the ZMQ context cannot terminate with its socket open.
                    self._tasks.append(task)
                del self.subscribers[wid]
        if not loop_running:
            return
        for wid, spec in wanted.items():
            if wid in self.subscribers:
                continue
            if self._zmq is None:
                self._zmq = zmq.asyncio.Context()
            sub = KvEventSubscriber(
                worker_id=wid,
                endpoint=spec.kv_events_endpoint or "",
                replay_endpoint=spec.replay_endpoint,
                index=self.index,
                ctx=self._zmq,
                silence_s=self.config.events_silence_s,
                on_outcome=self._on_event_outcome,
                clock=self.clock,
            )
            self.subscribers[wid] = sub
            self._sub_tasks[wid] = asyncio.get_running_loop().create_task(
                sub.run(), name=f"kvroute-events-{wid}"
            )

    def _scrape_targets(self) -> Iterable[tuple[str, str, str]]:
        return [(w.id, w.url, w.model) for w in self.snapshot.workers]

    def _on_scrape(self, worker_id: str, metrics: WorkerMetrics) -> None:
        spec = next((w for w in self.snapshot.workers if w.id == worker_id), None)
        if spec is not None and spec.capacity_blocks <= 0 and metrics.num_gpu_blocks:
            self.index.set_capacity(worker_id, metrics.num_gpu_blocks)

    def _on_event_outcome(self, worker_id: str, outcome: str) -> None:
        self.metrics.kv_events.labels(worker_id, outcome).inc()

    # -- per request ----------------------------------------------------------------------------

    def adapter_for(self, model: str) -> TokenizerAdapter:
        adapter = self._adapters.get(model)
        if adapter is None:
            spec = self.config.tokenizers.get(model)
            if spec is None:
                for w in self.snapshot.by_model.get(model, ()):
                    label = w.labels.get("tokenizer")
                    if isinstance(label, str) and label:
                        spec = label
                        break
            adapter = build_adapter(
                spec or self.config.tokenizer_default, model=model, client=self.client
            )
            self._adapters[model] = adapter
        return adapter

    def policy_for(self, ref: PolicyRef) -> Policy:
        key = ref.cache_key
        policy = self._policies.get(key)
        if policy is None:
            policy = build_policy(ref.type, dict(ref.params))
            self._policies[key] = policy
        return policy

    def model_workers(self, model: str) -> tuple[WorkerSpec, ...]:
        workers = self.snapshot.by_model.get(model)
        if workers is None and model not in self.snapshot.models:
            raise GatewayError(
                404,
                f"The model '{model}' does not exist.",
                type="invalid_request_error",
                param="model",
                code="model_not_found",
            )
        return workers or ()

    async def encode(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]] | None,
        text: str | None,
        worker_url: str,
    ) -> Encoded:
        adapter = self.adapter_for(model)
        if messages is not None:
            return await adapter.encode_chat(messages, worker_url=worker_url)
        return await adapter.encode_text(text or "", worker_url=worker_url)

    def views(self, workers: Iterable[WorkerSpec], *, now_s: float) -> list[WorkerView]:
        out = []
        for w in workers:
            scrape = self.scraper.states.get(w.id)
            metrics = scrape.metrics if scrape is not None else None
            healthy = w.healthy and self.breakers.allows(w.id, now_s=now_s)
            if scrape is not None and scrape.consecutive_failures >= SCRAPE_FAILURES_UNHEALTHY:
                healthy = False
            out.append(
                WorkerView(
                    id=w.id,
                    url=w.url,
                    model=w.model,
                    healthy=healthy,
                    draining=w.draining,
                    block_size=w.block_size,
                    capacity_blocks=w.capacity_blocks,
                    running=metrics.running if metrics else 0,
                    waiting=metrics.waiting if metrics else 0,
                    kv_usage_frac=metrics.kv_usage_frac if metrics else 0.0,
                    metrics_age_s=metrics_age_s(
                        scraped_at_s=scrape.scraped_at_s if scrape else None, now_s=now_s
                    )
                    if self.config.metrics_interval_s > 0
                    else 0.0,
                    network_ms=w.network_ms,
                )
            )
        return self.load.annotate(out, now_s=now_s)

    def choose_ref(
        self, model: str, *, session_key: str | None, tenant: str | None, request_id: str
    ) -> tuple[PolicyRef, Arm | None, int | None, PolicyRef | None]:
        routing = self.snapshot.models.get(model)
        if routing is None:
            return DEFAULT_POLICY, None, None, None
        exp = routing.experiment
        if exp is not None and exp.arms:
            if exp.sticky_key == "session":
                key = session_key or request_id
            elif exp.sticky_key == "tenant":
                key = tenant or request_id
            else:
                key = request_id
            arm = pick_arm(exp.arms, key=f"{exp.id}:{key}")
            return arm.ref, arm, exp.id, exp.shadow
        return routing.active or DEFAULT_POLICY, None, None, None

    def plan(
        self,
        *,
        model: str,
        workers: tuple[WorkerSpec, ...],
        encoded: Encoded,
        session_key: str | None,
        tenant: str | None,
        request_id: str,
        now_s: float,
    ) -> RoutePlan:
        """Pick the worker (and the retry order) for one request. Raises GatewayError 503."""
        if not workers:
            raise no_worker(f"no worker serves model '{model}'", retry_after_s=5.0)
        by_size: dict[int, tuple[int, ...]] = {}
        keys_by_worker: dict[str, tuple[int, ...]] = {}
        text_mode = encoded.token_ids is None
        block_chars = 64
        if text_mode:
            adapter = self.adapter_for(model)
            if isinstance(adapter, TextAdapter):
                block_chars = adapter.block_chars
        for w in workers:
            keys = by_size.get(w.block_size)
            if keys is None:
                if text_mode:
                    keys = text_block_keys(encoded.text or "", block_chars)
                else:
                    keys = token_block_keys(encoded.token_ids or [], w.block_size)
                by_size[w.block_size] = keys
            keys_by_worker[w.id] = keys
        # The most common block size defines the features; other sizes are matched separately.
        main_size = max(by_size, key=lambda bs: sum(1 for w in workers if w.block_size == bs))
        main_keys = by_size[main_size]
        cached: dict[str, int] = {}
        for bs, keys in by_size.items():
            matched = self.index.match(keys, now_s=now_s)
            for w in workers:
                if w.block_size == bs and w.id in matched:
                    # Scaled to the main key sequence so the policy's cached fraction is right.
                    blocks = matched[w.id]
                    cached[w.id] = blocks if bs == main_size else (blocks * bs) // main_size
        features = RequestFeatures(
            model=model,
            block_keys=main_keys,
            prompt_tokens=encoded.prompt_tokens,
            session_key=session_key,
            tenant=tenant,
            block_size=max(1, block_chars // CHARS_PER_TOKEN_ESTIMATE) if text_mode else main_size,
        )
        views = self.views(workers, now_s=now_s)
        ref, arm, experiment_id, shadow_ref = self.choose_ref(
            model, session_key=session_key, tenant=tenant, request_id=request_id
        )
        try:
            decision = self.policy_for(ref).decide(
                features, views, cached, now_s=now_s, rng=self.rng
            )
        except NoRoutableWorker as exc:
            ids = [w.id for w in workers]
            raise no_worker(
                str(exc), retry_after_s=self.breakers.retry_after_s(ids, now_s=now_s)
            ) from None
        notes = self._event_notes(workers, now_s=now_s)
        if notes:
            decision = replace(
                decision, reason=f"{decision.reason}; kv events: {notes} (approximate index)"
            )
        shadow = None
        if shadow_ref is not None:
            try:
                sd = self.policy_for(shadow_ref).decide(
                    features, views, cached, now_s=now_s, rng=self.rng
                )
                shadow = {
                    "policy": shadow_ref.label,
                    "policy_version_id": shadow_ref.version_id,
                    "worker": sd.worker_id,
                    "predicted_cached_tokens": sd.predicted_cached_tokens,
                    "reason": sd.reason,
                }
            except NoRoutableWorker:
                shadow = None
        return RoutePlan(
            model=model,
            features=features,
            decision=decision,
            policy_ref=ref,
            arm=arm.name if arm else None,
            experiment_id=experiment_id,
            shadow=shadow,
            workers={w.id: w for w in workers},
            keys_by_worker=keys_by_worker,
            cached_tokens_by_worker={
                c.worker_id: c.predicted_cached_tokens for c in decision.ranked
            },
        )

    def _event_notes(self, workers: Iterable[WorkerSpec], *, now_s: float) -> str:
        notes = []
        for w in workers:
            sub = self.subscribers.get(w.id)
            if sub is not None:
                st = sub.current_state(now_s=now_s)
                if st in FALLBACK_STATES:
                    notes.append(f"{w.id} {st}")
        return ", ".join(notes)

    # -- /gateway/metrics collectors ----------------------------------------------------------------

    def _collect(self) -> Iterable[Any]:
        now_s = self.clock()
        stats = self.index.stats(now_s=now_s)
        entries = m.gauge(m.INDEX_ENTRIES, "Distinct block keys in the prefix index.")
        entries.add_metric([], stats.entries)
        yield entries
        per = m.gauge(
            m.INDEX_WORKER_BLOCKS,
            "Blocks the index holds per worker and layer.",
            ["worker", "layer"],
        )
        for wid, counts in stats.per_worker.items():
            per.add_metric([wid, "precise"], counts[0])
            per.add_metric([wid, "approximate"], counts[1])
        yield per
        lag = m.gauge(
            m.EVENT_LAG,
            "Engine timestamp to gateway receipt of the last KV event batch.",
            ["worker"],
        )
        state = m.gauge(
            m.EVENTS_STATE, "KV event stream state per worker (1 = current).", ["worker", "state"]
        )
        age = m.gauge(
            m.METRICS_AGE, "Seconds since the worker's /metrics was last scraped.", ["worker"]
        )
        inflight = m.gauge(m.INFLIGHT, "Requests the gateway has in flight per worker.", ["worker"])
        breaker = m.gauge(
            m.BREAKER_OPEN, "1 when the worker's circuit breaker is open or half-open.", ["worker"]
        )
        for w in self.snapshot.workers:
            sub = self.subscribers.get(w.id)
            if sub is not None:
                lag.add_metric([w.id], sub.status.last_event_lag_s)
                state.add_metric([w.id, sub.current_state(now_s=now_s)], 1)
            else:
                state.add_metric([w.id, "none"], 1)
            scrape = self.scraper.states.get(w.id)
            a = metrics_age_s(scraped_at_s=scrape.scraped_at_s if scrape else None, now_s=now_s)
            age.add_metric([w.id], a if math.isfinite(a) else -1.0)
            inflight.add_metric([w.id], self.load.inflight(w.id)[0])
            breaker.add_metric(
                [w.id], 0 if self.breakers.state(w.id, now_s=now_s) == "closed" else 1
            )
        yield from (lag, state, age, inflight, breaker)
        # Read by telemetry's scrape_fleet for the dashboard's eviction rate.
        removed = m.counter(
            m.KV_BLOCKS_REMOVED, "BlockRemoved hashes applied per worker (evictions).", ["worker"]
        )
        for wid, sub in self.subscribers.items():
            removed.add_metric([wid], sub.status.blocks_removed)
        yield removed
        dropped = m.gauge(m.RECORDS_DROPPED, "Request records dropped (buffer full or sink down).")
        dropped.add_metric([], self.records.dropped)
        yield dropped
        snap_age = m.gauge(m.SNAPSHOT_AGE, "Seconds since the routing snapshot was last applied.")
        snap_age.add_metric(
            [], now_s - self.snapshot.loaded_at_s if self.snapshot.revision else -1.0
        )
        yield snap_age


def pick_arm(arms: tuple[Arm, ...], *, key: str) -> Arm:
    """The arm `key` hashes to, proportionally to the arms' shares (stable across processes)."""
    total = sum(max(0.0, a.share) for a in arms)
    if total <= 0:
        return arms[0]
    point = xxhash.xxh64_intdigest(key.encode()) / 2**64 * total
    acc = 0.0
    for arm in arms:
        acc += max(0.0, arm.share)
        if point < acc:
            return arm
    return arms[-1]


def no_worker(message: str, *, retry_after_s: float) -> GatewayError:
    return GatewayError(
        503,
        message,
        type="service_unavailable",
        code="no_routable_worker",
        headers={"retry-after": str(max(1, math.ceil(retry_after_s)))},
    )


def build_gateway_state(
    config: GatewayConfig | None = None,
    *,
    snapshot: Mapping[str, Any] | SnapshotSource | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    record_sink: MemorySink | RedisStreamSink | None = None,
    seed: int | None = None,
) -> GatewayState:
    """Wire a gateway. The snapshot comes from, in order: `snapshot` (a contract dict or an
    async callable returning one), `config.control_plane_url` (HTTP), else the control plane
    in this process (`controlplane.snapshot.routing_snapshot`, needs Django set up)."""
    config = config or GatewayConfig.from_env()
    httpx_log = logging.getLogger("httpx")
    if httpx_log.level == logging.NOTSET:
        # httpx logs every request at INFO: one line per proxied request is too much.
        httpx_log.setLevel(logging.WARNING)
    if isinstance(snapshot, Mapping):
        source: SnapshotSource = StaticSnapshotSource(snapshot)
    elif snapshot is not None:
        source = snapshot
    elif config.control_plane_url:
        source = HttpSnapshotSource(url=config.control_plane_url, token=config.control_plane_token)
    else:
        source = InProcessSnapshotSource()
    if transport is None and config.upstream_transport == "lean":
        transport = LeanTransport()
    return GatewayState(
        config=config,
        snapshot_source=source,
        transport=transport,
        record_sink=record_sink,
        seed=seed,
    )
