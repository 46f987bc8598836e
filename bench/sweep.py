"""Policy-parameter sweeps in the offline simulator: a grid -> rows -> table and heatmap.

``run_sweep`` is the plain function the dashboard's what-if panel calls: requests in, one
row (plain JSON-able dict) per grid point out, in grid order (last axis fastest).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.clustersim import SimConfig, simulate
from bench.report import comparison_table, summarize
from bench.workloads import BenchRequest, oracle_hit_rate

# Axes swept when the caller gives none.
DEFAULT_GRIDS: dict[str, dict[str, list[float]]] = {
    "kv_score": {
        "cache_weight": [0.0, 0.5, 1.0, 2.0, 4.0],
        "load_weight": [0.0, 0.25, 0.5, 1.0, 2.0],
    },
    "predicted_ttft": {"temperature_ms": [0.0, 5.0, 20.0, 50.0, 200.0]},
}


def parse_grid(items: Sequence[str]) -> dict[str, list[float]]:
    """``["cache_weight=0,1,2", "load_weight=0.5"]`` -> {name: [values]}; ValueError names the bad item."""
    grid: dict[str, list[float]] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"grid axis must be name=v1,v2,..., got {item!r}")
        try:
            grid[name.strip()] = [float(v) for v in raw.split(",") if v.strip()]
        except ValueError:
            raise ValueError(f"grid axis {name!r}: values must be numbers, got {raw!r}") from None
        if not grid[name.strip()]:
            raise ValueError(f"grid axis {name!r} has no values")
    return grid


def run_sweep(
    requests: Sequence[BenchRequest],
    *,
    policy: str,
    grid: Mapping[str, Sequence[float]] | None = None,
    engines: int = 8,
    profile: str = "h100-8b",
    base_params: Mapping[str, Any] | None = None,
    seed: int = 0,
    concurrency: int | None = None,
    slo_ttft_ms: float = 2000.0,
    max_model_len: int | None = None,
    on_point: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Simulate ``requests`` once per point of ``grid`` (cartesian product of its axes).

    ``grid`` maps policy parameter names to values (default: ``DEFAULT_GRIDS[policy]``, or a
    single point with ``base_params`` when the policy has none); every point's params are
    ``base_params`` overlaid with the point and validated by ``routing.core.registry``
    (``InvalidPolicyParams`` names a bad field). Open loop on the requests' ``arrival_s``
    unless ``concurrency`` is set. Each row: ``params`` (the point), ``policy``, latency
    metrics in model milliseconds (``ttft_mean_ms``, ``ttft_p50_ms``, ``ttft_p99_ms``,
    ``e2e_mean_ms``), ``hit_rate`` and ``oracle_hit_rate`` in [0, 1], ``throughput_rps``,
    ``output_tps``, ``completed``, ``failed``, ``goodput_rps``, ``wall_s``. ``on_point`` is
    called with each row as it completes (progress for a UI).
    """
    axes = dict(grid) if grid is not None else dict(DEFAULT_GRIDS.get(policy, {}))
    names = list(axes)
    oracle = oracle_hit_rate(requests).hit_rate
    rows: list[dict[str, Any]] = []
    for values in itertools.product(*(axes[n] for n in names)) if names else [()]:
        point = dict(zip(names, values, strict=True))
        params = {**dict(base_params or {}), **point}
        t0 = time.perf_counter()
        out = simulate(
            requests,
            config=SimConfig(
                engines=engines,
                policy=policy,
                params=params,
                profile=profile,
                seed=seed,
                concurrency=concurrency,
                max_model_len=max_model_len,
            ),
        )
        s = summarize(
            out.results, label=f"{policy} {point}", slo_ttft_ms=slo_ttft_ms, oracle_hit_rate=oracle
        )
        row = {
            "policy": policy,
            "params": point,
            "ttft_mean_ms": s.ttft_ms["mean"],
            "ttft_p50_ms": s.ttft_ms["p50"],
            "ttft_p99_ms": s.ttft_ms["p99"],
            "e2e_mean_ms": s.e2e_ms["mean"],
            "hit_rate": s.hit_rate,
            "oracle_hit_rate": oracle,
            "throughput_rps": s.request_throughput_rps,
            "output_tps": s.output_token_throughput_tps,
            "goodput_rps": s.goodput_rps,
            "completed": s.completed,
            "failed": s.failed,
            "wall_s": time.perf_counter() - t0,
        }
        rows.append(row)
        if on_point is not None:
            on_point(row)
    return rows


def sweep_table(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return "(no points)"
    names = list(rows[0]["params"])
    # Parameter values print as given (0.25 stays 0.25, not a 1-decimal rounding).
    flat = [
        {
            **{k: f"{v:g}" for k, v in r["params"].items()},
            **{k: v for k, v in r.items() if k != "params"},
        }
        for r in rows
    ]
    for f in flat:
        f["hit_pct"] = 100.0 * f["hit_rate"] if not math.isnan(f["hit_rate"]) else math.nan
    cols = [(n, n) for n in names] + [
        ("ttft_mean_ms", "TTFT mean ms"),
        ("ttft_p99_ms", "TTFT p99 ms"),
        ("hit_pct", "hit %"),
        ("throughput_rps", "req/s"),
        ("output_tps", "out tok/s"),
    ]
    return comparison_table(flat, cols)


def sweep_heatmap_html(
    rows: Sequence[Mapping[str, Any]],
    path: str | Path,
    *,
    grid: Mapping[str, Sequence[float]],
    title: str,
) -> Path:
    """Self-contained HTML (plotly.js inlined): one heatmap per metric over the first two axes,
    or line charts when the grid has one axis."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    metrics = [
        ("ttft_mean_ms", "mean TTFT (ms)"),
        ("ttft_p99_ms", "p99 TTFT (ms)"),
        ("hit_rate", "hit rate"),
        ("throughput_rps", "throughput (req/s)"),
    ]
    names = list(grid)
    fig = make_subplots(rows=2, cols=2, subplot_titles=[t for _, t in metrics])
    for k, (metric, label) in enumerate(metrics):
        r, c = divmod(k, 2)
        if len(names) >= 2:
            xs, ys = list(grid[names[0]]), list(grid[names[1]])
            z = [[math.nan] * len(xs) for _ in ys]
            for row in rows:
                p = row["params"]
                if p[names[0]] in xs and p[names[1]] in ys:
                    z[ys.index(p[names[1]])][xs.index(p[names[0]])] = row[metric]
            fig.add_trace(
                go.Heatmap(
                    x=[str(x) for x in xs],
                    y=[str(y) for y in ys],
                    z=z,
                    name=label,
                    colorscale="Viridis",
                    showscale=False,
                    texttemplate="%{z:.3g}",
                ),
                row=r + 1,
                col=c + 1,
            )
            fig.update_xaxes(title_text=names[0], row=r + 1, col=c + 1)
            fig.update_yaxes(title_text=names[1], row=r + 1, col=c + 1)
        else:
            xs = [row["params"].get(names[0]) if names else 0 for row in rows]
            fig.add_trace(
                go.Scatter(x=xs, y=[row[metric] for row in rows], mode="lines+markers", name=label),
                row=r + 1,
                col=c + 1,
            )
            if names:
                fig.update_xaxes(title_text=names[0], row=r + 1, col=c + 1)
    fig.update_layout(title=title, height=800, showlegend=False)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(str(p), include_plotlyjs=True, full_html=True)
    return p
