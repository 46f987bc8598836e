#!/usr/bin/env bash
# The whole suite, as `make test` runs it: services, the purity contract, then pytest
# on SQLite, then the database-backed tests again on Postgres when it is reachable.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv

# Redis: use REDIS_URL when set; otherwise start a local redis-server if one is
# installed but not running. Tests that need Redis skip (with a reason) without it.
if [ -z "${REDIS_URL:-}" ]; then
  if command -v redis-cli >/dev/null 2>&1 && redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    export KVROUTE_TEST_REDIS_URL=redis://127.0.0.1:6379/15
  elif command -v redis-server >/dev/null 2>&1; then
    echo "starting redis-server on 127.0.0.1:6379"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no >/dev/null
    for _ in $(seq 1 50); do redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 && break; sleep 0.1; done
    export KVROUTE_TEST_REDIS_URL=redis://127.0.0.1:6379/15
  else
    echo "redis-server not installed: Redis-backed tests will be skipped"
  fi
else
  export KVROUTE_TEST_REDIS_URL="$REDIS_URL"
fi

# Headless Chromium for the dashboard's browser test: installed when missing and apt works
# (as root, or with passwordless sudo); otherwise that test skips, saying why.
if ! { [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; }; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
  if command -v apt-get >/dev/null 2>&1 && { [ -z "$SUDO" ] || sudo -n true 2>/dev/null; }; then
    echo "installing chromium + chromium-driver for the browser test"
    { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver; } >/dev/null 2>&1 \
      || echo "could not install chromium: the browser test will be skipped"
  else
    echo "chromium not installed and apt not usable: the browser test will be skipped"
  fi
fi

echo "== import contract (routing.core stays pure)"
$VENV/bin/lint-imports

echo "== lint: ruff, and mypy --strict on routing.core and workers.sim"
$VENV/bin/ruff check --output-format concise .
$VENV/bin/ruff format --check .
$VENV/bin/mypy routing/core workers/sim

echo "== pytest (SQLite)"
unset DATABASE_URL
$VENV/bin/pytest -m "not vllm" "$@"

pg_url="${TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"
if $VENV/bin/python - "$pg_url" <<'PY' >/dev/null 2>&1
import sys, psycopg
psycopg.connect(sys.argv[1], connect_timeout=3).close()
PY
then
  echo "== pytest (Postgres: control-plane and telemetry tests, hostile API callers)"
  # NUL bytes and out-of-range numbers break PostgreSQL queries where SQLite shrugs.
  DATABASE_URL="$pg_url" $VENV/bin/pytest -m "not vllm and not browser" tests/controlplane \
    tests/hardening/test_controlplane_hostile.py tests/hardening/test_dashboard_hostile.py "$@"
else
  echo "Postgres not reachable at $pg_url: skipping the Postgres pass"
fi
