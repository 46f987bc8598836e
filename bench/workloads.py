"""Deterministic benchmark workloads: prompts as token ids, built from labelled segments.

Every prompt is a concatenation of *segments*. A segment is a label plus a length; its token
ids are derived from ``(seed, label)`` alone (SHAKE-128 of the label), so the same label gives
the same tokens in every request, every process and every run. Reuse between requests is
expressed by sharing labels (a tenant's prefix, a conversation's history, a Mooncake hash id),
and nothing else can collide. No tokenizer is involved anywhere: prompts are sent as token-id
lists to ``/v1/completions``.

Workloads (all parameters documented in ``WORKLOAD_PARAMS``):

- ``tenants``: T tenants, each with a shared P-token prefix (system prompt + documents);
  U users per tenant ask ``questions_per_user`` Q-token questions; requests shuffled by the seed.
  (The llm-d prefix-cache benchmark shape is 150 x 6k prefix, 5 users, 1.2k queries.)
- ``chat``: C conversations of K turns; turn k's prompt is the system prompt, every previous
  user message and assistant reply, and the new user message (history grows turn by turn).
- ``agent``: A agent loops over S steps sharing one of ``instruction_sets`` stable instruction
  blocks; each step appends the model's action and a tool result to the context.
- ``unique``: N prompts of L tokens with nothing in common (the control).
- ``trace``: Mooncake-format JSONL (``timestamp`` ms, ``input_length``, ``output_length``,
  ``hash_ids`` of 512-token blocks). Each hash id expands to the same 512 token ids wherever it
  appears; the prompt is cut (or filled with request-unique tokens) to ``input_length``.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import sys
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from routing.core.blocks import ROOT_KEY, token_block_keys

# Token ids live in [TOKEN_LO, TOKEN_LO + TOKEN_SPAN): clear of the low ids a tokenizer keeps for
# bytes/special tokens and below the simulated engine's builtin vocabulary size (32,000). A token
# is two bytes of SHAKE-128 output: the low byte as drawn, the high byte mapped into [1, 117).
TOKEN_LO = 256
_HIGH_BYTES = 116
TOKEN_SPAN = _HIGH_BYTES * 256
MOONCAKE_BLOCK_TOKENS = 512
_HIGH_MAP = bytes(1 + b % _HIGH_BYTES for b in range(256))
DEFAULT_TRACE = Path(__file__).resolve().parent / "traces" / "mooncake_synthetic_trace.jsonl"


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of ``length`` deterministic token ids named by ``label``, or, when ``literal`` is
    set, exactly those token ids (recorded requests)."""

    label: str
    length: int
    literal: tuple[int, ...] | None = None

    def tokens(self, seed: int) -> Sequence[int]:
        return (
            self.literal
            if self.literal is not None
            else segment_tokens(seed, self.label, self.length)
        )


@lru_cache(maxsize=32768)
def segment_tokens(seed: int, label: str, length: int) -> Sequence[int]:
    """The ``length`` token ids of segment ``label`` under ``seed`` (pure function of its inputs),
    as a read-only-by-convention ``array('H')`` (compact, and fast to copy into a list).

    A shorter length gives a prefix of a longer one, so a trace's cut last block is a prefix of
    the same block in full.
    """
    if length <= 0:
        return array("H")
    # Byte-level mapping: no per-token Python work.
    raw = bytearray(hashlib.shake_128(f"{seed}:{label}".encode()).digest(2 * length))
    raw[1::2] = raw[1::2].translate(_HIGH_MAP)
    tokens = array("H", raw)
    if sys.byteorder == "big":  # pragma: no cover - tokens must not depend on the host
        tokens.byteswap()
    return tokens


@dataclass(frozen=True, slots=True)
class BenchRequest:
    """One request of a workload.

    ``arrival_s`` is the offset from the start of the run at which an open-loop generator
    sends it (None: the generator assigns Poisson arrivals or runs closed loop).
    """

    request_id: str
    segments: tuple[Segment, ...]
    max_tokens: int
    seed: int
    arrival_s: float | None = None
    tenant: str | None = None
    session_key: str | None = None

    @property
    def prompt_tokens(self) -> int:
        return sum(s.length for s in self.segments)

    def token_ids(self) -> list[int]:
        out: list[int] = []
        for s in self.segments:
            out.extend(s.tokens(self.seed))
        return out

    def block_keys(self, block_size: int) -> tuple[int, ...]:
        """Chained keys (routing.core.blocks) of the prompt's full ``block_size`` blocks.

        Equal to ``token_block_keys(self.token_ids(), block_size)``; block-aligned segments are
        memoised by (parent key, label), which makes long shared prefixes nearly free.
        """
        keys: list[int] = []
        parent = ROOT_KEY
        carry: list[int] = []
        for s in self.segments:
            if not carry and s.literal is None and s.length % block_size == 0:
                seg_keys = _aligned_keys(self.seed, s.label, s.length, block_size, parent)
                if seg_keys:
                    keys.extend(seg_keys)
                    parent = seg_keys[-1]
                continue
            carry.extend(s.tokens(self.seed))  # list.extend takes the array as it is
            full = len(carry) // block_size
            if full:
                seg_keys = token_block_keys(carry[: full * block_size], block_size, parent=parent)
                keys.extend(seg_keys)
                parent = seg_keys[-1]
                carry = carry[full * block_size :]
        return tuple(keys)


@lru_cache(maxsize=65536)
def _aligned_keys(
    seed: int, label: str, length: int, block_size: int, parent: int
) -> tuple[int, ...]:
    return token_block_keys(segment_tokens(seed, label, length).tolist(), block_size, parent=parent)  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------- generators


@dataclass(frozen=True, slots=True)
class ParamDoc:
    default: float | int | str
    help: str


WORKLOAD_PARAMS: dict[str, dict[str, ParamDoc]] = {
    "tenants": {
        "tenants": ParamDoc(150, "number of tenants T"),
        "prefix_tokens": ParamDoc(6000, "shared prefix per tenant P (system prompt + documents)"),
        "users": ParamDoc(5, "users per tenant U"),
        "questions_per_user": ParamDoc(2, "questions each user asks"),
        "question_tokens": ParamDoc(1200, "tokens per question Q"),
        "output_tokens": ParamDoc(100, "max_tokens of each answer"),
    },
    "chat": {
        "conversations": ParamDoc(64, "number of conversations C"),
        "turns": ParamDoc(6, "turns per conversation K"),
        "system_tokens": ParamDoc(800, "per-conversation system prompt"),
        "user_tokens": ParamDoc(200, "tokens per user message"),
        "reply_tokens": ParamDoc(250, "tokens per assistant reply kept in the history"),
        "output_tokens": ParamDoc(250, "max_tokens of each reply"),
    },
    "agent": {
        "agents": ParamDoc(32, "number of agent loops A"),
        "steps": ParamDoc(8, "steps per loop S"),
        "instruction_sets": ParamDoc(4, "distinct stable instruction blocks shared by the agents"),
        "instruction_tokens": ParamDoc(4000, "tokens per instruction block (tools, rules)"),
        "task_tokens": ParamDoc(300, "per-agent task description"),
        "action_tokens": ParamDoc(80, "tokens of each model action kept in the context"),
        "tool_tokens": ParamDoc(600, "tokens of each tool result appended"),
        "output_tokens": ParamDoc(80, "max_tokens of each step"),
    },
    "unique": {
        "requests": ParamDoc(400, "number of requests N"),
        "prompt_tokens": ParamDoc(2000, "tokens per prompt L"),
        "output_tokens": ParamDoc(100, "max_tokens of each answer"),
    },
    "trace": {
        "path": ParamDoc(str(DEFAULT_TRACE), "Mooncake-format JSONL file"),
        "speed": ParamDoc(1.0, "time compression: arrival = timestamp_ms / 1000 / speed"),
        "max_output_tokens": ParamDoc(0, "cap on output_length (0: no cap)"),
    },
}

# Parameters that are token counts: --scale multiplies these (never counts of things).
_TOKEN_PARAMS = {
    "prefix_tokens",
    "question_tokens",
    "output_tokens",
    "system_tokens",
    "user_tokens",
    "reply_tokens",
    "instruction_tokens",
    "task_tokens",
    "action_tokens",
    "tool_tokens",
    "prompt_tokens",
}


def resolve_params(
    workload: str, params: Mapping[str, Any] | None = None, *, scale: float = 1.0
) -> dict[str, Any]:
    """Defaults overlaid with ``params``, token counts multiplied by ``scale`` (min 1 token).

    Raises ValueError naming the unknown workload or parameter.
    """
    if workload not in WORKLOAD_PARAMS:
        raise ValueError(f"unknown workload {workload!r}; choose from {sorted(WORKLOAD_PARAMS)}")
    docs = WORKLOAD_PARAMS[workload]
    out: dict[str, Any] = {k: d.default for k, d in docs.items()}
    for k, v in (params or {}).items():
        if k not in docs:
            raise ValueError(
                f"unknown parameter {k!r} for workload {workload!r}; known: {sorted(docs)}"
            )
        default = docs[k].default
        out[k] = type(default)(v) if not isinstance(default, str) else str(v)
    if scale != 1.0:
        for k in docs:
            if k in _TOKEN_PARAMS:
                out[k] = max(1, round(out[k] * scale))
    return out


def _tenants(p: Mapping[str, Any], seed: int) -> list[BenchRequest]:
    reqs = []
    for t in range(p["tenants"]):
        prefix = Segment(f"tenant{t}/prefix", p["prefix_tokens"])
        for u in range(p["users"]):
            for q in range(p["questions_per_user"]):
                reqs.append(
                    BenchRequest(
                        request_id=f"t{t}-u{u}-q{q}",
                        segments=(prefix, Segment(f"tenant{t}/user{u}/q{q}", p["question_tokens"])),
                        max_tokens=p["output_tokens"],
                        seed=seed,
                        tenant=f"tenant{t}",
                        session_key=f"tenant{t}/user{u}",
                    )
                )
    random.Random(seed).shuffle(reqs)
    return reqs


def _interleave_sessions(sessions: list[list[BenchRequest]], seed: int) -> list[BenchRequest]:
    """Random interleaving that keeps each session's own order (turn k before turn k+1)."""
    rng = random.Random(seed)
    order = [i for i, s in enumerate(sessions) for _ in s]
    rng.shuffle(order)
    cursors = [0] * len(sessions)
    out = []
    for i in order:
        out.append(sessions[i][cursors[i]])
        cursors[i] += 1
    return out


def _chat(p: Mapping[str, Any], seed: int) -> list[BenchRequest]:
    sessions = []
    for c in range(p["conversations"]):
        history = [Segment(f"chat{c}/system", p["system_tokens"])]
        turns = []
        for k in range(p["turns"]):
            history.append(Segment(f"chat{c}/user{k}", p["user_tokens"]))
            turns.append(
                BenchRequest(
                    request_id=f"c{c}-k{k}",
                    segments=tuple(history),
                    max_tokens=p["output_tokens"],
                    seed=seed,
                    session_key=f"chat{c}",
                )
            )
            history.append(Segment(f"chat{c}/reply{k}", p["reply_tokens"]))
        sessions.append(turns)
    return _interleave_sessions(sessions, seed)


def _agent(p: Mapping[str, Any], seed: int) -> list[BenchRequest]:
    sessions = []
    for a in range(p["agents"]):
        inst = a % max(1, p["instruction_sets"])
        context = [
            Segment(f"agent-instructions{inst}", p["instruction_tokens"]),
            Segment(f"agent{a}/task", p["task_tokens"]),
        ]
        steps = []
        for s in range(p["steps"]):
            steps.append(
                BenchRequest(
                    request_id=f"a{a}-s{s}",
                    segments=tuple(context),
                    max_tokens=p["output_tokens"],
                    seed=seed,
                    tenant=f"instructions{inst}",
                    session_key=f"agent{a}",
                )
            )
            context.append(Segment(f"agent{a}/action{s}", p["action_tokens"]))
            context.append(Segment(f"agent{a}/tool{s}", p["tool_tokens"]))
        sessions.append(steps)
    return _interleave_sessions(sessions, seed)


def _unique(p: Mapping[str, Any], seed: int) -> list[BenchRequest]:
    return [
        BenchRequest(
            request_id=f"u{i}",
            segments=(Segment(f"unique{i}", p["prompt_tokens"]),),
            max_tokens=p["output_tokens"],
            seed=seed,
        )
        for i in range(p["requests"])
    ]


def trace_request(
    record: Mapping[str, Any],
    *,
    index: int,
    seed: int,
    speed: float = 1.0,
    scale: float = 1.0,
    max_output_tokens: int = 0,
) -> BenchRequest:
    """One Mooncake record as a request. Raises ValueError naming a missing or bad field.

    Hash id h is segment ``hash{h}`` of ``512 x scale`` tokens; the prompt is cut to
    ``input_length x scale`` or filled with the request-unique segment ``req{index}/tail``.
    """
    for name in ("timestamp", "input_length", "output_length", "hash_ids"):
        if name not in record:
            raise ValueError(f"trace record {index}: missing field {name!r}")
    hash_ids = record["hash_ids"]
    if not isinstance(hash_ids, list) or not all(isinstance(h, int) for h in hash_ids):
        raise ValueError(f"trace record {index}: field 'hash_ids' must be a list of integers")
    block = max(1, round(MOONCAKE_BLOCK_TOKENS * scale))
    remaining = max(1, round(int(record["input_length"]) * scale))
    segs: list[Segment] = []
    for h in hash_ids:
        if remaining <= 0:
            break
        n = min(block, remaining)
        segs.append(Segment(f"hash{h}", n))
        remaining -= n
    if remaining > 0:
        segs.append(Segment(f"req{index}/tail", remaining))
    out_tokens = (
        max(1, round(int(record["output_length"]) * scale))
        if scale != 1.0
        else int(record["output_length"])
    )
    if max_output_tokens:
        out_tokens = min(out_tokens, max_output_tokens)
    return BenchRequest(
        request_id=f"trace{index}",
        segments=tuple(segs),
        max_tokens=max(1, out_tokens),
        seed=seed,
        arrival_s=float(record["timestamp"]) / 1000.0 / speed,
    )


def load_trace(
    path: str | Path,
    *,
    seed: int = 0,
    speed: float = 1.0,
    scale: float = 1.0,
    max_output_tokens: int = 0,
    limit: int | None = None,
) -> list[BenchRequest]:
    """Requests of a Mooncake-format JSONL file, in file order."""
    if speed <= 0:
        raise ValueError("speed must be positive")
    out: list[BenchRequest] = []
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if limit is not None and len(out) >= limit:
                break
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"trace line {i + 1}: not JSON ({exc})") from None
            out.append(
                trace_request(
                    rec,
                    index=i,
                    seed=seed,
                    speed=speed,
                    scale=scale,
                    max_output_tokens=max_output_tokens,
                )
            )
    return out


def requests_from_records(
    records: Sequence[Mapping[str, Any]], *, block_size: int = 16, seed: int = 0
) -> list[BenchRequest]:
    """Recorded requests (dicts) -> requests, in arrival order.

    Each record needs ``prompt_token_ids`` (a list of ints) or ``block_keys`` (chained keys of
    ``block_size``-token blocks) with ``prompt_tokens``; optional ``request_id``, ``ts_s`` or
    ``arrival_s`` (seconds; offsets from the first record are used), ``max_tokens`` or
    ``output_tokens`` (default 16), ``tenant``, ``session_key``. A block key becomes
    ``block_size`` deterministic tokens named after the key, so requests that shared key k share
    those tokens and the simulator sees the same reuse; tokens past the keyed blocks are unique
    to the request. Raises ValueError naming the record and the field.
    """
    out = []
    t0: float | None = None
    for i, rec in enumerate(records):
        rid = str(rec.get("request_id") or f"rec{i}")
        ts = rec.get("arrival_s", rec.get("ts_s"))
        if ts is not None:
            if isinstance(ts, bool) or not isinstance(ts, int | float):
                raise ValueError(f"record {i}: field 'ts_s' must be a number")
            t0 = float(ts) if t0 is None else min(t0, float(ts))
        max_tokens = rec.get("max_tokens", rec.get("output_tokens")) or 16
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"record {i}: field 'max_tokens' must be a positive integer")
        if rec.get("prompt_token_ids") is not None:
            ids = rec["prompt_token_ids"]
            if (
                not isinstance(ids, list)
                or not ids
                or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids)
            ):
                raise ValueError(
                    f"record {i}: field 'prompt_token_ids' must be a non-empty list of token ids"
                )
            segs: tuple[Segment, ...] = (Segment(f"{rid}/literal", len(ids), tuple(ids)),)
        elif rec.get("block_keys") is not None:
            keys = rec["block_keys"]
            n = rec.get("prompt_tokens")
            if not isinstance(keys, list) or not all(isinstance(k, int) for k in keys):
                raise ValueError(f"record {i}: field 'block_keys' must be a list of integers")
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"record {i}: field 'prompt_tokens' must be a positive integer")
            n = max(n, len(keys) * block_size)
            seg_list = [Segment(f"key{k}", block_size) for k in keys]
            if n > len(keys) * block_size:
                seg_list.append(Segment(f"{rid}/rest", n - len(keys) * block_size))
            segs = tuple(seg_list)
        else:
            raise ValueError(f"record {i}: needs 'prompt_token_ids' or 'block_keys'")
        out.append(
            BenchRequest(
                request_id=rid,
                segments=segs,
                max_tokens=int(max_tokens),
                seed=seed,
                arrival_s=float(ts) if ts is not None else None,
                tenant=rec.get("tenant"),
                session_key=rec.get("session_key"),
            )
        )
    if t0 is not None:
        out = [
            replace(r, arrival_s=r.arrival_s - t0) if r.arrival_s is not None else r for r in out
        ]
        out.sort(key=lambda r: r.arrival_s if r.arrival_s is not None else 0.0)
    return out


_BUILDERS: dict[str, Callable[[Mapping[str, Any], int], list[BenchRequest]]] = {
    "tenants": _tenants,
    "chat": _chat,
    "agent": _agent,
    "unique": _unique,
}


def build_workload(
    name: str,
    params: Mapping[str, Any] | None = None,
    *,
    seed: int = 0,
    scale: float = 1.0,
    limit: int | None = None,
) -> list[BenchRequest]:
    """The requests of workload ``name`` (see module docstring), deterministic in ``seed``.

    ``scale`` multiplies every token length (prompt segments and outputs); ``limit`` keeps the
    first N requests.
    """
    p = resolve_params(name, params, scale=1.0 if name == "trace" else scale)
    if name == "trace":
        return load_trace(
            p["path"],
            seed=seed,
            speed=float(p["speed"]),
            scale=scale,
            max_output_tokens=int(p["max_output_tokens"]),
            limit=limit,
        )
    reqs = _BUILDERS[name](p, seed)
    return reqs[:limit] if limit is not None else reqs


def poisson_arrivals(
    requests: Sequence[BenchRequest], *, rate_rps: float, seed: int
) -> list[BenchRequest]:
    """Copies of ``requests`` with Poisson arrival offsets at ``rate_rps`` (first at 0)."""
    if rate_rps <= 0:
        raise ValueError("rate must be positive")
    rng = random.Random(seed ^ 0x5EED)
    t = 0.0
    out = []
    for i, r in enumerate(requests):
        if i:
            t += rng.expovariate(rate_rps)
        out.append(replace(r, arrival_s=t))
    return out


def with_arrivals(
    requests: Sequence[BenchRequest], *, rate_rps: float | None, seed: int
) -> list[BenchRequest]:
    """Keep the requests' own arrivals (a trace) or assign Poisson ones at ``rate_rps``."""
    if rate_rps:
        return poisson_arrivals(requests, rate_rps=rate_rps, seed=seed)
    if any(r.arrival_s is None for r in requests):
        raise ValueError("open loop needs --rate (this workload has no timestamps)")
    return list(requests)


# ---------------------------------------------------------------------------- oracle


def cacheable_tokens(hit_blocks: int, prompt_tokens: int, block_size: int) -> int:
    """Tokens an engine can serve from cache given ``hit_blocks`` leading cached blocks.

    The last prompt token is always recomputed (vLLM), hence the ``(n - 1) // bs`` cap.
    """
    return min(hit_blocks, max(0, prompt_tokens - 1) // block_size) * block_size


@dataclass(slots=True)
class OracleResult:
    hit_rate: float
    cached_tokens: int
    prompt_tokens: int
    per_request: dict[str, int] = field(default_factory=dict)


def oracle_hit_rate(
    requests: Iterable[BenchRequest],
    *,
    block_size: int = 16,
    keys_of: Callable[[BenchRequest], Sequence[int]] | None = None,
) -> OracleResult:
    """Share of prompt tokens in blocks already seen earlier in the workload (arrival order).

    What a perfect router with infinite cache could reuse: for each request, the leading blocks
    whose keys appeared in any earlier request, capped like the engine (last token recomputed),
    summed over requests and divided by the total prompt tokens.
    """
    seen: set[int] = set()
    cached = total = 0
    per: dict[str, int] = {}
    ordered = sorted(requests, key=lambda r: r.arrival_s if r.arrival_s is not None else 0.0)
    for r in ordered:
        keys = keys_of(r) if keys_of else r.block_keys(block_size)
        hit = 0
        for k in keys:
            if k not in seen:
                break
            hit += 1
        n = r.prompt_tokens
        c = cacheable_tokens(hit, n, block_size)
        per[r.request_id] = c
        cached += c
        total += n
        seen.update(keys)
    return OracleResult(
        hit_rate=cached / total if total else math.nan,
        cached_tokens=cached,
        prompt_tokens=total,
        per_request=per,
    )


__all__ = [
    "BenchRequest",
    "DEFAULT_TRACE",
    "Segment",
    "WORKLOAD_PARAMS",
    "build_workload",
    "cacheable_tokens",
    "load_trace",
    "oracle_hit_rate",
    "poisson_arrivals",
    "requests_from_records",
    "resolve_params",
    "segment_tokens",
    "trace_request",
    "with_arrivals",
]
