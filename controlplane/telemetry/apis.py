"""Read-only telemetry API: overview series, per-worker series, recorded requests and
experiment results. Thin: validate the query, call a selector, render."""

from __future__ import annotations

import time

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.common.api import ApiView
from controlplane.common.errors import NotFound
from controlplane.telemetry import selectors

ERRORS = {
    400: OpenApiResponse(description="invalid query: `{field: [message]}`"),
    401: OpenApiResponse(description="no or invalid token"),
}


class WindowQuery(serializers.Serializer):
    window_s = serializers.FloatField(
        required=False, default=3600.0, min_value=60.0, max_value=90 * 86400.0
    )


class RequestsQuery(serializers.Serializer):
    limit = serializers.IntegerField(required=False, default=100, min_value=1, max_value=1000)
    worker = serializers.CharField(required=False, max_length=200)
    model = serializers.CharField(required=False, max_length=200)
    status = serializers.ChoiceField(required=False, choices=["ok", "error", "client_disconnect"])
    experiment = serializers.IntegerField(required=False, min_value=1)


def _brief(record: dict) -> dict:
    # Lists leave out the block keys (hundreds of integers per request); detail has them.
    return {k: v for k, v in record.items() if k != "block_keys"}


class OverviewApi(ApiView):
    @extend_schema(
        tags=["telemetry"], parameters=[WindowQuery], responses={200: OpenApiTypes.OBJECT, **ERRORS}
    )
    def get(self, request: Request) -> Response:
        """Fleet-wide points (10 s buckets up to an hour, minutes beyond), per-worker load
        series and the eviction rate: what the overview page draws."""
        q = WindowQuery(data=request.query_params)
        q.is_valid(raise_exception=True)
        return Response(selectors.overview_snapshot(window_s=q.validated_data["window_s"]))


class WorkerSeriesApi(ApiView):
    @extend_schema(
        tags=["telemetry"], parameters=[WindowQuery], responses={200: OpenApiTypes.OBJECT, **ERRORS}
    )
    def get(self, request: Request, worker_id: str) -> Response:
        q = WindowQuery(data=request.query_params)
        q.is_valid(raise_exception=True)
        now_s = time.time()
        since_s = now_s - q.validated_data["window_s"]
        fleet = selectors.fleet_series(since_s=since_s, worker_id=worker_id)
        return Response(
            {
                "worker_id": worker_id,
                "points": selectors.worker_points(
                    worker_id=worker_id, since_s=since_s, now_s=now_s
                ),
                "fleet": fleet["workers"].get(worker_id, []),
            }
        )


class RequestListApi(ApiView):
    @extend_schema(
        operation_id="telemetry_requests_list",
        tags=["telemetry"],
        parameters=[RequestsQuery],
        responses={200: OpenApiTypes.OBJECT, **ERRORS},
    )
    def get(self, request: Request) -> Response:
        """Recently recorded (sampled) requests, newest first."""
        q = RequestsQuery(data=request.query_params)
        q.is_valid(raise_exception=True)
        d = q.validated_data
        rows = selectors.recent_requests(
            limit=d["limit"],
            worker_id=d.get("worker"),
            model=d.get("model"),
            status=d.get("status"),
            experiment_id=d.get("experiment"),
        )
        return Response({"results": [_brief(selectors.record_to_dict(r)) for r in rows]})


class RequestDetailApi(ApiView):
    @extend_schema(
        tags=["telemetry"],
        responses={200: OpenApiTypes.OBJECT, 404: OpenApiResponse(description="not recorded")},
    )
    def get(self, request: Request, request_id: str) -> Response:
        record = selectors.request_get(request_id=request_id)
        if record is None:
            raise NotFound(f"No recorded request {request_id!r} (it may not have been sampled).")
        return Response(selectors.record_to_dict(record))


class ExperimentResultsApi(ApiView):
    @extend_schema(
        tags=["telemetry"],
        responses={200: OpenApiTypes.OBJECT, 404: OpenApiResponse(description="no results yet")},
    )
    def get(self, request: Request, experiment_id: int) -> Response:
        """Per-arm statistics with bootstrap CIs, the comparisons and the verdict."""
        result = selectors.experiment_result_get(experiment_id=experiment_id)
        if result is None:
            raise NotFound(f"No results for experiment {experiment_id} yet.")
        return Response(result)
