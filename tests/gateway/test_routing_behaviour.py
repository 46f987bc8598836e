"""What an operator notices about routing: prefixes stick to the worker holding them, load
moves traffic, draining workers get nothing new, dead workers are retried around, and the
predicted cached tokens are what the engine then reports."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx

from routing.gateway.records import MemorySink
from tests.gateway.conftest import MODEL, post

SYSTEM = " ".join(f"rule {i}: answer briefly and cite the cache block." for i in range(40))


def ask(
    url: str,
    question: str,
    *,
    system: str = SYSTEM,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 4,
        **extra,
    }
    resp = post(url, "/v1/chat/completions", body, headers=headers)
    assert resp.status_code == 200, resp.text
    return resp


def records(gw: Any) -> list[dict[str, Any]]:
    sink = gw.state.records.sink
    assert isinstance(sink, MemorySink)
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        gw.call(lambda: None)
        out = [r for _, r in sink.read(count=10_000)]
        if out:
            return out
        time.sleep(0.05)
    return []


def wait_for(predicate: Any, timeout_s: float = 3.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_shared_prefix_lands_on_the_worker_holding_it(
    fleet_factory: Any, gateway_factory: Any
) -> None:
    fleet = fleet_factory(3)
    gw = gateway_factory(fleet.snapshot())
    first = ask(gw.url, "question zero")
    holder = first.headers["x-kvroute-worker"]
    assert first.headers["x-kvroute-predicted-cached-tokens"] == "0"
    time.sleep(0.1)  # quiet fleet: the holder's KV events arrive
    for i in range(1, 8):
        resp = ask(gw.url, f"a different question number {i}", headers={"x-kvroute-explain": "1"})
        assert resp.headers["x-kvroute-worker"] == holder
        assert int(resp.headers["x-kvroute-predicted-cached-tokens"]) > 300
        assert resp.headers["x-kvroute-policy"] == "test-kv_score@1"
        # The engine confirms the cache hit.
        assert resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 300
    # A prompt nobody holds is free to go anywhere; with the holder busier it goes elsewhere
    # at least once over a few tries is not guaranteed, so check only that the explain header
    # lists every worker with its terms.
    import json

    decision = json.loads(resp.headers["x-kvroute-decision"])
    assert decision["worker"] == holder
    assert sorted(c["worker"] for c in decision["candidates"]) == ["sim-0", "sim-1", "sim-2"]
    assert all("cache" in c["terms"] for c in decision["candidates"])


def test_predictions_equal_actual_cached_tokens_on_a_quiet_fleet(
    fleet_factory: Any, gateway_factory: Any
) -> None:
    fleet = fleet_factory(2)
    gw = gateway_factory(fleet.snapshot())
    systems = [SYSTEM, SYSTEM[: len(SYSTEM) // 2], "tenant B: " + SYSTEM[100:]]
    for i in range(12):
        ask(gw.url, f"question {i % 5} about topic {i}", system=systems[i % 3])
        time.sleep(0.06)
    recs = records(gw)
    wait_for(lambda: len(records(gw)) == 12)
    recs = records(gw)
    assert len(recs) == 12
    assert sum(r["actual_cached_tokens"] for r in recs) > 2000  # the test must exercise hits
    for r in recs:
        assert r["predicted_cached_tokens"] == r["actual_cached_tokens"], r
        assert r["status"] == "ok" and r["http_status"] == 200
        assert r["policy_type"] == "kv_score" and r["policy_version_id"] == 1
        assert r["routing_overhead_us"] > 0 and r["e2e_ms"] > 0
        assert 1 <= len(r["candidates"]) <= 3


def test_traffic_moves_off_a_loaded_holder_to_an_idle_worker(
    fleet_factory: Any, gateway_factory: Any
) -> None:
    # Real time (time_scale=1): requests stay in flight long enough to load the holder.
    fleet = fleet_factory(2, time_scale=1.0)
    gw = gateway_factory(fleet.snapshot(params={"max_queue_imbalance": 2.0}))
    holder = ask(gw.url, "warm up").headers["x-kvroute-worker"]
    time.sleep(0.1)
    placed: list[str] = []
    stop = threading.Event()
    threads = []

    def long_request(i: int, started: threading.Event) -> None:
        body = {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"long {i}"},
            ],
            "max_tokens": 1200,
            "ignore_eos": True,
            "stream": True,
        }
        with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, timeout=30) as resp:
            placed.append(resp.headers["x-kvroute-worker"])
            started.set()
            for _ in resp.iter_bytes():
                if stop.is_set():
                    break

    try:
        for i in range(6):
            started = threading.Event()
            t = threading.Thread(target=long_request, args=(i, started), daemon=True)
            t.start()
            threads.append(t)
            assert started.wait(10)
        # The prefix keeps the first requests on its holder; once the holder is loaded past
        # the imbalance threshold, new requests for the same prefix go to the idle worker.
        assert placed[0] == holder
        assert placed[1] == holder
        other = next(w for w in ("sim-0", "sim-1") if w != holder)
        assert other in placed
        switch = placed.index(other)
        assert switch >= 2
        inflight = gw.call(lambda: gw.state.load.inflight(holder)[0])
        assert inflight >= 2  # the holder really was loaded when traffic moved
    finally:
        stop.set()
        for t in threads:
            t.join(10)


def test_a_draining_worker_gets_nothing_new(fleet_factory: Any, gateway_factory: Any) -> None:
    fleet = fleet_factory(2)
    gw = gateway_factory(fleet.snapshot())
    holder = ask(gw.url, "warm up").headers["x-kvroute-worker"]
    time.sleep(0.1)
    assert ask(gw.url, "again").headers["x-kvroute-worker"] == holder
    idx = int(holder.split("-")[1])
    gw.source.set(fleet.snapshot(states={idx: "draining"}, revision="r2"))
    gw.refresh()
    for i in range(6):
        resp = ask(gw.url, f"after drain {i}")
        assert resp.headers["x-kvroute-worker"] != holder
    health = httpx.get(gw.url + "/gateway/health").json()
    assert health["workers"][holder]["draining"] is True
    assert health["workers"][holder]["routable"] is False


def test_a_killed_worker_is_retried_around_without_client_visible_error(
    fleet_factory: Any, gateway_factory: Any
) -> None:
    fleet = fleet_factory(2)
    # No scraper: the only way to learn the worker is dead is the failed request itself.
    gw = gateway_factory(fleet.snapshot(), metrics_interval_s=0, breaker_failures=2)
    holder = ask(gw.url, "warm up").headers["x-kvroute-worker"]
    time.sleep(0.1)
    fleet.kill(int(holder.split("-")[1]))
    for i in range(5):
        resp = ask(gw.url, f"after kill {i}")
        assert resp.headers["x-kvroute-worker"] != holder
    stream_resp = ask(gw.url, "streamed after kill", stream=True)
    assert stream_resp.text.rstrip().endswith("data: [DONE]")
    recs = records(gw)
    wait_for(lambda: len(records(gw)) == 7)
    recs = records(gw)
    retried = [r for r in recs[1:] if r["retries"] > 0]
    # The first requests after the kill tried the holder first; then its breaker opened.
    assert len(retried) == 2
    assert all(r["status"] == "ok" for r in recs)
    metrics = httpx.get(gw.url + "/gateway/metrics").text
    assert f'kvroute_gateway_retries_total{{reason="connect",worker="{holder}"}} 2.0' in metrics
    assert f'kvroute_gateway_worker_breaker_open{{worker="{holder}"}} 1.0' in metrics


def test_experiment_arms_are_sticky_per_session_and_shadow_is_recorded(
    fleet_factory: Any, gateway_factory: Any, redis_url: str
) -> None:
    from routing.gateway.records import RedisStreamSink

    fleet = fleet_factory(2)

    def arm(name: str, policy: str, version_id: int) -> dict[str, Any]:
        return {
            "name": name,
            "policy": policy,
            "version": 1,
            "version_id": version_id,
            "type": policy,
            "params": {},
            "share": 50,
        }

    experiment = {
        "id": 7,
        "name": "kv-vs-rr",
        "sticky_key": "session",
        "arms": [arm("A", "kv_score", 11), arm("B", "round_robin", 12)],
        "shadow": {
            "policy": "least_load",
            "version": 1,
            "version_id": 13,
            "type": "least_load",
            "params": {},
        },
    }
    gw = gateway_factory(fleet.snapshot(experiment=experiment), redis_url=redis_url)
    seen: dict[str, set[str]] = {}
    for i in range(24):
        session = f"s{i % 8}"
        resp = ask(gw.url, f"question {i}", headers={"x-session-id": session})
        seen.setdefault(session, set()).add(resp.headers["x-kvroute-arm"])
        assert resp.headers["x-kvroute-policy"] in ("kv_score@1", "round_robin@1")
    assert all(len(arms) == 1 for arms in seen.values())  # sticky
    # OpenAI's `user` field is the session when no x-session-id header is sent.
    for session in ("s0", "s1", "s2"):
        assert {ask(gw.url, "via user", user=session).headers["x-kvroute-arm"]} == seen[session]
    assert set().union(*seen.values()) == {"A", "B"}  # both arms used
    sink = RedisStreamSink(url=redis_url)
    wait_for(lambda: len(sink.read(count=100)) == 27)
    recs = [r for _, r in sink.read(count=100)][:24]
    assert {r["experiment_id"] for r in recs} == {7}
    assert {(r["arm"], r["policy_version_id"]) for r in recs} == {("A", 11), ("B", 12)}
    assert all(
        r["shadow"]["policy_version_id"] == 13 and r["shadow"]["worker"] in ("sim-0", "sim-1")
        for r in recs
    )
    assert all(r["session_key"] == f"s{i % 8}" for i, r in enumerate(recs))
