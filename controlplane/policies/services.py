"""Writes for policies, versions, activations and experiments. All atomic; each change
that alters what gateways route publishes a config notice after commit."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from controlplane.common.auth import Actor
from controlplane.common.errors import Conflict, NotFound, ServiceError
from controlplane.common.validation import check_model, check_name, check_name_case_unique
from controlplane.policies.models import (
    Activation,
    ActiveVersion,
    Experiment,
    ExperimentArm,
    Policy,
    PolicyVersion,
)
from controlplane.snapshot import config_changed
from routing.core.errors import InvalidPolicyParams, UnknownPolicy
from routing.core.registry import validate_params

ARM_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
MAX_ARMS = 10
MAX_NOTE_CHARS = 2000


def policy_params_clean(*, type: str, params: Any) -> dict[str, Any]:
    """routing.core's validation, with its errors named after our fields (`type`, `params.<key>`)."""
    if not isinstance(type, str) or not type:
        raise ServiceError("A policy type is required.", field="type")
    if params is None:
        params = {}
    if not isinstance(params, Mapping):
        raise ServiceError("Params are a JSON object.", field="params")
    try:
        return dict(validate_params(type, dict(params)))
    except UnknownPolicy as exc:
        raise ServiceError(str(exc), field="type") from exc
    except InvalidPolicyParams as exc:
        raise ServiceError(
            str(exc), field=f"params.{exc.field}" if exc.field else "params"
        ) from exc


def _check_note(note: Any, *, field: str = "note") -> str:
    if note is None:
        return ""
    if not isinstance(note, str) or len(note) > MAX_NOTE_CHARS:
        raise ServiceError(f"A note is text of at most {MAX_NOTE_CHARS} characters.", field=field)
    return note


def _policy_locked(*, name: str) -> Policy:
    policy = Policy.objects.select_for_update().filter(name=name).first()
    if policy is None:
        raise NotFound(f"No policy named {name!r}.")
    return policy


def policy_create(
    *,
    name: str,
    model: str,
    type: str,
    params: Mapping[str, Any] | None,
    actor: Actor,
    description: str = "",
    note: str = "",
) -> tuple[Policy, PolicyVersion]:
    """A new policy with its version 1."""
    check_name(name)
    check_model(model)
    description = _check_note(description, field="description")
    note = _check_note(note)
    clean = policy_params_clean(type=type, params=params)
    check_name_case_unique(Policy.objects, name, kind="Policy")
    try:
        with transaction.atomic():
            policy = Policy.objects.create(
                name=name, model=model, description=description, created_by=actor.label
            )
            version = PolicyVersion.objects.create(
                policy=policy, number=1, type=type, params=clean, author=actor.label, note=note
            )
    except IntegrityError as exc:
        raise ServiceError(f"A policy named {name!r} already exists.", field="name") from exc
    return policy, version


def policy_version_add(
    *,
    policy_name: str,
    params: Mapping[str, Any] | None,
    actor: Actor,
    type: str | None = None,
    note: str = "",
) -> PolicyVersion:
    """Append an immutable version (number = last + 1); the type defaults to the last version's."""
    note = _check_note(note)
    with transaction.atomic():
        # The policy row lock serialises concurrent additions, so numbers never collide.
        policy = _policy_locked(name=policy_name)
        last = policy.versions.order_by("-number").first()
        version_type = type or (last.type if last else "")
        clean = policy_params_clean(type=version_type, params=params)
        number = (policy.versions.aggregate(n=Max("number"))["n"] or 0) + 1
        return PolicyVersion.objects.create(
            policy=policy,
            number=number,
            type=version_type,
            params=clean,
            author=actor.label,
            note=note,
        )


def _version_get(*, policy_name: str, number: Any) -> PolicyVersion:
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise ServiceError("A version number (1, 2, ...) is required.", field="version")
    policy = Policy.objects.filter(name=policy_name).first()
    if policy is None:
        raise NotFound(f"No policy named {policy_name!r}.")
    version = policy.versions.select_related("policy").filter(number=number).first()
    if version is None:
        raise ServiceError(f"Policy {policy_name!r} has no version {number}.", field="version")
    return version


def _version_by_id(*, version_id: Any, field: str) -> PolicyVersion:
    if isinstance(version_id, bool) or not isinstance(version_id, int):
        raise ServiceError("A policy version id is required.", field=field)
    version = PolicyVersion.objects.select_related("policy").filter(pk=version_id).first()
    if version is None:
        raise ServiceError(f"No policy version with id {version_id}.", field=field)
    return version


def _active_locked(*, model: str) -> ActiveVersion:
    """The model's ActiveVersion row, created empty if missing, locked until commit."""
    # get_or_create absorbs the race of two first activations (unique on model).
    ActiveVersion.objects.get_or_create(model=model)
    return ActiveVersion.objects.select_for_update().get(model=model)


def policy_activate(
    *,
    policy_name: str,
    version: int,
    actor: Actor,
    model: str | None = None,
    note: str = "",
) -> tuple[Activation, bool]:
    """Make a version the active policy of its model's default route; returns (activation, changed).

    `model`, when given, must be the policy's model. Activating the version that is
    already active changes nothing. Concurrent activations serialise on the model's
    ActiveVersion row, so exactly one version is active afterwards.
    """
    note = _check_note(note)
    target = _version_get(policy_name=policy_name, number=version)
    if model is not None and model != target.policy.model:
        raise ServiceError(
            f"Policy {policy_name!r} routes model {target.policy.model!r}, not {model!r}.",
            field="model",
        )
    model = target.policy.model
    with transaction.atomic():
        row = _active_locked(model=model)
        if row.version_id == target.pk and row.activation is not None:
            return row.activation, False
        activation = Activation.objects.create(
            model=model,
            kind=Activation.Kind.ACTIVATE,
            version=target,
            previous_version_id=row.version_id,
            previous_activation=row.activation,
            actor=actor.label,
            note=note,
        )
        row.version = target
        row.activation = activation
        row.save()
        config_changed()
    return activation, True


def policy_rollback(*, model: str, actor: Actor, note: str = "") -> Activation:
    """Undo the model's last activation: re-activate the version active before it.

    Rolling back again goes one more step back (it never re-activates what was just undone).
    """
    note = _check_note(note)
    with transaction.atomic():
        row = ActiveVersion.objects.select_for_update().filter(model=model).first()
        if row is None or row.activation is None:
            raise NotFound(f"Model {model!r} has no active policy.")
        target = row.activation.previous_activation
        if target is None:
            raise Conflict(
                f"Nothing to roll back to: {row.version} is the first activation for {model!r}."
            )
        activation = Activation.objects.create(
            model=model,
            kind=Activation.Kind.ROLLBACK,
            version=target.version,
            previous_version_id=row.version_id,
            previous_activation=target.previous_activation,
            actor=actor.label,
            note=note,
        )
        row.version = target.version
        row.activation = activation
        row.save()
        config_changed()
    return activation


def _clean_arms(*, arms: Any, model: str) -> list[tuple[str, PolicyVersion, int]]:
    if not isinstance(arms, Sequence) or isinstance(arms, str | bytes):
        raise ServiceError("Arms are a list.", field="arms")
    if not 2 <= len(arms) <= MAX_ARMS:
        raise ServiceError(f"An experiment has 2 to {MAX_ARMS} arms.", field="arms")
    clean: list[tuple[str, PolicyVersion, int]] = []
    seen: set[str] = set()
    for i, arm in enumerate(arms):
        where = f"arms[{i}]"
        if not isinstance(arm, Mapping):
            raise ServiceError("Each arm is an object.", field=where)
        name = arm.get("name") or chr(ord("A") + i)
        if not isinstance(name, str) or not ARM_NAME_RE.match(name):
            raise ServiceError(
                "Arm names are 1-32 letters, digits, '_' or '-'.", field=f"{where}.name"
            )
        if name in seen:
            raise ServiceError(f"Arm name {name!r} is used twice.", field=f"{where}.name")
        seen.add(name)
        share = arm.get("share")
        if isinstance(share, bool) or not isinstance(share, int) or not 1 <= share <= 100:
            raise ServiceError("A share is a whole percent from 1 to 100.", field=f"{where}.share")
        if arm.get("version_id") is not None:
            ref_field = f"{where}.version_id"
            version = _version_by_id(version_id=arm["version_id"], field=ref_field)
        else:
            ref_field = f"{where}.policy"
            policy_name = arm.get("policy")
            if not isinstance(policy_name, str) or not policy_name:
                raise ServiceError(
                    "Give either version_id, or policy and version.", field=f"{where}.policy"
                )
            try:
                version = _version_get(policy_name=policy_name, number=arm.get("version"))
            except NotFound as exc:
                raise ServiceError(exc.message, field=f"{where}.policy") from exc
            except ServiceError as exc:
                raise ServiceError(exc.message, field=f"{where}.version") from exc
        if version.policy.model != model:
            raise ServiceError(
                f"{version} belongs to a policy for model {version.policy.model!r}, "
                f"not this experiment's {model!r}.",
                field=ref_field,
            )
        clean.append((name, version, share))
    total = sum(share for _, _, share in clean)
    if total != 100:
        raise ServiceError(f"Arm shares must sum to 100, not {total}.", field="arms")
    return clean


def experiment_create(
    *,
    name: str,
    model: str,
    arms: Sequence[Mapping[str, Any]],
    actor: Actor,
    sticky_key: str = "session",
    shadow_version_id: int | None = None,
    description: str = "",
) -> Experiment:
    """A draft experiment. Arms: `{"name"?, "share", "version_id"}` or `{"policy", "version"}`."""
    check_name(name)
    check_model(model)
    description = _check_note(description, field="description")
    if sticky_key not in Experiment.StickyKey.values:
        raise ServiceError(
            f"Sticky key must be one of {', '.join(Experiment.StickyKey.values)}.",
            field="sticky_key",
        )
    clean = _clean_arms(arms=arms, model=model)
    check_name_case_unique(Experiment.objects, name, kind="Experiment")
    shadow = None
    if shadow_version_id is not None:
        shadow = _version_by_id(version_id=shadow_version_id, field="shadow_version_id")
        if shadow.policy.model != model:
            raise ServiceError(
                f"{shadow} belongs to a policy for model {shadow.policy.model!r}, not {model!r}.",
                field="shadow_version_id",
            )
    try:
        with transaction.atomic():
            experiment = Experiment.objects.create(
                name=name,
                model=model,
                description=description,
                sticky_key=sticky_key,
                shadow_version=shadow,
                created_by=actor.label,
            )
            ExperimentArm.objects.bulk_create(
                ExperimentArm(experiment=experiment, name=arm_name, version=version, share=share)
                for arm_name, version, share in clean
            )
    except IntegrityError as exc:
        raise ServiceError(f"An experiment named {name!r} already exists.", field="name") from exc
    return experiment


def _experiment_locked(*, name: str) -> Experiment:
    experiment = Experiment.objects.select_for_update().filter(name=name).first()
    if experiment is None:
        raise NotFound(f"No experiment named {name!r}.")
    return experiment


def experiment_start(*, name: str, actor: Actor) -> Experiment:
    """Draft -> running. At most one experiment runs per model (checked, and a DB constraint)."""
    try:
        with transaction.atomic():
            experiment = _experiment_locked(name=name)
            if experiment.status != Experiment.Status.DRAFT:
                raise Conflict(
                    f"Experiment {name!r} is {experiment.status}; only a draft can start "
                    "(create a new experiment to run it again)."
                )
            other = (
                Experiment.objects.filter(model=experiment.model, status=Experiment.Status.RUNNING)
                .exclude(pk=experiment.pk)
                .first()
            )
            if other is not None:
                raise Conflict(
                    f"Experiment {other.name!r} is already running for model "
                    f"{experiment.model!r}; stop it first."
                )
            experiment.status = Experiment.Status.RUNNING
            experiment.started_at = timezone.now()
            experiment.save(update_fields=["status", "started_at"])
            config_changed()
    except IntegrityError as exc:
        raise Conflict(
            f"Another experiment started for model {experiment.model!r} at the same time; stop it first."
        ) from exc
    return experiment


def experiment_stop(*, name: str, actor: Actor) -> Experiment:
    with transaction.atomic():
        experiment = _experiment_locked(name=name)
        if experiment.status != Experiment.Status.RUNNING:
            raise Conflict(f"Experiment {name!r} is {experiment.status}, not running.")
        experiment.status = Experiment.Status.STOPPED
        experiment.stopped_at = timezone.now()
        experiment.save(update_fields=["status", "stopped_at"])
        config_changed()
    return experiment


def experiment_delete(*, name: str, actor: Actor) -> None:
    """Delete a draft (running or stopped experiments are kept for their results)."""
    with transaction.atomic():
        experiment = _experiment_locked(name=name)
        if experiment.status != Experiment.Status.DRAFT:
            raise Conflict(
                f"Experiment {name!r} is {experiment.status}; only drafts can be deleted."
            )
        experiment.delete()
