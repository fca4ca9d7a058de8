"""The encoder for PyTorch: an ``autograd.Function`` (``EncoderFunction``, called through ``encoder``) and an
``nn.Module`` (``GPT2Embedding``) that run the package's kernels on torch tensors.

    import torch
    from gpt2enc_edu.torch import GPT2Embedding

    emb = GPT2Embedding(50257, 1024, 768, dtype=torch.bfloat16, device="cuda")
    x = emb(ids)                    # (B, T, C) = wte[ids] + wpe[:T]
    x.float().square().sum().backward()   # emb.wte.grad, emb.wpe.grad

``import gpt2enc_edu`` never imports this module (nor torch); ``import gpt2enc_edu.torch`` needs torch.

What it does, and the decisions behind it:

* **Backends.** CUDA tensors run the CUDA kernels (through CuPy) on torch's current stream, with no copies:
  tensors are viewed as CuPy arrays through DLPack (bf16 as ``int16`` and reinterpreted, which works
  whatever CuPy's DLPack knows about bf16). CPU tensors run the NumPy mirror on zero-copy NumPy views
  (torch has no NumPy bf16: the ``int16`` view is reinterpreted as ``ml_dtypes.bfloat16``). Both give the
  same bits, as the package's functions do.
* **Token ids** may be ``int32`` or ``int64`` (PyTorch's default). ``int64`` ids are checked to lie in
  ``[0, V)`` first, so a huge id cannot wrap, then converted to ``int32`` (a copy of ``B*T`` ids). Any other
  dtype is refused with ``TypeError``. Non-contiguous ids are made contiguous.
* **Weights**: ``wte`` (V, C) and ``wpe`` (maxT, C), both bf16 or both fp32, contiguous, on the device of
  the ids; ``C`` a multiple of 8 (bf16) or 4 (fp32). Anything else is refused by the package's validation
  with its message, before anything runs.
* **Gradients** are returned from ``backward`` as fresh tensors (zeros, into which the kernel adds), and
  autograd accumulates them into ``.grad`` as it does for ``nn.Embedding``: hooks, ``torch.autograd.grad``,
  tied weights (the LM head sharing ``wte``), frozen weights and gradient accumulation behave as usual. So
  the bf16 stochastic rounding rounds this call's sums (as ``encoder_backward`` into zeroed gradients does);
  adding them to an existing ``.grad`` is PyTorch's own add.
* **Seeds.** Every backward draws a fresh stochastic-rounding seed in ``[0, 2**32)`` from ``generator``, a
  CPU ``torch.Generator`` (default: ``torch.default_generator``, so ``torch.manual_seed(s)`` makes a run
  reproducible). ``method`` is one of the package's (``"chunked"``, the fastest deterministic one, by
  default; ``"bucketed"``; ``"atomic"`` and ``"atomic_bf16"``, nondeterministic).
* **The bucket table is built in the forward** (``bucket_ahead=True``, the default), where the deterministic
  methods would build it on the GPU (CUDA tensors, ``bucketing`` ``"auto"`` or ``"gpu"``): the ids are known
  there, so the table (``make_buckets``) is built on a side stream that waits only for the ids, while the model's
  forward goes on; the backward waits for it and only sums. That takes the table off the backward's critical path
  (docs/performance.md, part 12). Same bits either way. The table (about 4 MB at B=64, T=1024) is held until the
  graph is freed. ``bucket_ahead=False`` builds it inside the backward, as ``encoder_backward`` does by itself.
  Not where the backward is one launch (``cuda.one_launch_backward``: the chunked method on at most 1024 ids):
  that kernel sorts the ids itself and reads no table (docs/performance.md, part 13), so a table would cost host
  time for a slower backward.
"""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import torch
from torch import nn

from .cuda import one_launch_backward
from .encoder import encoder_backward, encoder_forward, make_buckets
from .rounding import bfloat16
from .validate import DETERMINISTIC_METHODS, check_flag

__all__ = ["EncoderFunction", "GPT2Embedding", "as_array", "draw_seed", "encoder", "from_array", "on_torch_stream"]

_STORAGE = {torch.bfloat16: bfloat16, torch.float32: np.dtype(np.float32)}
_ID_DTYPES = (torch.int32, torch.int64)


def as_array(t: torch.Tensor):
    """A zero-copy view of ``t``: a CuPy array for a CUDA tensor, a NumPy array for a CPU tensor.

    bf16 travels as ``int16`` and is reinterpreted as ``ml_dtypes.bfloat16``. For CUDA tensors call this
    inside ``on_torch_stream(t.device)``, so the DLPack exchange needs no synchronisation.
    """
    t = t.detach()
    bf16 = t.dtype == torch.bfloat16
    if bf16:
        t = t.view(torch.int16)
    if t.is_cuda:
        import cupy

        array = cupy.from_dlpack(t)
    else:
        array = t.numpy()
    return array.view(bfloat16) if bf16 else array


#: NumPy dtypes of the torch dtypes the adapter views (bf16 travels as int16).
_NUMPY_OF = {torch.int16: np.int16, torch.int32: np.int32, torch.int64: np.int64, torch.float32: np.float32}


def _view(t: torch.Tensor):
    """``as_array(t)`` for the adapter's own calls, which run inside ``on_torch_stream``: for a contiguous CUDA tensor,
    a CuPy array over its memory built directly (the array holds ``t``, so the memory outlives it), without the
    DLPack exchange and its stream bookkeeping, which cost the adapter more host time than the rest of a call (an
    H200 run: about half a millisecond of a step's 2.2 ms at B=1; docs/performance.md, part 12). Other tensors
    take ``as_array``."""
    t = t.detach()
    bf16 = t.dtype == torch.bfloat16
    raw = t.view(torch.int16) if bf16 else t
    if not (raw.is_cuda and raw.is_contiguous() and raw.numel() and raw.dtype in _NUMPY_OF):
        return as_array(t)
    import cupy

    memory = cupy.cuda.UnownedMemory(raw.data_ptr(), raw.numel() * raw.element_size(), raw, raw.device.index)
    array = cupy.ndarray(tuple(raw.shape), _NUMPY_OF[raw.dtype], cupy.cuda.MemoryPointer(memory, 0))
    return array.view(bfloat16) if bf16 else array


def from_array(array) -> torch.Tensor:
    """A zero-copy torch tensor of a NumPy or CuPy array (the inverse of ``as_array``)."""
    bf16 = array.dtype == bfloat16
    if bf16:
        array = array.view(np.int16)
    t = torch.from_numpy(array) if isinstance(array, np.ndarray) else torch.from_dlpack(array)
    return t.view(torch.bfloat16) if bf16 else t


@contextlib.contextmanager
def on_torch_stream(device: torch.device):
    """For a CUDA ``device``: make it CuPy's current device and torch's current stream CuPy's current stream."""
    if device.type != "cuda":
        yield
        return
    import cupy

    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = torch.cuda.current_stream(index)
    with cupy.cuda.Device(index), _cupy_stream(cupy, stream, index):
        yield


def _cupy_stream(cupy, stream, index: int):
    """torch's ``stream`` as a CuPy ``ExternalStream`` (CuPy 14 calls it deprecated in favour of
    ``Stream.from_external``; the warning is silenced here, the older call is the one checked on the H200)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return cupy.cuda.ExternalStream(stream.cuda_stream, index)


def draw_seed(generator: torch.Generator | None = None) -> int:
    """A stochastic-rounding seed in ``[0, 2**32)`` from ``generator`` (default ``torch.default_generator``)."""
    generator = torch.default_generator if generator is None else generator
    return int(torch.randint(0, 2**32, (1,), generator=generator, device=generator.device).item())


def _ids_int32(inp: torch.Tensor, V: int, check_ids: bool) -> torch.Tensor:
    """``inp`` as contiguous int32 ids, range-checked on its own dtype first (int64 cannot wrap)."""
    if not isinstance(inp, torch.Tensor):
        raise TypeError(f"inp must be a torch.Tensor of token ids, not {type(inp).__name__}")
    if inp.dtype not in _ID_DTYPES:
        raise TypeError(f"inp must hold int32 or int64 token ids, not {inp.dtype}")
    if check_ids and inp.numel():
        lo, hi = (int(v) for v in torch.aminmax(inp))
        if lo < 0 or hi >= V:
            raise ValueError(f"inp holds token id {lo if lo < 0 else hi}, outside [0, V) = [0, {V})")
    return inp.to(torch.int32).contiguous()


def _check_tensors(inp: torch.Tensor, wte: torch.Tensor, wpe: torch.Tensor) -> None:
    for name, t in (("wte", wte), ("wpe", wpe)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
        if t.dtype not in _STORAGE:
            raise TypeError(f"{name} must be torch.bfloat16 or torch.float32, not {t.dtype}")
        if t.ndim != 2:
            raise ValueError(f"{name} must be 2-D (rows, C), got shape {tuple(t.shape)}")
        if t.device != inp.device:
            raise ValueError(f"{name} is on {t.device} but inp is on {inp.device}; put them on one device")


_side_streams: dict = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    """One side stream per CUDA device, on which forwards build their bucket tables."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _side_streams:
        _side_streams[index] = torch.cuda.Stream(device=index)
    return _side_streams[index]


def _bucket_ahead(ids: torch.Tensor, C: int, dtype: torch.dtype, V: int):
    """Start building the bucket table of ``ids`` on the device's side stream; returns (table, ready event, stream).

    The side stream first waits for the current stream (the ids are ready, and an earlier backward that read a
    table whose memory this one may reuse is done). ``record_stream`` tells torch's allocator that the side stream
    reads ``ids``, so their memory is not handed out again before that read is done.
    """
    main = torch.cuda.current_stream(ids.device)
    side = _side_stream(ids.device)
    side.wait_stream(main)
    with torch.cuda.stream(side), on_torch_stream(ids.device):
        table = make_buckets(_view(ids), C, _STORAGE[dtype], V=V, check_ids=False)  # ids checked in forward
    ids.record_stream(side)
    ready = torch.cuda.Event()
    ready.record(side)
    return table, ready, side


class EncoderFunction(torch.autograd.Function):
    """``out = wte[inp] + wpe[:T]`` with the package's kernels; see the module docstring for the rules.

    ``EncoderFunction.apply(inp, wte, wpe, method, bucketing, generator, check_ids, bucket_ahead)``;
    ``encoder(...)`` is the same with keyword defaults (and no table built under ``torch.no_grad()``).
    """

    @staticmethod
    def forward(ctx, inp, wte, wpe, method, bucketing, generator, check_ids, bucket_ahead=True):
        if not isinstance(inp, torch.Tensor):
            raise TypeError(f"inp must be a torch.Tensor of token ids, not {type(inp).__name__}")
        _check_tensors(inp, wte, wpe)
        bucket_ahead = check_flag("bucket_ahead", bucket_ahead)
        ids = _ids_int32(inp, int(wte.shape[0]), check_ids)
        shape = (*ids.shape, wte.shape[1])
        out = torch.empty(shape, dtype=wte.dtype, device=wte.device)
        with on_torch_stream(wte.device):
            encoder_forward(_view(ids), _view(wte), _view(wpe), out=_view(out), check_ids=False)
        ctx.save_for_backward(ids)
        ctx.method, ctx.bucketing, ctx.generator = method, bucketing, generator
        ctx.tables = (tuple(wte.shape), tuple(wpe.shape), wte.dtype)
        # The table, where the backward would build one on the GPU and a backward can run (a weight wants its
        # gradient). A method or bucketing that is not one of the package's builds none here: the backward refuses
        # it, nor the chunked method where its backward is one kernel with its own sort (at most 1024 ids). (Grad mode
        # is off inside forward: ``encoder`` passes bucket_ahead=False under torch.no_grad().)
        ctx.ahead = None
        if (bucket_ahead and wte.is_cuda and ids.numel() and method in DETERMINISTIC_METHODS
                and bucketing in ("auto", "gpu") and any(ctx.needs_input_grad[1:3])
                and not one_launch_backward(method, bucketing, ids.numel(), int(wte.shape[0]))):
            ctx.ahead = _bucket_ahead(ids, int(wte.shape[1]), wte.dtype, int(wte.shape[0]))
        return out

    @staticmethod
    def backward(ctx, dout):
        (ids,) = ctx.saved_tensors
        wte_shape, wpe_shape, dtype = ctx.tables
        if dout.dtype != dtype:
            dout = dout.to(dtype)
        dout = dout.contiguous()
        dwte = torch.zeros(wte_shape, dtype=dtype, device=dout.device)
        dwpe = torch.zeros(wpe_shape, dtype=dtype, device=dout.device)
        seed = draw_seed(ctx.generator)
        table, bucketing = None, ctx.bucketing
        if ctx.ahead is not None:
            table, ready, side = ctx.ahead
            torch.cuda.current_stream(dout.device).wait_event(ready)
            bucketing = "auto"  # the table is built: bucketing "gpu" said where to build it
        with on_torch_stream(dout.device):
            encoder_backward(_view(dwte), _view(dwpe), _view(dout), _view(ids), seed=seed,
                             method=ctx.method, bucketing=bucketing, buckets=table, check_ids=False)
        if ctx.ahead is not None:
            # The table's memory goes back to CuPy's pool of the side stream when the graph is freed; the side
            # stream's next use of it must come after this backward's kernels have read it.
            side.wait_stream(torch.cuda.current_stream(dout.device))
        wants_wte, wants_wpe = ctx.needs_input_grad[1:3]
        return None, dwte if wants_wte else None, dwpe if wants_wpe else None, None, None, None, None, None


def encoder(inp: torch.Tensor, wte: torch.Tensor, wpe: torch.Tensor, *, method: str = "chunked",
            bucketing: str = "auto", generator: torch.Generator | None = None,
            check_ids: bool = True, bucket_ahead: bool = True) -> torch.Tensor:
    """``wte[inp] + wpe[:T]`` as a differentiable torch op; ``inp`` (B, T) int32/int64 ids.

    ``method`` and ``bucketing`` are ``encoder_backward``'s; ``generator`` gives one seed per backward;
    ``check_ids=False`` skips the id range check (a reduction and a sync); ``bucket_ahead`` builds the bucket
    table in the forward, on a side stream (see the module docstring).
    """
    bucket_ahead = check_flag("bucket_ahead", bucket_ahead) and torch.is_grad_enabled()  # no graph, no backward
    return EncoderFunction.apply(inp, wte, wpe, method, bucketing, generator, check_ids, bucket_ahead)


class GPT2Embedding(nn.Module):
    """Token plus position embedding with parameters ``wte`` (V, C) and ``wpe`` (maxT, C), GPT-2 style.

    ``forward(ids)`` with (B, T) ids, ``T <= maxT``, returns (B, T, C) in the parameters' dtype. Parameters
    start as GPT-2's: normal with std 0.02 (wte) and 0.01 (wpe), drawn from ``torch``'s global generator.
    ``generator`` (a CPU ``torch.Generator``) gives the stochastic-rounding seeds; ``None`` uses torch's
    default one. ``check_ids`` checks every forward's ids against ``V``: one reduction and a host sync, which
    stops the CPU from queueing work ahead of the GPU; ``False`` skips it (bad ids then corrupt memory).
    ``bucket_ahead`` builds the bucket table in the forward, on a side stream (see the module docstring).
    """

    def __init__(self, vocab_size: int, max_positions: int, channels: int, *, dtype=torch.bfloat16,
                 device=None, method: str = "chunked", bucketing: str = "auto",
                 generator: torch.Generator | None = None, check_ids: bool = True, bucket_ahead: bool = True):
        super().__init__()
        if dtype not in _STORAGE:
            raise TypeError(f"dtype must be torch.bfloat16 or torch.float32, not {dtype}")
        self.wte = nn.Parameter(torch.empty(vocab_size, channels, dtype=dtype, device=device))
        self.wpe = nn.Parameter(torch.empty(max_positions, channels, dtype=dtype, device=device))
        self.method, self.bucketing, self.generator, self.check_ids = method, bucketing, generator, check_ids
        self.bucket_ahead = bucket_ahead
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.wte, std=0.02)
        nn.init.normal_(self.wpe, std=0.01)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return encoder(ids, self.wte, self.wpe, method=self.method, bucketing=self.bucketing,
                       generator=self.generator, check_ids=self.check_ids, bucket_ahead=self.bucket_ahead)

    def extra_repr(self) -> str:
        V, C = self.wte.shape
        return f"{V}, {self.wpe.shape[0]}, {C}, dtype={self.wte.dtype}, method={self.method!r}"

