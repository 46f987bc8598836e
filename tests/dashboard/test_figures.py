from __future__ import annotations

import json

from dashboard import figures

POINTS = [
    {
        "t": "2026-11-29T10:00:00Z",
        "rps": 2.0,
        "ttft_p50_ms": 80.0,
        "ttft_p95_ms": 200.0,
        "ttft_p99_ms": 400.0,
        "hit_rate_actual": 0.5,
        "hit_rate_predicted": 0.6,
    },
    {
        "t": "2026-11-29T10:01:00Z",
        "rps": 3.0,
        "ttft_p50_ms": 70.0,
        "ttft_p95_ms": 150.0,
        "ttft_p99_ms": None,
        "hit_rate_actual": 0.7,
        "hit_rate_predicted": 0.65,
    },
]
FLEET = {
    "sim-1": [{"t": "2026-11-29T10:00:05Z", "waiting": 3, "kv_usage_frac": 0.4}],
    "sim-0": [
        {"t": "2026-11-29T10:00:05Z", "waiting": 1, "kv_usage_frac": 0.2},
        {"t": "2026-11-29T10:00:10Z", "waiting": 2, "kv_usage_frac": 0.25},
    ],
}


def test_overview_figures_map_every_series_to_its_field() -> None:
    figs = figures.overview_figures({"points": POINTS, "fleet": FLEET, "evictions": []})
    assert set(figs) == {"rps", "ttft", "hit_rate", "evictions", "queue", "kv_usage"}
    ttft = figs["ttft"]["data"]
    assert [t["name"] for t in ttft] == ["p50", "p95", "p99"]
    assert ttft[1]["y"] == [200.0, 150.0] and ttft[2]["y"] == [400.0, None]
    assert ttft[0]["meta"] == {"src": "overview", "field": "ttft_p50_ms"}
    hit = figs["hit_rate"]
    assert hit["layout"]["yaxis"]["tickformat"] == ".0%"
    assert [t["y"] for t in hit["data"]] == [[0.5, 0.7], [0.6, 0.65]]
    queue = figs["queue"]
    assert [t["name"] for t in queue["data"]] == ["sim-0", "sim-1"]  # stable order
    assert queue["data"][0]["y"] == [1, 2]
    assert queue["layout"]["meta"] == {"per_worker": "waiting"}
    json.dumps(figs)


def test_empty_snapshot_gives_empty_but_drawable_figures() -> None:
    figs = figures.overview_figures({})
    assert figs["rps"]["data"][0]["x"] == []
    assert figs["queue"]["data"] == []
    assert figs["queue"]["layout"]["title"]["text"].startswith("Queue depth")


def test_experiment_figures_bars_carry_asymmetric_cis() -> None:
    results = {
        "level": 0.95,
        "arms": [
            {
                "name": "A",
                "request_hit_rate": {"estimate": 0.5, "lo": 0.4, "hi": 0.55},
                "ttft_p95_ms": {"estimate": 300.0, "lo": 280.0, "hi": 330.0},
                "ttft_cdf": {"x": [100.0, 200.0, 300.0], "y": [0.33, 0.66, 1.0]},
            },
            {
                "name": "B",
                "request_hit_rate": None,
                "ttft_p95_ms": None,
                "ttft_cdf": {"x": [], "y": []},
            },
        ],
    }
    figs = figures.experiment_figures(results)
    bar = figs["hit_rate"]["data"][0]
    assert bar["y"] == [0.5, None]
    assert bar["error_y"]["array"][0] == 0.55 - 0.5
    assert abs(bar["error_y"]["arrayminus"][0] - 0.1) < 1e-12
    assert figs["cdf"]["data"][0]["x"] == [100.0, 200.0, 300.0]
    assert figs["cdf"]["layout"]["xaxis"]["type"] == "log"
    assert "95 %" in figs["ttft_p95"]["layout"]["title"]["text"]


def test_score_breakdown_stacks_terms_and_marks_the_choice() -> None:
    cands = [
        {"worker": "sim-0", "score": 0.7, "terms": {"cache": 0.9, "queue": -0.2}},
        {"worker": "sim-1", "score": -0.1, "terms": {"queue": -0.1, "kv_pressure": 0.0}},
    ]
    fig = figures.score_breakdown_figure(cands, chosen="sim-0")
    names = [t["name"] for t in fig["data"]]
    assert names == ["cache", "queue", "kv_pressure", "score"]
    assert fig["data"][0]["y"] == [0.9, 0.0]
    assert fig["data"][-1]["text"] == ["chosen", ""]
    assert fig["layout"]["barmode"] == "relative"


def test_whatif_figure_sorts_by_the_swept_weight() -> None:
    rows = [
        {"cache_weight": 2.0, "ttft_p95_ms": 90.0, "hit_rate": 0.8},
        {"cache_weight": 0.0, "ttft_p95_ms": 200.0, "hit_rate": 0.2},
    ]
    fig = figures.whatif_figure(
        rows, param="cache_weight", metrics=[("ttft_p95_ms", "TTFT p95"), ("hit_rate", "hit rate")]
    )
    assert fig["data"][0]["x"] == [0.0, 2.0] and fig["data"][0]["y"] == [200.0, 90.0]
    assert fig["data"][1]["yaxis"] == "y2"


def test_whatif_surface_lays_the_grid_out_as_heatmaps() -> None:
    rows = [
        {"a": a, "b": b, "ttft_p99_ms": 100 + 10 * a + b, "hit_rate": 0.1 * a}
        for a in (0.0, 1.0)
        for b in (0.0, 5.0, 10.0)
    ]
    fig = figures.whatif_surface_figure(rows, x_param="a", y_param="b")
    ttft, hit = fig["data"]
    assert ttft["x"] == ["0.0", "1.0"] and ttft["y"] == ["0.0", "5.0", "10.0"]
    assert ttft["z"][2] == [110.0, 120.0]  # row = b = 10, columns = a
    assert hit["xaxis"] == "x2" and hit["zmax"] == 1
    assert fig["layout"]["xaxis2"]["anchor"] == "y2"
