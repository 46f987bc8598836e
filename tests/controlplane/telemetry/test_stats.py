from __future__ import annotations

import random

import pytest

from controlplane.telemetry import experiments, stats


def test_histogram_percentiles_match_exact_within_bucket_error() -> None:
    rng = random.Random(7)
    values = [rng.lognormvariate(5.0, 0.8) for _ in range(5000)]
    hist = stats.hist_from_values(values)
    assert stats.hist_count(hist) == 5000
    for q in (50, 95, 99):
        exact = stats.percentile(values, q)
        approx = stats.hist_percentile(hist, q)
        assert exact is not None and approx is not None
        # Half a bucket either way: GAMMA**0.5 - 1 ~ 2.2 %.
        assert abs(approx - exact) / exact < 0.023, (q, approx, exact)


def test_known_values_land_in_the_right_buckets() -> None:
    hist = stats.hist_from_values([10.0] * 50 + [100.0] * 45 + [1000.0] * 5)
    assert stats.hist_percentile(hist, 50) == pytest.approx(10.0, rel=0.023)
    assert stats.hist_percentile(hist, 95) == pytest.approx(100.0, rel=0.023)
    assert stats.hist_percentile(hist, 96) == pytest.approx(1000.0, rel=0.023)
    assert stats.hist_percentile({}, 50) is None
    with pytest.raises(ValueError):
        stats.hist_percentile(hist, 101)


def test_merged_minutes_equal_the_hour() -> None:
    rng = random.Random(1)
    minutes = [[rng.uniform(5, 500) for _ in range(100)] for _ in range(60)]
    merged = stats.hist_merge(*(stats.hist_from_values(m) for m in minutes))
    whole = stats.hist_from_values([v for m in minutes for v in m])
    assert merged == whole
    assert stats.hist_percentile(merged, 99) == stats.hist_percentile(whole, 99)


def test_tiny_and_huge_values_are_clamped_not_lost() -> None:
    hist = stats.hist_from_values([0.0, 1e-9, 1e12])
    assert stats.hist_count(hist) == 3
    assert stats.hist_index(1e12) == stats.HIST_MAX_INDEX
    assert stats.hist_index(0.0) == 0


def test_two_proportion_test() -> None:
    same = stats.two_proportion_test(successes_a=500, n_a=1000, successes_b=505, n_b=1000)
    assert same is not None and same.p_value > 0.5
    diff = stats.two_proportion_test(successes_a=400, n_a=1000, successes_b=500, n_b=1000)
    assert diff is not None and diff.p_value < 1e-4 and diff.z > 0
    assert stats.two_proportion_test(successes_a=0, n_a=0, successes_b=1, n_b=2) is None


def test_wilson_interval_covers_the_proportion() -> None:
    iv = stats.wilson_interval(30, 100)
    assert iv is not None and iv.lo < 0.3 < iv.hi and iv.lo > 0.2 and iv.hi < 0.4
    assert stats.wilson_interval(0, 0) is None


def _arm(name: str, values: list[float]) -> experiments.ArmData:
    return experiments.ArmData(
        name=name,
        ttft_ms=values,
        requests=len(values),
        errors=0,
        hit_requests=len(values) // 2,
        cached_known_requests=len(values),
        actual_cached_tokens=100 * len(values),
        cached_known_prompt_tokens=200 * len(values),
        output_tokens=10 * len(values),
        duration_s=60.0,
    )


def test_seeded_ab_with_a_known_effect_is_detected() -> None:
    rng = random.Random(42)
    a = [rng.lognormvariate(6.0, 0.5) for _ in range(800)]
    b = [v * 0.75 for v in (rng.lognormvariate(6.0, 0.5) for _ in range(800))]  # 25 % faster
    out = experiments.compare_arms([_arm("A", a), _arm("B", b)], rng=random.Random(0))
    cmp_ = out["comparisons"][0]
    assert out["winner"] == "B"
    assert out["verdict"].startswith("B faster by ")
    assert "TTFT p95, 95 % CI" in out["verdict"]
    diff = cmp_["ttft_p95_rel_diff"]
    assert diff["lo"] > 0.05 and diff["lo"] < 0.25 < diff["hi"]


def test_seeded_aa_is_not_significant() -> None:
    rng = random.Random(43)
    a = [rng.lognormvariate(6.0, 0.5) for _ in range(800)]
    b = [rng.lognormvariate(6.0, 0.5) for _ in range(800)]
    out = experiments.compare_arms([_arm("A", a), _arm("B", b)], rng=random.Random(0))
    assert out["winner"] is None
    assert out["verdict"].startswith("not significant yet")
    assert "more requests per arm" in out["verdict"]


def test_results_are_reproducible_with_the_same_seed() -> None:
    rng = random.Random(3)
    a = [rng.uniform(100, 200) for _ in range(200)]
    b = [rng.uniform(90, 200) for _ in range(200)]
    r1 = experiments.compare_arms([_arm("A", a), _arm("B", b)], rng=random.Random(5))
    r2 = experiments.compare_arms([_arm("A", a), _arm("B", b)], rng=random.Random(5))
    assert r1 == r2


def test_too_few_requests_says_so() -> None:
    out = experiments.compare_arms(
        [_arm("A", [100.0] * 5), _arm("B", [50.0] * 5)], rng=random.Random(0)
    )
    assert out["winner"] is None
    assert "not enough data yet" in out["verdict"]


def test_verdict_text_when_control_wins() -> None:
    text = stats.verdict_text(
        metric="TTFT p95",
        control_arm="A",
        treatment_arm="B",
        diff=stats.Interval(estimate=-0.2, lo=-0.3, hi=-0.1),
        n_per_arm=500,
    )
    assert text == "A faster by 20 % TTFT p95, 95 % CI 10-30 %"
