"""The policy-weights form, generated from `routing.core.registry.params_schema`.

Parsing turns posted strings into the schema's JSON types (naming the field on a bad
value); range and choice checks stay with `validate_params`, the one gate every
parameter set passes, so the form can never accept what the API would reject.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

INPUT_PREFIX = "param__"


class ParamsFormError(ValueError):
    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


def form_fields(
    schema: Mapping[str, Any],
    values: Mapping[str, Any],
    *,
    errors: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Template-ready descriptions of one input per schema property."""
    errors = errors or {}
    out = []
    for key, prop in schema.get("properties", {}).items():
        kind = prop.get("type")
        value = values.get(key, prop.get("default"))
        field: dict[str, Any] = {
            "key": key,
            "input_name": INPUT_PREFIX + key,
            "label": key.replace("_", " "),
            "help": prop.get("description", ""),
            "default": prop.get("default"),
            "value": value,
            "error": errors.get(key, ""),
            "min": prop.get("minimum"),
            "max": prop.get("maximum"),
        }
        if "enum" in prop:
            field["widget"] = "select"
            field["choices"] = list(prop["enum"])
        elif kind == "boolean":
            field["widget"] = "checkbox"
        elif kind in ("number", "integer"):
            field["widget"] = "number"
            field["step"] = "1" if kind == "integer" else "any"
        else:
            field["widget"] = "text"
        out.append(field)
    return out


def params_from_post(schema: Mapping[str, Any], post: Mapping[str, str]) -> dict[str, Any]:
    """Typed params from a posted form; raises ParamsFormError naming the first bad field."""
    params: dict[str, Any] = {}
    for key, prop in schema.get("properties", {}).items():
        name = INPUT_PREFIX + key
        kind = prop.get("type")
        if kind == "boolean":
            params[key] = post.get(name) in ("on", "true", "1")
            continue
        raw = (post.get(name) or "").strip()
        if raw == "":
            raise ParamsFormError("This value is required.", field=key)
        if kind == "integer":
            try:
                params[key] = int(raw)
            except ValueError as exc:
                raise ParamsFormError(f"Enter a whole number, not {raw!r}.", field=key) from exc
        elif kind == "number":
            try:
                value = float(raw)
            except ValueError as exc:
                raise ParamsFormError(f"Enter a number, not {raw!r}.", field=key) from exc
            if not math.isfinite(value):
                raise ParamsFormError("Enter a finite number.", field=key)
            params[key] = value
        else:
            params[key] = raw
    return params
