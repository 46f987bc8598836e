#!/usr/bin/env bash
# Install the peer routers from PyPI into their own venv (.venv-peers, gitignored), apart from
# the product's .venv: vllm-router (round_robin, cache_aware, kv_aware) and sglang-router.
# Checks each package is downloadable first and says so plainly when one is not.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV=.venv-peers
test -x "$VENV/bin/python" || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for pkg in vllm-router sglang-router; do
  if "$VENV/bin/python" -m pip download -q --no-deps -d "$tmp" "$pkg" >/dev/null 2>&1; then
    "$VENV/bin/python" -m pip install -q "$pkg"
    echo "installed $pkg: $("$VENV/bin/python" -m pip show "$pkg" | awk '/^Version/{print $2}')"
  else
    echo "NOT AVAILABLE from the package index: $pkg (its configurations will be skipped)"
  fi
done
