"""Worker registry API and the routing snapshot. Thin: parse, call a service or selector, render."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.common.api import ApiView
from controlplane.common.auth import OPERATOR, WORKER
from controlplane.common.errors import NotFound
from controlplane.registry import services
from controlplane.registry.selectors import worker_get, worker_list
from controlplane.registry.serializers import (
    HeartbeatSerializer,
    ProbeSerializer,
    WorkerListQuerySerializer,
    WorkerPatchSerializer,
    WorkerRegisterSerializer,
    WorkerSerializer,
)
from controlplane.snapshot import routing_snapshot

OPERATOR_OR_WORKER = (OPERATOR, WORKER)
ERRORS = {
    400: OpenApiResponse(description="invalid input: `{field: [message]}`"),
    401: OpenApiResponse(description="no or invalid token"),
    403: OpenApiResponse(description="the token's scope does not allow this"),
}
NOT_FOUND = {404: OpenApiResponse(description="no such worker")}


def _worker_response(name: str, *, status_code: int = status.HTTP_200_OK) -> Response:
    worker = worker_get(name=name)
    if worker is None:
        raise NotFound(f"No worker named {name!r}.")
    return Response(WorkerSerializer(worker).data, status=status_code)


class WorkerListApi(ApiView):
    write_scopes = OPERATOR_OR_WORKER

    @extend_schema(
        tags=["workers"],
        parameters=[WorkerListQuerySerializer],
        responses={200: WorkerSerializer(many=True), **ERRORS},
    )
    def get(self, request: Request) -> Response:
        query = WorkerListQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        workers = worker_list(**query.validated_data)
        return Response(WorkerSerializer(workers, many=True).data)

    @extend_schema(
        tags=["workers"],
        request=WorkerRegisterSerializer,
        responses={200: WorkerSerializer, 201: WorkerSerializer, **ERRORS},
        description="Register a worker, or update it if the name exists (200 instead of 201).",
    )
    def post(self, request: Request) -> Response:
        body = WorkerRegisterSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        worker, created = services.worker_register(actor=self.actor(), **body.validated_data)
        return _worker_response(
            worker.name, status_code=status.HTTP_201_CREATED if created else status.HTTP_200_OK
        )


class WorkerDetailApi(ApiView):
    write_scopes = {"PATCH": (OPERATOR,), "DELETE": OPERATOR_OR_WORKER}

    @extend_schema(tags=["workers"], responses={200: WorkerSerializer, **ERRORS, **NOT_FOUND})
    def get(self, request: Request, name: str) -> Response:
        return _worker_response(name)

    @extend_schema(
        tags=["workers"],
        request=WorkerPatchSerializer,
        responses={200: WorkerSerializer, **ERRORS, **NOT_FOUND},
    )
    def patch(self, request: Request, name: str) -> Response:
        body = WorkerPatchSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        services.worker_update(name=name, actor=self.actor(), **body.validated_data)
        return _worker_response(name)

    @extend_schema(tags=["workers"], responses={204: None, **ERRORS, **NOT_FOUND})
    def delete(self, request: Request, name: str) -> Response:
        services.worker_deregister(name=name, actor=self.actor())
        return Response(status=status.HTTP_204_NO_CONTENT)


class WorkerDrainApi(ApiView):
    write_scopes = OPERATOR_OR_WORKER

    @extend_schema(
        tags=["workers"], request=None, responses={200: WorkerSerializer, **ERRORS, **NOT_FOUND}
    )
    def post(self, request: Request, name: str) -> Response:
        services.worker_drain(name=name, actor=self.actor())
        return _worker_response(name)


class WorkerEnableApi(ApiView):
    @extend_schema(
        tags=["workers"], request=None, responses={200: WorkerSerializer, **ERRORS, **NOT_FOUND}
    )
    def post(self, request: Request, name: str) -> Response:
        services.worker_enable(name=name, actor=self.actor())
        return _worker_response(name)


class WorkerHeartbeatApi(ApiView):
    write_scopes = OPERATOR_OR_WORKER

    @extend_schema(
        tags=["workers"],
        request=HeartbeatSerializer,
        responses={200: WorkerSerializer, **ERRORS, **NOT_FOUND},
    )
    def post(self, request: Request, name: str) -> Response:
        body = HeartbeatSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        services.worker_heartbeat(name=name, actor=self.actor(), **body.validated_data)
        return _worker_response(name)


class WorkerProbeApi(ApiView):
    @extend_schema(
        tags=["workers"],
        request=ProbeSerializer,
        responses={200: WorkerSerializer, **ERRORS, **NOT_FOUND},
        description="A gateway reports whether it could reach the worker (operator token).",
    )
    def post(self, request: Request, name: str) -> Response:
        body = ProbeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        services.worker_probe_record(name=name, actor=self.actor(), **body.validated_data)
        return _worker_response(name)


class SnapshotWorkerSerializer(serializers.Serializer):
    id = serializers.CharField()
    url = serializers.CharField()
    model = serializers.CharField()
    state = serializers.CharField()
    healthy = serializers.BooleanField()
    block_size = serializers.IntegerField()
    capacity_blocks = serializers.IntegerField()
    network_ms = serializers.FloatField()
    kv_events_endpoint = serializers.CharField(allow_null=True)
    replay_endpoint = serializers.CharField(allow_null=True)
    labels = serializers.DictField(child=serializers.CharField())


class SnapshotSerializer(serializers.Serializer):
    revision = serializers.CharField(help_text="SHA-1 of the canonical workers + models document")
    generated_at = serializers.DateTimeField()
    workers = SnapshotWorkerSerializer(many=True)
    models = serializers.DictField(
        child=serializers.DictField(),
        help_text="model -> {active: version or null, experiment: running experiment or null}",
    )


class RoutingSnapshotApi(ApiView):
    @extend_schema(
        tags=["gateway"],
        responses={200: SnapshotSerializer, 304: None, **ERRORS},
        description=(
            "Everything a gateway routes on, in one document (docs/contracts.md). The ETag is "
            "the revision: send it as If-None-Match to get 304 when nothing changed."
        ),
    )
    def get(self, request: Request) -> Response:
        document: dict[str, Any] = routing_snapshot()
        etag = f'"{document["revision"]}"'
        if etag in {t.strip() for t in request.headers.get("If-None-Match", "").split(",")}:
            return Response(status=status.HTTP_304_NOT_MODIFIED, headers={"ETag": etag})
        return Response(document, headers={"ETag": etag})
