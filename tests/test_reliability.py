"""Every error path leaves every output bitwise unchanged: bad calls drawn by Hypothesis, on both backends.

``tests/test_validation.py`` is the catalogue, one hand-written case per entry. Here Hypothesis draws the bad
argument instead (a wrong kind of thing, an ndarray or CuPy subclass, a wrong dtype or shape, an id outside
``[0, V)``, a bad seed, method, ``bucketing`` or ``check_ids``, overlapping or read-only outputs, strided or
misaligned views) into an otherwise valid call, and checks three things each time:

* the exception type (``TypeError`` for the wrong kind of thing, ``ValueError`` for a wrong value);
* that the message names the argument that was spoiled;
* that every array of the call, outputs and inputs and the buffers views were cut from, keeps its bits
  (``compare.bitwise_equal`` against copies taken before the call).

Below the properties: memory maps of one file passed as an output and an input (different addresses, the
same bytes) are refused, and maps of disjoint parts of one file are accepted with the bits of plain arrays.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpt2enc_edu as enc
from gpt2enc_edu import compare, validate
from gpt2enc_edu.backend import to_numpy
from gpt2enc_edu.problems import poisoned, random_problem
from gpt2enc_edu.rounding import bfloat16

BF16 = np.dtype(bfloat16)
FP32 = np.dtype(np.float32)
B, T, C, V, MAXT = 2, 4, 32, 7, 6
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
#: np.matrix is drawn on purpose (it must be refused); NumPy's advice against it is not news here.
pytestmark = [
    pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning"),
    # np.timedelta64(5) (the generic unit) is passed on purpose, as a seed or size that must be refused
    pytest.mark.filterwarnings("ignore:The 'generic' unit for NumPy timedelta:DeprecationWarning"),
]
BACKWARD_ARRAYS = ("dwte", "dwpe", "dout", "inp")
FORWARD_ARRAYS = ("inp", "wte", "wpe", "out")
OUTPUTS = {"dwte", "dwpe", "out"}


class Tagged(np.ndarray):
    """An ndarray subclass that changes nothing: refused all the same (only plain arrays reach a kernel)."""


@dataclass
class BadCall:
    """One call with one spoiled argument: what it should raise, which names may appear, what must not change."""

    kwargs: dict
    exc: type
    names: tuple[str, ...]
    watched: dict = field(default_factory=dict)


def _host_copy(x) -> np.ndarray:
    return np.array(to_numpy(x), copy=True)


def _cupy_subclass_view(cupy, value):
    """The memory of CuPy array ``value`` seen through a subclass of ``cupy.ndarray``."""

    class TaggedCupy(cupy.ndarray):
        pass

    return TaggedCupy(value.shape, value.dtype, memptr=value.data)


def _words(host: np.ndarray) -> np.ndarray:
    return host.view({2: np.uint16, 4: np.uint32}[host.dtype.itemsize])


def pick(values):
    """``st.sampled_from`` for values Hypothesis cannot hash (timedelta64, arrays): draws an index instead."""
    values = list(values)
    return st.integers(0, len(values) - 1).map(values.__getitem__)


NOT_ARRAYS = [None, 3, 1.5, "ids", b"ids", (1, 2), {"a": 1}]
BAD_SEEDS = st.one_of(
    st.integers(max_value=-1), st.integers(min_value=2**32),
    pick([1.5, np.float64(2.0), True, False, np.bool_(True), "3", None, b"3", np.timedelta64(5),
                     np.timedelta64(5, "s"), np.array(5), [5], np.float32(1.0), complex(1, 0)]),
)
BAD_FLAGS = pick([None, 0, 1, [], [True], np.array([True]), np.array(True), "yes", 1.0, np.int8(1)])


def _bad_choice(choices):
    """Strings outside ``choices`` (ValueError) or things that are not strings (TypeError)."""
    wrong_strings = st.text(max_size=12).filter(lambda s: s not in choices).map(lambda s: (s, ValueError))
    not_strings = pick([None, 3, b"bucketed", np.array([choices[0]]), np.array(choices[0]), [choices[0]],
                                   np.bytes_(choices[0].encode())]).map(lambda v: (v, TypeError))
    return st.one_of(wrong_strings, not_strings)


def _ids_out_of_range(draw, xp, inp):
    """A copy of the ids ``inp`` (NumPy) on ``xp`` with one id, at a drawn place, drawn outside [0, V)."""
    ids = inp.copy()
    ids.reshape(-1)[draw(st.integers(0, ids.size - 1))] = draw(
        st.one_of(st.integers(-(2**31), -1), st.integers(V, 2**31 - 1)))
    return xp.asarray(ids)


def _spoil_array(draw, xp, arrays: dict, name: str) -> tuple[object, type, tuple[str, ...], dict]:
    """Replace ``arrays[name]`` by a bad value; returns (value, exception, names, extra watched buffers)."""
    value = arrays[name]
    kind = draw(st.sampled_from(["not-array", "subclass", "dtype", "ndim", "strided", "misaligned"]))
    if kind == "not-array":
        return draw(pick(NOT_ARRAYS + [_host_copy(value).tolist()])), TypeError, (name,), {}
    if kind == "subclass":
        if xp is not np:
            return _cupy_subclass_view(xp, value), TypeError, (name,), {}
        choices = ["tagged", "masked", "masked-hidden"] + (["matrix"] if value.ndim == 2 else [])
        sub = draw(st.sampled_from(choices))
        if sub == "matrix":
            return np.asmatrix(value), TypeError, (name,), {}
        if sub == "tagged":
            return value.view(Tagged), TypeError, (name,), {}
        mask = np.zeros(value.shape, bool)
        mask.reshape(-1)[draw(st.integers(0, value.size - 1))] = True
        data = value.copy()
        if sub == "masked-hidden" and name == "inp":  # an out-of-range id hidden under the mask
            data[mask] = draw(st.sampled_from([-1, V, 2**31 - 1]))
        return np.ma.masked_array(data, mask=mask), TypeError, (name,), {}
    if kind == "dtype":
        if name == "inp":
            bad = draw(st.sampled_from([np.float32, np.float64, np.int64, np.uint32, np.int16]))
        else:
            bad = draw(st.sampled_from([np.float16, np.float64, np.int32, np.uint16]))
        with np.errstate(over="ignore", invalid="ignore"):  # the values do not matter, only the wrong dtype
            spoiled = _host_copy(value).astype(bad)
        return xp.asarray(spoiled), TypeError, (name,), {}
    if kind == "ndim":
        shaped = value.reshape(-1) if draw(st.booleans()) or value.ndim == 3 else value.reshape(value.shape + (1,))
        return shaped, ValueError, (name,), {}
    host = _host_copy(value)
    if kind == "strided":
        wide = np.zeros(host.shape[:-1] + (2 * host.shape[-1],), dtype=host.dtype)
        wide[..., ::2] = host
        buffer = xp.asarray(wide)
        return buffer[..., ::2], ValueError, (name,), {"buffer": buffer}
    item = host.dtype.itemsize
    flat = xp.asarray(np.zeros(host.size + 32 // item, dtype=host.dtype))
    offset = draw(st.sampled_from([o for o in (2, 4, 8, 12) if o % item == 0]))
    k = ((offset - validate.data_pointer(flat)) % 16) // item
    _words(flat)[k : k + host.size] = xp.asarray(_words(host.reshape(-1)))
    view = flat[k : k + host.size].reshape(host.shape)
    return view, ValueError, (name,), {"buffer": flat}


@st.composite
def bad_backward(draw, xp):
    """A backward call with exactly one spoiled argument."""
    dtype = draw(st.sampled_from([BF16, FP32]))
    method = draw(st.sampled_from([m for m in validate.METHODS if not (m == "atomic_bf16" and dtype == FP32)]))
    p = random_problem(B, T, C, V, MAXT, dtype=dtype, rng=np.random.default_rng(draw(st.integers(0, 2**32 - 1))))
    on = p.on(xp)
    arrays = {name: getattr(on, name) for name in BACKWARD_ARRAYS}
    kwargs = dict(arrays, seed=draw(st.integers(0, 2**32 - 1)), method=method, check_ids=True)
    watched = dict(arrays)
    what = draw(st.sampled_from(["array", "ids", "seed", "method", "bucketing", "check_ids", "overlap", "read-only"]))
    if what == "array":
        name = draw(st.sampled_from(BACKWARD_ARRAYS))
        kwargs[name], exc, names, extra = _spoil_array(draw, xp, arrays, name)
        return BadCall(kwargs, exc, names, {**watched, **extra})
    if what == "ids":
        kwargs["inp"] = watched["inp"] = _ids_out_of_range(draw, xp, p.inp)
        return BadCall(kwargs, ValueError, ("inp",), watched)
    if what == "seed":
        kwargs["seed"] = seed = draw(BAD_SEEDS)
        in_range_int = isinstance(seed, int) and not isinstance(seed, bool)
        return BadCall(kwargs, ValueError if in_range_int else TypeError, ("seed",), watched)
    if what in ("method", "bucketing"):
        choices = validate.METHODS if what == "method" else validate.BUCKETINGS
        kwargs[what], exc = draw(_bad_choice(choices))
        return BadCall(kwargs, exc, (what,), watched)
    if what == "check_ids":
        kwargs["check_ids"] = draw(BAD_FLAGS)
        return BadCall(kwargs, TypeError, ("check_ids",), watched)
    if what == "read-only" and xp is np:
        name = draw(st.sampled_from(["dwte", "dwpe"]))
        kwargs[name].flags.writeable = False
        return BadCall(kwargs, ValueError, (name,), watched)
    # overlapping memory: an output shares bytes with the other output or with an input
    case = draw(st.sampled_from(["dwte-dwpe", "dout-over-dwte", "dout-over-dwpe", "inp-over-dwte"]))
    if case == "dwte-dwpe":
        buffer = xp.asarray(np.concatenate([p.dwte, p.dwpe[1:]]))
        kwargs["dwte"], kwargs["dwpe"] = buffer[:V], buffer[V - 1 :]
        return BadCall(kwargs, ValueError, ("dwte", "dwpe"), {**watched, "buffer": buffer})
    table = "dwte" if case != "dout-over-dwpe" else "dwpe"
    rows = B * T + 2
    buffer = xp.asarray(np.concatenate([getattr(p, table)] * (rows // getattr(p, table).shape[0] + 1))[:rows])
    kwargs[table] = buffer
    if case == "inp-over-dwte":
        kwargs["inp"] = buffer.view(np.int32).reshape(-1)[: B * T].reshape(B, T)
        kwargs["check_ids"] = False  # the ids are float bits: only the overlap is under test
    else:
        kwargs["dout"] = buffer[1 : 1 + B * T].reshape(B, T, C)
    other = "inp" if case == "inp-over-dwte" else "dout"
    return BadCall(kwargs, ValueError, (table, other), {**watched, "buffer": buffer})


@st.composite
def bad_forward(draw, xp):
    """A forward call with exactly one spoiled argument."""
    dtype = draw(st.sampled_from([BF16, FP32]))
    p = random_problem(B, T, C, V, MAXT, dtype=dtype, rng=np.random.default_rng(draw(st.integers(0, 2**32 - 1))))
    on = p.on(xp)
    arrays = {"inp": on.inp, "wte": on.wte, "wpe": on.wpe, "out": poisoned((B, T, C), dtype, xp)}
    kwargs = dict(arrays, check_ids=True)
    what = draw(st.sampled_from(["array", "ids", "check_ids", "overlap"]))
    if what == "array":
        name = draw(st.sampled_from(FORWARD_ARRAYS))
        kwargs[name], exc, names, extra = _spoil_array(draw, xp, arrays, name)
        if name == "out" and kwargs[name] is None:
            kwargs[name] = [0.0]  # out=None is allowed (allocate); any other non-array is not
        return BadCall(kwargs, exc, names, {**arrays, **extra})
    if what == "ids":
        kwargs["inp"] = arrays["inp"] = _ids_out_of_range(draw, xp, p.inp)
        return BadCall(kwargs, ValueError, ("inp",), arrays)
    if what == "check_ids":
        kwargs["check_ids"] = draw(BAD_FLAGS)
        return BadCall(kwargs, TypeError, ("check_ids",), arrays)
    table = draw(st.sampled_from(["wte", "wpe"]))
    big = xp.asarray(np.concatenate([getattr(p, table)] * (B * T // getattr(p, table).shape[0] + 1))[: B * T])
    kwargs[table] = big
    kwargs["out"] = big.reshape(B, T, C)
    return BadCall(kwargs, ValueError, ("out", table), {**arrays, "buffer": big})


def assert_refused_untouched(bad: BadCall, call) -> None:
    """``call(**bad.kwargs)`` raises ``bad.exc``, names one of ``bad.names``, and changes no watched array."""
    before = {name: _host_copy(array) for name, array in bad.watched.items()}
    with pytest.raises(bad.exc) as info:
        call(**bad.kwargs)
    message = str(info.value)
    assert any(re.search(rf"\b{re.escape(n)}\b", message) for n in bad.names), (bad.names, message)
    changed = [n for n, a in bad.watched.items() if not compare.bitwise_equal(before[n], _host_copy(a))]
    assert not changed, f"the refused call wrote into {changed}: {message}"


@SETTINGS
@given(data=st.data())
def test_bad_backward_calls_write_nothing(xp, data):
    bad = data.draw(bad_backward(xp))
    assert_refused_untouched(bad, enc.encoder_backward)


@SETTINGS
@given(data=st.data())
def test_bad_forward_calls_write_nothing(xp, data):
    bad = data.draw(bad_forward(xp))
    assert_refused_untouched(bad, enc.encoder_forward)


@SETTINGS
@given(data=st.data())
def test_bad_make_buckets_calls(xp, data):
    """``make_buckets`` with a spoiled ``inp`` (or bad ``C``) raises, naming it, and leaves ``inp`` as it was."""
    inp = xp.asarray(random_problem(B, T, C, V, MAXT, rng=np.random.default_rng(0)).inp)
    extra = {} if xp is np else {"V": V}
    kwargs, watched = {"inp": inp, "C": C, "dtype": BF16, **extra}, {"inp": inp}
    if data.draw(st.booleans()):
        kwargs["inp"], exc, names, more = _spoil_array(data.draw, xp, {"inp": inp}, "inp")
        watched |= more
    else:
        kwargs["C"] = data.draw(pick([1.5, "32", True, None, np.timedelta64(32), 0, -8, 12]))
        exc, names = (ValueError if isinstance(kwargs["C"], int) and not isinstance(kwargs["C"], bool) else TypeError,
                      ("C",))
    assert_refused_untouched(BadCall(kwargs, exc, names, watched),
                             lambda inp, C, dtype, **kw: enc.make_buckets(inp, C, dtype, **kw))


# ----------------------------------------------------------------------------------------------------------
# memory maps of one file: different addresses, the same bytes


def _map(path, dtype, shape, offset=0, mode="r+"):
    return np.memmap(path, dtype=dtype, mode=mode, shape=shape, offset=offset)


def _file_with(path, *arrays):
    with open(path, "wb") as f:
        for a in arrays:
            f.write(np.ascontiguousarray(a).tobytes())


@pytest.mark.parametrize("view", ["memmap", "memmap-slice", "asarray"])
@pytest.mark.parametrize("method", validate.METHODS)
def test_two_maps_of_one_file_overlap(tmp_path, rng, method, view):
    """dwpe and dout mapped from one file (dout over dwpe's bytes) are refused, and nothing is written.

    Their addresses differ, so an address check alone passes them; the file ranges overlap. ``memmap-slice``
    maps more and slices, ``asarray`` passes plain ndarray views of the maps: the check sees through both.
    """
    p = random_problem(B, T, C, V, B * T, dtype=BF16, rng=rng)
    path = tmp_path / "shared.bin"
    _file_with(path, p.dwpe, p.dwpe)
    dwpe = _map(path, BF16, (B * T, C))
    dout = _map(path, BF16, (B, T, C), mode="r")
    if view == "memmap-slice":
        dwpe = _map(path, BF16, (2 * B * T, C))[: B * T]
        dout = _map(path, BF16, (2 * B * T, C), mode="r")[1 : 1 + B * T].reshape(B, T, C)
    elif view == "asarray":
        dwpe, dout = np.asarray(dwpe), np.asarray(dout)
    assert validate.data_pointer(dwpe) != validate.data_pointer(dout)
    dwte = p.dwte.copy()
    bad = BadCall(dict(dwte=dwte, dwpe=dwpe, dout=dout, inp=p.inp, seed=5, method=method), ValueError,
                  ("dwpe",), {"dwte": dwte, "dwpe": dwpe, "dout": dout})
    assert_refused_untouched(bad, enc.encoder_backward)
    assert compare.bitwise_equal(np.fromfile(path, dtype=BF16).reshape(-1, C)[: B * T], p.dwpe)


def test_maps_of_disjoint_parts_of_one_file_are_accepted(tmp_path, rng):
    """dwpe in the first half of a file and dout in the second: accepted, the bits of plain arrays."""
    p = random_problem(B, T, C, V, B * T, dtype=BF16, rng=rng)
    path = tmp_path / "halves.bin"
    _file_with(path, p.dwpe, p.dout)
    dwpe = _map(path, BF16, (B * T, C))
    dout = _map(path, BF16, (B, T, C), offset=p.dwpe.nbytes, mode="r")
    expected_te, expected_tp = p.dwte.copy(), p.dwpe.copy()
    enc.encoder_backward(expected_te, expected_tp, p.dout.copy(), p.inp, seed=11)
    dwte = p.dwte.copy()
    enc.encoder_backward(dwte, dwpe, dout, p.inp, seed=11)
    assert compare.bitwise_equal(dwte, expected_te) and compare.bitwise_equal(dwpe, expected_tp)


def test_memmap_out_over_wte_file(tmp_path, rng):
    """The forward's ``out`` mapped over the file that ``wte`` is mapped from: refused."""
    p = random_problem(B, T, C, B * T, MAXT, dtype=FP32, rng=rng)
    path = tmp_path / "wte.bin"
    _file_with(path, p.wte)
    wte = _map(path, FP32, (B * T, C), mode="r")
    out = _map(path, FP32, (B, T, C))
    bad = BadCall(dict(inp=p.inp, wte=wte, wpe=p.wpe, out=out), ValueError, ("out",), {"out": out, "wte": wte})
    assert_refused_untouched(bad, enc.encoder_forward)
