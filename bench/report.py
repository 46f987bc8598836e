"""Per-request results -> summary metrics, readable tables, JSON and an offline Plotly report.

Shared by the live load generator (``bench.loadgen``) and the offline simulator
(``bench.clustersim``) so a live run and a simulated run are summarised by the same code.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True, slots=True)
class RequestResult:
    """What one request did. Times are milliseconds; ``start_s`` is the send offset in seconds.

    ``cached_tokens`` is None when the server did not report it; ``itl_ms`` holds the gaps
    between successive streamed tokens (chunks) after the first.
    """

    request_id: str
    ok: bool
    start_s: float
    prompt_tokens: int
    output_tokens: int = 0
    cached_tokens: int | None = None
    ttft_ms: float = math.nan
    e2e_ms: float = math.nan
    itl_ms: tuple[float, ...] = ()
    worker: str | None = None
    error: str | None = None


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile ``q`` in [0, 100] of ``values`` (nan when empty)."""
    if not values:
        return math.nan
    xs = sorted(values)
    if len(xs) == 1:
        return float(xs[0])
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


def distribution(values: Sequence[float]) -> dict[str, float]:
    vals = [v for v in values if not math.isnan(v)]
    return {
        "mean": sum(vals) / len(vals) if vals else math.nan,
        "p50": percentile(vals, 50),
        "p90": percentile(vals, 90),
        "p99": percentile(vals, 99),
    }


@dataclass(slots=True)
class Summary:
    """Aggregate metrics of one run (ms for latencies, tokens/s and req/s for throughput)."""

    label: str
    completed: int
    failed: int
    duration_s: float
    request_throughput_rps: float
    output_token_throughput_tps: float
    total_token_throughput_tps: float
    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float]
    itl_ms: dict[str, float]
    e2e_ms: dict[str, float]
    slo_ttft_ms: float
    goodput_rps: float
    slo_attainment: float
    hit_rate: float
    oracle_hit_rate: float
    prompt_tokens: int
    cached_tokens: int
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = _jsonable(asdict(self))
        return out


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, float):
        return None if math.isnan(obj) or math.isinf(obj) else round(obj, 4)
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def summarize(
    results: Sequence[RequestResult],
    *,
    label: str,
    duration_s: float | None = None,
    slo_ttft_ms: float = 2000.0,
    oracle_hit_rate: float = math.nan,
    extra: Mapping[str, Any] | None = None,
) -> Summary:
    """Summarise ``results``.

    Duration defaults to first send -> last completion. Hit rate is sum(cached_tokens) / sum
    (prompt_tokens) over completed requests that reported cached tokens. Goodput counts completed
    requests whose TTFT met ``slo_ttft_ms``, per second of the run. TPOT is (e2e - ttft) /
    (output_tokens - 1) per request with at least 2 output tokens.
    """
    ok = [r for r in results if r.ok]
    if duration_s is None:
        if ok:
            start = min(r.start_s for r in results)
            end = max(r.start_s + r.e2e_ms / 1000.0 for r in ok)
            duration_s = max(end - start, 1e-9)
        else:
            duration_s = math.nan
    reported = [r for r in ok if r.cached_tokens is not None]
    prompt = sum(r.prompt_tokens for r in reported)
    cached = sum(r.cached_tokens or 0 for r in reported)
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    tpots = [(r.e2e_ms - r.ttft_ms) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    itls = [g for r in ok for g in r.itl_ms]
    good = sum(1 for r in ok if r.ttft_ms <= slo_ttft_ms)
    dur = duration_s if duration_s and not math.isnan(duration_s) else math.nan
    return Summary(
        label=label,
        completed=len(ok),
        failed=len(results) - len(ok),
        duration_s=dur,
        request_throughput_rps=len(ok) / dur if dur == dur else math.nan,
        output_token_throughput_tps=out_tokens / dur if dur == dur else math.nan,
        total_token_throughput_tps=(out_tokens + in_tokens) / dur if dur == dur else math.nan,
        ttft_ms=distribution([r.ttft_ms for r in ok]),
        tpot_ms=distribution(tpots),
        itl_ms=distribution(itls),
        e2e_ms=distribution([r.e2e_ms for r in ok]),
        slo_ttft_ms=slo_ttft_ms,
        goodput_rps=good / dur if dur == dur else math.nan,
        slo_attainment=good / len(results) if results else math.nan,
        hit_rate=cached / prompt if prompt else math.nan,
        oracle_hit_rate=oracle_hit_rate,
        prompt_tokens=in_tokens,
        cached_tokens=cached,
        extra=dict(extra or {}),
    )


def _fmt(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v:,.{digits}f}"
    return str(v)


def summary_table(s: Summary) -> str:
    """A readable multi-line table of one summary."""
    lines = [
        f"== {s.label}",
        f"completed {s.completed}  failed {s.failed}  duration {_fmt(s.duration_s, 2)} s",
        f"throughput {_fmt(s.request_throughput_rps, 2)} req/s  "
        f"{_fmt(s.output_token_throughput_tps)} out tok/s  {_fmt(s.total_token_throughput_tps)} total tok/s",
        f"hit rate {_fmt(100 * s.hit_rate)} %  oracle {_fmt(100 * s.oracle_hit_rate)} %  "
        f"goodput (TTFT <= {_fmt(s.slo_ttft_ms, 0)} ms) {_fmt(s.goodput_rps, 2)} req/s "
        f"({_fmt(100 * s.slo_attainment)} %)",
        f"{'ms':<6}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}",
    ]
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        d = getattr(s, name)
        lines.append(
            f"{name[:-3].upper():<6}"
            + "".join(f"{_fmt(d[k]):>10}" for k in ("mean", "p50", "p90", "p99"))
        )
    return "\n".join(lines)


def comparison_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    """A fixed-width table of ``rows`` with ``columns`` given as (key, header) pairs."""
    cells = [[h for _, h in columns]]
    for row in rows:
        cells.append(
            [_fmt(row.get(k), 1 if isinstance(row.get(k), float) else 0) for k, _ in columns]
        )
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    out = []
    for j, c in enumerate(cells):
        out.append(
            "  ".join(
                x.rjust(w) if i else x.ljust(w)
                for i, (x, w) in enumerate(zip(c, widths, strict=False))
            )
        )
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    head = "| " + " | ".join(h for _, h in columns) + " |"
    sep = "|" + "|".join("---" for _ in columns) + "|"
    body = [
        "| "
        + " | ".join(_fmt(r.get(k), 1 if isinstance(r.get(k), float) else 0) for k, _ in columns)
        + " |"
        for r in rows
    ]
    return "\n".join([head, sep, *body])


def write_json(path: str | Path, payload: Any) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(_jsonable(payload), indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return p


def results_payload(summary: Summary, results: Iterable[RequestResult]) -> dict[str, Any]:
    return {
        "summary": summary.to_dict(),
        "requests": [{k: v for k, v in asdict(r).items() if k != "itl_ms"} for r in results],
    }


# ---------------------------------------------------------------------------- plotly


def _hit_rate_series(
    results: Sequence[RequestResult], *, buckets: int = 40
) -> tuple[list[float], list[float]]:
    done = sorted(
        (r for r in results if r.ok and r.cached_tokens is not None), key=lambda r: r.start_s
    )
    if not done:
        return [], []
    t0, t1 = done[0].start_s, done[-1].start_s
    width = max((t1 - t0) / buckets, 1e-9)
    xs, ys = [], []
    for b in range(buckets):
        lo, hi = t0 + b * width, t0 + (b + 1) * width
        sel = [r for r in done if lo <= r.start_s < hi or (b == buckets - 1 and r.start_s == hi)]
        p = sum(r.prompt_tokens for r in sel)
        if p:
            xs.append(lo - t0)
            ys.append(100.0 * sum(r.cached_tokens or 0 for r in sel) / p)
    return xs, ys


def html_report(
    runs: Mapping[str, Sequence[RequestResult]], path: str | Path, *, title: str
) -> Path:
    """Self-contained HTML (plotly.js inlined, no CDN): TTFT CDF per run, hit rate over time."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("TTFT CDF", "Hit rate over time"))
    for name, results in runs.items():
        ttfts = sorted(r.ttft_ms for r in results if r.ok)
        if ttfts:
            n = len(ttfts)
            fig.add_trace(
                go.Scatter(
                    x=ttfts,
                    y=[(i + 1) / n for i in range(n)],
                    mode="lines",
                    name=f"{name} TTFT",
                    legendgroup=name,
                ),
                row=1,
                col=1,
            )
        xs, ys = _hit_rate_series(results)
        if xs:
            fig.add_trace(
                go.Scatter(
                    x=xs, y=ys, mode="lines+markers", name=f"{name} hit %", legendgroup=name
                ),
                row=1,
                col=2,
            )
    fig.update_xaxes(title_text="TTFT (ms)", type="log", row=1, col=1)
    fig.update_yaxes(title_text="fraction of requests", row=1, col=1)
    fig.update_xaxes(title_text="send time (s)", row=1, col=2)
    fig.update_yaxes(title_text="cached / prompt tokens (%)", row=1, col=2)
    fig.update_layout(title=title, height=520)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(str(p), include_plotlyjs=True, full_html=True)
    return p
