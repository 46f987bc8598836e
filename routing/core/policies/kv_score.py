"""kv_score: a weighted sum of cache benefit minus load, KV pressure and network cost."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from routing.core.policies.base import (
    cache_phrase,
    cached_count,
    impute_stale,
    load_of,
    make_decision,
    rank,
    routable_candidates,
    stale_note,
    tie_breaks,
)
from routing.core.types import Decision, RequestFeatures, ScoreTerms, WorkerView


class KvScore:
    """score = cache x cache_weight - queue x load_weight - prefill x prefill_weight
    - kv_usage x kv_pressure_weight - network x network_weight, every term in [0, 1].

    - cache: fraction of the request's blocks cached on the worker (leading prefix).
    - queue: outstanding requests / max(busiest candidate's, `load_scale`): relative when
      the fleet is busy, but one extra request on an idle fleet costs only 1/load_scale.
    - prefill: in-flight uncached prefill tokens / max(largest, `prefill_scale_tokens`).
    - kv_usage: the worker's KV-cache usage fraction (pressure: new blocks evict others).
    - network: network_ms / max(largest, `network_scale_ms`).

    Imbalance guard: a worker whose load exceeds the least-loaded candidate's by more than
    `max_queue_imbalance` gets its cache term multiplied by `imbalance_cache_discount`
    (0 = ignored), so a hot prefix cannot pile every request onto one queue.
    `ScoreTerms.terms` holds each signed contribution.
    """

    name = "kv_score"

    def __init__(
        self,
        *,
        cache_weight: float = 1.0,
        load_weight: float = 0.5,
        prefill_weight: float = 0.25,
        kv_pressure_weight: float = 0.1,
        network_weight: float = 0.1,
        load_scale: float = 8.0,
        prefill_scale_tokens: float = 8192.0,
        network_scale_ms: float = 10.0,
        max_queue_imbalance: float = 16.0,
        imbalance_cache_discount: float = 0.0,
        stale_after_s: float = 5.0,
    ) -> None:
        self.cache_weight = cache_weight
        self.load_weight = load_weight
        self.prefill_weight = prefill_weight
        self.kv_pressure_weight = kv_pressure_weight
        self.network_weight = network_weight
        self.load_scale = max(load_scale, 1e-9)
        self.prefill_scale_tokens = max(prefill_scale_tokens, 1e-9)
        self.network_scale_ms = max(network_scale_ms, 1e-9)
        self.max_queue_imbalance = max_queue_imbalance
        self.imbalance_cache_discount = imbalance_cache_discount
        self.stale_after_s = stale_after_s

    def decide(
        self,
        features: RequestFeatures,
        workers: Sequence[WorkerView],
        cached_blocks: Mapping[str, int],
        *,
        now_s: float,
        rng: random.Random,
    ) -> Decision:
        candidates = routable_candidates(features, workers)
        views, stale = impute_stale(candidates, stale_after_s=self.stale_after_s)
        tie = tie_breaks(views, rng)
        n_blocks = len(features.block_keys)
        loads = [load_of(w) for w in views]
        min_load = min(loads)
        load_norm = max(max(loads), self.load_scale)
        prefill_norm = max(max(w.inflight_prefill_tokens for w in views), self.prefill_scale_tokens)
        network_norm = max(max(w.network_ms for w in views), self.network_scale_ms)
        usable_blocks = max(0, (features.prompt_tokens - 1) // max(1, features.block_size))
        tokens_per_block = max(1, features.block_size)
        cache_w, discount = self.cache_weight, self.imbalance_cache_discount
        queue_k = self.load_weight / load_norm
        prefill_k = self.prefill_weight / prefill_norm
        kv_w = self.kv_pressure_weight
        network_k = self.network_weight / network_norm
        guard_load = min_load + self.max_queue_imbalance
        guarded: dict[str, int] = {}
        scored: list[ScoreTerms] = []
        # The hot loop of the gateway: plain arithmetic, no helper calls per candidate.
        for w, load in zip(views, loads, strict=True):
            blocks = cached_blocks.get(w.id, 0)
            blocks = 0 if blocks <= 0 else (blocks if blocks < n_blocks else n_blocks)
            cache = blocks / n_blocks if n_blocks else 0.0
            note = ""
            if blocks and load > guard_load:
                cache *= discount
                guarded[w.id] = load
                note = f"cache x{discount:g}: load {load} vs min {min_load}"
            if w.id in stale:
                note = f"{note}; stale metrics" if note else "stale metrics"
            kv = w.kv_usage_frac
            kv = 0.0 if kv <= 0.0 else (1.0 if kv >= 1.0 else kv)
            prefill_tokens = w.inflight_prefill_tokens if w.inflight_prefill_tokens > 0 else 0
            network_ms = w.network_ms if w.network_ms > 0.0 else 0.0
            c_cache = cache * cache_w
            c_queue = -load * queue_k
            c_prefill = -prefill_tokens * prefill_k
            c_kv = -kv * kv_w
            c_network = -network_ms * network_k
            scored.append(
                ScoreTerms(
                    worker_id=w.id,
                    score=c_cache + c_queue + c_prefill + c_kv + c_network,
                    cached_blocks=blocks,
                    predicted_cached_tokens=(blocks if blocks < usable_blocks else usable_blocks)
                    * tokens_per_block,
                    terms={
                        "cache": c_cache,
                        "queue": c_queue,
                        "prefill": c_prefill,
                        "kv_pressure": c_kv,
                        "network": c_network,
                    },
                    note=note,
                )
            )
        ranked = rank(scored, tie)
        best = ranked[0]
        by_id = dict(zip((w.id for w in views), loads, strict=True))
        if len(ranked) > 1:
            margin = f"best of {len(ranked)} by {best.score - ranked[1].score:.2f}"
        else:
            margin = "only candidate"
        reason = f"{best.worker_id}: {cache_phrase(features, best)}, load {by_id[best.worker_id]}; {margin}"
        if guarded:
            holder = max(
                sorted(guarded), key=lambda wid: cached_count(features, cached_blocks, wid)
            )
            verb = (
                "ignored"
                if self.imbalance_cache_discount == 0
                else f"discounted x{self.imbalance_cache_discount:g}"
            )
            reason += (
                f"; imbalance guard: cache on {holder} {verb} "
                f"(load {guarded[holder]} vs min {min_load}, limit {self.max_queue_imbalance:g})"
            )
        reason += stale_note(stale)
        return make_decision(self.name, features, ranked, reason)
