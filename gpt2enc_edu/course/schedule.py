"""A small model of how the GPU runs the bucketed wte kernel's blocks: why the table is largest first.

The model (greedy list scheduling):

* the GPU has ``num_slots`` places where a block can run at once: multiprocessors (SMs) times the blocks
  one SM keeps resident (an H200 has 132 SMs; a 256-thread block lets 8 of them share an SM);
* blocks are handed out in launch order (``blockIdx.x = 0, 1, 2, ...``), each to the slot that frees
  first (ties: the lowest slot number). CUDA does not promise this: the order in which blocks start is not
  documented. In practice low block indices start first, which is what the largest-first table relies on;
* a block runs for ``cost`` time units, ``per_block + per_item * ceil(bucket size / warps)``, and never
  migrates. The wte kernel's 8 warps share a bucket, one item per warp per round, so with ``warps=8`` (the
  kernel's ``layout.WTE_WARPS``) a cost counts rounds: a bucket of 1 to 8 items takes one round. The default
  ``warps=1`` counts items, the simplest picture.

Real hardware adds contention for memory bandwidth, warps of different blocks interleaving inside an
SM, and that undocumented block scheduler, so read the numbers as a picture of the *tail*, not as a
timing. The tail is what the order decides: the run ends when the last block ends. If a
long block starts last, every other slot idles while it runs. Handing out the longest blocks first (the
LPT rule) leaves only short blocks for the end; Graham (1969) showed it is never more than
``4/3 - 1/(3 * num_slots)`` times the best possible schedule, while an arbitrary order can take almost
twice as long. The bucket table (``gpt2enc_edu.buckets``) is sorted largest first for this reason.

Pure NumPy and ``heapq``; nothing here needs a GPU.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from ..buckets import BucketTable
from ..layout import WTE_BLOCK_SIZE
from ..validate import check_int

#: Streaming multiprocessors of an NVIDIA H200 (SXM): used for the "realistic" runs in notebook 03.
H200_SM_COUNT = 132
#: Threads one SM of a Hopper GPU keeps resident (2048), over the wte kernel's block size (256).
WTE_BLOCKS_PER_SM = 2048 // WTE_BLOCK_SIZE

#: Launch orders understood by ``launch_order``.
ORDERS = ("table", "random", "ascending")


@dataclass(frozen=True)
class Schedule:
    """Where and when each block ran, indexed by launch position (block 0 was launched first)."""

    costs: np.ndarray  #: run time of each block, in launch order (float64)
    slot: np.ndarray  #: the slot each block ran in (int64)
    start: np.ndarray  #: start time of each block (float64)
    num_slots: int
    order: np.ndarray  #: ``order[i]`` = index (into the costs given to ``simulate_order``) of block i

    @property
    def end(self) -> np.ndarray:
        """End time of each block."""
        return self.start + self.costs

    @property
    def makespan(self) -> float:
        """When the last block ends: the kernel's run time in this model (0 for no blocks)."""
        return float(self.end.max(initial=0.0))

    @property
    def total_work(self) -> float:
        """Sum of all block costs."""
        return float(self.costs.sum())

    @property
    def lower_bound(self) -> float:
        """No order can beat this: the work spread perfectly over the slots, or the longest block."""
        return max(self.total_work / self.num_slots, float(self.costs.max(initial=0.0)))

    @property
    def efficiency(self) -> float:
        """Fraction of slot time spent working, ``total_work / (num_slots * makespan)`` (1 when empty)."""
        if self.makespan == 0:
            return 1.0
        return self.total_work / (self.num_slots * self.makespan)


def _check_costs(costs) -> np.ndarray:
    costs = np.asarray(costs)
    if costs.ndim != 1:
        raise ValueError(f"costs must be a 1-D array, got shape {costs.shape}")
    if costs.dtype.kind not in "iuf":
        raise TypeError(f"costs must be numbers, not {costs.dtype}")
    costs = costs.astype(np.float64)
    if not np.isfinite(costs).all() or (costs < 0).any():
        raise ValueError("costs must be finite and >= 0")
    return costs


def block_costs(sizes, *, per_item: float = 1.0, per_block: float = 0.0, warps: int = 1) -> np.ndarray:
    """Run time of each bucket's block: ``per_block + per_item * ceil(size / warps)``.

    ``sizes`` is a ``BucketTable`` (its ``sizes``, in table order) or a 1-D array of bucket sizes; ``warps``
    is how many warps of the block share the bucket's items (``layout.WTE_WARPS`` = 8 for the wte kernel).
    """
    if isinstance(sizes, BucketTable):
        sizes = sizes.sizes
    sizes = _check_costs(sizes)
    warps = check_int("warps", warps, minimum=1)
    if not (np.isfinite(per_item) and np.isfinite(per_block)) or per_item < 0 or per_block < 0:
        raise ValueError(f"per_item and per_block must be finite and >= 0, got {per_item}, {per_block}")
    return per_block + per_item * np.ceil(sizes / warps)


def simulate(costs, num_slots: int) -> Schedule:
    """Run blocks of ``costs`` (in launch order) on ``num_slots`` slots: each goes to the slot free first."""
    costs = _check_costs(costs)
    num_slots = check_int("num_slots", num_slots, minimum=1)
    slot = np.empty(costs.size, dtype=np.int64)
    start = np.empty(costs.size, dtype=np.float64)
    free = [(0.0, s) for s in range(num_slots)]  # (time the slot frees, slot): a heap, already ordered
    for i, cost in enumerate(costs.tolist()):
        t, s = heapq.heappop(free)
        slot[i], start[i] = s, t
        heapq.heappush(free, (t + cost, s))
    return Schedule(costs=costs, slot=slot, start=start, num_slots=num_slots,
                    order=np.arange(costs.size, dtype=np.int64))


def launch_order(costs, order: str, *, seed=None) -> np.ndarray:
    """A permutation of ``range(len(costs))``: the order blocks are launched in.

    ``"table"`` keeps the given order (for a bucket table: largest first), ``"ascending"`` launches the
    smallest first (stable), ``"random"`` shuffles with ``numpy.random.default_rng(seed)`` (``seed`` is
    required then, so the picture is reproducible).
    """
    costs = _check_costs(costs)
    if order == "table":
        return np.arange(costs.size, dtype=np.int64)
    if order == "ascending":
        return np.argsort(costs, kind="stable").astype(np.int64)
    if order == "random":
        if seed is None:
            raise ValueError("order='random' needs a seed (any value numpy.random.default_rng accepts)")
        return np.random.default_rng(seed).permutation(costs.size).astype(np.int64)
    raise ValueError(f"order must be one of {ORDERS}, got {order!r}")


def simulate_order(costs, num_slots: int, order: str, *, seed=None) -> Schedule:
    """``simulate`` after reordering ``costs`` with ``launch_order``; ``Schedule.order`` records the permutation."""
    costs = _check_costs(costs)
    perm = launch_order(costs, order, seed=seed)
    result = simulate(costs[perm], num_slots)
    return Schedule(costs=result.costs, slot=result.slot, start=result.start, num_slots=result.num_slots,
                    order=perm)


def compare_orders(costs, num_slots: int, orders=ORDERS, *, seed=0) -> dict[str, Schedule]:
    """One ``Schedule`` per launch order, same blocks and slots: ``{order: schedule}``."""
    return {name: simulate_order(costs, num_slots, name, seed=seed) for name in orders}
