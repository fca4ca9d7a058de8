#!/usr/bin/env python3
"""Launch every encoder kernel once per case, for compute-sanitizer: the driver ``scripts/sanitize.sh`` runs.

    python3 scripts/sanitize_kernels.py --dry-run          # list the cases (no GPU needed)
    python3 scripts/sanitize_kernels.py                    # run them all (needs CuPy and a GPU)
    python3 scripts/sanitize_kernels.py --only 'C776'      # a subset, by regular expression on the name
    bash scripts/sanitize.sh                               # all of it under memcheck/racecheck/synccheck/initcheck

A case is a name and a function that launches kernels and checks what they wrote: the forward, every backward
method of ``methods.METHODS`` (atomic fp32, atomic bf16, and the deterministic methods, whose wpe, bucketing
and wte kernels run with the bucket table built both on the CPU and on the GPU), in both storage dtypes, over
ordinary and odd shapes (B=1, T=1, C=8, C=776, one-item buckets, a bucket of thousands of items). Every call
goes through the public API, so a kernel the package adds later behind a method is covered with no change
here; a case for something else is one ``register(Case(...))`` away (see ``--extra``).

Coverage: every ``extern "C" __global__`` kernel in ``kernels/*.cu`` must be launched by some case. Each case
declares the kernels it launches; ``--dry-run`` lists any kernel no case declares and exits 1 (so
``sanitize.sh`` stops before any tool runs), and a real run records the kernels each case fetches
(``get_kernel`` is wrapped) and counts a case as wrong if a kernel it declares did not run, and the run as
failed if a kernel in ``kernels/`` was never launched. A new kernel therefore needs a case (or a declaration
on an existing one) before the sanitizer run passes.

Results are checked too (deterministic kernels bitwise against the NumPy mirror, atomics within the error
bound of the float64 reference), so a run under a sanitizer also shows the kernels computed the right thing.

Memory: by default the driver turns CuPy's memory pool off (``cupy.cuda.set_allocator(None)``), so every
array is its own ``cudaMalloc``. With the pool, one big allocation holds many arrays: memcheck could not see an
overrun from one array into its neighbour, and initcheck could not see a read of a fresh array whose memory
the pool had initialised for an earlier one. ``--allocator pool`` keeps the pool (for comparison).

The last line a successful run prints starts with ``DONE_MARKER``; ``--summarize TOOL LOG`` reads a sanitizer
log and prints the one-line verdict that ``sanitize.sh`` shows.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "scripts"):  # the checkout's package, and the case kinds beside this file
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import numpy as np  # noqa: E402
from sanitize_cases import (  # noqa: E402
    Case,
    atomic_fp32_plain_case,
    backward_case,
    bench_spin_case,
    bucketed_forms,
    chunk_walks,
    forward_case,
    forward_versions,
    kernel_names,
    route_case,
    routes_for,
    table_places,
    token_ids_case,
    wpe_grid_case,
    wte_form_case,
)

from gpt2enc_edu.methods import METHODS, deterministic_methods  # noqa: E402
from gpt2enc_edu.rounding import bfloat16  # noqa: E402

__all__ = ["CASES", "DONE_MARKER", "Case", "kernel_names", "main", "register", "summarize"]

DONE_MARKER = "SANITIZE-DRIVER-DONE"

#: The cases, in the order they run. Add more with ``register``.
CASES: list[Case] = []


def register(case: Case) -> Case:
    """Append ``case`` to ``CASES``; names must be unique."""
    if any(c.name == case.name for c in CASES):
        raise ValueError(f"a sanitizer case named {case.name!r} already exists")
    CASES.append(case)
    return case



DTYPES = {"bf16": np.dtype(bfloat16), "fp32": np.dtype(np.float32)}
#: name: (B, T, C, V, maxT, ids). Small on purpose: every launch runs instrumented, four times over.
SHAPES = {
    "B1-T1-C8": (1, 1, 8, 5, 1, "uniform"),
    "ordinary": (4, 64, 768, 1000, 64, "zipf"),
    "B1-C776": (1, 37, 776, 300, 40, "uniform"),
    "T1": (3, 1, 64, 1000, 4, "uniform"),
    "one-item-buckets": (2, 3, 264, 50257, 3, "uniform"),
    # two tokens of about 8192 positions: 256 chunks each, so the combine kernel's slices take two stages
    "thousands-per-bucket": (16, 1024, 64, 2, 1024, "uniform"),
    # past the one-block bucketing kernel's limits (BT > 8192, V > 65536): the cooperative bucketing kernel
    "big-bucketing": (3, 3000, 64, 70000, 3000, "zipf"),
}
DETERMINISTIC = deterministic_methods()


def default_cases() -> list[Case]:
    """Every op x dtype x shape the encoder offers (building the list needs no GPU)."""
    cases = []
    for shape_name, shape in SHAPES.items():
        for dtype_name, dtype in DTYPES.items():
            C = shape[2]
            if C % (16 // dtype.itemsize):
                continue
            cases.append(forward_case(f"forward/{dtype_name}/{shape_name}", shape, dtype))
            for version in forward_versions():
                cases.append(forward_case(f"forward-v{version}/{dtype_name}/{shape_name}", shape, dtype, version))
            for method in METHODS:
                if not METHODS[method].takes(dtype):
                    continue
                bucketings = table_places() if method in DETERMINISTIC else (None,)
                for bucketing in bucketings:
                    op = f"backward-{method}" + (f"-{bucketing}" if bucketing else "")
                    cases.append(backward_case(f"{op}/{dtype_name}/{shape_name}", shape, dtype, method, bucketing))
            if shape_name in ("ordinary", "B1-C776"):
                cases.append(wpe_grid_case(f"wpe-grid-stride/{dtype_name}/{shape_name}", shape, dtype))
            if shape_name in ("B1-T1-C8", "ordinary", "B1-C776", "thousands-per-bucket"):
                cases.append(atomic_fp32_plain_case(f"atomic-fp32-plain/{dtype_name}/{shape_name}", shape, dtype))
            if "chunked" in DETERMINISTIC and shape_name in ("ordinary", "B1-C776", "thousands-per-bucket"):
                for walk in chunk_walks():
                    cases.append(wte_form_case(f"chunk-walk-{walk}/{dtype_name}/{shape_name}", shape, dtype, "chunked",
                                                 walk))
            if "bucketed" in DETERMINISTIC and shape_name in ("ordinary", "B1-C776", "thousands-per-bucket"):
                for form in bucketed_forms():
                    cases.append(wte_form_case(f"bucketed-{form}/{dtype_name}/{shape_name}", shape, dtype, "bucketed",
                                                 form))
            if shape_name in ("B1-T1-C8", "ordinary", "one-item-buckets", "thousands-per-bucket", "big-bucketing"):
                for route in routes_for(shape):
                    cases.append(route_case(f"bucketing-{route}/{dtype_name}/{shape_name}", shape, dtype, route))
    # The one-launch chunked backward's longest path: one sequence of 3 distinct ids, so every token is a block task
    # of 11 chunks (two passes of 8), in 2 channel groups, the second with idle threads.
    for dtype_name, dtype in DTYPES.items():
        C = 264 if dtype.itemsize == 2 else 132
        cases.append(backward_case(f"backward-chunked-gpu/{dtype_name}/one-sequence-3-ids",
                                    (1, 1024, C, 3, 1024, "uniform"), dtype, "chunked", "gpu"))
    if "bench_spin_kernel" in kernel_names():
        cases.append(bench_spin_case())
    cases.append(token_ids_case())
    return cases


def uncovered_kernels(cases: list[Case]) -> dict[str, str]:
    """Kernels of ``kernels/*.cu`` that no case in ``cases`` declares: {kernel name: file name}."""
    declared = set().union(*(case.kernels for case in cases))
    return {name: file for name, file in kernel_names().items() if name not in declared}


def record_kernel_fetches(fetched: set) -> None:
    """Wrap ``loader.get_kernel`` wherever the package imported it, adding each fetched kernel's name to ``fetched``.

    The launchers fetch a kernel right before launching it, so a case's fetches are the kernels it launched.
    """
    from gpt2enc_edu import loader

    original = loader.get_kernel

    def recording(file_name, kernel_name, dtype):
        fetched.add(kernel_name)
        return original(file_name, kernel_name, dtype)

    for module in list(sys.modules.values()):
        in_package = getattr(module, "__name__", "").startswith("gpt2enc_edu")
        if in_package and getattr(module, "get_kernel", None) is original:
            module.get_kernel = recording


for _case in default_cases():
    register(_case)



# ----------------------------------------------------------------------------------------------------------
# reading a sanitizer log


def summarize(tool: str, text: str, exit_code: int | None = None) -> tuple[str, bool]:
    """One line for ``tool``'s log ``text`` (e.g. ``memcheck: 0 errors``) and whether the run was clean.

    Clean means: the sanitizer printed its summary, it counts 0 errors (racecheck: 0 hazards, warnings
    included), the driver reached its last line with no wrong result, and the exit code (if given) is 0.
    """
    error_counts = [int(n) for n in re.findall(r"ERROR SUMMARY:\s*(\d+) errors?", text)]
    races = [tuple(map(int, r)) for r in
             re.findall(r"RACECHECK SUMMARY:\s*(\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)", text)]
    done = re.search(rf"^{DONE_MARKER}: (\d+) cases, (\d+) wrong", text, re.M)
    if tool == "racecheck" and races:
        errors = sum(e + w for _, e, w in races)
        detail = " ({} hazards: {} errors, {} warnings)".format(*map(sum, zip(*races)))
    else:
        errors, detail = sum(error_counts), ""
    problems = []
    if not error_counts and not races:
        problems.append("no sanitizer summary in the log (did compute-sanitizer attach to the GPU?)")
    if done is None:
        problems.append("the driver did not finish")
    elif int(done.group(2)):
        problems.append(f"{done.group(2)} of {done.group(1)} cases gave wrong results")
    if exit_code not in (None, 0) and not errors:
        problems.append(f"exit code {exit_code}")
    line = f"{tool}: {errors} errors{detail}"
    if done is not None:
        line += f" in {done.group(1)} cases"
    if problems:
        line += " - FAILED: " + "; ".join(problems)
    return line, errors == 0 and not problems


# ----------------------------------------------------------------------------------------------------------
# main


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", "--list", action="store_true", dest="dry_run",
                        help="print the cases that would run and exit (no GPU needed)")
    parser.add_argument("--only", metavar="REGEX", default="", help="run only cases whose name matches")
    parser.add_argument("--extra", metavar="MODULE", action="append", default=[],
                        help="import MODULE first; it may register() more cases (repeatable)")
    parser.add_argument("--allocator", choices=("plain", "pool"), default="plain",
                        help="plain: one cudaMalloc per array (default, see the module docstring); pool: CuPy's")
    parser.add_argument("--no-check", action="store_true", help="launch only, do not compare results")
    parser.add_argument("--summarize", nargs=2, metavar=("TOOL", "LOG"),
                        help="print the verdict line for a sanitizer log and exit 0 if clean, 1 if not")
    parser.add_argument("--exit-code", type=int, default=None, help="with --summarize: the sanitizer's exit code")
    return parser


def _warm_up(selected: list[Case]) -> float:
    """Compile the kernels before the cases run: one unchecked launch of each selected op on the smallest shape.

    A failure here is only printed; the case itself reports it when it runs.
    """
    start = time.perf_counter()
    by_name = {case.name: case for case in CASES}
    for op_dtype in dict.fromkeys(case.name.rsplit("/", 1)[0] for case in selected):
        smallest = by_name.get(f"{op_dtype}/B1-T1-C8")
        if smallest is None:
            continue
        try:
            smallest.run(False)
        except Exception as exc:
            print(f"warm-up of {smallest.name} raised {type(exc).__name__}: {exc}", flush=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.summarize:
        tool, log = args.summarize
        line, clean = summarize(tool, Path(log).read_text(errors="replace"), args.exit_code)
        print(line)
        return 0 if clean else 1
    for module in args.extra:
        importlib.import_module(module)
    selected = [c for c in CASES if re.search(args.only, c.name)]
    if not selected:
        print(f"no case matches {args.only!r}", file=sys.stderr)
        return 2
    whole_list = not args.only  # coverage is judged on the whole list only
    if args.dry_run:
        for case in selected:
            print(f"{case.name:55s} {case.description}")
        uncovered = uncovered_kernels(selected) if whole_list else {}
        for name, file in uncovered.items():
            print(f"UNCOVERED kernel {name} (kernels/{file}): no case launches it; add one (see register)")
        print(f"{len(selected)} cases, {len(kernel_names()) - len(uncovered)} of {len(kernel_names())} kernels covered")
        return 1 if uncovered else 0

    import cupy

    if args.allocator == "plain":
        cupy.cuda.set_allocator(None)
    print(f"compiled kernels in {_warm_up(selected):.1f} s", flush=True)
    fetched: set = set()
    launched: set = set()
    record_kernel_fetches(fetched)
    wrong = 0
    for case in selected:
        start = time.perf_counter()
        fetched.clear()
        try:
            problem = case.run(not args.no_check)
            cupy.cuda.Device().synchronize()
        except Exception as exc:  # report and go on: one broken case must not hide the others
            problem = f"raised {type(exc).__name__}: {exc}"
        launched |= fetched
        missing = sorted(case.kernels - fetched)
        if problem is None and missing:
            problem = f"declares kernels it did not launch: {', '.join(missing)}"
        wrong += problem is not None
        verdict = "ok   " if problem is None else "WRONG"
        print(f"{verdict} {case.name} ({time.perf_counter() - start:.2f} s){'' if problem is None else ': ' + problem}",
              flush=True)
    cupy.cuda.Device().synchronize()
    never = sorted(set(kernel_names()) - launched) if whole_list else []
    for name in never:
        print(f"WRONG kernel {name} was never launched by any case", flush=True)
    wrong += len(never)
    print(f"{DONE_MARKER}: {len(selected)} cases, {wrong} wrong", flush=True)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
