from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from controlplane.telemetry import selectors, tasks
from controlplane.telemetry.models import FleetSample

T0 = 1_800_000_000.0


class Pages:
    worker = ""
    gateway = ""


def vllm_metrics(
    *, running: int, waiting: int, kv: float, hits: int, queries: int, preempt: int
) -> str:
    # Two engines (data-parallel ranks) behind one URL: counters and queues add up, KV usage
    # is their mean.
    return "\n".join(
        [
            "# HELP vllm:num_requests_running Number of requests running.",
            "# TYPE vllm:num_requests_running gauge",
            f'vllm:num_requests_running{{engine="0",model_name="sim-8b"}} {running}',
            'vllm:num_requests_running{engine="1",model_name="sim-8b"} 0',
            f'vllm:num_requests_waiting{{engine="0",model_name="sim-8b"}} {waiting}',
            f'vllm:kv_cache_usage_perc{{engine="0",model_name="sim-8b"}} {kv}',
            f'vllm:kv_cache_usage_perc{{engine="1",model_name="sim-8b"}} {kv}',
            f'vllm:prefix_cache_hits_total{{engine="0",model_name="sim-8b"}} {hits}',
            f'vllm:prefix_cache_queries_total{{engine="0",model_name="sim-8b"}} {queries}',
            f'vllm:num_preemptions_total{{engine="0",model_name="sim-8b"}} {preempt}',
            "",
        ]
    )


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        body = (Pages.gateway if self.path.startswith("/gateway") else Pages.worker).encode()
        self.send_response(200)
        self.send_header("content-type", "text/plain; version=0.0.4")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def metrics_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.mark.django_db
def test_scrape_records_gauges_counter_deltas_and_evictions(metrics_server: str) -> None:
    targets = [("sim-0", metrics_server), ("dead", "http://127.0.0.1:9")]
    gw = f"{metrics_server}/gateway/metrics"
    Pages.worker = vllm_metrics(running=3, waiting=2, kv=0.5, hits=100, queries=400, preempt=1)
    Pages.gateway = (
        'kvroute_kv_blocks_removed_total{worker="sim-0"} 40\n'
        'kvroute_gateway_worker_events_state{worker="sim-0",state="live"} 1\n'
    )
    sent: list[dict] = []
    tasks.scrape_fleet_run(targets=targets, now_s=T0, gateway_metrics_url=gw, publish=sent.append)

    Pages.worker = vllm_metrics(running=4, waiting=0, kv=0.75, hits=300, queries=800, preempt=3)
    Pages.gateway = (
        'kvroute_kv_blocks_removed_total{worker="sim-0"} 100\n'
        'kvroute_gateway_worker_events_state{worker="sim-0",state="silent"} 1\n'
    )
    tasks.scrape_fleet_run(
        targets=targets, now_s=T0 + 5, gateway_metrics_url=gw, publish=sent.append
    )

    s = FleetSample.objects.filter(worker_id="sim-0").order_by("ts").last()
    assert (s.running, s.waiting, s.kv_usage_frac) == (4, 0, 0.75)
    assert (s.prefix_hits_delta, s.prefix_queries_delta, s.preemptions_delta) == (200, 400, 2)
    assert s.evictions_delta == 60 and s.interval_s == 5
    assert s.events_state == "silent"
    point = selectors.fleet_point(s)
    assert point["prefix_hit_rate"] == 0.5 and point["evictions_per_s"] == 12.0

    dead = FleetSample.objects.filter(worker_id="dead")
    assert dead.count() == 2 and not any(d.ok for d in dead) and "ConnectError" in dead[0].error

    # The engine restarted: counters went down, the delta counts from zero.
    Pages.worker = vllm_metrics(running=0, waiting=0, kv=0.0, hits=10, queries=20, preempt=0)
    tasks.scrape_fleet_run(targets=targets[:1], now_s=T0 + 10, gateway_metrics_url=gw)
    s = FleetSample.objects.filter(worker_id="sim-0").order_by("ts").last()
    assert (s.prefix_hits_delta, s.prefix_queries_delta) == (10, 20)

    assert sent[-1]["kind"] == "fleet"
    assert sent[-1]["evictions"][0]["evictions_per_s"] == 12.0
    series = selectors.fleet_series(since_s=T0 - 1)
    assert [p["waiting"] for p in series["workers"]["sim-0"]] == [2, 0, 0]
    latest = selectors.latest_fleet_by_worker()
    assert latest["dead"]["ok"] is False and latest["sim-0"]["ok"] is True


def test_metric_parsing_sums_engines_and_reads_labels() -> None:
    text = vllm_metrics(running=3, waiting=2, kv=0.5, hits=1, queries=2, preempt=0)
    m = tasks.worker_metrics_from_text(text)
    assert m.running == 3 and m.waiting == 2 and m.kv_usage_frac == 0.5
    old = text.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    assert tasks.worker_metrics_from_text(old).kv_usage_frac == 0.5
    view = tasks.gateway_view_from_metrics(
        'kvroute_kv_blocks_removed_total{worker="a"} 3\n'
        'kvroute_kv_blocks_removed_total{worker="b"} 4.5\n'
        'kvroute_gateway_worker_events_state{worker="a",state="live"} 1\n'
        'kvroute_gateway_worker_events_state{worker="b",state="none"} 1\n'
        "kvroute_gateway_index_entries 12\n"
    )
    assert view.blocks_removed == {"a": 3.0, "b": 4.5}
    assert view.events_state == {"a": "live", "b": "none"}
