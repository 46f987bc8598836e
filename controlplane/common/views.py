"""Site-wide error pages (400, 404, 500) that speak each surface's language: JSON for the control-plane
API (`/api/`), OpenAI-shaped errors under `/v1/` (paths the gateway does not serve fall
through to Django), Django's HTML pages everywhere else."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults


def _openai_error(message: str, *, status: int, type: str, code: str) -> JsonResponse:
    body = {"error": {"message": message, "type": type, "param": None, "code": code}}
    return JsonResponse(body, status=status)


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    # Django's own refusals (too many fields, a body over its limit) reach here, not DRF.
    message = str(exception) or "Bad request."
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": message}, status=400)
    if request.path.startswith("/v1/"):
        return _openai_error(message, status=400, type="invalid_request_error", code="bad_request")
    return defaults.bad_request(request, exception)


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": f"No API route for {request.path!r}."}, status=404)
    if request.path.startswith("/v1/"):
        return _openai_error(
            f"No route for {request.path}",
            status=404,
            type="invalid_request_error",
            code="not_found",
        )
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Internal server error."}, status=500)
    if request.path.startswith("/v1/"):
        return _openai_error(
            "Internal server error.", status=500, type="internal_error", code="internal_error"
        )
    return defaults.server_error(request)
