"""round_robin: each model's routable workers in turn, in id order."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from routing.core.policies.base import cache_phrase, make_decision, plain_terms, routable_candidates
from routing.core.types import Decision, RequestFeatures, ScoreTerms, WorkerView


class RoundRobin:
    """Cycles through the routable workers sorted by id, one counter per model.

    The only stateful policy: the counter advances on every successful decision. Sorting
    by id makes the turn independent of the order the candidates arrive in; when the
    candidate set changes the rotation continues from the same counter.
    """

    name = "round_robin"

    def __init__(self) -> None:
        self._counters: dict[str, int] = {}

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
        n = len(candidates)
        turn = self._counters.get(features.model, 0)
        start = turn % n
        ranked: list[ScoreTerms] = []
        for position in range(n):
            worker = candidates[(start + position) % n]
            ranked.append(
                plain_terms(
                    features,
                    cached_blocks,
                    worker,
                    score=-float(position),
                    terms={"rotation": float(position)},
                )
            )
        self._counters[features.model] = turn + 1
        best = ranked[0]
        reason = (
            f"{best.worker_id}: turn {start + 1} of {n} in rotation; {cache_phrase(features, best)}"
        )
        return make_decision(self.name, features, tuple(ranked), reason)
