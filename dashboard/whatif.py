"""Bridge from the policy page's what-if panel to the offline cluster simulator (bench/).

The simulator replays recorded requests in virtual time for each value of one weight.
When bench's sweep is not importable, `status()` says so and the panel shows that
honestly instead of drawing anything.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# Where bench publishes its sweep, most specific first.
SWEEP_CANDIDATES: tuple[tuple[str, str], ...] = (
    ("bench.whatif", "sweep_records"),
    ("bench.clustersim", "sweep_records"),
)


def _find() -> Callable[..., Any] | None:
    for module, attr in SWEEP_CANDIDATES:
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        fn = getattr(mod, attr, None)
        if callable(fn):
            return fn
    return None


def status() -> tuple[bool, str]:
    if _find() is None:
        return (
            False,
            "The offline simulator's sweep (bench) is not available in this build, so no "
            "what-if can be computed here.",
        )
    return True, "Replays recorded requests through the offline cluster simulator."


def sweep(
    *,
    records: Sequence[Mapping[str, Any]],
    policy_type: str,
    base_params: Mapping[str, Any],
    param: str,
    values: Sequence[float],
) -> list[dict[str, Any]]:
    """One row per value: {param: value, "ttft_p95_ms", "ttft_p50_ms", "hit_rate"}."""
    fn = _find()
    if fn is None:
        raise RuntimeError(status()[1])
    rows = fn(
        records=records,
        policy=policy_type,
        base_params=dict(base_params),
        param=param,
        values=list(values),
    )
    return [dict(r) for r in rows]
