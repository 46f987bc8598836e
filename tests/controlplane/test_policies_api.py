"""Policies over HTTP: versions, validation errors by field, activation, rollback."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from controlplane.policies.models import Activation, ActiveVersion, Policy, PolicyVersion
from tests.controlplane.conftest import policy_body

pytestmark = pytest.mark.django_db


def test_create_policy_with_first_version_and_defaults(operator: APIClient) -> None:
    resp = operator.post("/api/policies/", policy_body(note="first cut"), format="json")
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert (body["name"], body["model"], body["active_version"]) == ("kv-default", "sim-8b", None)
    [v1] = body["versions"]
    assert (v1["version"], v1["type"], v1["note"]) == (1, "kv_score", "first cut")
    assert v1["params"]["cache_weight"] == 2.0
    assert v1["params"]["load_weight"] == 0.5  # default filled in by routing.core
    assert v1["author"].startswith("token:")


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"type": "telepathy"}, "type"),
        ({"params": {"cache_weight": -1}}, "params.cache_weight"),
        ({"params": {"cache_weight": "NaN"}}, "params.cache_weight"),
        ({"params": {"cache_weight": 1e9}}, "params.cache_weight"),
        ({"params": {"cache_weight": True}}, "params.cache_weight"),
        ({"params": {"load_wieght": 1.0}}, "params.load_wieght"),
        ({"params": [1, 2]}, "params"),
        ({"name": "bad name!"}, "name"),
        ({"model": ""}, "model"),
    ],
)
def test_create_rejects_bad_input_naming_the_field(
    operator: APIClient, overrides: dict[str, object], field: str
) -> None:
    resp = operator.post("/api/policies/", policy_body(**overrides), format="json")
    assert resp.status_code == 400, resp.content
    assert list(resp.json()) == [field]
    assert Policy.objects.count() == 0 and PolicyVersion.objects.count() == 0


def test_duplicate_policy_name_is_400(operator: APIClient) -> None:
    assert operator.post("/api/policies/", policy_body(), format="json").status_code == 201
    resp = operator.post("/api/policies/", policy_body(model="other"), format="json")
    assert resp.status_code == 400
    assert resp.json() == {"name": ["A policy named 'kv-default' already exists."]}


def test_versions_are_appended_and_immutable(operator: APIClient) -> None:
    operator.post("/api/policies/", policy_body(), format="json")
    v2 = operator.post(
        "/api/policies/kv-default/versions/",
        {"params": {"cache_weight": 3.0}, "note": "more cache"},
        format="json",
    )
    assert v2.status_code == 201
    assert (v2.json()["version"], v2.json()["type"]) == (2, "kv_score")  # type carried over
    v3 = operator.post(
        "/api/policies/kv-default/versions/",
        {"type": "least_load", "params": {"power_of_two": True}},
        format="json",
    )
    assert v3.json()["version"] == 3
    listed = operator.get("/api/policies/kv-default/versions/").json()
    assert [(v["version"], v["params"].get("cache_weight")) for v in listed] == [
        (1, 2.0),
        (2, 3.0),
        (3, None),
    ]
    assert operator.get("/api/policies/kv-default/versions/2/").json()["note"] == "more cache"
    assert operator.get("/api/policies/kv-default/versions/9/").status_code == 404
    bad = operator.post(
        "/api/policies/kv-default/versions/", {"params": {"cache_weight": -2}}, format="json"
    )
    assert bad.status_code == 400 and list(bad.json()) == ["params.cache_weight"]
    assert operator.post("/api/policies/missing/versions/", {}, format="json").status_code == 404
    # No route edits or deletes a version.
    assert (
        operator.patch("/api/policies/kv-default/versions/1/", {}, format="json").status_code == 405
    )


def test_validate_is_a_dry_run(reader: APIClient) -> None:
    ok = reader.post(
        "/api/policies/validate/",
        {"type": "kv_score", "params": {"cache_weight": 1.5}},
        format="json",
    )
    assert ok.status_code == 200
    assert ok.json()["params"]["cache_weight"] == 1.5 and "load_weight" in ok.json()["params"]
    bad = reader.post(
        "/api/policies/validate/",
        {"type": "kv_score", "params": {"load_weight": -0.1}},
        format="json",
    )
    assert bad.status_code == 400 and list(bad.json()) == ["params.load_weight"]
    unknown = reader.post("/api/policies/validate/", {"type": "nope"}, format="json")
    assert unknown.status_code == 400 and list(unknown.json()) == ["type"]
    assert Policy.objects.count() == 0


def test_policy_types_lists_the_core_registry(reader: APIClient) -> None:
    types = {t["type"]: t for t in reader.get("/api/policy-types/").json()}
    assert {"round_robin", "least_load", "kv_score", "predicted_ttft"} <= set(types)
    assert types["kv_score"]["params"]["properties"]["cache_weight"]["minimum"] == 0.0


def test_activate_and_one_step_rollback(operator: APIClient) -> None:
    operator.post("/api/policies/", policy_body(), format="json")
    operator.post(
        "/api/policies/kv-default/versions/", {"params": {"cache_weight": 3.0}}, format="json"
    )
    operator.post(
        "/api/policies/kv-default/versions/", {"params": {"cache_weight": 4.0}}, format="json"
    )

    def active() -> int | None:
        return ActiveVersion.objects.get(model="sim-8b").version.number  # type: ignore[union-attr]

    first = operator.post("/api/policies/kv-default/activate/", {"version": 1}, format="json")
    assert first.status_code == 201 and first.json()["previous"] is None
    assert (
        operator.post(
            "/api/policies/kv-default/activate/", {"version": 1}, format="json"
        ).status_code
        == 200
    )
    operator.post("/api/policies/kv-default/activate/", {"version": 2}, format="json")
    third = operator.post(
        "/api/policies/kv-default/activate/", {"version": 3, "note": "push"}, format="json"
    )
    assert third.json()["previous"]["version"] == 2 and active() == 3
    assert operator.get("/api/policies/kv-default/").json()["active_version"] == 3

    back = operator.post("/api/models/sim-8b/rollback/", {"note": "bad p99"}, format="json")
    assert back.status_code == 201
    assert (
        back.json()["kind"],
        back.json()["to"]["version"],
        back.json()["previous"]["version"],
    ) == ("rollback", 2, 3)
    assert active() == 2
    # A second rollback goes one more step back rather than re-activating version 3.
    operator.post("/api/models/sim-8b/rollback/", {}, format="json")
    assert active() == 1
    nothing = operator.post("/api/models/sim-8b/rollback/", {}, format="json")
    assert nothing.status_code == 409 and "Nothing to roll back" in nothing.json()["detail"]
    assert (
        operator.post("/api/models/unknown-model/rollback/", {}, format="json").status_code == 404
    )

    history = operator.get("/api/models/sim-8b/").json()
    assert history["active"]["version"] == 1
    assert [(h["kind"], h["to"]["version"]) for h in history["history"]] == [
        ("rollback", 1),
        ("rollback", 2),
        ("activate", 3),
        ("activate", 2),
        ("activate", 1),
    ]
    assert Activation.objects.filter(model="sim-8b").count() == 5


def test_activate_rejects_bad_requests(operator: APIClient) -> None:
    operator.post("/api/policies/", policy_body(), format="json")
    other_model = operator.post(
        "/api/policies/kv-default/activate/", {"version": 1, "model": "llama-70b"}, format="json"
    )
    assert other_model.status_code == 400
    assert other_model.json() == {
        "model": ["Policy 'kv-default' routes model 'sim-8b', not 'llama-70b'."]
    }
    missing = operator.post("/api/policies/kv-default/activate/", {"version": 7}, format="json")
    assert missing.status_code == 400 and list(missing.json()) == ["version"]
    assert (
        operator.post(
            "/api/policies/kv-default/activate/", {"version": 0}, format="json"
        ).status_code
        == 400
    )
    assert operator.post("/api/policies/kv-default/activate/", {}, format="json").status_code == 400
    assert (
        operator.post("/api/policies/ghost/activate/", {"version": 1}, format="json").status_code
        == 404
    )
    assert not ActiveVersion.objects.exclude(version=None).exists()


def test_models_endpoint_lists_routes(operator: APIClient) -> None:
    operator.post("/api/policies/", policy_body(), format="json")
    operator.post(
        "/api/policies/", policy_body("org-llama", model="meta-llama/Llama-3.1-8B"), format="json"
    )
    operator.post("/api/policies/org-llama/activate/", {"version": 1}, format="json")
    routes = {r["model"]: r for r in operator.get("/api/models/").json()}
    assert routes["sim-8b"]["active"] is None
    assert routes["meta-llama/Llama-3.1-8B"]["active"]["policy"] == "org-llama"
    # Model names with a slash work in paths.
    detail = operator.get("/api/models/meta-llama/Llama-3.1-8B/").json()
    assert detail["active"]["version"] == 1 and len(detail["history"]) == 1
