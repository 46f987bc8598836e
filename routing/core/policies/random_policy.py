"""random: a uniformly random routable worker (a baseline for experiments)."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from routing.core.policies.base import (
    cache_phrase,
    make_decision,
    plain_terms,
    rank,
    routable_candidates,
    tie_breaks,
)
from routing.core.types import Decision, RequestFeatures, WorkerView


class RandomPolicy:
    """Ranks the routable workers by one RNG draw each (taken in id order) and picks the top."""

    name = "random"

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
        draws = tie_breaks(candidates, rng)
        scored = [
            plain_terms(features, cached_blocks, w, score=draws[w.id], terms={"draw": draws[w.id]})
            for w in candidates
        ]
        ranked = rank(scored, draws)
        best = ranked[0]
        reason = f"{best.worker_id}: random pick of {len(ranked)}; {cache_phrase(features, best)}"
        return make_decision(self.name, features, ranked, reason)
