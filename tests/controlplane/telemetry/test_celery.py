from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings

from controlplane.celery import app
from controlplane.telemetry import tasks
from controlplane.telemetry.models import FleetSample


def test_beat_schedule_names_registered_tasks() -> None:
    app.loader.import_default_modules()
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        assert entry["task"] in app.tasks, entry["task"]
        assert float(entry["schedule"]) > 0


@pytest.mark.django_db
def test_tasks_run_eagerly_without_redis(settings: Any) -> None:
    if not app.conf.task_always_eager:
        pytest.skip("REDIS_URL is set: tasks go to the broker, not run eagerly")
    settings.REDIS_URL = ""
    assert tasks.drain_request_stream.delay().get() == 0  # no source without Redis: no-op
    assert tasks.retention.delay().get() == 0
    assert tasks.experiment_results.delay().get() == 0
    # No workers registered: nothing scraped, nothing stored.
    assert tasks.scrape_fleet.delay().get() == 0
    assert FleetSample.objects.count() == 0


@pytest.mark.django_db
def test_run_embedded_jobs_once_runs_every_job() -> None:
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("run_embedded_jobs", "--once", stdout=out)
    assert out.getvalue().splitlines() == [
        "drain_request_stream: ok",
        "scrape_fleet: ok",
        "experiment_results: ok",
        "retention: ok",
    ]
