"""`manage.py seed_demo [--model sim-8b]`: the demo's policies, kv_score active, and a draft A/B.

Idempotent: existing policies and experiments are left as they are, and kv_score is
activated only when the model has no active policy yet (an operator's choice stands).
"""

from __future__ import annotations

import re
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from controlplane.common.auth import OPERATOR, Actor
from controlplane.policies import selectors, services

SEED_ACTOR = Actor(label="seed_demo", scope=OPERATOR)
DEMO_TYPES = ("round_robin", "least_load", "kv_score", "predicted_ttft")


def demo_policy_name(model: str, policy_type: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", model).strip("-.") or "model"
    return f"{slug}.{policy_type}"[:100]


def seed_demo(*, model: str) -> list[str]:
    """Create what is missing; returns one line per thing created or activated."""
    done: list[str] = []
    for policy_type in DEMO_TYPES:
        name = demo_policy_name(model, policy_type)
        if selectors.policy_get(name=name) is None:
            services.policy_create(
                name=name,
                model=model,
                type=policy_type,
                params={},
                actor=SEED_ACTOR,
                description=f"demo: {policy_type} with default parameters",
                note="seeded with defaults",
            )
            done.append(f"created policy {name} v1")
    if selectors.active_version(model=model) is None:
        services.policy_activate(
            policy_name=demo_policy_name(model, "kv_score"), version=1, actor=SEED_ACTOR
        )
        done.append(f"activated {demo_policy_name(model, 'kv_score')} v1 for {model}")
    experiment = demo_policy_name(model, "kv-vs-least")
    if selectors.experiment_get(name=experiment) is None:
        services.experiment_create(
            name=experiment,
            model=model,
            sticky_key="session",
            arms=[
                {
                    "name": "A",
                    "policy": demo_policy_name(model, "kv_score"),
                    "version": 1,
                    "share": 50,
                },
                {
                    "name": "B",
                    "policy": demo_policy_name(model, "least_load"),
                    "version": 1,
                    "share": 50,
                },
            ],
            actor=SEED_ACTOR,
            description="demo: KV-aware scoring against least load, 50/50 by session",
        )
        done.append(f"created draft experiment {experiment}")
    return done


class Command(BaseCommand):
    help = "Seed demo routing policies (kv_score active) and a draft kv_score-vs-least_load experiment."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--model", default="sim-8b", help="model name the policies route")

    def handle(self, *args: Any, **options: Any) -> None:
        done = seed_demo(model=options["model"])
        for line in done or [f"nothing to do: demo data for {options['model']} already present"]:
            self.stdout.write(line)
