#!/usr/bin/env bash
# The test command: set up .venv, then unit/property tests, the nvcc compile check, the notebooks under nbval (from
# the checkout, then from an installed wheel), and the jupytext pairing check. GPU tests (pytest mark "gpu") run
# where CuPy sees a GPU, else they skip.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${SKIP_SETUP:-0}" != 1 ]; then bash scripts/setup.sh; fi
PY=${PY:-.venv/bin/python}
# 1. style (ruff, clang-format) where installed; notebooks: jupytext twins in sync, none over 1 MB, no stray metadata
lint=0
PY="$PY" bash scripts/lint.sh || lint=$?
"$PY" scripts/check_notebooks.py
# 2. the tests and the notebooks (nbval compares the cells marked NBVAL_CHECK_OUTPUT with the stored GPU output)
"$PY" -m pytest -q tests/ --nbval-lax --nbval-current-env notebooks/ "$@"
# 3. nbval again with the package installed from a wheel, as a user of the wheel runs the notebooks
if [ "${NBVAL_INSTALLED:-1}" != 0 ]; then PY="$PY" bash scripts/nbval_installed.sh; fi
# style problems fail the command too, after the tests have had their say
if [ "$lint" != 0 ]; then echo "style checks failed (see above): ruff check --fix . / clang-format -i kernels/*" >&2; exit "$lint"; fi
