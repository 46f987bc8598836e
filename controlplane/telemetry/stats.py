"""Pure statistics for telemetry: mergeable latency histograms, percentile-bootstrap
intervals (the resampling itself is in `experiments`), a two-proportion z-test and the
plain-words verdict of an A/B comparison.

No Django here: plain data in, plain data out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# Log-spaced buckets: bucket i >= 1 holds values in [MIN_MS * GAMMA**(i-1), MIN_MS * GAMMA**i);
# bucket 0 holds everything below MIN_MS. GAMMA = 2**(1/16) bounds the relative error of a
# percentile read back from the buckets to about +-2.2 % (half a bucket, geometric).
HIST_MIN_MS = 0.1
HIST_GAMMA = 2.0 ** (1.0 / 16.0)
HIST_MAX_INDEX = 400  # 0.1 ms * GAMMA**400 ~ 3.5e6 ms: anything longer lands in the last bucket
_LOG_GAMMA = math.log(HIST_GAMMA)


def hist_index(value_ms: float) -> int:
    """Bucket index of one latency in milliseconds (monotone in the value)."""
    if not value_ms > HIST_MIN_MS:  # also catches NaN
        return 0
    idx = int(math.floor(math.log(value_ms / HIST_MIN_MS) / _LOG_GAMMA)) + 1
    return min(idx, HIST_MAX_INDEX)


def hist_bucket_value_ms(index: int) -> float:
    """Representative value of a bucket: the geometric middle of its bounds."""
    if index <= 0:
        return HIST_MIN_MS / 2.0
    return HIST_MIN_MS * HIST_GAMMA ** (index - 0.5)


def hist_add(hist: dict[str, int], value_ms: float, *, count: int = 1) -> dict[str, int]:
    """Add `count` observations of `value_ms` to a sparse histogram in place (and return it).

    Keys are bucket indexes as strings so the dict survives a JSON round trip unchanged.
    """
    key = str(hist_index(value_ms))
    hist[key] = hist.get(key, 0) + count
    return hist


def hist_from_values(values_ms: Iterable[float]) -> dict[str, int]:
    hist: dict[str, int] = {}
    for v in values_ms:
        hist_add(hist, v)
    return hist


def hist_merge(*hists: Mapping[str, int]) -> dict[str, int]:
    """Sum of histograms: merging minute buckets gives exactly the hour's histogram."""
    out: dict[str, int] = {}
    for h in hists:
        for k, c in h.items():
            out[str(k)] = out.get(str(k), 0) + int(c)
    return out


def hist_count(hist: Mapping[str, int]) -> int:
    return sum(int(c) for c in hist.values())


def hist_percentile(hist: Mapping[str, int], q: float) -> float | None:
    """The q-th percentile (q in [0, 100]) in ms, read from the buckets; None when empty.

    Uses the nearest-rank definition (the value below which ceil(q/100 * n) observations
    fall), reported as the middle of the bucket that holds it.
    """
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    n = hist_count(hist)
    if n == 0:
        return None
    rank = max(1, math.ceil(q / 100.0 * n))
    seen = 0
    for idx in sorted(int(k) for k in hist):
        seen += int(hist[str(idx)])
        if seen >= rank:
            return hist_bucket_value_ms(idx)
    return hist_bucket_value_ms(max(int(k) for k in hist))  # pragma: no cover - rank <= n


def percentile(values: Sequence[float], q: float) -> float | None:
    """Exact nearest-rank percentile of raw values (q in [0, 100]); None when empty."""
    if not values:
        return None
    return sorted_percentile(sorted(values), q)


def sorted_percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of already sorted, non-empty values."""
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return float(ordered[rank - 1])


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


@dataclass(frozen=True, slots=True)
class Interval:
    """A point estimate with a (lo, hi) confidence interval at `level` (e.g. 0.95)."""

    estimate: float
    lo: float
    hi: float
    level: float = 0.95

    def to_dict(self) -> dict[str, float]:
        return {"estimate": self.estimate, "lo": self.lo, "hi": self.hi, "level": self.level}


def interval_from_draws(estimate: float, draws: Sequence[float], *, level: float) -> Interval:
    """Percentile-bootstrap interval: `estimate` with the (1 - level) / 2 tails of `draws`."""
    ordered = sorted(draws)
    k = len(ordered)
    alpha = (1.0 - level) / 2.0
    return Interval(
        estimate=estimate,
        lo=ordered[int(alpha * (k - 1))],
        hi=ordered[int(math.ceil((1.0 - alpha) * (k - 1)))],
        level=level,
    )


def _normal_cdf(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


@dataclass(frozen=True, slots=True)
class ProportionTest:
    """Two-sided two-proportion z-test of successes_a/n_a vs successes_b/n_b."""

    p_a: float
    p_b: float
    z: float
    p_value: float

    def to_dict(self) -> dict[str, float]:
        return {"p_a": self.p_a, "p_b": self.p_b, "z": self.z, "p_value": self.p_value}


def two_proportion_test(
    *, successes_a: int, n_a: int, successes_b: int, n_b: int
) -> ProportionTest | None:
    """Pooled two-proportion z-test; None when either arm is empty."""
    if n_a <= 0 or n_b <= 0:
        return None
    p_a, p_b = successes_a / n_a, successes_b / n_b
    pooled = (successes_a + successes_b) / (n_a + n_b)
    se = math.sqrt(pooled * (1.0 - pooled) * (1.0 / n_a + 1.0 / n_b))
    if se == 0:
        return ProportionTest(p_a=p_a, p_b=p_b, z=0.0, p_value=1.0)
    z = (p_b - p_a) / se
    return ProportionTest(p_a=p_a, p_b=p_b, z=z, p_value=2.0 * (1.0 - _normal_cdf(abs(z))))


def wilson_interval(successes: int, n: int, *, level: float = 0.95) -> Interval | None:
    """Wilson score interval of a proportion (well behaved near 0 and 1)."""
    if n <= 0:
        return None
    z = _z_for_level(level)
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return Interval(estimate=p, lo=max(0.0, centre - half), hi=min(1.0, centre + half), level=level)


def _z_for_level(level: float) -> float:
    # Two-sided normal quantiles for the levels an operator actually picks.
    table = {0.8: 1.2816, 0.9: 1.6449, 0.95: 1.9600, 0.99: 2.5758}
    return table.get(round(level, 2), 1.96)


def requests_needed(*, n_per_arm: int, effect: float, interval: Interval) -> int:
    """Rough extra requests per arm until a CI of this width would exclude zero.

    CI half-width shrinks as 1/sqrt(n); we need it below |effect|. With no visible
    effect we size for a 5 % difference, the smallest one worth acting on here.
    """
    half_width = max((interval.hi - interval.lo) / 2.0, 1e-9)
    target = max(abs(effect), 0.05)
    needed_n = n_per_arm * (half_width / target) ** 2
    return max(0, math.ceil(needed_n - n_per_arm))


def verdict_text(
    *,
    metric: str,
    control_arm: str,
    treatment_arm: str,
    diff: Interval | None,
    n_per_arm: int,
    min_n: int = 30,
) -> str:
    """Plain-words verdict from a relative-difference CI (positive = treatment lower/faster).

    e.g. "B faster by 23 % TTFT p95, 95 % CI 15-31 %" or "not significant yet, need ~400
    more requests per arm".
    """
    level_pct = round((diff.level if diff else 0.95) * 100)
    if diff is None or n_per_arm < min_n:
        more = max(min_n - n_per_arm, 1)
        return f"not enough data yet, need ~{more} more requests per arm"
    lo_pct, hi_pct, est_pct = diff.lo * 100, diff.hi * 100, diff.estimate * 100
    if diff.lo > 0:
        return (
            f"{treatment_arm} faster by {est_pct:.0f} % {metric}, "
            f"{level_pct} % CI {lo_pct:.0f}-{hi_pct:.0f} %"
        )
    if diff.hi < 0:
        return (
            f"{control_arm} faster by {-est_pct:.0f} % {metric}, "
            f"{level_pct} % CI {-hi_pct:.0f}-{-lo_pct:.0f} %"
        )
    more = requests_needed(n_per_arm=n_per_arm, effect=diff.estimate, interval=diff)
    return (
        f"not significant yet ({metric} difference {est_pct:+.0f} %, {level_pct} % CI "
        f"{lo_pct:+.0f} to {hi_pct:+.0f} %), need ~{more} more requests per arm"
    )
