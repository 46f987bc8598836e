from __future__ import annotations

from django.urls import path

from controlplane.registry import apis

urlpatterns = [
    path("workers/", apis.WorkerListApi.as_view(), name="worker-list"),
    path("workers/<str:name>/", apis.WorkerDetailApi.as_view(), name="worker-detail"),
    path("workers/<str:name>/drain/", apis.WorkerDrainApi.as_view(), name="worker-drain"),
    path("workers/<str:name>/enable/", apis.WorkerEnableApi.as_view(), name="worker-enable"),
    path(
        "workers/<str:name>/heartbeat/", apis.WorkerHeartbeatApi.as_view(), name="worker-heartbeat"
    ),
    path("workers/<str:name>/probe/", apis.WorkerProbeApi.as_view(), name="worker-probe"),
    path("routing-snapshot/", apis.RoutingSnapshotApi.as_view(), name="routing-snapshot"),
]
