"""Prefix block index: which workers hold which chained block keys.

Two layers share one table:

- **precise**: blocks a worker's engine reported through KV events (``apply``). They stay until
  the engine removes them, the worker is cleared, or the global memory bound evicts them.
- **approximate**: blocks the gateway itself routed to a worker (``record_routed``). They expire
  ``approx_ttl_s`` after they were last recorded and are bounded per worker by an LRU sized from
  the worker's KV capacity (``set_capacity``).

Layout, chosen for ~150 bytes per entry at a million entries: ``_blocks`` maps a block key to one
int whose bit ``2*slot`` means "precise on worker ``slot``" and bit ``2*slot+1`` "approximate on
worker ``slot``" (worker ids are interned as small slot numbers). The dict's insertion order is
the global recency order (storing or routing a key re-inserts it; matching does not, to keep the
hot path read-only), so LRU eviction pops from its front. Per
worker there is an engine-hash -> key map (to resolve ``BlockRemoved`` and ``parent_block_hash``)
and an insertion-ordered key -> expiry map for the approximate layer, whose order is both its LRU
order and its expiry order because one TTL applies to every record.

An *entry* is one distinct block key, whatever the number of workers holding it. ``now_s`` is any
monotonic clock in seconds and must not go backwards between calls.

Keys are computed from the events' token ids, never taken from the engine's hashes, so they equal
what the gateway computes from a prompt. What the engine hashes and we do not: a LoRA adapter
(handled: adapter chains start from a per-adapter root and never match base-model prompts) and
multimodal or cache-salt extra keys (not handled: two such blocks with the same token ids share
one key; removing either forgets the key, the safe direction). The medium (GPU, CPU offload) is
not distinguished: a block stored in any tier counts as cached, a removal from any tier forgets it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from heapq import heappop, heappush
from itertools import islice
from typing import NamedTuple

from xxhash import xxh3_64_intdigest

from routing.core.blocks import ROOT_KEY, token_block_keys
from routing.core.errors import MalformedEvent
from routing.core.events import AllBlocksCleared, BlockRemoved, BlockStored, KVOp, validate_op

__all__ = ["BlockCounts", "IndexStats", "PrefixIndex"]

# Bounds are enforced with a little hysteresis (evict down to bound - bound/64) so that popping the
# oldest keys of an insertion-ordered dict scans its freed front slots once per batch, not per key.
_EVICT_SLACK_DIVISOR = 64
_MAX_INTERNED_MASKS = 4096


def _lora_root(lora_id: int) -> int:
    """Root key of chains computed under a LoRA adapter.

    The engine's hashes include the adapter but the gateway's keys do not, so adapter blocks are
    keyed from their own root: they never match (or are reported for) base-model prompts.
    """
    return xxh3_64_intdigest(b"kvroute/lora/%d" % lora_id, ROOT_KEY)


class BlockCounts(NamedTuple):
    """Blocks one worker holds in each layer."""

    precise: int
    approximate: int


@dataclass(frozen=True, slots=True)
class IndexStats:
    """A snapshot of the index's size and churn since construction."""

    entries: int
    max_entries: int
    per_worker: dict[str, BlockCounts]
    evicted_entries: int
    expired_blocks: int
    orphaned_blocks: int
    approx_ttl_s: float
    # block size of each worker's latest BlockStored: keys only match prompts hashed with it
    event_block_sizes: dict[str, int] = field(default_factory=dict)


class PrefixIndex:
    """Block key -> workers holding it, with longest-prefix matching for every worker at once.

    ``max_entries`` bounds the number of distinct keys (least recently stored/routed first out);
    ``approx_ttl_s`` is the lifetime of an approximate (routed, unconfirmed) block;
    ``default_capacity_blocks`` bounds each worker's approximate layer until ``set_capacity``
    says otherwise (0 = only the global bound applies).
    """

    def __init__(
        self,
        *,
        max_entries: int = 1_000_000,
        approx_ttl_s: float = 120.0,
        default_capacity_blocks: int = 0,
    ) -> None:
        if max_entries <= 0:
            raise ValueError(f"max_entries must be positive, got {max_entries}")
        if not approx_ttl_s > 0:
            raise ValueError(f"approx_ttl_s must be positive, got {approx_ttl_s}")
        if default_capacity_blocks < 0:
            raise ValueError(f"default_capacity_blocks must be >= 0, got {default_capacity_blocks}")
        self._max_entries = max_entries
        self._approx_ttl_s = float(approx_ttl_s)
        self._default_capacity = default_capacity_blocks
        self._blocks: dict[int, int] = {}
        self._slot_of: dict[str, int] = {}
        self._worker_of: list[str | None] = []
        self._free_slots: list[int] = []
        self._engine: list[dict[int, int]] = []
        self._approx: list[dict[int, float]] = []
        self._precise_count: list[int] = []
        self._capacity: list[int] = []
        self._event_block_size: list[int] = []
        # One shared int object per slot bit, and interned multi-worker masks: most keys have the
        # same few holder sets, so sharing the mask objects saves ~35 bytes per entry.
        self._pbit: list[int] = []
        self._abit: list[int] = []
        self._masks: dict[int, int] = {}
        # bits 2*slot for every slot in use: folds a two-bit mask into "held in any layer"
        self._even_mask = 0
        # (expiry_s, slot) per record_routed call, oldest first: says whose approximate layer
        # may hold expired blocks without scanning every worker.
        self._expiry_queue: deque[tuple[float, int]] = deque()
        self._evicted = 0
        self._expired = 0
        self._orphaned = 0

    # -- workers -------------------------------------------------------------------------------

    def _slot(self, worker_id: str) -> int:
        slot = self._slot_of.get(worker_id)
        if slot is not None:
            return slot
        if self._free_slots:
            # lowest free slot first keeps masks narrow
            slot = heappop(self._free_slots)
            self._worker_of[slot] = worker_id
            self._capacity[slot] = self._default_capacity
            self._event_block_size[slot] = 0
        else:
            slot = len(self._worker_of)
            self._worker_of.append(worker_id)
            self._engine.append({})
            self._approx.append({})
            self._precise_count.append(0)
            self._capacity.append(self._default_capacity)
            self._event_block_size.append(0)
            self._pbit.append(1 << (2 * slot))
            self._abit.append(2 << (2 * slot))
        self._slot_of[worker_id] = slot
        self._even_mask |= 1 << (2 * slot)
        return slot

    def set_capacity(self, worker_id: str, capacity_blocks: int) -> None:
        """Bound ``worker_id``'s approximate layer to ``capacity_blocks`` (0 = unbounded).

        Typically the worker's ``num_gpu_blocks``; shrinking evicts its oldest approximate blocks.
        """
        if capacity_blocks < 0:
            raise ValueError(f"capacity_blocks must be >= 0, got {capacity_blocks}")
        slot = self._slot(worker_id)
        self._capacity[slot] = capacity_blocks
        self._bound_approx(slot)

    def clear_worker(self, worker_id: str) -> None:
        """Forget every block ``worker_id`` holds (both layers); the worker stays known."""
        slot = self._slot_of.get(worker_id)
        if slot is not None:
            self._clear_slot(slot)

    def remove_worker(self, worker_id: str) -> None:
        """Forget ``worker_id`` entirely: its blocks, capacity and slot."""
        slot = self._slot_of.pop(worker_id, None)
        if slot is None:
            return
        self._clear_slot(slot)
        self._worker_of[slot] = None
        self._even_mask &= ~(1 << (2 * slot))
        heappush(self._free_slots, slot)

    def _clear_slot(self, slot: int) -> None:
        pbit = 1 << (2 * slot)
        abit = pbit << 1
        for key in self._engine[slot].values():
            self._clear_bits(key, pbit)
        for key in self._approx[slot]:
            self._clear_bits(key, abit)
        self._engine[slot] = {}
        self._approx[slot] = {}
        self._precise_count[slot] = 0

    def _intern(self, mask: int) -> int:
        shared = self._masks.get(mask)
        if shared is None:
            if len(self._masks) >= _MAX_INTERNED_MASKS:
                self._masks.clear()
            self._masks[mask] = shared = mask
        return shared

    def _clear_bits(self, key: int, bits: int) -> int:
        """Clear ``bits`` of ``key`` in place (recency unchanged); returns the bits that were set."""
        value = self._blocks.get(key)
        if value is None or not value & bits:
            return 0
        remaining = value & ~bits
        if remaining:
            self._blocks[key] = self._intern(remaining)
        else:
            del self._blocks[key]
        return value & bits

    # -- precise layer -------------------------------------------------------------------------

    def apply(self, worker_id: str, ops: Iterable[KVOp], *, now_s: float) -> None:
        """Apply KV-event ops from ``worker_id``'s engine, in order.

        All ops are validated first: on ``MalformedEvent`` nothing is applied. A ``BlockStored``
        whose parent hash is unknown (events were lost or evicted) cannot be keyed and is counted
        in ``stats().orphaned_blocks`` instead.
        """
        batch = list(ops)
        for op in batch:
            validate_op(op)
        self._expire(now_s)
        slot = self._slot(worker_id)
        for op in batch:
            if isinstance(op, BlockStored):
                self._store(slot, op)
            elif isinstance(op, BlockRemoved):
                self._remove(slot, op.engine_hashes)
            elif isinstance(op, AllBlocksCleared):
                self._clear_slot(slot)
            else:  # pragma: no cover - validate_op rejects anything else
                raise MalformedEvent(f"not a KV op: {type(op).__name__}")
        self._bound_entries()

    def _store(self, slot: int, op: BlockStored) -> None:
        engine = self._engine[slot]
        if op.parent_engine_hash is None:
            parent = ROOT_KEY if op.lora_id is None else _lora_root(op.lora_id)
        else:
            known = engine.get(op.parent_engine_hash)
            if known is None:
                self._orphaned += len(op.engine_hashes)
                return
            parent = known
        keys = token_block_keys(op.token_ids, op.block_size, parent=parent)
        self._event_block_size[slot] = op.block_size
        pbit = self._pbit[slot]
        abit = pbit << 1
        blocks = self._blocks
        approx = self._approx[slot]
        added = 0
        # Tail first, so that the chain's head ends up most recent and LRU eviction trims chains
        # from the end the way an engine frees a request's blocks, keeping prefixes matchable.
        for engine_hash, key in zip(reversed(op.engine_hashes), reversed(keys), strict=True):
            engine[engine_hash] = key
            value = blocks.pop(key, 0)
            if not value:
                blocks[key] = pbit
                added += 1
                continue
            if not value & pbit:
                added += 1
            if value & abit:
                # confirmed by the engine: the speculative copy is redundant
                del approx[key]
                value ^= abit
            blocks[key] = self._intern(value | pbit)
        self._precise_count[slot] += added

    def _remove(self, slot: int, engine_hashes: Sequence[int]) -> None:
        engine = self._engine[slot]
        pbit = 1 << (2 * slot)
        removed = 0
        for engine_hash in engine_hashes:
            key = engine.pop(engine_hash, None)
            if key is not None and self._clear_bits(key, pbit):
                removed += 1
        self._precise_count[slot] -= removed

    # -- approximate layer ---------------------------------------------------------------------

    def record_routed(self, worker_id: str, keys: Sequence[int], *, now_s: float) -> None:
        """Remember that the prompt with block ``keys`` was just sent to ``worker_id``.

        Blocks the worker already holds precisely are only refreshed in the global LRU.
        """
        self._expire(now_s)
        slot = self._slot(worker_id)
        if not keys:
            return
        pbit = self._pbit[slot]
        abit = self._abit[slot]
        held = pbit | abit
        expiry_s = now_s + self._approx_ttl_s
        blocks = self._blocks
        pop = blocks.pop
        approx = self._approx[slot]
        approx_pop = approx.pop
        # Per request on the gateway's path: the branches keep the common cases (new key, or a
        # key this worker already holds) to a handful of dict operations.
        for key in reversed(keys):  # tail first: see _store
            value = pop(key, 0)
            if not value:
                blocks[key] = abit
            elif value & held:
                blocks[key] = value
                if value & pbit:
                    continue
            else:
                blocks[key] = self._intern(value | abit)
            # re-insert so the dict's order stays oldest-expiry-first
            approx_pop(key, None)
            approx[key] = expiry_s
        self._expiry_queue.append((expiry_s, slot))
        self._bound_approx(slot)
        self._bound_entries()

    def _bound_approx(self, slot: int) -> None:
        capacity = self._capacity[slot]
        approx = self._approx[slot]
        if not capacity or len(approx) <= capacity:
            return
        target = capacity - capacity // _EVICT_SLACK_DIVISOR
        abit = 2 << (2 * slot)
        for key in list(islice(approx, len(approx) - target)):
            del approx[key]
            self._clear_bits(key, abit)

    def _expire(self, now_s: float) -> None:
        queue = self._expiry_queue
        while queue and queue[0][0] <= now_s:
            _, slot = queue.popleft()
            approx = self._approx[slot]
            expired: list[int] = []
            for key, expiry_s in approx.items():
                if expiry_s > now_s:
                    break
                expired.append(key)
            if not expired:
                continue
            abit = 2 << (2 * slot)
            for key in expired:
                del approx[key]
                self._clear_bits(key, abit)
            self._expired += len(expired)

    # -- global bound --------------------------------------------------------------------------

    def _bound_entries(self) -> None:
        blocks = self._blocks
        if len(blocks) <= self._max_entries:
            return
        target = self._max_entries - self._max_entries // _EVICT_SLACK_DIVISOR
        victims = list(islice(blocks.items(), len(blocks) - target))
        for key, value in victims:
            del blocks[key]
            while value:
                low = value & -value
                bit = low.bit_length() - 1
                value ^= low
                if bit & 1:
                    del self._approx[bit >> 1][key]
                else:
                    self._precise_count[bit >> 1] -= 1
        self._evicted += len(victims)

    # -- queries -------------------------------------------------------------------------------

    def match(self, keys: Sequence[int], *, now_s: float) -> dict[str, int]:
        """Worker id -> number of leading blocks of ``keys`` it holds (precise or unexpired
        approximate); workers holding none are omitted.

        One pass over ``keys`` that stops at the first block nobody holds; per block it does one
        dict lookup and a few bitmask operations, independent of the number of entries.
        """
        self._expire(now_s)
        get = self._blocks.get
        even = self._even_mask
        result: dict[str, int] = {}
        alive = 0
        previous = -1
        matched = 0
        for key in keys:
            value = get(key)
            if value is None:
                break
            if value != previous:
                held = (value | (value >> 1)) & even
                if matched == 0:
                    alive = held
                else:
                    still = alive & held
                    if still != alive:
                        self._report(alive ^ still, matched, result)
                        alive = still
                        if not alive:
                            break
                previous = value
            matched += 1
        if alive:
            self._report(alive, matched, result)
        return result

    def _report(self, mask: int, blocks: int, result: dict[str, int]) -> None:
        worker_of = self._worker_of
        while mask:
            low = mask & -mask
            worker = worker_of[(low.bit_length() - 1) >> 1]
            if worker is not None:
                result[worker] = blocks
            mask ^= low

    def workers(self) -> list[str]:
        """Worker ids the index knows, in slot order."""
        return [w for w in self._worker_of if w is not None]

    def stats(self, *, now_s: float | None = None) -> IndexStats:
        """Sizes and counters; with ``now_s``, expired approximate blocks are dropped first."""
        if now_s is not None:
            self._expire(now_s)
        per_worker = {
            worker: BlockCounts(self._precise_count[slot], len(self._approx[slot]))
            for slot, worker in enumerate(self._worker_of)
            if worker is not None
        }
        return IndexStats(
            entries=len(self._blocks),
            max_entries=self._max_entries,
            per_worker=per_worker,
            evicted_entries=self._evicted,
            expired_blocks=self._expired,
            orphaned_blocks=self._orphaned,
            approx_ttl_s=self._approx_ttl_s,
            event_block_sizes={
                worker: self._event_block_size[slot]
                for slot, worker in enumerate(self._worker_of)
                if worker is not None and self._event_block_size[slot]
            },
        )

    def __len__(self) -> int:
        return len(self._blocks)
