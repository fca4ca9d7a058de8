"""What the benchmark times: one named setup function per case, each returning the call to time.

At T=1024, C=768, V=50257, bf16, for every batch size B and token-id kind (``tokens.make_ids``: uniform, Zipf,
real GPT-2 text):

* ``ours``: the forward; the atomic backward (fp32 accumulation, and bf16 atomics); the deterministic backward
  with the bucket table built on the CPU (llm.c's route: ids to the host, NumPy, table back to the GPU, a host
  sync included) and built on the GPU, and the chunked deterministic backward (GPU bucketing) -- each end to
  end through the public API -- and both deterministic methods with the table built ahead (``make_buckets``
  before the timed call, ``encoder_backward(..., buckets=table)``: the backward of a training step whose table
  was built in the forward, as the PyTorch adapter does);
* ``piece``: the kernels those calls are made of, one at a time through the launchers of ``gpt2enc_edu.cuda``
  and ``buckets`` (no validation): the forward kernel, the wpe kernel, the GPU bucket table (whole, and as the
  chunked method builds it: no bucket rows), the bucketed and the chunked wte kernel with the table ready. They say
  where the time of a whole call goes;
* ``torch``, when ``import torch`` works and it sees the GPU: ``F.embedding`` + the position add, and the
  embedding backward (``embedding_dense_backward`` + the dwpe sum) with deterministic algorithms off and on;
* ``host``: building the bucket table alone (``make_buckets``, NumPy), with ``time.perf_counter``;
* ``step``, with PyTorch as for ``torch``: a training step of the encoder as the host sees it, forward and backward
  into fresh gradients, timed with ``time.perf_counter`` around a call that starts and ends with the GPU idle
  (``timer.time_synchronised_in_turn``: the steps of one workload are timed in turn, so that they compare):
  through ``gpt2enc_edu.torch.GPT2Embedding`` eagerly (``adapter_step``) and as a replay of a CUDA graph of it
  (``adapter_step_graph``), and through ``nn.Embedding`` + wpe with deterministic algorithms off and on
  (``torch_step``, ``torch_step_det``). Each eager step sets the deterministic-algorithms flag it is timed with
  as it starts (a call of about a microsecond in every eager step), since the others run in between.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .. import cuda
from ..buckets import build_bucket_table_gpu
from ..encoder import encoder_backward, encoder_forward, make_buckets
from ..methods import ATOMIC, ATOMIC_BF16, BUCKETED, CHUNKED, one_launch_backward
from ..rounding import bfloat16
from ..tokens import GPT2_VOCAB_SIZE, KINDS
from ..validate import check_ids_in_range

T_GPT2 = 1024  #: sequence length of GPT-2 (124M)
C_GPT2 = 768  #: channels of GPT-2 (124M)
ID_KINDS = KINDS  #: ("uniform", "zipf", "real")
FAMILIES = ("ours", "piece", "torch", "host", "step")
#: The families that need PyTorch with CUDA (left out of a run without it).
TORCH_FAMILIES = ("torch", "step")


@dataclass(frozen=True)
class Timed:
    """What a case's setup returns: the call to time, the CUDA stream it runs on, what to undo after."""

    fn: Callable[[], object]
    stream: object  #: a cupy.cuda.Stream (for PyTorch: torch's current stream seen from CuPy)
    teardown: Callable[[], object] | None = None


@dataclass(frozen=True)
class Case:
    """One timed thing. ``family``: one of ``FAMILIES``; ``op``: what the floor is computed for (``floor.ALL_OPS``)."""

    name: str
    label: str
    family: str
    op: str | None
    setup: Callable[["Workload"], Timed] | None
    host_sync: bool = False  #: the call waits for the GPU by design (its time is end to end)


@dataclass
class TorchSide:
    """PyTorch tensors sharing the benchmark's CuPy arrays (DLPack), for one configuration."""

    torch: object
    F: object
    stream: object
    wte: object
    wpe: object
    dout: object
    ids: object  #: int64 copy of the ids (the usual dtype of PyTorch indices)
    out: object


@dataclass
class Workload:
    """The arrays of one configuration (id kind, B) on the GPU; the cases read them."""

    kind: str
    B: int
    T: int
    C: int
    V: int
    inp_host: np.ndarray
    inp: object
    wte: object
    wpe: object
    dwte: object
    dwpe: object
    dout: object
    out: object
    stream: object
    distinct: int = 0  #: distinct ids in the batch (the wte rows touched), for the floor
    seeds: object = field(default_factory=lambda: itertools.count(1))
    torch_side: TorchSide | None = None

    def next_seed(self) -> int:
        """A fresh stochastic-rounding seed for every backward call, as in training."""
        return next(self.seeds) % 2**32

    def need_torch(self) -> TorchSide:
        if self.torch_side is None:
            raise RuntimeError("this case needs PyTorch with CUDA, which this run does not have")
        return self.torch_side

    def check_ids(self) -> None:
        """Check once that the ids lie in ``[0, V)`` (a sync), before timing a launcher that does not check."""
        check_ids_in_range(self.inp, self.V)


# ---------------------------------------------------------------------------------------------- whole calls
def case_forward(w: Workload) -> Timed:
    """``encoder_forward`` into a preallocated ``out`` (ids checked once here, not in the timed calls)."""
    encoder_forward(w.inp, w.wte, w.wpe, out=w.out, check_ids=True)
    return Timed(lambda: encoder_forward(w.inp, w.wte, w.wpe, out=w.out, check_ids=False), w.stream)


def _backward(w: Workload, **options) -> Timed:
    """``encoder_backward`` with ``options``; one validated call first (checks the ids, compiles)."""
    encoder_backward(w.dwte, w.dwpe, w.dout, w.inp, seed=w.next_seed(), check_ids=True, **options)

    def call():
        encoder_backward(w.dwte, w.dwpe, w.dout, w.inp, seed=w.next_seed(), check_ids=False, **options)

    return Timed(call, w.stream)


def case_atomic_fp32(w: Workload) -> Timed:
    """Atomic backward accumulating in fp32 copies of the gradients, rounded back to bf16 (nondeterministic)."""
    return _backward(w, method=ATOMIC.name)


def case_atomic_bf16(w: Workload) -> Timed:
    """Atomic backward with bf16 atomics on the gradients themselves (nondeterministic, lossy)."""
    return _backward(w, method=ATOMIC_BF16.name)


def case_bucketed_cpu(w: Workload) -> Timed:
    """Deterministic backward, bucket table built on the CPU: ids to the host, NumPy, table back (a sync)."""
    return _backward(w, method=BUCKETED.name, bucketing="cpu")


def case_bucketed_gpu(w: Workload) -> Timed:
    """Deterministic backward, bucket table built on the GPU (no host sync)."""
    return _backward(w, method=BUCKETED.name, bucketing="gpu")


def case_chunked_gpu(w: Workload) -> Timed:
    """Deterministic backward with the chunked wte kernel (one warp per 32-item chunk), GPU bucketing; at most 1024
    ids in one launch that builds no table (``chunked_call_builds_table``)."""
    return _backward(w, method=CHUNKED.name, bucketing="gpu")


def chunked_call_builds_table(B: int, T: int = T_GPT2) -> bool:
    """Whether ``chunked_gpu`` builds a bucket table at this shape: not for at most 1024 ids, which one kernel sums
    with its own sort of the ids (``cuda.encoder_backward_small``); so its pieces are then those of the table path."""
    return not one_launch_backward(CHUNKED.name, "gpu", B * T, GPT2_VOCAB_SIZE)


def _backward_table_ahead(w: Workload, method: str) -> Timed:
    """``encoder_backward(..., buckets=table)`` with the table built (and finished) before the timing starts."""
    with w.stream:
        table = make_buckets(w.inp, w.C, bfloat16, V=w.V)
    w.stream.synchronize()
    return _backward(w, method=method, buckets=table)  # its first, checked call also checks the table


def case_chunked_ahead(w: Workload) -> Timed:
    """The chunked deterministic backward with the table built ahead: the wpe kernel beside the wte kernels."""
    return _backward_table_ahead(w, CHUNKED.name)


def case_bucketed_ahead(w: Workload) -> Timed:
    """The bucketed deterministic backward with the table built ahead."""
    return _backward_table_ahead(w, BUCKETED.name)


# ---------------------------------------------------------------------------------------------- the pieces
def case_forward_kernel(w: Workload) -> Timed:
    """The forward kernel alone (``cuda.encoder_forward``: no validation, no allocation)."""
    w.check_ids()
    return Timed(lambda: cuda.encoder_forward(w.out, w.inp, w.wte, w.wpe, w.B, w.T, w.C), w.stream)


def case_wpe_kernel(w: Workload) -> Timed:
    """The wpe kernel alone (``cuda.encoder_backward_wpe``): dwpe += sum over b of dout, deterministic."""
    return Timed(lambda: cuda.encoder_backward_wpe(w.dwpe, w.dout, w.B, w.T, w.C, w.next_seed()), w.stream)


def case_gpu_buckets(w: Workload) -> Timed:
    """The GPU bucket table alone, by the route ``encoder_backward(bucketing="gpu")`` takes (``buckets.gpu``)."""
    w.check_ids()
    return Timed(lambda: build_bucket_table_gpu(w.inp, w.C, bfloat16, w.V), w.stream)


def case_gpu_buckets_units(w: Workload) -> Timed:
    """The GPU bucket table as the chunked method builds it (``bucket_rows=False``: units, bt_list and counters; the
    one-block route then skips the bucket rows, the scatter route writes only the big tokens')."""
    w.check_ids()
    return Timed(lambda: build_bucket_table_gpu(w.inp, w.C, bfloat16, w.V, bucket_rows=False), w.stream)


def _table_ready(w: Workload):
    """A GPU-built table of the workload's ids, finished before the timing starts."""
    w.check_ids()
    with w.stream:
        table = build_bucket_table_gpu(w.inp, w.C, bfloat16, w.V)
    w.stream.synchronize()
    return table


def case_wte_bucketed_kernel(w: Workload) -> Timed:
    """The bucketed wte kernel alone, table ready: llm.c's sums in llm.c's order, in the form the package picks
    (``cuda.bucketed_form``: a warp for each small bucket, a block for each big one)."""
    table = _table_ready(w)
    return Timed(lambda: cuda.encoder_backward_wte_bucketed(w.dwte, table, w.dout, w.C, w.next_seed()), w.stream)


def case_wte_chunked_kernel(w: Workload) -> Timed:
    """The chunked wte kernels alone (chunk kernel + combine kernel), table ready."""
    table = _table_ready(w)
    return Timed(lambda: cuda.encoder_backward_wte_chunked(w.dwte, table, w.dout, w.C, w.next_seed()), w.stream)


# ---------------------------------------------------------------------------------------------- PyTorch
def case_torch_forward(w: Workload) -> Timed:
    """PyTorch: ``F.embedding(ids, wte) + wpe[:T]``, written into a preallocated tensor."""
    t = w.need_torch()
    wpe_rows = t.wpe[: w.T]

    def call():
        t.torch.add(t.F.embedding(t.ids, t.wte), wpe_rows, out=t.out)

    return Timed(call, t.stream)


def _torch_backward(w: Workload, deterministic: bool) -> Timed:
    """PyTorch's embedding backward (a fresh dwte, as autograd computes it) and the dwpe sum over the batch."""
    t = w.need_torch()
    torch = t.torch
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(deterministic)
    embedding_backward = torch.ops.aten.embedding_dense_backward

    def call():
        embedding_backward(t.dout, t.ids, w.V, -1, False)
        t.dout.sum(0)

    def restore():
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])

    return Timed(call, t.stream, teardown=restore)


def case_torch_backward(w: Workload) -> Timed:
    """PyTorch embedding backward + dwpe sum, ``torch.use_deterministic_algorithms(False)``."""
    return _torch_backward(w, deterministic=False)


def case_torch_backward_det(w: Workload) -> Timed:
    """PyTorch embedding backward + dwpe sum, ``torch.use_deterministic_algorithms(True)``."""
    return _torch_backward(w, deterministic=True)


# ---------------------------------------------------------------------------------------------- training steps
def _step(w: Workload, forward=None, deterministic: bool = False):
    """(one step: fresh gradients, forward, backward; the leaves; a teardown): through ``forward(ids, wte, wpe)``,
    or ``GPT2Embedding`` where None, with leaf parameters over the run's weights (no copy)."""
    t = w.need_torch()
    torch, nn = t.torch, t.torch.nn
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(deterministic)
    wte, wpe = nn.Parameter(t.wte), nn.Parameter(t.wpe)
    if forward is None:
        from ..torch import GPT2Embedding  # imports torch: only for these cases

        module = GPT2Embedding(w.V, w.T, w.C, dtype=torch.bfloat16, device=t.wte.device)
        module.wte, module.wpe = wte, wpe
        forward = lambda ids, wte, wpe: module(ids)  # noqa: E731

    def call():
        torch.use_deterministic_algorithms(deterministic)  # the other steps of the workload run in between
        wte.grad = wpe.grad = None
        forward(t.ids, wte, wpe).backward(t.dout)

    return call, (wte, wpe), lambda: torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def case_adapter_step(w: Workload) -> Timed:
    """``GPT2Embedding`` forward + backward on int64 ids, its default options (the ids checked on the device)."""
    call, _, restore = _step(w)
    return Timed(call, w.need_torch().stream, teardown=restore)


def case_adapter_step_graph(w: Workload) -> Timed:
    """The same step captured once in a CUDA graph (``torch.cuda.graph``, warm-up on a side stream) and replayed."""
    torch = w.need_torch().torch
    call, leaves, restore = _step(w)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call(), call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return Timed(graph.replay, w.need_torch().stream, teardown=lambda: (graph.reset(), restore()))


def case_torch_step(w: Workload, deterministic: bool = False) -> Timed:
    """``F.embedding`` (``nn.Embedding``'s function) + wpe, forward + backward, deterministic algorithms off."""
    t = w.need_torch()
    call, _, restore = _step(w, lambda ids, wte, wpe: t.F.embedding(ids, wte) + wpe[: w.T], deterministic)
    return Timed(call, t.stream, teardown=restore)


def case_torch_step_det(w: Workload) -> Timed:
    """The same with ``torch.use_deterministic_algorithms(True)``."""
    return case_torch_step(w, deterministic=True)


#: Everything the benchmark times, in report order.
CASES = (
    Case("forward", "forward", "ours", "forward", case_forward),
    Case("atomic_fp32", "backward, atomic (fp32 accumulation)", "ours", "backward", case_atomic_fp32),
    Case("atomic_bf16", "backward, atomic (bf16 atomics)", "ours", "backward", case_atomic_bf16),
    Case("bucketed_cpu", "backward, deterministic, CPU bucketing", "ours", "backward", case_bucketed_cpu,
         host_sync=True),
    Case("bucketed_gpu", "backward, deterministic, GPU bucketing", "ours", "backward", case_bucketed_gpu),
    Case("chunked_gpu", "backward, deterministic chunked, GPU bucketing", "ours", "backward", case_chunked_gpu),
    Case("chunked_ahead", "backward, deterministic chunked, table built ahead", "ours", "backward",
         case_chunked_ahead),
    Case("bucketed_ahead", "backward, deterministic, table built ahead", "ours", "backward", case_bucketed_ahead),
    Case("torch_forward", "PyTorch F.embedding + wpe", "torch", "forward", case_torch_forward),
    Case("torch_backward", "PyTorch embedding backward + dwpe sum", "torch", "backward", case_torch_backward),
    Case("torch_backward_det", "PyTorch embedding backward + dwpe sum, deterministic", "torch", "backward",
         case_torch_backward_det),
    Case("adapter_step", "step: GPT2Embedding forward + backward (host-timed)", "step", None, case_adapter_step),
    Case("adapter_step_graph", "step: GPT2Embedding as a CUDA-graph replay (host-timed)", "step", None,
         case_adapter_step_graph),
    Case("torch_step", "step: nn.Embedding + wpe forward + backward (host-timed)", "step", None, case_torch_step),
    Case("torch_step_det", "step: nn.Embedding + wpe, deterministic (host-timed)", "step", None,
         case_torch_step_det),
    Case("make_buckets", "make_buckets alone (NumPy, host)", "host", None, None),
    Case("forward_kernel", "forward kernel alone", "piece", "forward", case_forward_kernel),
    Case("wpe_kernel", "wpe kernel alone", "piece", "backward_wpe", case_wpe_kernel),
    Case("gpu_buckets", "GPU bucket table alone", "piece", None, case_gpu_buckets),
    Case("gpu_buckets_units", "GPU bucket table alone, chunked method's (no bucket rows)", "piece", None,
         case_gpu_buckets_units),
    Case("wte_bucketed_kernel", "wte kernel alone, bucketed (table ready)", "piece", "backward_wte",
         case_wte_bucketed_kernel),
    Case("wte_chunked_kernel", "wte kernel alone, chunked (table ready)", "piece", "backward_wte",
         case_wte_chunked_kernel),
)
CASE_NAMES = tuple(c.name for c in CASES)
CASES_BY_NAME = {c.name: c for c in CASES}
#: Pieces that runs from before they existed did not time, and the piece that stands in for each (reports and
#: plots of committed older results still add up).
PIECE_FALLBACK = {"gpu_buckets_units": "gpu_buckets"}


def piece_value(by_key: dict, piece: str, kind: str, B: int):
    """``by_key[(piece, kind, B)]`` (a row, or any value a report keys that way), or that of the piece standing in
    for ``piece`` (``PIECE_FALLBACK``) where the run did not time it; None where neither was timed."""
    value = by_key.get((piece, kind, B))
    if value is None and piece in PIECE_FALLBACK:
        value = by_key.get((PIECE_FALLBACK[piece], kind, B))
    return value
