"""Send one routed request upstream and stream the answer back, measuring it on the way.

Before the first byte reaches the client nothing is committed: a connect error, a timeout,
a 5xx or a stream that ends before its first chunk marks the worker (circuit breaker) and
the next-ranked candidate is tried, at most `max_retries` times. After the first byte an
upstream failure ends the stream with an OpenAI-style error event. Cancellation (the client
went away) closes the upstream response, which makes the engine abort the request, and
releases the in-flight accounting.

Streaming requests always ask the worker for `stream_options.include_usage`, to learn the
actual cached tokens; the usage-only chunk is removed again when the client did not ask.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from routing.gateway.errors import GatewayError, sse_error_event
from routing.gateway.state import GatewayState, RoutePlan, no_worker
from routing.gateway.validation import ParsedRequest

SendHeaders = Callable[[int, list[tuple[bytes, bytes]]], Awaitable[None]]
SendBody = Callable[[bytes, bool], Awaitable[None]]

UPSTREAM_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


class SseFilter:
    """Passes complete SSE events through as they arrive; notes usage; drops the usage-only
    chunk when `strip_usage`. Only events that mention "usage" are parsed."""

    __slots__ = ("_buf", "strip_usage", "usage", "saw_done")

    def __init__(self, *, strip_usage: bool) -> None:
        self._buf = b""
        self.strip_usage = strip_usage
        self.usage: dict[str, Any] | None = None
        self.saw_done = False

    def feed(self, chunk: bytes) -> bytes:
        data = self._buf + chunk if self._buf else chunk
        end = data.rfind(b"\n\n")
        if end < 0:
            self._buf = data
            return b""
        complete, self._buf = data[: end + 2], data[end + 2 :]
        if b"[DONE]" in complete:
            self.saw_done = True
        if b'"usage"' not in complete:
            return complete
        out = []
        for event in complete.split(b"\n\n")[:-1]:
            if self._keep(event):
                out.append(event + b"\n\n")
        return b"".join(out)

    def _keep(self, event: bytes) -> bool:
        if not event.startswith(b"data:") or b'"usage"' not in event:
            return True
        try:
            obj = json.loads(event[5:])
        except ValueError:
            return True
        if not isinstance(obj, dict):
            return True
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
            if self.strip_usage and obj.get("choices") == []:
                return False
        return True

    def tail(self) -> bytes:
        rest, self._buf = self._buf, b""
        return rest


def cached_tokens_of(usage: dict[str, Any] | None) -> int | None:
    if not usage:
        return None
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        return int(details["cached_tokens"])
    return None


@dataclass(slots=True)
class Outcome:
    worker_id: str | None = None
    status: str = "error"
    http_status: int = 502
    ttft_ms: float | None = None
    usage: dict[str, Any] | None = None
    retries: int = 0
    predicted_cached_tokens: int = 0


def decision_headers(
    state: GatewayState, plan: RoutePlan, worker_id: str, *, explain: bool
) -> list[tuple[bytes, bytes]]:
    headers = [
        (b"x-kvroute-worker", worker_id.encode()),
        (b"x-kvroute-policy", plan.policy_ref.label.encode()),
        (
            b"x-kvroute-predicted-cached-tokens",
            str(plan.cached_tokens_by_worker.get(worker_id, 0)).encode(),
        ),
    ]
    if plan.arm is not None:
        headers.append((b"x-kvroute-arm", plan.arm.encode()))
    if explain:
        headers.append(
            (
                b"x-kvroute-decision",
                json.dumps(plan.decision.to_dict(), separators=(",", ":")).encode(),
            )
        )
    return headers


def _lean_request(
    state: GatewayState, url: str, content: bytes, headers: list[tuple[bytes, bytes]]
) -> httpx.Request:
    """What `client.build_request("POST", url, content=..., headers=...)` builds, without its
    per-request header merging and URL parsing: every header is given, host and length too."""
    urls = state.upstream_urls
    parsed_url = urls.get(url)
    if parsed_url is None:
        if len(urls) >= 4096:
            urls.clear()  # workers come and go; never let this grow without bound
        parsed_url = urls[url] = httpx.URL(url)
    return httpx.Request(
        "POST",
        parsed_url,
        headers=[
            (b"Host", parsed_url.netloc),
            *state.upstream_base_headers,
            *headers,
            (b"Content-Length", str(len(content)).encode()),
        ],
        stream=httpx.ByteStream(content),
        extensions=state.upstream_extensions,
    )


async def proxy_request(
    state: GatewayState,
    *,
    plan: RoutePlan,
    parsed: ParsedRequest,
    request_id: str,
    arrived_s: float,
    explain: bool,
    send_headers: SendHeaders,
    send_body: SendBody,
    outcome: Outcome,
) -> None:
    """Execute `plan`; fills `outcome` (also when cancelled). Raises GatewayError when no
    attempt got an answer and nothing was sent yet."""
    config = state.config
    clock = state.clock
    payload = parsed.payload
    if parsed.stream:
        payload = {
            **payload,
            "stream_options": {**(payload.get("stream_options") or {}), "include_usage": True},
        }
    content = json.dumps(payload, separators=(",", ":")).encode()
    path = UPSTREAM_PATHS[parsed.kind]
    # identity: the bytes are passed through as they come, so they must not be compressed.
    headers = {
        "content-type": "application/json",
        "x-request-id": request_id,
        "accept-encoding": "identity",
    }
    prompt_tokens = plan.features.prompt_tokens
    last_error = ""
    attempts = 0
    tried: list[str] = []

    for worker_id in plan.candidates:
        if attempts > config.max_retries:
            break
        now_s = clock()
        if not state.breakers.allows(worker_id, now_s=now_s):
            continue
        attempts += 1
        tried.append(worker_id)
        state.breakers.on_attempt(worker_id, now_s=now_s)
        spec = plan.workers[worker_id]
        predicted = plan.cached_tokens_by_worker.get(worker_id, 0)
        keys = plan.keys_by_worker.get(worker_id, ())
        state.load.dispatch(
            request_id, worker_id, uncached_tokens=max(0, prompt_tokens - predicted), now_s=now_s
        )
        # Speculative: keeps a burst of one prefix together before the engine's events arrive.
        state.index.record_routed(worker_id, keys, now_s=now_s)
        sub = state.subscribers.get(worker_id)
        if sub is not None and keys and predicted < len(keys) * spec.block_size:
            sub.note_dispatch(now_s=now_s)
        outcome.worker_id = worker_id
        outcome.predicted_cached_tokens = predicted
        resp: httpx.Response | None = None
        committed = False
        try:
            try:
                if state.lean_transport is not None:
                    # The same headers; the id encoded as httpx would (ascii, else it raises).
                    lean_headers = [
                        (b"content-type", b"application/json"),
                        (b"x-request-id", request_id.encode("ascii")),
                        (b"accept-encoding", b"identity"),
                    ]
                    request = _lean_request(state, spec.url + path, content, lean_headers)
                    resp = await state.lean_transport.handle_async_request(request)
                    resp.request = request
                else:
                    request = state.client.build_request(
                        "POST", spec.url + path, content=content, headers=headers
                    )
                    resp = await state.client.send(request, stream=True)
                if resp.status_code >= 500:
                    raise _Retryable(f"HTTP {resp.status_code}", "http_5xx")
                if resp.status_code != 200:
                    # The worker judged the request itself bad: pass its answer on, no retry.
                    body = await resp.aread()
                    state.breakers.on_success(worker_id)
                    committed = True
                    outcome.status, outcome.http_status = "error", resp.status_code
                    await send_headers(
                        resp.status_code,
                        [
                            (
                                b"content-type",
                                resp.headers.get("content-type", "application/json").encode(),
                            ),
                            *decision_headers(state, plan, worker_id, explain=explain),
                        ],
                    )
                    await send_body(body, False)
                    state.load.fail(request_id, now_s=clock())
                    return
                if parsed.stream:
                    # The lean transport's body directly: aiter_raw's per-chunk layers (byte
                    # counting, a context manager per chunk) add nothing here.
                    lean_body = resp.extensions.get("kvroute_body")
                    chunks = lean_body.__aiter__() if lean_body is not None else resp.aiter_raw()
                    first = b""
                    while not first:
                        first = await chunks.__anext__()
                else:
                    body = await resp.aread()
            except StopAsyncIteration:
                raise _Retryable("stream ended before its first byte", "empty") from None
            except httpx.TimeoutException as exc:
                raise _Retryable(f"timeout: {type(exc).__name__}", "timeout") from None
            except httpx.HTTPError as exc:
                raise _Retryable(f"{type(exc).__name__}: {exc}", "connect") from None
        except _Retryable as exc:
            last_error = f"{worker_id}: {exc.message}"
            state.load.fail(request_id, now_s=clock())
            state.breakers.on_failure(worker_id, now_s=clock())
            state.metrics.retries.labels(worker_id, exc.reason).inc()
            if resp is not None:
                await resp.aclose()
            continue
        except BaseException:
            # Cancelled (client gone) before anything was committed: says nothing about
            # the worker, but a half-open probe slot must be given back.
            state.breakers.release_probe(worker_id)
            state.load.fail(request_id, now_s=clock())
            if resp is not None:
                await resp.aclose()
            outcome.status = "client_disconnect"
            outcome.http_status = 499
            raise
        finally:
            if not committed:
                outcome.retries = max(0, attempts - 1)

        state.breakers.on_success(worker_id)
        outcome.retries = attempts - 1
        out_headers = decision_headers(state, plan, worker_id, explain=explain)
        if not parsed.stream:
            try:
                state.load.complete(request_id, now_s=clock())
                try:
                    answer = json.loads(body)
                    outcome.usage = answer.get("usage") if isinstance(answer, dict) else None
                except ValueError:
                    outcome.usage = None
                outcome.status, outcome.http_status = "ok", 200
                await send_headers(
                    200,
                    [
                        (
                            b"content-type",
                            resp.headers.get("content-type", "application/json").encode(),
                        ),
                        (b"content-length", str(len(body)).encode()),
                        *out_headers,
                    ],
                )
                await send_body(body, False)
            except BaseException:
                outcome.status, outcome.http_status = "client_disconnect", 499
                raise
            finally:
                await resp.aclose()
            return
        await _stream(
            state,
            resp,
            chunks,
            first,
            parsed=parsed,
            request_id=request_id,
            arrived_s=arrived_s,
            headers=out_headers,
            send_headers=send_headers,
            send_body=send_body,
            outcome=outcome,
        )
        return

    now_s = clock()
    if not tried:
        raise no_worker(
            "every worker for this model is marked failing (circuit open)",
            retry_after_s=state.breakers.retry_after_s(plan.candidates, now_s=now_s),
        )
    raise GatewayError(
        502,
        f"no worker answered after {attempts} attempt(s); last error: {last_error}",
        type="upstream_error",
        code="upstream_unavailable",
        headers={"retry-after": "1"},
    )


async def _stream(
    state: GatewayState,
    resp: httpx.Response,
    chunks: Any,
    first: bytes,
    *,
    parsed: ParsedRequest,
    request_id: str,
    arrived_s: float,
    headers: list[tuple[bytes, bytes]],
    send_headers: SendHeaders,
    send_body: SendBody,
    outcome: Outcome,
) -> None:
    clock = state.clock
    sse = SseFilter(strip_usage=not parsed.client_wants_usage)
    finished = False
    try:
        await send_headers(
            200,
            [
                (b"content-type", b"text/event-stream; charset=utf-8"),
                (b"cache-control", b"no-cache"),
                *headers,
            ],
        )
        state.load.first_token(request_id, now_s=clock())
        outcome.status, outcome.http_status = "ok", 200
        # The lean transport says when the upstream body has ended with the chunk just read:
        # the last chunk and the end of the answer then go out in one write, not two.
        body = resp.extensions.get("kvroute_body")
        ended = False
        out = sse.feed(first)
        if body is not None and body.at_end:
            ended = True
            await send_body(out + sse.tail(), False)
        elif out:
            await send_body(out, True)
        outcome.ttft_ms = (clock() - arrived_s) * 1000.0
        try:
            async for chunk in chunks:
                out = sse.feed(chunk)
                if body is not None and body.at_end:
                    ended = True
                    await send_body(out + sse.tail(), False)
                elif out:
                    await send_body(out, True)
        except httpx.HTTPError as exc:
            state.breakers.on_failure(outcome.worker_id or "", now_s=clock())
            outcome.status = "error"
            await send_body(
                sse.tail() + sse_error_event(f"upstream stream broke: {type(exc).__name__}: {exc}"),
                False,
            )
            state.load.fail(request_id, now_s=clock())
            finished = True
            return
        if not ended:
            await send_body(sse.tail(), False)
        state.load.complete(request_id, now_s=clock())
        finished = True
    except BaseException:
        if not finished:
            outcome.status, outcome.http_status = "client_disconnect", 499
            state.load.fail(request_id, now_s=clock())
        raise
    finally:
        outcome.usage = sse.usage
        await resp.aclose()


class _Retryable(Exception):
    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
