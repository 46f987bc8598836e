"""`manage.py run_embedded_jobs`: run the telemetry jobs in this process, without Celery."""

from __future__ import annotations

import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand

from controlplane.jobs import EmbeddedScheduler


class Command(BaseCommand):
    help = (
        "Run the telemetry jobs (drain, fleet scrape, experiment results, retention) on the "
        "beat intervals in this process: the stand-in for Celery beat + worker without Redis."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--once", action="store_true", help="run every job once and exit")

    def handle(self, *args: Any, **options: Any) -> None:
        scheduler = EmbeddedScheduler()
        if options["once"]:
            for name in scheduler.run_due():
                job = next(j for j in scheduler.jobs if j.name == name)
                status = f"failed: {job.last_error}" if job.failures else "ok"
                self.stdout.write(f"{name}: {status}")
            return
        done = threading.Event()
        signal.signal(signal.SIGINT, lambda *_: done.set())
        signal.signal(signal.SIGTERM, lambda *_: done.set())
        scheduler.start()
        self.stdout.write("embedded jobs running; Ctrl-C to stop")
        done.wait()
        scheduler.stop()
