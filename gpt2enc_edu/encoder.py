"""The public calls: validate, pick the backend from the arrays, run the kernel or its mirror.

    user call (NumPy or CuPy arrays)
      -> hold the memory it writes and reads (memory.SPAN_LOCK; only the arrays' kinds are checked before)
      -> validate  (everything, before anything is written: what is checked is what runs)
      -> dispatch  (NumPy -> mirror.py, CuPy -> cuda.py)
      -> bucket table, for the deterministic methods (buckets.host with NumPy, or buckets.gpu on the GPU:
         the same table either way)
      -> kernel | mirror (into private buffers, then committed: all outputs written or none)
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from . import backend, cuda, memory, methods, mirror, validate, validate_buckets
from .buckets import BucketTable, build_bucket_table, build_bucket_table_gpu, same_table
from .loader import cupy_module
from .methods import DEFAULT_METHOD, METHODS


def _hold(backend_name: str, writes, reads):
    """Hold the memory a call writes and reads (``memory.SPAN_LOCK``); CUDA calls also hold their stream.

    Calls that write the same memory from several threads run one after another, in the order they get the
    lock; calls on separate memory run side by side. The stream is held because a call reuses per-stream
    scratch buffers (the GPU bucket table, the chunk partials) between its launches.
    """
    resources = ()
    if backend_name == "cuda":
        cupy = cupy_module()
        resources = (_stream_key(cupy.cuda.Device().id, cupy.cuda.get_current_stream().ptr),)
    return memory.SPAN_LOCK.hold(writes, reads, resources)


def _stream_key(device_id: int, stream_ptr: int) -> tuple:
    return ("stream", device_id, stream_ptr)


def stream_held(device_id: int, stream_ptr: int):
    """Hold the stream ``stream_ptr`` of device ``device_id`` as a CUDA call of the package does (``_hold``): for a
    caller that launches work reusing the stream's scratch by other means (the PyTorch adapter's launch plans)."""
    return memory.SPAN_LOCK.hold((), (), (_stream_key(device_id, stream_ptr),))


def _held(arrays: dict, written: tuple[str, ...]):
    """``_hold`` the memory of a call's array arguments ``arrays`` (by name), those named in ``written`` exclusively.

    Taken before validation, so that what is validated is what runs: no other call can write the ids, or flip an
    output's flag, between the check and the run. Only the arguments' kinds are checked first (what the lock needs
    to read their memory; the same ``TypeError`` as validation gives, in the same order).
    """
    kind = backend.backend_of(**arrays)
    return _hold(kind, writes=[a for n, a in arrays.items() if n in written],
                 reads=[a for n, a in arrays.items() if n not in written])


def _mirror_ids(inp, dims) -> np.ndarray:
    """A private copy of the ids for the mirror, checked to lie in ``[0, V)`` whatever ``check_ids`` says.

    The mirror indexes NumPy arrays with the ids, where a negative id would wrap to a row from the end and an id
    of ``V`` would raise ``IndexError`` in the middle of a call: one pass over B*T ints refuses both first. The copy
    is what the mirror reads, so nothing can change the ids after the check.
    """
    ids = np.array(inp, dtype=np.int32)
    validate.check_ids_in_range(ids, dims.V)
    return ids


def _commit(results: dict) -> None:
    """Copy every result the mirror computed into its output, all of them or none: ``{name: (output, result)}``.

    The copies go through views made here, whose flags no one else holds: an output found read-only is refused
    (``ValueError``) before anything is copied, and one whose flag is flipped afterwards is still written whole.
    ``KeyboardInterrupt`` is held back until every copy is made (``memory.deferred_interrupt``).
    """
    targets = {name: output.view() for name, (output, _) in results.items()}
    for name, target in targets.items():
        validate.check_writable(name, target)
    with memory.deferred_interrupt():
        for name, (_, result) in results.items():
            np.copyto(targets[name], result)


def _runner(name: str):
    """The module that runs kernels for backend ``name`` (``cuda`` or ``mirror``), recorded for ``last_backend()``."""
    backend.record(name)
    return cuda if name == "cuda" else mirror


def encoder_forward(inp, wte, wpe, *, out=None, check_ids: bool = True):
    """Token plus position embedding: ``out[b, t, :] = wte[inp[b, t], :] + wpe[t, :]``.

    Parameters
    ----------
    inp : (B, T) int32 array of token ids in ``[0, V)``.
    wte : (V, C) token embedding, ``ml_dtypes.bfloat16`` or ``float32``.
    wpe : (maxT, C) position embedding, same dtype, ``maxT >= T``.
    out : optional (B, T, C) array of that dtype to write into; allocated when omitted.
    check_ids : verify ``0 <= inp < V`` first (a reduction and, on the GPU, a sync). With ``False`` the GPU reads
        whatever row an id gives (undefined behaviour, as in llm.c); the NumPy mirror refuses such ids anyway.

    Returns ``out``. NumPy arguments run the NumPy mirror, CuPy arguments the CUDA kernel; the result is
    the same bits either way (fp32 add, rounded to nearest).
    """
    given = {"inp": inp, "wte": wte, "wpe": wpe} | ({} if out is None else {"out": out})
    with _held(given, written=("out",)):
        dims = validate.forward_args(inp, wte, wpe, out, check_ids)
        run = _runner(dims.backend)
        shape = (dims.B, dims.T, dims.C)
        if dims.backend == "cuda":
            out = cupy_module().empty(shape, dtype=dims.dtype) if out is None else out
            run.encoder_forward(out, inp, wte, wpe, dims.B, dims.T, dims.C)
            return out
        result = np.empty(shape, dtype=dims.dtype)
        run.encoder_forward(result, _mirror_ids(inp, dims), wte, wpe, dims.B, dims.T, dims.C)
        if out is None:
            return result
        _commit({"out": (out, result)})
        return out


def make_buckets(inp, C: int, dtype, *, V: int | None = None, check_ids: bool = True):
    """The bucket table the deterministic wte kernels consume.

    ``inp`` is a (B, T) int32 array, ``C`` the channel count, ``dtype`` the storage dtype (it sets the
    channel-group width: 256 for bf16, 128 for fp32). See ``gpt2enc_edu.buckets`` for the order.
    A NumPy ``inp`` gives a ``BucketTable`` built with NumPy. A CuPy ``inp`` builds the same table on the
    GPU, on the current stream, and returns a ``buckets.DeviceBucketTable`` in memory of its own
    (``.to_host()`` gives the ``BucketTable``); it needs ``V``, the vocabulary size.

    The ids are checked first: no id below 0, and where ``V`` is given none at ``V`` or above (on the GPU, a
    reduction and a sync). ``check_ids=False`` reads no id and so needs no sync (for ids checked already, as
    in a training step that builds the table right after the forward); bad ids then give a wrong table.

    Either table can be built ahead and passed to ``encoder_backward(..., buckets=table)``.
    """
    check_ids = validate.check_flag("check_ids", check_ids)
    with _held({"inp": inp}, written=()):
        validate.bucket_args(inp, C, dtype, check_ids)
        if V is not None:
            validate.check_int("V", V, minimum=1)
            if check_ids:
                validate.check_ids_in_range(inp, int(V))
        if backend.is_cupy_array(inp) and V is None:
            raise ValueError("V (the vocabulary size) is required to bucket CuPy ids on the GPU")
        return _build_table(inp, int(C), np.dtype(dtype), V)


def _build_table(inp, C: int, dtype: np.dtype, V: int | None):
    """``make_buckets`` after validation, with ``inp`` (and, for CuPy ids, the stream) held by the caller."""
    if backend.is_cupy_array(inp):
        backend.record("cuda")
        return build_bucket_table_gpu(inp, C, dtype, int(V)).copy()  # built in the stream's reused workspace
    backend.record("numpy")
    return build_bucket_table(inp, C, dtype)


def encoder_backward(dwte, dwpe, dout, inp, *positional, seed=validate.SEED_REQUIRED, method: str = DEFAULT_METHOD,
                     bucketing: str = "auto", buckets=None, check_ids: bool = True) -> None:
    """Accumulate the encoder's gradients in place: ``dwte[inp[b,t]] += dout[b,t]``, ``dwpe[t] += dout[b,t]``.

    Parameters
    ----------
    dwte : (V, C) token-embedding gradient, updated in place (bf16 or fp32).
    dwpe : (maxT, C) position-embedding gradient, updated in place (rows ``T..maxT`` untouched).
    dout : (B, T, C) gradient of the encoder's output, same dtype.
    inp : (B, T) int32 token ids.
    seed : int in ``[0, 2**32)``, the stochastic-rounding seed (use a fresh one every step); required, by name
        (left out or passed by position, a ``TypeError`` says what it is for).
    method : a name of ``methods.METHODS``, whose row says what each one reads and runs:
        {methods}
        The deterministic methods round bf16 stochastically, keyed by ``seed`` and the element.
    bucketing : where the bucket table of a deterministic method is built: ``"cpu"`` (NumPy; for CuPy
        arrays this copies the ids to the host and the table back, as llm.c does), ``"gpu"`` (built on
        the GPU with no host round trip, by ``buckets.bucketing_route``'s route; CuPy arrays only), or
        ``"auto"`` (``"gpu"`` for CuPy arrays, ``"cpu"`` for NumPy). Both give the same table, hence the same bits.
    buckets : the bucket table of these ids, built ahead with ``make_buckets(inp, C, dtype, V=V)`` (deterministic
        methods only; ``bucketing`` then stays ``"auto"``). The call then only sums: in a training step the ids
        are known at the forward, so the table can be built there, off the backward's critical path (the PyTorch
        adapter does so on a side stream). Same bits as a call that builds the table itself.
    check_ids : verify ``0 <= inp < V`` first (on the GPU: a reduction and a sync), and that ``buckets`` is the
        table of these ids (by building it again and comparing: a check, not for a training loop). With
        ``False``, out-of-range ids are undefined behaviour on the GPU, as in llm.c (the NumPy mirror refuses
        them anyway), and a table of other ids gives wrong gradients. A host ``buckets`` table's contents are
        range-checked either way (docs/reliability.md).

    The old contents of ``dwte``/``dwpe`` are added to, so gradient accumulation over calls works; in bf16
    the atomic methods round to nearest, so an update below half an ulp of the old value is lost on every
    call (the accumulation stalls), while the deterministic methods' stochastic rounding keeps it on average.
    Deterministic methods give bitwise reproducible results, identical on both backends. Calls from several
    threads that write the same memory run one after another; on NumPy arrays a call writes both outputs or
    neither, whatever interrupts it; see ``docs/reliability.md``.
    """
    validate.check_seed_given("encoder_backward", seed, positional)
    with _held({"dwte": dwte, "dwpe": dwpe, "dout": dout, "inp": inp}, written=("dwte", "dwpe")):
        dims, seed = validate.backward_args(dwte, dwpe, dout, inp, seed, method, check_ids, bucketing)
        if buckets is not None:
            validate_buckets.check_buckets(buckets, dims, method, bucketing)
            buckets = _own_table(buckets, dims, method, {"dwte": dwte, "dwpe": dwpe})
            if check_ids:
                _check_table_of_ids(buckets, inp, dims, method)
        if dims.backend == "cuda":
            _backward(dims, dwte, dwpe, dout, inp, seed, METHODS[method], bucketing, buckets)
            return
        ids = _mirror_ids(inp, dims)
        new_dwte, new_dwpe = np.array(dwte), np.array(dwpe)  # private: nothing is written before the commit
        _backward(dims, new_dwte, new_dwpe, dout, ids, seed, METHODS[method], bucketing, buckets)
        _commit({"dwte": (dwte, new_dwte), "dwpe": (dwpe, new_dwpe)})


if encoder_backward.__doc__:  # the methods' list, from their rows (python -OO drops docstrings)
    encoder_backward.__doc__ = encoder_backward.__doc__.replace("        {methods}", methods.described(" " * 8))


def _own_table(table, dims, method: str, outputs: dict):
    """The table the call runs on: a host ``BucketTable`` copied (its arrays are small) and its contents
    range-checked (``validate_buckets.check_table_contents``), with or without ``check_ids``, so nothing can change
    it after the check; a ``DeviceBucketTable`` as it is, once its arrays are found not to overlap ``outputs``
    (addresses only: reading its contents would need a sync; its contract is in docs/reliability.md)."""
    if not isinstance(table, BucketTable):
        arrays = {f"buckets.{field}": getattr(table, field) for field in ("info", "bt_list", "units", "counters")}
        validate.check_disjoint(outputs, {name: a for name, a in arrays.items() if backend.is_cupy_array(a)})
        return table
    own = replace(table, info=np.array(table.info), bt_list=np.array(table.bt_list), units=np.array(table.units))
    validate_buckets.check_table_contents(own, dims, method)
    return own


def _check_table_of_ids(table, inp, dims, method: str) -> None:
    """ValueError unless ``table`` is the table ``make_buckets`` builds for ``inp`` (built again and compared; for
    CuPy arrays on the GPU, then copied to the host: a sync)."""
    rows = METHODS[method].bucket_rows or getattr(table, "has_bucket_rows", True)
    fresh = _build_table(inp, dims.C, dims.dtype, dims.V)  # the call holds inp (and its stream) already
    host = [t if isinstance(t, BucketTable) else t.to_host(bucket_rows=rows) for t in (table, fresh)]
    if not same_table(*host, bucket_rows=rows):
        raise ValueError("buckets is not the bucket table of these ids; build it with make_buckets(inp, C, dtype, V=V) "
                         "from the ids of this call")


def _backward(dims, dwte, dwpe, dout, inp, seed: int, method, bucketing: str, table=None) -> None:
    """``encoder_backward`` after validation, with its memory held: the dispatch of ``method`` (a row of
    ``methods.METHODS``) to its launcher or the launcher's mirror."""
    run = _runner(dims.backend)
    B, T, C = dims.B, dims.T, dims.C
    if not method.needs_table:
        getattr(run, method.launcher)(dwte, dwpe, dout, inp, B, T, C)
        return
    if dims.backend == "cuda" and (bucketing != "cpu" or table is not None):
        run.encoder_backward_deterministic_gpu_bucketing(dwte, dwpe, dout, inp, B, T, C, dims.V, seed, method,
                                                         table=table)
        return
    # llm.c's route: the wpe kernel is queued first, so on a GPU it runs while the host builds the table.
    run.encoder_backward_wpe(dwpe, dout, B, T, C, seed)
    if table is None:
        table = build_bucket_table(backend.to_numpy(inp), C, dims.dtype)
    getattr(run, method.launcher)(dwte, table, dout, C, seed)


# ------------------------------------------------------------------------------------ calls validated ahead
# The PyTorch adapter's CUDA calls come here when it records a launch plan (``plans``; later calls of the signature
# replay the plan and skip even this): the public calls' validation, memory hold and overlap checks cost more host
# time than the kernels of a small call take on the GPU, and the adapter's calls need none of them each time. It
# validates a call's signature once (``validate.forward_args`` / ``backward_args`` on the first call of those shapes,
# dtypes, options and device), and every call of that signature passes arrays of the layout validated: outputs fresh
# (no other call can see them, so none can overlap or hold them), inputs contiguous and aligned (or copied so). What
# stays per call: the stream's hold, where the call reuses the stream's scratch.
def forward_validated(dims, out, inp, wte, wpe) -> None:
    """``encoder_forward`` on CuPy arrays of a signature ``validate.forward_args`` accepted (``dims``), into a fresh
    ``out``, with ids checked already: the kernel alone."""
    backend.record("cuda")
    cuda.encoder_forward(out, inp, wte, wpe, dims.B, dims.T, dims.C)


def backward_validated(dims, dwte, dwpe, dout, inp, seed: int, method: str, bucketing: str) -> None:
    """``encoder_backward`` on CuPy arrays of a signature ``validate.backward_args`` accepted (``dims``), into fresh
    ``dwte`` and ``dwpe``, for ids checked already and a seed checked by the caller (``validate.check_seed``). The
    stream is held: the call reuses its scratch (the bucket table, the chunk partials) between launches."""
    with _hold("cuda", writes=(), reads=()):
        _backward(dims, dwte, dwpe, dout, inp, seed, METHODS[method], bucketing)
