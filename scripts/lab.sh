#!/usr/bin/env bash
# Open JupyterLab on notebooks/ (installs jupyterlab into .venv the first time).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=${EXTRAS:-test,notebooks,lab} bash scripts/setup.sh
exec .venv/bin/python -m jupyter lab notebooks/ "$@"
