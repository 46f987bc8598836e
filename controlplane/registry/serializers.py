"""Edges of the registry API: input checking and response shapes (services do the writing)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.registry.models import Worker
from controlplane.registry.selectors import worker_is_healthy


class WorkerRegisterSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    base_url = serializers.CharField(max_length=500, help_text="http(s) URL of the vLLM server")
    model = serializers.CharField(max_length=200)
    kv_events_endpoint = serializers.CharField(
        max_length=300, required=False, allow_blank=True, default="", help_text="tcp://host:port"
    )
    replay_endpoint = serializers.CharField(
        max_length=300, required=False, allow_blank=True, default="", help_text="tcp://host:port"
    )
    block_size = serializers.IntegerField(required=False, default=16)
    capacity_blocks = serializers.IntegerField(required=False, default=0)
    network_ms = serializers.FloatField(required=False, default=0.0)
    labels = serializers.DictField(
        child=serializers.CharField(allow_blank=True), required=False, default=dict
    )


class WorkerPatchSerializer(serializers.Serializer):
    base_url = serializers.CharField(max_length=500, required=False)
    model = serializers.CharField(max_length=200, required=False)
    kv_events_endpoint = serializers.CharField(max_length=300, required=False, allow_blank=True)
    replay_endpoint = serializers.CharField(max_length=300, required=False, allow_blank=True)
    block_size = serializers.IntegerField(required=False)
    capacity_blocks = serializers.IntegerField(required=False)
    network_ms = serializers.FloatField(required=False)
    labels = serializers.DictField(child=serializers.CharField(allow_blank=True), required=False)
    state = serializers.ChoiceField(choices=Worker.State.choices, required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        unknown = set(self.initial_data) - set(self.fields)
        if unknown:
            raise serializers.ValidationError(
                {key: ["Unknown or read-only field."] for key in sorted(unknown)}
            )
        return attrs


class HeartbeatSerializer(serializers.Serializer):
    running = serializers.IntegerField(required=False, default=0)
    waiting = serializers.IntegerField(required=False, default=0)
    kv_usage_frac = serializers.FloatField(required=False, default=0.0)
    inflight = serializers.IntegerField(required=False, default=0)
    block_size = serializers.IntegerField(required=False)
    capacity_blocks = serializers.IntegerField(required=False)


class ProbeSerializer(serializers.Serializer):
    ok = serializers.BooleanField()
    error = serializers.CharField(required=False, allow_blank=True, default="", max_length=300)


class WorkerListQuerySerializer(serializers.Serializer):
    model = serializers.CharField(required=False)
    state = serializers.ChoiceField(choices=Worker.State.choices, required=False)
    healthy = serializers.BooleanField(required=False, allow_null=True, default=None)


class WorkerLoadSerializer(serializers.Serializer):
    running = serializers.IntegerField()
    waiting = serializers.IntegerField()
    kv_usage_frac = serializers.FloatField()
    inflight = serializers.IntegerField()


class WorkerProbeStateSerializer(serializers.Serializer):
    last_probe_at = serializers.DateTimeField(allow_null=True)
    last_probe_ok_at = serializers.DateTimeField(allow_null=True)
    failures = serializers.IntegerField(source="probe_failures")
    error = serializers.CharField(source="last_probe_error")


class WorkerSerializer(serializers.ModelSerializer):
    healthy = serializers.SerializerMethodField()
    load = serializers.SerializerMethodField()
    probe = serializers.SerializerMethodField()

    class Meta:
        model = Worker
        fields = [
            "name",
            "base_url",
            "model",
            "kv_events_endpoint",
            "replay_endpoint",
            "block_size",
            "capacity_blocks",
            "network_ms",
            "labels",
            "state",
            "healthy",
            "last_heartbeat_at",
            "load",
            "probe",
            "registered_by",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.BooleanField())
    def get_healthy(self, worker: Worker) -> bool:
        annotated = getattr(worker, "healthy", None)
        return bool(annotated) if annotated is not None else worker_is_healthy(worker=worker)

    @extend_schema_field(WorkerLoadSerializer)
    def get_load(self, worker: Worker) -> dict[str, Any]:
        return WorkerLoadSerializer(worker).data

    @extend_schema_field(WorkerProbeStateSerializer)
    def get_probe(self, worker: Worker) -> dict[str, Any]:
        return WorkerProbeStateSerializer(worker).data
