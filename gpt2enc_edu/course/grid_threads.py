"""The threads of the grid emulator (``grid``): who a thread is, what it may ask for, and a block's schedule.

``run_block`` runs one block: it starts the threads in a random order (a thread without a barrier runs to
its end at once), then, round after round, advances every waiting thread in a new random order to its next
barrier or warp operation. Warps whose lanes all wait at one shuffle (or ballot) exchange values; a block
whose threads all wait at one ``__syncthreads()`` passes it, and a new barrier interval starts (the race
records of ``grid_memory`` compare intervals). Threads that disagree are a ``BarrierHazard``.
"""

from __future__ import annotations

import inspect
import sys
from collections import namedtuple

import numpy as np

from ..layout import WARP_SIZE
from .grid_memory import BarrierHazard, DeviceArray, Hazard, KernelFault, device_array, pending, picture

Dim3 = namedtuple("Dim3", "x y z", defaults=(1, 1))


class _Sync:
    """What ``cuda.syncthreads()`` returns: the thread yields it to wait at the block's barrier."""

    def __init__(self, site: str):
        self.site = site  # the source line of this __syncthreads(): threads must meet at one


class _Shuffle:
    """What a shuffle returns: the thread yields it and receives the value of lane ``lane`` (``down``: its own
    lane + ``lane``, or its own value past the warp)."""

    def __init__(self, value, lane: int, down: bool = False):
        self.value, self.lane, self.down = value, lane, down


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
        self._gid = (self.blockIdx.y * self.gridDim.x + self.blockIdx.x) * block_dim + thread_idx
        self.requested = 0  # barriers and shuffles asked for; the runner counts the ones yielded
        self.yielded = 0

    def __repr__(self) -> str:
        block = self.blockIdx.x if self.gridDim.y == 1 else f"({self.blockIdx.x}, {self.blockIdx.y})"
        return f"thread {self.threadIdx.x} of block {block}"

    def syncthreads(self) -> _Sync:
        """``__syncthreads()``; use it as ``yield cuda.syncthreads()``."""
        self.requested += 1
        caller = sys._getframe(1)
        return _Sync(f"line {caller.f_lineno} of {caller.f_code.co_name}")

    def shfl_sync(self, value, src_lane: int) -> _Shuffle:
        """``__shfl_sync(0xffffffff, value, src_lane)``; use it as ``value = yield cuda.shfl_sync(...)``."""
        self.requested += 1
        return _Shuffle(value, int(src_lane) % WARP_SIZE)

    def shfl_down_sync(self, value, delta: int) -> _Shuffle:
        """``__shfl_down_sync(0xffffffff, value, delta)``: lane l receives lane l + delta's value (its own where
        l + delta is past the warp); use it as ``value = yield cuda.shfl_down_sync(...)``."""
        self.requested += 1
        return _Shuffle(value, int(delta), down=True)

    def ballot_sync(self, predicate) -> _Ballot:
        """``__ballot_sync(0xffffffff, predicate)``; use it as ``mask = yield cuda.ballot_sync(...)``."""
        self.requested += 1
        return _Ballot(predicate)

    def shared_array(self, name: str, shape, dtype) -> DeviceArray:
        """The block's ``__shared__`` array ``name`` (the same array for every thread of the block)."""
        arrays = self._block["shared"]
        if name not in arrays:
            dtype = np.dtype(dtype)
            fill = -1 if dtype.kind in "iu" else np.nan
            arrays[name] = device_array(np.full(shape, fill, dtype=dtype), name, "write", "shared")
            arrays[name]._mem.tracker = self._block["tracker"]
        array = arrays[name]
        if array.shape != tuple(np.atleast_1d(shape)) or array.dtype != np.dtype(dtype):
            raise KernelFault(f"{self}: shared array {name!r} declared with two shapes or dtypes")
        return array

    def atomic_add(self, array, index: int, value) -> None:
        """``atomicAdd(&array[index], value)`` in fp32; the adds land after the launch, in a random order."""
        mem = getattr(array, "_mem", None)
        if array.dtype != np.float32 or mem is None or mem.access == "read":
            what = f"{mem.name} is an input" if mem is not None else "it is not one of the kernel's arrays"
            raise KernelFault(f"{self}: atomic_add needs a float32 array the kernel may change ({what}, "
                              f"{array.dtype})")
        index = int(index)
        if not 0 <= index < mem.size:
            mem.fault("atomic_add on", index)
        self._block["tracker"].count(1)
        target = mem.target.reshape(-1) if mem.access == "write" else mem.target
        self._block["atomics"].append((target, index, np.float32(value)))


_DONE = object()
_WARP_OPS = (_Shuffle, _Ballot)
_YIELD_HELP = ("write `yield cuda.syncthreads()` / `value = yield cuda.shfl_sync(...)` / "
               "`mask = yield cuda.ballot_sync(...)`; a call without `yield` (or a yield of anything else) is not "
               "a barrier")


def _guarded(thread: Thread, step):
    """Run ``step()`` (a thread's code up to its next yield) as ``thread``; NumPy's refusal to write a read-only
    array becomes a fault naming the thread, and any other error of the kernel says which thread raised it."""
    tracker = thread._block["tracker"]
    tracker.current = thread
    try:
        result = step()
    except ValueError as exc:
        if "read-only" not in str(exc):
            _note(exc, thread)
            raise
        raise KernelFault(f"{thread}: wrote into a kernel's array with a NumPy function or through a view of it; "
                          "a kernel never writes its inputs, only cuda.atomic_add changes an atomics-only array, and "
                          "an output's elements are written with `array[i] = value`, `array[i:j] = values` or "
                          "store128 (which the emulator sees)",
                          picture(thread, {"wrote a read-only array": [thread.threadIdx.x]})) from exc
    except (Hazard, StopIteration):
        raise
    except Exception as exc:
        if pending() is not None:  # the kernel caught a hazard, and then failed otherwise
            raise pending() from exc
        _note(exc, thread)
        raise
    if pending() is not None:  # the kernel caught a hazard and went on: stop it here
        raise pending()
    return result


def _note(exc: Exception, thread: Thread) -> None:
    note = getattr(exc, "add_note", None)  # Python 3.11 and newer
    if note is not None and not any("(raised in thread" in n for n in getattr(exc, "__notes__", [])):
        note(f"(raised in {thread})")


def _advance(thread: Thread, runner, send):
    """Run one thread to its next barrier or shuffle (returns what it yielded) or to its end (``_DONE``)."""
    def step():
        try:
            return runner.send(send)
        except StopIteration:
            return _DONE

    waiting = _guarded(thread, step)
    reached = thread.yielded + (waiting is not _DONE)
    if thread.requested != reached or not (waiting is _DONE or isinstance(waiting, (_Sync, *_WARP_OPS))):
        raise KernelFault(f"{thread}: {_YIELD_HELP}", picture(thread, {"no `yield`": [thread.threadIdx.x]}))
    thread.yielded = reached
    return waiting


def _start(kernel, thread: Thread, args):
    """Call the kernel for one thread: a generator to advance, or ``_DONE`` when it ran to its end."""
    result = _guarded(thread, lambda: kernel(thread, *args))
    if inspect.isgenerator(result):
        return result
    if thread.requested:
        raise KernelFault(f"{thread}: called syncthreads/shfl_sync/ballot_sync without `yield`",
                          picture(thread, {"no `yield`": [thread.threadIdx.x]}))
    return _DONE


def _warp_exchange(block_idx, block: int, warp: int, waiting: list, send: list, threads: list) -> None:
    """Lanes of ``warp`` all wait at one shuffle or ballot: hand each its value (or a hazard if they do not)."""
    lanes = range(warp * WARP_SIZE, min(block, (warp + 1) * WARP_SIZE))
    kind = type(next(waiting[t] for t in lanes if isinstance(waiting[t], _WARP_OPS)))
    name = "__shfl_sync" if kind is _Shuffle else "__ballot_sync"
    odd = [t for t in lanes if not isinstance(waiting[t], kind)]
    if odd:
        elsewhere = ("returned" if waiting[odd[0]] is _DONE else "wait at __syncthreads"
                     if isinstance(waiting[odd[0]], _Sync) else "wait at another warp operation")
        raise BarrierHazard(f"block {block_idx}: lanes of warp {warp} wait at {name} while threads {_spans(odd)} "
                            f"{elsewhere} (every lane of the warp must take part)",
                            picture(threads[odd[0]], {f"wait at {name}": [t for t in lanes if t not in odd],
                                                      elsewhere: odd}))
    if kind is _Ballot:
        mask = sum(1 << (t - warp * WARP_SIZE) for t in lanes if waiting[t].predicate)
        for t in lanes:
            send[t] = mask
        return
    for t in lanes:
        op, lane = waiting[t], t - warp * WARP_SIZE
        source = lane + op.lane if op.down else op.lane
        if op.down and source >= WARP_SIZE:
            source = lane
        if warp * WARP_SIZE + source >= block:
            raise KernelFault(f"{threads[t]}: shuffle from lane {source}, which does not exist",
                              picture(threads[t], {f"shuffle from lane {source}": [t]}))
        send[t] = waiting[warp * WARP_SIZE + source].value


def _release_barrier(block_idx, waiting: list, threads: list, state: dict) -> list[int]:
    """Threads that wait at ``__syncthreads`` pass it when all of the block wait at the same one."""
    block = len(waiting)
    at_barrier = [t for t in range(block) if isinstance(waiting[t], _Sync)]
    if not at_barrier:
        return []
    gone = [t for t in range(block) if waiting[t] is _DONE]
    if gone:
        raise BarrierHazard(
            f"block {block_idx}: threads {_spans(at_barrier)} wait at __syncthreads, but threads {_spans(gone)} "
            "returned before reaching it (CUDA C++ asks every thread of the block to reach each "
            "__syncthreads(); on a GPU the exited threads release the barrier, and the others find only what "
            "those threads wrote before they left). Let every thread reach the barrier and skip the work instead "
            "of returning early.",
            picture(threads[at_barrier[0]], {"wait at __syncthreads": at_barrier, "returned": gone}))
    sites: dict[str, list[int]] = {}
    for t in at_barrier:
        sites.setdefault(waiting[t].site, []).append(t)
    if len(sites) > 1:
        where = "; ".join(f"threads {_spans(ts)} at {site}" for site, ts in sites.items())
        raise BarrierHazard(
            f"block {block_idx}: threads wait at different __syncthreads() ({where}). A barrier in each branch "
            "of an if is two barriers: on a GPU that is undefined (synccheck: divergent barrier). Put one "
            "barrier where every thread of the block reaches it.",
            picture(threads[at_barrier[0]], {f"wait at {site}": ts for site, ts in sites.items()}))
    state["interval"] = state["tracker"].new_interval()
    return at_barrier


def run_block(kernel, block_idx, block: int, grid, args, rng, atomics: list, tracker) -> None:
    """Run one block of ``block`` threads to its end (see the module docstring)."""
    state = {"shared": {}, "atomics": atomics, "tracker": tracker, "interval": tracker.new_interval()}
    threads = [Thread(block_idx, t, block, grid, state) for t in range(block)]
    waiting: list = [None] * block
    runners: list = [None] * block
    send: list = [None] * block
    for t in rng.permutation(block).tolist():
        result = _start(kernel, threads[t], args)
        runners[t], waiting[t] = (None, _DONE) if result is _DONE else (result, None)
    runnable = [t for t in range(block) if runners[t] is not None]
    while runnable:
        for t in rng.permutation(runnable).tolist():
            waiting[t] = _advance(threads[t], runners[t], send[t])
            send[t] = None
        # Warp operations first: a warp whose lanes all wait at a shuffle (or all at a ballot) exchanges values
        # and goes on.
        runnable = []
        for warp in sorted({t // WARP_SIZE for t in range(block) if isinstance(waiting[t], _WARP_OPS)}):
            _warp_exchange(block_idx, block, warp, waiting, send, threads)
            runnable += list(range(warp * WARP_SIZE, min(block, (warp + 1) * WARP_SIZE)))
        if not runnable:
            runnable = _release_barrier(block_idx, waiting, threads, state)


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



