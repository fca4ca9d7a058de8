"""The backward methods of ``encoder_backward``: one row each, which every layer reads.

A row says what the method is (deterministic? which bucket table does it read? which dtypes?), which launcher runs
it (a function of ``cuda.py``, whose twin of the same name in ``mirror.py`` gives the GPU's bits or, for the atomic
methods, its kind of nondeterminism), and when it is one launch. The API (``encoder.py``), the validation, the
launchers, the PyTorch adapter, the bench, the demo, the sanitizer driver and the training helper ask here, so adding
a method is its kernel, its launcher, its twin and one row.

    >>> from gpt2enc_edu import methods
    >>> [m.name for m in methods.METHODS.values() if m.deterministic]
    ['bucketed', 'chunked']
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from .layout import SMALL_BACKWARD_MAX_BT, SMALL_MAX_V, dtype_name


@dataclass(frozen=True)
class Method:
    """One backward method.

    ``launcher`` names a function of ``cuda.py`` and its twin in ``mirror.py``. A method with a table (``table`` not
    None) is the wpe kernel, then its launcher ``(dwte, table, dout, C, seed)`` on the bucket table; a method without
    one is its launcher alone, ``(dwte, dwpe, dout, inp, B, T, C)``, the whole backward. ``table``: ``"buckets"``
    reads the bucket rows (``info``) with ``bt_list``; ``"units"`` only the unit list and ``bt_list`` (so a GPU-built
    table skips the bucket rows). ``one_launch``: the launcher (``(dwte, dwpe, dout, inp, B, T, C, seed)``) of the
    method's whole backward in one kernel, taken where ``one_launch_backward`` says. ``rounds_every_add``: every add
    is rounded to the storage dtype (its error bound grows per add, ``compare.error_bound(rounding_per_add=True)``).
    """

    name: str
    deterministic: bool
    table: str | None
    launcher: str
    dtypes: tuple[str, ...] = ("bf16", "fp32")
    rounds_every_add: bool = False
    one_launch: str | None = None
    notes: str = ""

    @property
    def needs_table(self) -> bool:
        """Whether the method reads a bucket table (the deterministic ones)."""
        return self.table is not None

    @property
    def bucket_rows(self) -> bool:
        """Whether the method reads the table's bucket rows (``info``), not only its units and ``bt_list``."""
        return self.table == "buckets"

    def takes(self, dtype) -> bool:
        """Whether the method runs on gradients of storage dtype ``dtype``."""
        return dtype_name(dtype) in self.dtypes


BUCKETED = Method(
    "bucketed", deterministic=True, table="buckets", launcher="encoder_backward_wte_bucketed",
    notes="deterministic, llm.c's scheme: the wpe kernel, then one block per bucket (the package launches a warp for "
          "each small bucket)")
CHUNKED = Method(
    "chunked", deterministic=True, table="units", launcher="encoder_backward_wte_chunked",
    one_launch="encoder_backward_small",
    notes="deterministic, fast and skew-proof: the wpe kernel, then one warp per 32-item chunk of a token and a kernel "
          "that adds a token's chunks in order; the fastest end to end at B >= 8 on an H200, and at most 1024 ids are "
          "one kernel that sorts the ids itself (docs/performance.md)")
ATOMIC = Method("atomic", deterministic=False, table=None, launcher="encoder_backward_atomic",
                notes="atomicAdd in fp32, rounded back to nearest once (nondeterministic)")
ATOMIC_BF16 = Method("atomic_bf16", deterministic=False, table=None, launcher="encoder_backward_atomic_bf16",
                     dtypes=("bf16",), rounds_every_add=True,
                     notes="atomicAdd on bf16 itself (nondeterministic and lossy; bf16 only)")
#: Every method, by name (code names one by its row above, so that a name is written only here).
METHODS = {m.name: m for m in (BUCKETED, CHUNKED, ATOMIC, ATOMIC_BF16)}
#: The method ``encoder_backward`` and the PyTorch adapter take by default.
DEFAULT_METHOD = CHUNKED.name
#: Where a deterministic method's bucket table is built: ``"auto"`` (on the GPU for CuPy arrays, with NumPy for
#: NumPy arrays), ``"cpu"`` (NumPy; for CuPy arrays the ids go to the host and the table back) or ``"gpu"``.
BUCKETINGS = ("auto", "cpu", "gpu")
#: The bucketings that build a CuPy call's table on the GPU.
GPU_BUCKETINGS = ("auto", "gpu")


def described(indent: str) -> str:
    """The methods one a line, ``"name"`` and its notes, the default marked: the list ``encoder_backward``'s
    docstring shows, so that the notes are written only in the rows above."""
    lines = [f'``"{m.name}"``{" (the default)" if m.name == DEFAULT_METHOD else ""}: {m.notes}'
             for m in METHODS.values()]
    return "\n".join(textwrap.fill(line + end, 116, initial_indent=indent, subsequent_indent=indent + "    ")
                     for line, end in zip(lines, [";"] * (len(lines) - 1) + ["."]))


def deterministic_methods() -> tuple[str, ...]:
    """The names of the deterministic methods (bitwise reproducible, the same bits on both backends)."""
    return tuple(name for name, m in METHODS.items() if m.deterministic)


def small_backward_fits(BT: int, V: int) -> bool:
    """Whether the one-launch backward (``kernels/encoder_backward_small.cu``) takes BT ids of a vocabulary of V: at
    most ``SMALL_BACKWARD_MAX_BT`` = 1024 ids (one sequence of GPT-2), each below ``SMALL_MAX_V`` (its sort keys)."""
    return BT <= SMALL_BACKWARD_MAX_BT and V <= SMALL_MAX_V


def check_small_backward_batch(B: int, T: int) -> None:
    """The one-launch backward (``encoder_backward_small``, its kernel and its mirror) takes at most
    ``SMALL_BACKWARD_MAX_BT`` ids: ValueError for more."""
    if B * T > SMALL_BACKWARD_MAX_BT:
        raise ValueError(f"encoder_backward_small takes at most {SMALL_BACKWARD_MAX_BT} ids, not B*T = {B * T}")


def one_launch_backward(method, bucketing: str, BT: int, V: int, *, buckets_given: bool = False) -> bool:
    """Whether ``encoder_backward(..., method=method, bucketing=bucketing)`` on CuPy arrays (``method`` a name or its
    row), for BT ids of a vocabulary of V, is one launch of the method's ``one_launch`` kernel: a method that has
    one, with its table left to be built on the GPU in the call (``bucketing`` in ``GPU_BUCKETINGS``, and no
    ``buckets=``), for a batch that ``small_backward_fits``. The one place that decides it: the dispatch, the
    PyTorch adapter (which then builds no table ahead), the bench (which then reports no table share) and the
    sanitizer driver (which then expects that one kernel) all ask here."""
    row = method if isinstance(method, Method) else METHODS.get(method)
    return (row is not None and row.one_launch is not None and bucketing in GPU_BUCKETINGS and not buckets_given
            and small_backward_fits(BT, V))
