from __future__ import annotations

from django.apps import AppConfig


class RegistryConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "controlplane.registry"
    label = "registry"
