"""The `Policy` protocol and the helpers every policy shares.

Invariants every policy keeps (tests/routing/core/test_policy_properties.py checks them):
it only picks a routable worker (healthy, not draining) serving the request's model,
raises `NoRoutableWorker` saying why when there is none, returns every routable
candidate in `Decision.ranked` (best first: the gateway retries in that order), and its
choice does not depend on the order the candidates are passed in. That last one is why
candidates are sorted by id first and ties are broken by draws from the injected RNG
taken in id order, never by list position.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import replace
from operator import attrgetter
from typing import Protocol

import xxhash

from routing.core.errors import NoRoutableWorker
from routing.core.types import Decision, RequestFeatures, ScoreTerms, WorkerView


class Policy(Protocol):
    """Picks one worker for a request and explains the choice."""

    name: str

    def decide(
        self,
        features: RequestFeatures,
        workers: Sequence[WorkerView],
        cached_blocks: Mapping[str, int],
        *,
        now_s: float,
        rng: random.Random,
    ) -> Decision:
        """Choose a worker.

        `cached_blocks` maps worker id -> leading blocks of `features.block_keys` cached
        there (from the prefix index; absent means 0). `now_s` is the caller's clock in
        seconds; `rng` is the only source of randomness.
        """
        ...


def routable_candidates(
    features: RequestFeatures, workers: Sequence[WorkerView]
) -> list[WorkerView]:
    """The routable workers serving `features.model`, sorted by id.

    Raises `NoRoutableWorker` naming the model, and how many workers were excluded.
    """
    model = features.model
    candidates = [w for w in workers if w.model == model and w.healthy and not w.draining]
    if not candidates:
        same_model = sum(1 for w in workers if w.model == model)
        if not same_model:
            raise NoRoutableWorker(f"no worker for model {model!r}")
        raise NoRoutableWorker(
            f"all {same_model} workers for model {model!r} are unhealthy or draining"
        )
    candidates.sort(key=_BY_ID)
    return candidates


_BY_ID = attrgetter("id")


def cached_count(
    features: RequestFeatures, cached_blocks: Mapping[str, int], worker_id: str
) -> int:
    """Leading blocks cached on `worker_id`, clamped to [0, number of request blocks]."""
    blocks = cached_blocks.get(worker_id, 0)
    if blocks <= 0:
        return 0
    return min(blocks, len(features.block_keys))


def predicted_cached_tokens(features: RequestFeatures, blocks: int) -> int:
    """Prompt tokens the engine will serve from cache given `blocks` leading cached blocks.

    vLLM always recomputes the last prompt token, so at most (prompt_tokens - 1) // block_size
    full blocks can be hits.
    """
    block_size = max(1, features.block_size)
    usable = max(0, (features.prompt_tokens - 1) // block_size)
    return min(max(0, blocks), usable) * block_size


def load_of(worker: WorkerView) -> int:
    """Outstanding requests on a worker: the larger of the gateway's own in-flight count and
    the worker's scraped running + waiting queues.

    Our in-flight requests appear in the scraped queues once scraped, so adding the two counts
    every request twice and makes a busy worker look twice as busy as it is (on traffic with
    no reuse that alone cost least_load 94 % and kv_score 24 % in mean TTFT against round
    robin in the offline simulator). The in-flight count is exact and current; the scrape is up
    to one interval old but also sees other gateways' requests: the maximum keeps both without
    counting ours twice.
    """
    return max(worker.inflight_requests, worker.running + worker.waiting)


def impute_stale(
    candidates: Sequence[WorkerView], *, stale_after_s: float
) -> tuple[list[WorkerView], dict[str, float]]:
    """Replace a stale worker's scraped signals by the worst the fresh candidates report.

    A worker whose metrics are old must not win just because its last scrape said it was
    idle, so its running, waiting and KV usage become at least the maximum among fresh
    candidates. When every candidate is stale nothing better is known and views are kept.
    Returns the (possibly replaced) views in the same order and {worker id: metrics age s}
    for the stale ones. In-flight fields are the gateway's own and always fresh.
    """
    # Inlined `is_stale`: this runs on every decision over every candidate.
    stale = {w.id: w.metrics_age_s for w in candidates if w.metrics_age_s > stale_after_s}
    if not stale or len(stale) == len(candidates):
        return list(candidates), stale
    fresh = [w for w in candidates if w.id not in stale]
    max_running = max(w.running for w in fresh)
    max_waiting = max(w.waiting for w in fresh)
    max_kv = max(w.kv_usage_frac for w in fresh)
    out = [
        replace(
            w,
            running=max(w.running, max_running),
            waiting=max(w.waiting, max_waiting),
            kv_usage_frac=max(w.kv_usage_frac, max_kv),
        )
        if w.id in stale
        else w
        for w in candidates
    ]
    return out, stale


def tie_breaks(candidates: Sequence[WorkerView], rng: random.Random) -> dict[str, float]:
    """One uniform draw per candidate, taken in id order: a tie-break that spreads ties
    across workers yet is fixed by the RNG seed and independent of candidate order."""
    ordered = sorted(w.id for w in candidates)
    return {worker_id: rng.random() for worker_id in ordered}


def rank(scored: Sequence[ScoreTerms], tie: Mapping[str, float]) -> tuple[ScoreTerms, ...]:
    """Sort best first by score, ties by `tie` (higher first), then by id."""
    return tuple(sorted(scored, key=lambda s: (-s.score, -tie.get(s.worker_id, 0.0), s.worker_id)))


def hrw_weight(key: str | int, worker_id: str) -> float:
    """Rendezvous (highest random weight) hash of `key` on `worker_id`, in [0, 1).

    Seedless and identical in every process, so every gateway replica agrees.
    """
    digest = xxhash.xxh3_64_intdigest(f"{key}\x1f{worker_id}".encode())
    return digest / 18446744073709551616.0


def stale_note(stale: Mapping[str, float]) -> str:
    """Reason fragment naming workers whose metrics were too old to trust."""
    if not stale:
        return ""
    parts = [
        f"{wid} ({age:.0f}s)" if age != float("inf") else f"{wid} (never)"
        for wid, age in sorted(stale.items())
    ]
    return "; stale metrics on " + ", ".join(parts) + " treated pessimistically"


def make_decision(
    policy: str,
    features: RequestFeatures,
    ranked: tuple[ScoreTerms, ...],
    reason: str,
) -> Decision:
    """A `Decision` for `ranked[0]`, carrying its predicted cached tokens."""
    best = ranked[0]
    return Decision(
        worker_id=best.worker_id,
        policy=policy,
        ranked=ranked,
        predicted_cached_tokens=best.predicted_cached_tokens,
        reason=reason,
    )


def plain_terms(
    features: RequestFeatures,
    cached_blocks: Mapping[str, int],
    worker: WorkerView,
    *,
    score: float,
    terms: dict[str, float],
    note: str = "",
) -> ScoreTerms:
    """ScoreTerms for `worker` with its cached blocks and predicted cached tokens filled."""
    blocks = cached_count(features, cached_blocks, worker.id)
    return ScoreTerms(
        worker_id=worker.id,
        score=score,
        cached_blocks=blocks,
        predicted_cached_tokens=predicted_cached_tokens(features, blocks),
        terms=terms,
        note=note,
    )


def cache_phrase(features: RequestFeatures, terms: ScoreTerms) -> str:
    """'37/40 blocks cached' for a reason string."""
    return f"{terms.cached_blocks}/{len(features.block_keys)} blocks cached"


__all__ = [
    "Policy",
    "cache_phrase",
    "cached_count",
    "hrw_weight",
    "impute_stale",
    "load_of",
    "make_decision",
    "plain_terms",
    "predicted_cached_tokens",
    "rank",
    "routable_candidates",
    "stale_note",
    "tie_breaks",
]
