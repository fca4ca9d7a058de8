#!/usr/bin/env bash
# Create (or reuse) .venv and install the package with the extras named in $EXTRAS (default: test,notebooks).
# Adds CuPy only when an NVIDIA driver is present and CuPy is not importable yet (pick the wheel with CUPY=...).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
EXTRAS=${EXTRAS:-test,notebooks}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[${EXTRAS}]"
if command -v nvidia-smi >/dev/null 2>&1 && ! .venv/bin/python -c "import cupy" 2>/dev/null; then
  .venv/bin/python -m pip install -q "${CUPY:-cupy-cuda13x}"
fi
.venv/bin/python -c "import gpt2enc_edu; print('gpt2enc_edu', gpt2enc_edu.__version__, '-', gpt2enc_edu.gpu_status())"
