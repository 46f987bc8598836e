from __future__ import annotations

import math

import pytest

from bench.report import RequestResult, html_report, percentile, summarize, summary_table


def test_percentile_interpolates() -> None:
    xs = [float(i) for i in range(1, 101)]
    assert percentile(xs, 50) == pytest.approx(50.5)
    assert percentile(xs, 99) == pytest.approx(99.01)
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 100.0
    assert percentile([3.0], 90) == 3.0
    assert math.isnan(percentile([], 50))


def _r(i: int, ttft: float, *, ok: bool = True, cached: int | None = 50) -> RequestResult:
    return RequestResult(
        request_id=str(i),
        ok=ok,
        start_s=float(i),
        prompt_tokens=100,
        output_tokens=11,
        cached_tokens=cached,
        ttft_ms=ttft,
        e2e_ms=ttft + 100.0,
        itl_ms=(10.0,) * 10,
    )


def test_summary_metrics() -> None:
    results = [
        _r(0, 100.0),
        _r(1, 300.0, cached=None),
        _r(2, 3000.0, cached=0),
        _r(3, 0.0, ok=False),
    ]
    s = summarize(results, label="x", slo_ttft_ms=1000.0, oracle_hit_rate=0.75)
    assert (s.completed, s.failed) == (3, 1)
    assert s.ttft_ms["mean"] == pytest.approx(3400 / 3)
    assert s.ttft_ms["p50"] == pytest.approx(300.0)
    assert s.tpot_ms["mean"] == pytest.approx(10.0)
    # Only requests that reported cached tokens count: (50 + 0) / 200.
    assert s.hit_rate == pytest.approx(0.25)
    # Duration: first start 0 -> last end 2 + 3.1 s.
    assert s.duration_s == pytest.approx(5.1)
    assert s.goodput_rps == pytest.approx(2 / 5.1)
    assert s.slo_attainment == pytest.approx(0.5)
    table = summary_table(s)
    assert "hit rate 25.0 %" in table and "oracle 75.0 %" in table
    assert s.to_dict()["ttft_ms"]["p50"] == 300.0


def test_html_report_is_self_contained(tmp_path) -> None:
    p = html_report({"a": [_r(i, 10.0 * i) for i in range(1, 20)]}, tmp_path / "r.html", title="t")
    html = p.read_text()
    assert '<script src="http' not in html and "<script src='http" not in html
    assert "TTFT CDF" in html and len(html) > 1_000_000
