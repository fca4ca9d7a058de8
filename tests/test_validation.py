"""The bad-input catalogue: every way to call the public API wrongly, refused before anything is written.

Each test makes one bad call on each backend (``xp`` = NumPy, and CuPy with a GPU) and checks three things:

* the exception type (``TypeError`` for the wrong kind of thing, ``ValueError`` for the right kind with a
  wrong value: see ``gpt2enc_edu.validate`` and ``docs/reliability.md``);
* that the message names the offending argument (``pytest.raises(match=...)``);
* that every array passed in (outputs *and* inputs, and the buffers that views were cut from) holds the
  same bits afterwards (``compare.bitwise_equal`` on before/after copies).

Sizes past 32-bit index arithmetic are built without allocating them: the forward case needs only a long
``inp`` and a single-row ``wte`` (B*T*C counts ``inp``'s positions times ``wte``'s channels), and the cases
that need a genuinely huge array use a sparse file mapped with ``np.memmap`` (NumPy backend; the GPU runs
the very same validator code on its arrays' shapes).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import gpt2enc_edu as enc
from gpt2enc_edu import compare, validate
from gpt2enc_edu.backend import to_numpy
from gpt2enc_edu.layout import INT32_LIMIT, pack_size
from gpt2enc_edu.problems import poisoned, random_problem
from gpt2enc_edu.rounding import bfloat16

BF16 = np.dtype(bfloat16)
FP32 = np.dtype(np.float32)
DTYPES = [pytest.param(BF16, id="bf16"), pytest.param(FP32, id="fp32")]
#: Every (dtype, method) pair the API accepts: atomic_bf16 is for bf16 only.
COMBOS = [
    pytest.param((dtype, method), id=f"{name}-{method}")
    for method in validate.METHODS
    for dtype, name in ((BF16, "bf16"), (FP32, "fp32"))
    if not (method == "atomic_bf16" and dtype == FP32)
]

B, T, C, V, MAXT = 2, 4, 32, 7, 6  # C = 32 is a whole number of packs for both dtypes


# ----------------------------------------------------------------------------------------------------------
# helpers


def _words(x) -> np.ndarray:
    """A host *copy* of ``x``'s bits as unsigned words, so arrays of any dtype compare exactly."""
    host = np.array(to_numpy(x), order="C", copy=True)
    if host.dtype.itemsize == 2:
        return host.view(np.uint16)
    if host.dtype.itemsize in (4, 8):
        return host.view(np.uint32)
    return host.astype(np.uint16)


def assert_refused(exc, match: str, call, watched: dict) -> None:
    """``call()`` raises ``exc`` with a message matching ``match``, and no array in ``watched`` changed."""
    before = {name: _words(array) for name, array in watched.items()}
    with pytest.raises(exc, match=match):
        call()
    changed = [name for name, array in watched.items() if not compare.bitwise_equal(before[name], _words(array))]
    assert not changed, f"the refused call still wrote into {changed}"


def refuse_forward(exc, match, *, inp, wte, wpe, out=None, watch=None):
    """``encoder_forward(inp, wte, wpe, out=out)`` is refused and leaves every array as it was."""
    watched = {"inp": inp, "wte": wte, "wpe": wpe, **({} if out is None else {"out": out}), **(watch or {})}
    assert_refused(exc, match, lambda: enc.encoder_forward(inp, wte, wpe, out=out), watched)


def refuse_backward(exc, match, *, dwte, dwpe, dout, inp, seed=1, method="bucketed", watch=None, **kwargs):
    """``encoder_backward(...)`` is refused and leaves every array as it was."""
    watched = {"dwte": dwte, "dwpe": dwpe, "dout": dout, "inp": inp, **(watch or {})}
    assert_refused(
        exc, match,
        lambda: enc.encoder_backward(dwte, dwpe, dout, inp, seed=seed, method=method, **kwargs),
        watched,
    )


def refuse_buckets(exc, match, inp, C_arg, dtype, *, watch=None, **kwargs):
    """``make_buckets(inp, C, dtype)`` is refused and leaves ``inp`` as it was."""
    assert_refused(exc, match, lambda: enc.make_buckets(inp, C_arg, dtype, **kwargs), {"inp": inp, **(watch or {})})


def problem(rng, dtype=BF16, **sizes):
    """A small random NumPy problem; ``sizes`` overrides B, T, C, V, maxT."""
    s = dict(B=B, T=T, C=C, V=V, maxT=MAXT) | sizes
    return random_problem(s["B"], s["T"], s["C"], s["V"], s["maxT"], dtype=dtype, rng=rng)


def _bucket_kwargs(xp) -> dict:
    """CuPy ids are bucketed on the GPU, which needs V; NumPy ids need nothing more."""
    return {} if xp is np else {"V": V}


def _host(x, dtype=None):
    host = np.ascontiguousarray(to_numpy(x))
    return host if dtype is None else host.astype(dtype)


def strided(xp, array, kind: str):
    """A non-contiguous view holding ``array``'s values, and the buffer it is cut from.

    ``"padded"``: rows of a wider buffer (``wide[..., :n]``, every row start aligned, only contiguity is
    wrong); ``"step"``: every other element of the last axis (``wide[..., ::2]``).
    """
    host = _host(array)
    n = host.shape[-1]
    wide = np.zeros(host.shape[:-1] + (2 * n,), dtype=host.dtype)
    if kind == "padded":
        wide[..., :n] = host
        buffer = xp.asarray(wide)
        view = buffer[..., :n]
    else:
        wide[..., ::2] = host
        buffer = xp.asarray(wide)
        view = buffer[..., ::2]
    assert not view.flags.c_contiguous
    return view, buffer


def misaligned(xp, array, byte_offset: int):
    """A C-contiguous copy of ``array`` whose first element sits ``byte_offset`` bytes past a 16-byte boundary.

    Cut from a flat buffer (``flat[k : k + n].reshape(shape)``) whose own start is wherever the allocator
    put it; ``k`` is chosen from the real address, so the misalignment does not depend on the allocator.
    """
    host = _host(array)
    item = host.dtype.itemsize
    word = {2: np.uint16, 4: np.uint32}[item]
    flat = xp.asarray(np.zeros(host.size + 32 // item, dtype=host.dtype))
    shift = (byte_offset - validate.data_pointer(flat)) % 16
    assert shift % item == 0
    k = shift // item
    flat.view(word)[k : k + host.size] = xp.asarray(host.reshape(-1).view(word))
    view = flat[k : k + host.size].reshape(host.shape)
    assert view.flags.c_contiguous and validate.data_pointer(view) % 16 == byte_offset % 16
    assert compare.bitwise_equal(view, host)
    return view, flat


# ----------------------------------------------------------------------------------------------------------
# token ids: out of range, wrong dtype


@pytest.mark.parametrize("bad", [-1, V, 2**31 - 1, -(2**31)])
def test_forward_ids_out_of_range(xp, rng, bad):
    p = problem(rng)
    ids = p.inp.copy()
    ids[1, 2] = bad
    on = replace(p, inp=ids).on(xp)
    refuse_forward(ValueError, rf"inp holds token id {bad}\b", inp=on.inp, wte=on.wte, wpe=on.wpe,
                   out=poisoned((B, T, C), BF16, xp))


@pytest.mark.parametrize("bad", [-1, V, 2**31 - 1])
@pytest.mark.parametrize("combo", COMBOS)
def test_backward_ids_out_of_range(xp, rng, combo, bad):
    dtype, method = combo
    p = problem(rng, dtype)
    ids = p.inp.copy()
    ids[0, 3] = bad
    on = replace(p, inp=ids).on(xp)
    refuse_backward(ValueError, rf"inp holds token id {bad}\b", dwte=on.dwte, dwpe=on.dwpe, dout=on.dout,
                    inp=on.inp, method=method)


def test_make_buckets_negative_ids(xp, rng):
    ids = problem(rng).inp.copy()
    ids[0, 0] = -5
    refuse_buckets(ValueError, r"inp holds token id -5", xp.asarray(ids), C, BF16, **_bucket_kwargs(xp))


ID_DTYPES = [np.float32, np.float64, np.int64, np.uint32, np.int16]


@pytest.mark.parametrize("id_dtype", ID_DTYPES, ids=lambda d: np.dtype(d).name)
def test_forward_ids_must_be_int32(xp, rng, id_dtype):
    """Float ids and int64 ids alike are refused with TypeError (no silent cast: documented decision)."""
    p = problem(rng).on(xp)
    match = rf"inp must hold int32 token ids, not {np.dtype(id_dtype).name}"
    if np.issubdtype(id_dtype, np.integer):
        match += r".*astype\(np.int32\)"
    refuse_forward(TypeError, match, inp=p.inp.astype(id_dtype), wte=p.wte, wpe=p.wpe)


@pytest.mark.parametrize("id_dtype", ID_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("combo", COMBOS)
def test_backward_ids_must_be_int32(xp, rng, combo, id_dtype):
    dtype, method = combo
    p = problem(rng, dtype).on(xp)
    refuse_backward(TypeError, rf"inp must hold int32 token ids, not {np.dtype(id_dtype).name}",
                    dwte=p.dwte, dwpe=p.dwpe, dout=p.dout, inp=p.inp.astype(id_dtype), method=method)


@pytest.mark.parametrize("id_dtype", ID_DTYPES, ids=lambda d: np.dtype(d).name)
def test_make_buckets_ids_must_be_int32(xp, rng, id_dtype):
    inp = xp.asarray(problem(rng).inp.astype(id_dtype))
    refuse_buckets(TypeError, r"inp must hold int32 token ids", inp, C, BF16, **_bucket_kwargs(xp))


def test_forward_ids_must_be_an_array(rng):
    p = problem(rng)
    refuse_forward(TypeError, r"inp must be a numpy.ndarray or cupy.ndarray, not list",
                   inp=p.inp.tolist(), wte=p.wte, wpe=p.wpe)


# ----------------------------------------------------------------------------------------------------------
# shapes that disagree


@pytest.mark.parametrize("case", ["wpe-channels", "out-channels", "out-rows", "out-2d", "inp-1d", "inp-3d",
                                  "wte-1d", "wte-3d"])
def test_forward_shapes_disagree(xp, rng, case):
    p = problem(rng)
    inp, wte, wpe, out = p.inp, p.wte, p.wpe, None
    if case == "wpe-channels":
        wpe, match = problem(rng, C=C + 8).wpe, rf"wpe has {C + 8} channels but the other arrays have C = {C}"
    elif case == "out-channels":
        out, match = poisoned((B, T, C + 8), BF16), r"out must have shape"
    elif case == "out-rows":
        out, match = poisoned((B, T + 1, C), BF16), r"out must have shape"
    elif case == "out-2d":
        out, match = poisoned((B * T, C), BF16), r"out must have shape"
    elif case == "inp-1d":
        inp, match = p.inp.reshape(-1), r"inp must have shape \(B, T\)"
    elif case == "inp-3d":
        inp, match = p.inp.reshape(B, T, 1), r"inp must have shape \(B, T\)"
    elif case == "wte-1d":
        wte, match = p.wte.reshape(-1), r"wte must be 2-D"
    else:
        wte, match = p.wte.reshape(V, C // 8, 8), r"wte must be 2-D"
    arrays = {k: None if v is None else xp.asarray(v) for k, v in dict(inp=inp, wte=wte, wpe=wpe, out=out).items()}
    refuse_forward(ValueError, match, **arrays)


@pytest.mark.parametrize("case", ["dout-T", "dout-B", "dout-2d", "dwte-channels", "dwpe-channels", "inp-1d",
                                  "dwte-1d"])
@pytest.mark.parametrize("combo", COMBOS)
def test_backward_shapes_disagree(xp, rng, combo, case):
    dtype, method = combo
    p = problem(rng, dtype)
    args = dict(dwte=p.dwte, dwpe=p.dwpe, dout=p.dout, inp=p.inp)
    if case == "dout-T":
        args["dout"], match = problem(rng, dtype, T=T + 1, maxT=T + 1).dout, r"dout has shape .* but inp has"
    elif case == "dout-B":
        args["dout"], match = problem(rng, dtype, B=B + 1).dout, r"dout has shape .* but inp has"
    elif case == "dout-2d":
        args["dout"], match = p.dout.reshape(B * T, C), r"dout must have shape \(B, T, C\)"
    elif case == "dwte-channels":
        args["dwte"], match = problem(rng, dtype, C=C + 8).dwte, rf"dwte has {C + 8} channels"
    elif case == "dwpe-channels":
        args["dwpe"], match = problem(rng, dtype, C=C + 8).dwpe, rf"dwpe has {C + 8} channels"
    elif case == "inp-1d":
        args["inp"], match = p.inp.reshape(-1), r"inp must have shape \(B, T\)"
    else:
        args["dwte"], match = p.dwte.reshape(-1), r"dwte must be 2-D"
    refuse_backward(ValueError, match, method=method, **{k: xp.asarray(v) for k, v in args.items()})


def test_make_buckets_ids_must_be_2d(xp, rng):
    inp = xp.asarray(problem(rng).inp.reshape(-1))
    refuse_buckets(ValueError, r"inp must have shape \(B, T\)", inp, C, BF16, **_bucket_kwargs(xp))


def test_forward_T_past_wpe_rows(xp, rng):
    p = problem(rng, maxT=T - 1).on(xp)
    refuse_forward(ValueError, rf"inp has T = {T} positions but wpe has only {T - 1} rows",
                   inp=p.inp, wte=p.wte, wpe=p.wpe, out=poisoned((B, T, C), BF16, xp))


@pytest.mark.parametrize("combo", COMBOS)
def test_backward_T_past_dwpe_rows(xp, rng, combo):
    dtype, method = combo
    p = problem(rng, dtype, maxT=T - 1).on(xp)
    refuse_backward(ValueError, rf"inp has T = {T} positions but dwpe has only {T - 1} rows",
                    dwte=p.dwte, dwpe=p.dwpe, dout=p.dout, inp=p.inp, method=method)


# ----------------------------------------------------------------------------------------------------------
# C not a multiple of the 128-bit pack (8 bf16, 4 fp32)

BAD_C = [pytest.param((BF16, 12), id="bf16-C12"), pytest.param((BF16, 4), id="bf16-C4"),
         pytest.param((FP32, 6), id="fp32-C6"), pytest.param((FP32, 2), id="fp32-C2")]


@pytest.mark.parametrize("dtype_C", BAD_C)
def test_forward_C_not_a_pack_multiple(xp, rng, dtype_C):
    dtype, bad_C = dtype_C
    p = problem(rng, dtype, C=bad_C).on(xp)
    refuse_forward(ValueError, rf"wte: C = {bad_C} must be a multiple of {pack_size(dtype)}",
                   inp=p.inp, wte=p.wte, wpe=p.wpe)


@pytest.mark.parametrize("method", validate.METHODS)
@pytest.mark.parametrize("dtype_C", BAD_C)
def test_backward_C_not_a_pack_multiple(xp, rng, dtype_C, method):
    dtype, bad_C = dtype_C
    p = problem(rng, dtype, C=bad_C).on(xp)
    refuse_backward(ValueError, rf"dout: C = {bad_C} must be a multiple of {pack_size(dtype)}",
                    dwte=p.dwte, dwpe=p.dwpe, dout=p.dout, inp=p.inp, method=method)


@pytest.mark.parametrize("dtype_C", BAD_C)
def test_make_buckets_C_not_a_pack_multiple(xp, rng, dtype_C):
    dtype, bad_C = dtype_C
    inp = xp.asarray(problem(rng).inp)
    refuse_buckets(ValueError, rf"C: C = {bad_C} must be a multiple of {pack_size(dtype)}", inp, bad_C, dtype,
                   **_bucket_kwargs(xp))


@pytest.mark.parametrize("bad, exc, match", [
    (1.5, TypeError, r"C must be an integer, not float"),
    ("32", TypeError, r"C must be an integer, not str"),
    (True, TypeError, r"C must be an integer, not bool"),
    (0, ValueError, r"C must be >= 1"),
    (-32, ValueError, r"C must be >= 1"),
])
def test_make_buckets_C_must_be_a_positive_int(xp, rng, bad, exc, match):
    refuse_buckets(exc, match, xp.asarray(problem(rng).inp), bad, BF16, **_bucket_kwargs(xp))


@pytest.mark.parametrize("bad", [np.float16, np.float64, "not-a-dtype", None], ids=str)
def test_make_buckets_dtype_must_be_storage(xp, rng, bad):
    refuse_buckets(TypeError, r"dtype must be ml_dtypes.bfloat16 or numpy.float32", xp.asarray(problem(rng).inp),
                   C, bad, **_bucket_kwargs(xp))


# ----------------------------------------------------------------------------------------------------------
# layout: strided views, misaligned views

FORWARD_ARGS = ["inp", "wte", "wpe", "out"]
BACKWARD_ARGS = ["dwte", "dwpe", "dout", "inp"]


def _forward_arrays(xp, p):
    on = p.on(xp)
    return dict(inp=on.inp, wte=on.wte, wpe=on.wpe, out=poisoned((p.B, p.T, p.C), p.dtype, xp))


def _backward_arrays(xp, p):
    on = p.on(xp)
    return dict(dwte=on.dwte, dwpe=on.dwpe, dout=on.dout, inp=on.inp)


#: Views no kernel can read, each made from an array by (xp, array) -> (view, its buffer), and the refusal it gets.
BAD_VIEWS = [
    *[pytest.param(lambda xp, a, kind=kind: strided(xp, a, kind), "must be C-contiguous", id=kind)
      for kind in ("padded", "step")],
    *[pytest.param(lambda xp, a, offset=offset: misaligned(xp, a, offset), "must start at a 16-byte-aligned address",
                   id=f"{offset}-bytes-off") for offset in (4, 8)],
]


@pytest.mark.parametrize(("view", "refusal"), BAD_VIEWS)
@pytest.mark.parametrize("name", FORWARD_ARGS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_refuses_views_no_kernel_reads(xp, rng, dtype, name, view, refusal):
    arrays = _forward_arrays(xp, problem(rng, dtype))
    arrays[name], buffer = view(xp, arrays[name])
    refuse_forward(ValueError, rf"{name} {refusal}", watch={"buffer": buffer}, **arrays)


@pytest.mark.parametrize(("view", "refusal"), BAD_VIEWS)
@pytest.mark.parametrize("name", BACKWARD_ARGS)
@pytest.mark.parametrize("combo", COMBOS)
def test_backward_refuses_views_no_kernel_reads(xp, rng, combo, name, view, refusal):
    dtype, method = combo
    arrays = _backward_arrays(xp, problem(rng, dtype))
    arrays[name], buffer = view(xp, arrays[name])
    refuse_backward(ValueError, rf"{name} {refusal}", method=method, watch={"buffer": buffer}, **arrays)


@pytest.mark.parametrize(("view", "refusal"), BAD_VIEWS)
def test_make_buckets_refuses_ids_no_kernel_reads(xp, rng, view, refusal):
    inp, buffer = view(xp, problem(rng).inp)
    refuse_buckets(ValueError, rf"inp {refusal}", inp, C, BF16, watch={"buffer": buffer}, **_bucket_kwargs(xp))


def test_bf16_view_two_bytes_off(xp, rng):
    """The smallest misalignment there is: a bf16 table starting one element (2 bytes) late."""
    arrays = _backward_arrays(xp, problem(rng, BF16))
    arrays["dwte"], buffer = misaligned(xp, arrays["dwte"], 2)
    refuse_backward(ValueError, r"dwte must start at a 16-byte-aligned address", watch={"buffer": buffer},
                    **arrays)


# ----------------------------------------------------------------------------------------------------------
# empty arrays

EMPTY_IDS = [pytest.param((0, T), id="B0"), pytest.param((B, 0), id="T0"), pytest.param((0, 0), id="B0-T0")]


@pytest.mark.parametrize("shape", EMPTY_IDS)
def test_forward_zero_size_batch(xp, rng, shape):
    p = problem(rng).on(xp)
    refuse_forward(ValueError, r"inp must not be empty, .*zero-size batch",
                   inp=xp.zeros(shape, dtype=np.int32), wte=p.wte, wpe=p.wpe)


@pytest.mark.parametrize("shape", EMPTY_IDS)
@pytest.mark.parametrize("combo", COMBOS)
def test_backward_zero_size_batch(xp, rng, combo, shape):
    dtype, method = combo
    p = problem(rng, dtype).on(xp)
    dout = xp.asarray(np.zeros(shape + (C,), dtype=dtype))
    refuse_backward(ValueError, r"inp must not be empty, .*zero-size batch", dwte=p.dwte, dwpe=p.dwpe, dout=dout,
                    inp=xp.zeros(shape, dtype=np.int32), method=method)


@pytest.mark.parametrize("shape", EMPTY_IDS)
def test_make_buckets_zero_size_batch(xp, shape):
    refuse_buckets(ValueError, r"inp must not be empty", xp.zeros(shape, dtype=np.int32), C, BF16,
                   **_bucket_kwargs(xp))


@pytest.mark.parametrize("name, shape", [("wte", (0, C)), ("wpe", (0, C)), ("wte", (V, 0))])
def test_forward_empty_tables(xp, rng, name, shape):
    arrays = _forward_arrays(xp, problem(rng))
    arrays[name] = xp.asarray(np.zeros(shape, dtype=BF16))
    if name == "wte" and shape[1] == 0:
        arrays["out"] = None  # out's shape would be checked against C = 0
    refuse_forward(ValueError, rf"{name} must not be empty", **arrays)


@pytest.mark.parametrize("name", ["dwte", "dwpe"])
@pytest.mark.parametrize("combo", COMBOS)
def test_backward_empty_tables(xp, rng, combo, name):
    dtype, method = combo
    arrays = _backward_arrays(xp, problem(rng, dtype))
    arrays[name] = xp.asarray(np.zeros((0, C), dtype=dtype))
    refuse_backward(ValueError, rf"{name} must not be empty", method=method, **arrays)


@pytest.mark.parametrize("combo", COMBOS)
def test_backward_zero_channels(xp, rng, combo):
    dtype, method = combo
    arrays = _backward_arrays(xp, problem(rng, dtype))
    arrays["dout"] = xp.asarray(np.zeros((B, T, 0), dtype=dtype))
    refuse_backward(ValueError, r"dout must not be empty \(C = 0\)", method=method, **arrays)


# ----------------------------------------------------------------------------------------------------------
# sizes past 32-bit index arithmetic


def test_check_index_range_boundary():
    """INT32_LIMIT elements are addressable, one more is not; the message names the argument."""
    validate.check_index_range("wte", INT32_LIMIT, "V*C")
    with pytest.raises(ValueError, match=rf"wte: V\*C = {INT32_LIMIT + 1} elements exceeds the 32-bit"):
        validate.check_index_range("wte", INT32_LIMIT + 1, "V*C")


def test_forward_BTC_past_int32(xp):
    """B*T*C = 2**31 built from small arrays: 32768 x 8 ids (1 MiB) and one 8192-channel wte row."""
    big_B, big_T, big_C = 2**15, 8, 8192
    inp = xp.zeros((big_B, big_T), dtype=np.int32)
    wte = xp.asarray(np.ones((1, big_C), dtype=BF16))
    wpe = xp.asarray(np.ones((big_T, big_C), dtype=BF16))
    refuse_forward(ValueError, rf"inp: B\*T\*C = {2**31} elements exceeds the 32-bit index range",
                   inp=inp, wte=wte, wpe=wpe)


def test_make_buckets_BTC_past_int32(xp):
    inp = xp.zeros((1, 1), dtype=np.int32)
    refuse_buckets(ValueError, rf"inp: B\*T\*C = {2**31} elements exceeds", inp, 2**31, BF16, **_bucket_kwargs(xp))


@pytest.fixture
def sparse(tmp_path):
    """Make memory-mapped arrays over sparse files of zeros (address space, not memory or disk); deleted after."""
    paths = []

    def make(name: str, shape, dtype, mode: str) -> np.memmap:
        path = tmp_path / name
        with open(path, "wb") as f:
            f.truncate(int(np.prod(shape)) * np.dtype(dtype).itemsize)
        paths.append(path)
        return np.memmap(path, dtype=dtype, mode=mode, shape=shape)

    yield make
    for path in paths:
        path.unlink()  # a 4 GiB apparent size is better not left behind in pytest's temp folders


def _spot_check_zeros(big: np.memmap, rng) -> None:
    """A few rows of a sparse map (first, last, random) are still all zero bits: nothing was written.

    Reading every row would page in gigabytes, so this samples; validation never touches the data at all.
    """
    rows = np.unique(np.concatenate([[0, big.shape[0] - 1], rng.integers(0, big.shape[0], 62)]))
    sample = np.asarray(big[rows])
    assert compare.bitwise_equal(sample, np.zeros_like(sample))


def test_backward_BTC_past_int32_memmap(sparse, rng):
    """dout of 2**31 elements (4 GiB of bf16, a sparse file): refused before anything reads it."""
    big_B, big_T, big_C = 2**15, 8, 8192
    dout = sparse("dout.bin", (big_B, big_T, big_C), BF16, "r")
    inp = np.zeros((big_B, big_T), dtype=np.int32)
    dwte = np.ones((1, big_C), dtype=BF16)
    dwpe = np.ones((big_T, big_C), dtype=BF16)
    before = {"inp": _words(inp), "dwte": _words(dwte), "dwpe": _words(dwpe)}
    with pytest.raises(ValueError, match=rf"dout: B\*T\*C = {2**31} elements exceeds the 32-bit index range"):
        enc.encoder_backward(dwte, dwpe, dout, inp, seed=1)
    for name, array in {"inp": inp, "dwte": dwte, "dwpe": dwpe}.items():
        assert compare.bitwise_equal(before[name], _words(array)), name
    _spot_check_zeros(dout, rng)


def test_wte_VC_past_int32_memmap(sparse, rng):
    """A vocabulary table of V*C = 2**31 + 8192 elements (a sparse file): refused on both calls.

    The forward maps it read-only (inputs need not be writable); the backward maps it writable and checks
    afterwards that it still holds only zeros.
    """
    big_V, big_C = 2**18 + 1, 8192
    p = problem(rng, BF16, C=big_C, maxT=T)
    limit = rf"V\*C = {big_V * big_C} elements exceeds the 32-bit index range"

    wte = sparse("wte.bin", (big_V, big_C), BF16, "r")
    out = poisoned((B, T, big_C), BF16)
    small = {"inp": p.inp, "wpe": p.wpe, "out": out}
    before = {name: _words(array) for name, array in small.items()}
    with pytest.raises(ValueError, match=rf"wte: {limit}"):
        enc.encoder_forward(p.inp, wte, p.wpe, out=out)
    for name, array in small.items():
        assert compare.bitwise_equal(before[name], _words(array)), name
    _spot_check_zeros(wte, rng)
    del wte

    dwte = sparse("dwte.bin", (big_V, big_C), BF16, "r+")
    dwpe, dout, inp = p.dwpe.copy(), p.dout.copy(), p.inp.copy()
    with pytest.raises(ValueError, match=rf"dwte: {limit}"):
        enc.encoder_backward(dwte, dwpe, dout, inp, seed=1)
    assert compare.bitwise_equal(dwpe, p.dwpe) and compare.bitwise_equal(dout, p.dout)
    assert compare.bitwise_equal(inp, p.inp)
    _spot_check_zeros(dwte, rng)


# ----------------------------------------------------------------------------------------------------------
# seeds, methods, bucketing

BAD_SEEDS = [
    pytest.param(-1, ValueError, id="minus-1"),
    pytest.param(2**32, ValueError, id="2**32"),
    pytest.param(np.uint64(2**32), ValueError, id="uint64-2**32"),
    pytest.param(np.int64(-5), ValueError, id="int64-minus-5"),
    pytest.param(1.5, TypeError, id="float"),
    pytest.param(np.float64(2.0), TypeError, id="float64"),
    pytest.param(True, TypeError, id="True"),
    pytest.param(np.bool_(False), TypeError, id="numpy-bool"),
    pytest.param("3", TypeError, id="str"),
    pytest.param(None, TypeError, id="None"),
    pytest.param(np.timedelta64(5), TypeError, id="timedelta64"),
    pytest.param(np.timedelta64(5, "s"), TypeError, id="timedelta64-seconds"),
    pytest.param(np.array(5), TypeError, id="0-d-array"),
]


@pytest.mark.parametrize("seed, exc", BAD_SEEDS)
@pytest.mark.parametrize("combo", COMBOS)
def test_backward_bad_seed(xp, rng, combo, seed, exc):
    dtype, method = combo
    p = problem(rng, dtype).on(xp)
    refuse_backward(exc, r"seed must", dwte=p.dwte, dwpe=p.dwpe, dout=p.dout, inp=p.inp, seed=seed, method=method)


@pytest.mark.parametrize("seed", [0, 2**32 - 1, np.uint64(2**32 - 1), np.int32(7), np.uint32(3)], ids=repr)
def test_backward_boundary_seeds_accepted(xp, rng, seed):
    """The whole unsigned 32-bit range, as Python or NumPy integers, is accepted and changes the result."""
    p = problem(rng, BF16)
    on = p.on(xp)
    enc.encoder_backward(on.dwte, on.dwpe, on.dout, on.inp, seed=seed)
    assert not compare.bitwise_equal(on.dwte, p.dwte)


@pytest.mark.parametrize("method, exc, match", [
    ("bucket", ValueError, r"method must be one of"),
    ("BUCKETED", ValueError, r"method must be one of"),
    ("", ValueError, r"method must be one of"),
    ("atomic-bf16", ValueError, r"method must be one of"),
    (None, TypeError, r"method must be a string"),
    (3, TypeError, r"method must be a string"),
    (b"bucketed", TypeError, r"method must be a string"),
    (np.array(["bucketed"]), TypeError, r"method must be a string, .*not ndarray"),
    (np.array("bucketed"), TypeError, r"method must be a string, .*not ndarray"),
])
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_unknown_method(xp, rng, dtype, method, exc, match):
    p = problem(rng, dtype).on(xp)
    refuse_backward(exc, match, dwte=p.dwte, dwpe=p.dwpe, dout=p.dout, inp=p.inp, method=method)


def test_atomic_bf16_refuses_fp32(xp, rng):
    p = problem(rng, FP32).on(xp)
    refuse_backward(ValueError, r"method='atomic_bf16' needs bf16", dwte=p.dwte, dwpe=p.dwpe, dout=p.dout,
                    inp=p.inp, method="atomic_bf16")


@pytest.mark.parametrize("bucketing", ["GPU", "host", ""])
def test_backward_unknown_bucketing(xp, rng, bucketing):
    p = problem(rng).on(xp)
    refuse_backward(ValueError, r"bucketing must be", dwte=p.dwte, dwpe=p.dwpe, dout=p.dout, inp=p.inp,
                    bucketing=bucketing)


@pytest.mark.parametrize("bucketing", [None, 1, b"cpu", np.array(["cpu"]), ["cpu"]], ids=repr)
def test_backward_bucketing_must_be_a_string(xp, rng, bucketing):
    p = problem(rng).on(xp)
    refuse_backward(TypeError, r"bucketing must be a string", dwte=p.dwte, dwpe=p.dwpe, dout=p.dout, inp=p.inp,
                    bucketing=bucketing)


BAD_FLAGS = [None, 0, 1, [], [True], np.array([True]), np.array(True), "yes", 1.0, np.int8(1)]


@pytest.mark.parametrize("flag", BAD_FLAGS, ids=repr)
def test_check_ids_must_be_a_bool(xp, rng, flag):
    """``check_ids`` is read as a bool only if it is one: None, 0 and [] used to switch the id check off."""
    p = problem(rng)
    ids = p.inp.copy()
    ids[0, 0] = V  # out of range: a check_ids read as False would let it through
    on = replace(p, inp=ids).on(xp)
    refuse_backward(TypeError, r"check_ids must be True or False", dwte=on.dwte, dwpe=on.dwpe, dout=on.dout,
                    inp=on.inp, check_ids=flag)
    watched = {"inp": on.inp, "wte": on.wte, "wpe": on.wpe}
    assert_refused(TypeError, r"check_ids must be True or False",
                   lambda: enc.encoder_forward(on.inp, on.wte, on.wpe, check_ids=flag), watched)


def test_numpy_bool_check_ids_accepted(rng):
    p = problem(rng).on(np)
    enc.encoder_backward(p.dwte, p.dwpe, p.dout, p.inp, seed=1, check_ids=np.bool_(True))


def test_gpu_bucketing_refuses_numpy(rng):
    p = problem(rng)
    refuse_backward(ValueError, r"bucketing='gpu' needs CuPy", dwte=p.dwte, dwpe=p.dwpe, dout=p.dout, inp=p.inp,
                    bucketing="gpu")


# ----------------------------------------------------------------------------------------------------------
# mixed dtypes


@pytest.mark.parametrize("case", ["bf16-wte-fp32-wpe", "fp32-wte-bf16-wpe", "out-dtype", "wte-float64",
                                  "wte-float16"])
def test_forward_mixed_dtypes(xp, rng, case):
    p_bf16, p_fp32 = problem(rng, BF16), problem(rng, FP32)
    args = dict(inp=p_bf16.inp, wte=p_bf16.wte, wpe=p_bf16.wpe, out=None)
    exc = TypeError
    if case == "bf16-wte-fp32-wpe":
        args["wpe"], match = p_fp32.wpe, r"wpe has dtype float32 but the other arrays have bfloat16"
    elif case == "fp32-wte-bf16-wpe":
        args["wte"], match = p_fp32.wte, r"wpe has dtype bfloat16 but the other arrays have float32"
    elif case == "out-dtype":
        args["out"], match = poisoned((B, T, C), FP32), r"out must have the dtype of wte \(bfloat16\)"
    elif case == "wte-float64":
        args["wte"], match = p_fp32.wte.astype(np.float64), r"wte must be ml_dtypes.bfloat16 or numpy.float32"
    else:
        args["wte"], match = p_fp32.wte.astype(np.float16), r"wte must be ml_dtypes.bfloat16 or numpy.float32"
    refuse_forward(exc, match, **{k: None if v is None else xp.asarray(v) for k, v in args.items()})


@pytest.mark.parametrize("case", ["fp32-dout-bf16-dwte", "bf16-dout-fp32-dwpe", "dout-float16", "dout-float64"])
@pytest.mark.parametrize("method", validate.METHODS)
def test_backward_mixed_dtypes(xp, rng, method, case):
    p_bf16, p_fp32 = problem(rng, BF16), problem(rng, FP32)
    if case == "fp32-dout-bf16-dwte":
        args, match = dict(dwte=p_bf16.dwte, dwpe=p_fp32.dwpe, dout=p_fp32.dout), r"dwte has dtype bfloat16"
    elif case == "bf16-dout-fp32-dwpe":
        args, match = dict(dwte=p_bf16.dwte, dwpe=p_fp32.dwpe, dout=p_bf16.dout), r"dwpe has dtype float32"
    elif case == "dout-float16":
        args = dict(dwte=p_bf16.dwte, dwpe=p_bf16.dwpe, dout=p_bf16.dout.astype(np.float16))
        match = r"dout must be ml_dtypes.bfloat16 or numpy.float32, not float16"
    else:
        args = dict(dwte=p_fp32.dwte, dwpe=p_fp32.dwpe, dout=p_fp32.dout.astype(np.float64))
        match = r"dout must be ml_dtypes.bfloat16 or numpy.float32, not float64"
    args["inp"] = p_bf16.inp
    refuse_backward(TypeError, match, method=method, **{k: xp.asarray(v) for k, v in args.items()})


# ----------------------------------------------------------------------------------------------------------
# ndarray subclasses (only plain arrays reach a kernel)


class Tagged(np.ndarray):
    """A subclass that changes nothing: refused all the same."""


def _subclassed(kind: str, array: np.ndarray):
    if kind == "matrix":
        return np.asmatrix(array)
    if kind == "masked":
        mask = np.zeros(array.shape, bool)
        mask.reshape(-1)[0] = True
        return np.ma.masked_array(array, mask=mask)
    return array.view(Tagged)


SUBCLASSES = ["matrix", "masked", "tagged"]


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
@pytest.mark.parametrize("kind", SUBCLASSES)
@pytest.mark.parametrize("name", BACKWARD_ARGS)
@pytest.mark.parametrize("combo", COMBOS)
def test_backward_refuses_subclasses(rng, combo, name, kind):
    dtype, method = combo
    arrays = _backward_arrays(np, problem(rng, dtype))
    if kind == "matrix" and arrays[name].ndim != 2:
        pytest.skip("np.matrix is 2-D only")
    arrays[name] = _subclassed(kind, arrays[name])
    refuse_backward(TypeError, rf"{name} must be a plain numpy.ndarray, not the subclass", method=method, **arrays)


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
@pytest.mark.parametrize("kind", SUBCLASSES)
@pytest.mark.parametrize("name", FORWARD_ARGS)
def test_forward_refuses_subclasses(rng, name, kind):
    arrays = _forward_arrays(np, problem(rng))
    if kind == "matrix" and arrays[name].ndim != 2:
        pytest.skip("np.matrix is 2-D only")
    arrays[name] = _subclassed(kind, arrays[name])
    refuse_forward(TypeError, rf"{name} must be a plain numpy.ndarray, not the subclass", **arrays)


@pytest.mark.parametrize("hidden", [-1, V])
def test_masked_ids_cannot_hide_out_of_range_ids(rng, hidden):
    """A masked array's min/max skip masked entries; the kernels would read them: refused by type first."""
    p = problem(rng)
    ids = p.inp.copy()
    ids[1, 1] = hidden
    masked = np.ma.masked_array(ids, mask=ids == hidden)
    assert 0 <= masked.min() and masked.max() < V  # what the range check would have seen
    refuse_backward(TypeError, r"inp must be a plain numpy.ndarray", dwte=p.dwte, dwpe=p.dwpe, dout=p.dout,
                    inp=masked)
    refuse_forward(TypeError, r"inp must be a plain numpy.ndarray", inp=masked, wte=p.wte, wpe=p.wpe)
    refuse_buckets(TypeError, r"inp must be a plain numpy.ndarray", masked, C, BF16)


@pytest.mark.gpu
@pytest.mark.parametrize("name", BACKWARD_ARGS)
def test_backward_refuses_cupy_subclasses(rng, name):
    import cupy

    class TaggedCupy(cupy.ndarray):
        pass

    arrays = _backward_arrays(cupy, problem(rng))
    watched = dict(arrays)  # the plain arrays: the subclass view shares the memory of one of them
    arrays[name] = TaggedCupy(arrays[name].shape, arrays[name].dtype, memptr=arrays[name].data)
    assert_refused(TypeError, rf"{name} must be a plain cupy.ndarray, not the subclass TaggedCupy",
                   lambda: enc.encoder_backward(seed=1, **arrays), watched)


def test_memmap_is_accepted_like_a_plain_array(tmp_path, rng):
    """Decision: np.memmap (a plain buffer mapped from a file) is accepted; same bits as plain arrays."""
    p = problem(rng)
    dwte = np.memmap(tmp_path / "dwte.bin", dtype=BF16, mode="w+", shape=p.dwte.shape)
    dwte[...] = p.dwte
    expected = p.on(np)
    enc.encoder_backward(expected.dwte, expected.dwpe, expected.dout, expected.inp, seed=3)
    dwpe = p.dwpe.copy()
    enc.encoder_backward(dwte, dwpe, p.dout, p.inp, seed=3)
    assert compare.bitwise_equal(np.asarray(dwte), expected.dwte) and compare.bitwise_equal(dwpe, expected.dwpe)


def test_two_memmaps_of_one_file_overlap(tmp_path, rng):
    """dwpe and dout mapped over the same bytes of one file: different addresses, refused as overlapping."""
    p = problem(rng, maxT=B * T)
    path = tmp_path / "one.bin"
    p.dwpe.tofile(path)
    dwpe = np.memmap(path, dtype=BF16, mode="r+", shape=p.dwpe.shape)
    dout = np.memmap(path, dtype=BF16, mode="r", shape=(B, T, C))
    refuse_backward(ValueError, r"dwpe and dout overlap in memory", dwte=p.dwte, dwpe=dwpe, dout=dout, inp=p.inp)


# ----------------------------------------------------------------------------------------------------------
# overlapping outputs


@pytest.mark.parametrize("combo", COMBOS)
def test_backward_dwte_dwpe_overlap(xp, rng, combo):
    """dwte and dwpe cut from one buffer so that one row is shared."""
    dtype, method = combo
    p = problem(rng, dtype)
    whole = np.concatenate([p.dwte, p.dwpe[1:]])  # rows V-1 .. : dwpe starts at dwte's last row
    buffer = xp.asarray(whole)
    on = p.on(xp)
    refuse_backward(ValueError, r"dwte and dwpe overlap in memory", dwte=buffer[:V], dwpe=buffer[V - 1 :],
                    dout=on.dout, inp=on.inp, method=method, watch={"buffer": buffer})


@pytest.mark.parametrize("combo", COMBOS)
def test_backward_dwte_is_dwpe(xp, rng, combo):
    dtype, method = combo
    p = problem(rng, dtype, V=MAXT).on(xp)
    refuse_backward(ValueError, r"dwte and dwpe overlap in memory", dwte=p.dwte, dwpe=p.dwte, dout=p.dout,
                    inp=p.inp, method=method)


@pytest.mark.parametrize("combo", COMBOS)
def test_backward_dout_aliases_dwte(xp, rng, combo):
    dtype, method = combo
    p = problem(rng, dtype, V=B * T).on(xp)
    refuse_backward(ValueError, r"dwte and dout overlap in memory", dwte=p.dwte, dwpe=p.dwpe,
                    dout=p.dwte.reshape(B, T, C), inp=p.inp, method=method)


@pytest.mark.parametrize("table", ["wte", "wpe"])
def test_forward_out_aliases_input(xp, rng, table):
    p = problem(rng, V=B * T, maxT=B * T).on(xp)
    out = getattr(p, table).reshape(B, T, C)
    refuse_forward(ValueError, rf"out and {table} overlap in memory", inp=p.inp, wte=p.wte, wpe=p.wpe, out=out)


def test_adjacent_views_are_accepted(xp, rng):
    """dwte and dwpe back to back in one buffer do not overlap: accepted, same bits as separate buffers."""
    p = problem(rng, BF16)
    buffer = xp.asarray(np.concatenate([p.dwte, p.dwpe]))
    dwte, dwpe = buffer[:V], buffer[V:]
    separate = p.on(xp)
    on = p.on(xp)
    enc.encoder_backward(dwte, dwpe, on.dout, on.inp, seed=9)
    enc.encoder_backward(separate.dwte, separate.dwpe, separate.dout, separate.inp, seed=9)
    assert compare.bitwise_equal(dwte, separate.dwte) and compare.bitwise_equal(dwpe, separate.dwpe)


def test_overlapping_inputs_are_accepted(xp, rng):
    """Inputs are only read, so wte and wpe may share memory."""
    p = problem(rng, BF16)
    buffer = xp.asarray(np.concatenate([p.wte, p.wpe]))
    wte, wpe = buffer[:V], buffer[2 : 2 + MAXT]  # wpe's rows 0..V-3 are wte's rows 2..V-1
    out = enc.encoder_forward(p.on(xp).inp, wte, wpe)
    expected = enc.encoder_forward(p.inp, to_numpy(wte).copy(), to_numpy(wpe).copy())
    assert compare.bitwise_equal(out, expected)


# ----------------------------------------------------------------------------------------------------------
# read-only outputs (NumPy: CuPy arrays have no read-only flag)


@pytest.mark.parametrize("name", ["dwte", "dwpe"])
@pytest.mark.parametrize("combo", COMBOS)
def test_backward_read_only_output(rng, combo, name):
    """A read-only gradient is refused up front, before the other one is updated."""
    dtype, method = combo
    arrays = _backward_arrays(np, problem(rng, dtype))
    arrays[name].flags.writeable = False
    refuse_backward(ValueError, rf"{name} is read-only", method=method, **arrays)


def test_forward_read_only_out(rng):
    arrays = _forward_arrays(np, problem(rng))
    arrays["out"].flags.writeable = False
    refuse_forward(ValueError, r"out is read-only", **arrays)


def test_read_only_inputs_are_accepted(rng):
    p = problem(rng)
    on = p.on(np)
    for array in (on.inp, on.dout):
        array.flags.writeable = False
    enc.encoder_backward(on.dwte, on.dwpe, on.dout, on.inp, seed=4)
    assert not compare.bitwise_equal(on.dwte, p.dwte)


# ----------------------------------------------------------------------------------------------------------
# NumPy and CuPy mixed in one call (GPU only)


@pytest.mark.gpu
@pytest.mark.parametrize("odd_one", FORWARD_ARGS)
@pytest.mark.parametrize("side", ["numpy", "cupy"])
def test_forward_mixed_backends(rng, side, odd_one):
    import cupy

    arrays = _forward_arrays(cupy if side == "numpy" else np, problem(rng))
    arrays[odd_one] = (np if side == "numpy" else cupy).asarray(to_numpy(arrays[odd_one]))
    label = "NumPy" if side == "numpy" else "CuPy"
    refuse_forward(TypeError, rf"{label} \({odd_one}\)", **arrays)


@pytest.mark.gpu
@pytest.mark.parametrize("odd_one", BACKWARD_ARGS)
@pytest.mark.parametrize("side", ["numpy", "cupy"])
@pytest.mark.parametrize("combo", COMBOS)
def test_backward_mixed_backends(rng, combo, side, odd_one):
    import cupy

    dtype, method = combo
    arrays = _backward_arrays(cupy if side == "numpy" else np, problem(rng, dtype))
    arrays[odd_one] = (np if side == "numpy" else cupy).asarray(to_numpy(arrays[odd_one]))
    label = "NumPy" if side == "numpy" else "CuPy"
    refuse_backward(TypeError, rf"{label} \({odd_one}\)", method=method, **arrays)


@pytest.mark.gpu
def test_make_buckets_on_gpu_needs_V(rng):
    import cupy

    refuse_buckets(ValueError, r"V \(the vocabulary size\) is required", cupy.asarray(problem(rng).inp), C, BF16)


@pytest.mark.gpu
def test_make_buckets_on_gpu_checks_ids_against_V(rng):
    import cupy

    ids = problem(rng).inp.copy()
    ids[1, 1] = V
    refuse_buckets(ValueError, rf"inp holds token id {V}\b", cupy.asarray(ids), C, BF16, V=V)


@pytest.mark.gpu
def test_arrays_on_another_gpu_are_refused(rng):
    """With two GPUs: arrays on GPU 1 while GPU 0 is current are refused, naming the argument."""
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    p = problem(rng)
    with cupy.cuda.Device(1):
        far = p.on(cupy)
    with cupy.cuda.Device(0):
        near = p.on(cupy)
        refuse_backward(ValueError, r"dwte lives on GPU 1 but the current device is GPU 0", dwte=far.dwte,
                        dwpe=near.dwpe, dout=near.dout, inp=near.inp)
        refuse_forward(ValueError, r"wte lives on GPU 1", inp=near.inp, wte=far.wte, wpe=near.wpe)


# ----------------------------------------------------------------------------------------------------------
# a bucket table built ahead (encoder_backward(..., buckets=...))


def _table_of(xp, p, dtype=None, **overrides):
    """The table of problem ``p``'s ids on backend ``xp`` (``overrides``: other ids, C or dtype to build it for)."""
    inp = overrides.get("inp", p.inp)
    return enc.make_buckets(xp.asarray(inp), overrides.get("C", p.C), overrides.get("dtype", dtype or p.dwte.dtype),
                            **_bucket_kwargs(xp))


@pytest.mark.parametrize("method", ["atomic", "atomic_bf16"])
def test_buckets_for_an_atomic_method(xp, rng, method):
    p = problem(rng)
    refuse_backward(ValueError, "buckets is read by the deterministic methods", method=method,
                    buckets=_table_of(xp, p), **_backward_arrays(xp, p))


@pytest.mark.parametrize("bucketing", ["cpu", "gpu"])
def test_buckets_with_a_bucketing(xp, rng, bucketing):
    if xp is np and bucketing == "gpu":
        pytest.skip("bucketing='gpu' with NumPy arrays is refused for its own reason")
    p = problem(rng)
    refuse_backward(ValueError, f"bucketing='{bucketing}' says where to build one", bucketing=bucketing,
                    buckets=_table_of(xp, p), **_backward_arrays(xp, p))


@pytest.mark.parametrize("bad", [None, "table", {"info": 0}], ids=["none-kind", "str", "dict"])
def test_buckets_must_be_a_table(xp, rng, bad):
    if bad is None:
        bad = problem(rng).inp  # an array is not a table
    p = problem(rng)
    refuse_backward(TypeError, "buckets must be a bucket table from make_buckets", buckets=bad,
                    **_backward_arrays(xp, p))


@pytest.mark.parametrize("method", ["bucketed", "chunked"])
def test_buckets_built_for_other_sizes(xp, rng, method):
    p = problem(rng)
    arrays = _backward_arrays(xp, p)
    refuse_backward(ValueError, f"built for C = {2 * C}, but dout has C = {C}", method=method,
                    buckets=_table_of(xp, p, C=2 * C), **arrays)
    refuse_backward(ValueError, "built for dtype float32, but the gradients are bfloat16", method=method,
                    buckets=_table_of(xp, p, dtype=FP32), **arrays)
    other = problem(rng, B=B + 1)
    refuse_backward(ValueError, rf"holds {(B + 1) * T} positions, but inp has B\*T = {B * T}", method=method,
                    buckets=_table_of(xp, other), **arrays)


@pytest.mark.parametrize("method", ["bucketed", "chunked"])
def test_buckets_of_other_ids(xp, rng, method):
    """check_ids (the default) also checks that the table is the one of these ids; off, nothing is read."""
    p = problem(rng)
    other = p.inp.copy()
    other[0, 0] = (other[0, 0] + 1) % V
    refuse_backward(ValueError, "buckets is not the bucket table of these ids", method=method,
                    buckets=_table_of(xp, p, inp=other), **_backward_arrays(xp, p))


@pytest.mark.gpu
def test_device_table_with_numpy_arrays(rng):
    import cupy

    p = problem(rng)
    table = _table_of(cupy, p)
    refuse_backward(TypeError, r"pass buckets.to_host\(\)", buckets=table, **_backward_arrays(np, p))


@pytest.mark.gpu
def test_table_without_bucket_rows_for_the_bucketed_method(rng):
    import cupy

    from gpt2enc_edu.buckets.gpu import build_bucket_table_gpu

    p = problem(rng, B=1)  # one sequence: the one-block route, which skips the rows when asked
    table = build_bucket_table_gpu(cupy.asarray(p.inp), C, BF16, V, bucket_rows=False)
    assert not table.has_bucket_rows
    refuse_backward(ValueError, "method='bucketed' reads the bucket rows", buckets=table,
                    **_backward_arrays(cupy, p))


def test_make_buckets_check_ids_must_be_a_bool(xp, rng):
    refuse_buckets(TypeError, "check_ids must be True or False", xp.asarray(problem(rng).inp), C, BF16, check_ids=1,
                   **_bucket_kwargs(xp))


@pytest.mark.parametrize("bad", ["int64", "3 columns", "strided"])
def test_buckets_arrays_must_be_the_kernels_layout(xp, rng, bad):
    """A hand-made BucketTable whose arrays the kernels would misread (they read int32, info and units as int4)."""
    p = problem(rng)
    table = enc.make_buckets(p.inp, C, BF16)  # a host table: the one kind a caller can assemble by hand
    if bad == "int64":
        table, match, exc = replace(table, bt_list=table.bt_list.astype(np.int64)), "bt_list must be int32", TypeError
    elif bad == "3 columns":
        table, match, exc = replace(table, info=np.ascontiguousarray(table.info[:, :3])), r"info has shape", ValueError
    else:
        wide = np.zeros((table.units.shape[0], 8), np.int32)
        wide[:, ::2] = table.units
        table, match, exc = replace(table, units=wide[:, ::2]), "units must be C-contiguous", ValueError
    refuse_backward(exc, match, buckets=table, **_backward_arrays(xp, p))


@pytest.mark.parametrize(("field", "value", "match"), [
    ("C", str(C), "buckets.C must be an integer"), ("C", float(C), "buckets.C must be an integer"),
    ("dtype", "garbage", "buckets.dtype must be a dtype"),
])
def test_buckets_sizes_of_the_wrong_type_are_named(xp, rng, field, value, match):
    """A hand-edited table whose C or dtype is of the wrong type: an error that names the field, nothing written."""
    p = problem(rng)
    table = replace(enc.make_buckets(p.inp, C, BF16), **{field: value})
    refuse_backward(TypeError, match, buckets=table, **_backward_arrays(xp, p))


def test_a_method_name_that_only_claims_to_be_one_is_refused(xp, rng):
    """A str subclass whose == is always true is compared as the plain string it holds."""
    class Anything(str):
        def __eq__(self, other):
            return True

        __hash__ = str.__hash__

    refuse_backward(ValueError, "method must be one of", method=Anything("zzz"), **_backward_arrays(xp, problem(rng)))


@pytest.mark.gpu
def test_host_table_holding_cupy_arrays_with_numpy_arrays(rng):
    import cupy

    p = problem(rng)
    table = enc.make_buckets(p.inp, C, BF16)
    on_gpu = replace(table, bt_list=cupy.asarray(table.bt_list))
    refuse_backward(TypeError, "a BucketTable holds NumPy arrays", buckets=on_gpu, **_backward_arrays(np, p))



# ----------------------------------------------------------------------------------------------------------
# first mistakes: the message says how to put them right


@pytest.mark.parametrize("other", ["float16", "float64", "float8_e4m3fn"])
@pytest.mark.parametrize("name", ["wte", "wpe"])
def test_float_weights_get_a_conversion_that_works(xp, rng, name, other):
    """Weights of another float type are refused with a conversion hint, and the hinted conversion is accepted."""
    import ml_dtypes

    if other.startswith("float8") and xp is not np:
        pytest.skip("CuPy makes no float8 arrays: there is nothing to refuse")
    p = problem(rng, FP32)
    arrays = _forward_arrays(xp, p)
    arrays[name] = arrays[name].astype(getattr(ml_dtypes, other, None) or np.dtype(other))
    hint = rf"convert with {name}.astype\(ml_dtypes.bfloat16\) \(llm.c's storage\) or {name}.astype\(np.float32\)"
    match = rf"{name} must be ml_dtypes.bfloat16 or numpy.float32, not {other}; {hint}"
    if other.startswith("float8"):  # one-byte words: the bit-watching helper reads 2- to 8-byte ones
        with pytest.raises(TypeError, match=match):
            enc.encoder_forward(arrays["inp"], arrays["wte"], arrays["wpe"], out=arrays["out"])
    else:
        refuse_forward(TypeError, match, **arrays)
    fixed = {k: v.astype(ml_dtypes.bfloat16) if k in ("wte", "wpe") else v for k, v in arrays.items()}
    out = enc.encoder_forward(fixed["inp"], fixed["wte"], fixed["wpe"])
    assert out.dtype == BF16


def test_integer_weights_get_no_float_hint(xp, rng):
    arrays = _forward_arrays(xp, problem(rng, FP32))
    arrays["wte"] = arrays["wte"].astype(np.int16)
    with pytest.raises(TypeError, match="wte must be ml_dtypes.bfloat16 or numpy.float32, not int16$"):
        enc.encoder_forward(arrays["inp"], arrays["wte"], arrays["wpe"])


def test_float16_gradients_get_a_conversion_hint(xp, rng):
    arrays = _backward_arrays(xp, problem(rng, FP32))
    arrays["dwte"] = arrays["dwte"].astype(np.float16)
    refuse_backward(TypeError, r"dwte must be ml_dtypes.bfloat16 or numpy.float32, not float16; convert with "
                               r"dwte.astype\(ml_dtypes.bfloat16\)", **arrays)


@pytest.mark.parametrize("method", validate.METHODS)
def test_a_forgotten_seed_says_what_it_is_for(xp, rng, method):
    """Python's generic "missing 1 required keyword-only argument" is not what the user sees."""
    arrays = _backward_arrays(xp, problem(rng))
    watched = dict(arrays)

    def call():
        enc.encoder_backward(arrays["dwte"], arrays["dwpe"], arrays["dout"], arrays["inp"], method=method)

    assert_refused(TypeError, r"encoder_backward needs seed=\.\.\.: the seed keys the stochastic rounding", call,
                   watched)
    with pytest.raises(TypeError) as info:
        call()
    assert "fresh one every step" in str(info.value) and "keyword-only" not in str(info.value)


def test_a_positional_seed_is_named_in_the_message(xp, rng):
    arrays = _backward_arrays(xp, problem(rng))

    def call(*extra):
        return lambda: enc.encoder_backward(arrays["dwte"], arrays["dwpe"], arrays["dout"], arrays["inp"], *extra)

    assert_refused(TypeError, r"pass seed=1234; the seed keys the stochastic rounding .* fresh one every step",
                   call(1234), dict(arrays))
    assert_refused(TypeError, r"pass seed=\.\.\. and the options by name", call(1234, "chunked"), dict(arrays))
    enc.encoder_backward(arrays["dwte"], arrays["dwpe"], arrays["dout"], arrays["inp"], seed=1234)  # by name: fine
