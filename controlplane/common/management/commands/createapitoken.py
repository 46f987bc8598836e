"""`manage.py createapitoken --name X --scope operator|worker|read`: prints the secret once."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from controlplane.common.errors import ServiceError
from controlplane.common.models import ApiToken
from controlplane.common.services import api_token_create


class Command(BaseCommand):
    help = "Create an API token and print its secret (only a hash is stored)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--name", required=True)
        parser.add_argument("--scope", required=True, choices=ApiToken.Scope.values)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            _, secret = api_token_create(name=options["name"], scope=options["scope"])
        except ServiceError as exc:
            raise CommandError(f"{exc.field}: {exc.message}") from exc
        self.stdout.write(secret)
