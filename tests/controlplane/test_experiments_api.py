"""A/B experiments over HTTP: arm validation, one running experiment per model, results."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from controlplane.policies.models import Experiment
from tests.controlplane.conftest import policy_body

pytestmark = pytest.mark.django_db


@pytest.fixture
def versions(operator: APIClient) -> dict[str, int]:
    """version ids: kv (sim-8b), least (sim-8b), other (another model)."""
    ids = {}
    for key, body in {
        "kv": policy_body("kv"),
        "least": policy_body("least", type="least_load", params={}),
        "other": policy_body("other", model="llama-70b"),
    }.items():
        ids[key] = operator.post("/api/policies/", body, format="json").json()["versions"][0][
            "version_id"
        ]
    return ids


def experiment_body(
    versions: dict[str, int], name: str = "kv-vs-least", **overrides: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "model": "sim-8b",
        "sticky_key": "session",
        "arms": [
            {"name": "A", "version_id": versions["kv"], "share": 50},
            {"name": "B", "policy": "least", "version": 1, "share": 50},
        ],
    }
    body.update(overrides)
    return body


def test_create_start_stop_and_results(operator: APIClient, versions: dict[str, int]) -> None:
    created = operator.post(
        "/api/experiments/",
        experiment_body(versions, shadow_version_id=versions["kv"]),
        format="json",
    )
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["status"] == "draft" and body["sticky_key"] == "session"
    assert [(a["name"], a["policy"], a["share"]) for a in body["arms"]] == [
        ("A", "kv", 50),
        ("B", "least", 50),
    ]
    assert body["shadow"]["policy"] == "kv"

    started = operator.post("/api/experiments/kv-vs-least/start/")
    assert started.status_code == 200 and started.json()["status"] == "running"
    assert started.json()["started_at"] is not None
    results = operator.get("/api/experiments/kv-vs-least/results/")
    assert results.status_code == 200
    assert [a["name"] for a in results.json()["arms"]] == ["A", "B"]
    assert "results" in results.json()
    again = operator.post("/api/experiments/kv-vs-least/start/")
    assert again.status_code == 409

    stopped = operator.post("/api/experiments/kv-vs-least/stop/")
    assert stopped.json()["status"] == "stopped" and stopped.json()["stopped_at"] is not None
    assert operator.post("/api/experiments/kv-vs-least/stop/").status_code == 409
    assert (
        operator.delete("/api/experiments/kv-vs-least/").status_code == 409
    )  # kept for its results
    listed = operator.get("/api/experiments/?model=sim-8b&status=stopped").json()
    assert [e["name"] for e in listed] == ["kv-vs-least"]


def test_one_running_experiment_per_model(operator: APIClient, versions: dict[str, int]) -> None:
    operator.post("/api/experiments/", experiment_body(versions, "first"), format="json")
    operator.post("/api/experiments/", experiment_body(versions, "second"), format="json")
    assert operator.post("/api/experiments/first/start/").status_code == 200
    clash = operator.post("/api/experiments/second/start/")
    assert clash.status_code == 409
    assert (
        clash.json()["detail"]
        == "Experiment 'first' is already running for model 'sim-8b'; stop it first."
    )
    assert Experiment.objects.get(name="second").status == "draft"
    operator.post("/api/experiments/first/stop/")
    assert operator.post("/api/experiments/second/start/").status_code == 200


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda b, v: b["arms"][1].update(share=40), "arms"),
        (lambda b, v: b.update(arms=b["arms"][:1]), "arms"),
        (lambda b, v: b["arms"][0].update(share=0), "arms"),
        (lambda b, v: b["arms"][0].update(share=150), "arms"),
        (lambda b, v: b["arms"][0].update(share="half"), "arms"),
        (lambda b, v: b["arms"][0].update(version_id=v["other"]), "arms[0].version_id"),
        (lambda b, v: b["arms"][1].update(policy="other"), "arms[1].policy"),
        (lambda b, v: b["arms"][1].update(policy="ghost"), "arms[1].policy"),
        (lambda b, v: b["arms"][1].update(version=9), "arms[1].version"),
        (lambda b, v: b["arms"][0].update(version_id=999_999), "arms[0].version_id"),
        (lambda b, v: b["arms"][1].update(name="A"), "arms[1].name"),
        (lambda b, v: b["arms"][1].pop("policy"), "arms[1].policy"),
        (lambda b, v: b.update(sticky_key="cookie"), "sticky_key"),
        (lambda b, v: b.update(shadow_version_id=v["other"]), "shadow_version_id"),
        (lambda b, v: b.update(name="no spaces please"), "name"),
    ],
)
def test_create_rejects_bad_arms_naming_the_field(
    operator: APIClient, versions: dict[str, int], mutate: Any, field: str
) -> None:
    body = experiment_body(versions)
    mutate(body, versions)
    resp = operator.post("/api/experiments/", body, format="json")
    assert resp.status_code == 400, resp.content
    assert list(resp.json()) == [field]
    assert Experiment.objects.count() == 0


def test_shares_message_and_duplicate_name(operator: APIClient, versions: dict[str, int]) -> None:
    body = experiment_body(versions)
    body["arms"][1]["share"] = 30
    assert operator.post("/api/experiments/", body, format="json").json() == {
        "arms": ["Arm shares must sum to 100, not 80."]
    }
    assert (
        operator.post("/api/experiments/", experiment_body(versions), format="json").status_code
        == 201
    )
    dup = operator.post("/api/experiments/", experiment_body(versions), format="json")
    assert dup.status_code == 400 and dup.json() == {
        "name": ["An experiment named 'kv-vs-least' already exists."]
    }


def test_three_arms_default_names_and_draft_delete(
    operator: APIClient, versions: dict[str, int]
) -> None:
    body = experiment_body(
        versions,
        arms=[
            {"version_id": versions["kv"], "share": 34},
            {"version_id": versions["least"], "share": 33},
            {"version_id": versions["kv"], "share": 33},
        ],
        sticky_key="tenant",
    )
    resp = operator.post("/api/experiments/", body, format="json")
    assert [a["name"] for a in resp.json()["arms"]] == ["A", "B", "C"]
    assert operator.delete("/api/experiments/kv-vs-least/").status_code == 204
    assert operator.get("/api/experiments/kv-vs-least/").status_code == 404
    assert operator.post("/api/experiments/kv-vs-least/start/").status_code == 404
