"""Concurrent writers on real database connections (one per thread): activations leave
exactly one active version, experiment starts leave exactly one running experiment."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, connections

from controlplane.common.auth import OPERATOR, Actor
from controlplane.common.errors import Conflict
from controlplane.policies import services
from controlplane.policies.models import Activation, ActiveVersion, Experiment
from controlplane.registry.models import Worker
from controlplane.registry.services import worker_register

pytestmark = pytest.mark.django_db(transaction=True)

OPS = Actor(label="test", scope=OPERATOR)


def race(*calls: Callable[[], Any]) -> list[Any]:
    """Run the calls at once, each on its own thread (and DB connection); results or exceptions."""
    if connection.vendor == "sqlite" and connection.settings_dict["NAME"].startswith(
        "file:memorydb"
    ):
        pytest.skip(
            "in-memory SQLite cannot be shared by threads; run with tests/controlplane's conftest"
        )
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(i: int, call: Callable[[], Any]) -> None:
        try:
            barrier.wait(timeout=10)
            results[i] = call()
        except Exception as exc:
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    return results


def test_concurrent_activations_leave_exactly_one_active_version() -> None:
    services.policy_create(name="p", model="m", type="kv_score", params={}, actor=OPS)
    for weight in (2.0, 3.0, 4.0):
        services.policy_version_add(policy_name="p", params={"cache_weight": weight}, actor=OPS)
    # Round 0 races two *first* activations (no ActiveVersion row yet); later rounds race updates.
    for round_no, (a, b) in enumerate([(1, 2), (3, 4), (1, 4), (2, 3)]):
        results = race(
            lambda a=a: services.policy_activate(policy_name="p", version=a, actor=OPS),
            lambda b=b: services.policy_activate(policy_name="p", version=b, actor=OPS),
        )
        assert not any(isinstance(r, Exception) for r in results), results
        rows = list(ActiveVersion.objects.filter(model="m"))
        assert len(rows) == 1
        latest = Activation.objects.filter(model="m").order_by("-id")[:2]
        winner, loser = latest[0], latest[1]
        # Serialised: the last activation is the active one, and it saw the other as previous.
        assert rows[0].version_id == winner.version_id
        assert winner.previous_version_id == loser.version_id, round_no
        assert {winner.version.number, loser.version.number} == {a, b}


def test_concurrent_starts_leave_one_running_experiment() -> None:
    _, v1 = services.policy_create(name="p", model="m", type="kv_score", params={}, actor=OPS)
    _, v2 = services.policy_create(name="q", model="m", type="least_load", params={}, actor=OPS)
    arms = [{"version_id": v1.pk, "share": 50}, {"version_id": v2.pk, "share": 50}]
    for name in ("e1", "e2", "e3"):
        services.experiment_create(name=name, model="m", arms=arms, actor=OPS)
    results = race(
        *(lambda n=n: services.experiment_start(name=n, actor=OPS) for n in ("e1", "e2", "e3"))
    )
    started = [r for r in results if isinstance(r, Experiment)]
    refused = [r for r in results if isinstance(r, Conflict)]
    assert (len(started), len(refused)) == (1, 2), results
    assert list(Experiment.objects.filter(status="running").values_list("name", flat=True)) == [
        started[0].name
    ]


def test_concurrent_registrations_of_one_name_create_one_worker() -> None:
    results = race(
        *(
            lambda i=i: worker_register(
                name="w", base_url=f"http://127.0.0.1:{8100 + i}", model="m", actor=OPS
            )
            for i in range(3)
        )
    )
    assert not any(isinstance(r, Exception) for r in results), results
    assert sorted(created for _, created in results) == [False, False, True]
    assert Worker.objects.count() == 1


def test_concurrent_registrations_differing_only_in_case_leave_one_worker() -> None:
    results = race(
        *(
            lambda name=name: worker_register(
                name=name, base_url="http://127.0.0.1:8100", model="m", actor=OPS
            )
            for name in ("gpu-a", "GPU-A", "Gpu-A")
        )
    )
    assert Worker.objects.count() == 1
    errors = [r for r in results if isinstance(r, Exception)]
    assert len(errors) == 2, results
    assert all(getattr(e, "field", None) == "name" for e in errors), errors
