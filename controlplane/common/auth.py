"""Who is calling: bearer API tokens (operator / worker / read) and staff sessions.

`Authorization: Bearer <token>` authenticates a token; a logged-in Django session
(the dashboard, the browsable API) counts as operator for staff and read otherwise,
with CSRF enforced by DRF's SessionAuthentication. Reads need no credentials only
when `settings.KVROUTE_OPEN_READS` is on (a trusted network).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request

from controlplane.common.models import ApiToken

TOKEN_PREFIX = "kvr_"
# last_used_at is bookkeeping, not an audit log: refresh it at most this often.
LAST_USED_RESOLUTION = timedelta(seconds=60)

OPERATOR = "operator"
WORKER = "worker"
READ = "read"


def token_hash(secret: str) -> str:
    # Tokens are 256-bit random secrets, so a plain SHA-256 is enough (no password stretching).
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class Actor:
    """The caller of a service: recorded as `label` in history rows."""

    label: str
    scope: str
    token_id: int | None = None

    @property
    def is_operator(self) -> bool:
        return self.scope == OPERATOR


SYSTEM = Actor(label="system", scope=OPERATOR)


class TokenUser:
    """What `request.user` is for a token-authenticated request."""

    is_authenticated = True
    is_active = True
    is_staff = False
    is_anonymous = False

    def __init__(self, token: ApiToken) -> None:
        self.token = token
        self.username = f"token:{token.name}"

    def __str__(self) -> str:
        return self.username


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "bearer"

    def authenticate(self, request: Request) -> tuple[TokenUser, ApiToken] | None:
        parts = authentication.get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword.encode():
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed(
                "Malformed Authorization header: expected 'Bearer <token>'."
            )
        try:
            secret = parts[1].decode("ascii")
        except UnicodeDecodeError as exc:
            raise exceptions.AuthenticationFailed("Malformed API token.") from exc
        token = ApiToken.objects.filter(token_hash=token_hash(secret)).first()
        if token is None or token.revoked:
            raise exceptions.AuthenticationFailed("Invalid or revoked API token.")
        now = timezone.now()
        if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
            token.last_used_at = now
        return TokenUser(token), token

    def authenticate_header(self, request: Request) -> str:
        # Makes DRF answer 401 (not 403) when credentials are missing or wrong.
        return 'Bearer realm="kvroute"'


def actor_from_request(request: Request) -> Actor | None:
    """The authenticated caller, or None for an anonymous request."""
    if isinstance(request.auth, ApiToken):
        token = request.auth
        return Actor(label=f"token:{token.name}", scope=token.scope, token_id=token.pk)
    user: Any = request.user
    if user is not None and getattr(user, "is_authenticated", False):
        scope = OPERATOR if user.is_staff else READ
        return Actor(label=f"user:{user.get_username()}", scope=scope)
    return None


class ScopePermission(permissions.BasePermission):
    """Reads: any token or session (or nobody, with KVROUTE_OPEN_READS).
    Writes: the scopes in the view's `write_scopes` (a tuple, or a dict by HTTP method;
    operator only by default)."""

    message = "This API token's scope does not allow this action."

    def has_permission(self, request: Request, view: Any) -> bool:
        actor = actor_from_request(request)
        if request.method in permissions.SAFE_METHODS:
            return actor is not None or bool(settings.KVROUTE_OPEN_READS)
        if actor is None:
            return False
        scopes = getattr(view, "write_scopes", (OPERATOR,))
        if isinstance(scopes, dict):
            scopes = scopes.get(request.method, (OPERATOR,))
        return actor.scope in scopes
