#!/usr/bin/env bash
# nbval over the notebooks as a user of the wheel meets them: the package installed from a wheel built here (not
# imported from this checkout), the notebooks copied to a folder with no checkout above it. Catches a notebook that
# reads a file the wheel does not carry. Part of the test command (scripts/test.sh); NBVAL_INSTALLED=0 skips it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
case $PY in /*) ;; */*) PY="$PWD/$PY" ;; esac  # a path relative to the checkout, kept valid after the cd below
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PY" -m pip wheel -q --no-deps -w "$work/wheel" .
"$PY" -c 'import glob, sys, zipfile; zipfile.ZipFile(*glob.glob(sys.argv[1] + "/*.whl")).extractall(sys.argv[2])' \
  "$work/wheel" "$work/site"
mkdir "$work/notebooks"
cp notebooks/*.ipynb "$work/notebooks/"
cd "$work/notebooks"
export PYTHONPATH="$work/site"
# the installed copy, not the checkout's editable one, is what the notebooks will import
"$PY" -c 'import gpt2enc_edu, sys; p = gpt2enc_edu.__file__
if not p.startswith(sys.argv[1]): sys.exit(f"gpt2enc_edu imports from {p}, not from the wheel in {sys.argv[1]}")' \
  "$work/site"
"$PY" -m pytest -q -p no:cacheprovider --nbval-lax --nbval-current-env .
