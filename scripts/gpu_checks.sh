#!/usr/bin/env bash
# Every GPU-side check behind the claims in README.md and docs/, in one command, on a machine with a CUDA GPU:
#
#   bash scripts/gpu_checks.sh [LOG_DIR]        (default LOG_DIR: _gpu_checks/)
#
# 1. (in parallel: none of these times anything)
#    the GPU tests (mark "gpu"), one pytest process per test file (a crash in one cannot hide the others);
#    compute-sanitizer's four tools over every kernel (scripts/sanitize.sh, one process per tool);
#    nbval on the GPU (the notebooks' NBVAL_CHECK_OUTPUT cells against the stored outputs).
# 2. (alone) the full benchmark (docs/bench/, the README's table, the tables of docs/performance.md) and the
#    walkthrough's committed numbers (docs/walkthrough/).
# 3. (alone) every notebook executed in place, so the stored outputs come from this GPU in one run.
# Each step's log goes to LOG_DIR; summary.txt collects the verdict lines. Exit status: non-zero if any step failed.
# Environment: PY (default python3), PHASE_TIMEOUT (seconds per step of phase 1, default 300), PHASES (which of
# 1, 2, 3 to run, default 123: a lease too short for all of them can take 1, then 23, in two calls).
set -u -o pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
LOG=${1:-_gpu_checks}
mkdir -p "$LOG"
summary="$LOG/summary.txt"
: >"$summary"
status=0
note() { echo "$*" | tee -a "$summary"; }
export PYTHONUNBUFFERED=1

PHASES=${PHASES:-123}

# 1. tests, sanitizer, nbval side by side
if [[ $PHASES == *1* ]]; then
(
  for f in tests/test_*.py; do
    name=$(basename "$f" .py)
    timeout "${PHASE_TIMEOUT:-300}" "$PY" -m pytest -q -m gpu -p no:cacheprovider "$f" >"$LOG/$name.log" 2>&1
    rc=$?
    [ $rc = 5 ] || echo "$name: rc=$rc $(tail -n 1 "$LOG/$name.log")"  # 5: the file has no GPU tests
  done
) >"$LOG/gpu_tests.txt" 2>&1 &
tests_pid=$!
sanitize_pids=()
for tool in memcheck racecheck synccheck initcheck; do
  TOOLS=$tool LOG_DIR="$LOG/sanitizer-$tool" PYTHON="$PY" timeout "${PHASE_TIMEOUT:-300}" bash scripts/sanitize.sh \
    >"$LOG/sanitize-$tool.txt" 2>&1 &
  sanitize_pids+=($!)
done
timeout "${PHASE_TIMEOUT:-300}" "$PY" -m pytest -q -p no:cacheprovider --nbval-lax --nbval-current-env notebooks/ \
  >"$LOG/nbval_gpu.log" 2>&1 &
nbval_pid=$!
wait $tests_pid
cat "$LOG/gpu_tests.txt" | tee -a "$summary"
grep -q "rc=[^0]" "$LOG/gpu_tests.txt" && status=1
for i in 0 1 2 3; do
  wait "${sanitize_pids[$i]}" || status=1
done
for tool in memcheck racecheck synccheck initcheck; do note "$(grep -E "^$tool:" "$LOG/sanitize-$tool.txt" || echo "$tool: did not finish (see sanitize-$tool.txt)")"; done
wait $nbval_pid || status=1
note "nbval on the GPU: $(tail -n 1 "$LOG/nbval_gpu.log")"
fi

# 2. timings, alone on the GPU
if [[ $PHASES == *2* ]]; then
"$PY" -m gpt2enc_edu.bench --no-progress --out docs/bench --readme README.md >"$LOG/bench.log" 2>&1 || status=1
note "bench: rc=$? $(tail -n 1 "$LOG/bench.log")"
"$PY" -m gpt2enc_edu.bench.perfdoc >"$LOG/perfdoc.log" 2>&1 || status=1
note "docs/performance.md tables: $(tail -n 1 "$LOG/perfdoc.log")"
"$PY" -m gpt2enc_edu.course.measured --out docs/walkthrough >"$LOG/measured.log" 2>&1 || status=1
note "walkthrough numbers: $(tail -n 1 "$LOG/measured.log")"
fi

# 3. the stored notebook outputs
if [[ $PHASES == *3* ]]; then
# nbconvert as a module: where the tools were installed with `pip install --target` (a GPU machine without network),
# the `jupyter-nbconvert` script that `jupyter nbconvert` looks for is not on PATH.
for nb in notebooks/[0-9]*.ipynb; do
  "$PY" -m nbconvert --to notebook --execute --inplace --ExecutePreprocessor.timeout=600 "$nb" \
    >"$LOG/execute-$(basename "$nb" .ipynb).log" 2>&1
  rc=$?
  [ $rc = 0 ] || status=1
  note "executed $nb: rc=$rc"
done
"$PY" scripts/check_notebooks.py --fix >/dev/null 2>&1
fi
exit $status
