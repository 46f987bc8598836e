"""Number formatting for the operator pages: percentages, milliseconds, ages."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.html import format_html

register = template.Library()
DASH = "–"


@register.filter
def pct(value: Any, digits: int = 1) -> str:
    if value is None or value == "":
        return DASH
    return f"{100 * float(value):.{int(digits)}f} %"


@register.filter
def ms(value: Any) -> str:
    if value is None or value == "":
        return DASH
    v = float(value)
    return f"{v / 1000:.2f} s" if v >= 1000 else f"{v:.0f} ms"


@register.filter
def num(value: Any, digits: int = 2) -> str:
    if value is None or value == "":
        return DASH
    v = float(value) + 0.0  # no "-0.000"
    if round(v, int(digits)) == 0:
        v = 0.0
    if v.is_integer() and abs(v) >= 100:
        return f"{int(v):,}"
    return f"{v:,.{int(digits)}f}"


@register.filter
def age(seconds: Any) -> str:
    if seconds is None:
        return "never"
    s = float(seconds)
    if s < 60:
        return f"{s:.0f} s ago"
    if s < 3600:
        return f"{s / 60:.0f} min ago"
    return f"{s / 3600:.1f} h ago"


@register.filter
def get(mapping: Any, key: Any) -> Any:
    if isinstance(mapping, dict):
        return mapping.get(key)
    return None


@register.filter
def ci(interval: Any, kind: str = "ms") -> str:
    """Estimate with its interval underneath, from an interval dict; ms or %."""
    if not interval:
        return DASH
    f = pct if kind == "pct" else ms
    return format_html(
        '{}<span class="ci">{} – {}</span>',
        f(interval["estimate"]),
        f(interval["lo"]),
        f(interval["hi"]),
    )
