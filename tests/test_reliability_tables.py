"""Host bucket tables are range-checked, with or without ``check_ids`` (docs/reliability.md, "Bucket tables").

A ``BucketTable`` passed as ``buckets=`` is copied and its contents checked before anything runs
(``validate_buckets.check_table_contents``): positions in ``[0, B*T)``, tokens in ``[0, V)``, every row's range inside
``bt_list``, channel groups and chunks in range, the multi-chunk units a prefix with their chunks inside it. An
edited table is refused with a ValueError naming the field, and nothing is written, on both backends (run, such a
table reads and writes out of bounds on the GPU, and on the mirror raises a raw IndexError half-way or wraps negative
indices silently). A table edited after the call took its copy cannot change what the call runs on.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import numpy as np
import pytest

import gpt2enc_edu as enc
from gpt2enc_edu import compare, memory
from gpt2enc_edu.backend import to_numpy
from gpt2enc_edu.layout import CHUNK_ITEMS

B, T, C, V = 2, 40, 32, 16
BT = B * T
FREQUENT = 3  # a token of more than one chunk: its units open the unit list


def _ids(rng) -> np.ndarray:
    ids = rng.integers(0, V, (B, T), dtype=np.int32)
    ids[0, :] = FREQUENT  # 40+ occurrences: two chunks
    return ids


def _edit(table, field: str, row: int, col: int | None, value):
    """A copy of ``table`` with ``field[row, col]`` (``bt_list[row]`` when ``col`` is None) set to ``value``."""
    array = getattr(table, field).copy()
    if col is None:
        array[row] = value
    else:
        array[row, col] = value
    return replace(table, **{field: array})


def _reordered_units(table):
    """The unit list reversed: the multi-chunk token's units are not a prefix."""
    return replace(table, units=np.ascontiguousarray(table.units[::-1]))


def _chunk_moved(table):
    """The second unit of the two-chunk token claims chunk 0: its token would start one row further on."""
    return _edit(table, "units", 1, 1, 0)


EDITS = {
    "bt_list position B*T": lambda t: _edit(t, "bt_list", 0, None, BT),
    "bt_list position -1": lambda t: _edit(t, "bt_list", 5, None, -1),
    "info token V": lambda t: _edit(t, "info", 0, 2, V),
    "info token -3": lambda t: _edit(t, "info", 2, 2, -3),
    "info size past bt_list": lambda t: _edit(t, "info", 1, 1, BT),
    "info start -1": lambda t: _edit(t, "info", 1, 0, -1),
    "info size 0": lambda t: _edit(t, "info", 1, 1, 0),
    "info channel group -1": lambda t: _edit(t, "info", 0, 3, -1),
    "units token V": lambda t: _edit(t, "units", 2, 0, V),
    "units token -1": lambda t: _edit(t, "units", 0, 0, -1),
    "units start past bt_list": lambda t: _edit(t, "units", 2, 2, BT),
    "units chunk past its size": lambda t: _edit(t, "units", 2, 1, 1),
    "units chunk -1": lambda t: _edit(t, "units", 0, 1, -1),
    "multi-chunk units not first": _reordered_units,
    "multi-chunk unit's token outside the prefix": _chunk_moved,
    "info bucket dropped": lambda t: replace(t, info=np.ascontiguousarray(t.info[1:])),
    "units size changed": lambda t: _edit(t, "units", 2, 3, 3),
}


@pytest.mark.parametrize("check_ids", [False, True])
@pytest.mark.parametrize("method", ["bucketed", "chunked"])
@pytest.mark.parametrize("edit", list(EDITS))
def test_edited_host_table_is_refused(xp, rng, edit, method, check_ids):
    inp = _ids(rng)
    table = enc.make_buckets(inp, C, np.float32)
    assert table.units[0, 3] > CHUNK_ITEMS and table.units[1, 1] == 1  # the edits above assume this layout
    bad = EDITS[edit](table)
    dwte0 = rng.standard_normal((V, C)).astype(np.float32)
    dwpe0 = rng.standard_normal((T, C)).astype(np.float32)
    dout = xp.asarray(rng.standard_normal((B, T, C)).astype(np.float32))
    dwte, dwpe = xp.asarray(dwte0), xp.asarray(dwpe0)
    with pytest.raises(ValueError, match=r"buckets\.(bt_list|info|units)"):
        enc.encoder_backward(dwte, dwpe, dout, xp.asarray(inp), seed=9, method=method, buckets=bad,
                             check_ids=check_ids)
    assert compare.bitwise_equal(to_numpy(dwte), dwte0) and compare.bitwise_equal(to_numpy(dwpe), dwpe0)


@pytest.mark.parametrize("method", ["bucketed", "chunked"])
def test_valid_host_table_without_check_gives_the_same_bits(xp, rng, method):
    """The range check refuses nothing that ``make_buckets`` builds: the bits of a call that builds its own table."""
    inp = _ids(rng)
    table = enc.make_buckets(inp, C, np.float32)
    dwte0 = rng.standard_normal((V, C)).astype(np.float32)
    dwpe0 = rng.standard_normal((T, C)).astype(np.float32)
    dout = xp.asarray(rng.standard_normal((B, T, C)).astype(np.float32))
    own_te, own_pe = xp.asarray(dwte0), xp.asarray(dwpe0)
    enc.encoder_backward(own_te, own_pe, dout, xp.asarray(inp), seed=9, method=method)
    given_te, given_pe = xp.asarray(dwte0), xp.asarray(dwpe0)
    enc.encoder_backward(given_te, given_pe, dout, xp.asarray(inp), seed=9, method=method, buckets=table,
                         check_ids=False)
    assert compare.bitwise_equal(to_numpy(given_te), to_numpy(own_te))
    assert compare.bitwise_equal(to_numpy(given_pe), to_numpy(own_pe))


def test_table_edited_while_the_call_waits_is_checked(rng):
    """A table's arrays edited while the call waits for its memory: the call copies and checks what it then finds."""
    inp = _ids(rng)
    table = enc.make_buckets(inp, C, np.float32)
    dwte0 = rng.standard_normal((V, C)).astype(np.float32)
    dwpe0 = rng.standard_normal((T, C)).astype(np.float32)
    dout = rng.standard_normal((B, T, C)).astype(np.float32)
    dwte, dwpe = dwte0.copy(), dwpe0.copy()
    errors = []

    def call():
        try:
            enc.encoder_backward(dwte, dwpe, dout, inp, seed=9, buckets=table, check_ids=False)
        except ValueError as exc:
            errors.append(exc)

    with memory.SPAN_LOCK.hold(writes=(dwte,)):
        thread = threading.Thread(target=call)
        thread.start()
        deadline = time.monotonic() + 10
        while memory.SPAN_LOCK.waiting == 0:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        table.units[2, 0] = -5  # the table the call was given, edited in place
    thread.join(timeout=30)
    assert errors and "buckets.units" in str(errors[0]), errors
    assert compare.bitwise_equal(dwte, dwte0) and compare.bitwise_equal(dwpe, dwpe0)


def test_table_without_bucket_rows(rng):
    """A host table without its bucket rows: refused for the bucketed method, which reads them; the chunked method's
    bits for the chunked one."""
    inp = _ids(rng)
    table = enc.make_buckets(inp, C, np.float32)
    no_rows = replace(table, info=np.empty((0, 4), np.int32))
    dwte0 = rng.standard_normal((V, C)).astype(np.float32)
    dwpe0 = rng.standard_normal((T, C)).astype(np.float32)
    dout = rng.standard_normal((B, T, C)).astype(np.float32)
    dwte, dwpe = dwte0.copy(), dwpe0.copy()
    with pytest.raises(ValueError, match="reads the bucket rows, and buckets.info has none"):
        enc.encoder_backward(dwte, dwpe, dout, inp, seed=9, method="bucketed", buckets=no_rows, check_ids=False)
    assert compare.bitwise_equal(dwte, dwte0) and compare.bitwise_equal(dwpe, dwpe0)
    expected_te, expected_pe = dwte0.copy(), dwpe0.copy()
    enc.encoder_backward(expected_te, expected_pe, dout, inp, seed=9, method="chunked")
    enc.encoder_backward(dwte, dwpe, dout, inp, seed=9, method="chunked", buckets=no_rows, check_ids=False)
    assert compare.bitwise_equal(dwte, expected_te) and compare.bitwise_equal(dwpe, expected_pe)


@pytest.mark.gpu
def test_device_table_over_an_output_is_refused(rng):
    """A ``DeviceBucketTable`` is not read on the host, but its arrays' addresses are checked: one over ``dwte``'s
    memory is refused (the overlap error), and nothing is written."""
    import cupy

    inp = cupy.asarray(_ids(rng))
    table = enc.make_buckets(inp, C, np.float32, V=V)
    dwte0 = rng.standard_normal((V, C)).astype(np.float32)
    dwpe0 = rng.standard_normal((T, C)).astype(np.float32)
    dwte, dwpe = cupy.asarray(dwte0), cupy.asarray(dwpe0)
    dwte.reshape(-1)[:BT] = table.bt_list.view(np.float32)  # the table's positions, held in dwte's memory
    dwte0 = cupy.asnumpy(dwte)
    aliased = replace(table, bt_list=dwte.reshape(-1).view(np.int32)[:BT])
    dout = cupy.asarray(rng.standard_normal((B, T, C)).astype(np.float32))
    with pytest.raises(ValueError, match=r"dwte and buckets\.bt_list overlap in memory"):
        enc.encoder_backward(dwte, dwpe, dout, inp, seed=9, buckets=aliased, check_ids=False)
    assert compare.bitwise_equal(to_numpy(dwte), dwte0) and compare.bitwise_equal(to_numpy(dwpe), dwpe0)
