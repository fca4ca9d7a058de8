"""Launch plans: the GPU work of one call signature, recorded once and replayed with new addresses and a new seed.

What a CUDA call of the package launches depends on its signature (shapes, dtypes, options, device, stream) and never
on the data: that is what lets a CUDA graph capture it. So a call launches what the last call of its signature
launched, with other arrays and another seed. A ``Plan`` keeps that work: for each kernel its loaded function, its
launch configuration and a buffer of its argument values, in which a replay rewrites only the addresses of the call's
own arrays and the seed before the launch (``cuLaunchKernelEx``); and the events that order a side stream. The
PyTorch adapter replays plans for its eager calls on the GPU: the Python a call runs to get there (dispatch, CuPy
arrays, launch shapes, argument packing) costs more host time than a small call's kernels take on the GPU
(docs/experiments.md, host overhead).

Recording: ``with recording() as recorder:`` around one call. ``loader.launch``, ``loader.record_event`` and
``loader.wait_event`` report what they do to the recorder of their thread (``active()``), as they do it. Afterwards
``recorder.plan(arrays, seed)`` maps each array argument to one of the call's named ``arrays`` (by address range,
with its offset) or keeps it as it is (scratch: the plan holds it alive, and replays use it again), and each
``numpy.uint32`` argument (the kernels take only the seed in that type) to the seed. It returns None where the call
cannot be replayed: a step said so (``refuse``: a per-call counter, a one-off memset, a graph launched by its own
rules), a uint32 argument that is not the seed, an argument ``driver.kernel_params`` cannot pack, or named arrays that
overlap (an address could not be told apart).
``on_failure`` registers what must be undone where a replay stops half-way (a launch error): the plan is then spent
and the caller records the call again.

A plan is valid for the calls of the signature and stream it was recorded for, with arrays of the layout it was
recorded with; keying it so is the caller's business (``gpt2enc_edu.torch_calls``). It keeps the launch choices the
package made when it was recorded (grids, forms; ``loader.PROGRAMMATIC_LAUNCH`` is part of the adapter's key):
``caches.clear()`` forgets every plan, and the next call records again. Only ``replay`` touches the GPU, so the
rest is tested without one.
"""

from __future__ import annotations

import ctypes
import struct
import threading

import numpy as np

from . import driver

_local = threading.local()


class Recorder:
    """What one call launched, in order (see the module's docstring)."""

    def __init__(self) -> None:
        self.steps: list = []
        self.refusals: list[str] = []
        self.undo: list = []

    def kernel(self, kernel, grid: tuple, block: int, shared_mem: int, args: tuple, stream_ptr: int,
               attribute: int | None) -> None:
        """``kernel`` (a ``cupy.RawKernel``: its ``name``, and ``kernel.ptr``, the loaded function) launched on
        ``stream_ptr``; ``attribute``: the launch attribute it was launched with (a key of
        ``driver.LAUNCH_ATTRIBUTES``) or None."""
        self.steps.append(("kernel", kernel, grid, block, shared_mem, args, stream_ptr, attribute))

    def record_event(self, event, stream) -> None:
        self.steps.append(("record", event, stream))

    def wait_event(self, stream, event) -> None:
        self.steps.append(("wait", stream, event))

    def refuse(self, why: str) -> None:
        """This call's work cannot be replayed as it was launched (``why``): no plan is made of it."""
        self.refusals.append(why)

    def on_failure(self, undo) -> None:
        """``undo()`` runs where a replay of the plan stops before its last step."""
        self.undo.append(undo)

    def plan(self, arrays: dict, seed: int | None = None) -> Plan | None:
        """The ``Plan`` of what was recorded, its varying addresses those of ``arrays`` (name -> CuPy array or torch
        tensor, the call's own memory) and its seed ``seed``; None where it cannot be replayed (module docstring)."""
        if self.refusals:
            return None
        names = tuple(arrays)
        ranges = [_span(a) for a in arrays.values()]
        ordered = sorted(r for r in ranges if r[1] > r[0])
        if any(a[1] > b[0] for a, b in zip(ordered, ordered[1:])):
            return None
        steps, patches, keep = [], [], []
        for step in self.steps:
            if step[0] != "kernel":
                keep.append(step)
                steps.append(step)
                continue
            _, kernel, grid, block, shared_mem, args, stream_ptr, attribute = step
            keep.append(kernel)  # its module stays loaded while the plan may launch it
            try:
                buffer, params = driver.kernel_params(args)
            except TypeError:  # an argument the driver's launch cannot take (the call itself ran through CuPy)
                return None
            for i, arg in enumerate(args):
                if isinstance(arg, np.uint32):
                    if seed is None or int(arg) != seed:
                        return None
                    patches.append((_SEED_SLOT.pack_into, buffer, 8 * i, SEED, 0))
                    continue
                if isinstance(arg, np.generic):
                    continue
                address = arg.data.ptr
                slot = next((j for j, (start, end) in enumerate(ranges) if start <= address < end), None)
                if slot is None:
                    keep.append(arg)  # scratch: alive as long as the plan
                else:
                    patches.append((_ADDRESS_SLOT.pack_into, buffer, 8 * i, slot, address - ranges[slot][0]))
            config = driver.launch_config(grid, block, shared_mem, stream_ptr, attribute)
            steps.append(("kernel", kernel.name, kernel.kernel.ptr, config, params, buffer))
        return Plan(names, steps, patches, keep, self.undo)


#: A patch's slot that takes the seed instead of an address.
SEED = -1
#: How a patch writes its value at the start of an argument's 8-byte slot (``driver.kernel_params``'s layout).
_ADDRESS_SLOT, _SEED_SLOT = struct.Struct("<Q"), struct.Struct("<I")


def _span(array) -> tuple[int, int]:
    """[start, end) of the memory of a CuPy array or a torch tensor."""
    if hasattr(array, "data_ptr"):  # torch
        start = array.data_ptr()
        return start, start + array.numel() * array.element_size()
    start = array.data.ptr
    return start, start + array.nbytes


class recording:  # noqa: N801 (used as a context manager, like a function)
    """``with recording() as recorder:``: the launches of this thread in the block go to ``recorder``."""

    def __enter__(self) -> Recorder:
        if getattr(_local, "recorder", None) is not None:
            raise RuntimeError("a recording is already in progress in this thread")
        _local.recorder = Recorder()
        return _local.recorder

    def __exit__(self, *exc) -> None:
        _local.recorder = None


def active() -> Recorder | None:
    """The recorder of this thread, or None (the launchers' question)."""
    return getattr(_local, "recorder", None)


def refuse(why: str) -> None:
    """``Recorder.refuse`` for the recording of this thread, if one is in progress: for a step whose work a replay
    could not repeat."""
    recorder = active()
    if recorder is not None:
        recorder.refuse(why)


class Plan:
    """A recorded call's work, replayed with ``replay(addresses, seed)`` (see the module's docstring)."""

    def __init__(self, names: tuple, steps: list, patches: list, keep: list, undo: list):
        self.names = names
        self._steps = steps
        self._patches = patches
        self._keep = keep
        self._undo = undo
        self._calls = None  # bound to the driver at the first replay
        self._lock = threading.Lock()
        self.spent = False

    @property
    def launches(self) -> int:
        return sum(step[0] == "kernel" for step in self._steps)

    def _bind(self) -> list:
        """Each step as (driver function, its arguments as ctypes objects, what to call it in an error): arguments
        converted once, not at every call."""
        lib = driver.libcuda()
        address = ctypes.c_void_p
        calls = []
        for step in self._steps:
            if step[0] == "kernel":
                _, name, function_ptr, config, params, _ = step
                calls.append((lib.cuLaunchKernelEx, (ctypes.byref(config), address(function_ptr), address(params),
                                                     None), f"cuLaunchKernelEx of {name}"))
            elif step[0] == "record":
                calls.append((lib.cuEventRecord, (address(step[1].ptr), address(step[2].ptr)), "cuEventRecord"))
            else:
                calls.append((lib.cuStreamWaitEvent, (address(step[1].ptr), address(step[2].ptr), ctypes.c_uint(0)),
                              "cuStreamWaitEvent"))
        return calls

    def replay(self, addresses: tuple, seed: int = 0) -> None:
        """Launch the recorded work with ``addresses`` (one per name of ``names``, in that order) and ``seed``.

        Where a step fails (the driver's error is raised as ``RuntimeError``) or an interrupt stops the replay, the
        steps before it have run: the failure hooks run and the plan is ``spent`` (the caller records the call
        again)."""
        with self._lock:
            if self._calls is None:
                self._calls = self._bind()
            for pack_into, buffer, offset, slot, delta in self._patches:
                pack_into(buffer, offset, seed if slot == SEED else addresses[slot] + delta)
            try:
                for function, args, what in self._calls:
                    status = function(*args)
                    if status:
                        driver.check(status, what)
            except BaseException:  # a launch error, or an interrupt between two launches
                self.spent = True
                for undo in self._undo:
                    undo()
                raise
