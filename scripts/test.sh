#!/usr/bin/env bash
# The test command: set up .venv, then unit/property tests, the nvcc compile check, the notebooks under nbval,
# and the jupytext pairing check. GPU tests (pytest mark "gpu") run where CuPy sees a GPU, else they skip.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${SKIP_SETUP:-0}" != 1 ]; then bash scripts/setup.sh; fi
PY=${PY:-.venv/bin/python}
# 1. notebooks and their jupytext .py twins must say the same thing
for py in notebooks/[0-9]*.py; do
  diff_out=$("$PY" -m jupytext --diff "$py" "${py%.py}.ipynb" 2>&1) || true
  if [ -n "$diff_out" ]; then echo "$py and its .ipynb are out of sync (run: jupytext --sync $py):"; echo "$diff_out"; exit 1; fi
done
# 2. no notebook over 1 MB
for nb in notebooks/*.ipynb; do
  size=$(wc -c <"$nb"); if [ "$size" -gt 1048576 ]; then echo "$nb is $size bytes (> 1 MB)"; exit 1; fi
done
# 3. the tests and the notebooks (nbval compares the cells marked NBVAL_CHECK_OUTPUT with the stored GPU output)
"$PY" -m pytest -q tests/ --nbval-lax --nbval-current-env notebooks/ "$@"
