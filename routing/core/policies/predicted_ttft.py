"""predicted_ttft: estimate each candidate's time to first token in ms, pick the smallest."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

from routing.core.policies.base import (
    cache_phrase,
    impute_stale,
    make_decision,
    predicted_cached_tokens,
    rank,
    routable_candidates,
    stale_note,
    tie_breaks,
)
from routing.core.types import Decision, RequestFeatures, ScoreTerms, WorkerView


class PredictedTtft:
    """est_ttft_ms = queue_ms + prefill_ms + network_ms, per candidate; score = -est_ttft_ms.

    - queue_ms = max(in-flight prefill tokens x speed, waiting x `waiting_request_ms`)
      + running x `running_seq_ms`. The gateway's in-flight prefill and the scraped
      waiting queue are the same queue seen from two sides, so the larger counts, not the
      sum; running sequences share every step with our prefill and slow it down.
    - prefill_ms = uncached prompt tokens x speed, where uncached = prompt tokens minus the
      tokens the cached prefix will serve (the last prompt token is always recomputed).
    - network_ms = 2 x the worker's one-way network_ms (request out, first token back).

    speed is the worker's learned `prefill_ms_per_token` (EWMA from `LoadTracker`). A
    worker with no learned speed yet gets the median of the candidates' learned speeds
    (same model, usually same hardware), else this policy's `prefill_ms_per_token`:
    judging an unused worker by a prior slower than its peers' measured speed would keep
    it unused forever, since only traffic teaches its speed. With
    `temperature_ms` > 0 the pick is sampled with probability proportional to
    exp(-(est - best_est) / temperature_ms), spreading load among near-equal workers.
    """

    name = "predicted_ttft"

    def __init__(
        self,
        *,
        prefill_ms_per_token: float = 0.1,
        waiting_request_ms: float = 50.0,
        running_seq_ms: float = 0.5,
        temperature_ms: float = 0.0,
        stale_after_s: float = 5.0,
    ) -> None:
        self.prefill_ms_per_token = prefill_ms_per_token
        self.waiting_request_ms = waiting_request_ms
        self.running_seq_ms = running_seq_ms
        self.temperature_ms = temperature_ms
        self.stale_after_s = stale_after_s

    def prior_ms_per_token(self, workers: Sequence[WorkerView]) -> float:
        """Speed assumed for a worker with none learned: the median learned one, or the default."""
        learned = sorted(
            w.prefill_ms_per_token
            for w in workers
            if w.prefill_ms_per_token is not None and 0.0 <= w.prefill_ms_per_token < math.inf
        )
        if not learned:
            return self.prefill_ms_per_token
        mid = len(learned) // 2
        return learned[mid] if len(learned) % 2 else (learned[mid - 1] + learned[mid]) / 2.0

    def estimate(
        self,
        features: RequestFeatures,
        worker: WorkerView,
        blocks: int,
        *,
        prior_ms_per_token: float | None = None,
    ) -> dict[str, float]:
        """The TTFT estimate's parts in ms for `worker` holding `blocks` leading blocks."""
        speed = worker.prefill_ms_per_token
        if speed is None or not math.isfinite(speed) or speed < 0:
            speed = self.prefill_ms_per_token if prior_ms_per_token is None else prior_ms_per_token
        queue_ms = (
            max(
                max(0, worker.inflight_prefill_tokens) * speed,
                max(0, worker.waiting) * self.waiting_request_ms,
            )
            + max(0, worker.running) * self.running_seq_ms
        )
        uncached = max(0, features.prompt_tokens - predicted_cached_tokens(features, blocks))
        prefill_ms = uncached * speed
        network_ms = 2.0 * max(0.0, worker.network_ms)
        return {
            "est_ttft_ms": queue_ms + prefill_ms + network_ms,
            "queue_ms": queue_ms,
            "prefill_ms": prefill_ms,
            "network_ms": network_ms,
            "ms_per_token": speed,
        }

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
        tokens_per_block = max(1, features.block_size)
        usable_blocks = max(0, (features.prompt_tokens - 1) // tokens_per_block)
        n_blocks = len(features.block_keys)
        prompt_tokens = max(0, features.prompt_tokens)
        default_speed = self.prior_ms_per_token(views)
        waiting_ms, running_ms = self.waiting_request_ms, self.running_seq_ms
        scored: list[ScoreTerms] = []
        # The hot loop: `estimate` spelled out inline, no helper calls per candidate.
        for w in views:
            blocks = cached_blocks.get(w.id, 0)
            blocks = 0 if blocks <= 0 else (blocks if blocks < n_blocks else n_blocks)
            cached_tokens = (blocks if blocks < usable_blocks else usable_blocks) * tokens_per_block
            speed = w.prefill_ms_per_token
            if speed is None or not (0.0 <= speed < math.inf):
                speed = default_speed
            prefill_wait_ms = (
                w.inflight_prefill_tokens if w.inflight_prefill_tokens > 0 else 0
            ) * speed
            waiting_wait_ms = (w.waiting if w.waiting > 0 else 0) * waiting_ms
            queue_ms = (
                prefill_wait_ms if prefill_wait_ms > waiting_wait_ms else waiting_wait_ms
            ) + (w.running if w.running > 0 else 0) * running_ms
            uncached = prompt_tokens - cached_tokens
            prefill_ms = (uncached if uncached > 0 else 0) * speed
            network_ms = 2.0 * w.network_ms if w.network_ms > 0.0 else 0.0
            est_ms = queue_ms + prefill_ms + network_ms
            terms = {
                "est_ttft_ms": est_ms,
                "queue_ms": queue_ms,
                "prefill_ms": prefill_ms,
                "network_ms": network_ms,
                "ms_per_token": speed,
            }
            note = ""
            if w.id in stale:
                terms["stale"] = 1.0
                note = "stale metrics"
            scored.append(
                ScoreTerms(
                    worker_id=w.id,
                    score=-est_ms,
                    cached_blocks=blocks,
                    predicted_cached_tokens=cached_tokens,
                    terms=terms,
                    note=note,
                )
            )
        ranked = rank(scored, tie)
        sampled = ""
        if self.temperature_ms > 0 and len(ranked) > 1:
            chosen, p = self._sample(ranked, rng)
            if chosen.worker_id != ranked[0].worker_id:
                sampled = f"; sampled at temperature {self.temperature_ms:g} ms (p={p:.2f})"
            ranked = (chosen, *(s for s in ranked if s is not chosen))
        best = ranked[0]
        t = best.terms
        reason = (
            f"{best.worker_id}: est TTFT {t['est_ttft_ms']:.1f} ms (queue {t['queue_ms']:.1f}"
            f" + prefill {t['prefill_ms']:.1f} + network {t['network_ms']:.1f}), "
            f"{cache_phrase(features, best)}"
        )
        if len(ranked) > 1:
            runner = ranked[1]
            reason += f"; best of {len(ranked)}, next {runner.worker_id} at {-runner.score:.1f} ms"
        reason += sampled + stale_note(stale)
        return make_decision(self.name, features, ranked, reason)

    def _sample(
        self, ranked: tuple[ScoreTerms, ...], rng: random.Random
    ) -> tuple[ScoreTerms, float]:
        # Softmax over -est / T, walked in id order so the draw maps to the same worker
        # whatever order the candidates came in.
        best_score = ranked[0].score
        ordered = sorted(ranked, key=lambda s: s.worker_id)
        weights = [math.exp((s.score - best_score) / self.temperature_ms) for s in ordered]
        total = math.fsum(weights)
        u = rng.random() * total
        acc = 0.0
        for s, weight in zip(ordered, weights, strict=True):
            acc += weight
            if u < acc:
                return s, weight / total
        # Rounding left u past the last bucket: the best worker is the safe answer.
        return ranked[0], 1.0 / total
