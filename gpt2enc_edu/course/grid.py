"""A small CUDA grid emulator for per-thread Python kernels (the gpu-mode idea, with barriers that bite).

A per-thread kernel is a Python function ``kernel(cuda, *args)`` of one thread: ``cuda.blockIdx.x``,
``cuda.threadIdx.x``, ``cuda.blockDim.x`` and ``cuda.gridDim.x`` say which thread it is, and the arrays in
``args`` are flat NumPy arrays (the pointers). ``launch(kernel, grid, block, args)`` runs it over the grid
with the CUDA semantics the encoder kernels depend on:

* blocks of threads, each block with its own shared memory: ``cuda.shared_array(name, shape, dtype)``
  (filled with NaN, or -1 for integers, so a read of a slot nobody wrote shows);
* ``yield cuda.syncthreads()``: a barrier that every thread of the block must reach. A thread that returns
  while others of its block wait at a barrier is a ``BarrierHazard`` (on a GPU that is undefined
  behaviour: a hang or garbage), and so is calling ``cuda.syncthreads()`` without ``yield``;
* ``value = yield cuda.shfl_sync(value, src_lane)``: a full-warp shuffle, every live lane of the warp
  must take part; ``mask = yield cuda.ballot_sync(predicate)`` likewise (bit l of the mask: lane l's predicate);
* ``cuda.atomic_add(array, index, value)``: an fp32 atomic add, applied after the launch in a random order
  that changes from launch to launch (the returned old value of CUDA's ``atomicAdd`` is not offered).
  Arrays that only atomics may change are passed as read-only views (``read_only``), so a plain ``+=``
  into them is reported instead of silently working (threads run one at a time here; on a GPU it races);
* between two barriers the threads of a block run one after another in a random order, so a kernel that
  reads what another thread writes without a barrier between them gets different results from run to run.

A thread that uses a barrier or a shuffle is a generator (it contains ``yield``); a thread without one is
a plain function. fp32 arithmetic goes through ``fadd`` (the GPU's flush-to-zero add) and friends, so a
kernel written in the CUDA kernel's order gives the mirror's bits.

Why not numba's CUDA simulator (what GPU-Puzzles uses): it is a heavy dependency (numba + llvmlite) for CI
and every notebook user, its threads are OS threads (slow to start, nondeterministic scheduling that we
could not replay), and it lets a thread return before a ``syncthreads`` others wait at without a word.
Running each thread as a generator costs about 150 lines, starts instantly, and turns that hazard into an
error that names the threads.
"""

from __future__ import annotations

import inspect
from collections import namedtuple

import numpy as np

from ..layout import WARP_SIZE, pack_size
from ..rounding import fadd, round_to_storage, to_bf16_nearest, to_float

__all__ = [
    "BarrierHazard",
    "KernelFault",
    "fadd",
    "launch",
    "load128",
    "read_only",
    "round_to_storage",
    "store128",
    "to_float",
    "to_storage_nearest",
]

Dim3 = namedtuple("Dim3", "x y z", defaults=(1, 1))


class BarrierHazard(RuntimeError):
    """Threads of one block disagree about a barrier or a shuffle (some wait, some returned or went elsewhere)."""


class KernelFault(RuntimeError):
    """A thread read or wrote outside an array, or misused the emulator; the message names the thread."""


class _Sync:
    """What ``cuda.syncthreads()`` returns: the thread yields it to wait at the block's barrier."""


class _Shuffle:
    """What ``cuda.shfl_sync(value, lane)`` returns: the thread yields it and receives the lane's value."""

    def __init__(self, value, lane: int):
        self.value, self.lane = value, lane


class _Ballot:
    """What ``cuda.ballot_sync(predicate)`` returns: the thread yields it and receives the warp's mask."""

    def __init__(self, predicate):
        self.predicate = bool(predicate)


class Thread:
    """The ``cuda`` argument of a per-thread kernel: who this thread is, and the block's facilities."""

    def __init__(self, block_idx, thread_idx: int, block_dim: int, grid_dim, block_state: dict):
        # block_idx and grid_dim: an int (a 1-D grid) or a Dim3 (a 2-D grid)
        # (an index's unused coordinates are 0, a size's are 1, as in CUDA)
        self.blockIdx = block_idx if isinstance(block_idx, Dim3) else Dim3(block_idx, 0, 0)
        self.gridDim = grid_dim if isinstance(grid_dim, Dim3) else Dim3(grid_dim)
        self.threadIdx, self.blockDim = Dim3(thread_idx, 0, 0), Dim3(block_dim)
        self.warpSize = WARP_SIZE
        self._block = block_state
        self.requested = 0  # barriers and shuffles asked for; the runner counts the ones yielded

    def __repr__(self) -> str:
        block = self.blockIdx.x if self.gridDim.y == 1 else f"({self.blockIdx.x}, {self.blockIdx.y})"
        return f"thread {self.threadIdx.x} of block {block}"

    def syncthreads(self) -> _Sync:
        """``__syncthreads()``; use it as ``yield cuda.syncthreads()``."""
        self.requested += 1
        return _Sync()

    def shfl_sync(self, value, src_lane: int) -> _Shuffle:
        """``__shfl_sync(0xffffffff, value, src_lane)``; use it as ``value = yield cuda.shfl_sync(...)``."""
        self.requested += 1
        return _Shuffle(value, int(src_lane) % WARP_SIZE)

    def ballot_sync(self, predicate) -> _Ballot:
        """``__ballot_sync(0xffffffff, predicate)``; use it as ``mask = yield cuda.ballot_sync(...)``."""
        self.requested += 1
        return _Ballot(predicate)

    def shared_array(self, name: str, shape, dtype) -> np.ndarray:
        """The block's ``__shared__`` array ``name`` (the same array for every thread of the block)."""
        arrays = self._block["shared"]
        if name not in arrays:
            dtype = np.dtype(dtype)
            fill = -1 if dtype.kind in "iu" else np.nan
            arrays[name] = np.full(shape, fill, dtype=dtype)
        array = arrays[name]
        if array.shape != tuple(np.atleast_1d(shape)) or array.dtype != np.dtype(dtype):
            raise KernelFault(f"{self}: shared array {name!r} declared with two shapes or dtypes")
        return array

    def atomic_add(self, array: np.ndarray, index: int, value) -> None:
        """``atomicAdd(&array[index], value)`` in fp32; the adds land after the launch, in a random order."""
        if array.dtype != np.float32:
            raise KernelFault(f"{self}: atomic_add needs a float32 array, got {array.dtype}")
        _check_range(self, array, int(index), 1, "atomic_add on")
        self._block["atomics"].append((array, int(index), np.float32(value)))


def _check_range(thread, array: np.ndarray, start: int, count: int, what: str) -> None:
    if start < 0 or start + count > array.size:
        raise KernelFault(f"{thread}: {what} elements {start}..{start + count - 1} of an array of {array.size}")


def read_only(array: np.ndarray) -> np.ndarray:
    """A flat read-only view of ``array`` for a kernel that may change it only with ``cuda.atomic_add``."""
    view = array.reshape(-1).view()
    view.flags.writeable = False
    return view


def load128(array: np.ndarray, start: int, thread=None) -> np.ndarray:
    """``load128(array + start)``: a copy of the 128-bit pack (8 bf16 or 4 fp32) that starts at ``start``."""
    start, size = int(start), pack_size(array.dtype)
    _check_range(thread or "a thread", array, start, size, "load128 of")
    if start % size:
        raise KernelFault(f"{thread or 'a thread'}: load128 at element {start}, not a multiple of {size} (misaligned)")
    return array[start : start + size].copy()


def store128(array: np.ndarray, start: int, pack, thread=None) -> None:
    """``store128(array + start, pack)``: write one 128-bit pack."""
    start, size = int(start), pack_size(array.dtype)
    _check_range(thread or "a thread", array, start, size, "store128 to")
    if start % size:
        raise KernelFault(f"{thread or 'a thread'}: store128 at element {start}, not a multiple of {size} (misaligned)")
    array[start : start + size] = np.asarray(pack).astype(array.dtype)


def to_storage_nearest(value, dtype) -> np.ndarray:
    """``(floatX)value``: fp32 -> storage dtype, round to nearest even (unchanged for fp32)."""
    value = np.asarray(value, dtype=np.float32)
    return value if np.dtype(dtype) == np.float32 else to_bf16_nearest(value)


_DONE = object()


def _advance(thread: Thread, runner, send):
    """Run one thread to its next barrier or shuffle (returns what it yielded) or to its end (``_DONE``)."""
    try:
        waiting = runner.send(send)
    except StopIteration:
        waiting = _DONE
    except ValueError as exc:
        if "read-only" not in str(exc):
            raise
        raise KernelFault(f"{thread}: wrote into an array that many threads update at once; only "
                          "cuda.atomic_add may change it") from exc
    except Exception as exc:
        note = getattr(exc, "add_note", None)
        if note:
            note(f"(raised in {thread})")
        raise
    reached = thread.yielded + (waiting is not _DONE)
    if thread.requested != reached or not (waiting is _DONE or isinstance(waiting, (_Sync, _Shuffle, _Ballot))):
        raise KernelFault(f"{thread}: write `yield cuda.syncthreads()` / `value = yield cuda.shfl_sync(...)` / "
                          "`mask = yield cuda.ballot_sync(...)`; a call without `yield` (or a yield of anything "
                          "else) is not a barrier")
    thread.yielded = reached
    return waiting


def _run_block(kernel, block_idx, block: int, grid, args, rng, atomics: list) -> None:
    state = {"shared": {}, "atomics": atomics}
    threads = [Thread(block_idx, t, block, grid, state) for t in range(block)]
    waiting: list = [None] * block
    runners: list = [None] * block
    send: list = [None] * block
    for t, thread in enumerate(threads):
        thread.yielded = 0
        try:
            result = kernel(thread, *args)
        except ValueError as exc:
            if "read-only" not in str(exc):
                raise
            raise KernelFault(f"{thread}: wrote into an array that many threads update at once; only "
                              "cuda.atomic_add may change it") from exc
        if inspect.isgenerator(result):
            runners[t] = result
        else:
            waiting[t] = _DONE
            if thread.requested:
                raise KernelFault(f"{thread}: called syncthreads/shfl_sync/ballot_sync without `yield`")
    runnable = [t for t in range(block) if runners[t] is not None]
    while runnable:
        for t in rng.permutation(runnable).tolist():
            waiting[t] = _advance(threads[t], runners[t], send[t])
            send[t] = None
        # Warp operations first: a warp whose live lanes all wait at a shuffle (or all at a ballot) exchanges
        # values and goes on.
        warp_ops = sorted({t // WARP_SIZE for t in range(block) if isinstance(waiting[t], (_Shuffle, _Ballot))})
        runnable = []
        for warp in warp_ops:
            lanes = range(warp * WARP_SIZE, min(block, (warp + 1) * WARP_SIZE))
            kind = type(next(waiting[t] for t in lanes if isinstance(waiting[t], (_Shuffle, _Ballot))))
            name = "__shfl_sync" if kind is _Shuffle else "__ballot_sync"
            odd = [t for t in lanes if not isinstance(waiting[t], kind)]
            if odd:
                elsewhere = ("returned" if waiting[odd[0]] is _DONE else "wait at __syncthreads"
                             if isinstance(waiting[odd[0]], _Sync) else "wait at another warp operation")
                raise BarrierHazard(f"block {block_idx}: lanes of warp {warp} wait at {name} while threads "
                                    f"{odd} {elsewhere}")
            if kind is _Ballot:
                mask = sum(1 << (t - warp * WARP_SIZE) for t in lanes if waiting[t].predicate)
                for t in lanes:
                    send[t] = mask
            else:
                for t in lanes:
                    source = warp * WARP_SIZE + waiting[t].lane
                    if source >= block:
                        raise KernelFault(f"{threads[t]}: shuffle from lane {waiting[t].lane}, which does not exist")
                    send[t] = waiting[source].value
            runnable += list(lanes)
        if runnable:
            continue
        at_barrier = [t for t in range(block) if isinstance(waiting[t], _Sync)]
        if at_barrier:
            gone = [t for t in range(block) if waiting[t] is _DONE]
            if gone:
                raise BarrierHazard(
                    f"block {block_idx}: threads {_spans(at_barrier)} wait at __syncthreads, but threads "
                    f"{_spans(gone)} returned before reaching it (on a GPU: a hang or garbage). Let every "
                    "thread reach the barrier and skip the work instead of returning early.")
            runnable = at_barrier


def _spans(ids: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``'0-2, 5'``."""
    parts, start = [], None
    for i, t in enumerate(ids):
        if start is None:
            start = t
        if i + 1 == len(ids) or ids[i + 1] != t + 1:
            parts.append(f"{start}" if start == t else f"{start}-{t}")
            start = None
    return ", ".join(parts)


def launch(kernel, grid, block: int, args: tuple, *, rng=None) -> None:
    """Run the per-thread ``kernel`` over ``grid`` blocks of ``block`` threads: ``kernel<<<grid, block>>>(args)``.

    ``grid`` is a number of blocks, or ``(x, y)`` for a 2-D grid (``cuda.blockIdx.y``, ``cuda.gridDim.y``).
    Blocks run one after another; ``rng`` (a fresh unseeded generator by default) orders the threads
    between barriers and the atomic adds.
    """
    rng = np.random.default_rng() if rng is None else rng
    grid_x, grid_y = (grid, 1) if np.ndim(grid) == 0 else (int(grid[0]), int(grid[1]))
    if grid_x <= 0 or grid_y <= 0 or block <= 0 or block > 1024:
        raise KernelFault(f"invalid launch: grid={grid}, block={block} (1..1024 threads per block)")
    atomics: list = []
    grid_dim = Dim3(grid_x, grid_y) if grid_y > 1 else grid_x
    for y in range(grid_y):
        for x in range(grid_x):
            _run_block(kernel, Dim3(x, y, 0) if grid_y > 1 else x, block, grid_dim, args, rng, atomics)
    for i in rng.permutation(len(atomics)).tolist():
        array, index, value = atomics[i]
        target = array if array.flags.writeable else array.base.reshape(-1)  # read_only(): atomics only
        target[index] = fadd(target[index], value)
