"""HTTP load generator for any OpenAI-compatible endpoint (gateway, one worker, another router).

Every request is sent to ``/v1/completions`` with the prompt as a token-id list, ``stream``
on and ``stream_options.include_usage`` so TTFT, inter-token gaps and the server's
``usage.prompt_tokens_details.cached_tokens`` are all measured on the same response.

Open loop: each request is sent at its ``arrival_s`` offset (trace timestamps / speed, or
Poisson arrivals), whether or not earlier ones finished. Closed loop: ``concurrency``
clients each send their next request as soon as the previous one ends.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import httpx

from bench.report import RequestResult
from bench.workloads import BenchRequest

# Response headers a router may use to say which worker served the request.
WORKER_HEADERS = ("x-kvroute-worker", "x-worker-id", "x-served-by")


@dataclass(frozen=True, slots=True)
class Target:
    """Where to send: base URL (no trailing /v1), model name, optional bearer key, and the
    prompt format ("tokens" or "text", see ``request_body``)."""

    base_url: str
    model: str
    api_key: str | None = None
    timeout_s: float = 600.0
    prompt_format: str = "tokens"


async def discover_model(
    base_url: str, *, api_key: str | None = None, timeout_s: float = 10.0
) -> str:
    """The first model id ``GET /v1/models`` lists; raises RuntimeError when there is none."""
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        resp = await client.get(base_url.rstrip("/") + "/v1/models", headers=headers)
        resp.raise_for_status()
        data = resp.json().get("data") or []
    if not data:
        raise RuntimeError(f"{base_url}/v1/models lists no model; pass --model")
    return str(data[0]["id"])


def token_word(token_id: int) -> str:
    """A token id as one letters-only word (" q" + base-26): the builtin tokenizer encodes each
    such word to exactly one token, so a text prompt keeps the token prompt's block structure."""
    letters = ""
    t = token_id
    while True:
        letters = chr(97 + t % 26) + letters
        t //= 26
        if not t:
            return " q" + letters


def prompt_text(req: BenchRequest) -> str:
    return "".join(map(_WORDS.__getitem__, req.token_ids()))


_WORDS = tuple(token_word(t) for t in range(1 << 15))


def request_body(
    req: BenchRequest, *, model: str, stream: bool = True, prompt_format: str = "tokens"
) -> dict[str, object]:
    """``prompt_format``: "tokens" (a token-id list) or "text" (``prompt_text``, for routers
    that only accept string prompts)."""
    body: dict[str, object] = {
        "model": model,
        "prompt": req.token_ids() if prompt_format == "tokens" else prompt_text(req),
        "max_tokens": req.max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if req.session_key:
        body["user"] = req.session_key
    return body


async def send_one(
    client: httpx.AsyncClient, req: BenchRequest, *, target: Target, t0: float
) -> RequestResult:
    """Send one streaming completion and time it; never raises (errors become ok=False)."""
    headers = {"content-type": "application/json"}
    if target.api_key:
        headers["authorization"] = f"Bearer {target.api_key}"
    if req.session_key:
        headers["x-session-id"] = req.session_key
    payload = json.dumps(
        request_body(req, model=target.model, prompt_format=target.prompt_format),
        separators=(",", ":"),
    )
    start = time.perf_counter()
    first: float | None = None
    last: float | None = None
    gaps: list[float] = []
    chunks = 0
    usage: dict[str, Any] | None = None
    worker: str | None = None
    try:
        async with client.stream(
            "POST",
            target.base_url.rstrip("/") + "/v1/completions",
            content=payload,
            headers=headers,
        ) as resp:
            for h in WORKER_HEADERS:
                if h in resp.headers:
                    worker = resp.headers[h]
                    break
            if resp.status_code != 200:
                body = (await resp.aread())[:300].decode("utf-8", "replace")
                return _failed(req, start - t0, f"HTTP {resp.status_code}: {body}", start)
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    chunk = json.loads(data)
                except json.JSONDecodeError:
                    return _failed(req, start - t0, f"bad SSE chunk: {data[:100]}", start)
                if "error" in chunk and not chunk.get("choices"):
                    return _failed(
                        req, start - t0, f"stream error: {str(chunk['error'])[:200]}", start
                    )
                if chunk.get("usage"):
                    usage = chunk["usage"]
                if chunk.get("choices"):
                    now = time.perf_counter()
                    if first is None:
                        first = now
                    elif last is not None:
                        gaps.append((now - last) * 1000.0)
                    last = now
                    chunks += 1
    except (httpx.HTTPError, OSError) as exc:
        return _failed(req, start - t0, f"{type(exc).__name__}: {exc}", start)
    end = time.perf_counter()
    if first is None:
        return _failed(req, start - t0, "no token streamed", start)
    cached: int | None = None
    out_tokens = chunks
    prompt_tokens = req.prompt_tokens
    if usage:
        details = usage.get("prompt_tokens_details") or {}
        if isinstance(details, dict) and details.get("cached_tokens") is not None:
            cached = int(details["cached_tokens"])
        out_tokens = int(usage.get("completion_tokens") or chunks)
        prompt_tokens = int(usage.get("prompt_tokens") or prompt_tokens)
    return RequestResult(
        request_id=req.request_id,
        ok=True,
        start_s=start - t0,
        prompt_tokens=prompt_tokens,
        output_tokens=out_tokens,
        cached_tokens=cached,
        ttft_ms=(first - start) * 1000.0,
        e2e_ms=(end - start) * 1000.0,
        itl_ms=tuple(gaps),
        worker=worker,
    )


def _failed(req: BenchRequest, start_s: float, error: str, start: float) -> RequestResult:
    return RequestResult(
        request_id=req.request_id,
        ok=False,
        start_s=start_s,
        prompt_tokens=req.prompt_tokens,
        e2e_ms=(time.perf_counter() - start) * 1000.0,
        error=error,
    )


def _client(target: Target, *, connections: int) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(timeout=httpx.Timeout(target.timeout_s, connect=10.0), limits=limits)


async def run_open_loop(
    requests: Sequence[BenchRequest], *, target: Target, max_inflight: int = 512
) -> tuple[list[RequestResult], float]:
    """Send each request at its ``arrival_s``; returns (results in request order, wall seconds).

    ``max_inflight`` bounds open connections; when reached, later sends wait (and their
    measured TTFT starts when they are actually sent).
    """
    if any(r.arrival_s is None for r in requests):
        raise ValueError("open loop needs arrival_s on every request")
    sem = asyncio.Semaphore(max_inflight)
    async with _client(target, connections=max_inflight) as client:
        t0 = time.perf_counter()

        async def fire(r: BenchRequest) -> RequestResult:
            delay = (r.arrival_s or 0.0) - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            async with sem:
                return await send_one(client, r, target=target, t0=t0)

        results = await asyncio.gather(*(fire(r) for r in requests))
        return list(results), time.perf_counter() - t0


async def run_closed_loop(
    requests: Sequence[BenchRequest], *, target: Target, concurrency: int
) -> tuple[list[RequestResult], float]:
    """``concurrency`` clients drain ``requests`` in order; returns (results in order, wall s)."""
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    results: list[RequestResult | None] = [None] * len(requests)
    cursor = 0
    async with _client(target, connections=concurrency) as client:
        t0 = time.perf_counter()

        async def worker() -> None:
            nonlocal cursor
            while cursor < len(requests):
                i = cursor
                cursor += 1
                results[i] = await send_one(client, requests[i], target=target, t0=t0)

        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(requests)))))
        wall = time.perf_counter() - t0
    return [r for r in results if r is not None], wall


async def run_load(
    requests: Sequence[BenchRequest],
    *,
    target: Target,
    concurrency: int | None = None,
    max_inflight: int = 512,
    time_scale: float = 1.0,
) -> tuple[list[RequestResult], float]:
    """Closed loop when ``concurrency`` is given, else open loop on the requests' arrivals.

    ``time_scale``: the target's simulated workers run every model duration x time_scale
    (``python -m workers.sim --time-scale``). Arrivals are compressed by it and the measured
    times divided by it, so results are in model milliseconds, comparable with the offline
    simulator and with an unscaled fleet. Returns (results, wall seconds).
    """
    if time_scale <= 0:
        raise ValueError("time_scale must be positive")
    if concurrency:
        results, wall = await run_closed_loop(requests, target=target, concurrency=concurrency)
    else:
        if time_scale != 1.0:
            requests = [replace(r, arrival_s=(r.arrival_s or 0.0) * time_scale) for r in requests]
        results, wall = await run_open_loop(requests, target=target, max_inflight=max_inflight)
    if time_scale != 1.0:
        results = [unscale(r, time_scale=time_scale) for r in results]
    return results, wall


def unscale(r: RequestResult, *, time_scale: float) -> RequestResult:
    """Wall-clock measurements of a time-scaled run -> model time."""
    return replace(
        r,
        start_s=r.start_s / time_scale,
        ttft_ms=r.ttft_ms / time_scale,
        e2e_ms=r.e2e_ms / time_scale,
        itl_ms=tuple(g / time_scale for g in r.itl_ms),
    )
