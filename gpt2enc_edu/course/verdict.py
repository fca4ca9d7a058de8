"""The verdict on a learner's kernel: which output elements are wrong, which threads own them, and a picture.

A ``Verdict`` is what ``buildit.check_*`` returns: true when the kernel passed. On a wrong result it holds the
expected and actual values of the tensor that went wrong (as 2-D arrays: rows x channels), the mask of
wrong elements, and for each element the block and thread of the real kernel's launch that owns it (-1
where no single thread does: rows nobody writes, or elements that many threads add into with atomics).
On a hazard (a race, a divergent barrier, a fault) it holds ``fault``, the emulator's picture of the failing
block: its threads by role. ``show()`` draws whichever it has (matplotlib is imported only there).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..compare import ulp_difference
from ..layout import pack_size

_UNSIGNED = {2: np.uint16, 4: np.uint32}


def hex_bits(value) -> str:
    """The bits of one bf16 or fp32 value as hex (``0x3f80``)."""
    value = np.asarray(value)
    width = 2 * value.dtype.itemsize
    return f"0x{int(value.reshape(1).view(_UNSIGNED[value.dtype.itemsize])[0]):0{width}x}"


def elementwise_owner(rows: int, C: int, dtype, block_size: int, *, first_rows: int | None = None):
    """(block, thread) arrays of shape (rows, C) for a kernel with one thread per 128-bit pack of a
    row-major tensor; rows at or past ``first_rows`` (when given) belong to no thread (-1)."""
    thread = np.arange(rows * C, dtype=np.int64).reshape(rows, C) // pack_size(dtype)
    block, thread = np.divmod(thread, block_size)
    if first_rows is not None:
        block[first_rows:] = thread[first_rows:] = -1
    return block, thread


@dataclass
class Verdict:
    """The result of one check; ``bool(verdict)`` is True when the kernel passed every case."""

    exercise: str
    passed: bool
    message: str
    case: str = ""
    tensor: str = ""
    expected: np.ndarray | None = None  #: (rows, C) in the storage dtype
    actual: np.ndarray | None = None
    wrong: np.ndarray | None = None  #: (rows, C) bool
    block: np.ndarray | None = None  #: (rows, C) owning block, -1 for none
    thread: np.ndarray | None = None  #: (rows, C) owning thread of that block, -1 for none
    row_names: list = field(default_factory=list)
    timings: dict = field(default_factory=dict)  #: name -> microseconds, on a GPU success
    status: str = ""  #: "correct", "failed", "not done", "refused" or "no GPU"
    detail: str = ""  #: a compiler log, a traceback, or the cases of a pass
    fault: dict = field(default_factory=dict)  #: a hazard's picture (``grid_memory.picture``)
    description: str = ""  #: the failing case's shapes
    form: str = ""  #: "per-thread Python" or "CUDA"
    seconds: float = 0.0  #: how long the graded run took
    printed: str = ""  #: what the kernel printed (its last lines)

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        return f"Verdict({self.exercise}: {'passed' if self.passed else 'failed'})"

    @property
    def first_wrong(self) -> tuple[int, int] | None:
        """(row, channel) of the first wrong element, or None."""
        if self.wrong is None or not self.wrong.any():
            return None
        row, c = np.argwhere(self.wrong)[0]
        return int(row), int(c)

    def describe_first_wrong(self) -> str:
        """One line on the first wrong element: where, which thread owns it, expected and actual bits."""
        where = self.first_wrong
        if where is None:
            return ""
        row, c = where
        want, got = self.expected[row, c], self.actual[row, c]
        name = self.row_names[row] if self.row_names else f"row {row}"
        owner = (f"owned by block {self.block[row, c]}, thread {self.thread[row, c]}" if self.block[row, c] >= 0
                 else "no single thread owns it")
        ulps = int(ulp_difference(np.asarray([got]), np.asarray([want]))[0]) if np.isfinite(float(want)) else None
        return (f"first wrong element: {self.tensor}[{name}, c={c}] ({owner}): expected {hex_bits(want)} "
                f"({float(want)!r}), got {hex_bits(got)} ({float(got)!r})"
                + (f", {ulps:+d} ulps" if ulps is not None and np.isfinite(float(got)) else ""))

    def show(self, *, max_rows: int = 16, ax=None):
        """Draw the wrong elements (red crosses) on the owner-thread map, or a hazard's threads by role; does
        nothing on a pass."""
        if self.fault:
            return draw_hazard(self.fault, f"{self.exercise}, {self.case}" if self.case else self.exercise, ax=ax)
        if self.passed or self.wrong is None:
            return None
        import matplotlib.pyplot as plt

        bad_rows = np.flatnonzero(self.wrong.any(axis=1))[:max_rows]
        C = self.wrong.shape[1]
        if ax is None:
            _, ax = plt.subplots(figsize=(min(12.0, 2.0 + 0.3 * C), 0.45 * len(bad_rows) + 1.6), dpi=80,
                                 layout="constrained")
        owner = np.where(self.block[bad_rows] >= 0, self.block[bad_rows] * 1024 + self.thread[bad_rows], -1)
        shade = np.where(owner >= 0, owner % 20, np.nan)
        ax.imshow(shade, cmap=plt.get_cmap("tab20", 20), vmin=0, vmax=19, alpha=0.45, aspect="auto",
                  interpolation="nearest")
        rows, cols = np.nonzero(self.wrong[bad_rows])
        ax.plot(cols, rows, "x", color="red", markersize=7, mew=2, label="wrong element")
        if C <= 64:
            size = pack_size(self.expected.dtype)
            for i, row in enumerate(bad_rows.tolist()):
                for c in range(0, C, size):
                    if self.block[row, c] >= 0:
                        ax.text(c + (size - 1) / 2, i, f"b{self.block[row, c]} t{self.thread[row, c]}",
                                ha="center", va="center", fontsize=7)
        names = self.row_names or [f"row {r}" for r in range(self.wrong.shape[0])]
        ax.set_yticks(range(len(bad_rows)), [names[r] for r in bad_rows])
        ax.set_xlabel("channel c")
        ax.set_title(f"{self.exercise}, {self.case}: {int(self.wrong.sum())} of {self.wrong.size} elements of "
                     f"{self.tensor} wrong (shade = owning thread; rows with a wrong element)", fontsize=9)
        ax.legend(fontsize=8, loc="upper right")
        return ax


def draw_hazard(fault: dict, title: str, *, ax=None):
    """Draw a hazard's block as a thread map (one row per warp, one column per lane), each thread coloured by
    its role (``fault["roles"]``: role -> thread indices); the array and elements involved in the title."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    size = max(int(fault.get("block_size") or 32), 1)
    warps = -(-size // 32)
    roles = list(fault.get("roles", {}).items())
    role_of = np.full(warps * 32, np.nan)
    for k, (_, threads) in enumerate(roles):
        role_of[[t for t in threads if 0 <= t < warps * 32]] = k
    role_of[size:] = np.nan
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.32 * warps + 1.8), dpi=80, layout="constrained")
    colours = plt.get_cmap("tab10")
    shade = np.ma.masked_invalid(role_of.reshape(warps, 32))
    ax.imshow(np.ones((warps, 32)), cmap="Greys", vmin=0, vmax=6, aspect="auto")  # light grey: no part in it
    ax.imshow(shade, cmap=colours, vmin=0, vmax=9, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(0, 32, 4))
    ax.set_yticks(range(warps), [f"warp {w}" for w in range(warps)])
    ax.set_xlabel("lane (thread = 32 * warp + lane)")
    ax.legend(handles=[Patch(color=colours(k), label=f"{role} ({len(ts)} thread{'s' if len(ts) != 1 else ''})")
                       for k, (role, ts) in enumerate(roles)], fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, 1.0))
    what = f"; {fault['array']}[{', '.join(map(str, fault['elements'][:8]))}]" if fault.get("array") and \
        fault.get("elements") else ""
    ax.set_title(f"{title}: block {fault.get('block', '?')}{what} (grey: threads with no part in it)", fontsize=9)
    return ax
