"""OpenAPI generation without warnings, offline API docs, the admin, and seed_demo."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from controlplane.policies.management.commands.seed_demo import demo_policy_name
from controlplane.policies.models import ActiveVersion, Experiment, Policy, PolicyVersion

pytestmark = pytest.mark.django_db


def test_schema_generates_without_warnings_and_validates(tmp_path: Path) -> None:
    out = tmp_path / "schema.yaml"
    # --fail-on-warn turns any drf-spectacular warning or error into a CommandError.
    call_command("spectacular", "--fail-on-warn", "--validate", "--file", str(out))
    schema = yaml.safe_load(out.read_text())
    paths = schema["paths"]
    for path in [
        "/api/workers/",
        "/api/workers/{name}/heartbeat/",
        "/api/policies/{name}/activate/",
        "/api/models/{model}/rollback/",
        "/api/experiments/{name}/results/",
        "/api/routing-snapshot/",
        "/api/policies/validate/",
    ]:
        assert path in paths, path
    assert schema["components"]["securitySchemes"]["bearerToken"]["scheme"] == "bearer"


def test_schema_and_docs_are_served_without_a_cdn() -> None:
    client = Client()
    assert client.get("/api/schema/").status_code == 200
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    html = docs.content.decode()
    assert "drf_spectacular_sidecar" in html
    assert "cdn.jsdelivr" not in html and "unpkg.com" not in html
    # The assets themselves are served (from the installed package; no collectstatic needed).
    bundle = client.get("/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js")
    assert bundle.status_code == 200
    b"".join(bundle.streaming_content)  # type: ignore[attr-defined]
    bundle.close()


def test_admin_lists_every_model_and_versions_are_read_only() -> None:
    call_command("seed_demo", stdout=io.StringIO())
    admin = get_user_model().objects.create_superuser("root", "root@example.com", "pw-123456")
    client = Client()
    client.force_login(admin)
    for url in [
        "/admin/registry/worker/",
        "/admin/policies/policy/",
        "/admin/policies/policyversion/",
        "/admin/policies/activation/",
        "/admin/policies/activeversion/",
        "/admin/policies/experiment/",
        "/admin/common/apitoken/",
    ]:
        assert client.get(url).status_code == 200, url
    experiment = Experiment.objects.get()
    page = client.get(f"/admin/policies/experiment/{experiment.pk}/change/")
    assert page.status_code == 200 and b'name="arms-0-share"' not in page.content  # arms read-only
    version = PolicyVersion.objects.first()
    assert version is not None
    assert client.get("/admin/policies/policyversion/add/").status_code == 403
    page = client.get(f"/admin/policies/policyversion/{version.pk}/change/")
    assert page.status_code == 200 and b'name="params"' not in page.content  # no editable field
    resp = client.post(f"/admin/policies/policyversion/{version.pk}/change/", {"params": "{}"})
    assert resp.status_code == 403
    assert (
        client.post(
            f"/admin/policies/policyversion/{version.pk}/delete/", {"post": "yes"}
        ).status_code
        == 403
    )


def test_seed_demo_is_idempotent() -> None:
    first = io.StringIO()
    call_command("seed_demo", stdout=first)
    assert "activated sim-8b.kv_score v1" in first.getvalue()
    names = set(Policy.objects.filter(model="sim-8b").values_list("name", flat=True))
    assert names == {
        demo_policy_name("sim-8b", t)
        for t in ("round_robin", "least_load", "kv_score", "predicted_ttft")
    }
    active = ActiveVersion.objects.get(model="sim-8b").version
    assert active is not None and active.type == "kv_score"
    experiment = Experiment.objects.get(model="sim-8b")
    assert (experiment.status, experiment.sticky_key) == ("draft", "session")
    assert sorted((a.version.type, a.share) for a in experiment.arms.all()) == [
        ("kv_score", 50),
        ("least_load", 50),
    ]

    again = io.StringIO()
    call_command("seed_demo", stdout=again)
    assert "nothing to do" in again.getvalue()
    assert (Policy.objects.count(), PolicyVersion.objects.count(), Experiment.objects.count()) == (
        4,
        4,
        1,
    )

    call_command("seed_demo", "--model", "meta-llama/Llama-3.1-8B", stdout=io.StringIO())
    assert Policy.objects.filter(model="meta-llama/Llama-3.1-8B").count() == 4
    assert (
        demo_policy_name("meta-llama/Llama-3.1-8B", "kv_score")
        == "meta-llama-Llama-3.1-8B.kv_score"
    )
