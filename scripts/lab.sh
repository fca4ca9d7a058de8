#!/usr/bin/env bash
# Open JupyterLab on notebooks/ (installs jupyterlab into .venv the first time). As root (a container, CI-like
# machines) it adds --allow-root, which Jupyter otherwise demands. Extra arguments go to jupyter lab
# (e.g. --no-browser --ip=0.0.0.0 --port=8888).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=${EXTRAS:-test,notebooks,lab} bash scripts/setup.sh
args=()
if [ "$(id -u)" = 0 ]; then args+=(--allow-root); fi
exec .venv/bin/python -m jupyter lab ${args[@]+"${args[@]}"} notebooks/ "$@"
