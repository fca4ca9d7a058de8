"""A small CUDA grid emulator for per-thread Python kernels (the gpu-mode idea, with barriers that bite).

A per-thread kernel is a Python function ``kernel(cuda, *args)`` of one thread: ``cuda.blockIdx.x``,
``cuda.threadIdx.x``, ``cuda.blockDim.x`` and ``cuda.gridDim.x`` say which thread it is, and the arrays in
``args`` are flat arrays (the pointers). ``launch(kernel, grid, block, args)`` runs it over the grid with the
CUDA semantics the encoder kernels depend on, and reports what compute-sanitizer's racecheck and synccheck
would report on a GPU:

* blocks and threads run in a random order: the blocks one after another in a shuffled order, the threads
  of a block one after another in a new shuffled order between two barriers. A kernel whose result depends
  on that order is wrong on a GPU too;
* arrays are ``grid_memory.DeviceArray`` views: every index is checked (a fault names the thread, the array
  and the index), an input of the kernel cannot be written, and two threads touching one element with no
  barrier between them, one of them writing, is a ``RaceHazard`` naming both (shared and global memory);
* blocks of threads have their own shared memory: ``cuda.shared_array(name, shape, dtype)`` (filled with
  NaN, or -1 for integers, so a read of a slot nobody wrote shows);
* ``yield cuda.syncthreads()``: a barrier every thread of the block must reach, at the same
  ``__syncthreads()`` of the source. A thread that returns while others wait, threads waiting at two
  different barriers, or ``cuda.syncthreads()`` without ``yield`` is a ``BarrierHazard`` / ``KernelFault``;
* ``value = yield cuda.shfl_sync(value, src_lane)`` and ``value = yield cuda.shfl_down_sync(value, delta)``:
  full-warp shuffles, every lane of the warp must take part; ``mask = yield cuda.ballot_sync(predicate)``
  likewise (bit l of the mask: lane l's predicate);
* ``cuda.atomic_add(array, index, value)``: an fp32 atomic add, applied after the launch in a random order
  that changes from launch to launch (the returned old value of CUDA's ``atomicAdd`` is not offered). An
  array that only atomics may change is passed as ``read_only(array)``: a plain write into it is a fault.

A thread that uses a barrier or a shuffle is a generator (it contains ``yield``); a thread without one is
a plain function. fp32 arithmetic goes through ``fadd`` (the GPU's flush-to-zero add) and friends, so a
kernel written in the CUDA kernel's order gives the mirror's bits. Every hazard carries a picture of the
block's threads by role (``verdict.draw_hazard`` draws it).

Why not numba's CUDA simulator (what GPU-Puzzles uses): it is a heavy dependency (numba + llvmlite) for CI
and every notebook user, its threads are OS threads (slow to start, nondeterministic scheduling that we
could not replay), and it lets a thread return before a ``syncthreads`` others wait at without a word.
"""

from __future__ import annotations

import inspect

import numpy as np

from ..layout import pack_size
from ..rounding import fadd, round_to_storage, to_bf16_nearest, to_float
from .grid_memory import (
    BarrierHazard,
    DeviceArray,
    Hazard,
    KernelFault,
    RaceHazard,
    Tracker,
    device_array,
    forget,
    picture,
    read_only,
)
from .grid_threads import Dim3, Thread, run_block

__all__ = [
    "BarrierHazard",
    "Hazard",
    "KernelFault",
    "RaceHazard",
    "fadd",
    "launch",
    "load128",
    "read_only",
    "round_to_storage",
    "store128",
    "to_float",
    "to_storage_nearest",
]

def _fault_name(array) -> str:
    mem = getattr(array, "_mem", None)
    return mem.name if mem is not None else "an array"


def _pack_range(array, start: int, what: str, thread) -> tuple[int, int]:
    start, size = int(start), pack_size(array.dtype)
    mem = getattr(array, "_mem", None)
    thread = thread or (mem._who() if mem is not None else "a thread")
    # Alignment first: the GPU faults a misaligned 128-bit access whatever its address, so a pack that is both
    # misaligned and past the end is reported the same way whichever thread runs first.
    if start % size:
        raise KernelFault(f"{thread}: {what} {_fault_name(array)} at element {start}, not a multiple of {size} "
                          "(misaligned: a 128-bit access must start on a 16-byte boundary)",
                          _one(thread, f"misaligned {what} {_fault_name(array)}", _fault_name(array),
                               range(start, start + size)))
    if start < 0 or start + size > array.size:
        raise KernelFault(f"{thread}: {what} {_fault_name(array)} elements {start}..{start + size - 1}, outside "
                          f"the array ({array.size} elements)", _one(thread, f"{what} {_fault_name(array)}",
                                                                    _fault_name(array), range(start, start + size)))
    return start, size


def _one(thread, role: str, array: str, elements) -> dict:
    return picture(thread, {role: [thread.threadIdx.x]}, array, elements) if isinstance(thread, Thread) else {}


def load128(array, start: int, thread=None) -> np.ndarray:
    """``load128(array + start)``: a copy of the 128-bit pack (8 bf16 or 4 fp32) that starts at ``start``."""
    start, size = _pack_range(array, start, "load128 of", thread)
    return np.asarray(array[start : start + size]).copy()


def store128(array, start: int, pack, thread=None) -> None:
    """``store128(array + start, pack)``: write one 128-bit pack."""
    start, size = _pack_range(array, start, "store128 to", thread)
    array[start : start + size] = np.asarray(pack).astype(array.dtype)


def to_storage_nearest(value, dtype) -> np.ndarray:
    """``(floatX)value``: fp32 -> storage dtype, round to nearest even (unchanged for fp32)."""
    value = np.asarray(value, dtype=np.float32)
    return value if np.dtype(dtype) == np.float32 else to_bf16_nearest(value)


#: The ``grid_memory.Tracker`` of the latest launch (``busiest()``: the thread that wrote the most elements).
last_launch: Tracker | None = None


def _arguments(kernel, args: tuple, names, writes, tracker: Tracker) -> tuple:
    """The kernel's view of ``args``: device arrays named after the kernel's parameters (or ``names``)."""
    if names is None:
        try:
            names = list(inspect.signature(kernel).parameters)[1:]
        except (TypeError, ValueError):
            names = []
    out = []
    for i, arg in enumerate(args):
        name = names[i] if i < len(names) else f"argument {i + 1}"
        if isinstance(arg, DeviceArray) and arg._mem is not None:
            arg._mem.tracker = tracker
            if arg._mem.name.startswith("an "):
                arg._mem.name = name
        elif isinstance(arg, np.ndarray):
            access = "write" if writes is None or i in writes or name in writes else "read"
            arg = device_array(arg, name, access)
            arg._mem.tracker = tracker
        out.append(arg)
    return tuple(out)


def launch(kernel, grid, block: int, args: tuple, *, rng=None, names=None, writes=None) -> None:
    """Run the per-thread ``kernel`` over ``grid`` blocks of ``block`` threads: ``kernel<<<grid, block>>>(args)``.

    ``grid`` is a number of blocks, or ``(x, y)`` for a 2-D grid (``cuda.blockIdx.y``, ``cuda.gridDim.y``).
    ``names`` names the arguments in messages (the kernel's parameter names by default); ``writes`` lists the
    arguments (by position or name) the kernel may write: the others are its inputs, refused any write. By
    default every array may be written. ``rng`` (a fresh unseeded generator by default) orders the blocks,
    the threads between barriers and the atomic adds.
    """
    rng = np.random.default_rng() if rng is None else rng
    grid_x, grid_y = (grid, 1) if np.ndim(grid) == 0 else (int(grid[0]), int(grid[1]))
    if grid_x <= 0 or grid_y <= 0 or block <= 0 or block > 1024:
        raise KernelFault(f"invalid launch: grid={grid}, block={block} (1..1024 threads per block)")
    global last_launch
    tracker = last_launch = Tracker(block)
    forget()
    args = _arguments(kernel, args, names, writes, tracker)
    atomics: list = []
    grid_dim = Dim3(grid_x, grid_y) if grid_y > 1 else grid_x
    for i in rng.permutation(grid_x * grid_y).tolist():
        y, x = divmod(i, grid_x)
        run_block(kernel, Dim3(x, y, 0) if grid_y > 1 else x, block, grid_dim, args, rng, atomics, tracker)
    for i in rng.permutation(len(atomics)).tolist():
        target, index, value = atomics[i]
        target[index] = fadd(target[index], value)



