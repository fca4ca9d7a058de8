"""The GPU side of the build-it exercises: compile the learner's CUDA, launch it like the real kernel, time it.

This runs in the grading process (``grade_child``), on a source the checker has already passed through
``cudasource.prepare``. The source goes through ``loader.compile_source``, so it sees exactly the package's
headers (``common.cuh``), NVRTC options and ``-DENC_FP32`` switch; it is launched with the grid and block math
of ``gpt2enc_edu/cuda.py`` (restated here for a kernel that is not the package's; ``tests/test_course_buildit.py``
runs the package's own kernel files through the graded check to keep the two in step).
"""

from __future__ import annotations

import numpy as np

from ..layout import BLOCK_SIZE, WTE_BLOCK_SIZE, ceil_div, pack_size
from ..loader import compile_source, cupy_module, get_kernel, launch
from ..problems import poisoned, random_problem
from ..rounding import bfloat16, to_bf16_nearest
from .skeletons import KERNEL_EXERCISES


class Runner:
    """The learner's kernel compiled for both storage dtypes, with the real kernel's launch shape."""

    def __init__(self, exercise: str, functions: dict):
        self.exercise = exercise
        self.spec = KERNEL_EXERCISES[exercise]
        self.functions = functions  # dtype name -> cupy RawKernel

    @classmethod
    def create(cls, exercise: str, source: str):
        """Compile the whole ``source`` for both storage dtypes (``CudaUnavailableError`` without a GPU,
        ``KernelCompileError`` with NVRTC's log)."""
        cupy_module()
        spec = KERNEL_EXERCISES[exercise]
        functions = {}
        for dtype in (bfloat16, np.float32):
            module = compile_source(source, dtype, label=f"your {spec.file}")
            functions[np.dtype(dtype).name] = module.get_function(spec.kernel)
        return cls(exercise, functions)

    def _launch(self, function, shape: tuple, scalars: dict, d: dict) -> None:
        """One launch of ``function`` on the device arrays ``d`` with the real kernel's grid and block."""
        B, T, C, size = shape
        if self.exercise == "forward":
            launch(function, ceil_div(B * T * C // size, BLOCK_SIZE), BLOCK_SIZE,
                   (d["out"], d["inp"], d["wte"], d["wpe"], np.int32(B), np.int32(T), np.int32(C)))
        elif self.exercise == "wpe":
            launch(function, ceil_div(T * C // size, BLOCK_SIZE), BLOCK_SIZE,
                   (d["dwpe"], d["dout"], np.int32(B), np.int32(T), np.int32(C), np.uint32(scalars["seed"])))
        elif self.exercise == "atomic":
            launch(function, ceil_div(B * T * C // size, BLOCK_SIZE), BLOCK_SIZE,
                   (d["dwte32"], d["dwpe32"], d["dout"], d["inp"], np.int32(B), np.int32(T), np.int32(C)))
        else:
            launch(function, max(int(scalars["num_buckets"]), 1), WTE_BLOCK_SIZE,
                   (d["dwte"], d["info"], d["bt_list"], d["dout"], d["num_buckets"], np.int32(C),
                    np.uint32(scalars["seed"])))

    def _device_arrays(self, arrays: dict, scalars: dict) -> tuple[tuple, dict]:
        cupy = cupy_module()
        d = {name: cupy.asarray(a) for name, a in arrays.items()}
        if self.exercise == "atomic":
            d["dwte32"] = cupy.asarray(arrays["dwte"].astype(np.float32))
            d["dwpe32"] = cupy.asarray(arrays["dwpe"].astype(np.float32))
        if self.exercise == "wte_bucketed":
            d["num_buckets"] = cupy.asarray(np.array([scalars["num_buckets"]], dtype=np.int32))
        dtype = arrays["dout" if "dout" in arrays else "wte"].dtype
        B, T = arrays["dout"].shape[:2] if "dout" in arrays else arrays["inp"].shape
        C = arrays["dout" if "dout" in arrays else "wte"].shape[-1]
        return (B, T, C, pack_size(dtype)), d

    def run(self, arrays: dict, scalars: dict, function=None) -> dict:
        """Launch the learner's kernel (or ``function``) on host ``arrays``; name -> array on the host, for the
        outputs and for every input as the GPU holds it afterwards (the grader checks them unchanged)."""
        cupy = cupy_module()
        shape, d = self._device_arrays(arrays, scalars)
        dtype = arrays["dout" if "dout" in arrays else "wte"].dtype
        self._launch(function or self.functions[dtype.name], shape, scalars, d)
        cupy.cuda.Device().synchronize()
        back = {name: d[name].get() for name in arrays}
        if self.exercise == "atomic":
            dwte32, dwpe32 = d["dwte32"].get(), d["dwpe32"].get()
            if dtype == bfloat16:  # bf16 storage: round the fp32 sums back once, as the package does
                return {**back, "dwte": to_bf16_nearest(dwte32), "dwpe": to_bf16_nearest(dwpe32)}
            return {**back, "dwte": dwte32, "dwpe": dwpe32}
        return back

    def package_function(self, dtype):
        """The package's own kernel for this exercise (compiled from ``kernels/``)."""
        return get_kernel(self.spec.file, self.spec.kernel, dtype)

    def time_against_package(self, *, repeats: int = 20) -> dict:
        """Median time (microseconds, CUDA events) of the learner's kernel and the package's on a GPT-2-sized
        bf16 problem (B=8, T=1024, C=768, Zipf ids, V=8192); printed and returned."""
        from ..buckets import build_bucket_table

        cupy = cupy_module()
        p = random_problem(8, 1024, 768, 8192, ids="zipf")
        arrays = {name: getattr(p, name) for name in ("inp", "wte", "wpe", "dout", "dwte", "dwpe")}
        scalars = {"seed": 1234}
        if self.exercise == "forward":
            arrays["out"] = poisoned((p.B, p.T, p.C), p.dtype)
        if self.exercise == "wte_bucketed":
            table = build_bucket_table(p.inp, p.C, p.dtype)
            arrays.update(info=table.info, bt_list=table.bt_list)
            scalars["num_buckets"] = int(table.num_buckets)
        shape, d = self._device_arrays(arrays, scalars)
        times = {}
        for name, function in (("yours", self.functions[p.dtype.name]), ("package", self.package_function(p.dtype))):
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            samples = []
            for i in range(repeats + 2):
                start.record()
                self._launch(function, shape, scalars, d)
                stop.record()
                stop.synchronize()
                if i >= 2:
                    samples.append(cupy.cuda.get_elapsed_time(start, stop) * 1000.0)
            times[name] = float(np.median(samples))
        return times
