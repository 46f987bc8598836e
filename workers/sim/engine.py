"""A step model of vLLM's v1 scheduler and prefix cache, driven by an injected clock.

Pure Python, no I/O, no asyncio, no wall clock: the HTTP server drives it in (scaled)
real time and the offline cluster simulator (bench/) drives many engines in virtual time.

API (all times are model seconds, all durations model seconds)::

    engine = Engine(profile=PROFILES["h100-8b"], num_blocks=4096)
    engine.add_request(request_id="r1", prompt_token_ids=[...], max_tokens=64,
                       arrival_s=now_s, ignore_eos=True)    # raises RequestRejected
    while engine.has_work():                                # discrete-event loop
        t = engine.next_step_time_s(now_s=t)                # >= t
        result = engine.step(now_s=t)                       # schedules one batch
        t = result.end_s                                    # outputs become visible here
        result.events     # KV ops (routing.core.events) in publish order, one batch per step
        result.tokens     # TokenOutput per sequence that sampled a token this step
        result.finished   # FinishedRequest (ttft_s, e2e_s, queue_s, cached_tokens, ...)
    engine.abort_request("r1")   # frees blocks now (client disconnect)

`step(now_s)` models the whole step: it schedules a batch at `now_s`, takes
`duration_s`, and reports what exists at `end_s = now_s + duration_s` (sampled tokens,
finished requests, KV events). A driver must not call `step` again before `end_s`.
`next_step_time_s(now_s)` is `max(now_s, busy_until_s)` while there is work (or the queue
head's `arrival_s` when nothing runs: a step never admits a request that arrives after it
starts), else None.

Rules modelled (vLLM v1, checked against a recorded trace of a real engine):
- `num_blocks` includes the reserved null block: `num_blocks - 1` are usable.
- Only full blocks are hashed; a block's hash chains on its parent's hash.
- A request's hit is the leading run of cached blocks, capped so the last prompt token
  is computed: `cached = min(hit_blocks, (n - 1) // block_size) * block_size`. A recomputed
  full block is stored again (a duplicate copy under the same hash).
- Free blocks form an LRU queue popped from the head. A finished request's blocks are
  freed tail first and appended (they stay hashed, reusable); freed blocks that never got
  a hash (a partial last block) go to the head, so they are reused before any cached block
  (observed in the golden trace). Popping a hashed block evicts it: one `BlockRemoved`
  per block. A hit on a free cached block takes it out of the queue.
- Each step: running requests first (one decode token each, or the next prefill chunk),
  preempting the most recently admitted request (recompute) when blocks run out; then,
  if nothing was preempted, waiting requests FCFS while blocks, the token budget
  (`max_num_batched_tokens`, chunked prefill) and `max_num_seqs` allow.
- Admission allocates blocks for the tokens computed in this step only (prompt blocks
  minus hits; vLLM v1 keeps no decode-growth reserve: in the golden trace a block-aligned
  256-token prompt takes exactly 8 blocks). Decode growth takes one block whenever a
  sequence crosses a block boundary, and preempts when none is free.
- Full blocks of generated tokens are hashed and stored too, like vLLM's.
- A step's `BlockRemoved` events come before its `BlockStored` events.
- Step time: `base_ms + prefill_ms_per_token x prefill_tokens + decode_ms_per_seq x
  decode_seqs` (profile constants; a step with nothing scheduled takes 0).
- Output: deterministic filler tokens (a function of the prompt and position); EOS at a
  deterministic natural length drawn from `eos_range` unless `ignore_eos`; `max_tokens`
  always ends a request ("length").
"""

from __future__ import annotations

import struct
from collections import OrderedDict, deque
from dataclasses import dataclass, field, replace
from typing import Literal

import xxhash

from routing.core.events import BlockRemoved, BlockStored
from routing.core.tokenizer import EOS_ID, FILLER_TOKEN_IDS
from workers.sim.profiles import EngineProfile

FinishReason = Literal["stop", "length", "abort"]
KVOp = BlockStored | BlockRemoved

# Seed of the engine's block hash: deliberately not the router's key function, so
# nothing downstream can rely on engine hashes equalling its own keys.
_ENGINE_HASH_SEED = 0x5EED_CAFE
_MASK64 = (1 << 64) - 1


class RequestRejected(ValueError):
    """The request can never be served by this engine; `field` names the culprit."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class TokenOutput:
    """One token sampled for one request at the end of a step."""

    request_id: str
    token_id: int
    index: int
    first: bool
    finish_reason: FinishReason | None


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    """Accounting of a request that left the engine (times in model seconds)."""

    request_id: str
    finish_reason: FinishReason
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    arrival_s: float
    queue_s: float
    ttft_s: float | None
    e2e_s: float
    preemptions: int


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one engine step did; everything in it is visible at `end_s`."""

    start_s: float
    duration_s: float
    prefill_tokens: int
    decode_seqs: int
    events: tuple[KVOp, ...]
    tokens: tuple[TokenOutput, ...]
    finished: tuple[FinishedRequest, ...]
    preempted: tuple[str, ...]

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Counters and gauges in the shape of vLLM's metrics (cumulative since start)."""

    running: int
    waiting: int
    kv_usage_frac: float
    free_blocks: int
    usable_blocks: int
    prefix_cache_queries_tokens: int
    prefix_cache_hits_tokens: int
    prompt_tokens: int
    generation_tokens: int
    preemptions: int
    steps: int


@dataclass(slots=True)
class _Block:
    block_id: int
    ref_cnt: int = 0
    block_hash: int | None = None


@dataclass(slots=True)
class _Request:
    request_id: str
    prompt_len: int
    token_ids: list[int]
    max_tokens: int
    ignore_eos: bool
    arrival_s: float
    eos_at: int | None
    seed: int
    num_computed: int = 0
    blocks: list[_Block] = field(default_factory=list)
    num_hashed_blocks: int = 0
    block_hashes: list[int] = field(default_factory=list)
    cached_tokens: int = -1
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    preemptions: int = 0

    @property
    def output_len(self) -> int:
        return len(self.token_ids) - self.prompt_len


def _block_hash(parent: int | None, tokens: list[int]) -> int:
    packed = struct.pack(f"<Q{len(tokens)}I", parent if parent is not None else 0, *tokens)
    return xxhash.xxh64_intdigest(packed, seed=_ENGINE_HASH_SEED) & _MASK64


class Engine:
    """One simulated vLLM engine (see the module docstring for the rules and the API)."""

    def __init__(
        self,
        *,
        profile: EngineProfile,
        num_blocks: int | None = None,
        block_size: int | None = None,
        max_num_batched_tokens: int | None = None,
        max_num_seqs: int | None = None,
        max_model_len: int | None = None,
        enable_prefix_caching: bool = True,
        eos_range: tuple[int, int] | None = (64, 512),
    ) -> None:
        """`eos_range` bounds the deterministic natural length at which a request emits
        EOS unless it sets `ignore_eos`; None means only `max_tokens` ends a request."""
        self.profile = replace(
            profile,
            num_blocks=num_blocks or profile.num_blocks,
            block_size=block_size or profile.block_size,
            max_num_batched_tokens=max_num_batched_tokens or profile.max_num_batched_tokens,
            max_num_seqs=max_num_seqs or profile.max_num_seqs,
            max_model_len=max_model_len or profile.max_model_len,
        )
        if self.profile.num_blocks < 2 or self.profile.block_size < 1:
            raise ValueError("need num_blocks >= 2 and block_size >= 1")
        self.block_size = self.profile.block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.eos_range = eos_range
        self._blocks = [_Block(i) for i in range(self.profile.num_blocks)]
        # Block 0 is vLLM's null block: never in the free queue, never handed out.
        self._free: OrderedDict[int, None] = OrderedDict(
            (i, None) for i in range(1, len(self._blocks))
        )
        self._cached: dict[int, dict[int, _Block]] = {}
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._requests: dict[str, _Request] = {}
        self._removed: list[KVOp] = []
        self._stored: list[KVOp] = []
        self._busy_until_s = 0.0
        self._queries_tokens = 0
        self._hits_tokens = 0
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._preemptions = 0
        self._steps = 0

    # -- public API -------------------------------------------------------------------

    @property
    def usable_blocks(self) -> int:
        return len(self._blocks) - 1

    @property
    def busy_until_s(self) -> float:
        return self._busy_until_s

    def add_request(
        self,
        *,
        request_id: str,
        prompt_token_ids: list[int],
        max_tokens: int,
        arrival_s: float,
        ignore_eos: bool = False,
    ) -> None:
        """Queue a request (FCFS). Raises `RequestRejected` when it can never run:
        empty prompt, `max_tokens < 1`, longer than `max_model_len`, or more KV than the
        whole cache; raises ValueError on a duplicate id."""
        n = len(prompt_token_ids)
        if request_id in self._requests:
            raise ValueError(f"duplicate request id {request_id!r}")
        if n == 0:
            raise RequestRejected("prompt must contain at least one token", field="prompt")
        if max_tokens < 1:
            raise RequestRejected("max_tokens must be at least 1", field="max_tokens")
        if n > self.profile.max_model_len:
            raise RequestRejected(
                f"This model's maximum context length is {self.profile.max_model_len} tokens. "
                f"However, your request has {n} input tokens.",
                field="prompt",
            )
        if n + max_tokens > self.profile.max_model_len:
            raise RequestRejected(
                f"max_tokens ({max_tokens}) + prompt tokens ({n}) exceeds the maximum "
                f"context length of {self.profile.max_model_len} tokens",
                field="max_tokens",
            )
        if -(-(n + max_tokens) // self.block_size) > self.usable_blocks:
            raise RequestRejected(
                f"request needs more KV blocks than the engine has ({self.usable_blocks})",
                field="max_tokens",
            )
        seed = xxhash.xxh64_intdigest(struct.pack(f"<{n}I", *prompt_token_ids))
        eos_at: int | None = None
        if self.eos_range is not None and not ignore_eos:
            lo, hi = self.eos_range
            eos_at = lo + seed % (hi - lo + 1)
        req = _Request(
            request_id=request_id,
            prompt_len=n,
            token_ids=list(prompt_token_ids),
            max_tokens=max_tokens,
            ignore_eos=ignore_eos,
            arrival_s=arrival_s,
            eos_at=eos_at,
            seed=seed,
        )
        self._requests[request_id] = req
        self._waiting.append(req)

    def abort_request(self, request_id: str) -> bool:
        """Drop a request now, freeing its blocks (tail first). False if unknown/done."""
        req = self._requests.pop(request_id, None)
        if req is None:
            return False
        if req in self._running:
            self._running.remove(req)
        else:
            self._waiting.remove(req)
        self._free_request_blocks(req)
        return True

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block, like vLLM's `reset_prefix_cache`: refused (False)
        while any block is in use. On success the caller publishes `AllBlocksCleared`."""
        if len(self._free) != self.usable_blocks:
            return False
        for block in self._blocks:
            block.block_hash = None
        self._cached.clear()
        return True

    def has_work(self) -> bool:
        return bool(self._running or self._waiting)

    def next_step_time_s(self, *, now_s: float) -> float | None:
        """When the next step can start (model seconds), or None when idle."""
        if not self.has_work():
            return None
        t = max(now_s, self._busy_until_s)
        if not self._running:
            t = max(t, self._waiting[0].arrival_s)
        return t

    def cached_prefix_tokens(self, prompt_token_ids: list[int]) -> int:
        """How many prompt tokens a request would get from the cache right now."""
        return len(self._find_hit_blocks(prompt_token_ids, [])) * self.block_size

    def stats(self) -> EngineStats:
        free = len(self._free)
        return EngineStats(
            running=len(self._running),
            waiting=len(self._waiting),
            kv_usage_frac=1.0 - free / self.usable_blocks,
            free_blocks=free,
            usable_blocks=self.usable_blocks,
            prefix_cache_queries_tokens=self._queries_tokens,
            prefix_cache_hits_tokens=self._hits_tokens,
            prompt_tokens=self._prompt_tokens,
            generation_tokens=self._generation_tokens,
            preemptions=self._preemptions,
            steps=self._steps,
        )

    def step_duration_s(self, *, prefill_tokens: int, decode_seqs: int) -> float:
        """The step-time model, in model seconds."""
        p = self.profile
        return (
            p.base_ms + p.prefill_ms_per_token * prefill_tokens + p.decode_ms_per_seq * decode_seqs
        ) / 1000.0

    def step(self, *, now_s: float) -> StepResult:
        """Schedule and run one batch starting at `now_s` (see the module docstring)."""
        budget = self.profile.max_num_batched_tokens
        scheduled: list[tuple[_Request, int]] = []
        preempted: list[_Request] = []

        # Running requests first, in admission order; the newest is preempted first.
        i = 0
        while i < len(self._running) and budget > 0:
            req = self._running[i]
            num_new = min(len(req.token_ids) - req.num_computed, budget)
            ok = False
            while True:
                if self._allocate(req, num_new, []):
                    ok = True
                    break
                victim = self._running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is req:
                    break
            if not ok:
                break
            scheduled.append((req, num_new))
            budget -= num_new
            i += 1

        if not preempted:
            while self._waiting and budget > 0 and len(self._running) < self.profile.max_num_seqs:
                req = self._waiting[0]
                if req.arrival_s > now_s:
                    break  # not arrived yet at this step's start (FCFS: nobody behind it either)
                hits: list[_Block] = []
                if req.num_computed == 0 and self.enable_prefix_caching:
                    hits = self._find_hit_blocks(req.token_ids, req.block_hashes)
                hit_tokens = len(hits) * self.block_size
                num_new = min(len(req.token_ids) - hit_tokens, budget)
                if not self._allocate(req, num_new, hits):
                    break
                self._waiting.popleft()
                self._running.append(req)
                if req.cached_tokens < 0:
                    # First scheduling: what usage.prompt_tokens_details reports.
                    req.cached_tokens = hit_tokens
                    req.first_scheduled_s = now_s
                    self._queries_tokens += req.prompt_len
                    self._hits_tokens += hit_tokens
                    self._prompt_tokens += req.prompt_len
                scheduled.append((req, num_new))
                budget -= num_new

        prefill_tokens = 0
        decode_seqs = 0
        for req, num_new in scheduled:
            if num_new == 1 and req.num_computed >= req.prompt_len:
                decode_seqs += 1
            else:
                prefill_tokens += num_new
        duration_s = self.step_duration_s(prefill_tokens=prefill_tokens, decode_seqs=decode_seqs)
        if not scheduled:
            duration_s = 0.0
        end_s = now_s + duration_s

        tokens: list[TokenOutput] = []
        finished: list[FinishedRequest] = []
        for req, num_new in scheduled:
            req.num_computed += num_new
            if req.num_computed < len(req.token_ids):
                continue  # a prefill chunk that did not reach the end of the sequence
            index = req.output_len
            token_id, reason = self._sample(req, index)
            req.token_ids.append(token_id)
            self._generation_tokens += 1
            first = req.first_token_s is None
            if first:
                req.first_token_s = end_s
            tokens.append(TokenOutput(req.request_id, token_id, index, first, reason))
            if reason is not None:
                finished.append(self._finish(req, reason, end_s=end_s))

        if scheduled:
            self._steps += 1
            self._busy_until_s = end_s
        events = tuple(self._removed + self._stored)
        self._removed.clear()
        self._stored.clear()
        return StepResult(
            start_s=now_s,
            duration_s=duration_s,
            prefill_tokens=prefill_tokens,
            decode_seqs=decode_seqs,
            events=events,
            tokens=tuple(tokens),
            finished=tuple(finished),
            preempted=tuple(r.request_id for r in preempted),
        )

    def finish_aborted(self, request_id: str, *, now_s: float) -> FinishedRequest | None:
        """Abort a request and return its accounting (for metrics), or None if unknown."""
        req = self._requests.get(request_id)
        if req is None:
            return None
        self.abort_request(request_id)
        return self._accounting(req, "abort", end_s=now_s)

    # -- internals --------------------------------------------------------------------

    def _sample(self, req: _Request, index: int) -> tuple[int, FinishReason | None]:
        if req.eos_at is not None and index + 1 >= req.eos_at:
            return EOS_ID, "stop"
        # Deterministic filler: a function of the prompt and the position only.
        token_id = FILLER_TOKEN_IDS[(req.seed + index * 2_654_435_761) % len(FILLER_TOKEN_IDS)]
        if index + 1 >= req.max_tokens:
            return token_id, "length"
        return token_id, None

    def _hashes_for(self, token_ids: list[int], upto_blocks: int, known: list[int]) -> list[int]:
        bs = self.block_size
        hashes = known
        while len(hashes) < upto_blocks:
            j = len(hashes)
            hashes.append(_block_hash(hashes[-1] if j else None, token_ids[j * bs : (j + 1) * bs]))
        return hashes

    def _find_hit_blocks(self, token_ids: list[int], known_hashes: list[int]) -> list[_Block]:
        # The last token is always computed (it produces the logits), hence n - 1.
        max_blocks = (len(token_ids) - 1) // self.block_size
        hits: list[_Block] = []
        for h in self._hashes_for(token_ids, max_blocks, known_hashes)[:max_blocks]:
            copies = self._cached.get(h)
            if not copies:
                break
            hits.append(next(iter(copies.values())))
        return hits

    def _allocate(self, req: _Request, num_new: int, hits: list[_Block]) -> bool:
        bs = self.block_size
        computed = req.num_computed + len(hits) * bs
        required = -(-(computed + num_new) // bs)
        num_new_blocks = required - len(req.blocks) - len(hits)
        evictable_hits = sum(1 for b in hits if b.ref_cnt == 0)
        if num_new_blocks + evictable_hits > len(self._free):
            return False
        for b in hits:
            if b.ref_cnt == 0:
                del self._free[b.block_id]
            b.ref_cnt += 1
        if hits:
            req.blocks.extend(hits)
            req.num_computed = computed
            req.num_hashed_blocks = len(hits)
        for _ in range(max(0, num_new_blocks)):
            block_id, _unused = self._free.popitem(last=False)
            block = self._blocks[block_id]
            self._evict(block)
            block.ref_cnt = 1
            req.blocks.append(block)
        if self.enable_prefix_caching:
            self._cache_full_blocks(req, min(computed + num_new, len(req.token_ids)))
        return True

    def _evict(self, block: _Block) -> None:
        h = block.block_hash
        if h is None:
            return
        copies = self._cached.get(h)
        if copies is not None and copies.pop(block.block_id, None) is not None:
            if not copies:
                del self._cached[h]
            self._removed.append(BlockRemoved(engine_hashes=(h,)))
        block.block_hash = None

    def _cache_full_blocks(self, req: _Request, num_tokens: int) -> None:
        bs = self.block_size
        full = num_tokens // bs
        start = req.num_hashed_blocks
        if full <= start:
            return
        hashes = self._hashes_for(req.token_ids, full, req.block_hashes)
        for j in range(start, full):
            block = req.blocks[j]
            block.block_hash = hashes[j]
            self._cached.setdefault(hashes[j], {})[block.block_id] = block
        self._stored.append(
            BlockStored(
                engine_hashes=tuple(hashes[start:full]),
                parent_engine_hash=hashes[start - 1] if start > 0 else None,
                token_ids=tuple(req.token_ids[start * bs : full * bs]),
                block_size=bs,
            )
        )
        req.num_hashed_blocks = full

    def _free_request_blocks(self, req: _Request) -> None:
        # Tail first: a request's last blocks are the least likely to be shared, so they
        # are evicted before its prefix. Never-hashed blocks go to the head of the queue.
        for block in reversed(req.blocks):
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block.block_id] = None
                if block.block_hash is None:
                    self._free.move_to_end(block.block_id, last=False)
        req.blocks = []
        req.num_hashed_blocks = 0

    def _preempt(self, req: _Request) -> None:
        # Recompute preemption: drop all KV, requeue at the front with everything so far.
        self._free_request_blocks(req)
        req.num_computed = 0
        req.preemptions += 1
        self._preemptions += 1
        self._waiting.appendleft(req)

    def _finish(self, req: _Request, reason: FinishReason, *, end_s: float) -> FinishedRequest:
        self._running.remove(req)
        del self._requests[req.request_id]
        self._free_request_blocks(req)
        return self._accounting(req, reason, end_s=end_s)

    def _accounting(self, req: _Request, reason: FinishReason, *, end_s: float) -> FinishedRequest:
        scheduled_s = req.first_scheduled_s if req.first_scheduled_s is not None else end_s
        return FinishedRequest(
            request_id=req.request_id,
            finish_reason=reason,
            prompt_tokens=req.prompt_len,
            cached_tokens=max(req.cached_tokens, 0),
            output_tokens=req.output_len,
            arrival_s=req.arrival_s,
            queue_s=scheduled_s - req.arrival_s,
            ttft_s=None if req.first_token_s is None else req.first_token_s - req.arrival_s,
            e2e_s=end_s - req.arrival_s,
            preemptions=req.preemptions,
        )
