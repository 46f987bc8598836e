"""The gateway's parts on their own: SSE filter, vLLM metrics parser, circuit breaker, arm
hashing, config parsing, tokenizer adapters, record sinks."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import generate_latest

from routing.core.tokenizer import builtin_encode, render_chat
from routing.gateway.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreakers
from routing.gateway.config import GatewayConfig, parse_gateway_keys, parse_tokenizers
from routing.gateway.proxy import SseFilter
from routing.gateway.records import MemorySink, RecordWriter, RedisStreamSink
from routing.gateway.scraper import parse_vllm_metrics
from routing.gateway.snapshot import Arm, PolicyRef, parse_snapshot
from routing.gateway.state import pick_arm
from routing.gateway.tokenization import (
    BuiltinAdapter,
    HFAdapter,
    RemoteAdapter,
    TextAdapter,
    build_adapter,
)
from workers.sim.server import SimWorker, WorkerConfig


def test_sse_filter_passes_events_whole_and_strips_the_usage_chunk() -> None:
    usage = {
        "prompt_tokens": 10,
        "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 8},
    }
    events = [
        b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n',
        b'data: {"choices":[{"delta":{"content":"b"}}]}\n\n',
        b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n",
        b"data: [DONE]\n\n",
    ]
    stream = b"".join(events)
    for strip in (True, False):
        f = SseFilter(strip_usage=strip)
        # Split at every 7 bytes: events must still come out whole and in order.
        out = b"".join(f.feed(stream[i : i + 7]) for i in range(0, len(stream), 7)) + f.tail()
        expected = b"".join(e for e in events if not (strip and b'"usage"' in e))
        assert out == expected
        assert f.usage == usage and f.saw_done


def test_vllm_metrics_parser_reads_the_simulators_page_and_data_parallel_pages() -> None:
    sim = SimWorker(WorkerConfig(model="sim-8b", num_blocks=300, block_size=16))
    parsed = parse_vllm_metrics(generate_latest(sim.registry).decode(), model="sim-8b")
    assert (parsed.running, parsed.waiting, parsed.kv_usage_frac) == (0, 0, 0.0)
    assert (parsed.num_gpu_blocks, parsed.block_size) == (300, 16)
    page = "\n".join(
        [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            'vllm:num_requests_running{engine="0",model_name="m"} 3.0',
            'vllm:num_requests_running{engine="1",model_name="m"} 2.0',
            'vllm:num_requests_running{engine="0",model_name="other"} 50.0',
            'vllm:num_requests_waiting{engine="0",model_name="m"} 4.0 1700000000000',
            'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.5',
            'vllm:gpu_cache_usage_perc{engine="1",model_name="m"} 0.25',
            'vllm:cache_config_info{block_size="32",enable_prefix_caching="True",num_gpu_blocks="1234"} 1.0',
        ]
    )
    parsed = parse_vllm_metrics(page, model="m")
    assert (parsed.running, parsed.waiting, parsed.kv_usage_frac) == (5, 4, 0.375)
    assert (parsed.num_gpu_blocks, parsed.block_size) == (1234, 32)


def test_circuit_breaker_opens_probes_once_and_closes() -> None:
    b = CircuitBreakers(failures_to_open=2, cooldown_s=5)
    b.on_failure("w", now_s=0)
    assert b.allows("w", now_s=0) and b.state("w", now_s=0) == CLOSED
    b.on_failure("w", now_s=1)
    assert b.state("w", now_s=1) == OPEN and not b.allows("w", now_s=5.9)
    assert b.retry_after_s(["w"], now_s=2) == 4
    assert b.allows("w", now_s=6.0) and b.state("w", now_s=6.0) == HALF_OPEN
    b.on_attempt("w", now_s=6.0)
    assert not b.allows("w", now_s=6.1)  # one probe at a time
    b.on_failure("w", now_s=6.2)
    assert b.state("w", now_s=6.3) == OPEN
    assert b.allows("w", now_s=11.3)
    b.on_attempt("w", now_s=11.3)
    assert not b.allows("w", now_s=11.3)
    b.release_probe("w")  # that probe was cancelled by its client: another may go
    assert b.allows("w", now_s=11.3)
    b.on_attempt("w", now_s=11.3)
    b.on_success("w")
    assert b.state("w", now_s=11.4) == CLOSED and b.allows("w", now_s=11.4)


def test_arms_split_by_share_and_stick_to_their_key() -> None:
    ref = PolicyRef(policy="p", type="round_robin")
    arms = (Arm("A", 75, ref), Arm("B", 25, ref))
    picks = [pick_arm(arms, key=f"1:session-{i}").name for i in range(4000)]
    assert 0.72 < picks.count("A") / 4000 < 0.78
    assert all(pick_arm(arms, key=f"1:session-{i}").name == picks[i] for i in range(100))
    assert pick_arm((Arm("A", 0, ref), Arm("B", 0, ref)), key="x").name == "A"


def test_config_parsing_rejects_malformed_entries() -> None:
    assert parse_gateway_keys("tenantA:key1, tenantB:key2") == {
        "key1": "tenantA",
        "key2": "tenantB",
    }
    assert parse_tokenizers("m1=builtin,m2=hf:/x/y") == {"m1": "builtin", "m2": "hf:/x/y"}
    with pytest.raises(ValueError, match="tenantA"):
        parse_gateway_keys("tenantA")
    cfg = GatewayConfig.from_env(
        {"KVROUTE_GATEWAY_KEYS": "t:k", "KVROUTE_GATEWAY_MAX_RETRIES": "5"}
    )
    assert cfg.gateway_keys == {"k": "t"} and cfg.max_retries == 5
    with pytest.raises(ValueError, match="unknown tokenizer"):
        build_adapter("sentencepiece", model="m", client=httpx.AsyncClient())


def test_snapshot_parsing_keeps_only_routable_states() -> None:
    snap = parse_snapshot(
        {
            "revision": "x",
            "workers": [
                {"id": "a", "url": "http://a/", "model": "m", "state": "active"},
                {"id": "b", "url": "http://b", "model": "m", "state": "draining"},
                {"id": "c", "url": "http://c", "model": "m", "state": "disabled"},
            ],
            "models": {"m": {"active": None, "experiment": None}},
        }
    )
    assert [(w.id, w.draining) for w in snap.by_model["m"]] == [("a", False), ("b", True)]
    assert snap.workers[0].url == "http://a"


async def test_builtin_and_text_adapters() -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello there"},
    ]
    enc = await BuiltinAdapter().encode_chat(messages, worker_url="")
    assert enc.token_ids == builtin_encode(render_chat(messages))
    text = await TextAdapter(block_chars=8).encode_text("x" * 100, worker_url="")
    assert text.token_ids is None and text.text == "x" * 100 and text.prompt_tokens == 25


async def test_hf_adapter_uses_the_directorys_tokenizer_and_chat_template(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "<s>": 1, "hello": 2, "there": 3, "user": 4, ":": 5, "assistant": 6}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    template = "{{ bos_token }}{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}assistant :{% endif %}"
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": template, "bos_token": "<s>"})
    )
    adapter = build_adapter(f"hf:{tmp_path}", model="m", client=httpx.AsyncClient())
    assert isinstance(adapter, HFAdapter)
    enc = await adapter.encode_chat([{"role": "user", "content": "hello there"}], worker_url="")
    # <s> is not split by the whitespace pre-tokenizer from "user"; unknown pieces map to 0.
    assert enc.token_ids is not None and enc.token_ids[-4:] == [2, 3, 6, 5]
    plain = await adapter.encode_text("hello there hello", worker_url="")
    assert plain.token_ids == [2, 3, 2]


async def test_remote_adapter_asks_the_worker_once_per_prompt(fleet_factory: Any) -> None:
    fleet = fleet_factory(1)
    calls: list[str] = []

    async def count(request: httpx.Request) -> None:
        calls.append(request.url.path)

    async with httpx.AsyncClient(event_hooks={"request": [count]}) as client:
        adapter = RemoteAdapter(client=client, model="sim-8b")
        messages = [{"role": "user", "content": "tokenize me remotely"}]
        first = await adapter.encode_chat(messages, worker_url=fleet.urls[0])
        second = await adapter.encode_chat(messages, worker_url=fleet.urls[0])
        text = await adapter.encode_text("plain prompt", worker_url=fleet.urls[0])
    assert first == second
    assert first.token_ids == builtin_encode(render_chat(messages))
    assert text.token_ids == builtin_encode("plain prompt")
    assert calls == ["/tokenize", "/tokenize"]


async def test_record_writer_flushes_off_the_hot_path_to_memory() -> None:
    sink = MemorySink(maxlen=3)
    writer = RecordWriter(sink, flush_s=0.01)
    task = asyncio.get_running_loop().create_task(writer.run())
    for i in range(5):
        writer.submit({"i": i})
    assert len(sink) == 0  # submit only buffers
    await asyncio.sleep(0.1)
    assert [r["i"] for _, r in sink.read()] == [2, 3, 4]  # ring buffer keeps the newest
    ids = [i for i, _ in sink.read()]
    assert sink.read(after=ids[0]) == sink.read()[1:]
    assert [r["i"] for r in sink.drain(count=2)] == [2, 3]
    assert len(sink) == 1
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_redis_stream_sink_writes_and_reads(redis_url: str) -> None:
    sink = RedisStreamSink(url=redis_url, stream="kvroute:test-requests", maxlen=1000)
    await sink.write_many([{"request_id": str(i), "ttft_ms": i * 1.5} for i in range(5)])
    rows = sink.read(count=3)
    assert [r["request_id"] for _, r in rows] == ["0", "1", "2"]
    rest = sink.read(after=rows[-1][0])
    assert [r["request_id"] for _, r in rest] == ["3", "4"]
    drained = sink.drain(count=10)
    assert [r["ttft_ms"] for r in drained] == [0.0, 1.5, 3.0, 4.5, 6.0]
    assert sink.read() == []
    await sink.aclose()


async def test_builtin_adapter_per_message_memo_equals_whole_conversation_encoding() -> None:
    adapter = BuiltinAdapter(cache_size=4)
    awkward = [
        "plain words here",
        "  leading spaces and trailing  ",
        "\n\nnewlines\n",
        "contains <|user|> a marker and <|end|> another",
        "ends with a partial marker <|en",
        "<|assistant|>",
        "",
        "unicode: héllo wörld 日本語 1234",
    ]
    roles = ["system", "user", "assistant", "tool", "developer"]
    for i in range(40):
        messages: list[dict[str, Any]] = [
            {"role": roles[(i + j) % len(roles)], "content": awkward[(i * 3 + j) % len(awkward)]}
            for j in range(1 + i % 4)
        ]
        if i % 5 == 0:
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "part one "},
                        {"type": "image_url"},
                        {"type": "text", "text": "two"},
                    ],
                }
            )
        if i % 7 == 0:
            messages.append({"role": "assistant", "content": None})
        enc = await adapter.encode_chat(messages, worker_url="")
        assert enc.token_ids == builtin_encode(render_chat(messages)), messages
