"""Which memory an array covers, and a lock that serializes calls writing the same memory.

``spans(array)`` lists the regions an array occupies: its address range (host or device: CUDA's unified
addressing gives every device allocation its own range), and, for arrays mapped from a file with
``numpy.memmap`` (or views of one, plain or not), the byte range of the file, keyed by the file's device
and inode. Two memory maps of one file sit at different addresses but write the same bytes; comparing file
ranges is what lets the overlap check and the lock see that.

``SPAN_LOCK`` is the package's one lock: after validation, a public call holds the memory it writes
(exclusively) and reads (shared with other readers) while it runs the mirror or queues the kernels.
Calls that share no written memory run side by side. A call takes all its regions at once or waits, so
there is no lock order and no deadlock. For CuPy arrays the lock orders the *launches*: work
queued on one stream runs in that order, work on different streams is ordered by the caller, as for
every CuPy operation.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager

import numpy as np

from .backend import is_cupy_array


def data_pointer(array) -> int:
    """Address of the first element (host address for NumPy, device address for CuPy)."""
    if is_cupy_array(array):
        return int(array.data.ptr)
    return int(array.__array_interface__["data"][0])


def _file_identity(filename: str):
    try:
        stat = os.stat(filename)
    except OSError:
        return ("path", os.path.abspath(filename))
    return ("file", stat.st_dev, stat.st_ino)


def _file_span(array):
    """``(file key, first byte, end byte)`` of a host array mapped from a file, else ``None``.

    Walks the ``.base`` chain to the ``numpy.memmap`` that owns the map (its base is the ``mmap`` object):
    that array's first element sits at the file offset ``offset``.
    """
    root = array
    while isinstance(getattr(root, "base", None), np.ndarray):
        root = root.base
    filename = getattr(root, "filename", None)
    if not isinstance(root, np.memmap) or filename is None:
        return None
    start = int(root.offset) + data_pointer(array) - data_pointer(root)
    return (_file_identity(filename), start, start + array.nbytes)


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
        with self._changed:
            self._changed.wait_for(lambda: not any(self._conflict(entry, other) for other in self._held.values()))
            self._held[token] = entry
        try:
            yield
        finally:
            with self._changed:
                del self._held[token]
                self._changed.notify_all()


#: The lock every public call of the package holds while it writes.
SPAN_LOCK = SpanLock()
