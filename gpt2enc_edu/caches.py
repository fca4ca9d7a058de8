"""The package's per-stream caches, each bounded: what a CUDA call keeps between calls.

A call on the GPU reuses, per (device, stream, shape), the bucket table's workspace (``buckets.gpu``), the chunk
kernel's partial sums and the atomic method's fp32 rows (``cuda``), a side stream with its events (``cuda``) and
launch configurations (``driver``). Making them afresh each call costs allocations and host time; keeping every one
forever holds memory for streams and shapes that are gone (in torch's pool, when called from the PyTorch adapter).
So each cache keeps the entries used most recently, up to its size, and drops the least recently used one.

Two rules make dropping safe:

* An entry is dropped only from the host's view: CuPy's pool and torch's caching allocator are stream-aware, so
  memory freed while the stream that used it still has work queued is reused only by later work on that stream.
* An entry used while its stream was being captured into a CUDA graph is never dropped: the graph holds its
  addresses and writes them at every replay, and nothing tells the package when the graph is gone. Such entries
  count apart (``pinned``); there is one per shape and stream captured.

``held()`` tells what every cache holds; ``clear()`` forgets it all (the memory goes back to the pool it came from),
for instance before a process moves on to other work on the same GPU.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

_all: list = []


class BoundedCache:
    """Up to ``size`` entries by key, least recently used dropped first; ``get(key, make, capturing)`` returns the
    entry, made by ``make()`` when absent, and pins it when ``capturing`` (see the module's docstring)."""

    def __init__(self, name: str, size: int):
        if size < 1:
            raise ValueError(f"a cache holds at least one entry, not {size}")
        self.name, self.size = name, size
        self._entries: OrderedDict = OrderedDict()
        self._pinned: dict = {}
        self._lock = threading.Lock()
        _all.append(self)

    def get(self, key, make, capturing: bool = False):
        with self._lock:
            value = self._pinned.get(key)
            if value is not None:
                return value
            value = self._entries.get(key)
            if value is None:
                value = make()
            else:
                del self._entries[key]
            if capturing:
                self._pinned[key] = value
                return value
            self._entries[key] = value
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
            return value

    def __len__(self) -> int:
        return len(self._entries) + len(self._pinned)

    @property
    def pinned(self) -> int:
        return len(self._pinned)

    def items(self) -> list:
        with self._lock:
            return [*self._entries.items(), *self._pinned.items()]

    def values(self) -> list:
        return [value for _, value in self.items()]

    def clear(self) -> None:
        """Forget every entry, pinned ones too (only when no captured graph that used them will replay)."""
        with self._lock:
            self._entries.clear()
            self._pinned.clear()


def held() -> dict[str, tuple[int, int, int]]:
    """Every cache of the package by name: (entries, of which pinned by a captured graph, its size)."""
    return {cache.name: (len(cache), cache.pinned, cache.size) for cache in _all}


def clear() -> None:
    """Forget the entries of every cache, pinned ones too: call it only when no CUDA graph captured over the package's
    calls will be replayed again, and after the GPU work queued with them (a ``synchronize``) when in doubt."""
    for cache in _all:
        cache.clear()
