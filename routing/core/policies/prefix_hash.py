"""prefix_hash: consistent hashing on the prompt's first blocks, with bounded load."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import replace

from routing.core.policies.base import (
    cache_phrase,
    hrw_weight,
    impute_stale,
    load_of,
    make_decision,
    plain_terms,
    routable_candidates,
    stale_note,
)
from routing.core.policies.least_load import LeastLoad
from routing.core.types import Decision, RequestFeatures, ScoreTerms, WorkerView


class PrefixHash:
    """Rendezvous hash of the key of block `prefix_blocks` (or the last full block).

    Block keys are chained, so that one key stands for the whole leading prefix: requests
    sharing their first `prefix_blocks` blocks go to the same worker without consulting
    the index. Bounded load (consistent hashing with bounded loads): a worker is skipped
    when taking this request would push it past ceil((1 + load_epsilon) x mean load after
    the request); the least-loaded worker always fits, so someone always does. Prompts
    shorter than one block have nothing to hash and go to least_load.
    """

    name = "prefix_hash"

    def __init__(
        self, *, prefix_blocks: int = 8, load_epsilon: float = 0.25, stale_after_s: float = 5.0
    ) -> None:
        self.prefix_blocks = prefix_blocks
        self.load_epsilon = load_epsilon
        self.stale_after_s = stale_after_s
        self._least_load = LeastLoad(stale_after_s=stale_after_s)

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
        if not features.block_keys:
            inner = self._least_load.decide(features, workers, cached_blocks, now_s=now_s, rng=rng)
            return replace(
                inner,
                policy=self.name,
                reason=f"prompt under one block, least_load: {inner.reason}",
            )
        used = min(self.prefix_blocks, len(features.block_keys))
        key = features.block_keys[used - 1]
        views, stale = impute_stale(candidates, stale_after_s=self.stale_after_s)
        loads = {w.id: load_of(w) for w in views}
        total = sum(loads.values())
        cap = math.ceil((1.0 + self.load_epsilon) * (total + 1) / len(views))
        scored: list[ScoreTerms] = []
        for w in views:
            weight = hrw_weight(key, w.id)
            over = loads[w.id] + 1 > cap
            terms = {"hrw": weight, "load": float(loads[w.id]), "over_bound": 1.0 if over else 0.0}
            if w.id in stale:
                terms["stale"] = 1.0
            # Over-bound workers sort after every eligible one but keep their hash order.
            score = weight - 1.0 if over else weight
            note = f"load {loads[w.id]} + 1 over bound {cap}" if over else ""
            scored.append(
                plain_terms(features, cached_blocks, w, score=score, terms=terms, note=note)
            )
        ranked = tuple(sorted(scored, key=lambda s: (-s.score, s.worker_id)))
        best = ranked[0]
        skipped = [
            s.worker_id
            for s in ranked
            if s.terms["over_bound"] and s.terms["hrw"] > best.terms["hrw"]
        ]
        how = f"hash of first {used} blocks"
        if skipped:
            how += f", skipped {', '.join(skipped)} over load bound {cap}"
        reason = (
            f"{best.worker_id}: {how}; load {loads[best.worker_id]}, "
            f"{cache_phrase(features, best)}{stale_note(stale)}"
        )
        return make_decision(self.name, features, ranked, reason)
