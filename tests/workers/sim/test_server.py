"""The simulated worker over real sockets: HTTP (uvicorn), SSE, metrics, ZMQ KV events."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from routing.core.events import BlockStored, EventBatch, decode_message, is_replay_end
from routing.core.tokenizer import builtin_encode, render_chat
from workers.sim.fleet import FleetHandle, start_fleet

MODEL = "sim-8b"


@pytest.fixture(scope="module")
def fleet() -> Iterator[FleetHandle]:
    with start_fleet(2, model=MODEL, profile="dev", time_scale=0.02, num_blocks=64) as handle:
        yield handle


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10) as c:
        yield c


def sse_events(text: str) -> list[Any]:
    out: list[Any] = []
    for frame in text.split("\n\n"):
        if not frame.strip():
            continue
        assert frame.startswith("data: "), frame
        payload = frame[len("data: ") :]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def subscribe(endpoint: str) -> zmq.Socket[bytes]:
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    time.sleep(0.3)  # ZMQ slow joiner: let the subscription reach the publisher
    return sub


def receive_batches(
    sub: zmq.Socket[bytes], *, until_tokens: list[int], timeout_s: float = 5.0
) -> list[EventBatch]:
    batches: list[EventBatch] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sub.poll(100):
            batches.append(decode_message(sub.recv_multipart()))
            stored = [
                t
                for b in batches
                for op in b.ops
                if isinstance(op, BlockStored)
                for t in op.token_ids
            ]
            if stored[: len(until_tokens)] == until_tokens:
                return batches
    raise AssertionError(f"no BlockStored for the prompt within {timeout_s}s: {batches}")


def test_streaming_completion_shape_usage_and_prefix_hit(
    fleet: FleetHandle, client: httpx.Client
) -> None:
    url = fleet.workers[0].url
    prompt = list(range(3000, 3100))  # token ids bypass the tokenizer
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    first = client.post(f"{url}/v1/completions", json=body)
    assert first.status_code == 200
    assert first.headers["content-type"].startswith("text/event-stream")
    events = sse_events(first.text)
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["prompt_tokens"] == 100
    assert usage_chunk["usage"]["completion_tokens"] == 5
    assert usage_chunk["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    chunks = events[:-2]
    assert len(chunks) == 5 and all(c["object"] == "text_completion" for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 4 + ["length"]
    second = sse_events(client.post(f"{url}/v1/completions", json=body).text)
    assert second[-2]["usage"]["prompt_tokens_details"]["cached_tokens"] == 96
    assert [c["choices"][0]["text"] for c in second[:-2]] == [
        c["choices"][0]["text"] for c in chunks
    ]


def test_chat_stream_and_non_stream(fleet: FleetHandle, client: httpx.Client) -> None:
    url = fleet.workers[1].url
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "what is a cache"},
    ]
    full = client.post(
        f"{url}/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 4}
    )
    assert full.status_code == 200
    data = full.json()
    assert data["object"] == "chat.completion"
    assert data["choices"][0]["message"]["role"] == "assistant"
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["prompt_tokens"] == len(builtin_encode(render_chat(messages)))
    streamed = sse_events(
        client.post(
            f"{url}/v1/chat/completions",
            json={"model": MODEL, "messages": messages, "max_tokens": 4, "stream": True},
        ).text
    )
    assert streamed[-1] == "[DONE]"
    assert streamed[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert (
        "".join(c["choices"][0]["delta"].get("content", "") for c in streamed[:-1])
        == data["choices"][0]["message"]["content"]
    )
    assert all("usage" not in c for c in streamed[:-1])


def test_tokenize_models_and_health(fleet: FleetHandle, client: httpx.Client) -> None:
    url = fleet.workers[0].url
    assert client.get(f"{url}/health").status_code == 200
    models = client.get(f"{url}/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    tok = client.post(
        f"{url}/tokenize", json={"model": MODEL, "prompt": "the cache is warm"}
    ).json()
    assert tok["tokens"] == builtin_encode("the cache is warm") and tok["count"] == 4
    messages = [{"role": "user", "content": "hi"}]
    assert client.post(f"{url}/tokenize", json={"messages": messages}).json()[
        "tokens"
    ] == builtin_encode(render_chat(messages))


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"prompt": "hi"}, 400, "model"),
        ({"model": "nope", "prompt": "hi"}, 404, "model"),
        ({"model": MODEL, "prompt": list(range(5000))}, 400, "prompt"),
        ({"model": MODEL, "prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
        ({"model": MODEL, "prompt": "hi", "max_tokens": "ten"}, 400, "max_tokens"),
        ({"model": MODEL, "prompt": [1, "x"]}, 400, "prompt"),
        ({"model": MODEL}, 400, "prompt"),
    ],
)
def test_bad_requests_get_vllm_like_errors(
    fleet: FleetHandle, client: httpx.Client, body: dict[str, Any], status: int, param: str
) -> None:
    resp = client.post(f"{fleet.workers[0].url}/v1/completions", json=body)
    assert resp.status_code == status
    err = resp.json()["error"]
    assert err["param"] == param and err["code"] == status and err["message"]


def test_malformed_json_and_unknown_routes(fleet: FleetHandle, client: httpx.Client) -> None:
    url = fleet.workers[0].url
    resp = client.post(
        f"{url}/v1/chat/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert resp.status_code == 400 and "JSON" in resp.json()["error"]["message"]
    assert (
        client.post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": []}).json()[
            "error"
        ]["param"]
        == "messages"
    )
    assert client.get(f"{url}/v2/nothing").status_code == 404
    assert client.get(f"{url}/health").status_code == 200


def test_metrics_parse_with_vllm_names_and_labels(fleet: FleetHandle, client: httpx.Client) -> None:
    url = fleet.workers[1].url
    client.post(
        f"{url}/v1/completions",
        json={"model": MODEL, "prompt": list(range(10, 60)), "max_tokens": 3},
    )
    families = {
        f.name: f for f in text_string_to_metric_families(client.get(f"{url}/metrics").text)
    }
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
        "vllm:num_preemptions",
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:cache_config_info",
    ):
        assert name in families, name
    running = families["vllm:num_requests_running"].samples[0]
    assert running.labels == {"model_name": MODEL, "engine": "0"}
    ttft_count = [
        s for s in families["vllm:time_to_first_token_seconds"].samples if s.name.endswith("_count")
    ]
    assert ttft_count[0].value >= 1
    prompt_total = [
        s for s in families["vllm:prompt_tokens"].samples if s.name == "vllm:prompt_tokens_total"
    ]
    assert prompt_total[0].value >= 50
    (info,) = families["vllm:cache_config_info"].samples
    assert info.labels["block_size"] == "16" and info.labels["num_gpu_blocks"] == "64"
    assert info.labels["enable_prefix_caching"] == "True"


def test_kv_events_reach_a_zmq_subscriber_and_replay_returns_missed_batches(
    fleet: FleetHandle, client: httpx.Client
) -> None:
    w = fleet.workers[1]
    assert w.events_endpoint and w.replay_endpoint
    sub = subscribe(w.events_endpoint)
    prompt = list(range(7000, 7040))  # 2 full blocks of 16 + 8
    client.post(f"{w.url}/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1})
    batches = receive_batches(sub, until_tokens=prompt[:32])
    stored = [op for b in batches for op in b.ops if isinstance(op, BlockStored)]
    assert stored[-1].block_size == 16 and len(stored[-1].engine_hashes) == 2
    assert stored[-1].parent_engine_hash is None
    sub.close()

    # Batches published while nobody listened come back through the replay socket.
    missed_prompt = list(range(8000, 8048))
    client.post(
        f"{w.url}/v1/completions", json={"model": MODEL, "prompt": missed_prompt, "max_tokens": 1}
    )
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(w.replay_endpoint)
    start_seq = batches[0].seq
    dealer.send_multipart([b"", start_seq.to_bytes(8, "big")])
    replayed: list[EventBatch] = []
    while True:
        assert dealer.poll(5000), "replay did not answer"
        frames = dealer.recv_multipart()
        if is_replay_end(frames):
            break
        replayed.append(decode_message(frames[1:]))
    dealer.close()
    seqs = [b.seq for b in replayed]
    assert seqs[0] == start_seq and seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    tokens = [
        t for b in replayed for op in b.ops if isinstance(op, BlockStored) for t in op.token_ids
    ]
    assert missed_prompt[:48] == tokens[-48:]


def test_wire_maps_have_exactly_vllms_keys(fleet: FleetHandle, client: httpx.Client) -> None:
    import msgpack

    from tests.workers.sim.test_golden import GOLDEN

    golden = json.loads(GOLDEN.read_text())
    golden_keys = {e["type"]: set(e) for b in golden["event_batches"] for e in b["events"]}
    w = fleet.workers[0]
    sub = subscribe(w.events_endpoint or "")
    prompt = list(range(20_000, 20_064))
    client.post(f"{w.url}/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1})
    assert sub.poll(5000)
    topic, seq, payload = sub.recv_multipart()
    sub.close()
    assert topic == b"" and len(seq) == 8
    ts, events, dp_rank = msgpack.unpackb(payload)
    assert isinstance(ts, float) and dp_rank == 0
    for event in events:
        assert set(event) == golden_keys[event["type"]]


def test_older_tagged_array_shape_decodes_the_same(client: httpx.Client) -> None:
    with start_fleet(1, model=MODEL, profile="dev", time_scale=0.02, event_shape="array") as arr:
        w = arr.workers[0]
        sub = subscribe(w.events_endpoint or "")
        prompt = list(range(900, 932))
        client.post(
            f"{w.url}/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1}
        )
        assert sub.poll(5000)
        frames = sub.recv_multipart()
        sub.close()
    import msgpack

    assert isinstance(msgpack.unpackb(frames[2])[1][0], list)
    (op,) = decode_message(frames).ops
    assert isinstance(op, BlockStored) and list(op.token_ids) == prompt


def test_client_disconnect_aborts_and_frees_blocks() -> None:
    with start_fleet(1, model=MODEL, profile="dev", time_scale=1.0, kv_events=False) as fleet:
        _disconnect_mid_stream(fleet)


def _disconnect_mid_stream(fleet: FleetHandle) -> None:
    w = fleet.workers[0]
    sim = fleet.sims[0]
    host, port = w.url.removeprefix("http://").split(":")
    body = json.dumps(
        {
            "model": MODEL,
            "prompt": list(range(100, 400)),
            "max_tokens": 1500,  # ~3 s of decode at time_scale 1
            "ignore_eos": True,
            "stream": True,
        }
    ).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        % (len(body), body)
    )
    received = b""
    while b"data: " not in received:
        received += sock.recv(65536)
    assert fleet.call(lambda: sim.engine.stats().running) == 1
    sock.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        stats = fleet.call(sim.engine.stats)
        if stats.running == 0 and stats.free_blocks == stats.usable_blocks:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"request not aborted: {stats}")
    assert fleet.call(lambda: sim.finished_by_reason.get("abort", 0)) >= 1


def test_reset_prefix_cache_publishes_all_blocks_cleared(
    fleet: FleetHandle, client: httpx.Client
) -> None:
    from routing.core.events import AllBlocksCleared

    w = fleet.workers[1]
    body = {"model": MODEL, "prompt": list(range(30_000, 30_040)), "max_tokens": 1}
    client.post(f"{w.url}/v1/completions", json=body)
    sub = subscribe(w.events_endpoint or "")
    assert client.post(f"{w.url}/reset_prefix_cache").status_code == 200
    assert sub.poll(5000)
    assert decode_message(sub.recv_multipart()).ops == (AllBlocksCleared(),)
    sub.close()
    again = client.post(f"{w.url}/v1/completions", json=body).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
