"""kvroute control-plane settings, all from environment variables (12-factor).

SQLite and in-process stand-ins by default; DATABASE_URL switches to Postgres and
REDIS_URL turns on Redis for Celery, the channel layer and the request stream.
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw else default


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw else default


DEBUG = env_bool("KVROUTE_DEBUG", False)
SECRET_KEY = os.environ.get("KVROUTE_SECRET_KEY", "kvroute-insecure-dev-key-change-me")
ALLOWED_HOSTS = [h for h in os.environ.get("KVROUTE_ALLOWED_HOSTS", "*").split(",") if h]
CSRF_TRUSTED_ORIGINS = [
    o for o in os.environ.get("KVROUTE_CSRF_TRUSTED_ORIGINS", "").split(",") if o
]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "controlplane.common",
    "controlplane.registry",
    "controlplane.policies",
    "controlplane.telemetry",
    "dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "controlplane.urls"
ASGI_APPLICATION = "controlplane.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL") or f"sqlite:///{BASE_DIR / 'var' / 'kvroute.sqlite3'}",
        conn_max_age=env_int("KVROUTE_DB_CONN_MAX_AGE", 0),
    )
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    DATABASES["default"].setdefault("OPTIONS", {})["timeout"] = 20
    # Take the write lock at BEGIN: concurrent writers then wait (up to `timeout`)
    # instead of failing with "database is locked" when upgrading a read lock.
    DATABASES["default"]["OPTIONS"]["transaction_mode"] = "IMMEDIATE"

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_TZ = True
STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "var" / "static"
# Serve app static files (Swagger UI from drf-spectacular-sidecar, admin) straight from the
# installed packages, so `make demo` needs no collectstatic step.
WHITENOISE_USE_FINDERS = True
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"

REDIS_URL = os.environ.get("REDIS_URL", "")

if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "prefix": "kvroute"},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "kvroute control plane API",
    "DESCRIPTION": "Worker registry, versioned routing policies and A/B experiments.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI assets served from the drf-spectacular-sidecar package (no CDN, works offline).
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# Reads of the control-plane API without a token: only on a trusted network.
KVROUTE_OPEN_READS = env_bool("KVROUTE_OPEN_READS", False)
# A worker whose last heartbeat is older than this is reported unhealthy.
KVROUTE_HEARTBEAT_TIMEOUT_S = env_float("KVROUTE_HEARTBEAT_TIMEOUT_S", 15.0)

# Celery: Redis broker when REDIS_URL is set; otherwise tasks run in-process
# (the embedded stand-in started by `manage.py run_embedded_jobs` / `make demo`).
CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_RESULT_BACKEND = None
CELERY_TASK_ALWAYS_EAGER = not REDIS_URL
CELERY_TASK_IGNORE_RESULT = True
# Telemetry (controlplane.telemetry): job intervals, sampling and retention ages.
KVROUTE_TELEMETRY_SAMPLE_RATE = env_float("KVROUTE_TELEMETRY_SAMPLE_RATE", 1.0)
KVROUTE_TELEMETRY_DRAIN_BATCH = env_int("KVROUTE_TELEMETRY_DRAIN_BATCH", 1000)
KVROUTE_TELEMETRY_DRAIN_INTERVAL_S = env_float("KVROUTE_TELEMETRY_DRAIN_INTERVAL_S", 2.0)
KVROUTE_TELEMETRY_SCRAPE_INTERVAL_S = env_float("KVROUTE_TELEMETRY_SCRAPE_INTERVAL_S", 5.0)
KVROUTE_TELEMETRY_RESULTS_INTERVAL_S = env_float("KVROUTE_TELEMETRY_RESULTS_INTERVAL_S", 30.0)
KVROUTE_TELEMETRY_RETENTION_INTERVAL_S = env_float("KVROUTE_TELEMETRY_RETENTION_INTERVAL_S", 600.0)
KVROUTE_TELEMETRY_BOOTSTRAP_RESAMPLES = env_int("KVROUTE_TELEMETRY_BOOTSTRAP_RESAMPLES", 400)
KVROUTE_TELEMETRY_RECORDS_MAX_AGE_S = env_float("KVROUTE_TELEMETRY_RECORDS_MAX_AGE_S", 7 * 86400.0)
KVROUTE_TELEMETRY_MINUTE_ROLLUPS_MAX_AGE_S = env_float(
    "KVROUTE_TELEMETRY_MINUTE_ROLLUPS_MAX_AGE_S", 2 * 86400.0
)
KVROUTE_TELEMETRY_HOUR_ROLLUPS_MAX_AGE_S = env_float(
    "KVROUTE_TELEMETRY_HOUR_ROLLUPS_MAX_AGE_S", 90 * 86400.0
)
KVROUTE_TELEMETRY_FLEET_MAX_AGE_S = env_float("KVROUTE_TELEMETRY_FLEET_MAX_AGE_S", 2 * 86400.0)
KVROUTE_TELEMETRY_LIVE_ROLLUPS_MAX_AGE_S = env_float(
    "KVROUTE_TELEMETRY_LIVE_ROLLUPS_MAX_AGE_S", 2 * 3600.0
)
# The gateway's Prometheus page (per-worker BlockRemoved counts -> eviction rate); optional.
KVROUTE_GATEWAY_METRICS_URL = os.environ.get("KVROUTE_GATEWAY_METRICS_URL", "")
# What-if panel: how many recent recorded requests are replayed.
KVROUTE_WHATIF_REQUESTS = env_int("KVROUTE_WHATIF_REQUESTS", 500)

CELERY_BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    "telemetry.drain_request_stream": {
        "task": "telemetry.drain_request_stream",
        "schedule": KVROUTE_TELEMETRY_DRAIN_INTERVAL_S,
    },
    "telemetry.scrape_fleet": {
        "task": "telemetry.scrape_fleet",
        "schedule": KVROUTE_TELEMETRY_SCRAPE_INTERVAL_S,
    },
    "telemetry.experiment_results": {
        "task": "telemetry.experiment_results",
        "schedule": KVROUTE_TELEMETRY_RESULTS_INTERVAL_S,
    },
    "telemetry.retention": {
        "task": "telemetry.retention",
        "schedule": KVROUTE_TELEMETRY_RETENTION_INTERVAL_S,
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("KVROUTE_LOG_LEVEL", "INFO")},
    "loggers": {"django.request": {"level": "ERROR"}},
}
