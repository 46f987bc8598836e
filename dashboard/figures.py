"""Pure data -> Plotly figure dicts (JSON-able). No Django, no I/O.

Every trace fed by live updates carries `meta` saying where its y values come from, so
the page's script can re-derive x/y from the points it holds without knowing the
figure: `{"src": "overview", "field": "ttft_p95_ms"}`, `{"src": "fleet", "worker": id,
"field": "waiting"}`, `{"src": "evictions", "field": "evictions_per_s"}`. A per-worker
chart also carries `layout.meta = {"per_worker": field}` so a worker that appears later
gets its own trace.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

PALETTE = ("#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#65a30d")
FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif"

Figure = dict[str, Any]


def base_layout(
    title: str, *, y_title: str = "", y_format: str = "", height_px: int = 260
) -> dict[str, Any]:
    return {
        "title": {"text": title, "font": {"size": 14}, "x": 0.01, "xanchor": "left"},
        "height": height_px,
        "margin": {"l": 56, "r": 16, "t": 40, "b": 36},
        "font": {"family": FONT, "size": 12, "color": "#1f2937"},
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "xaxis": {"gridcolor": "#eef0f3", "linecolor": "#d1d5db", "automargin": True},
        "yaxis": {
            "title": {"text": y_title},
            "gridcolor": "#eef0f3",
            "linecolor": "#d1d5db",
            "rangemode": "tozero",
            "tickformat": y_format,
            "automargin": True,
        },
        "legend": {"orientation": "h", "y": -0.22, "x": 0},
        "showlegend": True,
        "hovermode": "x unified",
    }


def _line(
    name: str,
    x: Sequence[Any],
    y: Sequence[Any],
    *,
    color: str,
    meta: dict[str, Any],
    dash: str = "solid",
) -> dict[str, Any]:
    return {
        "type": "scatter",
        "mode": "lines+markers",
        "name": name,
        "x": list(x),
        "y": list(y),
        "line": {"color": color, "width": 2, "dash": dash},
        "marker": {"size": 4},
        "connectgaps": False,
        "meta": meta,
    }


def _series(points: Sequence[Mapping[str, Any]], field: str) -> tuple[list[Any], list[Any]]:
    return [p["t"] for p in points], [p.get(field) for p in points]


def overview_series_figure(
    points: Sequence[Mapping[str, Any]],
    *,
    title: str,
    fields: Sequence[tuple[str, str]],
    y_title: str = "",
    y_format: str = "",
    dashes: Sequence[str] = (),
) -> Figure:
    """One line per (field, label) over the fleet-wide minute points."""
    data = []
    for i, (field, label) in enumerate(fields):
        x, y = _series(points, field)
        data.append(
            _line(
                label,
                x,
                y,
                color=PALETTE[i % len(PALETTE)],
                meta={"src": "overview", "field": field},
                dash=dashes[i] if i < len(dashes) else "solid",
            )
        )
    return {"data": data, "layout": base_layout(title, y_title=y_title, y_format=y_format)}


def per_worker_figure(
    fleet: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    field: str,
    title: str,
    y_title: str = "",
    y_format: str = "",
) -> Figure:
    """One line per worker of one fleet field (queue depth, KV usage, ...)."""
    data = []
    for i, worker_id in enumerate(sorted(fleet)):
        x, y = _series(fleet[worker_id], field)
        data.append(
            _line(
                worker_id,
                x,
                y,
                color=PALETTE[i % len(PALETTE)],
                meta={"src": "fleet", "worker": worker_id, "field": field},
            )
        )
    layout = base_layout(title, y_title=y_title, y_format=y_format)
    layout["meta"] = {"per_worker": field}
    return {"data": data, "layout": layout}


def evictions_figure(evictions: Sequence[Mapping[str, Any]]) -> Figure:
    x, y = _series(evictions, "evictions_per_s")
    return {
        "data": [
            _line(
                "evictions/s",
                x,
                y,
                color=PALETTE[1],
                meta={"src": "evictions", "field": "evictions_per_s"},
            )
        ],
        "layout": base_layout("KV block evictions (BlockRemoved/s)", y_title="blocks/s"),
    }


def _traffic_figures(points: Sequence[Mapping[str, Any]], *, hit_title: str) -> dict[str, Figure]:
    """Request rate, TTFT percentiles and actual vs predicted hit rate from rollup points."""
    return {
        "rps": overview_series_figure(
            points, title="Requests per second", fields=[("rps", "req/s")], y_title="req/s"
        ),
        "ttft": overview_series_figure(
            points,
            title="Time to first token",
            fields=[("ttft_p50_ms", "p50"), ("ttft_p95_ms", "p95"), ("ttft_p99_ms", "p99")],
            y_title="ms",
        ),
        "hit_rate": overview_series_figure(
            points,
            title=hit_title,
            fields=[("hit_rate_actual", "actual"), ("hit_rate_predicted", "predicted")],
            y_format=".0%",
            dashes=("solid", "dot"),
        ),
    }


def overview_figures(snapshot: Mapping[str, Any]) -> dict[str, Figure]:
    """Every chart of the overview page from one snapshot (selectors.overview_snapshot)."""
    fleet = snapshot.get("fleet", {})
    return {
        **_traffic_figures(
            snapshot.get("points", []), hit_title="Prefix-cache hit rate: actual vs predicted"
        ),
        "evictions": evictions_figure(snapshot.get("evictions", [])),
        "queue": per_worker_figure(
            fleet, field="waiting", title="Queue depth (waiting) per worker", y_title="requests"
        ),
        "kv_usage": per_worker_figure(
            fleet, field="kv_usage_frac", title="KV-cache usage per worker", y_format=".0%"
        ),
    }


def worker_figures(
    *, points: Sequence[Mapping[str, Any]], samples: Sequence[Mapping[str, Any]], worker_id: str
) -> dict[str, Figure]:
    """Charts of one worker: its request rate, TTFT, hit rates (rollups) and load (scrapes)."""
    fleet = {worker_id: samples}
    return {
        **_traffic_figures(points, hit_title="Hit rate: actual vs predicted"),
        "queue": per_worker_figure(fleet, field="waiting", title="Waiting requests"),
        "running": per_worker_figure(fleet, field="running", title="Running requests"),
        "kv_usage": per_worker_figure(
            fleet, field="kv_usage_frac", title="KV-cache usage", y_format=".0%"
        ),
    }


def ttft_cdf_figure(arms: Sequence[Mapping[str, Any]]) -> Figure:
    """Per-arm empirical CDF of TTFT (from each arm's `ttft_cdf` {x, y})."""
    data = []
    for i, arm in enumerate(arms):
        cdf = arm.get("ttft_cdf") or {"x": [], "y": []}
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": f"arm {arm['name']}",
                "x": list(cdf["x"]),
                "y": list(cdf["y"]),
                "line": {"color": PALETTE[i % len(PALETTE)], "width": 2, "shape": "hv"},
            }
        )
    layout = base_layout("TTFT distribution per arm (CDF)", y_title="fraction of requests")
    layout["xaxis"]["title"] = {"text": "TTFT (ms)"}
    layout["xaxis"]["type"] = "log"
    layout["yaxis"]["tickformat"] = ".0%"
    layout["hovermode"] = "closest"
    return {"data": data, "layout": layout}


def _bar_with_ci(
    arms: Sequence[Mapping[str, Any]],
    *,
    key: str,
    title: str,
    y_title: str = "",
    y_format: str = "",
) -> Figure:
    names, est, plus, minus = [], [], [], []
    for arm in arms:
        iv = arm.get(key)
        names.append(f"arm {arm['name']}")
        if iv is None:
            est.append(None)
            plus.append(0)
            minus.append(0)
            continue
        est.append(iv["estimate"])
        plus.append(iv["hi"] - iv["estimate"])
        minus.append(iv["estimate"] - iv["lo"])
    layout = base_layout(title, y_title=y_title, y_format=y_format)
    layout["showlegend"] = False
    layout["hovermode"] = "closest"
    return {
        "data": [
            {
                "type": "bar",
                "x": names,
                "y": est,
                "marker": {"color": [PALETTE[i % len(PALETTE)] for i in range(len(names))]},
                "error_y": {
                    "type": "data",
                    "symmetric": False,
                    "array": plus,
                    "arrayminus": minus,
                    "color": "#374151",
                    "thickness": 1.5,
                },
            }
        ],
        "layout": layout,
    }


def experiment_figures(results: Mapping[str, Any]) -> dict[str, Figure]:
    """Charts of an experiment's results (telemetry.experiments.compare_arms output)."""
    arms = results.get("arms", [])
    level = round(100 * results.get("level", 0.95))
    return {
        "cdf": ttft_cdf_figure(arms),
        "hit_rate": _bar_with_ci(
            arms,
            key="request_hit_rate",
            title=f"Requests with a cache hit ({level} % CI)",
            y_format=".0%",
        ),
        "ttft_p95": _bar_with_ci(
            arms, key="ttft_p95_ms", title=f"TTFT p95 ({level} % bootstrap CI)", y_title="ms"
        ),
    }


def score_breakdown_figure(candidates: Sequence[Mapping[str, Any]], *, chosen: str) -> Figure:
    """Why this worker: each candidate's signed score terms, stacked, plus its total."""
    workers = [str(c.get("worker", "?")) for c in candidates]
    term_names: list[str] = []
    for c in candidates:
        for name in c.get("terms") or {}:
            if name not in term_names and name != "est_ttft_ms":
                term_names.append(name)
    data: list[dict[str, Any]] = []
    for i, name in enumerate(term_names):
        data.append(
            {
                "type": "bar",
                "name": name,
                "x": workers,
                "y": [(c.get("terms") or {}).get(name, 0.0) for c in candidates],
                "marker": {"color": PALETTE[i % len(PALETTE)]},
            }
        )
    data.append(
        {
            "type": "scatter",
            "mode": "markers+text",
            "name": "score",
            "x": workers,
            "y": [c.get("score") for c in candidates],
            "text": ["chosen" if w == chosen else "" for w in workers],
            "textposition": "top center",
            "cliponaxis": False,
            "marker": {"color": "#111827", "size": 10, "symbol": "diamond"},
        }
    )
    layout = base_layout("Score terms per candidate (higher score wins)", y_title="contribution")
    layout["barmode"] = "relative"
    layout["hovermode"] = "closest"
    layout["yaxis"]["rangemode"] = "normal"
    return {"data": data, "layout": layout}


def whatif_figure(
    rows: Sequence[Mapping[str, Any]], *, param: str, metrics: Sequence[tuple[str, str]]
) -> Figure:
    """Predicted metrics of an offline replay over a grid of one weight's values.

    `rows`: one dict per grid point with `param` and each metric key.
    """
    ordered = sorted(rows, key=lambda r: r[param])
    x = [r[param] for r in ordered]
    data = []
    for i, (key, label) in enumerate(metrics):
        trace = {
            "type": "scatter",
            "mode": "lines+markers",
            "name": label,
            "x": x,
            "y": [r.get(key) for r in ordered],
            "line": {"color": PALETTE[i % len(PALETTE)], "width": 2},
        }
        if i == 1:
            trace["yaxis"] = "y2"
        data.append(trace)
    layout = base_layout(f"What-if: replayed requests vs {param}", y_title=metrics[0][1])
    layout["xaxis"]["title"] = {"text": param}
    layout["hovermode"] = "x unified"
    if len(metrics) > 1:
        layout["yaxis2"] = {
            "title": {"text": metrics[1][1]},
            "overlaying": "y",
            "side": "right",
            "tickformat": ".0%",
            "rangemode": "tozero",
        }
        layout["margin"]["r"] = 56
    return {"data": data, "layout": layout}


def whatif_surface_figure(
    rows: Sequence[Mapping[str, Any]], *, x_param: str, y_param: str
) -> Figure:
    """Two heatmaps over a 2-D weight grid: predicted TTFT p99 and predicted hit rate."""
    xs = sorted({r[x_param] for r in rows})
    ys = sorted({r[y_param] for r in rows})
    by_point = {(r[x_param], r[y_param]): r for r in rows}

    def z(key: str) -> list[list[Any]]:
        return [[(by_point.get((x, y)) or {}).get(key) for x in xs] for y in ys]

    layout = base_layout(f"What-if surface: {x_param} x {y_param}", height_px=340)
    layout["showlegend"] = False
    layout["hovermode"] = "closest"
    layout["margin"]["t"] = 72
    layout["xaxis"].update({"domain": [0.0, 0.42], "title": {"text": x_param}, "type": "category"})
    layout["yaxis"].update({"title": {"text": y_param}, "type": "category", "rangemode": "normal"})
    layout["xaxis2"] = {
        "domain": [0.56, 0.98],
        "title": {"text": x_param},
        "type": "category",
        "anchor": "y2",
    }
    layout["yaxis2"] = {"anchor": "x2", "type": "category", "title": {"text": y_param}}
    layout["annotations"] = [
        {
            "text": "predicted TTFT p99 (ms)",
            "x": 0.21,
            "y": 1.02,
            "xref": "paper",
            "yref": "paper",
            "showarrow": False,
            "xanchor": "center",
            "yanchor": "bottom",
        },
        {
            "text": "predicted hit rate",
            "x": 0.77,
            "y": 1.02,
            "xref": "paper",
            "yref": "paper",
            "showarrow": False,
            "xanchor": "center",
            "yanchor": "bottom",
        },
    ]
    return {
        "data": [
            {
                "type": "heatmap",
                "x": [str(x) for x in xs],
                "y": [str(y) for y in ys],
                "z": z("ttft_p99_ms"),
                "colorscale": "YlOrRd",
                "reversescale": True,  # plotly.js runs YlOrRd red-to-yellow; slow = red
                "texttemplate": "%{z:.1f}",
                "colorbar": {"x": 0.44, "thickness": 10, "title": {"text": "ms"}},
                "hovertemplate": f"{x_param}=%{{x}}<br>{y_param}=%{{y}}<br>TTFT p99 %{{z:.1f}} ms<extra></extra>",
            },
            {
                "type": "heatmap",
                "x": [str(x) for x in xs],
                "y": [str(y) for y in ys],
                "z": z("hit_rate"),
                "xaxis": "x2",
                "yaxis": "y2",
                "colorscale": "Blues",
                "reversescale": True,  # plotly.js runs Blues dark-to-light; more hits = darker
                "texttemplate": "%{z:.0%}",
                "zmin": 0,
                "zmax": 1,
                "colorbar": {"x": 1.0, "thickness": 10, "tickformat": ".0%"},
                "hovertemplate": f"{x_param}=%{{x}}<br>{y_param}=%{{y}}<br>hit rate %{{z:.1%}}<extra></extra>",
            },
        ],
        "layout": layout,
    }
