"""The control-plane API (`/api/`) against a hostile caller, over a real socket (uvicorn).

Every refused request must get a 4xx whose JSON body names the offending field (or says
what is wrong in `detail`), never a 500, and must leave every control-plane row exactly
as it was. Each test walks a table of cases and reports all the ones that misbehave.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.hardening.conftest import LiveServer

MODEL = "sim-8b"
WORKER = {
    "name": "w0",
    "base_url": "http://127.0.0.1:8101",
    "model": MODEL,
    "block_size": 16,
    "capacity_blocks": 4096,
    "labels": {"zone": "a"},
}


def send(api: httpx.Client, method: str, path: str, body: Any = None, **kw: Any) -> httpx.Response:
    """`body`: bytes/str go on the wire as they are (with a JSON content type unless
    `headers` say otherwise); anything else is JSON-encoded."""
    if body is None:
        return api.request(method, path, **kw)
    if isinstance(body, bytes | str):
        headers = {"content-type": "application/json", **kw.pop("headers", {})}
        return api.request(method, path, content=body, headers=headers, **kw)
    return api.request(method, path, json=body, **kw)


def problem(resp: httpx.Response, status: int, field: str | None) -> str | None:
    """Why `resp` is not the expected refusal, or None when it is."""
    if resp.status_code != status:
        return f"status {resp.status_code} (want {status}): {resp.text[:200]}"
    try:
        body = resp.json()
    except ValueError:
        return f"body is not JSON: {resp.text[:200]!r}"
    if not isinstance(body, dict):
        return f"body is not an object: {body!r}"
    key = field or "detail"
    if key not in body:
        return f"body does not name {key!r}: {body}"
    message = body[key]
    text = message if isinstance(message, str) else json.dumps(message)
    if not text or len(text) < 5:
        return f"empty message for {key!r}: {body}"
    return None


Case = tuple[str, str, Any, int, str | None]


def run_cases(api: httpx.Client, db_state: Callable[[], dict[str, Any]], cases: list[Case]) -> None:
    failures = []
    for method, path, body, status, field in cases:
        before = db_state()
        resp = send(api, method, path, body)
        why = problem(resp, status, field)
        if why is None and db_state() != before:
            why = "a refused request changed the database"
        if why is not None:
            failures.append(f"{method} {path[:80]} {str(body)[:120]!r}: {why}")
    assert api.get("/api/workers/").status_code == 200, "the server is no longer healthy"
    assert not failures, "\n".join(failures)


@pytest.fixture
def seeded(api: httpx.Client) -> dict[str, int]:
    """A worker, two policies of MODEL (one active), one of another model; version ids."""
    assert api.post("/api/workers/", json=WORKER).status_code == 201
    ids = {}
    for name, model, type_ in [
        ("p-kv", MODEL, "kv_score"),
        ("p-least", MODEL, "least_load"),
        ("p-other", "other-model", "kv_score"),
    ]:
        resp = api.post("/api/policies/", json={"name": name, "model": model, "type": type_})
        assert resp.status_code == 201, resp.text
        ids[name] = resp.json()["versions"][0]["version_id"]
    assert api.post("/api/policies/p-kv/activate/", json={"version": 1}).status_code == 201
    return ids


def test_malformed_bodies_are_400_not_500(
    api: httpx.Client, seeded: dict[str, int], db_state: Callable[[], dict[str, Any]]
) -> None:
    cases: list[Case] = []
    for path in (
        "/api/workers/",
        "/api/workers/w0/heartbeat/",
        "/api/policies/",
        "/api/policies/p-kv/versions/",
        "/api/policies/p-kv/activate/",
        "/api/experiments/",
    ):
        cases += [
            ("POST", path, "{not json", 400, None),
            ("POST", path, b"\xff\xfe\x00", 400, None),
            ("POST", path, '{"name": NaN}', 400, None),
            ("POST", path, '{"name": Infinity}', 400, None),
            ("POST", path, '{"name": -Infinity}', 400, None),
            ("POST", path, "[" * 100_000, 400, None),
            ("POST", path, '{"a":' * 50_000 + "1" + "}" * 50_000, 400, None),
            ("POST", path, "[1, 2]", 400, "non_field_errors"),
            ("POST", path, '"a string"', 400, "non_field_errors"),
        ]
    cases += [
        ("PATCH", "/api/workers/w0/", "[]", 400, "non_field_errors"),
        ("PATCH", "/api/workers/w0/", "null", 400, "non_field_errors"),
        ("PATCH", "/api/workers/w0/", "[" * 100_000, 400, None),
        ("POST", "/api/models/sim-8b/rollback/", "[" * 100_000, 400, None),
    ]
    run_cases(api, db_state, cases)


def test_unsupported_and_oversized_bodies(
    api: httpx.Client, seeded: dict[str, int], db_state: Callable[[], dict[str, Any]]
) -> None:
    before = db_state()
    xml = api.post(
        "/api/workers/", content=b"<worker/>", headers={"content-type": "application/xml"}
    )
    assert problem(xml, 415, None) is None, xml.text
    # 3 MB of JSON: refused as too large before it is parsed (Django's 2.5 MB body limit).
    huge = json.dumps({**WORKER, "name": "w-huge", "labels": {"k": "v" * 3_000_000}})
    resp = api.post("/api/workers/", content=huge, headers={"content-type": "application/json"})
    assert problem(resp, 413, None) is None, resp.text[:300]
    form = "name=w-form&base_url=http://a:1&model=m&" + "x=" + "y" * 3_000_000
    resp = api.post(
        "/api/workers/", content=form, headers={"content-type": "application/x-www-form-urlencoded"}
    )
    assert problem(resp, 413, None) is None, resp.text[:300]
    # More fields than Django parses (DATA_UPLOAD_MAX_NUMBER_FIELDS): a JSON 400.
    many = "&".join(f"model=m{i}" for i in range(1500))
    resp = api.get(f"/api/workers/?{many}")
    assert problem(resp, 400, None) is None, resp.text[:300]
    resp = api.post(
        "/api/workers/", content=many, headers={"content-type": "application/x-www-form-urlencoded"}
    )
    assert problem(resp, 400, None) is None, resp.text[:300]
    assert db_state() == before


def test_worker_registration_refuses_hostile_fields(
    api: httpx.Client, seeded: dict[str, int], db_state: Callable[[], dict[str, Any]]
) -> None:
    def reg(**overrides: Any) -> dict[str, Any]:
        return {**WORKER, "name": "w-new", **overrides}

    # fmt: off
    cases: list[Case] = [
        ("POST", "/api/workers/", reg(name="W0"), 400, "name"),  # only the case differs from w0
        ("POST", "/api/workers/", reg(name="w\u0000x"), 400, "name"),
        ("POST", "/api/workers/", reg(name="x" * 100_000), 400, "name"),
        ("POST", "/api/workers/", reg(name="wörker"), 400, "name"),
        ("POST", "/api/workers/", reg(name="a/b"), 400, "name"),
        ("POST", "/api/workers/", reg(name=""), 400, "name"),
        ("POST", "/api/workers/", reg(name=None), 400, "name"),
        ("POST", "/api/workers/", reg(name=["w"]), 400, "name"),
        ("POST", "/api/workers/", reg(name={"a": 1}), 400, "name"),
        ("POST", "/api/workers/", reg(model="m\u0000"), 400, "model"),
        ("POST", "/api/workers/", reg(model="two words"), 400, "model"),
        ("POST", "/api/workers/", reg(model="x" * 10_000), 400, "model"),
        ("POST", "/api/workers/", reg(base_url="http://user:secret@10.0.0.1:8000"), 400, "base_url"),
        ("POST", "/api/workers/", reg(base_url="http://token@10.0.0.1:8000"), 400, "base_url"),
        ("POST", "/api/workers/", reg(base_url="javascript:alert(1)"), 400, "base_url"),
        ("POST", "/api/workers/", reg(base_url="file:///etc/passwd"), 400, "base_url"),
        ("POST", "/api/workers/", reg(base_url="ftp://h:21"), 400, "base_url"),
        ("POST", "/api/workers/", reg(base_url="//h:1"), 400, "base_url"),
        ("POST", "/api/workers/", reg(base_url="http://[::1"), 400, "base_url"),
        ("POST", "/api/workers/", reg(base_url="http://h:99999"), 400, "base_url"),
        ("POST", "/api/workers/", reg(base_url="http://h:1/?q=1"), 400, "base_url"),
        ("POST", "/api/workers/", reg(base_url="http://h\u0000:1"), 400, "base_url"),
        ("POST", "/api/workers/", reg(base_url="http://h :1"), 400, "base_url"),
        ("POST", "/api/workers/", reg(kv_events_endpoint="tcp://h:0"), 400, "kv_events_endpoint"),
        ("POST", "/api/workers/", reg(kv_events_endpoint="ipc:///tmp/x"), 400, "kv_events_endpoint"),
        ("POST", "/api/workers/", reg(replay_endpoint=5), 400, "replay_endpoint"),
        ("POST", "/api/workers/", reg(block_size=0), 400, "block_size"),
        ("POST", "/api/workers/", reg(block_size=-16), 400, "block_size"),
        ("POST", "/api/workers/", reg(block_size=2**70), 400, "block_size"),
        ("POST", "/api/workers/", reg(block_size=16.5), 400, "block_size"),
        ("POST", "/api/workers/", reg(block_size=True), 400, "block_size"),
        ("POST", "/api/workers/", reg(capacity_blocks=2**63), 400, "capacity_blocks"),
        ("POST", "/api/workers/", reg(capacity_blocks=2**31), 400, "capacity_blocks"),
        ("POST", "/api/workers/", reg(capacity_blocks=-1), 400, "capacity_blocks"),
        ("POST", "/api/workers/", reg(network_ms=-0.5), 400, "network_ms"),
        ("POST", "/api/workers/", reg(network_ms=1e308), 400, "network_ms"),
        ("POST", "/api/workers/", reg(network_ms="fast"), 400, "network_ms"),
        ("POST", "/api/workers/", json.dumps(reg(network_ms=1)).replace("1}", "1e400}"), 400, "network_ms"),
        ("POST", "/api/workers/", reg(labels=["zone"]), 400, "labels"),
        ("POST", "/api/workers/", reg(labels="zone=a"), 400, "labels"),
        ("POST", "/api/workers/", reg(labels={"zone": {"nested": "x"}}), 400, "labels"),
        ("POST", "/api/workers/", reg(labels={"zone": None}), 400, "labels"),
        ("POST", "/api/workers/", reg(labels={"k\u0000": "v"}), 400, "labels"),
        ("POST", "/api/workers/", reg(labels={"k": "v\u0000"}), 400, "labels"),
        ("POST", "/api/workers/", reg(labels={"": "v"}), 400, "labels"),
        ("POST", "/api/workers/", reg(labels={"k" * 64: "v"}), 400, "labels"),
        ("POST", "/api/workers/", reg(labels={"k": "v" * 201}), 400, "labels"),
        ("POST", "/api/workers/", reg(labels={f"k{i}": "v" for i in range(51)}), 400, "labels"),
        # Re-registering w0 with a bad field must not half-update it either.
        ("POST", "/api/workers/", {**WORKER, "block_size": 0}, 400, "block_size"),
        ("POST", "/api/workers/", {**WORKER, "base_url": "gopher://h:70"}, 400, "base_url"),
    ]
    # fmt: on
    run_cases(api, db_state, cases)
    # Exactly the same name is an idempotent re-registration, not a clash.
    assert api.post("/api/workers/", json=WORKER).status_code == 200


def test_worker_updates_heartbeats_and_probes_refuse_garbage(
    api: httpx.Client, seeded: dict[str, int], db_state: Callable[[], dict[str, Any]]
) -> None:
    hb = "/api/workers/w0/heartbeat/"
    # fmt: off
    cases: list[Case] = [
        ("POST", hb, {"running": -1}, 400, "running"),
        ("POST", hb, {"running": 2**63}, 400, "running"),
        ("POST", hb, {"running": 1.5}, 400, "running"),
        ("POST", hb, {"running": "lots"}, 400, "running"),
        ("POST", hb, {"running": None}, 400, "running"),
        ("POST", hb, {"running": [1]}, 400, "running"),
        ("POST", hb, {"waiting": -5}, 400, "waiting"),
        ("POST", hb, {"inflight": True}, 400, "inflight"),
        ("POST", hb, {"inflight": {"n": 1}}, 400, "inflight"),
        ("POST", hb, {"kv_usage_frac": 1.5}, 400, "kv_usage_frac"),
        ("POST", hb, {"kv_usage_frac": -0.1}, 400, "kv_usage_frac"),
        ("POST", hb, {"kv_usage_frac": "half"}, 400, "kv_usage_frac"),
        ("POST", hb, '{"kv_usage_frac": NaN}', 400, None),
        ("POST", hb, {"block_size": 0}, 400, "block_size"),
        ("POST", hb, {"capacity_blocks": 2**63}, 400, "capacity_blocks"),
        ("POST", hb, {"running": 1, "capacity_blocks": -1}, 400, "capacity_blocks"),
        ("POST", "/api/workers/ghost/heartbeat/", {"running": 1}, 404, None),
        ("PATCH", "/api/workers/w0/", {"state": "exploded"}, 400, "state"),
        ("PATCH", "/api/workers/w0/", {"name": "renamed"}, 400, "name"),
        ("PATCH", "/api/workers/w0/", {"owner_token": 1}, 400, "owner_token"),
        ("PATCH", "/api/workers/w0/", {"labels": None}, 400, "labels"),
        ("PATCH", "/api/workers/w0/", {"base_url": "http://u:p@h:1"}, 400, "base_url"),
        ("PATCH", "/api/workers/w0/", {"network_ms": -1, "state": "draining"}, 400, "network_ms"),
        ("PATCH", "/api/workers/ghost/", {"state": "draining"}, 404, None),
        ("POST", "/api/workers/w0/probe/", {}, 400, "ok"),
        ("POST", "/api/workers/w0/probe/", {"ok": "maybe"}, 400, "ok"),
        ("POST", "/api/workers/w0/probe/", {"ok": False, "error": "e" * 301}, 400, "error"),
        ("POST", "/api/workers/w0/probe/", {"ok": False, "error": "e\u0000"}, 400, "error"),
    ]
    # fmt: on
    run_cases(api, db_state, cases)


def test_policies_refuse_hostile_fields(
    api: httpx.Client, seeded: dict[str, int], db_state: Callable[[], dict[str, Any]]
) -> None:
    def pol(**overrides: Any) -> dict[str, Any]:
        return {"name": "p-new", "model": MODEL, "type": "kv_score", "params": {}, **overrides}

    # fmt: off
    cases: list[Case] = [
        ("POST", "/api/policies/", pol(name="P-KV"), 400, "name"),
        ("POST", "/api/policies/", pol(name="p-kv"), 400, "name"),
        ("POST", "/api/policies/", pol(name="p\u0000"), 400, "name"),
        ("POST", "/api/policies/", pol(type="nope"), 400, "type"),
        ("POST", "/api/policies/", pol(type=None), 400, "type"),
        ("POST", "/api/policies/", pol(type=["kv_score"]), 400, "type"),
        ("POST", "/api/policies/", pol(params=[1]), 400, "params"),
        ("POST", "/api/policies/", pol(params="cache_weight=2"), 400, "params"),
        ("POST", "/api/policies/", pol(params=None), 400, "params"),
        ("POST", "/api/policies/", pol(params={"cache_weight": -1}), 400, "params.cache_weight"),
        ("POST", "/api/policies/", pol(params={"cache_weight": 1e308}), 400, "params.cache_weight"),
        ("POST", "/api/policies/", pol(params={"cache_weight": 2**70}), 400, "params.cache_weight"),
        ("POST", "/api/policies/", pol(params={"cache_weight": "2"}), 400, "params.cache_weight"),
        ("POST", "/api/policies/", pol(params={"cache_weight": True}), 400, "params.cache_weight"),
        ("POST", "/api/policies/", pol(params={"cache_weight": {"x": 1}}), 400, "params.cache_weight"),
        ("POST", "/api/policies/", pol(params={"nested": {"deep": [1, {"x": None}]}}), 400, "params.nested"),
        ("POST", "/api/policies/", pol(params={"k\u0000": 1}), 400, "params.k\u0000"),
        (
            "POST",
            "/api/policies/",
            '{"name":"p-new","model":"sim-8b","type":"kv_score","params":{"cache_weight":NaN}}',
            400,
            None,
        ),
        ("POST", "/api/policies/", pol(type="prefix_hash", params={"prefix_blocks": 2.5}), 400, "params.prefix_blocks"),
        ("POST", "/api/policies/", pol(type="prefix_hash", params={"prefix_blocks": 2**70}), 400, "params.prefix_blocks"),
        ("POST", "/api/policies/", pol(type="session_affinity", params={"fallback": "x" * 100_000}), 400, "params.fallback"),
        ("POST", "/api/policies/", pol(description="d" * 5000), 400, "description"),
        ("POST", "/api/policies/", pol(note="n\u0000"), 400, "note"),
        ("POST", "/api/policies/p-kv/versions/", {"params": {"cache_weight": -3}}, 400, "params.cache_weight"),
        ("POST", "/api/policies/p-kv/versions/", {"type": "least_load", "params": {"cache_weight": 3}}, 400, "params.cache_weight"),
        ("POST", "/api/policies/p-kv/versions/", {"params": []}, 400, "params"),
        ("POST", "/api/policies/ghost/versions/", {"params": {}}, 404, None),
        ("POST", "/api/policies/p-kv/activate/", {}, 400, "version"),
        ("POST", "/api/policies/p-kv/activate/", {"version": 0}, 400, "version"),
        ("POST", "/api/policies/p-kv/activate/", {"version": -1}, 400, "version"),
        ("POST", "/api/policies/p-kv/activate/", {"version": 99}, 400, "version"),
        ("POST", "/api/policies/p-kv/activate/", {"version": 2**63}, 400, "version"),
        ("POST", "/api/policies/p-kv/activate/", {"version": 1.5}, 400, "version"),
        ("POST", "/api/policies/p-kv/activate/", {"version": "one"}, 400, "version"),
        ("POST", "/api/policies/p-kv/activate/", {"version": 1, "model": "other-model"}, 400, "model"),
        ("POST", "/api/policies/ghost/activate/", {"version": 1}, 404, None),
        ("POST", "/api/policies/p-other/activate/", {"version": 1, "model": MODEL}, 400, "model"),
        ("POST", "/api/models/sim-8b/rollback/", {}, 409, None),
        ("POST", "/api/models/ghost-model/rollback/", {}, 404, None),
        ("POST", "/api/models/sim-8b/rollback/", {"note": "n" * 2001}, 400, "note"),
        ("POST", "/api/policies/validate/", {"type": "kv_score", "params": {"cache_weight": "abc"}}, 400, "params.cache_weight"),
        ("POST", "/api/policies/validate/", {"params": {}}, 400, "type"),
        # Versions are immutable and policies keep their history: no edit or delete verbs.
        ("PUT", "/api/policies/p-kv/versions/1/", {"params": {"cache_weight": 9}}, 405, None),
        ("PATCH", "/api/policies/p-kv/versions/1/", {"params": {"cache_weight": 9}}, 405, None),
        ("DELETE", "/api/policies/p-kv/versions/1/", None, 405, None),
        ("PATCH", "/api/policies/p-kv/", {"model": "other-model"}, 405, None),
        ("DELETE", "/api/policies/p-kv/", None, 405, None),
        ("DELETE", "/api/models/sim-8b/", None, 405, None),
    ]
    # fmt: on
    run_cases(api, db_state, cases)


def test_experiments_refuse_hostile_arms(
    api: httpx.Client, seeded: dict[str, int], db_state: Callable[[], dict[str, Any]]
) -> None:
    kv, least, other = seeded["p-kv"], seeded["p-least"], seeded["p-other"]

    def exp(arms: Any, **overrides: Any) -> dict[str, Any]:
        return {"name": "e-new", "model": MODEL, "arms": arms, **overrides}

    two = [{"share": 50, "version_id": kv}, {"share": 50, "version_id": least}]
    # fmt: off
    cases: list[Case] = [
        ("POST", "/api/experiments/", exp([]), 400, "arms"),
        ("POST", "/api/experiments/", exp([{"share": 100, "version_id": kv}]), 400, "arms"),
        ("POST", "/api/experiments/", exp([{"share": 9, "version_id": kv}] * 11 + [{"share": 1, "version_id": least}]), 400, "arms"),
        ("POST", "/api/experiments/", exp("AB"), 400, "arms"),
        ("POST", "/api/experiments/", exp({"A": 50}), 400, "arms"),
        ("POST", "/api/experiments/", exp(None), 400, "arms"),
        ("POST", "/api/experiments/", exp([two[0], "B"]), 400, "arms"),
        ("POST", "/api/experiments/", exp([{"share": 60, "version_id": kv}, two[1]]), 400, "arms"),
        ("POST", "/api/experiments/", exp([{"share": 50.5, "version_id": kv}, {"share": 49.5, "version_id": least}]), 400, "arms"),
        ("POST", "/api/experiments/", exp([{"share": "half", "version_id": kv}, two[1]]), 400, "arms"),
        ("POST", "/api/experiments/", exp([{"share": 0, "version_id": kv}, {"share": 100, "version_id": least}]), 400, "arms"),
        ("POST", "/api/experiments/", exp([{"share": -50, "version_id": kv}, {"share": 150, "version_id": least}]), 400, "arms"),
        ("POST", "/api/experiments/", exp([two[0], {"share": 50, "version_id": other}]), 400, "arms[1].version_id"),
        ("POST", "/api/experiments/", exp([two[0], {"share": 50, "version_id": 2**63}]), 400, "arms[1].version_id"),
        ("POST", "/api/experiments/", exp([two[0], {"share": 50, "version_id": -1}]), 400, "arms[1].version_id"),
        ("POST", "/api/experiments/", exp([two[0], {"share": 50}]), 400, "arms[1].policy"),
        ("POST", "/api/experiments/", exp([two[0], {"share": 50, "policy": "p-least", "version": 2}]), 400, "arms[1].version"),
        ("POST", "/api/experiments/", exp([two[0], {"share": 50, "policy": "ghost", "version": 1}]), 400, "arms[1].policy"),
        ("POST", "/api/experiments/", exp([two[0], {"share": 50, "policy": "p-least"}]), 400, "arms[1].version"),
        ("POST", "/api/experiments/", exp([{**two[0], "name": "A"}, {**two[1], "name": "A"}]), 400, "arms[1].name"),
        ("POST", "/api/experiments/", exp([{**two[0], "name": "a b"}, two[1]]), 400, "arms[0].name"),
        ("POST", "/api/experiments/", exp(two, sticky_key="cookie"), 400, "sticky_key"),
        ("POST", "/api/experiments/", exp(two, shadow_version_id=other), 400, "shadow_version_id"),
        ("POST", "/api/experiments/", exp(two, shadow_version_id="x"), 400, "shadow_version_id"),
        ("POST", "/api/experiments/", exp(two, shadow_version_id=2**63), 400, "shadow_version_id"),
        ("POST", "/api/experiments/", exp(two, model="other-model"), 400, "arms[0].version_id"),
        ("POST", "/api/experiments/", exp(two, name="bad name"), 400, "name"),
        ("POST", "/api/experiments/ghost/start/", {}, 404, None),
        ("POST", "/api/experiments/ghost/stop/", {}, 404, None),
        ("DELETE", "/api/experiments/ghost/", None, 404, None),
    ]
    # fmt: on
    run_cases(api, db_state, cases)

    assert api.post("/api/experiments/", json=exp(two, name="e1")).status_code == 201
    # An A/A test (the same version in both arms) is a legitimate way to check the
    # experiment machinery: accepted, with two distinct arms.
    aa = api.post("/api/experiments/", json=exp([two[0], {**two[0]}], name="e-aa"))
    assert aa.status_code == 201, aa.text
    assert [a["name"] for a in aa.json()["arms"]] == ["A", "B"]
    # Shares given as integral floats or numeric strings are read as whole percents.
    floats = [{"share": 50.0, "version_id": kv}, {"share": "50", "version_id": least}]
    resp = api.post("/api/experiments/", json=exp(floats, name="e-floats"))
    assert resp.status_code == 201, resp.text
    assert [a["share"] for a in resp.json()["arms"]] == [50, 50]
    run_cases(
        api,
        db_state,
        [
            ("POST", "/api/experiments/", exp(two, name="E1"), 400, "name"),
            ("POST", "/api/experiments/", exp(two, name="e1"), 400, "name"),
            ("POST", "/api/experiments/e1/stop/", {}, 409, None),
        ],
    )
    assert api.post("/api/experiments/e1/start/").status_code == 200
    run_cases(
        api,
        db_state,
        [
            ("POST", "/api/experiments/e1/start/", {}, 409, None),
            ("POST", "/api/experiments/e-aa/start/", {}, 409, None),
            ("DELETE", "/api/experiments/e1/", None, 409, None),
        ],
    )


def test_path_and_query_parameters(
    api: httpx.Client, seeded: dict[str, int], db_state: Callable[[], dict[str, Any]]
) -> None:
    long = "a" * 5000
    # fmt: off
    cases: list[Case] = [
        ("GET", f"/api/workers/{long}/", None, 404, None),
        ("DELETE", f"/api/workers/{long}/", None, 404, None),
        ("GET", f"/api/policies/{long}/", None, 404, None),
        ("GET", f"/api/experiments/{long}/", None, 404, None),
        ("POST", f"/api/models/{long}/rollback/", {}, 404, None),
        ("GET", "/api/policies/p-kv/versions/99999999999999999999999/", None, 404, None),
        ("GET", "/api/policies/p-kv/versions/9223372036854775808/", None, 404, None),
        # NUL in a name: PostgreSQL refuses it in a query, so it must never reach one.
        ("GET", "/api/workers/w%000/", None, 400, "name"),
        ("POST", "/api/workers/w%000/drain/", None, 400, "name"),
        ("POST", "/api/workers/w%000/heartbeat/", {"running": 1}, 400, "name"),
        ("GET", "/api/policies/p%00/", None, 400, "name"),
        ("POST", "/api/policies/p%00/activate/", {"version": 1}, 400, "name"),
        ("GET", "/api/experiments/e%00/results/", None, 400, "name"),
        ("GET", "/api/models/m%00/", None, 400, "model"),
        ("POST", "/api/models/m%00/rollback/", {}, 400, "model"),
        ("GET", "/api/workers/?model=%00", None, 400, "model"),
        ("GET", "/api/workers/?state=exploded", None, 400, "state"),
        ("GET", "/api/workers/?healthy=maybe", None, 400, "healthy"),
        ("GET", "/api/policies/?model=%00", None, 400, "model"),
        ("GET", "/api/policies/?model=ok&model=%00", None, 400, "model"),
        ("GET", "/api/experiments/?model=%00", None, 400, "model"),
        ("GET", "/api/experiments/?status=bogus", None, 400, "status"),
    ]
    # fmt: on
    run_cases(api, db_state, cases)
    # %2F decodes to '/', so no name route matches: a JSON 404, and w0 is untouched.
    run_cases(
        api,
        db_state,
        [
            ("GET", "/api/workers/w0%2F..%2Fw0/", None, 404, None),
            ("DELETE", "/api/workers/w0%2F/", None, 404, None),
            ("POST", "/api/workers/w0%2F/drain/", None, 404, None),
            ("GET", "/api/no-such-route/", None, 404, None),
            ("POST", "/api/policies/p-kv/versions/1/activate/", {}, 404, None),
        ],
    )
    # The model route takes any model name, '/' included (HF-style "org/model").
    resp = api.get("/api/models/org%2Fmodel/")
    assert resp.status_code == 200 and resp.json()["model"] == "org/model"


def test_authorization_header_variants(
    cp_server: LiveServer, operator_token: str, db_state: Callable[[], dict[str, Any]]
) -> None:
    body = {**WORKER, "name": "w-auth"}
    refused = [
        None,
        "Bearer",
        f"Bearer {operator_token} {operator_token}",
        f"Bearer {operator_token}, Bearer {operator_token}",
        f"Token {operator_token}",
        f"Basic {operator_token}",
        operator_token,
        f"Bearer {operator_token[:-1]}",
        f"Bearer {operator_token}x",
        "Bearer " + "x" * 10_000,
        "Bearer kvr_\u00e9t\u00e9",
    ]
    accepted = [f"Bearer {operator_token}", f"bearer {operator_token}", f"BEARER  {operator_token}"]
    failures = []
    with httpx.Client(base_url=cp_server.url, timeout=10) as client:
        before = db_state()
        for header in refused:
            headers = {} if header is None else {"authorization": header.encode("utf-8")}
            resp = client.post("/api/workers/", json=body, headers=headers)
            if resp.status_code != 401 or not resp.headers.get("www-authenticate", "").startswith(
                "Bearer"
            ):
                failures.append(f"{header!r:.60}: {resp.status_code} {resp.text[:100]}")
            elif "detail" not in resp.json():
                failures.append(f"{header!r:.60}: no detail in {resp.text[:100]}")
        if db_state() != before:
            failures.append("a refused request changed the database")
        for header in accepted:
            resp = client.get("/api/workers/", headers={"authorization": header})
            if resp.status_code != 200:
                failures.append(f"{header!r:.60}: {resp.status_code} {resp.text[:100]}")
    assert not failures, "\n".join(failures)


def test_tokens_cannot_reach_beyond_their_scope(
    cp_server: LiveServer,
    api: httpx.Client,
    seeded: dict[str, int],
    db_state: Callable[[], dict[str, Any]],
) -> None:
    from controlplane.common.services import api_token_create

    _, agent_a = api_token_create(name="agent-a", scope="worker")
    _, agent_b = api_token_create(name="agent-b", scope="worker")
    _, reader = api_token_create(name="reader", scope="read")

    def client(secret: str) -> httpx.Client:
        return httpx.Client(
            base_url=cp_server.url, headers={"authorization": f"Bearer {secret}"}, timeout=10
        )

    with client(agent_a) as a:
        assert a.post("/api/workers/", json={**WORKER, "name": "w-a"}).status_code == 201
    kv = seeded["p-kv"]
    experiment = {
        "name": "e-x",
        "model": MODEL,
        "arms": [{"share": 50, "version_id": kv}, {"share": 50, "version_id": kv}],
    }
    agent_b_cases: list[Case] = [
        # Another agent's worker: no hijack by re-registering, heartbeats, drain or delete.
        (
            "POST",
            "/api/workers/",
            {**WORKER, "name": "w-a", "base_url": "http://evil:1"},
            403,
            None,
        ),
        ("POST", "/api/workers/w-a/heartbeat/", {"running": 999}, 403, None),
        ("POST", "/api/workers/w-a/drain/", None, 403, None),
        ("DELETE", "/api/workers/w-a/", None, 403, None),
        ("POST", "/api/workers/w0/drain/", None, 403, None),  # an operator-registered worker
        ("PATCH", "/api/workers/w-a/", {"state": "disabled"}, 403, None),
        ("POST", "/api/workers/w-a/enable/", None, 403, None),
        ("POST", "/api/workers/w-a/probe/", {"ok": False}, 403, None),
        ("POST", "/api/policies/", {"name": "p-x", "model": MODEL, "type": "random"}, 403, None),
        ("POST", "/api/policies/p-kv/activate/", {"version": 1}, 403, None),
        ("POST", "/api/models/sim-8b/rollback/", {}, 403, None),
        ("POST", "/api/experiments/", experiment, 403, None),
    ]
    reader_cases: list[Case] = [
        *agent_b_cases,
        ("POST", "/api/workers/", {**WORKER, "name": "w-r"}, 403, None),
        ("POST", "/api/workers/w0/heartbeat/", {"running": 1}, 403, None),
    ]
    with client(agent_b) as b:
        run_cases(b, db_state, agent_b_cases)
    with client(reader) as r:
        run_cases(r, db_state, reader_cases)
        # The dry run writes nothing, so a read token may use it.
        resp = r.post("/api/policies/validate/", json={"type": "kv_score", "params": {}})
        assert resp.status_code == 200, resp.text


def test_unknown_routes_answer_in_each_surfaces_language(django_db_setup: None) -> None:
    """The product's ASGI app: /v1/ paths the gateway does not serve fall through to Django,
    which must still answer like the OpenAI API; /api/ answers JSON."""
    from controlplane.asgi import application

    with LiveServer(application) as server, httpx.Client(base_url=server.url, timeout=10) as c:
        for method, path in [
            ("POST", "/v1/embeddings"),
            ("POST", "/v1/chat/completions/"),
            ("GET", "/v1/"),
            ("GET", "/v1/models/sim-8b"),
        ]:
            resp = c.request(method, path, json={} if method == "POST" else None)
            assert resp.status_code == 404, (path, resp.text[:200])
            err = resp.json()["error"]
            assert err["code"] == "not_found" and path in err["message"], err
        resp = c.get("/api/nothing-here/")
        assert resp.status_code == 404 and "nothing-here" in resp.json()["detail"]
        # Everything else keeps Django's HTML pages.
        resp = c.get("/no-such-page/")
        assert resp.status_code == 404 and resp.headers["content-type"].startswith("text/html")
