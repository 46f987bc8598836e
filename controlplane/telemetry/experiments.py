"""A/B comparison of experiment arms: pure functions over per-request samples and
per-arm counters. The first arm is the control; every other arm is compared with it.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controlplane.telemetry import stats

STATS: tuple[tuple[str, float | None], ...] = (
    ("mean", None),
    ("p50", 50.0),
    ("p95", 95.0),
    ("p99", 99.0),
)
VERDICT_STAT = "p95"
MAX_SAMPLES_PER_ARM = 2000
CDF_POINTS = 200


@dataclass(frozen=True, slots=True)
class ArmData:
    """What one arm saw: sampled per-request TTFTs plus exact counters from rollups."""

    name: str
    ttft_ms: Sequence[float]
    requests: int
    errors: int
    hit_requests: int
    cached_known_requests: int
    actual_cached_tokens: int
    cached_known_prompt_tokens: int
    output_tokens: int
    duration_s: float
    version_id: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def _stat_of_sorted(ordered: Sequence[float], q: float | None) -> float:
    if q is None:
        return sum(ordered) / len(ordered)
    return stats.sorted_percentile(ordered, q)


def _bootstrap(values: Sequence[float], *, rng: random.Random, resamples: int) -> dict[str, list]:
    """Resample once per round and read every statistic from the same resample."""
    out: dict[str, list[float]] = {name: [] for name, _ in STATS}
    n = len(values)
    for _ in range(resamples):
        ordered = sorted(rng.choices(values, k=n))
        for name, q in STATS:
            out[name].append(_stat_of_sorted(ordered, q))
    return out


def _cdf(ordered: Sequence[float]) -> dict[str, list[float]]:
    n = len(ordered)
    if n == 0:
        return {"x": [], "y": []}
    step = max(1, n // CDF_POINTS)
    idx = list(range(step - 1, n, step))
    if idx[-1] != n - 1:
        idx.append(n - 1)
    return {"x": [ordered[i] for i in idx], "y": [(i + 1) / n for i in idx]}


def compare_arms(
    arms: Sequence[ArmData],
    *,
    rng: random.Random,
    resamples: int = 400,
    level: float = 0.95,
    min_n: int = 30,
) -> dict[str, Any]:
    """Per-arm statistics with bootstrap CIs, and each arm against the first (control).

    Returns a JSON-able dict: `arms` (list), `comparisons` (list, one per non-control
    arm), `verdict` (plain words about the best comparison), `winner` (arm name or None).
    """
    draws: dict[str, dict[str, list[float]]] = {}
    arm_out: list[dict[str, Any]] = []
    for arm in arms:
        values = list(arm.ttft_ms)
        if len(values) > MAX_SAMPLES_PER_ARM:
            values = rng.sample(values, MAX_SAMPLES_PER_ARM)
        ordered = sorted(values)
        body: dict[str, Any] = {
            "name": arm.name,
            "version_id": arm.version_id,
            "n": arm.requests,
            "n_sampled": len(arm.ttft_ms),
            "error_rate": stats.wilson_interval(arm.errors, arm.requests, level=level),
            "request_hit_rate": stats.wilson_interval(
                arm.hit_requests, arm.cached_known_requests, level=level
            ),
            "token_hit_rate": (
                arm.actual_cached_tokens / arm.cached_known_prompt_tokens
                if arm.cached_known_prompt_tokens
                else None
            ),
            "throughput_rps": arm.requests / arm.duration_s if arm.duration_s > 0 else None,
            "output_tokens_per_s": (
                arm.output_tokens / arm.duration_s if arm.duration_s > 0 else None
            ),
            "ttft_cdf": _cdf(ordered),
            **arm.extra,
        }
        if ordered:
            draws[arm.name] = _bootstrap(values, rng=rng, resamples=resamples)
            for name, q in STATS:
                body[f"ttft_{name}_ms"] = stats.interval_from_draws(
                    _stat_of_sorted(ordered, q), draws[arm.name][name], level=level
                )
        arm_out.append(body)

    comparisons: list[dict[str, Any]] = []
    control = arms[0] if arms else None
    for arm in arms[1:]:
        assert control is not None
        n_per_arm = min(len(control.ttft_ms), len(arm.ttft_ms))
        diff: stats.Interval | None = None
        c_draws, t_draws = draws.get(control.name), draws.get(arm.name)
        if c_draws and t_draws:
            c_est = _stat_of_sorted(sorted(control.ttft_ms), 95.0)
            t_est = _stat_of_sorted(sorted(arm.ttft_ms), 95.0)
            if c_est > 0:
                rel = [
                    (c - t) / c if c else 0.0
                    for c, t in zip(c_draws[VERDICT_STAT], t_draws[VERDICT_STAT], strict=True)
                ]
                diff = stats.interval_from_draws((c_est - t_est) / c_est, rel, level=level)
        hit_test = stats.two_proportion_test(
            successes_a=control.hit_requests,
            n_a=control.cached_known_requests,
            successes_b=arm.hit_requests,
            n_b=arm.cached_known_requests,
        )
        verdict = stats.verdict_text(
            metric="TTFT p95",
            control_arm=control.name,
            treatment_arm=arm.name,
            diff=diff,
            n_per_arm=n_per_arm,
            min_n=min_n,
        )
        winner = None
        if diff is not None and n_per_arm >= min_n:
            if diff.lo > 0:
                winner = arm.name
            elif diff.hi < 0:
                winner = control.name
        comparisons.append(
            {
                "control": control.name,
                "treatment": arm.name,
                "ttft_p95_rel_diff": diff,
                "hit_rate_test": hit_test,
                "hit_rate_significant": bool(hit_test and hit_test.p_value < 1.0 - level),
                "verdict": verdict,
                "winner": winner,
            }
        )

    decided = [c for c in comparisons if c["winner"]]
    best = max(
        decided,
        key=lambda c: abs(c["ttft_p95_rel_diff"].estimate),
        default=comparisons[0] if comparisons else None,
    )
    return _jsonable(
        {
            "arms": arm_out,
            "comparisons": comparisons,
            "verdict": best["verdict"] if best else "needs at least two arms",
            "winner": best["winner"] if best else None,
            "level": level,
            "resamples": resamples,
        }
    )


def _jsonable(v: Any) -> Any:
    if isinstance(v, stats.Interval | stats.ProportionTest):
        return v.to_dict()
    if isinstance(v, Mapping):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    return v
