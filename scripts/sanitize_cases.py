"""The kinds of case the sanitizer driver (``scripts/sanitize_kernels.py``) runs, and the kernels each launches.

A case is a name, a function that launches kernels and checks what they wrote, and the kernels it declares; the
factories here make one for a forward version, a backward method and bucketing, the fp32 atomic kernel launched
plainly, the wpe kernel on a narrow grid, a bucketing route, a wte kernel's form by name, the bench's spin kernel.
The driver lists them over shapes and dtypes (``default_cases``) and checks every kernel has one.
"""

from __future__ import annotations

import inspect
import re
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import gpt2enc_edu as enc  # noqa: E402
from gpt2enc_edu import compare, reference, validate  # noqa: E402
from gpt2enc_edu.buckets import reorder_buckets  # noqa: E402
from gpt2enc_edu.cuda import WPE_FORMS  # noqa: E402
from gpt2enc_edu.layout import WPE_PIPELINED_MAX_B  # noqa: E402
from gpt2enc_edu.methods import METHODS, one_launch_backward  # noqa: E402
from gpt2enc_edu.problems import count_poison, poisoned, random_problem  # noqa: E402
from gpt2enc_edu.rounding import bfloat16  # noqa: E402


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


# ----------------------------------------------------------------------------------------------------------
# the encoder's cases


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


def route_kernels_for(BT: int, V: int) -> frozenset:
    """The GPU bucketing kernels ``buckets.gpu`` launches by itself for BT ids of a vocabulary of V."""
    from gpt2enc_edu.buckets import gpu as gpu_buckets

    return ROUTE_KERNELS[gpu_buckets.bucketing_route(BT, V)]


def backward_kernels(method: str, dtype, shape, bucketing: str | None) -> frozenset:
    """The kernels one backward call launches, as ``gpt2enc_edu.cuda`` dispatches today."""
    B, T, _, V, _, _ = shape
    if method == "atomic_bf16":
        return frozenset({"encoder_backward_atomic_bf16_kernel"})
    if method == "atomic":
        if np.dtype(dtype).itemsize == 2:
            return frozenset({"encoder_backward_atomic_widen_kernel", "encoder_backward_atomic_fp32_rows_kernel",
                              "encoder_backward_atomic_narrow_kernel"})
        return frozenset({"encoder_backward_atomic_fp32_rows_kernel"})
    if one_launch_backward(method, bucketing or "auto", B * T, V):  # one kernel sorts the ids itself and sums
        return frozenset({"encoder_backward_small_kernel"})
    # chunked: the combine kernel, and one of the chunk kernel's two forms, which the package picks on the GPU
    # (cuda.chunk_walk); the chunk-walk cases launch each form by name. bucketed: one of the warps forms, which the
    # package picks on the GPU by dout's size (cuda.bucketed_form); the bucketed-form cases launch each by name.
    # The wpe kernel: beside the scatter route's table built in the call, for small batches, one of its two forms,
    # which the package picks on the GPU (cuda.wpe_form); the wpe-grid cases launch each form by name.
    wte = {"encoder_backward_wte_chunk_combine_kernel"} if method == "chunked" else set()
    table_in_call = bucketing in ("gpu", "auto", None)
    bucketing_kernels = route_kernels_for(B * T, V) if table_in_call else set()
    either_form = table_in_call and bucketing_kernels == ROUTE_KERNELS["scatter"] and B <= WPE_PIPELINED_MAX_B
    wpe = set() if either_form else {"encoder_backward_wpe_kernel"}
    return frozenset({*wpe, *wte, *bucketing_kernels})


def table_places() -> tuple[str | None, ...]:
    """Where the bucket table can be built: both places if the API offers the choice."""
    if "bucketing" in inspect.signature(enc.encoder_backward).parameters:
        return ("cpu", "gpu")
    return (None,)


def problem(name: str, shape, dtype):
    B, T, C, V, maxT, ids = shape
    return random_problem(B, T, C, V, maxT, dtype=dtype, ids=ids, rng=np.random.default_rng(zlib.crc32(name.encode())))


def forward_versions() -> dict:
    """{version: kernel name} of the forward kernels ``gpt2enc_edu.cuda`` can launch one by one."""
    from gpt2enc_edu import cuda

    return {v: entry[0] for v, entry in getattr(cuda, "FORWARD_VERSIONS", {}).items()}


def forward_case(name: str, shape, dtype, version: int | None = None) -> Case:
    """The public forward (``version=None``), or one forward kernel version launched directly after validation."""

    def run(check: bool) -> str | None:
        import cupy

        from gpt2enc_edu import cuda

        p = problem(name, shape, dtype)
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
    kernel = forward_versions()[version]
    return Case(name, run, kernel, frozenset({kernel}))


def backward_case(name: str, shape, dtype, method: str, bucketing: str | None) -> Case:
    extra = {} if bucketing is None else {"bucketing": bucketing}

    def run(check: bool) -> str | None:
        import cupy

        fresh_gpu_tables()
        p = problem(name, shape, dtype)
        seed = zlib.crc32(name.encode()) ^ 0x5EED
        g = p.on(cupy)
        enc.encoder_backward(g.dwte, g.dwpe, g.dout, g.inp, seed=seed, method=method, **extra)
        cupy.cuda.Device().synchronize()
        if not check:
            return None
        if METHODS[method].deterministic:
            cpu = p.on(np)
            enc.encoder_backward(cpu.dwte, cpu.dwpe, cpu.dout, cpu.inp, seed=seed, method=method)
            for label, got, want in (("dwte", g.dwte, cpu.dwte), ("dwpe", g.dwpe, cpu.dwpe)):
                if not compare.bitwise_equal(got, want):
                    return f"{label}: {compare.count_bit_differences(got, want)} elements differ from the mirror"
            return None
        ref = reference.backward(p.dwte, p.dwpe, p.dout, p.inp)
        per_add = METHODS[method].rounds_every_add
        for label, got, want, magnitude in (("dwte", g.dwte, ref.dwte, ref.dwte_abs),
                                            ("dwpe", g.dwpe, ref.dwpe, ref.dwpe_abs)):
            bound = compare.error_bound(dtype, magnitude, ref.max_terms, rounding_per_add=per_add)
            if not compare.within_bound(got, want, bound):
                return f"{label}: outside the error bound of the float64 reference"
        return None

    atomic_fp32 = "atomic fp32 rows kernel" + (" between the widen and narrow kernels (bf16 storage)"
                                               if dtype.itemsize == 2 else "")
    launched = backward_kernels(method, dtype, shape, bucketing)
    kernels = {"atomic": atomic_fp32, "atomic_bf16": "atomic bf16 kernel"}.get(
        method, f"wpe kernel + {method} wte kernel, bucket table built on the {bucketing or 'default side'}")
    if "encoder_backward_small_kernel" in launched:
        kernels = "the chunked backward in one launch (its own sort of the ids, dwte, dwpe)"
    return Case(name, run, kernels, launched)


def atomic_fp32_plain_case(name: str, shape, dtype) -> Case:
    """``encoder_backward_atomic_fp32_kernel``, the one-pack-per-thread atomic kernel notebook 02 teaches (the
    package's route uses the rows kernel): launched directly on fp32 copies after validation."""

    def run(check: bool) -> str | None:
        import cupy

        from gpt2enc_edu.layout import BLOCK_SIZE, ceil_div, pack_size
        from gpt2enc_edu.loader import get_kernel, launch

        p = problem(name, shape, dtype)
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


def wpe_grid_case(name: str, shape, dtype) -> Case:
    """Both forms of the wpe kernel on grids smaller than a thread per pack (1 and 2 blocks: each thread walks
    several packs, as beside the scatter route's table built in the call, where the package gives it a share of the
    SMs), against the mirror."""

    def run(check: bool) -> str | None:
        import cupy

        from gpt2enc_edu import cuda, mirror

        p = problem(name, shape, dtype)
        seed = zlib.crc32(name.encode()) ^ 0x5EED
        for form in cuda.WPE_FORMS:
            for blocks in (1, 2):
                got = cupy.asarray(p.dwpe)
                cuda.encoder_backward_wpe(got, cupy.asarray(p.dout), p.B, p.T, p.C, seed, blocks=blocks, form=form)
                cupy.cuda.Device().synchronize()
                if not check:
                    continue
                want = p.dwpe.copy()
                mirror.encoder_backward_wpe(want, p.dout, p.B, p.T, p.C, seed)
                if not compare.bitwise_equal(got.get(), want):
                    wrong = compare.count_bit_differences(got.get(), want)
                    return f"{form} form, {blocks} block(s): {wrong} elements differ from the mirror"
        return None

    return Case(name, run, "both wpe kernel forms on 1 and 2 blocks (threads walk the packs in turn)",
                frozenset(WPE_FORMS.values()))


def route_case(name: str, shape, dtype, route: str) -> Case:
    """One GPU bucketing route by name (``build_bucket_table_gpu(route=...)``), its table against NumPy's."""

    def run(check: bool) -> str | None:
        import cupy

        from gpt2enc_edu import buckets
        from gpt2enc_edu.buckets import gpu as gpu_buckets

        fresh_gpu_tables()
        p = problem(name, shape, dtype)
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


def wte_form_case(name: str, shape, dtype, method: str, form: str) -> Case:
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

        p = problem(name, shape, dtype)
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


def fresh_gpu_tables() -> None:
    """Drop the GPU tables' cached workspaces, so a case's first table launches its kernels one by one (the
    scatter route's later calls replay a CUDA graph, which fetches no kernel: the coverage check would not see
    them run)."""
    from gpt2enc_edu.buckets import gpu as gpu_buckets

    gpu_buckets.release_workspaces()


def chunk_walks() -> list[str]:
    """The chunk kernel's forms that ``gpt2enc_edu.cuda`` can launch by name (building the list needs no GPU)."""
    from gpt2enc_edu import cuda

    return sorted(cuda.CHUNK_WALKS)


def bucketed_forms() -> list[str]:
    """The bucketed wte kernel's forms that ``gpt2enc_edu.cuda`` can launch by name."""
    from gpt2enc_edu import cuda

    return sorted(cuda.BUCKETED_FORMS)


def routes_for(shape) -> list[str]:
    """The bucketing routes that take this shape (``buckets.gpu.routes_for``, which needs no GPU)."""
    from gpt2enc_edu.buckets import gpu as gpu_buckets

    B, T, _, V, _, _ = shape
    return list(gpu_buckets.routes_for(B * T, V))


def bench_spin_case() -> Case:
    """The benchmark timer's busy-wait kernel (``bench/timer.py``): one thread, no memory."""

    def run(check: bool) -> str | None:
        import cupy

        from gpt2enc_edu.loader import get_kernel, launch

        launch(get_kernel("bench_spin.cu", "bench_spin_kernel", bfloat16), 1, 1, (np.uint64(20_000),))
        cupy.cuda.Device().synchronize()
        return None

    return Case("bench-spin", run, "bench_spin_kernel (the benchmark timer's busy-wait)",
                frozenset({"bench_spin_kernel"}))


def token_ids_case() -> Case:
    """The PyTorch adapter's id kernels (``kernels/token_ids.cu``): int64 and int32 ids of an odd count, checked, into
    int32 (valid ids only: a bad id stops the kernel with a trap by design, which the adapter's tests cover)."""

    def run(check: bool) -> str | None:
        import cupy

        from gpt2enc_edu.token_ids import token_ids

        V, wrong = 50257, []
        ids = np.random.default_rng(0).integers(0, V, 1000 + 3)
        for dtype in (np.int64, np.int32):
            out = cupy.full(ids.size, -1, dtype=np.int32)
            token_ids(out, cupy.asarray(ids.astype(dtype)), V, check=True)
            if check and not (out.get() == ids).all():
                wrong.append(np.dtype(dtype).name)
        cupy.cuda.Device().synchronize()
        return f"token ids of {wrong} were not copied exactly" if wrong else None

    return Case("token-ids", run, "token_ids_i64_kernel and token_ids_i32_kernel (the PyTorch adapter's id check)",
                frozenset({"token_ids_i64_kernel", "token_ids_i32_kernel"}))
