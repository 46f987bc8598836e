"""A real vLLM CPU engine as the agent runs it: registration from its own /metrics, the
precise index fed by its real KV events (BlockRemoved included), and the simulated
engine's conformance with it (same prompts -> same cached tokens, same events in order)."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import httpx
import pytest

from routing.core.blocks import token_block_keys
from routing.core.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from routing.core.index import PrefixIndex
from tests.vllm.conftest import (
    BLOCK_SIZE,
    MAX_MODEL_LEN,
    MODEL,
    NUM_GPU_BLOCKS,
    Engine,
    Stack,
    VllmEnv,
    cached_tokens,
    completion,
    reset_prefix_cache,
)
from tests.vllm.harness import EventRecorder, Proc, free_ports, http_ok, wait_until
from workers.agent import parse_metrics

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


def test_agent_registers_the_engine_from_its_own_metrics(stack: Stack, fleet: list[Engine]) -> None:
    workers = stack.workers()
    for engine in fleet:
        metrics = parse_metrics(httpx.get(f"{engine.url}/metrics", timeout=5).text)
        assert metrics.block_size == BLOCK_SIZE
        assert metrics.num_gpu_blocks == NUM_GPU_BLOCKS
        worker = workers[engine.name]
        assert worker["base_url"] == engine.url
        assert worker["model"] == MODEL
        assert worker["block_size"] == BLOCK_SIZE
        assert worker["capacity_blocks"] == NUM_GPU_BLOCKS
        assert worker["kv_events_endpoint"] == engine.spec.kv_events_endpoint
        assert worker["replay_endpoint"] == engine.spec.replay_endpoint
        assert worker["healthy"] is True and worker["state"] == "active"
        assert worker["last_heartbeat_at"] is not None


def _tokens(rng: random.Random, n: int) -> list[int]:
    # Ids above the tiny tokenizer's special tokens, below its vocabulary size.
    return [rng.randrange(16, 2000) for _ in range(n)]


def scenario() -> list[tuple[str, list[int]]]:
    """Prompts that exercise every prefix-cache rule at block size 32 with 63 usable blocks."""
    rng = random.Random(20261129)
    a, b, c = _tokens(rng, 256), _tokens(rng, 512), _tokens(rng, 256)
    q1, q2, q3 = _tokens(rng, 40), _tokens(rng, 40), _tokens(rng, 40)
    prompts = [
        ("cold A+q1", a + q1),
        ("repeat A+q1: last token recomputed", a + q1),
        ("A+q2 shares 8 blocks", a + q2),
        ("cold C, exactly 8 blocks", c),
        ("C again: its last block is recomputed", c),
        ("cold B+q1", b + q1),
        ("B+q2 shares 16 blocks", b + q2),
    ]
    prompts += [(f"filler {i}", _tokens(rng, 296)) for i in range(8)]
    prompts += [
        ("A+q3 after eviction pressure", a + q3),
        ("B+q3 after eviction pressure", b + q3),
        ("A+q1 again", a + q1),
    ]
    return prompts


@dataclass(frozen=True)
class Run:
    cached: list[int]
    predicted: list[int]
    batches: list[EventBatch]


def drive(url: str, recorder: EventRecorder, prompts: Sequence[tuple[str, list[int]]]) -> Run:
    """Send prompts one at a time (max_tokens 1); before each, predict its cached tokens from
    a precise index fed only by the events received so far."""
    index = PrefixIndex()
    applied = 0
    cached: list[int] = []
    predicted: list[int] = []
    for _label, prompt in prompts:
        batches = recorder.wait_quiet(quiet_s=0.4)
        for batch in batches[applied:]:
            index.apply("w", batch.ops, now_s=0.0)
        applied = len(batches)
        keys = token_block_keys(prompt, BLOCK_SIZE)
        hit_blocks = index.match(keys, now_s=0.0).get("w", 0)
        # vLLM always recomputes the last prompt token.
        predicted.append(min(hit_blocks, (len(prompt) - 1) // BLOCK_SIZE) * BLOCK_SIZE)
        cached.append(cached_tokens(completion(url, prompt)))
    return Run(cached=cached, predicted=predicted, batches=recorder.wait_quiet(quiet_s=0.6))


def normalise(batches: Sequence[EventBatch]) -> list[tuple[str, tuple[tuple[int, ...], ...]]]:
    """Events as (kind, block contents): engine hashes differ between engines, the blocks
    they name do not. A removed block is named by the tokens it was stored with."""
    contents: dict[int, tuple[int, ...]] = {}
    out: list[tuple[str, tuple[tuple[int, ...], ...]]] = []
    for batch in batches:
        for op in batch.ops:
            if isinstance(op, BlockStored):
                size = op.block_size
                blocks = tuple(
                    tuple(op.token_ids[i * size : (i + 1) * size])
                    for i in range(len(op.engine_hashes))
                )
                contents.update(zip(op.engine_hashes, blocks, strict=True))
                out.append(("BlockStored", blocks))
            elif isinstance(op, BlockRemoved):
                out.append(
                    ("BlockRemoved", tuple(contents.get(h, (-1,)) for h in op.engine_hashes))
                )
            elif isinstance(op, AllBlocksCleared):
                out.append(("AllBlocksCleared", ()))
    return out


def summary(events: Sequence[tuple[str, tuple[tuple[int, ...], ...]]]) -> list[str]:
    return [f"{kind}x{len(blocks)}@{blocks[0][0] if blocks else '-'}" for kind, blocks in events]


@pytest.fixture
def quiet_engine(fleet: list[Engine]) -> Iterator[tuple[Engine, EventRecorder]]:
    """The second engine with an empty prefix cache and a subscriber on its events.

    After /reset_prefix_cache every block is free and unhashed, which is observably the
    same as a fresh engine; the AllBlocksCleared it publishes is consumed here."""
    engine = fleet[1]
    assert engine.spec.kv_events_endpoint is not None
    recorder = EventRecorder(engine.spec.kv_events_endpoint).start()
    try:
        reset_prefix_cache(engine.url)
        # The reset is published with the engine's next step.
        completion(engine.url, [7] * 8)
        wait_until(
            lambda: any(
                isinstance(op, AllBlocksCleared) for b in recorder.snapshot() for op in b.ops
            ),
            timeout_s=10,
            what="AllBlocksCleared after /reset_prefix_cache",
        )
        recorder.wait_quiet()
        recorder.clear()
        yield engine, recorder
    finally:
        recorder.close()


def test_precise_index_predicts_real_cached_tokens_through_eviction(
    quiet_engine: tuple[Engine, EventRecorder],
) -> None:
    engine, recorder = quiet_engine
    prompts = scenario()
    run = drive(engine.url, recorder, prompts)
    assert not recorder.errors
    labels = [label for label, _ in prompts]
    table = list(zip(labels, run.predicted, run.cached, strict=True))
    # vLLM's rules as this engine applies them (the last prompt token is always computed).
    assert run.cached[:7] == [0, 288, 256, 0, 224, 0, 512], table
    kinds = {kind for kind, _ in normalise(run.batches)}
    assert "BlockRemoved" in kinds, "eight 296-token fillers must evict from 63 usable blocks"
    # The precise index, fed only by the engine's events, predicts every value exactly,
    # including after eviction removed (part of) the shared prefixes.
    assert run.predicted == run.cached, table
    assert run.cached[-3:] != [256, 512, 288], "eviction pressure had no effect"


@pytest.fixture
def sim_engine(vllm_env: VllmEnv) -> Iterator[tuple[str, EventRecorder]]:
    port, events_port = free_ports(2)
    proc = Proc.start(
        "simulated engine",
        [
            sys.executable,
            "-m",
            "workers.sim",
            "--port",
            str(port),
            "--model",
            MODEL,
            "--profile",
            "golden-cpu",
            "--block-size",
            str(BLOCK_SIZE),
            "--num-blocks",
            str(NUM_GPU_BLOCKS),
            "--max-model-len",
            str(MAX_MODEL_LEN),
            "--time-scale",
            "0.01",
            "--kv-events",
            f"tcp://127.0.0.1:{events_port}",
        ],
        log_path=vllm_env.log_dir / "sim-conformance.log",
    )
    url = f"http://127.0.0.1:{port}"
    recorder: EventRecorder | None = None
    try:
        wait_until(
            lambda: http_ok(f"{url}/health"), timeout_s=30, what="the simulated engine", proc=proc
        )
        recorder = EventRecorder(f"tcp://127.0.0.1:{events_port}").start()
        yield url, recorder
    finally:
        if recorder is not None:
            recorder.close()
        proc.stop(grace_s=5)


def test_simulated_engine_conforms_to_the_real_one(
    quiet_engine: tuple[Engine, EventRecorder], sim_engine: tuple[str, EventRecorder]
) -> None:
    engine, real_recorder = quiet_engine
    sim_url, sim_recorder = sim_engine
    prompts = scenario()
    real = drive(engine.url, real_recorder, prompts)
    sim = drive(sim_url, sim_recorder, prompts)
    labels = [label for label, _ in prompts]
    assert sim.cached == real.cached, list(zip(labels, real.cached, sim.cached, strict=True))
    real_events, sim_events = normalise(real.batches), normalise(sim.batches)
    assert [k for k, _ in sim_events] == [k for k, _ in real_events], (
        f"real: {summary(real_events)}\nsim:  {summary(sim_events)}"
    )
    # Same blocks stored and evicted, in the same order.
    assert sim_events == real_events, f"real: {summary(real_events)}\nsim:  {summary(sim_events)}"
