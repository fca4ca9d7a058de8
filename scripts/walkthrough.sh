#!/usr/bin/env bash
# The main job: run the whole walkthrough headless on whatever backend is present (CUDA if CuPy sees a GPU,
# else the NumPy mirror) and write a rendered copy of every notebook, figures included, to _rendered/
# (scripts/render_notebooks.py: nbconvert's execution and HTML export, with alternative text on the figures).
# The committed notebooks are not modified. Then the short demo checks every kernel once more.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${SKIP_SETUP:-0}" != 1 ]; then bash scripts/setup.sh; fi
PY=${PY:-.venv/bin/python}
# (no MPLBACKEND here: notebook kernels must use the inline backend so figures are embedded)
"$PY" scripts/render_notebooks.py --out _rendered --timeout 900 notebooks/[0-9]*.ipynb
"$PY" -m gpt2enc_edu.demo
echo "rendered notebooks: $(pwd)/_rendered/"
