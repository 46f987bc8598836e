from __future__ import annotations

import re

import pytest
from django.test import Client

from controlplane.common.auth import OPERATOR, Actor
from controlplane.policies import services as psvc
from controlplane.policies.models import PolicyVersion
from controlplane.policies.selectors import active_version
from controlplane.registry import services as rsvc
from controlplane.registry.models import Worker
from controlplane.telemetry import services as tsvc
from controlplane.telemetry import tasks
from controlplane.telemetry.models import ExperimentResult
from controlplane.telemetry.sources import MemorySinkSource
from routing.gateway.records import MemorySink
from tests.controlplane.telemetry.test_drain import make_record

OPS = Actor(label="test", scope=OPERATOR)
pytestmark = pytest.mark.django_db


def test_pages_need_login_and_login_page_works(client: Client) -> None:
    for url in ["/", "/workers/", "/policies/", "/experiments/", "/requests/", "/snapshot.json"]:
        resp = client.get(url)
        assert resp.status_code == 302 and resp["Location"].startswith("/login/"), url
    assert client.get("/login/").status_code == 200
    from django.contrib.auth.models import User

    User.objects.create_user("a", password="pw-123-abc")
    resp = client.post("/login/", {"username": "a", "password": "pw-123-abc"})
    assert resp.status_code == 302 and resp["Location"] == "/"
    assert client.get("/").status_code == 200
    resp = client.post("/logout/")
    assert resp.status_code == 302
    assert client.get("/").status_code == 302


def test_plotly_is_served_locally(client: Client) -> None:
    resp = client.get("/assets/plotly.min.js")
    assert resp.status_code == 200
    body = resp.content
    assert len(body) > 1_000_000 and b"plotly" in body[:2000].lower()


def test_overview_page_and_snapshot(ops_client: Client) -> None:
    page = ops_client.get("/").content.decode()
    assert 'data-ws-path="/ws/dashboard/"' in page
    assert "/assets/plotly.min.js" in page and "cdn" not in page.lower()
    sink = MemorySink()
    sink.append_many([make_record(i, ts_s=1_800_000_000.0 + i) for i in range(30)])
    tsvc.request_stream_drain(source=MemorySinkSource(sink, name="m"))
    snap = ops_client.get("/snapshot.json?window_s=86400").json()
    assert "points" in snap and "fleet" in snap and "evictions" in snap
    assert ops_client.get("/snapshot.json?window_s=abc").status_code == 400
    assert snap["marks"] == []
    _policy()
    psvc.policy_activate(policy_name="kv-default", version=1, actor=OPS)
    marks = ops_client.get("/snapshot.json").json()["marks"]
    assert [m["text"] for m in marks] == ["activate: kv-default v1"]


def _worker() -> Worker:
    w, _ = rsvc.worker_register(
        name="sim-0", base_url="http://127.0.0.1:9", model="sim-8b", actor=OPS
    )
    return w


def test_workers_table_and_drain_enable(ops_client: Client, viewer_client: Client) -> None:
    _worker()
    page = ops_client.get("/workers/").content.decode()
    assert "sim-0" in page and "Drain" in page
    assert "Drain" not in viewer_client.get("/workers/").content.decode()
    assert viewer_client.post("/workers/sim-0/drain/").status_code == 403
    resp = ops_client.post("/workers/sim-0/drain/")
    assert resp.status_code == 302
    assert Worker.objects.get(name="sim-0").state == "draining"
    ops_client.post("/workers/sim-0/enable/")
    assert Worker.objects.get(name="sim-0").state == "active"
    # "next" only ever sends the operator back into this site.
    resp = ops_client.post("/workers/sim-0/drain/", {"next": "https://evil.example/"})
    assert resp["Location"] == "/workers/"
    resp = ops_client.post("/workers/sim-0/enable/", {"next": "/workers/sim-0/"})
    assert resp["Location"] == "/workers/sim-0/"
    assert ops_client.post("/workers/nope/drain/").status_code == 302  # flashed NotFound
    assert ops_client.get("/workers/sim-0/").status_code == 200
    assert ops_client.get("/workers/nope/").status_code == 404
    assert ops_client.get("/workers/sim-0/drain/").status_code == 405


def _policy() -> None:
    psvc.policy_create(name="kv-default", model="sim-8b", type="kv_score", params={}, actor=OPS)


def test_policy_form_is_generated_from_the_schema_and_validated(ops_client: Client) -> None:
    _policy()
    page = ops_client.get("/policies/kv-default/").content.decode()
    assert 'name="param__cache_weight"' in page and 'max="100.0"' in page
    form = {m: v for m, v in re.findall(r'name="(param__[a-z_]+)" value="([^"]*)"', page)}
    assert form["param__cache_weight"] == "1.0"

    bad = dict(form, param__cache_weight="250")
    resp = ops_client.post("/policies/kv-default/save/", bad)
    assert resp.status_code == 400
    assert 'id="error-cache_weight"' in resp.content.decode()
    resp = ops_client.post("/policies/kv-default/save/", dict(form, param__load_weight="lots"))
    assert resp.status_code == 400 and 'id="error-load_weight"' in resp.content.decode()
    assert PolicyVersion.objects.count() == 1

    good = dict(form, param__cache_weight="2.5", activate="1", note="more cache")
    resp = ops_client.post("/policies/kv-default/save/", good)
    assert resp.status_code == 302
    v2 = PolicyVersion.objects.get(number=2)
    assert v2.params["cache_weight"] == 2.5 and v2.note == "more cache"
    assert active_version(model="sim-8b") == v2

    ops_client.post("/policies/kv-default/activate/", {"version": "1"})
    assert active_version(model="sim-8b").number == 1
    ops_client.post("/policies/kv-default/rollback/")
    assert active_version(model="sim-8b").number == 2


def test_viewer_cannot_save_weights(viewer_client: Client) -> None:
    _policy()
    assert (
        viewer_client.post("/policies/kv-default/save/", {"param__cache_weight": "2"}).status_code
        == 403
    )


def test_whatif_panel_is_honest_when_the_simulator_is_missing(
    ops_client: Client, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    from dashboard import whatif

    _policy()
    monkeypatch.setattr(whatif, "_bench", lambda: None)
    page = ops_client.get("/policies/kv-default/").content.decode()
    assert 'id="whatif-unavailable"' in page and "not available" in page
    resp = ops_client.post(
        "/policies/kv-default/whatif/", {"param": "cache_weight", "values": "0,1"}
    )
    assert resp.status_code == 503 and resp.json()["available"] is False


def _recorded(n: int, *, with_keys: bool) -> None:
    sink = MemorySink()
    recs = []
    for i in range(n):
        tenant = i % 3
        keys = [tenant * 1000 + j for j in range(40)] + [10**9 + i * 10 + j for j in range(4)]
        recs.append(
            make_record(
                i,
                ts_s=1_800_000_000.0 + i * 0.2,
                prompt_tokens=len(keys) * 16 + 3,
                output_tokens=8,
                **({"block_keys": keys, "block_size": 16} if with_keys else {}),
            )
        )
    sink.append_many(recs)
    tsvc.request_stream_drain(source=MemorySinkSource(sink, name="m"))


def test_whatif_replays_recorded_requests_in_the_offline_simulator(ops_client: Client) -> None:
    _policy()
    _worker()
    page = ops_client.get("/policies/kv-default/").content.decode()
    assert 'id="whatif-form"' in page and '<option value="h100-8b" selected>' in page
    resp = ops_client.post(
        "/policies/kv-default/whatif/", {"param": "cache_weight", "values": "0,1"}
    )
    assert resp.status_code == 409 and "need at least 10" in resp.json()["detail"]

    _recorded(30, with_keys=True)
    bad = ops_client.post(
        "/policies/kv-default/whatif/", {"param": "cache_weight", "values": "0,500"}
    )
    assert bad.status_code == 400 and "values" in bad.json()
    assert (
        ops_client.post(
            "/policies/kv-default/whatif/", {"param": "nope", "values": "0,1"}
        ).status_code
        == 400
    )
    resp = ops_client.post(
        "/policies/kv-default/whatif/",
        {"param": "cache_weight", "values": "0, 2", "profile": "dev"},
    )
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert body["requests"] == 30 and body["engines"] == 1 and body["profile"] == "dev"
    assert [r["cache_weight"] for r in body["rows"]] == [0.0, 2.0]
    assert all(r["ttft_p99_ms"] > 0 and 0 <= r["hit_rate"] <= 1 for r in body["rows"])
    # Three tenants share 40-block prefixes: the replay sees that reuse.
    assert body["rows"][1]["hit_rate"] > 0.5
    assert body["figure"]["data"][0]["x"] == [0.0, 2.0]

    # Two weights: a surface (one simulator run per grid point).
    resp = ops_client.post(
        "/policies/kv-default/whatif/",
        {
            "param": "cache_weight",
            "values": "0, 2",
            "param2": "load_weight",
            "values2": "0, 1",
            "profile": "dev",
        },
    )
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert sorted((r["cache_weight"], r["load_weight"]) for r in body["rows"]) == [
        (0.0, 0.0),
        (0.0, 1.0),
        (2.0, 0.0),
        (2.0, 1.0),
    ]
    assert [t["type"] for t in body["figure"]["data"]] == ["heatmap", "heatmap"]
    too_many = ops_client.post(
        "/policies/kv-default/whatif/",
        {
            "param": "cache_weight",
            "values": "0,1,2,3,4",
            "param2": "load_weight",
            "values2": "0,1,2,3",
        },
    )
    assert too_many.status_code == 400 and "values2" in too_many.json()
    same = ops_client.post(
        "/policies/kv-default/whatif/",
        {"param": "cache_weight", "values": "0,1", "param2": "cache_weight", "values2": "0,1"},
    )
    assert same.status_code == 400 and "param2" in same.json()


def test_whatif_says_so_when_records_have_no_block_keys(ops_client: Client) -> None:
    _policy()
    _recorded(12, with_keys=False)
    resp = ops_client.post(
        "/policies/kv-default/whatif/", {"param": "cache_weight", "values": "0,1"}
    )
    assert resp.status_code == 409 and "no block keys" in resp.json()["detail"]


def test_experiment_lifecycle_results_and_promote(ops_client: Client) -> None:
    _policy()
    psvc.policy_create(name="least", model="sim-8b", type="least_load", params={}, actor=OPS)
    psvc.policy_activate(policy_name="least", version=1, actor=OPS)
    v_kv = PolicyVersion.objects.get(policy__name="kv-default")
    v_ll = PolicyVersion.objects.get(policy__name="least")
    resp = ops_client.post(
        "/experiments/new/",
        {
            "name": "kv-vs-ll",
            "model": "sim-8b",
            "sticky_key": "session",
            "arm_A_version": v_ll.pk,
            "arm_A_share": "50",
            "arm_B_version": v_kv.pk,
            "arm_B_share": "40",
        },
    )
    assert resp.status_code == 302  # shares sum to 90: flashed, back to the form
    page = ops_client.get("/experiments/").content.decode()
    assert "must sum to 100" in page
    resp = ops_client.post(
        "/experiments/new/",
        {
            "name": "kv-vs-ll",
            "model": "sim-8b",
            "sticky_key": "session",
            "arm_A_version": v_ll.pk,
            "arm_A_share": "50",
            "arm_B_version": v_kv.pk,
            "arm_B_share": "50",
        },
    )
    assert resp["Location"] == "/experiments/kv-vs-ll/"
    ops_client.post("/experiments/kv-vs-ll/start/")
    from controlplane.policies.models import Experiment

    exp = Experiment.objects.get(name="kv-vs-ll")
    assert exp.status == "running"

    # Arm B is clearly faster: ~30 % lower TTFT.
    import random

    rng = random.Random(9)
    recs = []
    for i in range(600):
        arm = "A" if i % 2 == 0 else "B"
        ttft = rng.lognormvariate(5.5, 0.4) * (1.0 if arm == "A" else 0.7)
        recs.append(
            make_record(
                i,
                experiment_id=exp.pk,
                arm=arm,
                ttft_ms=ttft,
                policy_version_id=(v_ll if arm == "A" else v_kv).pk,
            )
        )
    sink = MemorySink()
    sink.append_many(recs)
    tsvc.request_stream_drain(source=MemorySinkSource(sink, name="m"))
    verdicts = tasks.experiment_results_run()
    assert verdicts[exp.pk].startswith("B faster by")
    assert ExperimentResult.objects.get(experiment_id=exp.pk).body["winner"] == "B"

    page = ops_client.get("/experiments/kv-vs-ll/").content.decode()
    assert 'id="verdict"' in page and "B faster by" in page and 'id="promote"' in page
    assert 'id="chart-cdf"' in page

    ops_client.post("/experiments/kv-vs-ll/promote/", {"arm": "B"})
    exp.refresh_from_db()
    assert exp.status == "stopped"
    assert active_version(model="sim-8b") == v_kv


def test_request_explorer_explains_the_choice(ops_client: Client) -> None:
    sink = MemorySink()
    rec = make_record(
        1,
        candidates=[
            {
                "worker": "sim-1",
                "score": 0.8,
                "cached_blocks": 60,
                "terms": {"cache": 0.9, "queue": -0.1},
            },
            {
                "worker": "sim-0",
                "score": 0.1,
                "cached_blocks": 0,
                "terms": {"cache": 0.0, "queue": 0.1},
            },
        ],
        worker_id="sim-1",
        reason="sim-1 holds 60 of 62 prompt blocks",
    )
    sink.append_many([rec])
    tsvc.request_stream_drain(source=MemorySinkSource(sink, name="m"))
    listing = ops_client.get("/requests/").content.decode()
    assert "/requests/req-1/" in listing
    assert "sim-1" in ops_client.get("/requests/?worker=sim-1").content.decode()
    assert "req-1" not in ops_client.get("/requests/?worker=sim-9").content.decode()
    page = ops_client.get("/requests/req-1/").content.decode()
    assert "sim-1 holds 60 of 62 prompt blocks" in page
    assert 'id="chart-why"' in page and "chosen" in page
    assert ops_client.get("/requests/nope/").status_code == 404


def test_nul_in_a_path_or_query_is_a_400(ops_client: Client) -> None:
    assert ops_client.get("/workers/w%00/").status_code == 400
    assert ops_client.get("/requests/?worker=%00").status_code == 400
    assert ops_client.post("/experiments/e%00/start/").status_code == 400
