"""Bridge from the policy page's what-if panel to the offline cluster simulator (bench/).

The last N recorded requests (their chained block keys, so prefix sharing is preserved)
are replayed in virtual time through `bench.sweep.run_sweep`, once per value of one
weight. When bench is not importable, or the records carry no block keys, `status()` /
`sweep()` say so and the panel shows that honestly instead of drawing anything.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

DEFAULT_PROFILE = "h100-8b"
MAX_VALUES = 8
MAX_POINTS = 16  # simulator runs per what-if (about a second each for 500 requests)


class WhatIfUnavailable(RuntimeError):
    """The replay cannot run here; the message says why in words for the operator."""


def _bench() -> tuple[Any, Any, Any] | None:
    try:
        sweep = importlib.import_module("bench.sweep")
        workloads = importlib.import_module("bench.workloads")
        profiles = importlib.import_module("workers.sim.profiles")
    except ImportError:
        return None
    run = getattr(sweep, "run_sweep", None)
    convert = getattr(workloads, "requests_from_records", None)
    if not callable(run) or not callable(convert):
        return None
    return run, convert, profiles


def status() -> tuple[bool, str]:
    if _bench() is None:
        return (
            False,
            "The offline simulator (bench.sweep) is not available in this build, so no "
            "what-if can be computed here.",
        )
    return True, "Replays recorded requests through the offline cluster simulator."


def profiles() -> list[str]:
    found = _bench()
    return sorted(found[2].PROFILES) if found else []


def sweep(
    *,
    records: Sequence[Mapping[str, Any]],
    policy_type: str,
    base_params: Mapping[str, Any],
    grid: Mapping[str, Sequence[float]],
    engines: int,
    profile: str = DEFAULT_PROFILE,
) -> list[dict[str, Any]]:
    """One row per grid point: the point's weights plus ttft_p50_ms, ttft_p99_ms,
    ttft_mean_ms, hit_rate, throughput_rps, in model milliseconds (what a live run would
    measure)."""
    found = _bench()
    if found is None:
        raise WhatIfUnavailable(status()[1])
    run_sweep, requests_from_records, _ = found
    usable = [r for r in records if r.get("block_keys")]
    if not usable:
        raise WhatIfUnavailable(
            "The recorded requests carry no block keys (recorded by an older gateway), "
            "so their prefix sharing cannot be replayed."
        )
    block_size = int(usable[0].get("block_size") or 16)
    requests = requests_from_records(usable, block_size=block_size)
    rows = run_sweep(
        requests,
        policy=policy_type,
        grid={k: list(v) for k, v in grid.items()},
        engines=max(1, engines),
        profile=profile,
        base_params=dict(base_params),
    )
    return [
        {
            **row["params"],
            "ttft_p50_ms": row["ttft_p50_ms"],
            "ttft_p99_ms": row["ttft_p99_ms"],
            "ttft_mean_ms": row["ttft_mean_ms"],
            "hit_rate": row["hit_rate"],
            "throughput_rps": row["throughput_rps"],
        }
        for row in rows
    ]
