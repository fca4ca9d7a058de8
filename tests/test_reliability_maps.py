"""Memory maps are one memory by the file's identity, not its name (docs/reliability.md, "Memory maps").

``memory.spans`` finds the file behind a mapped array from the mapping itself (``/proc/self/maps``: device, inode,
offset, on Linux), so two maps of one file are one memory however they were made: by name before and after a
rename, over an ``os.fdopen`` file object, as an ``mmap.mmap`` wrapped with ``np.frombuffer`` or with ctypes, or as a
shared ``torch.from_file`` tensor. Outputs that share
a file's bytes through two such routes are refused (the overlap error, nothing written); outputs in disjoint parts
of one file give the bits of separate buffers; the lock serializes calls on them. Where ``/proc/self/maps`` is
absent, ``numpy.memmap`` arrays are still compared by the name they were made with (the fallback, tested by hiding
the listing).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading
import time

import numpy as np
import pytest

import gpt2enc_edu as enc
from gpt2enc_edu import compare, memory, validate

pytestmark = pytest.mark.skipif(not os.path.exists(memory.PROC_MAPS) or sys.platform != "linux",
                                reason="the file identity of a map comes from /proc/self/maps (Linux)")

V, C, MAXT = 8, 32, 8
B, T = 2, 4
ROWS = V  # the file holds V rows of C fp32: dwte's size


def _routes(path, rows: int, offset: int = 0):
    """Maps of ``rows`` rows of ``path`` from byte ``offset``, made four ways; each is a function -> array."""
    def by_name():
        return np.memmap(path, dtype=np.float32, mode="r+", shape=(rows, C), offset=offset)

    def by_fdopen():
        with os.fdopen(os.open(path, os.O_RDWR), "r+b") as f:
            return np.memmap(f, dtype=np.float32, mode="r+", shape=(rows, C), offset=offset)

    def by_raw_mmap():
        with open(path, "r+b") as f:
            raw = mmap.mmap(f.fileno(), 0)
        return np.frombuffer(raw, dtype=np.float32, count=rows * C, offset=offset).reshape(rows, C)

    def renamed():  # a map made by the old name, after which the file moves to `path`
        old = f"{path}.old"
        os.rename(path, old)
        try:
            return np.memmap(old, dtype=np.float32, mode="r+", shape=(rows, C), offset=offset)
        finally:
            os.rename(old, path)

    def by_ctypes():  # ctypes over a raw mmap: the array's owner is a ctypes object, not the mmap
        with open(path, "r+b") as f:
            raw = mmap.mmap(f.fileno(), 0)
        return np.ctypeslib.as_array((ctypes.c_float * (rows * C)).from_buffer(raw, offset)).reshape(rows, C)

    def by_torch():  # a shared torch.from_file tensor, seen as NumPy (the PyTorch adapter's view on the CPU)
        torch = pytest.importorskip("torch")
        whole = torch.from_file(path, shared=True, size=os.path.getsize(path) // 4, dtype=torch.float32)
        return whole[offset // 4 : offset // 4 + rows * C].numpy().reshape(rows, C)

    return {"name": by_name, "fdopen": by_fdopen, "raw-mmap": by_raw_mmap, "renamed": renamed, "ctypes": by_ctypes,
            "torch": by_torch}


ROUTE_NAMES = ["name", "fdopen", "raw-mmap", "renamed", "ctypes", "torch"]
PAIRS = [(a, b) for a in ROUTE_NAMES for b in ROUTE_NAMES if a != "name" or b != "name"]


def _problem(rng):
    dwte = rng.standard_normal((V, C)).astype(np.float32)
    dout = rng.standard_normal((B, T, C)).astype(np.float32)
    inp = rng.integers(0, V, (B, T), dtype=np.int32)
    return dwte, dout, inp


@pytest.mark.parametrize(("route_te", "route_pe"), PAIRS, ids=[f"{a}+{b}" for a, b in PAIRS])
def test_outputs_sharing_a_file_through_two_routes_are_refused(tmp_path, rng, route_te, route_pe):
    """dwte and dwpe over the same bytes of one file, mapped two different ways: the overlap error, file unchanged.

    (Compared by name, a map made before a rename, over ``os.fdopen`` or through a raw ``mmap`` is not seen: the
    call would run and write both updates into the same bytes.)
    """
    path = tmp_path / "grads.bin"
    start, dout, inp = _problem(rng)
    start.tofile(path)
    dwte = _routes(str(path), ROWS)[route_te]()
    dwpe = _routes(str(path), MAXT)[route_pe]()
    assert memory.data_pointer(dwte) != memory.data_pointer(dwpe)
    with pytest.raises(ValueError, match="dwte and dwpe overlap in memory"):
        enc.encoder_backward(dwte, dwpe, dout, inp, seed=2, method="atomic")
    assert compare.bitwise_equal(np.fromfile(path, dtype=np.float32).reshape(ROWS, C), start)


@pytest.mark.parametrize("method", validate.METHODS[:3])
@pytest.mark.parametrize(("route_te", "route_pe"), [("fdopen", "name"), ("renamed", "raw-mmap"), ("ctypes", "torch")])
def test_outputs_in_disjoint_parts_of_a_file_give_separate_buffer_bits(tmp_path, rng, route_te, route_pe, method):
    """dwte in the file's first rows, dwpe after them, mapped two different ways: the bits of separate buffers."""
    path = tmp_path / "halves.bin"
    dwte0, dout, inp = _problem(rng)
    dwpe0 = rng.standard_normal((MAXT, C)).astype(np.float32)
    np.concatenate([dwte0, dwpe0]).tofile(path)
    dwte = _routes(str(path), ROWS)[route_te]()
    dwpe = _routes(str(path), MAXT, offset=dwte0.nbytes)[route_pe]()
    expected_te, expected_tp = dwte0.copy(), dwpe0.copy()
    enc.encoder_backward(expected_te, expected_tp, dout, inp, seed=5, method=method)
    enc.encoder_backward(dwte, dwpe, dout, inp, seed=5, method=method)
    got = np.fromfile(path, dtype=np.float32).reshape(-1, C)
    if method == "atomic":  # its order is random; with these few terms the sums still agree closely
        np.testing.assert_allclose(got, np.concatenate([expected_te, expected_tp]), rtol=1e-6, atol=1e-6)
    else:
        assert compare.bitwise_equal(got, np.concatenate([expected_te, expected_tp]))


def test_forward_out_over_wte_through_fdopen(tmp_path, rng):
    """``out`` mapped over the file ``wte`` is mapped from, through an ``os.fdopen`` file object: refused."""
    path = tmp_path / "wte.bin"
    wte0 = rng.standard_normal((B * T, C)).astype(np.float32)
    wte0.tofile(path)
    wte = _routes(str(path), B * T)["name"]()
    with os.fdopen(os.open(path, os.O_RDWR), "r+b") as f:
        out = np.memmap(f, dtype=np.float32, mode="r+", shape=(B, T, C))
    wpe = rng.standard_normal((MAXT, C)).astype(np.float32)
    with pytest.raises(ValueError, match="out and wte overlap in memory"):
        enc.encoder_forward(rng.integers(0, B * T, (B, T), dtype=np.int32), wte, wpe, out=out)
    assert compare.bitwise_equal(np.fromfile(path, dtype=np.float32).reshape(-1, C), wte0)


def test_lock_sees_one_file_through_two_routes(tmp_path):
    """A writer holding a map made by name keeps out a writer of a map made before a rename, until it lets go."""
    path = tmp_path / "locked.bin"
    np.zeros((ROWS, C), np.float32).tofile(path)
    first = _routes(str(path), ROWS)["renamed"]()
    second = _routes(str(path), ROWS)["fdopen"]()
    lock, inside = memory.SpanLock(), threading.Event()

    def writer():
        with lock.hold(writes=(second,)):
            inside.set()

    with lock.hold(writes=(first,)):
        thread = threading.Thread(target=writer)
        thread.start()
        deadline = time.monotonic() + 10
        while lock.waiting == 0:  # the second writer is parked on the first one's memory
            assert time.monotonic() < deadline, "the second writer never waited"
            time.sleep(0.001)
        assert not inside.is_set()
    thread.join(timeout=10)
    assert inside.is_set()


def test_without_proc_maps_memmaps_compare_by_name(tmp_path, rng, monkeypatch):
    """The fallback where ``/proc/self/maps`` is absent: two ``np.memmap`` of one file by name still overlap."""
    monkeypatch.setattr(memory, "PROC_MAPS", str(tmp_path / "no-such-listing"))
    path = tmp_path / "grads.bin"
    start, dout, inp = _problem(rng)
    start.tofile(path)
    dwte, dwpe = _routes(str(path), ROWS)["name"](), _routes(str(path), MAXT)["name"]()
    with pytest.raises(ValueError, match="dwte and dwpe overlap in memory"):
        enc.encoder_backward(dwte, dwpe, dout, inp, seed=2)
    assert compare.bitwise_equal(np.fromfile(path, dtype=np.float32).reshape(ROWS, C), start)
