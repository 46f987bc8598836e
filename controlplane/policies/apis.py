"""Policies, activation per model, and experiments. Thin: parse, call a service or selector, render."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    inline_serializer,
)
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.common.api import ApiView
from controlplane.common.auth import OPERATOR, READ, WORKER
from controlplane.common.errors import NotFound, ServiceError
from controlplane.policies import selectors, services
from controlplane.policies.models import Experiment, Policy
from controlplane.policies.serializers import (
    ActivateSerializer,
    ActivationSerializer,
    ExperimentCreateSerializer,
    ExperimentResultsSerializer,
    ExperimentSerializer,
    ModelRouteSerializer,
    PolicyCreateSerializer,
    PolicySerializer,
    PolicyVersionSerializer,
    RollbackSerializer,
    ValidatedSerializer,
    ValidateSerializer,
    VersionCreateSerializer,
)
from controlplane.registry.selectors import worker_models
from routing.core.registry import POLICIES, params_schema

ERRORS = {
    400: OpenApiResponse(description="invalid input: `{field: [message]}`"),
    401: OpenApiResponse(description="no or invalid token"),
    403: OpenApiResponse(description="the token's scope does not allow this"),
}
NOT_FOUND = {404: OpenApiResponse(description="not found")}
CONFLICT = {409: OpenApiResponse(description="conflicts with the current state")}
MODEL_FILTER = OpenApiParameter("model", str, description="only this model")


def _policy(name: str) -> Policy:
    policy = selectors.policy_get(name=name)
    if policy is None:
        raise NotFound(f"No policy named {name!r}.")
    return policy


def _experiment(name: str) -> Experiment:
    experiment = selectors.experiment_get(name=name)
    if experiment is None:
        raise NotFound(f"No experiment named {name!r}.")
    return experiment


class PolicyTypeListApi(ApiView):
    @extend_schema(
        tags=["policies"],
        responses={
            200: inline_serializer(
                "PolicyType",
                {
                    "type": serializers.CharField(),
                    "description": serializers.CharField(),
                    "params": serializers.DictField(help_text="JSON-able schema of the params"),
                },
                many=True,
            ),
            **ERRORS,
        },
    )
    def get(self, request: Request) -> Response:
        return Response(
            [
                {"type": name, "description": spec.description, "params": params_schema(name)}
                for name, spec in sorted(POLICIES.items())
            ]
        )


class PolicyListApi(ApiView):
    @extend_schema(
        tags=["policies"],
        parameters=[MODEL_FILTER],
        responses={200: PolicySerializer(many=True), **ERRORS},
    )
    def get(self, request: Request) -> Response:
        policies = selectors.policy_list(model=request.query_params.get("model") or None)
        return Response(PolicySerializer(policies, many=True).data)

    @extend_schema(
        tags=["policies"],
        request=PolicyCreateSerializer,
        responses={201: PolicySerializer, **ERRORS},
        description="Create a policy with its first version.",
    )
    def post(self, request: Request) -> Response:
        body = PolicyCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        policy, _ = services.policy_create(actor=self.actor(), **body.validated_data)
        return Response(PolicySerializer(policy).data, status=status.HTTP_201_CREATED)


class PolicyDetailApi(ApiView):
    @extend_schema(tags=["policies"], responses={200: PolicySerializer, **ERRORS, **NOT_FOUND})
    def get(self, request: Request, name: str) -> Response:
        return Response(PolicySerializer(_policy(name)).data)


class PolicyVersionListApi(ApiView):
    @extend_schema(
        tags=["policies"],
        responses={200: PolicyVersionSerializer(many=True), **ERRORS, **NOT_FOUND},
    )
    def get(self, request: Request, name: str) -> Response:
        versions = selectors.policy_versions(policy=_policy(name))
        return Response(PolicyVersionSerializer(versions, many=True).data)

    @extend_schema(
        tags=["policies"],
        request=VersionCreateSerializer,
        responses={201: PolicyVersionSerializer, **ERRORS, **NOT_FOUND},
        description="Add an immutable version; it is not activated.",
    )
    def post(self, request: Request, name: str) -> Response:
        body = VersionCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        version = services.policy_version_add(
            policy_name=name, actor=self.actor(), **body.validated_data
        )
        return Response(PolicyVersionSerializer(version).data, status=status.HTTP_201_CREATED)


class PolicyVersionDetailApi(ApiView):
    @extend_schema(
        tags=["policies"], responses={200: PolicyVersionSerializer, **ERRORS, **NOT_FOUND}
    )
    def get(self, request: Request, name: str, number: int) -> Response:
        version = selectors.policy_versions(policy=_policy(name)).filter(number=number).first()
        if version is None:
            raise NotFound(f"Policy {name!r} has no version {number}.")
        return Response(PolicyVersionSerializer(version).data)


class PolicyActivateApi(ApiView):
    @extend_schema(
        tags=["policies"],
        request=ActivateSerializer,
        responses={200: ActivationSerializer, 201: ActivationSerializer, **ERRORS, **NOT_FOUND},
        description=(
            "Make a version the active policy of its model's default route (201; 200 when it "
            "already was)."
        ),
    )
    def post(self, request: Request, name: str) -> Response:
        body = ActivateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        activation, changed = services.policy_activate(
            policy_name=name, actor=self.actor(), **body.validated_data
        )
        return Response(
            ActivationSerializer(activation).data,
            status=status.HTTP_201_CREATED if changed else status.HTTP_200_OK,
        )


class PolicyValidateApi(ApiView):
    # A dry run writes nothing, so any token may call it.
    write_scopes = (OPERATOR, WORKER, READ)

    @extend_schema(
        tags=["policies"],
        request=ValidateSerializer,
        responses={200: ValidatedSerializer, **ERRORS},
        description="Dry run: the cleaned params (defaults filled in) or field errors.",
    )
    def post(self, request: Request) -> Response:
        body = ValidateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        clean = services.policy_params_clean(**body.validated_data)
        return Response({"type": body.validated_data["type"], "params": clean})


def _model_route(model: str, *, history: bool) -> dict[str, Any]:
    running = selectors.experiments_running().get(model)
    route: dict[str, Any] = {
        "model": model,
        "active": selectors.active_version(model=model),
        "running_experiment": running.name if running else None,
    }
    if history:
        route["history"] = selectors.activation_history(model=model)
    return route


class ModelListApi(ApiView):
    @extend_schema(
        tags=["models"],
        responses={200: ModelRouteSerializer(many=True), **ERRORS},
        description="Every model with workers, policies or experiments, and what routes it.",
    )
    def get(self, request: Request) -> Response:
        models = sorted(
            set(worker_models())
            | set(Policy.objects.values_list("model", flat=True))
            | set(Experiment.objects.values_list("model", flat=True))
        )
        routes = [_model_route(m, history=False) for m in models]
        return Response(ModelRouteSerializer(routes, many=True).data)


class ModelDetailApi(ApiView):
    @extend_schema(
        tags=["models"],
        # 404 only for a path no model name can take (model names have no whitespace).
        responses={200: ModelRouteSerializer, **ERRORS, **NOT_FOUND},
        description="The model's active version and its activation history, newest first.",
    )
    def get(self, request: Request, model: str) -> Response:
        return Response(ModelRouteSerializer(_model_route(model, history=True)).data)


class ModelRollbackApi(ApiView):
    @extend_schema(
        tags=["models"],
        request=RollbackSerializer,
        responses={201: ActivationSerializer, **ERRORS, **NOT_FOUND, **CONFLICT},
        description=(
            "Undo the model's last activation (re-activate the version before it). "
            "Rolling back again goes one more step back."
        ),
    )
    def post(self, request: Request, model: str) -> Response:
        body = RollbackSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        activation = services.policy_rollback(
            model=model, actor=self.actor(), **body.validated_data
        )
        return Response(ActivationSerializer(activation).data, status=status.HTTP_201_CREATED)


class ExperimentListApi(ApiView):
    @extend_schema(
        tags=["experiments"],
        parameters=[
            MODEL_FILTER,
            OpenApiParameter(
                "status", str, enum=Experiment.Status.values, description="only this status"
            ),
        ],
        responses={200: ExperimentSerializer(many=True), **ERRORS},
    )
    def get(self, request: Request) -> Response:
        status_filter = request.query_params.get("status") or None
        if status_filter is not None and status_filter not in Experiment.Status.values:
            raise ServiceError(
                f"Status must be one of {', '.join(Experiment.Status.values)}.", field="status"
            )
        experiments = selectors.experiment_list(
            model=request.query_params.get("model") or None, status=status_filter
        )
        return Response(ExperimentSerializer(experiments, many=True).data)

    @extend_schema(
        tags=["experiments"],
        request=ExperimentCreateSerializer,
        responses={201: ExperimentSerializer, **ERRORS},
        description="Create a draft experiment; arms' shares sum to 100.",
    )
    def post(self, request: Request) -> Response:
        body = ExperimentCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        experiment = services.experiment_create(actor=self.actor(), **body.validated_data)
        return Response(
            ExperimentSerializer(_experiment(experiment.name)).data, status=status.HTTP_201_CREATED
        )


class ExperimentDetailApi(ApiView):
    @extend_schema(
        tags=["experiments"], responses={200: ExperimentSerializer, **ERRORS, **NOT_FOUND}
    )
    def get(self, request: Request, name: str) -> Response:
        return Response(ExperimentSerializer(_experiment(name)).data)

    @extend_schema(tags=["experiments"], responses={204: None, **ERRORS, **NOT_FOUND, **CONFLICT})
    def delete(self, request: Request, name: str) -> Response:
        services.experiment_delete(name=name, actor=self.actor())
        return Response(status=status.HTTP_204_NO_CONTENT)


class ExperimentStartApi(ApiView):
    @extend_schema(
        tags=["experiments"],
        request=None,
        responses={200: ExperimentSerializer, **ERRORS, **NOT_FOUND, **CONFLICT},
    )
    def post(self, request: Request, name: str) -> Response:
        services.experiment_start(name=name, actor=self.actor())
        return Response(ExperimentSerializer(_experiment(name)).data)


class ExperimentStopApi(ApiView):
    @extend_schema(
        tags=["experiments"],
        request=None,
        responses={200: ExperimentSerializer, **ERRORS, **NOT_FOUND, **CONFLICT},
    )
    def post(self, request: Request, name: str) -> Response:
        services.experiment_stop(name=name, actor=self.actor())
        return Response(ExperimentSerializer(_experiment(name)).data)


class ExperimentResultsApi(ApiView):
    @extend_schema(
        tags=["experiments"], responses={200: ExperimentResultsSerializer, **ERRORS, **NOT_FOUND}
    )
    def get(self, request: Request, name: str) -> Response:
        return Response(selectors.experiment_results(experiment=_experiment(name)))
