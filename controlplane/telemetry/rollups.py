"""Pure rollup arithmetic: request records -> additive per-bucket counters, and the
derived view (rates, hit rates, percentiles) of any sum of such counters.

A request record is the gateway's JSON object (docs/contracts.md, "request records").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controlplane.telemetry import stats

TEN_S = 10
MINUTE_S = 60
HOUR_S = 3600

# The additive counters of a rollup (model field names). Histograms merge separately.
COUNTER_FIELDS: tuple[str, ...] = (
    "requests",
    "errors",
    "retries",
    "prompt_tokens",
    "output_tokens",
    "cached_known_requests",
    "cached_known_prompt_tokens",
    "actual_cached_tokens",
    "predicted_cached_tokens",
    "prediction_abs_error_tokens",
    "hit_requests",
    "ttft_count",
    "ttft_sum_ms",
    "e2e_count",
    "e2e_sum_ms",
)
HIST_FIELDS: tuple[str, ...] = ("ttft_hist", "e2e_hist")


class MalformedRecord(ValueError):
    """A request record is missing a required field or has one of the wrong type."""


@dataclass(frozen=True, slots=True)
class RollupKey:
    bucket_start_s: int
    model: str
    worker_id: str
    policy_version_id: int
    experiment_id: int
    arm: str


def _int(rec: Mapping[str, Any], name: str, default: int = 0) -> int:
    v = rec.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise MalformedRecord(f"{name} must be a number, got {v!r}")
    return int(v)


def _float_or_none(rec: Mapping[str, Any], name: str) -> float | None:
    v = rec.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise MalformedRecord(f"{name} must be a finite number, got {v!r}")
    return float(v)


def _str(rec: Mapping[str, Any], name: str) -> str:
    v = rec.get(name)
    return "" if v is None else str(v)


def normalize_record(rec: Mapping[str, Any]) -> dict[str, Any]:
    """Validated, typed copy of one gateway request record; raises MalformedRecord."""
    if not isinstance(rec, Mapping):
        raise MalformedRecord("record must be a JSON object")
    request_id = _str(rec, "request_id")
    if not request_id:
        raise MalformedRecord("request_id is required")
    ts_s = _float_or_none(rec, "ts_s")
    if ts_s is None:
        raise MalformedRecord("ts_s is required")
    model = _str(rec, "model")
    if not model:
        raise MalformedRecord("model is required")
    actual = rec.get("actual_cached_tokens")
    candidates = rec.get("candidates") or []
    if not isinstance(candidates, list):
        raise MalformedRecord("candidates must be a list")
    shadow = rec.get("shadow")
    block_keys = rec.get("block_keys")
    if block_keys is not None and (
        not isinstance(block_keys, list)
        # `type(k) is int` (not isinstance) also rejects bools, in one cheap check per key.
        or not all(type(k) is int for k in block_keys)
    ):
        raise MalformedRecord("block_keys must be a list of integers")
    block_size = _int(rec, "block_size", 16)
    if block_size < 1:
        raise MalformedRecord("block_size must be a positive integer")
    return {
        "request_id": request_id[:100],
        "ts_s": ts_s,
        "model": model[:200],
        "tenant": _str(rec, "tenant")[:200],
        "session_key": _str(rec, "session_key")[:200],
        "worker_id": _str(rec, "worker_id")[:200],
        "policy": _str(rec, "policy")[:200],
        "policy_version_id": _int(rec, "policy_version_id"),
        "policy_type": _str(rec, "policy_type")[:100],
        "experiment_id": _int(rec, "experiment_id"),
        "arm": _str(rec, "arm")[:100],
        "prompt_tokens": _int(rec, "prompt_tokens"),
        "predicted_cached_tokens": _int(rec, "predicted_cached_tokens"),
        "actual_cached_tokens": None if actual is None else _int(rec, "actual_cached_tokens"),
        "ttft_ms": _float_or_none(rec, "ttft_ms"),
        "e2e_ms": _float_or_none(rec, "e2e_ms"),
        "output_tokens": _int(rec, "output_tokens"),
        "status": (_str(rec, "status") or "ok")[:32],
        "http_status": _int(rec, "http_status", 200),
        "retries": _int(rec, "retries"),
        "routing_overhead_us": _float_or_none(rec, "routing_overhead_us") or 0.0,
        "stream": bool(rec.get("stream", False)),
        "candidates": candidates,
        "shadow": shadow if isinstance(shadow, dict) else None,
        "reason": _str(rec, "reason"),
        "block_keys": block_keys,
        "block_size": block_size,
    }


def bucket_start_s(ts_s: float, *, width_s: int = MINUTE_S) -> int:
    return int(ts_s // width_s) * width_s


def rollup_key(rec: Mapping[str, Any], *, width_s: int = MINUTE_S) -> RollupKey:
    return RollupKey(
        bucket_start_s=bucket_start_s(rec["ts_s"], width_s=width_s),
        model=rec["model"],
        worker_id=rec["worker_id"],
        policy_version_id=rec["policy_version_id"],
        experiment_id=rec["experiment_id"],
        arm=rec["arm"],
    )


def empty_counters() -> dict[str, Any]:
    out: dict[str, Any] = {f: 0 for f in COUNTER_FIELDS}
    out["ttft_sum_ms"] = 0.0
    out["e2e_sum_ms"] = 0.0
    for h in HIST_FIELDS:
        out[h] = {}
    return out


def add_record(acc: dict[str, Any], rec: Mapping[str, Any]) -> None:
    """Add one normalised record to an accumulator made by `empty_counters` (in place)."""
    acc["requests"] += 1
    if rec["status"] != "ok":
        acc["errors"] += 1
    acc["retries"] += rec["retries"]
    acc["prompt_tokens"] += rec["prompt_tokens"]
    acc["output_tokens"] += rec["output_tokens"]
    acc["predicted_cached_tokens"] += rec["predicted_cached_tokens"]
    actual = rec["actual_cached_tokens"]
    if actual is not None:
        acc["cached_known_requests"] += 1
        acc["cached_known_prompt_tokens"] += rec["prompt_tokens"]
        acc["actual_cached_tokens"] += actual
        acc["prediction_abs_error_tokens"] += abs(rec["predicted_cached_tokens"] - actual)
        if actual > 0:
            acc["hit_requests"] += 1
    if rec["ttft_ms"] is not None:
        acc["ttft_count"] += 1
        acc["ttft_sum_ms"] += rec["ttft_ms"]
        stats.hist_add(acc["ttft_hist"], rec["ttft_ms"])
    if rec["e2e_ms"] is not None:
        acc["e2e_count"] += 1
        acc["e2e_sum_ms"] += rec["e2e_ms"]
        stats.hist_add(acc["e2e_hist"], rec["e2e_ms"])


def merge_counters(*parts: Mapping[str, Any]) -> dict[str, Any]:
    """Sum of rollup counters (any mapping with the rollup fields: dicts or model rows)."""
    out = empty_counters()
    for p in parts:
        for f in COUNTER_FIELDS:
            out[f] += p[f] or 0
        for h in HIST_FIELDS:
            out[h] = stats.hist_merge(out[h], p[h] or {})
    return out


def accumulate(
    records: Iterable[Mapping[str, Any]], *, width_s: int = MINUTE_S
) -> dict[RollupKey, dict[str, Any]]:
    """Group normalised records into per-bucket counters."""
    out: dict[RollupKey, dict[str, Any]] = {}
    for rec in records:
        key = rollup_key(rec, width_s=width_s)
        acc = out.get(key)
        if acc is None:
            acc = out[key] = empty_counters()
        add_record(acc, rec)
    return out


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def summarize(counters: Mapping[str, Any], *, duration_s: float) -> dict[str, Any]:
    """Derived view of summed counters over `duration_s` seconds of wall time.

    Hit rates are token-weighted over requests whose worker reported cached tokens;
    `prediction_error_frac` is mean |predicted - actual| cached tokens over prompt tokens.
    """
    ttft, e2e = counters["ttft_hist"], counters["e2e_hist"]
    known_prompt = counters["cached_known_prompt_tokens"]
    return {
        "requests": counters["requests"],
        "errors": counters["errors"],
        "retries": counters["retries"],
        "rps": _ratio(counters["requests"], duration_s) or 0.0,
        "error_rate": _ratio(counters["errors"], counters["requests"]),
        "prompt_tokens": counters["prompt_tokens"],
        "output_tokens": counters["output_tokens"],
        "output_tokens_per_s": _ratio(counters["output_tokens"], duration_s) or 0.0,
        "hit_rate_actual": _ratio(counters["actual_cached_tokens"], known_prompt),
        "hit_rate_predicted": _ratio(
            counters["predicted_cached_tokens"], counters["prompt_tokens"]
        ),
        "prediction_error_frac": _ratio(counters["prediction_abs_error_tokens"], known_prompt),
        "request_hit_rate": _ratio(counters["hit_requests"], counters["cached_known_requests"]),
        "ttft_mean_ms": _ratio(counters["ttft_sum_ms"], counters["ttft_count"]),
        "ttft_p50_ms": stats.hist_percentile(ttft, 50),
        "ttft_p95_ms": stats.hist_percentile(ttft, 95),
        "ttft_p99_ms": stats.hist_percentile(ttft, 99),
        "e2e_mean_ms": _ratio(counters["e2e_sum_ms"], counters["e2e_count"]),
        "e2e_p50_ms": stats.hist_percentile(e2e, 50),
        "e2e_p95_ms": stats.hist_percentile(e2e, 95),
        "e2e_p99_ms": stats.hist_percentile(e2e, 99),
    }
