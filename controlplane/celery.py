"""The Celery app. Redis is the broker when REDIS_URL is set; without it, tasks run
eagerly in-process and the embedded scheduler (`manage.py run_embedded_jobs`) drives them."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("kvroute")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
