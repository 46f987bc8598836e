"""Offline cluster simulator: N simulated engines in virtual time behind the real routing core.

The engines are ``workers.sim.engine.Engine`` (the same step model and profiles the simulated
HTTP workers run); in front of them sits what the gateway runs per request, from the real
``routing.core`` modules:

- features: chained block keys of the prompt (``routing.core.blocks``, engine block size);
- ``PrefixIndex.match`` over the precise layer, fed with every engine's KV events (the ops each
  step emits, exactly what the gateway decodes from the ZMQ stream) plus the approximate layer
  (``record_routed`` after each decision, capacity from the engine's usable blocks);
- ``LoadTracker`` (dispatch / first token / complete) annotating ``WorkerView``s whose scraped
  fields (running, waiting, KV usage) refresh every ``scrape_interval_s`` like the gateway's
  metrics scraper;
- the policy from ``routing.core.registry.build_policy`` deciding with an injected RNG.

Discrete events: arrivals (open loop: the requests' ``arrival_s``; closed loop: a client sends
its next request when its previous one finishes) and engine steps. An engine's step is run when
it starts and its outputs (tokens, finished requests, KV events) are applied at ``end_s``, so a
decision taken mid-step sees the state the gateway would see. Times are model seconds; the
reported latencies are model milliseconds (what a live run measures at time scale 1).
"""

from __future__ import annotations

import gc
import heapq
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from bench.report import RequestResult
from bench.workloads import BenchRequest
from routing.core.index import PrefixIndex
from routing.core.load import LoadTracker
from routing.core.registry import build_policy, validate_params
from routing.core.types import RequestFeatures, WorkerView
from workers.sim.engine import Engine, RequestRejected, StepResult
from workers.sim.profiles import PROFILES, EngineProfile

MODEL = "sim"

_ARRIVAL = 0
_STEP_DONE = 1
_KV = 2


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One simulated fleet and routing setup.

    ``max_model_len`` None: the profile's, raised to fit the longest request of the workload
    (an 8B model serves 128k contexts; profiles default to vLLM's 8k serving setting).
    ``scrape_interval_s`` mirrors the gateway's metrics period (KVROUTE_GATEWAY_METRICS_INTERVAL_S).
    ``kv_event_delay_s`` is the ZMQ publish -> index latency. ``concurrency`` switches to closed
    loop. ``approx_ttl_s`` is the index's approximate-layer lifetime.
    """

    engines: int = 8
    policy: str = "kv_score"
    params: Mapping[str, Any] = field(default_factory=dict)
    profile: str | EngineProfile = "h100-8b"
    seed: int = 0
    concurrency: int | None = None
    max_model_len: int | None = None
    num_blocks: int | None = None
    scrape_interval_s: float = 1.0
    kv_event_delay_s: float = 0.0
    approx_ttl_s: float = 120.0
    network_ms: float = 0.0


@dataclass(slots=True)
class SimOutput:
    results: list[RequestResult]
    virtual_s: float
    block_size: int
    per_engine_requests: list[int]
    events: int
    rejected: int
    predicted_cached_tokens: int


@dataclass(slots=True)
class _Live:
    req: BenchRequest
    worker: int
    sent_s: float
    prompt_tokens: int
    predicted_cached: int
    first_s: float | None = None
    last_s: float | None = None
    gaps_ms: list[float] = field(default_factory=list)
    client: int | None = None


def resolve_profile(profile: str | EngineProfile) -> EngineProfile:
    if isinstance(profile, EngineProfile):
        return profile
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; known: {sorted(PROFILES)}")
    return PROFILES[profile]


def simulate(requests: Sequence[BenchRequest], *, config: SimConfig) -> SimOutput:
    """Replay ``requests`` through ``config.engines`` engines behind ``config.policy``.

    Deterministic for fixed inputs. Raises ``routing.core.errors.InvalidPolicyParams`` on bad
    params and ValueError on a bad profile or an empty fleet.
    """
    # Millions of live block/index objects make every cyclic-GC pass expensive, and nothing here
    # builds reference cycles: collecting during the run cost more than the simulation itself.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _simulate(requests, config=config)
    finally:
        if gc_was_enabled:
            gc.enable()


def _simulate(requests: Sequence[BenchRequest], *, config: SimConfig) -> SimOutput:
    if config.engines < 1:
        raise ValueError("engines must be >= 1")
    prof = resolve_profile(config.profile)
    longest = max((r.prompt_tokens + r.max_tokens for r in requests), default=0)
    max_len = config.max_model_len or max(prof.max_model_len, longest)
    engines = [
        Engine(profile=prof, max_model_len=max_len, num_blocks=config.num_blocks, eos_range=None)
        for _ in range(config.engines)
    ]
    bs = engines[0].block_size
    ids = [f"sim-{i}" for i in range(config.engines)]
    params = validate_params(config.policy, dict(config.params))
    policy = build_policy(config.policy, params)
    rng = random.Random(config.seed)
    index = PrefixIndex(approx_ttl_s=config.approx_ttl_s, max_entries=4_000_000)
    for wid, eng in zip(ids, engines, strict=True):
        index.set_capacity(wid, eng.usable_blocks)
    tracker = LoadTracker()
    base_views = [
        WorkerView(
            id=wid,
            url=f"http://{wid}",
            model=MODEL,
            block_size=bs,
            capacity_blocks=eng.usable_blocks,
            network_ms=config.network_ms,
        )
        for wid, eng in zip(ids, engines, strict=True)
    ]
    views = list(base_views)
    scraped_at = -math.inf

    heap: list[tuple[float, int, int, int, Any]] = []
    seq = 0

    def push(t: float, kind: int, who: int, payload: Any) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, kind, seq, who, payload))

    stepping = [False] * len(engines)
    live: dict[str, _Live] = {}
    results: dict[str, RequestResult] = {}
    per_engine = [0] * len(engines)
    events_total = 0
    rejected = 0
    predicted_total = 0
    order = list(requests)
    next_idx = 0
    if config.concurrency:
        for c in range(min(config.concurrency, len(order))):
            push(0.0, _ARRIVAL, c, order[next_idx])
            next_idx += 1
    else:
        for req in order:
            if req.arrival_s is None:
                raise ValueError("open loop needs arrival_s on every request (or use concurrency)")
            push(req.arrival_s, _ARRIVAL, -1, req)
        next_idx = len(order)

    def start_step(i: int, t: float) -> None:
        eng = engines[i]
        nt = eng.next_step_time_s(now_s=t)
        if nt is None:
            stepping[i] = False
            return
        res = eng.step(now_s=nt)
        if res.duration_s <= 0.0 and eng.has_work():
            raise RuntimeError(f"engine {ids[i]} has work but scheduled nothing at t={nt}")
        stepping[i] = True
        push(res.end_s, _STEP_DONE, i, res)

    def next_for_client(client: int | None, t: float) -> None:
        nonlocal next_idx
        if client is None or next_idx >= len(order):
            return
        push(t, _ARRIVAL, client, order[next_idx])
        next_idx += 1

    now = 0.0
    while heap:
        now, kind, _, who, payload = heapq.heappop(heap)
        if kind == _ARRIVAL:
            r: BenchRequest = payload
            if now - scraped_at >= config.scrape_interval_s:
                scraped_at = now
                fresh = []
                for v, eng in zip(base_views, engines, strict=True):
                    st = eng.stats()
                    fresh.append(
                        replace(
                            v,
                            running=st.running,
                            waiting=st.waiting,
                            kv_usage_frac=st.kv_usage_frac,
                        )
                    )
                views = fresh
            age = now - scraped_at
            cur = [replace(v, metrics_age_s=age) for v in views] if age else views
            cur = tracker.annotate(cur, now_s=now)
            keys = r.block_keys(bs)
            n = r.prompt_tokens
            features = RequestFeatures(
                model=MODEL,
                block_keys=keys,
                prompt_tokens=n,
                session_key=r.session_key,
                tenant=r.tenant,
                block_size=bs,
            )
            cached = index.match(keys, now_s=now)
            decision = policy.decide(features, cur, cached, now_s=now, rng=rng)
            w = ids.index(decision.worker_id)
            try:
                engines[w].add_request(
                    request_id=r.request_id,
                    prompt_token_ids=r.token_ids(),
                    max_tokens=r.max_tokens,
                    arrival_s=now,
                    ignore_eos=True,
                )
            except RequestRejected as exc:
                rejected += 1
                results[r.request_id] = RequestResult(
                    request_id=r.request_id,
                    ok=False,
                    start_s=now,
                    prompt_tokens=n,
                    worker=decision.worker_id,
                    error=f"rejected: {exc}",
                )
                next_for_client(who if config.concurrency else None, now)
                continue
            tracker.dispatch(
                r.request_id,
                decision.worker_id,
                uncached_tokens=n - decision.predicted_cached_tokens,
                now_s=now,
            )
            index.record_routed(decision.worker_id, keys, now_s=now)
            predicted_total += decision.predicted_cached_tokens
            per_engine[w] += 1
            live[r.request_id] = _Live(
                req=r,
                worker=w,
                sent_s=now,
                prompt_tokens=n,
                predicted_cached=decision.predicted_cached_tokens,
                client=who if config.concurrency else None,
            )
            if not stepping[w]:
                start_step(w, now)
        elif kind == _KV:
            index.apply(ids[who], payload, now_s=now)
        else:
            res: StepResult = payload
            i = who
            if res.events:
                events_total += len(res.events)
                if config.kv_event_delay_s > 0:
                    push(now + config.kv_event_delay_s, _KV, i, res.events)
                else:
                    index.apply(ids[i], res.events, now_s=now)
            for tok in res.tokens:
                lv = live.get(tok.request_id)
                if lv is None:
                    continue
                if tok.first:
                    lv.first_s = now
                    tracker.first_token(tok.request_id, now_s=now)
                elif lv.last_s is not None:
                    lv.gaps_ms.append((now - lv.last_s) * 1000.0)
                lv.last_s = now
            for fin in res.finished:
                lv = live.pop(fin.request_id, None)
                if lv is None:
                    continue
                tracker.complete(fin.request_id, now_s=now)
                results[fin.request_id] = RequestResult(
                    request_id=fin.request_id,
                    ok=True,
                    start_s=lv.sent_s,
                    prompt_tokens=fin.prompt_tokens,
                    output_tokens=fin.output_tokens,
                    cached_tokens=fin.cached_tokens,
                    ttft_ms=((lv.first_s if lv.first_s is not None else now) - lv.sent_s) * 1000.0,
                    e2e_ms=(now - lv.sent_s) * 1000.0,
                    itl_ms=tuple(lv.gaps_ms),
                    worker=ids[i],
                )
                next_for_client(lv.client, now)
            start_step(i, now)

    ordered = [results[r.request_id] for r in order if r.request_id in results]
    return SimOutput(
        results=ordered,
        virtual_s=now,
        block_size=bs,
        per_engine_requests=per_engine,
        events=events_total,
        rejected=rejected,
        predicted_cached_tokens=predicted_total,
    )
