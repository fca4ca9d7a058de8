"""Argument checks that run before anything is launched or written.

Every public call validates all of its arguments here first, so a bad call raises ``TypeError`` (wrong
kind of thing: dtype, array type, a float seed) or ``ValueError`` (right kind, wrong value: shape, range,
size, alignment) naming the argument, and leaves every output buffer bitwise unchanged.

Decisions worth knowing (docs/api.md lists the refusals too):

* only plain arrays reach a kernel: ``numpy.ndarray`` (or ``numpy.memmap``) and ``cupy.ndarray`` themselves;
  subclasses (``np.matrix``, masked arrays, others) are refused with ``TypeError`` (``backend.array_kind``);
* flags and choices have their exact types: ``check_ids`` a ``bool``, ``method`` and ``bucketing`` strings,
  ``seed`` an integer type (``check_int``: no ``bool``, no ``timedelta64``);
* outputs must not overlap each other or an input, judged on the memory itself (``memory.spans``: address
  ranges, and file ranges for memory maps, so two maps of one file are caught);
* token ids must be ``int32`` (the kernels read ``const int*``); ``int64`` is refused rather than copied
  behind your back: pass ``inp.astype(np.int32)``;
* arrays must be C-contiguous with a 16-byte-aligned start (every thread does 128-bit loads): a strided or
  offset view is refused, ``np.ascontiguousarray`` / ``cupy.ascontiguousarray`` fixes it;
* every flat index the kernels compute must fit in a signed 32-bit int;
* outputs must be writable (a read-only NumPy array is refused up front, not half-way through a call)
  and, for CuPy, every array must live on the current device (the kernels launch there);
* checking that ids lie in ``[0, V)`` reads them: on the GPU this is one small reduction and a sync.
  ``check_ids=False`` skips it (for benchmarks); out-of-range ids then corrupt memory on the GPU, as in llm.c
  (the NumPy mirror refuses them anyway). A host bucket table's contents are range-checked either way
  (``validate_buckets.check_table_contents``, beside the other checks of a table built ahead).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .backend import backend_of
from .checks import check_choice, check_flag, check_int
from .layout import INT32_LIMIT, STORAGE_DTYPES, dtype_name, pack_size
from .memory import data_pointer, overlap, spans
from .methods import BUCKETINGS, deterministic_methods
from .methods import METHODS as METHOD_ROWS

#: The names ``method`` may take (``methods.METHODS``, where each one's properties live).
METHODS = tuple(METHOD_ROWS)
#: The methods that read a bucket table.
DETERMINISTIC_METHODS = deterministic_methods()


@dataclass(frozen=True)
class Dims:
    """The sizes of one call, after validation."""

    B: int
    T: int
    C: int
    V: int
    maxT: int
    dtype: np.dtype
    backend: str  # "numpy" or "cuda"


def check_seed(seed) -> int:
    """A seed is an integer in [0, 2**32): the kernels take it as ``unsigned int``."""
    return check_int("seed", seed, minimum=0, maximum=2**32 - 1)


class _Required:
    """The default of a keyword argument that must be given, so that leaving it out raises our own explanation
    (``check_seed_given``) instead of Python's "missing 1 required keyword-only argument"."""

    def __repr__(self) -> str:
        return "<required>"


#: ``encoder_backward``'s ``seed`` when the caller gave none.
SEED_REQUIRED = _Required()

SEED_PURPOSE = ("the seed keys the stochastic rounding of the bf16 gradients (an integer in [0, 2**32)); draw a "
                "fresh one every step, e.g. seed=int(rng.integers(2**32)), so that rounding errors average out "
                "over steps instead of repeating")


def check_seed_given(function: str, seed, positional: tuple) -> None:
    """``TypeError`` saying what the seed is for when ``seed=`` was left out or passed by position."""
    if positional:
        given = f"seed={positional[0]!r}" if len(positional) == 1 else "seed=... and the options by name"
        raise TypeError(f"{function} takes 4 arguments by position (dwte, dwpe, dout, inp) and the rest by name: "
                        f"pass {given}; {SEED_PURPOSE}")
    if seed is SEED_REQUIRED:
        raise TypeError(f"{function} needs seed=...: {SEED_PURPOSE}")


def check_ids_array(inp, name: str = "inp") -> tuple[int, int]:
    """``inp`` is a non-empty (B, T) int32 array; returns (B, T)."""
    if inp.dtype != np.int32:
        hint = f" (convert with {name}.astype(np.int32))" if np.issubdtype(inp.dtype, np.integer) else ""
        raise TypeError(f"{name} must hold int32 token ids, not {inp.dtype}{hint}")
    if inp.ndim != 2:
        raise ValueError(f"{name} must have shape (B, T), got {inp.shape}")
    B, T = inp.shape
    if B == 0 or T == 0:
        raise ValueError(f"{name} must not be empty, got shape {inp.shape} (a zero-size batch)")
    check_layout(name, inp)
    return B, T


def check_storage_dtype(name: str, array) -> np.dtype:
    """``array`` holds bf16 (``ml_dtypes.bfloat16``) or fp32."""
    if array.dtype not in STORAGE_DTYPES:
        hint = ""
        if np.issubdtype(array.dtype, np.floating) or array.dtype.name.startswith("float"):  # fp16, fp64, fp8...
            hint = f"; convert with {name}.astype(ml_dtypes.bfloat16) (llm.c's storage) or {name}.astype(np.float32)"
        raise TypeError(f"{name} must be ml_dtypes.bfloat16 or numpy.float32, not {array.dtype}{hint}")
    return np.dtype(array.dtype)


def check_layout(name: str, array) -> None:
    """C-contiguous and 16-byte aligned, as 128-bit loads and stores require."""
    if not array.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (got strides {array.strides}); use ascontiguousarray")
    if array.size and data_pointer(array) % 16:
        raise ValueError(f"{name} must start at a 16-byte-aligned address for 128-bit loads; copy it first")


def check_writable(name: str, array) -> None:
    """An output can be written: a read-only NumPy array (``flags.writeable`` False) is refused.

    Checked up front so that a backward call never updates ``dwpe`` and then fails on ``dwte``. CuPy
    arrays have no read-only flag and always pass.
    """
    if not getattr(array.flags, "writeable", True):
        raise ValueError(f"{name} is read-only, but the call writes into it; pass a writable array")


def check_device(arrays: dict) -> None:
    """Every CuPy array lives on the current device, where the kernels are compiled and launched."""
    import cupy

    current = cupy.cuda.Device().id
    for name, array in arrays.items():
        if array is not None and int(array.device.id) != current:
            raise ValueError(
                f"{name} lives on GPU {int(array.device.id)} but the current device is GPU {current}; "
                f"call inside `with cupy.cuda.Device({int(array.device.id)}):` or move it with cupy.asarray"
            )


def check_index_range(name: str, count: int, what: str) -> None:
    """``count`` elements must be addressable with 32-bit signed index arithmetic."""
    if count > INT32_LIMIT:
        raise ValueError(f"{name}: {what} = {count} elements exceeds the 32-bit index range of the kernels")


def check_ids_in_range(inp, V: int, name: str = "inp") -> None:
    """Every id in [0, V). Reads the ids (one reduction and a sync on the GPU)."""
    lo, hi = int(inp.min()), int(inp.max())
    if lo < 0 or hi >= V:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{name} holds token id {bad}, outside [0, V) = [0, {V})")


def check_disjoint(outputs: dict, inputs: dict) -> None:
    """No output overlaps another output or an input: the kernels read and write them concurrently.

    Overlap is judged on the memory itself (``memory.spans``): address ranges, and for memory-mapped files
    the byte ranges of the file, so two maps of one file are seen to overlap although their addresses differ.
    """
    covered = {name: spans(array) for name, array in {**outputs, **inputs}.items()}
    names = list(covered)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if a not in outputs and b not in outputs:
                continue
            if overlap(covered[a], covered[b]):
                raise ValueError(f"{a} and {b} overlap in memory; the output must be a separate buffer")


def _check_table(name: str, table, C: int | None, dtype: np.dtype | None) -> tuple[int, int]:
    """A (rows, C) table of the storage dtype, matching ``dtype`` and ``C`` when given."""
    this_dtype = check_storage_dtype(name, table)
    if dtype is not None and this_dtype != dtype:
        raise TypeError(f"{name} has dtype {this_dtype} but the other arrays have {dtype}; use one dtype")
    if table.ndim != 2:
        raise ValueError(f"{name} must be 2-D (rows, C), got shape {table.shape}")
    rows, cols = table.shape
    if C is not None and cols != C:
        raise ValueError(f"{name} has {cols} channels but the other arrays have C = {C}")
    if rows == 0 or cols == 0:
        raise ValueError(f"{name} must not be empty, got shape {table.shape}")
    check_layout(name, table)
    return rows, cols


def _check_C(C: int, dtype: np.dtype, name: str) -> None:
    width = pack_size(dtype)
    if C % width:
        raise ValueError(
            f"{name}: C = {C} must be a multiple of {width} (one 128-bit pack of {dtype_name(dtype)})"
        )


def forward_args(inp, wte, wpe, out, check_ids: bool) -> Dims:
    """Validate ``encoder_forward``'s arguments; returns the call's sizes."""
    arrays = {"inp": inp, "wte": wte, "wpe": wpe}
    if out is not None:
        arrays["out"] = out
    backend = backend_of(**arrays)
    check_ids = check_flag("check_ids", check_ids)
    if backend == "cuda":
        check_device(arrays)
    B, T = check_ids_array(inp)
    V, C = _check_table("wte", wte, None, None)
    dtype = np.dtype(wte.dtype)
    maxT, _ = _check_table("wpe", wpe, C, dtype)
    _check_C(C, dtype, "wte")
    if T > maxT:
        raise ValueError(f"inp has T = {T} positions but wpe has only {maxT} rows")
    check_index_range("inp", B * T * C, "B*T*C")
    check_index_range("wte", V * C, "V*C")
    if out is not None:
        if out.dtype != dtype:
            raise TypeError(f"out must have the dtype of wte ({dtype}), not {out.dtype}")
        if out.shape != (B, T, C):
            raise ValueError(f"out must have shape {(B, T, C)}, got {out.shape}")
        check_layout("out", out)
        check_writable("out", out)
        check_disjoint({"out": out}, {"inp": inp, "wte": wte, "wpe": wpe})
    if check_ids:
        check_ids_in_range(inp, V)
    return Dims(B, T, C, V, maxT, dtype, backend)


def backward_args(dwte, dwpe, dout, inp, seed, method, check_ids, bucketing="auto") -> tuple[Dims, int]:
    """Validate ``encoder_backward``'s arguments; returns the call's sizes and the seed as an int."""
    backend = backend_of(dwte=dwte, dwpe=dwpe, dout=dout, inp=inp)
    seed = check_seed(seed)
    method = check_choice("method", method, METHODS)
    bucketing = check_choice("bucketing", bucketing, BUCKETINGS)
    check_ids = check_flag("check_ids", check_ids)
    if bucketing == "gpu" and backend != "cuda":
        raise ValueError("bucketing='gpu' needs CuPy arrays; NumPy arrays are bucketed on the CPU")
    if backend == "cuda":
        check_device({"dwte": dwte, "dwpe": dwpe, "dout": dout, "inp": inp})
    B, T = check_ids_array(inp)
    dtype = check_storage_dtype("dout", dout)
    if dout.ndim != 3:
        raise ValueError(f"dout must have shape (B, T, C), got {dout.shape}")
    if dout.shape[:2] != (B, T):
        raise ValueError(f"dout has shape {dout.shape} but inp has (B, T) = {(B, T)}")
    C = dout.shape[2]
    if C == 0:
        raise ValueError("dout must not be empty (C = 0)")
    check_layout("dout", dout)
    V, _ = _check_table("dwte", dwte, C, dtype)
    maxT, _ = _check_table("dwpe", dwpe, C, dtype)
    check_writable("dwte", dwte)
    check_writable("dwpe", dwpe)
    _check_C(C, dtype, "dout")
    if T > maxT:
        raise ValueError(f"inp has T = {T} positions but dwpe has only {maxT} rows")
    check_index_range("dout", B * T * C, "B*T*C")
    check_index_range("dwte", V * C, "V*C")
    if not METHOD_ROWS[method].takes(dtype):
        raise ValueError(f"method={method!r} needs {' or '.join(METHOD_ROWS[method].dtypes)} gradients, not "
                         f"{dtype_name(dtype)}; use one of {[m.name for m in METHOD_ROWS.values() if m.takes(dtype)]}")
    check_disjoint({"dwte": dwte, "dwpe": dwpe}, {"dout": dout, "inp": inp})
    if check_ids:
        check_ids_in_range(inp, V)
    return Dims(B, T, C, V, maxT, dtype, backend), seed


def bucket_args(inp, C, dtype, check_ids: bool = True) -> tuple[int, int, np.dtype]:
    """Validate ``make_buckets``'s arguments; returns (B, T, dtype). ``check_ids=False``: no id is read."""
    backend_of(inp=inp)
    B, T = check_ids_array(inp)
    try:
        dtype = np.dtype(dtype)
        dtype_name(dtype)
    except TypeError:
        raise TypeError(f"dtype must be ml_dtypes.bfloat16 or numpy.float32, not {dtype!r}") from None
    C = check_int("C", C, minimum=1)
    _check_C(C, dtype, "C")
    check_index_range("inp", B * T * C, "B*T*C")
    if check_ids and int(inp.min()) < 0:
        raise ValueError(f"inp holds token id {int(inp.min())}, ids must be >= 0")
    return B, T, dtype
