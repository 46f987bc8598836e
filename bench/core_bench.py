"""Routing-core micro-benchmark: decision latency, block hashing and index memory.

    .venv/bin/python bench/core_bench.py            # full: 1M-entry index, ~2-4 minutes
    .venv/bin/python bench/core_bench.py --quick    # 100k entries, fewer repetitions

A *decision* is what the gateway does per request before proxying: hash the prompt's tokens
into chained block keys, match them against the prefix index, and run the policy
(``build_policy(name, {})``, default parameters) over every worker. Its median and p99 are
reported per policy, prompt size (1k/8k/32k tokens) and fleet size (8/64/256 workers) against an
index of 1M distinct block keys. Index memory is measured with tracemalloc while the index is
built. Results: a table on stdout and JSON in bench/results/core_bench.json.

The index is filled the way a fleet fills it: every worker's engine reports chains of 64 blocks
(precise layer, through the same ``BlockStored`` ops the KV-event decoder produces), plus the
benchmark prompt's own history: its first quarter (a shared system prompt) is on every worker,
half of it on one worker in eight, 90% on two workers, and 60% was routed recently to two more
workers (approximate layer), so the match walks most of the prompt and drops holders on the way.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo importable without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from routing.core.blocks import token_block_keys
from routing.core.events import BlockRemoved, BlockStored
from routing.core.index import PrefixIndex
from routing.core.registry import build_policy
from routing.core.types import RequestFeatures, WorkerView

BLOCK_SIZE = 16
CHAIN_BLOCKS = 64
MODEL = "bench-model"
RESULTS = Path(__file__).resolve().parent / "results" / "core_bench.json"

TARGET_P50_MS = 0.5
TARGET_P99_MS = 2.0
TARGET_BYTES_PER_ENTRY = 200.0
TARGET_HASH_8K_US = 150.0


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(fn: Callable[[], object], repeats: int) -> list[float]:
    """Wall time of each call in seconds (perf_counter)."""
    return timed_with_cpu(fn, repeats)[0]


def timed_with_cpu(fn: Callable[[], object], repeats: int) -> tuple[list[float], list[float]]:
    """Wall and thread-CPU seconds of each call: on a shared machine the wall-clock tail is
    mostly time spent preempted, which the CPU time leaves out."""
    wall, cpu = [], []
    for _ in range(repeats):
        start_cpu = time.thread_time()
        start = time.perf_counter()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - start_cpu)
    return wall, cpu


def prompt_tokens(n_tokens: int, *, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(128_000) for _ in range(n_tokens)]


def stored_chain(tokens: list[int], *, first_hash: int, parent_hash: int | None) -> BlockStored:
    n_blocks = len(tokens) // BLOCK_SIZE
    return BlockStored(
        engine_hashes=tuple(range(first_hash, first_hash + n_blocks)),
        parent_engine_hash=parent_hash,
        token_ids=tuple(tokens[: n_blocks * BLOCK_SIZE]),
        block_size=BLOCK_SIZE,
    )


def build_index(
    *,
    n_workers: int,
    entries: int,
    prompts: dict[int, list[int]],
    rng: random.Random,
    filler_layer: str = "precise",
) -> PrefixIndex:
    """An index of ``entries`` distinct keys: the benchmark prompts' history plus filler chains."""
    # headroom above the target size: nothing the benchmark prompts need is evicted
    index = PrefixIndex(max_entries=2 * entries, approx_ttl_s=3600.0)
    workers = [f"w{i}" for i in range(n_workers)]
    next_hash = 1
    for tokens in prompts.values():
        n_blocks = len(tokens) // BLOCK_SIZE
        held = {w: n_blocks // 4 for w in workers}
        for w in workers[::8]:
            held[w] = n_blocks // 2
        for w in rng.sample(workers, 2):
            held[w] = n_blocks * 9 // 10
        for w, blocks in held.items():
            index.apply(
                w,
                [
                    stored_chain(
                        tokens[: blocks * BLOCK_SIZE], first_hash=next_hash, parent_hash=None
                    )
                ],
                now_s=0.0,
            )
            next_hash += blocks
        keys = token_block_keys(tokens, BLOCK_SIZE)
        for w in rng.sample(workers, 2):
            index.record_routed(w, keys[: n_blocks * 6 // 10], now_s=0.0)
    filler_tokens = prompt_tokens(CHAIN_BLOCKS * BLOCK_SIZE, seed=99)
    chain = 0
    while len(index) < entries:
        # a distinct first token makes every filler chain a distinct prompt
        filler_tokens[0] = 200_000 + chain
        w = workers[chain % n_workers]
        if filler_layer == "precise":
            index.apply(
                w,
                [stored_chain(filler_tokens, first_hash=next_hash, parent_hash=None)],
                now_s=0.0,
            )
        else:
            index.record_routed(w, token_block_keys(filler_tokens, BLOCK_SIZE), now_s=0.0)
        next_hash += CHAIN_BLOCKS
        chain += 1
    return index


def make_workers(n_workers: int, rng: random.Random) -> list[WorkerView]:
    return [
        WorkerView(
            id=f"w{i}",
            url=f"http://127.0.0.1:{8100 + i}",
            model=MODEL,
            block_size=BLOCK_SIZE,
            capacity_blocks=16_384,
            running=rng.randrange(0, 32),
            waiting=rng.randrange(0, 4),
            kv_usage_frac=rng.random(),
            inflight_prefill_tokens=rng.randrange(0, 20_000),
            inflight_requests=rng.randrange(0, 8),
            metrics_age_s=0.5,
            network_ms=rng.random(),
            prefill_ms_per_token=0.05 + 0.1 * rng.random() if i % 3 else None,
        )
        for i in range(n_workers)
    ]


def measure_memory(
    *, n_workers: int, entries: int, prompts: dict[int, list[int]], filler_layer: str
) -> dict[str, Any]:
    gc.collect()
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    index = build_index(
        n_workers=n_workers,
        entries=entries,
        prompts=prompts,
        rng=random.Random(1),
        filler_layer=filler_layer,
    )
    gc.collect()
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    stats = index.stats()
    holdings = sum(c.precise + c.approximate for c in stats.per_worker.values())
    used = current - base
    return {
        "workers": n_workers,
        "layer": filler_layer,
        "entries": stats.entries,
        "holdings": holdings,
        "bytes": used,
        "bytes_per_entry": used / stats.entries,
        "bytes_per_holding": used / holdings,
        "peak_bytes_per_entry": (peak - base) / stats.entries,
    }


def measure_decisions(
    *,
    index: PrefixIndex,
    workers: list[WorkerView],
    tokens: list[int],
    policy_name: str,
    repeats: int,
) -> dict[str, Any]:
    policy = build_policy(policy_name, {})
    rng = random.Random(7)
    keys = token_block_keys(tokens, BLOCK_SIZE)
    cached = index.match(keys, now_s=1.0)
    features = RequestFeatures(
        model=MODEL, block_keys=keys, prompt_tokens=len(tokens), block_size=BLOCK_SIZE
    )

    def decision() -> object:
        # everything the gateway does per request between tokenizing and proxying
        block_keys = token_block_keys(tokens, BLOCK_SIZE)
        hits = index.match(block_keys, now_s=1.0)
        request = RequestFeatures(
            model=MODEL, block_keys=block_keys, prompt_tokens=len(tokens), block_size=BLOCK_SIZE
        )
        return policy.decide(request, workers, hits, now_s=1.0, rng=rng)

    decision()  # warm up
    match_samples = timed(lambda: index.match(keys, now_s=1.0), repeats)
    decide_samples = timed(
        lambda: policy.decide(features, workers, cached, now_s=1.0, rng=rng), repeats
    )
    total, total_cpu = timed_with_cpu(decision, repeats)
    return {
        "policy": policy_name,
        "prompt_tokens": len(tokens),
        "entries": len(index),
        "workers_matched": len(cached),
        "p50_ms": statistics.median(total) * 1e3,
        "p99_ms": percentile(total, 0.99) * 1e3,
        "cpu_p50_ms": statistics.median(total_cpu) * 1e3,
        "cpu_p99_ms": percentile(total_cpu, 0.99) * 1e3,
        "match_p50_ms": statistics.median(match_samples) * 1e3,
        "decide_p50_ms": statistics.median(decide_samples) * 1e3,
    }


def measure_updates(*, index: PrefixIndex, tokens: list[int], repeats: int) -> list[dict[str, Any]]:
    """Per-request and per-event index writes for one 8k-token prompt (512 blocks): recording it
    as routed to a worker that holds none / all of it, and an engine storing then evicting it."""
    keys = token_block_keys(tokens, BLOCK_SIZE)
    stored = stored_chain(tokens, first_hash=10**12, parent_hash=None)
    removed = BlockRemoved(stored.engine_hashes)
    samples: dict[str, list[float]] = {
        "record_routed (new blocks)": [],
        "record_routed (held blocks)": [],
        "apply BlockStored": [],
        "apply BlockRemoved": [],
    }

    def clocked(name: str, fn: Callable[[], object]) -> None:
        start = time.perf_counter()
        fn()
        samples[name].append(time.perf_counter() - start)

    for _ in range(repeats):
        clocked("record_routed (new blocks)", lambda: index.record_routed("x", keys, now_s=1.0))
        clocked("record_routed (held blocks)", lambda: index.record_routed("x", keys, now_s=1.0))
        index.remove_worker("x")
        clocked("apply BlockStored", lambda: index.apply("y", [stored], now_s=1.0))
        clocked("apply BlockRemoved", lambda: index.apply("y", [removed], now_s=1.0))
    return [
        {
            "op": name,
            "blocks": len(keys),
            "p50_us": statistics.median(values) * 1e6,
            "p99_us": percentile(values, 0.99) * 1e6,
        }
        for name, values in samples.items()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100k entries, fewer repetitions")
    parser.add_argument("--entries", type=int, help="index size (distinct block keys)")
    parser.add_argument("--repeats", type=int, help="decisions timed per configuration")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    entries = args.entries or (100_000 if args.quick else 1_000_000)
    repeats = args.repeats or (100 if args.quick else 400)
    prompt_sizes = (1024, 8192, 32768)
    fleet_sizes = (8, 64, 256)
    policies = ("kv_score", "predicted_ttft")
    prompts = {n: prompt_tokens(n, seed=n) for n in prompt_sizes}
    started = time.perf_counter()

    hashing = []
    for n in prompt_sizes:
        tokens = prompts[n]
        samples = timed(partial(token_block_keys, tokens, BLOCK_SIZE), repeats * 2)
        hashing.append(
            {
                "prompt_tokens": n,
                "blocks": n // BLOCK_SIZE,
                "p50_us": statistics.median(samples) * 1e6,
                "p99_us": percentile(samples, 0.99) * 1e6,
            }
        )

    memory = [
        measure_memory(n_workers=w, entries=entries, prompts=prompts, filler_layer=layer)
        for w, layer in ((64, "precise"), (256, "precise"), (64, "approximate"))
    ]

    rows = []
    updates: list[dict[str, Any]] = []
    for n_workers in fleet_sizes:
        rng = random.Random(n_workers)
        build_start = time.perf_counter()
        index = build_index(n_workers=n_workers, entries=entries, prompts=prompts, rng=rng)
        build_s = time.perf_counter() - build_start
        workers = make_workers(n_workers, rng)
        if n_workers == 64:
            updates = measure_updates(index=index, tokens=prompts[8192], repeats=repeats)
        for n in prompt_sizes:
            for name in policies:
                row = measure_decisions(
                    index=index,
                    workers=workers,
                    tokens=prompts[n],
                    policy_name=name,
                    repeats=repeats,
                )
                rows.append({**row, "workers": n_workers, "index_build_s": build_s})
        index = PrefixIndex()  # drop the big one before building the next
        gc.collect()

    target_rows = [r for r in rows if r["prompt_tokens"] == 8192 and r["workers"] == 64]
    hash_8k = next(h for h in hashing if h["prompt_tokens"] == 8192)
    mem_64 = next(m for m in memory if m["workers"] == 64 and m["layer"] == "precise")
    checks = {
        f"8k prompt, 64 workers, {entries:,} entries: p50 <= {TARGET_P50_MS} ms": all(
            r["p50_ms"] <= TARGET_P50_MS for r in target_rows
        ),
        f"8k prompt, 64 workers, {entries:,} entries: p99 <= {TARGET_P99_MS} ms": all(
            r["p99_ms"] <= TARGET_P99_MS for r in target_rows
        ),
        f"index bytes/entry (precise, 64 workers) <= {TARGET_BYTES_PER_ENTRY:g}": mem_64[
            "bytes_per_entry"
        ]
        <= TARGET_BYTES_PER_ENTRY,
        f"hash 8k tokens p50 <= {TARGET_HASH_8K_US:g} us": hash_8k["p50_us"] <= TARGET_HASH_8K_US,
    }
    result = {
        "command": "bench/core_bench.py" + (" --quick" if args.quick else ""),
        "python": sys.version.split()[0],
        "machine": f"{platform.machine()} {platform.processor() or platform.system()}",
        "block_size": BLOCK_SIZE,
        "entries": entries,
        "repeats": repeats,
        "hashing": hashing,
        "memory": memory,
        "decisions": rows,
        "index_updates": updates,
        "checks": checks,
        "elapsed_s": time.perf_counter() - started,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(render(result))
    print(f"\nwrote {args.out}")
    return 0


def render(result: dict[str, Any]) -> str:
    lines = [
        f"routing core, block size {result['block_size']}, index {result['entries']:,} entries, "
        f"{result['repeats']} decisions per row, Python {result['python']}",
        "",
        "decision = hash prompt + index match + policy.decide over all workers",
        f"{'policy':<15}{'prompt':>8}{'workers':>9}{'matched':>9}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'cpu p50':>9}{'cpu p99':>9}{'match p50':>11}{'decide p50':>12}",
    ]
    for r in result["decisions"]:
        lines.append(
            f"{r['policy']:<15}{r['prompt_tokens']:>8}{r['workers']:>9}{r['workers_matched']:>9}"
            f"{r['p50_ms']:>9.3f}{r['p99_ms']:>9.3f}{r['cpu_p50_ms']:>9.3f}{r['cpu_p99_ms']:>9.3f}"
            f"{r['match_p50_ms']:>11.3f}"
            f"{r['decide_p50_ms']:>12.3f}"
        )
    lines += ["", f"{'index update':<28}{'p50 us':>9}{'p99 us':>9}  (8k prompt, 64 workers)"]
    for u in result["index_updates"]:
        lines.append(f"{u['op']:<28}{u['p50_us']:>9.1f}{u['p99_us']:>9.1f}")
    lines += ["", f"{'hashing':<15}{'prompt':>8}{'blocks':>9}{'p50 us':>9}{'p99 us':>9}"]
    for h in result["hashing"]:
        lines.append(
            f"{'':<15}{h['prompt_tokens']:>8}{h['blocks']:>9}{h['p50_us']:>9.1f}{h['p99_us']:>9.1f}"
        )
    lines += [
        "",
        f"{'index memory':<15}{'layer':>12}{'workers':>8}{'entries':>11}{'holdings':>11}{'B/entry':>9}"
        f"{'B/holding':>11}{'peak B/entry':>14}",
    ]
    for m in result["memory"]:
        lines.append(
            f"{'(tracemalloc)':<15}{m['layer']:>12}{m['workers']:>8}{m['entries']:>11,}{m['holdings']:>11,}"
            f"{m['bytes_per_entry']:>9.1f}{m['bytes_per_holding']:>11.1f}"
            f"{m['peak_bytes_per_entry']:>14.1f}"
        )
    lines += ["", "targets:"]
    for name, ok in result["checks"].items():
        lines.append(f"  [{'met' if ok else 'MISSED'}] {name}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
