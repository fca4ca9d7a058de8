"""The package's per-stream caches are bounded: least recently used dropped, entries a captured graph uses kept."""

from __future__ import annotations

import pytest

from gpt2enc_edu import caches
from gpt2enc_edu.caches import BoundedCache


def test_least_recently_used_is_dropped_first():
    cache = BoundedCache("test lru", 3)
    made = []

    def make(key):
        return lambda: made.append(key) or f"value {key}"

    for key in "abc":
        assert cache.get(key, make(key)) == f"value {key}"
    assert cache.get("a", make("a")) == "value a"  # a hit: nothing made, "a" now the most recent
    cache.get("d", make("d"))  # over the size: "b", the least recently used, goes
    assert made == ["a", "b", "c", "d"]
    assert [key for key, _ in cache.items()] == ["c", "a", "d"]
    cache.get("b", make("b"))  # made again
    assert made[-1] == "b" and len(cache) == 3


class _Capturing:
    """A stream being captured into a CUDA graph, as the caches see it."""

    def is_capturing(self) -> bool:
        return True


def test_entries_used_while_capturing_are_pinned_and_none_is_made_to_stay():
    cache = BoundedCache("test pinned", 2)
    made = cache.get("new", lambda: ["temporary"], stream=_Capturing())  # nothing made before the capture
    assert made == ["temporary"] and len(cache) == 0  # the call's own, from the capture's allocator: not kept
    cache.get("old", lambda: "old value")
    cache.get("old", lambda: "made again", stream=_Capturing())  # an entry a graph now uses: pinned
    for i in range(10):
        cache.get(i, lambda i=i: i)
    assert cache.get("old", lambda: "made again") == "old value"
    assert len(cache) == 3 and cache.pinned == 1
    assert dict(cache.items())["old"] == "old value"


def test_held_and_clear_cover_every_cache():
    cache = BoundedCache("test held", 4)
    cache.get(1, lambda: 1)
    cache.get(2, lambda: 2)
    cache.get(2, lambda: 2, stream=_Capturing())
    assert caches.held()["test held"] == (2, 1, 4)
    caches.clear()
    assert len(cache) == 0 and caches.held()["test held"] == (0, 0, 4)


def test_a_cache_holds_at_least_one_entry():
    with pytest.raises(ValueError, match="at least one"):
        BoundedCache("test empty", 0)


@pytest.mark.gpu
def test_gpu_calls_over_many_streams_and_shapes_stay_bounded(rng):
    """40 backward calls, each on a stream and a batch size of its own: every cache stays within its size, and
    the results stay those of the mirror."""
    import cupy

    import gpt2enc_edu.cuda  # noqa: F401  (registers the CUDA calls' caches)
    from gpt2enc_edu import encoder_backward
    from gpt2enc_edu.compare import bitwise_equal
    from gpt2enc_edu.problems import random_problem

    caches.clear()
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(40)]  # alive together: 40 distinct handles
    for i, stream in enumerate(streams):
        method = ("chunked", "bucketed", "atomic")[i % 3]
        p = random_problem(1 + i % 5, 260 + 4 * i, 64, 300, ids="zipf", rng=rng)
        g = p.on(cupy)
        with stream:
            encoder_backward(g.dwte, g.dwpe, g.dout, g.inp, seed=i, method=method)
            stream.synchronize()
        if method != "atomic":
            encoder_backward(p.dwte, p.dwpe, p.dout, p.inp, seed=i, method=method)
            assert bitwise_equal(g.dwte, p.dwte) and bitwise_equal(g.dwpe, p.dwpe)
    held = caches.held()
    assert all(entries - pinned <= size for entries, pinned, size in held.values()), held
    assert held["bucket table workspaces"][0] == 8, held  # full, not over: a table for each of 13 bucketed calls
    caches.clear()
    assert all(entries == 0 for entries, _, _ in caches.held().values())
