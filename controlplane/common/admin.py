from __future__ import annotations

from django.contrib import admin

from controlplane.common.models import ApiToken


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    # Tokens are created by `manage.py createapitoken` (the secret is printed once); here they
    # can be inspected and revoked.
    list_display = ("name", "scope", "prefix", "created_at", "last_used_at", "revoked")
    list_filter = ("scope", "revoked")
    search_fields = ("name",)
    readonly_fields = ("name", "scope", "prefix", "created_by", "created_at", "last_used_at")
    fields = ("name", "scope", "prefix", "created_by", "created_at", "last_used_at", "revoked")

    def has_add_permission(self, request: object) -> bool:
        return False
