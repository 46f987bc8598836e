"""session_affinity: a session's requests stick to one worker by rendezvous hashing."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import replace

from routing.core.policies.base import (
    cache_phrase,
    hrw_weight,
    make_decision,
    plain_terms,
    routable_candidates,
)
from routing.core.policies.least_load import LeastLoad
from routing.core.types import Decision, RequestFeatures, WorkerView

FALLBACKS = ("least_load", "rendezvous")


class SessionAffinity:
    """Rendezvous (HRW) hash of `features.session_key` over the model's workers.

    The hash runs over every worker of the model, routable or not, so a session's home
    does not move when another worker leaves. A request with no session key is routed by
    least_load. When the home worker is unhealthy or draining, `fallback` decides:
    "least_load" (default) routes by load, "rendezvous" takes the next worker in the
    session's hash order, which keeps the session sticky to a stand-in while the home is away.
    """

    name = "session_affinity"

    def __init__(self, *, fallback: str = "least_load", stale_after_s: float = 5.0) -> None:
        if fallback not in FALLBACKS:
            raise ValueError(f"fallback must be one of {FALLBACKS}, got {fallback!r}")
        self.fallback = fallback
        self._least_load = LeastLoad(stale_after_s=stale_after_s)

    def _fall_back(
        self,
        why: str,
        features: RequestFeatures,
        workers: Sequence[WorkerView],
        cached_blocks: Mapping[str, int],
        *,
        now_s: float,
        rng: random.Random,
    ) -> Decision:
        inner = self._least_load.decide(features, workers, cached_blocks, now_s=now_s, rng=rng)
        return replace(inner, policy=self.name, reason=f"{why}, least_load: {inner.reason}")

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
        key = features.session_key
        if not key:
            return self._fall_back(
                "no session key", features, workers, cached_blocks, now_s=now_s, rng=rng
            )
        weights = {w.id: hrw_weight(key, w.id) for w in workers if w.model == features.model}
        home = max(sorted(weights), key=weights.__getitem__)
        routable_ids = {w.id for w in candidates}
        if home not in routable_ids and self.fallback == "least_load":
            return self._fall_back(
                f"session home {home} is unhealthy or draining",
                features,
                workers,
                cached_blocks,
                now_s=now_s,
                rng=rng,
            )
        ordered = sorted(candidates, key=lambda w: (-weights[w.id], w.id))
        ranked = tuple(
            plain_terms(
                features,
                cached_blocks,
                w,
                score=weights[w.id],
                terms={"hrw": weights[w.id], "home": 1.0 if w.id == home else 0.0},
            )
            for w in ordered
        )
        best = ranked[0]
        if best.worker_id == home:
            how = "session home"
        else:
            how = f"stand-in while session home {home} is unhealthy or draining"
        reason = f"{best.worker_id}: {how} (rendezvous of {len(weights)}); {cache_phrase(features, best)}"
        return make_decision(self.name, features, ranked, reason)
