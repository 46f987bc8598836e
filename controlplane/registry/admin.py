from __future__ import annotations

from django.contrib import admin

from controlplane.registry.models import Worker
from controlplane.snapshot import config_changed


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    list_display = ("name", "model", "base_url", "state", "last_heartbeat_at", "probe_failures")
    list_filter = ("model", "state")
    search_fields = ("name", "base_url", "model")
    readonly_fields = (
        "last_heartbeat_at",
        "running",
        "waiting",
        "kv_usage_frac",
        "inflight",
        "last_probe_at",
        "last_probe_ok_at",
        "probe_failures",
        "last_probe_error",
        "registered_by",
        "owner_token",
        "created_at",
        "updated_at",
    )

    # Admin edits bypass the services, so they announce the change themselves.
    def save_model(self, request: object, obj: Worker, form: object, change: bool) -> None:
        super().save_model(request, obj, form, change)
        config_changed()

    def delete_model(self, request: object, obj: Worker) -> None:
        super().delete_model(request, obj)
        config_changed()
