#!/usr/bin/env bash
# The step before every commit: the linter, then the unit tier on both cores.
#   bash scripts/check.sh            # ruff, then `pytest -m unit` (no server, no browser, no full-size training)
#   bash scripts/check.sh -k config  # extra arguments go to pytest
# It installs nothing: run `bash scripts/test.sh` once first (or `pip install -r requirements-dev.txt`).
set -euo pipefail
cd "$(dirname "$0")/.."
export GRADIO_ANALYTICS_ENABLED=False HF_HUB_OFFLINE=1
python -m ruff check --quiet .
exec python -m pytest -m unit -n 2 --dist loadgroup --no-loadscope-reorder -q "$@"
