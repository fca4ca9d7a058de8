#!/usr/bin/env bash
# Style checks, run by scripts/test.sh: ruff over the Python (pyproject.toml [tool.ruff], line length 120) and
# clang-format over the CUDA of kernels/ and scripts/experiments/ (.clang-format). Each runs only where it is
# installed (the `test` extra installs both), and says so where it is not. Fix with:  ruff check --fix .  and
#   clang-format -i kernels/*.cu kernels/*.cuh scripts/experiments/*.cu
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-$(dirname "${PY:-.venv/bin/python}")}
find_tool() { if [ -x "$BIN/$1" ]; then echo "$BIN/$1"; elif command -v "$1" >/dev/null 2>&1; then command -v "$1"; fi; }
# Each check's failure is kept (a failing command on the left of && would not stop `set -e`), and the script
# exits non-zero if either failed.
status=0
ruff=$(find_tool ruff)
if [ -z "$ruff" ]; then
  echo "ruff: not installed, skipped"
elif "$ruff" check --quiet .; then
  echo "ruff: ok"
else
  echo "ruff: failed"
  status=1
fi
clang_format=$(find_tool clang-format)
if [ -z "$clang_format" ]; then
  echo "clang-format: not installed, skipped"
elif "$clang_format" --dry-run -Werror kernels/*.cu kernels/*.cuh scripts/experiments/*.cu; then
  echo "clang-format: ok"
else
  echo "clang-format: failed"
  status=1
fi
exit $status
