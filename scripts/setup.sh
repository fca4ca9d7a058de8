#!/usr/bin/env bash
# Create (or reuse) .venv and install the package with the extras named in $EXTRAS (default: test,notebooks).
# Adds CuPy when an NVIDIA driver answers and CuPy is not importable yet (pick the wheel with CUPY=..., default
# cupy-cuda13x), and PyTorch when TORCH names what to install (TORCH=torch, or a wheel file).
# The pip work (~6 s) runs only when something changed: a stamp in .venv/ records a hash of pyproject.toml, the
# extras, CUPY, TORCH, the GPU's presence and the Python. FORCE=1 reinstalls anyway.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
EXTRAS=${EXTRAS:-test,notebooks}
GPU=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then GPU=1; fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
key=$({ cat pyproject.toml; echo "extras=$EXTRAS cupy=${CUPY:-} torch=${TORCH:-} gpu=$GPU"; .venv/bin/python -VV; } \
  | .venv/bin/python -c "import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest()[:16])")
stamp=.venv/.gpt2enc-setup-$key
if [ "${FORCE:-0}" = 1 ] || [ ! -e "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[${EXTRAS}]"
  if [ "$GPU" = 1 ] && ! .venv/bin/python -c "import cupy" 2>/dev/null; then
    .venv/bin/python -m pip install -q "${CUPY:-cupy-cuda13x}"
  fi
  if [ -n "${TORCH:-}" ]; then
    .venv/bin/python -m pip install -q "$TORCH"
  fi
  touch "$stamp"
fi
.venv/bin/python -c "import gpt2enc_edu; print('gpt2enc_edu', gpt2enc_edu.__version__, '-', gpt2enc_edu.gpu_status())"
