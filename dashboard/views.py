"""Operator pages: overview (live), workers, policy tuning, experiments, request explorer.

Reads go through selectors, writes through the control-plane services (the same ones the
REST API uses), so the UI can do nothing the API would refuse. Writes need a staff user
(the operator scope); any logged-in user can read.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import plotly
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from controlplane.common.auth import OPERATOR, READ, Actor
from controlplane.common.errors import ServiceError
from controlplane.telemetry import selectors as tsel
from dashboard import figures, forms, whatif

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
OVERVIEW_WINDOW_S = 3600.0
WORKER_WINDOW_S = 3600.0
SUMMARY_WINDOW_S = 900.0


def _actor(request: HttpRequest) -> Actor:
    user: Any = request.user
    return Actor(label=f"user:{user.get_username()}", scope=OPERATOR if user.is_staff else READ)


def refuse_nul(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """400 for a NUL byte in the path parameters or the query: no name holds one, and
    PostgreSQL refuses it in text parameters (it would otherwise surface as a 500)."""

    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        bad = [k for k, v in kwargs.items() if isinstance(v, str) and "\x00" in v]
        bad += [k for k, vs in request.GET.lists() if any("\x00" in v for v in vs)]
        if bad:
            return HttpResponse(f"Invalid character (NUL) in {', '.join(bad)}.", status=400)
        return view(request, *args, **kwargs)

    return wrapped


def _safe_next(request: HttpRequest, target: str | None, *, default: str) -> str:
    """Where to go back to: only this site's own URLs (no open redirect)."""
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return default


def operator_post(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """POST only, logged in, staff; ServiceErrors become a flash message and a redirect back."""

    @login_required
    @require_POST
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_staff:  # type: ignore[union-attr]
            return HttpResponse("Changing routing needs an operator (staff) account.", status=403)
        try:
            return view(request, *args, **kwargs)
        except ServiceError as exc:
            where = f" ({exc.field})" if exc.field else ""
            messages.error(request, f"{exc.message}{where}")
            back = request.POST.get("next") or request.META.get("HTTP_REFERER")
            return redirect(_safe_next(request, back, default="/"))

    wrapped.__name__ = view.__name__
    wrapped.__doc__ = view.__doc__
    return wrapped


# --- assets --------------------------------------------------------------------------


@functools.cache
def _plotly_bundle() -> bytes:
    # Read once per process: ~4.6 MB, served to every dashboard page load.
    return PLOTLY_JS.read_bytes()


@require_GET
def plotly_js(request: HttpRequest) -> HttpResponse:
    """The installed plotly package's own bundle: the dashboard never loads from a CDN."""
    resp = HttpResponse(_plotly_bundle(), content_type="application/javascript")
    resp["Cache-Control"] = "public, max-age=86400"
    return resp


# --- overview ------------------------------------------------------------------------


@login_required
def overview(request: HttpRequest) -> HttpResponse:
    # Layout-only figures: the script fills them from the snapshot, then from updates.
    figs = figures.overview_figures({})
    return render(
        request,
        "dashboard/overview.html",
        {
            "figs": figs,
            "chart_order": ["rps", "ttft", "hit_rate", "evictions", "queue", "kv_usage"],
            "nav": "overview",
        },
    )


@login_required
@require_GET
def snapshot(request: HttpRequest) -> JsonResponse:
    """What the overview draws before websocket updates: minute points, fleet series."""
    try:
        window_s = min(max(float(request.GET.get("window_s", OVERVIEW_WINDOW_S)), 60.0), 86400.0)
    except ValueError:
        return JsonResponse({"window_s": ["Enter a number of seconds."]}, status=400)
    snap = tsel.overview_snapshot(window_s=window_s)
    snap["marks"] = _activation_marks(since_s=time.time() - window_s)
    return JsonResponse(snap)


def _activation_marks(*, since_s: float) -> list[dict[str, str]]:
    """Policy activations and rollbacks in the window, drawn as vertical marks on the
    overview's time series so a weight change can be read against its effect."""
    from datetime import UTC, datetime

    from controlplane.policies import selectors as psel

    since = datetime.fromtimestamp(since_s, tz=UTC)
    marks = []
    for model in sorted({p.model for p in psel.policy_list()}):
        for a in psel.activation_history(model=model, limit=20):
            if a.created_at < since:
                break
            marks.append(
                {
                    "t": a.created_at.isoformat().replace("+00:00", "Z"),
                    "text": f"{a.kind}: {a.version.policy.name} v{a.version.number}",
                }
            )
    return sorted(marks, key=lambda m: m["t"])


# --- workers -------------------------------------------------------------------------


@login_required
def workers(request: HttpRequest) -> HttpResponse:
    from controlplane.registry.selectors import worker_list

    now_s = time.time()
    fleet = tsel.latest_fleet_by_worker()
    summary = tsel.worker_rollup_summary(since_s=now_s - SUMMARY_WINDOW_S, now_s=now_s)
    rows = []
    for w in worker_list():
        f = fleet.get(w.name)
        s = summary.get(w.name, {})
        hb_age_s = (now_s - w.last_heartbeat_at.timestamp()) if w.last_heartbeat_at else None
        rows.append(
            {
                "worker": w,
                "healthy": getattr(w, "healthy", False),
                "fleet": f,
                "summary": s,
                "heartbeat_age_s": hb_age_s,
                "events": "KV events" if w.kv_events_endpoint else "approximate only",
            }
        )
    return render(
        request,
        "dashboard/workers.html",
        {"rows": rows, "nav": "workers", "summary_window_min": int(SUMMARY_WINDOW_S // 60)},
    )


@login_required
def worker_detail(request: HttpRequest, name: str) -> HttpResponse:
    from controlplane.registry.selectors import worker_get

    w = worker_get(name=name)
    if w is None:
        raise Http404(f"No worker named {name!r}.")
    now_s = time.time()
    since_s = now_s - WORKER_WINDOW_S
    fleet = tsel.fleet_series(since_s=since_s, worker_id=name)
    figs = figures.worker_figures(
        points=tsel.worker_points(worker_id=name, since_s=since_s, now_s=now_s),
        samples=fleet["workers"].get(name, []),
        worker_id=name,
    )
    return render(
        request,
        "dashboard/worker_detail.html",
        {
            "worker": w,
            "figs": figs,
            "chart_order": ["rps", "ttft", "hit_rate", "queue", "running", "kv_usage"],
            "recent": tsel.recent_requests(limit=20, worker_id=name),
            "nav": "workers",
        },
    )


@operator_post
def worker_action(request: HttpRequest, name: str, action: str) -> HttpResponse:
    from controlplane.registry import services as reg

    fn = {"drain": reg.worker_drain, "enable": reg.worker_enable}.get(action)
    if fn is None:
        raise Http404(f"Unknown worker action {action!r}.")
    fn(name=name, actor=_actor(request))
    messages.success(request, f"Worker {name}: {action} done.")
    return redirect(
        _safe_next(request, request.POST.get("next"), default=reverse("dashboard:workers"))
    )


# --- policy tuning ---------------------------------------------------------------------


@login_required
def policies(request: HttpRequest) -> HttpResponse:
    from controlplane.policies import selectors as psel

    active = psel.active_versions()
    rows = [
        {"policy": p, "latest": p.versions.order_by("-number").first()} for p in psel.policy_list()
    ]
    return render(
        request,
        "dashboard/policies.html",
        {"rows": rows, "active": active, "nav": "policies"},
    )


def _policy_context(request: HttpRequest, name: str) -> dict[str, Any]:
    from controlplane.policies import selectors as psel
    from routing.core.registry import params_schema

    policy = psel.policy_get(name=name)
    if policy is None:
        raise Http404(f"No policy named {name!r}.")
    versions = list(psel.policy_versions(policy=policy))
    latest = versions[-1] if versions else None
    active = psel.active_version(model=policy.model)
    schema = params_schema(latest.type) if latest else {"properties": {}}
    return {
        "policy": policy,
        "versions": list(reversed(versions)),
        "latest": latest,
        "active": active,
        "active_id": active.pk if active else None,
        "schema": schema,
        "history": list(psel.activation_history(model=policy.model, limit=10)),
        "whatif": whatif.status(),
        "whatif_profiles": whatif.profiles(),
        "whatif_default_profile": whatif.DEFAULT_PROFILE,
        "whatif_params": [k for k, p in schema["properties"].items() if p["type"] == "number"],
        "whatif_requests": settings.KVROUTE_WHATIF_REQUESTS,
        "nav": "policies",
    }


@login_required
def policy_detail(request: HttpRequest, name: str) -> HttpResponse:
    ctx = _policy_context(request, name)
    latest = ctx["latest"]
    ctx["fields"] = forms.form_fields(ctx["schema"], latest.params if latest else {})
    return render(request, "dashboard/policy_detail.html", ctx)


@login_required
@require_POST
def policy_save(request: HttpRequest, name: str) -> HttpResponse:
    """Save the form as a new immutable version (and optionally activate it)."""
    from controlplane.policies import services as psvc

    if not request.user.is_staff:  # type: ignore[union-attr]
        return HttpResponse("Changing routing needs an operator (staff) account.", status=403)
    ctx = _policy_context(request, name)
    errors: dict[str, str] = {}
    posted = {
        k[len(forms.INPUT_PREFIX) :]: v
        for k, v in request.POST.items()
        if k.startswith(forms.INPUT_PREFIX)
    }
    try:
        params = forms.params_from_post(ctx["schema"], request.POST)
        version = psvc.policy_version_add(
            policy_name=name,
            params=params,
            actor=_actor(request),
            note=request.POST.get("note", ""),
        )
        if request.POST.get("activate"):
            psvc.policy_activate(policy_name=name, version=version.number, actor=_actor(request))
            messages.success(request, f"Saved and activated {name} v{version.number}.")
        else:
            messages.success(request, f"Saved {name} v{version.number} (not active yet).")
        return redirect(reverse("dashboard:policy", args=[name]))
    except forms.ParamsFormError as exc:
        errors[exc.field] = exc.message
    except ServiceError as exc:
        key = (exc.field or "").removeprefix("params.")
        if key in ctx["schema"]["properties"]:
            errors[key] = exc.message
        else:
            messages.error(request, exc.message)
    ctx["fields"] = forms.form_fields(ctx["schema"], posted, errors=errors)
    ctx["note"] = request.POST.get("note", "")
    return render(request, "dashboard/policy_detail.html", ctx, status=400)


@operator_post
def policy_activate(request: HttpRequest, name: str) -> HttpResponse:
    from controlplane.policies import services as psvc

    try:
        number = int(request.POST.get("version", ""))
    except ValueError as exc:
        raise ServiceError("A version number is required.", field="version") from exc
    _, changed = psvc.policy_activate(policy_name=name, version=number, actor=_actor(request))
    messages.success(
        request,
        f"{name} v{number} is active." if changed else f"{name} v{number} was already active.",
    )
    return redirect(
        _safe_next(
            request, request.POST.get("next"), default=reverse("dashboard:policy", args=[name])
        )
    )


@operator_post
def policy_rollback(request: HttpRequest, name: str) -> HttpResponse:
    from controlplane.policies import selectors as psel
    from controlplane.policies import services as psvc

    policy = psel.policy_get(name=name)
    if policy is None:
        raise Http404(f"No policy named {name!r}.")
    activation = psvc.policy_rollback(model=policy.model, actor=_actor(request))
    messages.success(request, f"Rolled back {policy.model} to {activation.version}.")
    return redirect(reverse("dashboard:policy", args=[name]))


def _whatif_axis(
    ctx: dict[str, Any], *, param: str, raw: str, field: str
) -> tuple[list[float] | None, JsonResponse | None]:
    """Parsed and range-checked values of one what-if axis, or a 400 naming the field."""
    try:
        values = [float(v) for v in raw.split(",") if v.strip()]
    except ValueError:
        return None, JsonResponse({field: ["Enter numbers separated by commas."]}, status=400)
    prop = ctx["schema"]["properties"][param]
    lo, hi = prop.get("minimum", -math.inf), prop.get("maximum", math.inf)
    if not 2 <= len(values) <= whatif.MAX_VALUES or any(not lo <= v <= hi for v in values):
        return None, JsonResponse(
            {field: [f"Enter 2 to {whatif.MAX_VALUES} values of {param} within [{lo}, {hi}]."]},
            status=400,
        )
    return sorted(set(values)), None


@login_required
@require_POST
def policy_whatif(request: HttpRequest, name: str) -> JsonResponse:
    """Replay the last N recorded requests offline over a grid of one or two weights."""
    from controlplane.registry.selectors import worker_list

    ctx = _policy_context(request, name)
    ok, why = ctx["whatif"]
    if not ok:
        return JsonResponse({"available": False, "detail": why}, status=503)
    choices = ", ".join(ctx["whatif_params"]) or "none (this policy has no numeric weights)"
    param = request.POST.get("param", "")
    if param not in ctx["whatif_params"]:
        return JsonResponse({"param": [f"Choose one of {choices}."]}, status=400)
    values, err = _whatif_axis(ctx, param=param, raw=request.POST.get("values", ""), field="values")
    if err is not None:
        return err
    grid: dict[str, list[float]] = {param: values or []}
    param2 = request.POST.get("param2", "")
    if param2:
        if param2 not in ctx["whatif_params"] or param2 == param:
            return JsonResponse(
                {"param2": [f"Choose a second weight other than {param}: {choices}."]}, status=400
            )
        values2, err = _whatif_axis(
            ctx, param=param2, raw=request.POST.get("values2", ""), field="values2"
        )
        if err is not None:
            return err
        grid[param2] = values2 or []
        if len(grid[param]) * len(grid[param2]) > whatif.MAX_POINTS:
            return JsonResponse(
                {"values2": [f"At most {whatif.MAX_POINTS} grid points in all."]}, status=400
            )
    profile = request.POST.get("profile") or whatif.DEFAULT_PROFILE
    if profile not in ctx["whatif_profiles"]:
        return JsonResponse(
            {"profile": [f"Choose one of {', '.join(ctx['whatif_profiles'])}."]}, status=400
        )
    records = tsel.recent_request_dicts(limit=ctx["whatif_requests"], model=ctx["policy"].model)
    if len(records) < 10:
        return JsonResponse(
            {
                "available": True,
                "detail": f"Only {len(records)} recorded requests; need at least 10.",
            },
            status=409,
        )
    engines = sum(1 for w in worker_list(model=ctx["policy"].model) if w.state != "disabled")
    latest = ctx["latest"]
    try:
        rows = whatif.sweep(
            records=records,
            policy_type=latest.type,
            base_params=dict(latest.params),
            grid=grid,
            engines=engines,
            profile=profile,
        )
    except whatif.WhatIfUnavailable as exc:
        return JsonResponse({"available": False, "detail": str(exc)}, status=409)
    if param2:
        fig = figures.whatif_surface_figure(rows, x_param=param, y_param=param2)
    else:
        fig = figures.whatif_figure(
            rows,
            param=param,
            metrics=[
                ("ttft_p99_ms", "predicted TTFT p99 (ms)"),
                ("hit_rate", "predicted hit rate"),
            ],
        )
    return JsonResponse(
        {
            "available": True,
            "rows": rows,
            "figure": fig,
            "requests": len(records),
            "engines": max(1, engines),
            "profile": profile,
        }
    )


# --- experiments -------------------------------------------------------------------------


@login_required
def experiments(request: HttpRequest) -> HttpResponse:
    from controlplane.policies import selectors as psel
    from controlplane.policies.models import PolicyVersion

    versions = PolicyVersion.objects.select_related("policy").order_by(
        "policy__model", "policy__name", "-number"
    )
    return render(
        request,
        "dashboard/experiments.html",
        {
            "experiments": [
                {"exp": e, "results": tsel.experiment_result_get(experiment_id=e.pk)}
                for e in psel.experiment_list()
            ],
            "versions": versions,
            "models": sorted({v.policy.model for v in versions}),
            "arm_slots": ["A", "B", "C", "D"],
            "form": request.session.pop("experiment_form", None) or {},
            "nav": "experiments",
        },
    )


@operator_post
def experiment_create(request: HttpRequest) -> HttpResponse:
    from controlplane.policies import services as psvc

    arms = []
    for slot in ("A", "B", "C", "D"):
        vid = request.POST.get(f"arm_{slot}_version", "")
        if not vid:
            continue
        try:
            arms.append(
                {
                    "name": slot,
                    "version_id": int(vid),
                    "share": int(request.POST.get(f"arm_{slot}_share", "0")),
                }
            )
        except ValueError as exc:
            raise ServiceError("Shares are whole percents.", field=f"arm {slot} share") from exc
    try:
        exp = psvc.experiment_create(
            name=request.POST.get("name", "").strip(),
            model=request.POST.get("model", "").strip(),
            arms=arms,
            sticky_key=request.POST.get("sticky_key", "session"),
            description=request.POST.get("description", ""),
            actor=_actor(request),
        )
    except ServiceError:
        request.session["experiment_form"] = dict(request.POST.items())
        raise
    messages.success(request, f"Created experiment {exp.name} (draft). Start it to split traffic.")
    return redirect(reverse("dashboard:experiment", args=[exp.name]))


@login_required
def experiment_detail(request: HttpRequest, name: str) -> HttpResponse:
    from controlplane.policies import selectors as psel

    exp = psel.experiment_get(name=name)
    if exp is None:
        raise Http404(f"No experiment named {name!r}.")
    info = psel.experiment_info(exp)
    results = tsel.experiment_result_get(experiment_id=exp.pk)
    figs = figures.experiment_figures(results) if results else {}
    winner_arm = None
    if results and results.get("winner"):
        winner_arm = next((a for a in info.arms if a.name == results["winner"]), None)
    return render(
        request,
        "dashboard/experiment_detail.html",
        {
            "exp": exp,
            "info": info,
            "results": results,
            "figs": figs,
            "chart_order": ["cdf", "hit_rate", "ttft_p95"],
            "winner_arm": winner_arm,
            "nav": "experiments",
        },
    )


@operator_post
def experiment_action(request: HttpRequest, name: str, action: str) -> HttpResponse:
    from controlplane.policies import selectors as psel
    from controlplane.policies import services as psvc
    from controlplane.telemetry import tasks

    actor = _actor(request)
    if action == "start":
        psvc.experiment_start(name=name, actor=actor)
        messages.success(request, f"Experiment {name} is running.")
    elif action == "stop":
        psvc.experiment_stop(name=name, actor=actor)
        messages.success(
            request, f"Experiment {name} stopped; traffic is back on the active policy."
        )
    elif action == "recompute":
        exp = psel.experiment_get(name=name)
        if exp is None:
            raise Http404(f"No experiment named {name!r}.")
        info = psel.experiment_info(exp)
        tasks.experiment_results_compute(
            experiment_id=info.id, arms=[(a.name, a.version.version_id) for a in info.arms]
        )
        messages.success(request, "Results recomputed.")
    elif action == "promote":
        exp = psel.experiment_get(name=name)
        if exp is None:
            raise Http404(f"No experiment named {name!r}.")
        info = psel.experiment_info(exp)
        results = tsel.experiment_result_get(experiment_id=info.id) or {}
        arm_name = request.POST.get("arm") or results.get("winner")
        arm = next((a for a in info.arms if a.name == arm_name), None)
        if arm is None:
            raise ServiceError("No winning arm to promote yet.", field="arm")
        if exp.status == "running":
            psvc.experiment_stop(name=name, actor=actor)
        _, changed = psvc.policy_activate(
            policy_name=arm.version.policy,
            version=arm.version.version,
            actor=actor,
            note=f"promoted from experiment {name}, arm {arm.name}",
        )
        messages.success(
            request,
            f"Promoted arm {arm.name}: {arm.version.policy} v{arm.version.version} "
            f"{'is now active' if changed else 'was already active'} for {info.model}.",
        )
    else:
        raise Http404(f"Unknown experiment action {action!r}.")
    return redirect(reverse("dashboard:experiment", args=[name]))


# --- request explorer ----------------------------------------------------------------------


@login_required
def requests_explorer(request: HttpRequest) -> HttpResponse:
    worker_id = request.GET.get("worker") or None
    status = request.GET.get("status") or None
    rows = tsel.recent_requests(limit=200, worker_id=worker_id, status=status)
    return render(
        request,
        "dashboard/requests.html",
        {"rows": rows, "worker": worker_id or "", "status": status or "", "nav": "requests"},
    )


@login_required
def request_detail(request: HttpRequest, request_id: str) -> HttpResponse:
    rec = tsel.request_get(request_id=request_id)
    if rec is None:
        raise Http404(f"No recorded request {request_id!r} (it may not have been sampled).")
    candidates = rec.candidates if isinstance(rec.candidates, list) else []
    term_names: list[str] = []
    for c in candidates:
        for t in c.get("terms") or {}:
            if t not in term_names:
                term_names.append(t)
    return render(
        request,
        "dashboard/request_detail.html",
        {
            "rec": rec,
            "candidates": candidates,
            "term_names": term_names,
            "figs": {"why": figures.score_breakdown_figure(candidates, chosen=rec.worker_id)},
            "shadow_json": json.dumps(rec.shadow, indent=2) if rec.shadow else "",
            "nav": "requests",
        },
    )
