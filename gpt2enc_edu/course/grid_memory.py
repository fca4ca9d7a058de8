"""Device memory of the grid emulator: arrays that know their name, check every index and report races.

``grid.launch`` hands a kernel ``DeviceArray`` views instead of plain NumPy arrays:

* an input (a ``const`` pointer of the CUDA kernel) is an immutable copy: an assignment names the thread and
  the array, and NumPy refuses every other way of writing into it (``flags.writeable = True`` included);
* an output, and every ``__shared__`` array, records who wrote and who read each element since the block's
  last barrier (a write goes through indexing or ``store128``; NumPy functions that write in place, such as
  ``np.copyto`` or a ufunc's ``out=``, are refused: the emulator could not see who wrote what). Two
  different threads touching one element between two barriers, at least one of them writing, is a
  ``RaceHazard`` (compute-sanitizer's racecheck reports the same pairs on the GPU): of one block, when no
  ``__syncthreads()`` lies between the accesses; of two blocks, always (nothing orders blocks). A NumPy function
  or a ufunc given such an array reads all of it (``DeviceArray.load``; ``kernel_numpy`` makes ``np.asarray`` and
  its kin do the same in a graded run), and an array method that would make a view or a copy of it is refused,
  since reads through that would not be recorded;
* an atomics-only buffer (``read_only``) refuses every plain write; ``cuda.atomic_add`` is its only way in;
* an index past either end (a negative one included: on a GPU it is an address before the array) is a
  ``KernelFault`` naming the thread, the array and the index.

Every hazard carries a ``picture``: the failing block's threads by role (who faulted, who raced with whom),
the array and its elements, so ``Verdict.show()`` can draw it. A read returns a copy (a load into
registers), so a write always goes through the array and is seen.
"""

from __future__ import annotations

import numpy as np

#: A reader record that stands for more than one thread (or block).
_MANY = -2


class Hazard(RuntimeError):
    """A misuse of the grid the GPU would not report, or would report only under a sanitizer; ``picture`` says
    which threads of which block did what (a dict that ``verdict.draw_hazard`` draws).

    A hazard is remembered when it is made (``pending``): a kernel that catches it and goes on is stopped with it
    as soon as its thread yields or ends, so a ``try``/``except`` cannot hide a race or a fault."""

    def __init__(self, message: str, picture: dict | None = None):
        super().__init__(message)
        self.picture = picture or {}
        _RAISED.append(self)


_RAISED: list[Hazard] = []


def pending() -> Hazard | None:
    """The first hazard made since ``forget``, caught or not."""
    return _RAISED[0] if _RAISED else None


def forget() -> None:
    _RAISED.clear()


class KernelFault(Hazard):
    """A thread read or wrote outside an array, wrote an input, or misused the emulator."""


class BarrierHazard(Hazard):
    """Threads of one block disagree about a barrier or a shuffle (some wait, some returned or went elsewhere)."""


class RaceHazard(Hazard):
    """Two threads touched one element with nothing ordering them, at least one of them writing."""


def picture(thread, roles: dict, array: str | None = None, elements=()) -> dict:
    """The picture of a hazard in ``thread``'s block: role -> thread indices of that block."""
    block = getattr(thread, "blockIdx", None)
    return {"block": "?" if block is None else (block.x if thread.gridDim.y == 1 else [block.x, block.y]),
            "block_size": int(thread.blockDim.x) if block is not None else 0,
            "roles": {role: sorted({int(t) for t in ts}) for role, ts in roles.items()},
            "array": array, "elements": [int(e) for e in list(elements)[:64]]}


class Tracker:
    """What one launch shares among its arrays: the running thread, and the barrier intervals."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.current = None  # the Thread whose code runs now
        self.intervals = 0
        self.written: dict[int, int] = {}  # global thread id -> elements of global arrays it wrote or added into

    def count(self, elements: int) -> None:
        gid = self.current._gid
        self.written[gid] = self.written.get(gid, 0) + elements

    def busiest(self) -> tuple[int, int, int, int]:
        """(block, thread, elements, block size) of the thread that wrote the most elements of global arrays."""
        if not self.written:
            return -1, -1, 0, self.block_size
        gid = max(self.written, key=self.written.get)
        return gid // self.block_size, gid % self.block_size, self.written[gid], self.block_size

    def new_interval(self) -> int:
        self.intervals += 1
        return self.intervals


class Memory:
    """One array's record: its name, what a kernel may do with it, and who touched which element."""

    def __init__(self, name: str, access: str, kind: str, shape, target=None):
        self.name, self.access, self.kind = name, access, kind  # access: "read", "write" or "atomic"
        self.shape, self.size = tuple(shape), int(np.prod(shape))
        self.target = target  # the writable array behind the view (access "write"), or that atomic adds land in
        self.tracker: Tracker | None = None
        self.writes: dict[int, tuple[int, int]] = {}  # element -> (thread, interval)
        self.reads: dict[int, tuple[int, int, int]] = {}  # element -> (thread or _MANY, block or _MANY, interval)
        self._ids = None

    def _who(self):
        thread = self.tracker.current if self.tracker is not None else None
        return thread if thread is not None else "a thread"

    def fault(self, what: str, index) -> None:
        thread = self._who()
        raise KernelFault(f"{thread}: {what} {self.name}[{index}], outside the array ({self.size} elements)",
                          picture(thread, {f"{what} {self.name}[{index}]": [thread.threadIdx.x]}
                                  if hasattr(thread, "threadIdx") else {}, self.name, [index] if
                                  isinstance(index, (int, np.integer)) else []))

    def index(self, key, what: str) -> np.ndarray:
        """The flat element ids ``key`` selects; a fault for a negative or too large index."""
        parts = key if isinstance(key, tuple) else (key,)
        for part in parts:
            if isinstance(part, (float, np.floating)) or (isinstance(part, np.ndarray) and part.dtype.kind == "f"):
                thread = self._who()
                raise KernelFault(f"{thread}: {what} {self.name}[{part}], an index that is not an integer (in "
                                  "Python `/` divides into a float: `//` is CUDA's integer division)",
                                  picture(thread, {f"{what} {self.name}[{part}]": [thread.threadIdx.x]}, self.name)
                                  if hasattr(thread, "threadIdx") else {})
            if isinstance(part, slice):
                if (part.start is not None and part.start < 0) or (part.stop is not None and part.stop < 0):
                    self.fault(what, part.start if part.start is not None and part.start < 0 else part.stop)
                if part.stop is not None and len(parts) == 1 and len(self.shape) == 1 and part.stop > self.size:
                    self.fault(what, f"{part.start or 0}:{part.stop}")
            elif isinstance(part, (int, np.integer)) and part < 0:
                self.fault(what, int(part))
            elif isinstance(part, (list, np.ndarray)) and np.size(part) and np.asarray(part).dtype.kind in "iu" \
                    and np.min(part) < 0:
                self.fault(what, int(np.min(part)))
        if self._ids is None:
            self._ids = np.arange(self.size).reshape(self.shape)
        try:
            return np.asarray(self._ids[key]).reshape(-1)
        except IndexError:
            bad = [int(p) for p in parts if isinstance(p, (int, np.integer))] + \
                  [int(np.max(p)) for p in parts if isinstance(p, (list, np.ndarray)) and np.size(p)]
            self.fault(what, bad[-1] if bad else key)

    def _race(self, element: int, other, other_did: str, did: str, other_block=None) -> None:
        """Raise the race of the running thread with thread ``other`` (a global thread id; None: several threads,
        of ``other_block`` or of several blocks when that is None)."""
        thread, size = self.tracker.current, self.tracker.block_size
        block = thread._gid // size
        if other is None:
            same_block = other_block == block
            other_name = "other threads of the same block" if same_block else "threads of other blocks"
        else:
            same_block = other // size == block
            other_name = (f"thread {other % size} of the same block" if same_block else
                          f"thread {other % size} of block {other // size}")
        if not same_block:
            other_name += " (another block: no barrier orders them)"
        kind = "shared" if self.kind == "shared" else "global"
        roles = {f"{did} {self.name}[{element}]": [thread.threadIdx.x]}
        if same_block and other is not None:
            roles[f"{other_did} {self.name}[{element}]"] = [other % size]
        raise RaceHazard(
            f"race on {kind} memory {self.name}[{element}]: {thread} {did} it, and {other_name} {other_did} it "
            "with no __syncthreads() between (compute-sanitizer's racecheck reports this pair). Put a barrier "
            "between the write and the other thread's access, or let one thread own the element.",
            picture(thread, roles, self.name, [element]))

    def read(self, ids) -> None:
        self._access(ids, writing=False)

    def write(self, ids) -> None:
        thread = self.tracker.current
        if self.access != "write":
            self.refuse(thread)
        if self.kind == "global":
            self.tracker.count(len(ids))
        self._access(ids, writing=True)

    def _access(self, ids, writing: bool) -> None:
        """Record the running thread's reads or writes of elements ``ids``, raising the first race: an element
        another thread wrote (or, for a write, read) in the same barrier interval of its block, or in another block."""
        thread = self.tracker.current
        gid, size, interval = thread._gid, self.tracker.block_size, thread._block["interval"]
        block = gid // size
        did = "wrote" if writing else "read"
        writes, reads = self.writes, self.reads
        for e in ids:
            w = writes.get(e)
            if w is not None and w[0] != gid and (w[0] // size != block or w[1] == interval):
                self._race(e, w[0], "wrote", did)
            r = reads.get(e)
            if writing:
                if r is not None and r[0] != gid and (r[1] != block or r[2] == interval):
                    self._race(e, None if r[0] == _MANY else r[0], "read", "wrote", None if r[1] == _MANY else r[1])
                writes[e] = (gid, interval)
            elif r is None or r[0] == gid or (r[1] == block and r[2] != interval):
                reads[e] = (gid, block, interval)
            else:
                reads[e] = (_MANY, block if r[1] == block else _MANY, interval)

    def refuse(self, thread) -> None:
        why = ("many threads add into it at once: only cuda.atomic_add may change it" if self.access == "atomic"
               else "it is an input of the kernel (a const pointer): a kernel never writes its inputs"
               if self.access == "read" else "NumPy functions that write in place are refused: write its "
               "elements with `array[i] = value`, `array[i:j] = values` or store128, which the emulator sees")
        raise KernelFault(f"{thread}: wrote into {self.name}, but {why}",
                          picture(thread, {f"wrote {self.name}": [thread.threadIdx.x]}, self.name)
                          if hasattr(thread, "threadIdx") else {})


#: Depth of the emulator's own indexing of a ``DeviceArray`` (its views are made and dropped inside it).
_INSIDE = [0]


class DeviceArray(np.ndarray):
    """A kernel's view of one array (see the module docstring); arithmetic on it gives plain arrays."""

    _mem: Memory | None = None

    def __array_finalize__(self, obj):
        mem = getattr(obj, "_mem", None)
        if mem is not None and mem.access == "write" and not _INSIDE[0]:
            # A view (reshape, .T, ravel) or a copy made by a method would let its reads bypass the record of who
            # read what, and so hide a race: the kernel indexes the array itself, or loads it whole (np.asarray).
            raise KernelFault(f"{mem._who()}: made an array from {mem.name} with an array method; index {mem.name} "
                              f"itself ({mem.name}[i], {mem.name}[a:b], load128) or load it with np.asarray, so "
                              "the emulator sees each read")
        self._mem = None  # a view or a result derived from a device array is a plain value, not the array

    def load(self) -> np.ndarray:
        """The whole array as a read-only plain copy, recorded as a read of every element by the running thread
        (``np.asarray``, a NumPy function or a ufunc given the array)."""
        mem = self._mem
        if mem is not None and mem.access == "write" and mem.tracker is not None and \
                mem.tracker.current is not None:
            mem.read(range(mem.size))
        copy = self.view(np.ndarray).copy()
        copy.flags.writeable = False  # writing into it would change nothing: refused, as writing the view is
        return copy

    # Ways to read every element that NumPy does not route through __getitem__: through a whole load.
    def __iter__(self):
        return iter(_loaded([self])[0])

    def tolist(self):
        return _loaded([self])[0].tolist()

    def item(self, *args):
        return _loaded([self])[0].item(*args)

    def tobytes(self, order="C"):
        return _loaded([self])[0].tobytes(order)

    def __array_function__(self, func, types, args, kwargs):
        return func(*_loaded(args), **dict(zip(kwargs, _loaded(kwargs.values()))))

    def __getitem__(self, key):
        mem = self._mem
        if mem is None:
            return np.ndarray.__getitem__(self, key)
        if type(key) is int and len(mem.shape) == 1:
            if not 0 <= key < mem.size:
                mem.fault("read", key)
            if mem.access == "write":
                mem.read((key,))
            return np.ndarray.__getitem__(self, key)
        ids = mem.index(key, "read")
        if mem.access == "write":
            mem.read(ids.tolist())
        _INSIDE[0] += 1
        try:
            result = np.ndarray.__getitem__(self, key)
        finally:
            _INSIDE[0] -= 1
        return result.view(np.ndarray).copy() if isinstance(result, np.ndarray) else result

    def __setitem__(self, key, value):
        mem = self._mem
        if mem is not None:
            if mem.access != "write":
                mem.refuse(mem._who())
            if type(key) is int and len(mem.shape) == 1:
                if not 0 <= key < mem.size:
                    mem.fault("wrote", key)
                mem.write((key,))
            else:
                mem.write(mem.index(key, "wrote").tolist())
        value = _loaded([value])[0]  # another device array as the value: a read of all of it
        # through the writable array behind the view (NumPy's own slice assignment on the view would call
        # __getitem__, which returns a copy, and the view itself is read-only)
        np.ndarray.__setitem__(self.view(np.ndarray) if mem is None else mem.target, key, value)

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        plain = _loaded(inputs)
        if out is not None:
            for o in out:
                if isinstance(o, DeviceArray) and o._mem is not None:
                    o._mem.refuse(o._mem._who())
            kwargs["out"] = tuple(o.view(np.ndarray) if isinstance(o, DeviceArray) else o for o in out)
        return getattr(ufunc, method)(*plain, **kwargs)


def _loaded(values) -> list:
    """``values`` with each ``DeviceArray`` loaded whole (``DeviceArray.load``) and each list or tuple of them too:
    what a NumPy function or a ufunc reads of a device array, it reads all of."""
    def one(x):
        if isinstance(x, DeviceArray):
            return x.load() if x._mem is not None else x.view(np.ndarray)
        if isinstance(x, (list, tuple)):
            return type(x)(one(v) for v in x)
        return x
    return [one(x) for x in values]


def kernel_numpy(numpy_module=np):
    """NumPy as a graded kernel sees it: the same module, except that the functions that turn an argument into an
    array (``np.asarray``, ``np.array``, ...), which NumPy does not let a ``DeviceArray`` intercept, load a device
    array whole first (``DeviceArray.load``), so that the emulator sees the read."""
    import types

    class KernelNumPy(types.ModuleType):
        def __getattr__(self, name):
            real = getattr(numpy_module, name)
            if name not in _CONVERTERS:
                return real
            return lambda a, *args, **kwargs: real(_loaded([a])[0], *args, **kwargs)

    return KernelNumPy("numpy", numpy_module.__doc__)


#: NumPy's functions that make an array of their first argument without dispatching on its type.
_CONVERTERS = frozenset({"array", "asarray", "asanyarray", "ascontiguousarray", "asfortranarray", "asarray_chkfinite",
                         "require", "fromiter"})


def device_array(array: np.ndarray, name: str, access: str, kind: str = "global") -> DeviceArray:
    """``array`` as a kernel sees it: a view that records (``access="write"``), or an immutable copy."""
    if access == "write":  # the kernel's view is read-only: every write goes through __setitem__ into target
        view = array.view(DeviceArray)
        view.flags.writeable = False
        target = array
    else:
        target = array if access == "atomic" else None
        flat = np.ascontiguousarray(array)
        view = np.frombuffer(flat.tobytes(), dtype=array.dtype).reshape(array.shape).view(DeviceArray)
    view._mem = Memory(name, access, kind, array.shape, target)
    return view


def read_only(array: np.ndarray) -> DeviceArray:
    """A flat view of ``array`` for a kernel that may change it only with ``cuda.atomic_add``: plain writes are
    refused (even after ``flags.writeable = True``), and the adds land in ``array`` after the launch."""
    flat = array.reshape(-1)
    if not np.shares_memory(flat, array):
        raise ValueError("read_only needs a contiguous array (the atomic adds must land in it)")
    return device_array(flat, "an atomics-only array", "atomic")
