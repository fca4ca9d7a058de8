#!/usr/bin/env python3
"""Launch every encoder kernel once per case, for compute-sanitizer: the driver ``scripts/sanitize.sh`` runs.

    python3 scripts/sanitize_kernels.py --dry-run          # list the cases (no GPU needed)
    python3 scripts/sanitize_kernels.py                    # run them all (needs CuPy and a GPU)
    python3 scripts/sanitize_kernels.py --only 'C776'      # a subset, by regular expression on the name
    bash scripts/sanitize.sh                               # all of it under memcheck/racecheck/synccheck/initcheck

A case is a name and a function that launches kernels and checks what they wrote: the forward, every backward
method of ``validate.METHODS`` (atomic fp32, atomic bf16, and the deterministic methods, whose wpe, bucketing
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
import inspect
import re
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the checkout's package, also when run as scripts/sanitize_kernels.py

import numpy as np  # noqa: E402

import gpt2enc_edu as enc  # noqa: E402
from gpt2enc_edu import compare, reference, validate  # noqa: E402
from gpt2enc_edu.buckets import reorder_buckets  # noqa: E402
from gpt2enc_edu.problems import count_poison, poisoned, random_problem  # noqa: E402
from gpt2enc_edu.rounding import bfloat16  # noqa: E402

DONE_MARKER = "SANITIZE-DRIVER-DONE"


@dataclass(frozen=True)
class Case:
    """One named piece of GPU work.

    ``run(check)`` launches the kernels (importing CuPy itself) and, when ``check`` is true, returns ``None``
    if the results are right or a sentence saying what is wrong. It must leave no work pending that a later
    case relies on; the driver synchronizes the device after every case.
    """

    name: str
    run: Callable[[bool], str | None]
    description: str = ""
    kernels: frozenset = frozenset()  #: the names of the kernels it launches (checked when it runs)


#: The cases, in the order they run. Add more with ``register``.
CASES: list[Case] = []


def register(case: Case) -> Case:
    """Append ``case`` to ``CASES``; names must be unique."""
    if any(c.name == case.name for c in CASES):
        raise ValueError(f"a sanitizer case named {case.name!r} already exists")
    CASES.append(case)
    return case


# ----------------------------------------------------------------------------------------------------------
# the encoder's cases

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
DETERMINISTIC = tuple(m for m in ("bucketed", "chunked") if m in validate.METHODS)

#: ``extern "C" __global__ void [__launch_bounds__(...)] name(`` across lines.
KERNEL_DECLARATION = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(')


def kernel_names(folder: Path = ROOT / "kernels") -> dict[str, str]:
    """Every kernel defined in ``folder/*.cu``: {kernel name: file name}."""
    found = {}
    for path in sorted(folder.glob("*.cu")):
        for name in KERNEL_DECLARATION.findall(path.read_text()):
            found[name] = path.name
    return found


#: The kernels of each GPU bucketing route (``buckets.gpu.ROUTES``).
ROUTE_KERNELS = {
    "scatter": frozenset({"scatter_count_kernel", "scatter_classify_kernel", "scatter_rows_kernel",
                          "scatter_positions_kernel", "scatter_sort_kernel"}),
    "cooperative": frozenset({"bucketing_kernel"}),
    "small": frozenset({"bucketing_small_kernel"}),
}


def _bucketing_kernels(BT: int, V: int) -> frozenset:
    """The GPU bucketing kernels ``buckets.gpu`` launches by itself for BT ids of a vocabulary of V."""
    from gpt2enc_edu.buckets import gpu as gpu_buckets

    return ROUTE_KERNELS[gpu_buckets.bucketing_route(BT, V)]


def _backward_kernels(method: str, dtype, shape, bucketing: str | None) -> frozenset:
    """The kernels one backward call launches, as ``gpt2enc_edu.cuda`` dispatches today."""
    B, T, _, V, _, _ = shape
    if method == "atomic_bf16":
        return frozenset({"encoder_backward_atomic_bf16_kernel"})
    if method == "atomic":
        if np.dtype(dtype).itemsize == 2:
            return frozenset({"encoder_backward_atomic_widen_kernel", "encoder_backward_atomic_fp32_rows_kernel",
                              "encoder_backward_atomic_narrow_kernel"})
        return frozenset({"encoder_backward_atomic_fp32_rows_kernel"})
    from gpt2enc_edu import cuda

    if cuda.one_launch_backward(method, bucketing or "auto", B * T, V):  # one kernel sorts the ids itself and sums
        return frozenset({"encoder_backward_small_kernel"})
    # chunked: the combine kernel, and one of the chunk kernel's two forms, which the package picks on the GPU
    # (cuda.chunk_walk); the chunk-walk cases launch each form by name. bucketed: one of the warps forms, which the
    # package picks on the GPU by dout's size (cuda.bucketed_form); the bucketed-form cases launch each by name.
    wte = {"encoder_backward_wte_chunk_combine_kernel"} if method == "chunked" else set()
    bucketing_kernels = _bucketing_kernels(B * T, V) if bucketing in ("gpu", "auto", None) else set()
    return frozenset({"encoder_backward_wpe_kernel", *wte, *bucketing_kernels})


def _bucketings() -> tuple[str | None, ...]:
    """Where the bucket table can be built: both places if the API offers the choice."""
    if "bucketing" in inspect.signature(enc.encoder_backward).parameters:
        return ("cpu", "gpu")
    return (None,)


def _problem(name: str, shape, dtype):
    B, T, C, V, maxT, ids = shape
    return random_problem(B, T, C, V, maxT, dtype=dtype, ids=ids, rng=np.random.default_rng(zlib.crc32(name.encode())))


def _forward_versions() -> dict:
    """{version: kernel name} of the forward kernels ``gpt2enc_edu.cuda`` can launch one by one."""
    from gpt2enc_edu import cuda

    return {v: entry[0] for v, entry in getattr(cuda, "FORWARD_VERSIONS", {}).items()}


def _forward_case(name: str, shape, dtype, version: int | None = None) -> Case:
    """The public forward (``version=None``), or one forward kernel version launched directly after validation."""

    def run(check: bool) -> str | None:
        import cupy

        from gpt2enc_edu import cuda

        p = _problem(name, shape, dtype)
        g = p.on(cupy)
        out = poisoned((p.B, p.T, p.C), dtype, cupy)
        if version is None:
            enc.encoder_forward(g.inp, g.wte, g.wpe, out=out)
        else:
            validate.forward_args(g.inp, g.wte, g.wpe, out, True)
            cuda.encoder_forward_version(version, out, g.inp, g.wte, g.wpe, p.B, p.T, p.C)
        cupy.cuda.Device().synchronize()
        if not check:
            return None
        if count_poison(out):
            return f"{count_poison(out)} output elements never written"
        expected = enc.encoder_forward(p.inp, p.wte, p.wpe)
        if not compare.bitwise_equal(out, expected):
            return f"{compare.count_bit_differences(out, expected)} elements differ from the mirror"
        return None

    if version is None:
        return Case(name, run, "encoder_forward (the public call; its kernel is covered by the version cases)")
    kernel = _forward_versions()[version]
    return Case(name, run, kernel, frozenset({kernel}))


def _backward_case(name: str, shape, dtype, method: str, bucketing: str | None) -> Case:
    extra = {} if bucketing is None else {"bucketing": bucketing}

    def run(check: bool) -> str | None:
        import cupy

        _fresh_gpu_tables()
        p = _problem(name, shape, dtype)
        seed = zlib.crc32(name.encode()) ^ 0x5EED
        g = p.on(cupy)
        enc.encoder_backward(g.dwte, g.dwpe, g.dout, g.inp, seed=seed, method=method, **extra)
        cupy.cuda.Device().synchronize()
        if not check:
            return None
        if method in DETERMINISTIC:
            cpu = p.on(np)
            enc.encoder_backward(cpu.dwte, cpu.dwpe, cpu.dout, cpu.inp, seed=seed, method=method)
            for label, got, want in (("dwte", g.dwte, cpu.dwte), ("dwpe", g.dwpe, cpu.dwpe)):
                if not compare.bitwise_equal(got, want):
                    return f"{label}: {compare.count_bit_differences(got, want)} elements differ from the mirror"
            return None
        ref = reference.backward(p.dwte, p.dwpe, p.dout, p.inp)
        per_add = method == "atomic_bf16"
        for label, got, want, magnitude in (("dwte", g.dwte, ref.dwte, ref.dwte_abs),
                                            ("dwpe", g.dwpe, ref.dwpe, ref.dwpe_abs)):
            bound = compare.error_bound(dtype, magnitude, ref.max_terms, rounding_per_add=per_add)
            if not compare.within_bound(got, want, bound):
                return f"{label}: outside the error bound of the float64 reference"
        return None

    atomic_fp32 = "atomic fp32 rows kernel" + (" between the widen and narrow kernels (bf16 storage)"
                                               if dtype.itemsize == 2 else "")
    launched = _backward_kernels(method, dtype, shape, bucketing)
    kernels = {"atomic": atomic_fp32, "atomic_bf16": "atomic bf16 kernel"}.get(
        method, f"wpe kernel + {method} wte kernel, bucket table built on the {bucketing or 'default side'}")
    if "encoder_backward_small_kernel" in launched:
        kernels = "the chunked backward in one launch (its own sort of the ids, dwte, dwpe)"
    return Case(name, run, kernels, launched)


def _atomic_fp32_plain_case(name: str, shape, dtype) -> Case:
    """``encoder_backward_atomic_fp32_kernel``, the one-pack-per-thread atomic kernel notebook 02 teaches (the
    package's route uses the rows kernel): launched directly on fp32 copies after validation."""

    def run(check: bool) -> str | None:
        import cupy

        from gpt2enc_edu.layout import BLOCK_SIZE, ceil_div, pack_size
        from gpt2enc_edu.loader import get_kernel, launch

        p = _problem(name, shape, dtype)
        g = p.on(cupy)
        validate.backward_args(g.dwte, g.dwpe, g.dout, g.inp, 0, "atomic", True)
        dwte32, dwpe32 = g.dwte.astype(cupy.float32), g.dwpe.astype(cupy.float32)
        kernel = get_kernel("encoder_backward_atomic.cu", "encoder_backward_atomic_fp32_kernel", dtype)
        launch(kernel, ceil_div(p.B * p.T * p.C // pack_size(dtype), BLOCK_SIZE), BLOCK_SIZE,
               (dwte32, dwpe32, g.dout, g.inp, np.int32(p.B), np.int32(p.T), np.int32(p.C)))
        cupy.cuda.Device().synchronize()
        if not check:
            return None
        ref = reference.backward(p.dwte, p.dwpe, p.dout, p.inp)
        for label, got, want, magnitude in (("dwte", dwte32, ref.dwte, ref.dwte_abs),
                                            ("dwpe", dwpe32, ref.dwpe, ref.dwpe_abs)):
            if not compare.within_bound(got, want, compare.error_bound(np.float32, magnitude, ref.max_terms)):
                return f"{label}: outside the error bound of the float64 reference"
        return None

    return Case(name, run, "encoder_backward_atomic_fp32_kernel (one pack per thread, as notebook 02 teaches)",
                frozenset({"encoder_backward_atomic_fp32_kernel"}))


def _wpe_grid_case(name: str, shape, dtype) -> Case:
    """The wpe kernel on grids smaller than a thread per pack (1 and 2 blocks: each thread walks several packs,
    as beside the scatter route's table built in the call, where the package gives it a share of the SMs), against
    the mirror."""

    def run(check: bool) -> str | None:
        import cupy

        from gpt2enc_edu import cuda, mirror

        p = _problem(name, shape, dtype)
        seed = zlib.crc32(name.encode()) ^ 0x5EED
        for blocks in (1, 2):
            got = cupy.asarray(p.dwpe)
            cuda.encoder_backward_wpe(got, cupy.asarray(p.dout), p.B, p.T, p.C, seed, blocks=blocks)
            cupy.cuda.Device().synchronize()
            if not check:
                continue
            want = p.dwpe.copy()
            mirror.encoder_backward_wpe(want, p.dout, p.B, p.T, p.C, seed)
            if not compare.bitwise_equal(got.get(), want):
                wrong = compare.count_bit_differences(got.get(), want)
                return f"{blocks} block(s): {wrong} elements differ from the mirror"
        return None

    return Case(name, run, "encoder_backward_wpe_kernel on 1 and 2 blocks (threads walk the packs in turn)",
                frozenset({"encoder_backward_wpe_kernel"}))


def _route_case(name: str, shape, dtype, route: str) -> Case:
    """One GPU bucketing route by name (``build_bucket_table_gpu(route=...)``), its table against NumPy's."""

    def run(check: bool) -> str | None:
        import cupy

        from gpt2enc_edu import buckets
        from gpt2enc_edu.buckets import gpu as gpu_buckets

        _fresh_gpu_tables()
        p = _problem(name, shape, dtype)
        want = buckets.build_bucket_table(p.inp, p.C, dtype) if check else None
        # Three calls: the scatter route launches its kernels one by one, then captures them as a graph and
        # replays it, then replays it again (the other routes launch alike every time). Every table is checked.
        for call in range(3):
            table = gpu_buckets.build_bucket_table_gpu(cupy.asarray(p.inp), p.C, dtype, p.V, route=route).to_host()
            if check:
                wrong = [f for f in ("info", "bt_list", "units")
                         if not np.array_equal(getattr(table, f), getattr(want, f))]
                if wrong:
                    return f"call {call + 1}: {', '.join(wrong)} differ from the NumPy table"
        return None

    return Case(name, run, f"GPU bucket table by the {route} route", ROUTE_KERNELS[route])


def _wte_form_case(name: str, shape, dtype, method: str, form: str) -> Case:
    """One named form of a wte launcher on a NumPy-built table, against the mirror: the chunked method's chunk
    kernel (``cuda.CHUNK_WALKS``; the package picks one form by grid size, so a small shape alone would never run
    the other) or the bucketed kernel (``cuda.BUCKETED_FORMS``). The bucketed kernel runs twice, on the table as
    built and with its buckets reversed (big buckets last: the warps form's blocks then find them among their
    candidates b + kG, several in a block)."""
    from gpt2enc_edu import cuda

    if method not in ("chunked", "bucketed"):
        raise ValueError(f"method must be 'chunked' or 'bucketed', got {method!r}")
    chunked = method == "chunked"
    launcher = "encoder_backward_wte_chunked" if chunked else "encoder_backward_wte_bucketed"
    kernels = {cuda.CHUNK_WALKS[form], "encoder_backward_wte_chunk_combine_kernel"} if chunked \
        else {cuda.BUCKETED_FORMS[form]}

    def run(check: bool) -> str | None:
        import cupy

        p = _problem(name, shape, dtype)
        seed = zlib.crc32(name.encode()) ^ 0x5EED
        table = enc.make_buckets(p.inp, p.C, dtype)
        tables = [("as built", table)]
        if not chunked:
            tables.append(("reversed", reorder_buckets(table, "reversed")))
        for label, t in tables:
            got, want = compare.wte_launcher_and_mirror(launcher, p, t, seed, mirror=check,
                                                        **{"walk" if chunked else "form": form})
            cupy.cuda.Device().synchronize()
            if not check:
                continue
            if not compare.bitwise_equal(got, want):
                wrong = compare.count_bit_differences(got, want)
                return f"dwte, table {label}: {wrong} elements differ from the mirror"
        return None

    what = f"chunked wte kernels, the chunk kernel's {form} form" if chunked \
        else f"bucketed wte kernel, the {form} form, table as built and reversed"
    return Case(name, run, what, frozenset(kernels))


def _fresh_gpu_tables() -> None:
    """Drop the GPU tables' cached workspaces, so a case's first table launches its kernels one by one (the
    scatter route's later calls replay a CUDA graph, which fetches no kernel: the coverage check would not see
    them run)."""
    from gpt2enc_edu.buckets import gpu as gpu_buckets

    gpu_buckets.release_workspaces()


def _chunk_walks() -> list[str]:
    """The chunk kernel's forms that ``gpt2enc_edu.cuda`` can launch by name (building the list needs no GPU)."""
    from gpt2enc_edu import cuda

    return sorted(cuda.CHUNK_WALKS)


def _bucketed_forms() -> list[str]:
    """The bucketed wte kernel's forms that ``gpt2enc_edu.cuda`` can launch by name."""
    from gpt2enc_edu import cuda

    return sorted(cuda.BUCKETED_FORMS)


def _routes_for(shape) -> list[str]:
    """The bucketing routes that take this shape (``buckets.gpu.routes_for``, which needs no GPU)."""
    from gpt2enc_edu.buckets import gpu as gpu_buckets

    B, T, _, V, _, _ = shape
    return list(gpu_buckets.routes_for(B * T, V))


def _bench_spin_case() -> Case:
    """The benchmark timer's busy-wait kernel (``bench/timer.py``): one thread, no memory."""

    def run(check: bool) -> str | None:
        import cupy

        from gpt2enc_edu.loader import get_kernel, launch

        launch(get_kernel("bench_spin.cu", "bench_spin_kernel", bfloat16), 1, 1, (np.uint64(20_000),))
        cupy.cuda.Device().synchronize()
        return None

    return Case("bench-spin", run, "bench_spin_kernel (the benchmark timer's busy-wait)",
                frozenset({"bench_spin_kernel"}))


def default_cases() -> list[Case]:
    """Every op x dtype x shape the encoder offers (building the list needs no GPU)."""
    cases = []
    for shape_name, shape in SHAPES.items():
        for dtype_name, dtype in DTYPES.items():
            C = shape[2]
            if C % (16 // dtype.itemsize):
                continue
            cases.append(_forward_case(f"forward/{dtype_name}/{shape_name}", shape, dtype))
            for version in _forward_versions():
                cases.append(_forward_case(f"forward-v{version}/{dtype_name}/{shape_name}", shape, dtype, version))
            for method in validate.METHODS:
                if method == "atomic_bf16" and dtype_name != "bf16":
                    continue
                bucketings = _bucketings() if method in DETERMINISTIC else (None,)
                for bucketing in bucketings:
                    op = f"backward-{method}" + (f"-{bucketing}" if bucketing else "")
                    cases.append(_backward_case(f"{op}/{dtype_name}/{shape_name}", shape, dtype, method, bucketing))
            if shape_name in ("ordinary", "B1-C776"):
                cases.append(_wpe_grid_case(f"wpe-grid-stride/{dtype_name}/{shape_name}", shape, dtype))
            if shape_name in ("B1-T1-C8", "ordinary", "B1-C776", "thousands-per-bucket"):
                cases.append(_atomic_fp32_plain_case(f"atomic-fp32-plain/{dtype_name}/{shape_name}", shape, dtype))
            if "chunked" in DETERMINISTIC and shape_name in ("ordinary", "B1-C776", "thousands-per-bucket"):
                for walk in _chunk_walks():
                    cases.append(_wte_form_case(f"chunk-walk-{walk}/{dtype_name}/{shape_name}", shape, dtype, "chunked",
                                                 walk))
            if "bucketed" in DETERMINISTIC and shape_name in ("ordinary", "B1-C776", "thousands-per-bucket"):
                for form in _bucketed_forms():
                    cases.append(_wte_form_case(f"bucketed-{form}/{dtype_name}/{shape_name}", shape, dtype, "bucketed",
                                                 form))
            if shape_name in ("B1-T1-C8", "ordinary", "one-item-buckets", "thousands-per-bucket", "big-bucketing"):
                for route in _routes_for(shape):
                    cases.append(_route_case(f"bucketing-{route}/{dtype_name}/{shape_name}", shape, dtype, route))
    # The one-launch chunked backward's longest path: one sequence of 3 distinct ids, so every token is a block task
    # of 11 chunks (two passes of 8), in 2 channel groups, the second with idle threads.
    for dtype_name, dtype in DTYPES.items():
        C = 264 if dtype.itemsize == 2 else 132
        cases.append(_backward_case(f"backward-chunked-gpu/{dtype_name}/one-sequence-3-ids",
                                    (1, 1024, C, 3, 1024, "uniform"), dtype, "chunked", "gpu"))
    if "bench_spin_kernel" in kernel_names():
        cases.append(_bench_spin_case())
    return cases


def uncovered_kernels(cases: list[Case]) -> dict[str, str]:
    """Kernels of ``kernels/*.cu`` that no case in ``cases`` declares: {kernel name: file name}."""
    declared = set().union(*(case.kernels for case in cases))
    return {name: file for name, file in kernel_names().items() if name not in declared}


def _record_kernel_fetches(fetched: set) -> None:
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
    _record_kernel_fetches(fetched)
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
