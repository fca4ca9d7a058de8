"""The GPU side of the build-it exercises: compile the learner's CUDA, launch it like the real kernel, time it.

The learner's source goes through ``loader.compile_source``, so it sees exactly the package's headers
(``common.cuh``), NVRTC options and ``-DENC_FP32`` switch; it is launched with the grid and block math of
``gpt2enc_edu/cuda.py`` (restated here for a kernel that is not the package's; ``tests/test_course_buildit.py``
runs the package's own kernels through this runner to keep the two in step).
"""

from __future__ import annotations

import numpy as np

from ..layout import BLOCK_SIZE, WTE_BLOCK_SIZE, ceil_div, pack_size
from ..loader import CudaUnavailableError, compile_source, cupy_module, get_kernel, launch
from ..problems import Problem, poisoned, random_problem
from ..rounding import bfloat16, to_bf16_nearest
from .skeletons import KERNEL_EXERCISES, fill


class Runner:
    """The learner's kernel compiled for both storage dtypes, with the real kernel's launch shape."""

    def __init__(self, exercise: str, functions: dict):
        self.exercise = exercise
        self.spec = KERNEL_EXERCISES[exercise]
        self.functions = functions  # dtype name -> cupy RawKernel

    @classmethod
    def create(cls, exercise: str, source: str):
        """Compile ``source`` (a body for the skeleton's gap, or a whole file); None, saying why, without a GPU."""
        try:
            cupy_module()
        except CudaUnavailableError as exc:
            print(f"The CUDA form of this exercise needs a GPU ({exc}); the per-thread Python form runs here.")
            return None
        spec = KERNEL_EXERCISES[exercise]
        full = fill(exercise, source)
        functions = {}
        for dtype in (bfloat16, np.float32):
            module = compile_source(full, dtype, label=f"your {spec.file}")
            functions[np.dtype(dtype).name] = module.get_function(spec.kernel)
        return cls(exercise, functions)

    def _launch(self, function, p: Problem, seed: int, table, arrays: dict) -> None:
        """One launch of ``function`` on the device ``arrays`` with the real kernel's grid and block."""
        B, T, C = p.B, p.T, p.C
        size = pack_size(p.dtype)
        if self.exercise == "forward":
            launch(function, ceil_div(B * T * C // size, BLOCK_SIZE), BLOCK_SIZE,
                   (arrays["out"], arrays["inp"], arrays["wte"], arrays["wpe"], np.int32(B), np.int32(T), np.int32(C)))
        elif self.exercise == "wpe":
            launch(function, ceil_div(T * C // size, BLOCK_SIZE), BLOCK_SIZE,
                   (arrays["dwpe"], arrays["dout"], np.int32(B), np.int32(T), np.int32(C), np.uint32(seed)))
        elif self.exercise == "atomic":
            launch(function, ceil_div(B * T * C // size, BLOCK_SIZE), BLOCK_SIZE,
                   (arrays["dwte32"], arrays["dwpe32"], arrays["dout"], arrays["inp"], np.int32(B), np.int32(T),
                    np.int32(C)))
        else:
            launch(function, int(table.num_buckets), WTE_BLOCK_SIZE,
                   (arrays["dwte"], arrays["info"], arrays["bt_list"], arrays["dout"], arrays["num_buckets"],
                    np.int32(C), np.uint32(seed)))

    def _device_arrays(self, p: Problem, table) -> dict:
        cupy = cupy_module()
        arrays = {name: cupy.asarray(getattr(p, name)) for name in ("inp", "wte", "wpe", "dout", "dwte", "dwpe")}
        if self.exercise == "forward":
            arrays["out"] = poisoned((p.B, p.T, p.C), p.dtype, xp=cupy)
        if self.exercise == "atomic":
            arrays["dwte32"] = cupy.asarray(p.dwte.astype(np.float32))
            arrays["dwpe32"] = cupy.asarray(p.dwpe.astype(np.float32))
        if table is not None:
            arrays["info"] = cupy.asarray(table.info)
            arrays["bt_list"] = cupy.asarray(table.bt_list)
            arrays["num_buckets"] = cupy.asarray(np.array([table.num_buckets], dtype=np.int32))
        return arrays

    def run(self, p: Problem, seed: int, table, function=None) -> dict:
        """Launch the learner's kernel (or ``function``) on ``p``; tensor name -> result on the host."""
        cupy = cupy_module()
        arrays = self._device_arrays(p, table)
        self._launch(function or self.functions[p.dtype.name], p, seed, table, arrays)
        cupy.cuda.Device().synchronize()
        if self.exercise == "forward":
            return {"out": arrays["out"].get()}
        if self.exercise == "wpe":
            return {"dwpe": arrays["dwpe"].get()}
        if self.exercise == "wte_bucketed":
            return {"dwte": arrays["dwte"].get()}
        dwte32, dwpe32 = arrays["dwte32"].get(), arrays["dwpe32"].get()
        if p.dtype == bfloat16:  # bf16 storage: round the fp32 sums back once, as the package does
            return {"dwte": to_bf16_nearest(dwte32), "dwpe": to_bf16_nearest(dwpe32)}
        return {"dwte": dwte32, "dwpe": dwpe32}

    def package_function(self, dtype):
        """The package's own kernel for this exercise (compiled from ``kernels/``)."""
        return get_kernel(self.spec.file, self.spec.kernel, dtype)

    def time_against_package(self, rng, *, repeats: int = 20) -> dict:
        """Median time (microseconds, CUDA events) of the learner's kernel and the package's on a GPT-2-sized
        bf16 problem (B=8, T=1024, C=768, Zipf ids, V=8192); printed and returned."""
        from ..buckets import build_bucket_table

        cupy = cupy_module()
        p = random_problem(8, 1024, 768, 8192, ids="zipf", rng=rng)
        table = build_bucket_table(p.inp, p.C, p.dtype) if self.exercise == "wte_bucketed" else None
        arrays = self._device_arrays(p, table)
        times = {}
        for name, function in (("yours", self.functions[p.dtype.name]), ("package", self.package_function(p.dtype))):
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            samples = []
            for i in range(repeats + 2):
                start.record()
                self._launch(function, p, 1234, table, arrays)
                stop.record()
                stop.synchronize()
                if i >= 2:
                    samples.append(cupy.cuda.get_elapsed_time(start, stop) * 1000.0)
            times[name] = float(np.median(samples))
        print(f"Time on {p.B}x{p.T}x{p.C} bf16, Zipf ids (median of {repeats}): your kernel {times['yours']:.1f} us, "
              f"the package's {times['package']:.1f} us.")
        return times
