from __future__ import annotations

from typing import Any

from django.contrib import admin

from controlplane.policies.models import (
    Activation,
    ActiveVersion,
    Experiment,
    ExperimentArm,
    Policy,
    PolicyVersion,
)
from controlplane.snapshot import config_changed


class ReadOnlyAdmin(admin.ModelAdmin):
    """History and immutable rows: viewable, never edited here (the API services write them)."""

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False


class PolicyVersionInline(admin.TabularInline):
    model = PolicyVersion
    fields = ("number", "type", "params", "author", "note", "created_at")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(Policy)
class PolicyAdmin(admin.ModelAdmin):
    list_display = ("name", "model", "created_by", "created_at")
    list_filter = ("model",)
    search_fields = ("name", "model")
    readonly_fields = ("created_by", "created_at")
    inlines = [PolicyVersionInline]


@admin.register(PolicyVersion)
class PolicyVersionAdmin(ReadOnlyAdmin):
    list_display = ("policy", "number", "type", "author", "created_at")
    list_filter = ("type", "policy__model")
    search_fields = ("policy__name", "note")


@admin.register(Activation)
class ActivationAdmin(ReadOnlyAdmin):
    list_display = ("model", "kind", "version", "previous_version", "actor", "created_at")
    list_filter = ("model", "kind")


@admin.register(ActiveVersion)
class ActiveVersionAdmin(ReadOnlyAdmin):
    list_display = ("model", "version", "updated_at")


class ExperimentArmInline(admin.TabularInline):
    # Arms are validated together (shares sum to 100, versions of the experiment's model)
    # by experiment_create; the admin shows them only.
    model = ExperimentArm
    fields = ("name", "version", "share")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(Experiment)
class ExperimentAdmin(admin.ModelAdmin):
    list_display = ("name", "model", "status", "sticky_key", "started_at", "stopped_at")
    list_filter = ("model", "status")
    search_fields = ("name",)
    readonly_fields = ("created_by", "created_at", "started_at", "stopped_at")
    inlines = [ExperimentArmInline]

    # Admin edits bypass the services, so they announce the change themselves.
    def save_model(self, request: Any, obj: Experiment, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        config_changed()

    def delete_model(self, request: Any, obj: Experiment) -> None:
        super().delete_model(request, obj)
        config_changed()
