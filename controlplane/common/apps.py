from __future__ import annotations

from django.apps import AppConfig


class CommonConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "controlplane.common"
    label = "common"
    verbose_name = "API access"

    def ready(self) -> None:
        # Registers the OpenAPI description of the bearer-token scheme with drf-spectacular.
        from controlplane.common import schema  # noqa: F401
