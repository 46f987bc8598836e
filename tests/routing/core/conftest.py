"""Builders for the pure routing-core tests: plain functions, overridable by keyword."""

from __future__ import annotations

import random
from collections.abc import Sequence

from routing.core.events import BlockStored
from routing.core.types import WorkerView

MODEL = "sim-8b"
BLOCK_SIZE = 16


def make_worker(**overrides: object) -> WorkerView:
    """A healthy, idle worker; any field can be overridden (``id`` defaults to "w0")."""
    worker_id = str(overrides.pop("id", "w0"))
    fields: dict[str, object] = {
        "id": worker_id,
        "url": f"http://127.0.0.1:8100/{worker_id}",
        "model": MODEL,
        "block_size": BLOCK_SIZE,
        "capacity_blocks": 4096,
    }
    fields.update(overrides)
    return WorkerView(**fields)  # type: ignore[arg-type]


def make_tokens(n_tokens: int, *, seed: int = 0, vocab: int = 32_000) -> list[int]:
    """``n_tokens`` reproducible pseudo-random token ids below ``vocab``."""
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n_tokens)]


def make_stored(
    tokens: Sequence[int],
    *,
    first_hash: int,
    parent_hash: int | None = None,
    block_size: int = BLOCK_SIZE,
) -> BlockStored:
    """A BlockStored for the full blocks of ``tokens``, engine hashes first_hash, first_hash+1, ..."""
    n_blocks = len(tokens) // block_size
    return BlockStored(
        engine_hashes=tuple(range(first_hash, first_hash + n_blocks)),
        parent_engine_hash=parent_hash,
        token_ids=tuple(tokens[: n_blocks * block_size]),
        block_size=block_size,
    )
