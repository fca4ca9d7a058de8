#!/usr/bin/env bash
# Run every encoder kernel under compute-sanitizer's four tools and print one verdict line per tool:
#
#   bash scripts/sanitize.sh                      # memcheck, racecheck, synccheck, initcheck over all cases
#   TOOLS="memcheck" bash scripts/sanitize.sh     # some tools only
#   bash scripts/sanitize.sh --only 'C776'        # arguments go to the driver (scripts/sanitize_kernels.py)
#
# Prints e.g. "memcheck: 0 errors in 78 cases" and exits non-zero if any tool found an error, if a case gave a
# wrong result, or if a run did not finish. Full logs stay in $LOG_DIR (printed at the end).
#
# Environment:
#   COMPUTE_SANITIZER  the sanitizer binary (default: on PATH, else under $CUDA_HOME or /usr/local/cuda)
#   PYTHON             the interpreter that has CuPy (default: python3)
#   TOOLS              which tools, space separated (default: all four)
#   LOG_DIR            where logs go (default: a fresh folder under ${TMPDIR:-/tmp})
#   SANITIZER_FLAGS    extra flags for every tool
#
# Flags, and why:
#   --error-exitcode 1          a tool that finds an error makes the run fail, whatever the driver returns
#   --target-processes all      also follow child processes (CuPy may spawn the NVRTC/compiler helpers)
#   --report-api-errors no      a failing CUDA API call already raises in CuPy, and the driver counts a case
#                               that raises as wrong; the sanitizer's own API-error reports would only repeat
#                               those or flag CuPy's internal probing calls, which are not kernel bugs
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
TOOLS=${TOOLS:-"memcheck racecheck synccheck initcheck"}
LOG_DIR=${LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/gpt2enc-sanitize.XXXXXX")}
DRIVER="$ROOT/scripts/sanitize_kernels.py"

find_sanitizer() {
    if [ -n "${COMPUTE_SANITIZER:-}" ]; then echo "$COMPUTE_SANITIZER"; return; fi
    if command -v compute-sanitizer >/dev/null 2>&1; then command -v compute-sanitizer; return; fi
    for dir in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
        for candidate in "$dir/bin/compute-sanitizer" "$dir/compute-sanitizer/compute-sanitizer"; do
            if [ -n "$dir" ] && [ -x "$candidate" ]; then echo "$candidate"; return; fi
        done
    done
}

SANITIZER=$(find_sanitizer)
if [ -z "$SANITIZER" ]; then
    echo "compute-sanitizer not found: put it on PATH or set COMPUTE_SANITIZER=/path/to/compute-sanitizer" >&2
    exit 2
fi
mkdir -p "$LOG_DIR"
echo "sanitizer: $SANITIZER ($("$SANITIZER" --version 2>/dev/null | grep -i version | head -n 1))"
# The case list, without a GPU: a broken driver fails here, before any tool runs.
"$PYTHON" "$DRIVER" --dry-run "$@" >"$LOG_DIR/cases.txt" || { cat "$LOG_DIR/cases.txt"; exit 2; }
echo "cases: $(tail -n 1 "$LOG_DIR/cases.txt")"

status=0
for tool in $TOOLS; do
    log="$LOG_DIR/$tool.log"
    start=$SECONDS
    # shellcheck disable=SC2086  # SANITIZER_FLAGS is a list of flags
    PYTHONUNBUFFERED=1 "$SANITIZER" --tool "$tool" --error-exitcode 1 --target-processes all \
        --report-api-errors no ${SANITIZER_FLAGS:-} "$PYTHON" "$DRIVER" "$@" >"$log" 2>&1
    rc=$?
    if ! "$PYTHON" "$DRIVER" --summarize "$tool" "$log" --exit-code "$rc" | sed "s/\$/ [$((SECONDS - start)) s]/"; then
        status=1
        grep -E "^(WRONG|=========)" "$log" | head -n 20 | sed 's/^/    /'
    fi
done
echo "logs: $LOG_DIR"
exit $status
