"""Which memory an array covers, and a lock that serializes calls writing the same memory.

``spans(array)`` lists the regions an array occupies: its address range (host or device: CUDA's unified
addressing gives every device allocation its own range), and, for host arrays mapped from a file, the byte
range of the file, keyed by the file's device and inode. Two memory maps of one file sit at different
addresses but write the same bytes; comparing file ranges is what lets the overlap check and the lock see
that. The file is identified from the map itself, not from a name: where ``/proc/self/maps`` exists (Linux),
the mapping that holds the array's address gives the device, the inode and the file offset, so a map made
before the file was renamed, a map over an ``os.fdopen`` file object, an ``mmap.mmap`` wrapped with
``np.frombuffer`` or with ctypes, or a tensor of ``torch.from_file(..., shared=True)`` are all seen to be the same
memory as a map of the file by its current name. Elsewhere
(macOS, Windows) only ``numpy.memmap`` arrays have a file span, found from the name the map was made with
(``os.stat``), which a rename since then defeats.

``SPAN_LOCK`` is the package's one lock: a public call holds the memory it writes (exclusively) and reads
(shared with other readers) while it validates its arguments and runs the mirror or queues the kernels, so
the ids and flags it checked are the ones it runs on.
Calls that share no written memory run side by side. A call takes all its regions at once or waits, so
there is no lock order and no deadlock. For CuPy arrays the lock orders the *launches*: work
queued on one stream runs in that order, work on different streams is ordered by the caller, as for
every CuPy operation.

``deferred_interrupt()`` holds back ``KeyboardInterrupt`` (SIGINT) for a block: the NumPy path computes a
call's results into private buffers and copies them into the outputs inside it, so an interrupt leaves every
output as it was or entirely written.
"""

from __future__ import annotations

import mmap
import os
import signal
import threading
from contextlib import contextmanager

import numpy as np

from .backend import is_cupy_array


def data_pointer(array) -> int:
    """Address of the first element (host address for NumPy, device address for CuPy)."""
    if is_cupy_array(array):
        return int(array.data.ptr)
    return int(array.__array_interface__["data"][0])


#: Where Linux lists the process's mappings: address range, permissions, file offset, device, inode, path.
PROC_MAPS = "/proc/self/maps"


def _may_be_mapped(array) -> bool:
    """Whether ``array``'s memory may be mapped from a file, so that ``spans`` looks its address up.

    Follows views, memoryviews and ctypes buffers down to the owner of the memory. NumPy's and ctypes' own
    allocations and Python's bytes are not mapped; an ``mmap.mmap`` is; a torch tensor is where its storage says so
    (``torch.from_file(..., shared=True)``). Memory that anything else owns may be, and is looked up: the lookup
    reads ``/proc/self/maps`` (a fraction of a millisecond), which the common owners above do not need.
    """
    obj = array
    while True:
        if isinstance(obj, mmap.mmap):
            return True
        if isinstance(obj, np.ndarray):
            if obj.base is None:
                return not obj.flags.owndata
            obj = obj.base
        elif isinstance(obj, memoryview):
            obj = obj.obj
        elif isinstance(obj, (bytes, bytearray)):
            return False
        elif hasattr(obj, "_b_needsfree_"):  # a ctypes object
            if obj._b_needsfree_:  # ctypes allocated it
                return False
            held = obj._objects
            exporters = [v for v in held.values() if isinstance(v, memoryview)] if isinstance(held, dict) else []
            if len(exporters) != 1:  # from_address, or a layout not known here: look it up
                return True
            obj = exporters[0]  # from_buffer keeps the exporter's memoryview
        elif type(obj).__module__.startswith("torch") and hasattr(obj, "untyped_storage"):
            return getattr(obj.untyped_storage(), "filename", "unknown") is not None
        else:
            return True


def _maps_entry(address: int):
    """``(st_dev, st_ino, file offset of address)`` of the file mapping that holds ``address``.

    Read from ``/proc/self/maps``: the device and inode of the file mapped there, as ``os.stat`` would give
    them, whatever name the file has now or was opened by. ``None`` when the address lies in no file mapping.
    Raises ``OSError`` where the file cannot be read (no ``/proc``).
    """
    with open(PROC_MAPS, "rb") as listing:
        lines = listing.read().splitlines()
    for line in lines:
        fields = line.split(maxsplit=5)
        low, high = (int(x, 16) for x in fields[0].split(b"-"))
        if low <= address < high:
            inode = int(fields[4])
            if inode == 0:  # anonymous memory
                return None
            major, minor = (int(x, 16) for x in fields[3].split(b":"))
            return os.makedev(major, minor), inode, int(fields[2], 16) + address - low
    return None


def _memmap_by_name(array):
    """``(key, first byte)`` in its file of a ``numpy.memmap`` (or a view of one), from the map's file name.

    The fallback where ``/proc/self/maps`` is absent: walks the ``.base`` chain to the ``numpy.memmap`` that
    owns the map, whose first element sits at the file offset ``offset``, and identifies the file by
    ``os.stat`` of the name the map was made with. ``None`` for other arrays.
    """
    root = array
    while isinstance(getattr(root, "base", None), np.ndarray):
        root = root.base
    filename = getattr(root, "filename", None)
    if not isinstance(root, np.memmap) or filename is None:
        return None
    try:
        stat = os.stat(filename)
        key = ("file", stat.st_dev, stat.st_ino)
    except OSError:
        key = ("path", os.path.abspath(filename))
    return key, int(root.offset) + data_pointer(array) - data_pointer(root)


def _file_span(array):
    """``(file key, first byte, end byte)`` of a host array mapped from a file, else ``None``."""
    if not _may_be_mapped(array):
        return None
    try:
        entry = _maps_entry(data_pointer(array))
    except OSError:
        found = _memmap_by_name(array)
        if found is None:
            return None
        key, start = found
    else:
        if entry is None:
            return None
        device, inode, start = entry
        key = ("file", device, inode)
    return (key, start, start + array.nbytes)


def spans(array) -> list[tuple]:
    """The memory ``array`` covers: ``[(space, first byte, end byte), ...]``, C-contiguous arrays assumed."""
    start = data_pointer(array)
    space = "cuda" if is_cupy_array(array) else "host"
    found = [(space, start, start + array.nbytes)]
    if space == "host":
        in_file = _file_span(array)
        if in_file is not None:
            found.append(in_file)
    return found


def overlap(a: list[tuple], b: list[tuple]) -> bool:
    """Whether two span lists share a byte (in one address space or one file)."""
    return any(sa == sb and a0 < b1 and b0 < a1 for sa, a0, a1 in a for sb, b0, b1 in b)


class SpanLock:
    """A readers-writer lock over memory regions: writers exclusive, readers shared, all regions at once."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._held: dict[object, tuple[list, list]] = {}  # (written spans, read spans) of each call in progress
        self._waiting = 0

    @property
    def waiting(self) -> int:
        """How many calls are waiting for memory that another call holds (the tests use it to know that a call
        is parked before they change what it will read)."""
        with self._changed:
            return self._waiting

    @staticmethod
    def _conflict(mine: tuple[list, list], theirs: tuple[list, list]) -> bool:
        (my_writes, my_reads), (their_writes, their_reads) = mine, theirs
        return (overlap(my_writes, their_writes) or overlap(my_writes, their_reads)
                or overlap(my_reads, their_writes))

    @contextmanager
    def hold(self, writes, reads=(), resources=()):
        """Hold the memory of the arrays ``writes`` (exclusively) and ``reads`` (shared) for the block.

        ``resources`` are further hashable keys held exclusively (the launchers hold their CUDA stream,
        whose scratch buffers and events a call reuses).
        """
        written = [s for a in writes for s in spans(a)] + [(("resource", key), 0, 1) for key in resources]
        entry = (written, [s for a in reads for s in spans(a)])
        token = object()
        try:  # the entry is removed whatever interrupts the block, KeyboardInterrupt included
            with self._changed:
                def free() -> bool:
                    return not any(self._conflict(entry, other) for other in self._held.values())

                if not free():
                    self._waiting += 1
                    try:
                        self._changed.wait_for(free)
                    finally:
                        self._waiting -= 1
                self._held[token] = entry
            yield
        finally:
            with self._changed:
                if self._held.pop(token, None) is not None:
                    self._changed.notify_all()


#: The lock every public call of the package holds while it writes.
SPAN_LOCK = SpanLock()


@contextmanager
def deferred_interrupt():
    """Hold back SIGINT (``KeyboardInterrupt``) for the block; one that arrives meanwhile is delivered after it.

    For the commit of a call's outputs: the block's copies are then all made or, if the interrupt came
    before the block, none. Only the main thread of the main interpreter receives SIGINT in Python and may
    change its handler; in any other thread, or when the handler was not installed from Python, the block
    runs as it is (no ``KeyboardInterrupt`` can be raised there).
    """
    received = []
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.getsignal(signal.SIGINT)
        if previous is not None:
            try:
                signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
            except ValueError:  # not the main interpreter
                previous = None
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
            if received:
                signal.raise_signal(signal.SIGINT)  # to the handler that was in place: KeyboardInterrupt by default
