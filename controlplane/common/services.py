"""Writes for API tokens."""

from __future__ import annotations

import secrets

from django.db import IntegrityError, transaction

from controlplane.common.auth import TOKEN_PREFIX, token_hash
from controlplane.common.errors import ServiceError
from controlplane.common.models import ApiToken
from controlplane.common.validation import check_name


def api_token_create(
    *, name: str, scope: str, created_by: object | None = None
) -> tuple[ApiToken, str]:
    """Create a token; returns the row and the secret, which is not stored and never shown again."""
    check_name(name)
    if scope not in ApiToken.Scope.values:
        raise ServiceError(
            f"Unknown scope {scope!r}; choose one of {', '.join(ApiToken.Scope.values)}.",
            field="scope",
        )
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    try:
        with transaction.atomic():
            token = ApiToken.objects.create(
                name=name,
                scope=scope,
                token_hash=token_hash(secret),
                prefix=secret[:10],
                created_by=created_by,
            )
    except IntegrityError as exc:
        raise ServiceError(f"An API token named {name!r} already exists.", field="name") from exc
    return token, secret


def api_token_revoke(*, name: str) -> ApiToken:
    updated = ApiToken.objects.filter(name=name).update(revoked=True)
    if not updated:
        raise ServiceError(f"No API token named {name!r}.", field="name")
    return ApiToken.objects.get(name=name)
