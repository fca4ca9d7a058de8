#!/usr/bin/env bash
# Style checks, run by scripts/test.sh: ruff over the Python (pyproject.toml [tool.ruff], line length 120) and
# clang-format over kernels/ (.clang-format). Each runs only where it is installed (the `test` extra installs
# both), and says so where it is not. Fix with:  ruff check --fix .  and  clang-format -i kernels/*.cu kernels/*.cuh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-$(dirname "${PY:-.venv/bin/python}")}
find_tool() { if [ -x "$BIN/$1" ]; then echo "$BIN/$1"; elif command -v "$1" >/dev/null 2>&1; then command -v "$1"; fi; }
ruff=$(find_tool ruff)
if [ -n "$ruff" ]; then "$ruff" check --quiet . && echo "ruff: ok"; else echo "ruff: not installed, skipped"; fi
clang_format=$(find_tool clang-format)
if [ -n "$clang_format" ]; then
  "$clang_format" --dry-run -Werror kernels/*.cu kernels/*.cuh && echo "clang-format: ok"
else
  echo "clang-format: not installed, skipped"
fi
