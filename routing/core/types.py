"""Value types shared by every layer: plain, frozen, slotted dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class WorkerView:
    """What a policy may know about one worker at decision time.

    `kv_usage_frac` is in [0, 1]; `metrics_age_s` is how old the scraped load
    signals are (inf when never scraped); `network_ms` is the configured one-way
    cost of reaching the worker from this gateway.
    """

    id: str
    url: str
    model: str
    healthy: bool = True
    draining: bool = False
    block_size: int = 16
    capacity_blocks: int = 0
    running: int = 0
    waiting: int = 0
    kv_usage_frac: float = 0.0
    inflight_prefill_tokens: int = 0
    inflight_requests: int = 0
    metrics_age_s: float = 0.0
    network_ms: float = 0.0
    prefill_ms_per_token: float | None = None

    @property
    def routable(self) -> bool:
        return self.healthy and not self.draining


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """What the gateway extracted from one request before routing it.

    `block_keys` are chained keys from `routing.core.blocks` (full blocks only);
    `prompt_tokens` counts every prompt token, partial last block included.
    """

    model: str
    block_keys: tuple[int, ...] = ()
    prompt_tokens: int = 0
    session_key: str | None = None
    tenant: str | None = None
    block_size: int = 16


@dataclass(frozen=True, slots=True)
class ScoreTerms:
    """One candidate's score, broken into the terms that produced it.

    `terms` maps a term name (e.g. "cache", "queue", "kv_pressure", "network",
    "est_ttft_ms") to its signed contribution; `score` is higher-is-better for
    every policy (predicted_ttft uses minus the estimated TTFT).
    """

    worker_id: str
    score: float
    cached_blocks: int = 0
    predicted_cached_tokens: int = 0
    terms: dict[str, float] = field(default_factory=dict)
    note: str = ""


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one routing decision, explaining itself.

    `ranked` lists every routable candidate best first (the retry order);
    `ranked[0].worker_id == worker_id` always holds.
    """

    worker_id: str
    policy: str
    ranked: tuple[ScoreTerms, ...]
    predicted_cached_tokens: int
    reason: str

    def to_dict(self, *, top: int | None = None) -> dict[str, object]:
        """JSON-able form; `top` keeps only the best `top` candidates (request records)."""
        ranked = self.ranked if top is None else self.ranked[:top]
        return {
            "worker": self.worker_id,
            "policy": self.policy,
            "predicted_cached_tokens": self.predicted_cached_tokens,
            "reason": self.reason,
            "candidates": [
                {
                    "worker": c.worker_id,
                    "score": round(c.score, 6),
                    "cached_blocks": c.cached_blocks,
                    "terms": {k: round(v, 6) for k, v in c.terms.items()},
                    **({"note": c.note} if c.note else {}),
                }
                for c in ranked
            ],
        }
