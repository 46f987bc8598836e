"""URL map of the control plane: API, schema, admin and dashboard pages."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/", include("controlplane.api_urls")),
    path("", include("dashboard.urls")),
]

# JSON (API) and OpenAI-shaped (/v1/) bodies for 400, 404 and 500; HTML elsewhere.
handler400 = "controlplane.common.views.bad_request"
handler404 = "controlplane.common.views.not_found"
handler500 = "controlplane.common.views.server_error"
