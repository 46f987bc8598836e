"""Channels HTTP consumers: the OpenAI-compatible surface and the gateway's own endpoints.

- `POST /v1/chat/completions`, `POST /v1/completions` (stream and non-stream)
- `GET /v1/models` (every model the routing snapshot knows)
- `GET /gateway/metrics` (Prometheus text), `GET /gateway/health` (JSON)

Each consumer gets the app's `GatewayHandle`; the handle builds the one `GatewayState`
on the serving event loop (lifespan startup, or the first request under a server without
lifespan). The request is served in a task so the consumer keeps listening: a client
disconnect cancels that task, which closes the upstream request and releases its
in-flight accounting.

Order of checks: gateway API key (401) -> body size (413) -> JSON/schema (400) -> model
(404) -> routing (503 with Retry-After) -> upstream (502 when every attempt failed).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from channels.exceptions import StopConsumer
from channels.generic.http import AsyncHttpConsumer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from routing.gateway.config import GatewayConfig
from routing.gateway.errors import GatewayError, error_body
from routing.gateway.proxy import Outcome, cached_tokens_of, proxy_request
from routing.gateway.state import GatewayState, build_gateway_state
from routing.gateway.tokenization import Encoded
from routing.gateway.validation import parse_request

log = logging.getLogger(__name__)

JSON = b"application/json"


# Request ids: a random per-process prefix and a counter (uuid4 reads the OS entropy pool on
# every call, a measurable cost per request); unique across gateway replicas in practice.
_ID_PREFIX = secrets.token_hex(6)
_ID_COUNTER = itertools.count(1)


def next_request_id() -> str:
    return f"gw-{_ID_PREFIX}-{next(_ID_COUNTER):x}"


class GatewayHandle:
    """The one gateway state an ASGI app holds, built and started on the serving loop."""

    def __init__(
        self,
        factory: Callable[[], GatewayState] | None = None,
        *,
        config: GatewayConfig | None = None,
    ) -> None:
        self.config = config or GatewayConfig.from_env(listen_channel_layer=True)
        self._factory = factory or (lambda: build_gateway_state(self.config))
        self.state: GatewayState | None = None
        self._lock: asyncio.Lock | None = None

    async def get(self) -> GatewayState:
        if self.state is not None and self.state.started:
            return self.state
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.state is None:
                self.state = self._factory()
                self.config = self.state.config
            if not self.state.started:
                await self.state.start()
        return self.state

    async def startup(self) -> None:
        await self.get()

    async def shutdown(self) -> None:
        if self.state is not None:
            await self.state.aclose()
            self.state = None
        self._lock = None


def check_api_key(config: GatewayConfig, headers: dict[str, str]) -> str | None:
    """The tenant of the request's gateway key; None when keys are off. Raises 401."""
    if not config.gateway_keys:
        return headers.get("x-tenant") or None
    auth = headers.get("authorization", "")
    key = auth[7:].strip() if auth.lower().startswith("bearer ") else headers.get("x-api-key", "")
    tenant = config.gateway_keys.get(key) if key else None
    if tenant is None:
        raise GatewayError(
            401,
            "Missing or invalid API key: send 'Authorization: Bearer <key>'.",
            type="authentication_error",
            code="invalid_api_key",
        )
    return tenant


class GatewayConsumer(AsyncHttpConsumer):  # type: ignore[misc]
    """Base: no channel layer (nothing here is addressed through one) and no per-message
    database housekeeping (the gateway never touches the ORM per request)."""

    allowed_methods: tuple[str, ...] = ("GET",)

    def __init__(self, *, handle: GatewayHandle) -> None:
        super().__init__()
        self.body: list[bytes] = []
        self.handle = handle
        self._task: asyncio.Task[None] | None = None
        self._size = 0
        self._too_large = False
        self._started_response = False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.scope = scope
        self.channel_layer = None
        self.base_send = send
        # One message source, so a plain loop: channels' await_many_dispatch makes a task and
        # an asyncio.wait per message to multiplex sources this consumer does not have.
        with contextlib.suppress(StopConsumer):
            while True:
                await self.dispatch(await receive())

    async def dispatch(self, message: dict[str, Any]) -> None:
        handler = getattr(self, message["type"].replace(".", "_"), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def send_headers(self, *, status: int = 200, headers: Any = None) -> None:
        self._started_response = True
        await super().send_headers(status=status, headers=headers)

    async def http_request(self, message: dict[str, Any]) -> None:
        chunk = message.get("body", b"")
        self._size += len(chunk)
        if self._size > self.handle.config.max_body_bytes:
            self._too_large = True
            self.body.clear()  # stop holding an oversized body in memory
        elif chunk:
            self.body.append(chunk)
        if message.get("more_body"):
            return
        # Serve in a task: this consumer must keep receiving to see a client disconnect.
        self._task = asyncio.get_running_loop().create_task(self._run(b"".join(self.body)))
        self.body = []

    async def http_disconnect(self, message: dict[str, Any]) -> None:
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        raise StopConsumer()

    def request_headers(self) -> dict[str, str]:
        return {
            k.decode("latin-1").lower(): v.decode("latin-1")
            for k, v in self.scope.get("headers", [])
        }

    async def send_json(
        self, status: int, doc: Any, *, headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        body = json.dumps(doc, separators=(",", ":")).encode()
        await self.send_headers(
            status=status,
            headers=[
                (b"content-type", JSON),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        )
        await self.send_body(body)

    async def send_error(self, exc: GatewayError) -> None:
        body = exc.body()
        headers = [(b"content-type", JSON), (b"content-length", str(len(body)).encode())] + [
            (k.encode(), v.encode()) for k, v in exc.headers.items()
        ]
        await self.send_headers(status=exc.status, headers=headers)
        await self.send_body(body)

    async def _run(self, body: bytes) -> None:
        try:
            method = self.scope.get("method", "GET")
            if method not in self.allowed_methods:
                raise GatewayError(
                    405,
                    f"Method {method} not allowed; use {', '.join(self.allowed_methods)}.",
                    code="method_not_allowed",
                    headers={"allow": ", ".join(self.allowed_methods)},
                )
            await self.serve(body)
        except GatewayError as exc:
            if not self._started_response:
                await self.send_error(exc)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("gateway request failed")
            if not self._started_response:
                await self.send_headers(status=500, headers=[(b"content-type", JSON)])
                await self.send_body(
                    error_body("internal gateway error", type="internal_error", code=500)
                )

    async def serve(self, body: bytes) -> None:
        raise NotImplementedError


class CompletionsConsumer(GatewayConsumer):
    allowed_methods = ("POST",)
    kind = "completions"

    async def serve(self, body: bytes) -> None:
        arrived_s = time.monotonic()
        ts_s = time.time()
        headers = self.request_headers()
        config = self.handle.config
        tenant = check_api_key(config, headers)
        if self._too_large:
            raise GatewayError(
                413,
                f"Request body is larger than {config.max_body_bytes} bytes.",
                code="request_too_large",
            )
        state = await self.handle.get()
        parsed = parse_request(body, kind=self.kind, max_tokens_limit=config.max_tokens_limit)
        try:
            workers = state.model_workers(parsed.model)
        except GatewayError:
            state.metrics.requests.labels("none", "none", "not_found").inc()
            raise
        request_id = headers.get("x-request-id") or next_request_id()
        # The session a request belongs to (sticky experiment arms, session_affinity): the
        # x-session-id header, else OpenAI's own end-user field.
        user = parsed.payload.get("user")
        session_key = headers.get("x-session-id") or (
            user if isinstance(user, str) and user else None
        )
        explain = headers.get("x-kvroute-explain", "") in ("1", "true", "yes")
        outcome = Outcome()
        plan = None
        overhead_us = 0.0
        try:
            if parsed.prompt_ids is not None:
                encoded = Encoded(parsed.prompt_ids, None, len(parsed.prompt_ids))
            else:
                url = next((w.url for w in workers if w.healthy), workers[0].url if workers else "")
                encoded = await state.encode(
                    model=parsed.model,
                    messages=parsed.messages,
                    text=parsed.prompt_text,
                    worker_url=url,
                )
            plan = state.plan(
                model=parsed.model,
                workers=workers,
                encoded=encoded,
                session_key=session_key,
                tenant=tenant,
                request_id=request_id,
                now_s=state.clock(),
            )
            overhead_us = (time.monotonic() - arrived_s) * 1e6
            state.metrics.routing_overhead.observe(overhead_us / 1e6)
            await proxy_request(
                state,
                plan=plan,
                parsed=parsed,
                request_id=request_id,
                arrived_s=arrived_s,
                explain=explain,
                send_headers=self._send_headers_pos,
                send_body=self._send_body_pos,
                outcome=outcome,
            )
        except GatewayError as exc:
            outcome.status, outcome.http_status = "error", exc.status
            raise
        finally:
            self._record(
                state,
                plan,
                parsed,
                outcome,
                request_id=request_id,
                ts_s=ts_s,
                arrived_s=arrived_s,
                overhead_us=overhead_us,
                tenant=tenant,
                session_key=session_key,
            )

    # The proxy's send callbacks write the ASGI messages channels' send_headers / send_body
    # would, without their layers: they run once per streamed chunk.
    async def _send_headers_pos(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self._started_response = True
        await self.base_send({"type": "http.response.start", "status": status, "headers": headers})

    async def _send_body_pos(self, body: bytes, more_body: bool) -> None:
        await self.base_send({"type": "http.response.body", "body": body, "more_body": more_body})

    def _record(
        self,
        state: GatewayState,
        plan: Any,
        parsed: Any,
        outcome: Outcome,
        *,
        request_id: str,
        ts_s: float,
        arrived_s: float,
        overhead_us: float,
        tenant: str | None,
        session_key: str | None,
    ) -> None:
        e2e_ms = (time.monotonic() - arrived_s) * 1000.0
        worker = outcome.worker_id or "none"
        policy_label = plan.policy_ref.label if plan is not None else "none"
        state.metrics.requests.labels(worker, policy_label, outcome.status).inc()
        usage = outcome.usage
        actual = cached_tokens_of(usage)
        if outcome.worker_id is not None and outcome.status == "ok":
            state.metrics.e2e.labels(worker).observe(e2e_ms / 1000.0)
            if outcome.ttft_ms is not None:
                state.metrics.ttft.labels(worker).observe(outcome.ttft_ms / 1000.0)
            state.metrics.predicted_cached.labels(worker).inc(outcome.predicted_cached_tokens)
            if actual is not None:
                state.metrics.actual_cached.labels(worker).inc(actual)
                state.metrics.prediction_error.labels(worker).observe(
                    abs(actual - outcome.predicted_cached_tokens)
                )
        if plan is None:
            return
        ref = plan.policy_ref
        candidates = plan.decision.to_dict(top=3)["candidates"]
        state.records.submit(
            {
                "request_id": request_id,
                "ts_s": ts_s,
                "model": plan.model,
                "tenant": tenant,
                "session_key": session_key,
                "worker_id": outcome.worker_id,
                "policy": ref.policy,
                "policy_version_id": ref.version_id,
                "policy_type": ref.type,
                "experiment_id": plan.experiment_id,
                "arm": plan.arm,
                "shadow": plan.shadow,
                "prompt_tokens": (usage or {}).get("prompt_tokens", plan.features.prompt_tokens),
                "predicted_cached_tokens": outcome.predicted_cached_tokens,
                "actual_cached_tokens": actual,
                "ttft_ms": round(outcome.ttft_ms, 3) if outcome.ttft_ms is not None else None,
                "e2e_ms": round(e2e_ms, 3),
                "output_tokens": (usage or {}).get("completion_tokens"),
                "status": outcome.status,
                "http_status": outcome.http_status,
                "retries": outcome.retries,
                "routing_overhead_us": round(overhead_us, 1),
                "stream": parsed.stream,
                "candidates": candidates,
                "reason": plan.decision.reason,
                # Lets telemetry's what-if replay the request's prefix sharing offline.
                "block_keys": list(plan.features.block_keys),
                "block_size": plan.features.block_size,
            }
        )


class ChatCompletionsConsumer(CompletionsConsumer):
    kind = "chat"


class ModelsConsumer(GatewayConsumer):
    async def serve(self, body: bytes) -> None:
        check_api_key(self.handle.config, self.request_headers())
        state = await self.handle.get()
        snap = state.snapshot
        data = [
            {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "kvroute",
                "workers": len(snap.by_model.get(name, ())),
            }
            for name in snap.model_names
        ]
        await self.send_json(200, {"object": "list", "data": data})


class MetricsConsumer(GatewayConsumer):
    async def serve(self, body: bytes) -> None:
        state = await self.handle.get()
        text = generate_latest(state.metrics.registry)
        await self.send_headers(
            status=200, headers=[(b"content-type", CONTENT_TYPE_LATEST.encode())]
        )
        await self.send_body(text)


class HealthConsumer(GatewayConsumer):
    async def serve(self, body: bytes) -> None:
        state = await self.handle.get()
        now_s = state.clock()
        workers = {}
        for view in state.views(state.snapshot.workers, now_s=now_s):
            sub = state.subscribers.get(view.id)
            workers[view.id] = {
                "model": view.model,
                "routable": view.routable,
                "draining": view.draining,
                "breaker": state.breakers.state(view.id, now_s=now_s),
                "kv_events": sub.current_state(now_s=now_s) if sub else "none",
                "metrics_age_s": view.metrics_age_s if view.metrics_age_s != float("inf") else None,
                "inflight_requests": view.inflight_requests,
            }
        loaded = bool(state.snapshot.revision) or bool(state.snapshot.workers)
        routable = any(w["routable"] for w in workers.values())
        doc = {
            "status": "ok" if loaded and routable else "degraded",
            "snapshot_revision": state.snapshot.revision,
            "snapshot_error": state.refresher.last_error or None,
            "workers": workers,
        }
        await self.send_json(200 if loaded else 503, doc)


class NotFoundConsumer(GatewayConsumer):
    allowed_methods = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")

    async def serve(self, body: bytes) -> None:
        raise GatewayError(404, f"No route for {self.scope.get('path')}", code="not_found")
