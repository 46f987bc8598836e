"""Reads of policies, activations and experiments, as plain data where others consume them."""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from typing import Any

from django.db.models import QuerySet

from controlplane.policies.models import (
    Activation,
    ActiveVersion,
    Experiment,
    Policy,
    PolicyVersion,
)

# Extension point filled by the telemetry app: `experiment_results(*, experiment) -> JSON-able`.
RESULTS_HOOK_MODULE = "controlplane.telemetry.selectors"
RESULTS_HOOK_NAME = "experiment_results"


@dataclass(frozen=True, slots=True)
class VersionInfo:
    version_id: int
    policy: str
    version: int
    type: str
    params: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "version_id": self.version_id,
            "version": self.version,
            "type": self.type,
            "params": dict(self.params),
        }


@dataclass(frozen=True, slots=True)
class ArmInfo:
    name: str
    share: int
    version: VersionInfo

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **self.version.to_dict(), "share": self.share}


@dataclass(frozen=True, slots=True)
class ExperimentInfo:
    id: int
    name: str
    model: str
    status: str
    sticky_key: str
    arms: tuple[ArmInfo, ...]
    shadow: VersionInfo | None

    def to_dict(self) -> dict[str, Any]:
        """The snapshot's `experiment` document (docs/contracts.md)."""
        return {
            "id": self.id,
            "name": self.name,
            "sticky_key": self.sticky_key,
            "arms": [a.to_dict() for a in self.arms],
            "shadow": self.shadow.to_dict() if self.shadow else None,
        }


def version_info(version: PolicyVersion) -> VersionInfo:
    return VersionInfo(
        version_id=version.pk,
        policy=version.policy.name,
        version=version.number,
        type=version.type,
        params=dict(version.params),
    )


def experiment_info(experiment: Experiment) -> ExperimentInfo:
    arms = tuple(
        ArmInfo(name=a.name, share=a.share, version=version_info(a.version))
        for a in experiment.arms.select_related("version__policy").order_by("name")
    )
    shadow = experiment.shadow_version
    return ExperimentInfo(
        id=experiment.pk,
        name=experiment.name,
        model=experiment.model,
        status=experiment.status,
        sticky_key=experiment.sticky_key,
        arms=arms,
        shadow=version_info(shadow) if shadow is not None else None,
    )


def policy_list(*, model: str | None = None) -> QuerySet[Policy]:
    qs = Policy.objects.all()
    if model:
        qs = qs.filter(model=model)
    return qs.order_by("model", "name")


def policy_get(*, name: str) -> Policy | None:
    return Policy.objects.filter(name=name).first()


def policy_versions(*, policy: Policy) -> QuerySet[PolicyVersion]:
    return policy.versions.select_related("policy").order_by("number")


def active_version(*, model: str) -> PolicyVersion | None:
    row = ActiveVersion.objects.select_related("version__policy").filter(model=model).first()
    return row.version if row is not None else None


def active_versions() -> dict[str, VersionInfo]:
    """model -> the active version of its default route (models with none are omitted)."""
    rows = ActiveVersion.objects.select_related("version__policy").filter(version__isnull=False)
    return {row.model: version_info(row.version) for row in rows if row.version is not None}


def activation_history(*, model: str, limit: int = 50) -> QuerySet[Activation]:
    return (
        Activation.objects.filter(model=model)
        .select_related("version__policy", "previous_version__policy")
        .order_by("-created_at", "-id")[:limit]
    )


def experiment_list(*, model: str | None = None, status: str | None = None) -> QuerySet[Experiment]:
    qs = Experiment.objects.select_related("shadow_version__policy").prefetch_related(
        "arms__version__policy"
    )
    if model:
        qs = qs.filter(model=model)
    if status:
        qs = qs.filter(status=status)
    return qs.order_by("-created_at", "-id")


def experiment_get(*, name: str) -> Experiment | None:
    return experiment_list().filter(name=name).first()


def experiments_running() -> dict[str, ExperimentInfo]:
    """model -> its running experiment (at most one per model, by constraint)."""
    running = experiment_list(status=Experiment.Status.RUNNING)
    return {e.model: experiment_info(e) for e in running}


def experiment_arms(*, experiment: Experiment) -> list[ArmInfo]:
    return list(experiment_info(experiment).arms)


def experiment_results(*, experiment: Experiment) -> dict[str, Any]:
    """The arms, plus whatever the telemetry app's results hook reports (None until it exists)."""
    info = experiment_info(experiment)
    results: Any = None
    if importlib.util.find_spec(RESULTS_HOOK_MODULE) is not None:
        hook = getattr(importlib.import_module(RESULTS_HOOK_MODULE), RESULTS_HOOK_NAME, None)
        if hook is not None:
            results = hook(experiment=experiment)
    return {
        "experiment": info.name,
        "model": info.model,
        "status": info.status,
        "started_at": experiment.started_at,
        "stopped_at": experiment.stopped_at,
        "arms": [a.to_dict() for a in info.arms],
        "shadow": info.shadow.to_dict() if info.shadow else None,
        "results": results,
    }
