from __future__ import annotations

from django.urls import path

from controlplane.policies import apis

# Activation is per model (one default route per model): activate a policy's version
# with POST policies/<name>/activate/, undo with POST models/<model>/rollback/.
urlpatterns = [
    path("policy-types/", apis.PolicyTypeListApi.as_view(), name="policy-type-list"),
    path("policies/", apis.PolicyListApi.as_view(), name="policy-list"),
    path("policies/validate/", apis.PolicyValidateApi.as_view(), name="policy-validate"),
    path("policies/<str:name>/", apis.PolicyDetailApi.as_view(), name="policy-detail"),
    path(
        "policies/<str:name>/versions/", apis.PolicyVersionListApi.as_view(), name="policy-versions"
    ),
    path(
        "policies/<str:name>/versions/<int:number>/",
        apis.PolicyVersionDetailApi.as_view(),
        name="policy-version-detail",
    ),
    path("policies/<str:name>/activate/", apis.PolicyActivateApi.as_view(), name="policy-activate"),
    path("models/", apis.ModelListApi.as_view(), name="model-list"),
    path("models/<path:model>/rollback/", apis.ModelRollbackApi.as_view(), name="model-rollback"),
    path("models/<path:model>/", apis.ModelDetailApi.as_view(), name="model-detail"),
    path("experiments/", apis.ExperimentListApi.as_view(), name="experiment-list"),
    path("experiments/<str:name>/", apis.ExperimentDetailApi.as_view(), name="experiment-detail"),
    path(
        "experiments/<str:name>/start/", apis.ExperimentStartApi.as_view(), name="experiment-start"
    ),
    path("experiments/<str:name>/stop/", apis.ExperimentStopApi.as_view(), name="experiment-stop"),
    path(
        "experiments/<str:name>/results/",
        apis.ExperimentResultsApi.as_view(),
        name="experiment-results",
    ),
]
