"""The package's per-stream caches, each bounded: what a CUDA call keeps between calls.

A call on the GPU reuses, per (device, stream, shape), the bucket table's workspace (``buckets.gpu``), the chunk
kernel's partial sums and the atomic method's fp32 rows (``cuda``), a side stream with its events (``cuda``) and
launch configurations (``driver``), and the PyTorch adapter keeps the call signatures it has validated and the launch
plans of its CUDA calls (``gpt2enc_edu.torch``, ``plans``; a plan holds the scratch its call used alive). Making them
afresh each call costs allocations and host time; keeping every one forever holds memory for streams and shapes that
are gone. So each cache keeps the entries used most recently, up to its size, and drops the least recently used one.

Three rules make this safe under CUDA graphs and beside torch:

* An entry's memory comes from CuPy's own pool, whatever allocator the call runs under (the PyTorch adapter's calls
  run with torch's): it outlives the call, and a pool that CUDA-graph trees (``torch.compile(mode=
  "reduce-overhead")``) own may hold only a graph's outputs and its temporaries, not memory kept between calls.
* A call on a stream being captured into a CUDA graph uses the entry made before the capture (its stream's warm-up
  call made it) and pins it: the graph holds its addresses and writes them at every replay, and nothing tells the
  package when the graph is gone, so a pinned entry is never dropped (``pinned`` counts them: one per shape and stream
  captured). Where no entry was made before, the call makes a temporary one under the capture's allocator (the
  graph's pool, from torch) and keeps nothing.
* Dropping an entry only drops the host's reference: CuPy's pool is stream-aware, so memory freed while the stream
  that used it still has work queued is reused only by later work on that stream.

``held()`` tells what every cache holds; ``clear()`` forgets it all (the memory goes back to the pool it came from),
for instance before a process moves on to other work on the same GPU.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

_all: list = []


class BoundedCache:
    """Up to ``size`` entries by key, least recently used dropped first, entries a captured graph uses pinned (see
    the module's docstring)."""

    def __init__(self, name: str, size: int):
        if size < 1:
            raise ValueError(f"a cache holds at least one entry, not {size}")
        self.name, self.size = name, size
        self._entries: OrderedDict = OrderedDict()
        self._pinned: dict = {}
        self._retired: list = []  # pinned entries replaced by ``put``
        self._lock = threading.Lock()
        _all.append(self)

    def get(self, key, make, stream=None):
        """The entry of ``key``, made by ``make()`` when absent. ``stream``: the CuPy stream an entry holding GPU
        memory serves (None for entries without memory): its memory then follows the module's rules."""
        if stream is None:
            return self._get(key, make, capturing=False)
        capturing = stream.is_capturing()
        with self._lock:
            known = key in self._pinned or key in self._entries
        if known:
            return self._get(key, make, capturing)
        if capturing:  # nothing made before the capture: a temporary from the capture's own allocator
            return make()
        import cupy

        with cupy.cuda.using_allocator(cupy.get_default_memory_pool().malloc):
            return self._get(key, make, capturing=False)

    def _get(self, key, make, capturing: bool):
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
            self._keep(key, value)
            return value

    def _keep(self, key, value) -> None:
        """``value`` as the most recently used entry of ``key``, the least recently used dropped beyond the size (the
        lock held)."""
        self._entries[key] = value
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def find(self, key, capturing: bool = False):
        """The entry of ``key`` or None, made most recently used; pinned where the caller's stream is ``capturing``
        (for entries that hold no GPU memory of their own making: ``get`` makes the others)."""
        with self._lock:
            value = self._pinned.get(key)
            if value is not None:
                return value
            value = self._entries.pop(key, None)
            if value is not None:
                if capturing:
                    self._pinned[key] = value
                else:
                    self._keep(key, value)
            return value

    def put(self, key, value) -> None:
        """Keep ``value`` under ``key`` (in place of what was there), dropping the least recently used beyond the
        size. A pinned entry it replaces stays held (a graph may still use its memory), as ``retired``."""
        with self._lock:
            replaced = self._pinned.pop(key, None)
            if replaced is not None:
                self._retired.append(replaced)
            self._entries.pop(key, None)
            self._keep(key, value)

    def __len__(self) -> int:
        return len(self._entries) + len(self._pinned) + len(self._retired)

    @property
    def pinned(self) -> int:
        return len(self._pinned) + len(self._retired)

    def items(self) -> list:
        with self._lock:
            return [*self._entries.items(), *self._pinned.items(), *((None, value) for value in self._retired)]

    def values(self) -> list:
        return [value for _, value in self.items()]

    def clear(self) -> None:
        """Forget every entry, pinned ones too (only when no captured graph that used them will replay)."""
        with self._lock:
            self._entries.clear()
            self._pinned.clear()
            self._retired.clear()


def held() -> dict[str, tuple[int, int, int]]:
    """Every cache of the package by name: (entries, of which pinned by a captured graph, its size)."""
    return {cache.name: (len(cache), cache.pinned, cache.size) for cache in _all}


def clear() -> None:
    """Forget the entries of every cache, pinned ones too: call it only when no CUDA graph captured over the package's
    calls will be replayed again, and after the GPU work queued with them (a ``synchronize``) when in doubt."""
    for cache in _all:
        cache.clear()
