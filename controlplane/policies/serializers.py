"""Edges of the policies API: input checking and response shapes (services do the writing)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.policies.models import Activation, Experiment, Policy, PolicyVersion
from controlplane.policies.selectors import active_version


class PolicyCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    model = serializers.CharField(max_length=200)
    type = serializers.CharField(
        max_length=64, help_text="a policy type from GET /api/policy-types/"
    )
    params = serializers.DictField(required=False, default=dict)
    description = serializers.CharField(required=False, allow_blank=True, default="")
    note = serializers.CharField(
        required=False, allow_blank=True, default="", help_text="note on version 1"
    )


class VersionCreateSerializer(serializers.Serializer):
    type = serializers.CharField(
        max_length=64, required=False, help_text="defaults to the last version's"
    )
    params = serializers.DictField(required=False, default=dict)
    note = serializers.CharField(required=False, allow_blank=True, default="")


class ValidateSerializer(serializers.Serializer):
    type = serializers.CharField(max_length=64)
    params = serializers.DictField(required=False, default=dict)


class ValidatedSerializer(serializers.Serializer):
    type = serializers.CharField()
    params = serializers.DictField(help_text="the params with defaults filled in")


class ActivateSerializer(serializers.Serializer):
    version = serializers.IntegerField(min_value=1, help_text="version number within the policy")
    model = serializers.CharField(
        max_length=200, required=False, help_text="optional guard: must be the policy's model"
    )
    note = serializers.CharField(required=False, allow_blank=True, default="")


class RollbackSerializer(serializers.Serializer):
    note = serializers.CharField(required=False, allow_blank=True, default="")


class PolicyVersionSerializer(serializers.ModelSerializer):
    policy = serializers.CharField(source="policy.name")
    version = serializers.IntegerField(source="number")
    version_id = serializers.IntegerField(source="pk")

    class Meta:
        model = PolicyVersion
        fields = [
            "version_id",
            "policy",
            "version",
            "type",
            "params",
            "author",
            "note",
            "created_at",
        ]
        read_only_fields = fields


class PolicySerializer(serializers.ModelSerializer):
    versions = serializers.SerializerMethodField()
    active_version = serializers.SerializerMethodField(
        help_text="number of this policy's version active for its model, or null"
    )

    class Meta:
        model = Policy
        fields = [
            "name",
            "model",
            "description",
            "created_by",
            "created_at",
            "active_version",
            "versions",
        ]
        read_only_fields = fields

    @extend_schema_field(PolicyVersionSerializer(many=True))
    def get_versions(self, policy: Policy) -> list[dict[str, Any]]:
        versions = policy.versions.select_related("policy").order_by("number")
        return PolicyVersionSerializer(versions, many=True).data

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_active_version(self, policy: Policy) -> int | None:
        active = active_version(model=policy.model)
        return active.number if active is not None and active.policy_id == policy.pk else None


class ActivationSerializer(serializers.ModelSerializer):
    to = PolicyVersionSerializer(source="version")
    previous = PolicyVersionSerializer(source="previous_version", allow_null=True)

    class Meta:
        model = Activation
        fields = ["id", "model", "kind", "to", "previous", "actor", "note", "created_at"]
        read_only_fields = fields


class ModelRouteSerializer(serializers.Serializer):
    model = serializers.CharField()
    active = PolicyVersionSerializer(allow_null=True)
    running_experiment = serializers.CharField(allow_null=True)
    history = ActivationSerializer(many=True, required=False)


class ArmInputSerializer(serializers.Serializer):
    name = serializers.CharField(
        max_length=32, required=False, help_text="defaults to A, B, C, ..."
    )
    share = serializers.IntegerField(min_value=1, max_value=100, help_text="percent of traffic")
    version_id = serializers.IntegerField(required=False)
    policy = serializers.CharField(
        required=False, help_text="with `version`, instead of version_id"
    )
    version = serializers.IntegerField(required=False, min_value=1)


class ExperimentCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    model = serializers.CharField(max_length=200)
    arms = ArmInputSerializer(many=True)
    sticky_key = serializers.ChoiceField(choices=Experiment.StickyKey.choices, default="session")
    shadow_version_id = serializers.IntegerField(required=False, allow_null=True, default=None)
    description = serializers.CharField(required=False, allow_blank=True, default="")


class ArmSerializer(serializers.Serializer):
    name = serializers.CharField()
    share = serializers.IntegerField()
    version_id = serializers.IntegerField(source="version.version_id")
    policy = serializers.CharField(source="version.policy")
    version = serializers.IntegerField(source="version.version")
    type = serializers.CharField(source="version.type")
    params = serializers.DictField(source="version.params")


class ExperimentSerializer(serializers.ModelSerializer):
    arms = serializers.SerializerMethodField()
    shadow = PolicyVersionSerializer(source="shadow_version", allow_null=True)

    class Meta:
        model = Experiment
        fields = [
            "id",
            "name",
            "model",
            "description",
            "status",
            "sticky_key",
            "arms",
            "shadow",
            "created_by",
            "created_at",
            "started_at",
            "stopped_at",
        ]
        read_only_fields = fields

    @extend_schema_field(ArmSerializer(many=True))
    def get_arms(self, experiment: Experiment) -> list[dict[str, Any]]:
        from controlplane.policies.selectors import experiment_arms

        return ArmSerializer(experiment_arms(experiment=experiment), many=True).data


class ExperimentResultsSerializer(serializers.Serializer):
    experiment = serializers.CharField()
    model = serializers.CharField()
    status = serializers.CharField()
    started_at = serializers.DateTimeField(allow_null=True)
    stopped_at = serializers.DateTimeField(allow_null=True)
    arms = serializers.ListField(child=serializers.DictField())
    shadow = serializers.DictField(allow_null=True)
    results = serializers.JSONField(
        allow_null=True, help_text="per-arm metrics from the telemetry app; null until it reports"
    )
