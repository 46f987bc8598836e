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
    predicted_cached_tokens,
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
        guarded: dict[str, int] = {}
        scored: list[ScoreTerms] = []
        for w, load in zip(views, loads, strict=True):
            blocks = cached_count(features, cached_blocks, w.id)
            cache = blocks / n_blocks if n_blocks else 0.0
            notes: list[str] = []
            if blocks and load - min_load > self.max_queue_imbalance:
                cache *= self.imbalance_cache_discount
                guarded[w.id] = load
                notes.append(
                    f"cache x{self.imbalance_cache_discount:g}: load {load} vs min {min_load}"
                )
            if w.id in stale:
                notes.append("stale metrics")
            terms = {
                "cache": cache * self.cache_weight,
                "queue": -(load / load_norm) * self.load_weight,
                "prefill": -(max(0, w.inflight_prefill_tokens) / prefill_norm)
                * self.prefill_weight,
                "kv_pressure": -min(1.0, max(0.0, w.kv_usage_frac)) * self.kv_pressure_weight,
                "network": -(max(0.0, w.network_ms) / network_norm) * self.network_weight,
            }
            score = (
                terms["cache"]
                + terms["queue"]
                + terms["prefill"]
                + terms["kv_pressure"]
                + terms["network"]
            )
            scored.append(
                ScoreTerms(
                    worker_id=w.id,
                    score=score,
                    cached_blocks=blocks,
                    predicted_cached_tokens=predicted_cached_tokens(features, blocks),
                    terms=terms,
                    note="; ".join(notes),
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
