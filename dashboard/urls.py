"""Dashboard pages (login required) and the Django auth views at /login/ and /logout/."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path

from dashboard import views

app_name = "dashboard"

_urlpatterns = [
    path(
        "login/",
        auth_views.LoginView.as_view(template_name="dashboard/login.html"),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(next_page="/login/"), name="logout"),
    path("assets/plotly.min.js", views.plotly_js, name="plotly-js"),
    path("", views.overview, name="overview"),
    path("snapshot.json", views.snapshot, name="snapshot"),
    path("workers/", views.workers, name="workers"),
    path("workers/<str:name>/", views.worker_detail, name="worker"),
    path(
        "workers/<str:name>/<str:action>/",
        views.worker_action,
        name="worker-action",
    ),
    path("policies/", views.policies, name="policies"),
    path("policies/<str:name>/", views.policy_detail, name="policy"),
    path("policies/<str:name>/save/", views.policy_save, name="policy-save"),
    path("policies/<str:name>/activate/", views.policy_activate, name="policy-activate"),
    path("policies/<str:name>/rollback/", views.policy_rollback, name="policy-rollback"),
    path("policies/<str:name>/whatif/", views.policy_whatif, name="policy-whatif"),
    path("experiments/", views.experiments, name="experiments"),
    path("experiments/new/", views.experiment_create, name="experiment-create"),
    path("experiments/<str:name>/", views.experiment_detail, name="experiment"),
    path(
        "experiments/<str:name>/<str:action>/",
        views.experiment_action,
        name="experiment-action",
    ),
    path("requests/", views.requests_explorer, name="requests"),
    path("requests/<str:request_id>/", views.request_detail, name="request"),
]

# Every page refuses a NUL byte in its path parameters or query with a 400.
urlpatterns = [
    path(str(p.pattern), views.refuse_nul(p.callback), name=p.name) for p in _urlpatterns
]
