"""least_load: the worker with the fewest outstanding requests, optionally power-of-two."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from routing.core.policies.base import (
    cache_phrase,
    impute_stale,
    load_of,
    make_decision,
    plain_terms,
    rank,
    routable_candidates,
    stale_note,
    tie_breaks,
)
from routing.core.types import Decision, RequestFeatures, ScoreTerms, WorkerView


class LeastLoad:
    """Picks the minimum of in-flight + running + waiting requests; ties broken by the RNG.

    With `power_of_two`, only two workers sampled with the RNG are compared (the classic
    "power of two choices": nearly as balanced, and replicas with the same stale view do
    not all pile onto the same idle worker). Stale workers are scored pessimistically.
    """

    name = "least_load"

    def __init__(self, *, power_of_two: bool = False, stale_after_s: float = 5.0) -> None:
        self.power_of_two = power_of_two
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
        sampled: set[str] | None = None
        if self.power_of_two and len(views) > 2:
            # rng.sample over the id-sorted list: which two are compared is fixed by the seed.
            sampled = {w.id for w in rng.sample(views, 2)}
        scored: list[ScoreTerms] = []
        for w in views:
            load = load_of(w)
            terms = {"load": float(load)}
            if w.id in stale:
                terms["stale"] = 1.0
            note = "" if sampled is None or w.id in sampled else "not sampled"
            scored.append(
                plain_terms(features, cached_blocks, w, score=-float(load), terms=terms, note=note)
            )
        ordered = rank(scored, tie)
        if sampled is not None:
            # The two sampled workers come first (the choice), the rest stay as retry order.
            ordered = tuple(s for s in ordered if s.worker_id in sampled) + tuple(
                s for s in ordered if s.worker_id not in sampled
            )
        best = ordered[0]
        how = (
            f"lower load of 2 sampled from {len(ordered)}"
            if sampled
            else f"least loaded of {len(ordered)}"
        )
        reason = (
            f"{best.worker_id}: load {best.terms['load']:.0f}, {how}; "
            f"{cache_phrase(features, best)}{stale_note(stale)}"
        )
        return make_decision(self.name, features, ordered, reason)
