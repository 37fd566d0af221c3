#!/usr/bin/env bash
# Install everything the tests need, lint, then run the whole suite on both cores.
#   bash scripts/test.sh                  # every tier
#   bash scripts/test.sh -m unit          # one tier: unit, app, browser or science (tests/conftest.py)
#   bash scripts/check.sh                 # before every commit: the linter and the unit tier, nothing installed
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
# TransformerLens 4.x's wheel, for the virtual environment tests/test_transformer_lens_4x.py makes (4.x and the
# 3.9 above cannot share one): fetched here, so that nothing is downloaded at test time
python -m pip download --quiet --disable-pip-version-check --no-deps transformer-lens==4.3.0 -d .wheels
# The browser tests drive Debian's Chromium through Playwright (Playwright cannot download a browser here).
# The emoji font keeps the README screenshots free of empty boxes.
need=""
{ command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; } || need="chromium"
dpkg -s fonts-noto-color-emoji >/dev/null 2>&1 || need="$need fonts-noto-color-emoji"
if [ -n "$need" ] && command -v apt-get >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $need >/dev/null
fi
export GRADIO_ANALYTICS_ENABLED=False HF_HUB_OFFLINE=1
# the linter first (ruff.toml: syntax errors, unused or undefined names, likely bugs): seconds, and it names the line
python -m ruff check --quiet .
# two workers (pytest-xdist): a module's tests on one worker, so its app server and trainings stay
# shared by their tests; modules in tests/conftest.py's order (longest tiers first), not xdist's (most tests first)
exec python -m pytest -n 2 --dist loadgroup --no-loadscope-reorder "$@"
