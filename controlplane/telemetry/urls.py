"""Telemetry API routes (under /api/)."""

from __future__ import annotations

from django.urls import path

from controlplane.telemetry import apis

urlpatterns = [
    path("telemetry/overview/", apis.OverviewApi.as_view(), name="telemetry-overview"),
    path(
        "telemetry/workers/<str:worker_id>/series/",
        apis.WorkerSeriesApi.as_view(),
        name="telemetry-worker-series",
    ),
    path("telemetry/requests/", apis.RequestListApi.as_view(), name="telemetry-requests"),
    path(
        "telemetry/requests/<str:request_id>/",
        apis.RequestDetailApi.as_view(),
        name="telemetry-request",
    ),
    path(
        "telemetry/experiments/<int:experiment_id>/results/",
        apis.ExperimentResultsApi.as_view(),
        name="telemetry-experiment-results",
    ),
]
