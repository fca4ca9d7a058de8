"""The work of the PyTorch adapter's calls on torch tensors, for both ways of calling it (its operators and its eager
``autograd.Function``): the forward and the backward into fresh tensors, on the NumPy mirror for CPU tensors and on
the kernels for CUDA tensors, where the first call of a signature is recorded as a launch plan (``plans``) that every
later call of it replays (docs/torch.md says why that is sound and which calls are never replayed).

Imported only by ``gpt2enc_edu.torch``; needs torch.
"""

from __future__ import annotations

import torch

from . import loader, plans, validate
from .caches import BoundedCache
from .encoder import backward_validated, encoder_backward, encoder_forward, forward_validated, stream_held
from .token_ids import token_ids
from .torch_arrays import on_torch_stream
from .torch_arrays import view as _view

#: The address alignment every array of the kernels needs (128-bit loads and stores).
ALIGN = 16


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` if the kernels can read it in place (contiguous, 16-byte aligned), else a copy that they can."""
    if t.is_contiguous() and t.data_ptr() % ALIGN == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _ids_for_kernels(ids: torch.Tensor, check: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the int32 ids the kernels read, the ids ``token_ids`` reads to write them, or None where the kernels read
    ``ids`` themselves: int32, contiguous, aligned and not to be checked)."""
    if not check and ids.dtype == torch.int32 and ids.is_contiguous() and ids.data_ptr() % ALIGN == 0:
        return ids, None
    return torch.empty(ids.shape, dtype=torch.int32, device=ids.device), ids.contiguous()


def _write_ids32(ids32: torch.Tensor, source: torch.Tensor | None, V: int, check: bool) -> None:
    """Write ``_ids_for_kernels``'s int32 ids from their ``source``, checked against ``[0, V)`` with ``check``
    (``token_ids``: on the GPU in a kernel, no sync); nothing where the kernels read the ids themselves."""
    if source is not None:
        token_ids(_view(ids32), _view(source), V, check=check)


def _ids32(ids: torch.Tensor, V: int, check: bool) -> torch.Tensor:
    """``ids`` as contiguous, aligned int32 ids, checked with ``check`` (``_write_ids32``); ``ids`` themselves where
    they need neither a copy nor a check."""
    ids32, source = _ids_for_kernels(ids, check)
    _write_ids32(ids32, source, V, check)
    return ids32


#: The signatures (shapes, dtypes, options, device) of the eager CUDA calls validated so far, with their sizes
#: (``encoder.forward_validated``: why a call of a known signature is not validated again).
_signatures = BoundedCache("adapter signatures", 64)
#: The launch plans of the CUDA calls (``plans``) by signature, stream and launch method (``loader``'s): a call of a
#: known key replays its plan, with its own tensors' addresses and seed, and runs no other Python of the package.
_plans = BoundedCache("launch plans", 32)
#: torch's current stream of a device as a raw address, without making a ``torch.cuda.Stream`` (the private call
#: torch's own generated code uses; the public one where it is missing).
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda index: torch.cuda.current_stream(index).cuda_stream)


def _planned(key: tuple, tensors: dict, seed: int | None, work, *, hold_stream: bool) -> None:
    """Run a CUDA call of ``key`` (its second and third items: the device index and stream): replay its plan where
    there is one, else ``work()``, recorded into a plan of ``tensors`` (the call's own memory by name, in the same
    order at every call of the key) and ``seed``, unless the stream is being captured into a CUDA graph (what a
    capture makes is temporary). A replay during a capture pins the plan (``caches``). ``hold_stream``: the call
    reuses the stream's scratch, so a replay holds the stream as the package's calls do (``encoder.stream_held``)."""
    index, stream = key[1], key[2]
    if torch.cuda.current_device() != index:  # the plan's kernels are loaded in that device's context
        with torch.cuda.device(index):
            return _planned(key, tensors, seed, work, hold_stream=hold_stream)
    capturing = torch.cuda.is_current_stream_capturing()
    plan = _plans.find(key, capturing)
    if plan is None or plan.spent:
        if capturing:
            work()
            return None
        with plans.recording() as recorder:
            work()
        plan = recorder.plan(tensors, seed)
        if plan is not None:
            _plans.put(key, plan)
        return None
    addresses = tuple(t.data_ptr() for t in tensors.values())
    seed = 0 if seed is None else seed
    if not hold_stream:
        plan.replay(addresses, seed)
        return None
    with stream_held(index, stream):
        plan.replay(addresses, seed)
    return None


def forward(ids: torch.Tensor, wte: torch.Tensor, wpe: torch.Tensor, check_ids: bool):
    """The forward into a fresh tensor: (out, the int32 ids the kernels read, which the backward can take)."""
    wte, wpe = _aligned(wte), _aligned(wpe)
    out = torch.empty((*ids.shape, wte.shape[1]), dtype=wte.dtype, device=wte.device)
    if not out.is_cuda:
        # checked on the CPU whatever check_ids says: the NumPy path refuses an id out of range anyway, and an
        # unchecked int64 id would wrap into range when narrowed to int32, before that path could see it
        ids32 = _ids32(ids, int(wte.shape[0]), True)
        encoder_forward(_view(ids32), _view(wte), _view(wpe), out=_view(out), check_ids=False)
        return out, ids32
    ids32, source = _ids_for_kernels(ids, check_ids)
    tensors = {"out": out, "ids32": ids32, "wte": wte, "wpe": wpe} | ({} if source is None else {"ids": source})
    signature = (tuple(ids.shape), tuple(wte.shape), tuple(wpe.shape), wte.dtype, wpe.dtype)

    def work():
        # out is fresh, ids32 and the weights contiguous and aligned: the signature decides the rest.
        with on_torch_stream(wte.device):
            _write_ids32(ids32, source, int(wte.shape[0]), check_ids)
            arrays = _view(out), _view(ids32), _view(wte), _view(wpe)
            dims = _signatures.get(("forward", *signature, wte.device),
                                   lambda: validate.forward_args(*arrays[1:], arrays[0], False))
            forward_validated(dims, *arrays)

    index = wte.device.index
    key = ("forward", index, _raw_stream(index), loader.PROGRAMMATIC_LAUNCH, check_ids, ids.dtype, source is None,
           *signature)
    _planned(key, tensors, None, work, hold_stream=False)
    return out, ids32


def backward(dout: torch.Tensor, ids: torch.Tensor, V: int, maxT: int, method: str, bucketing: str,
             seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward into fresh gradients (dwte, dwpe), with the stochastic-rounding ``seed`` (checked by the caller)
    and ids checked by the forward."""
    C = dout.shape[-1]
    dwte = torch.zeros((V, C), dtype=dout.dtype, device=dout.device)
    dwpe = torch.zeros((maxT, C), dtype=dout.dtype, device=dout.device)
    dout = _aligned(dout)
    if not dout.is_cuda:
        encoder_backward(_view(dwte), _view(dwpe), _view(dout), _view(_ids32(ids, V, False)), seed=seed, method=method,
                         bucketing=bucketing, check_ids=False)  # the ids were checked by the forward
        return dwte, dwpe
    ids32, source = _ids_for_kernels(ids, False)
    tensors = {"dwte": dwte, "dwpe": dwpe, "dout": dout, "ids32": ids32} | ({} if source is None else {"ids": source})
    signature = (tuple(dout.shape), tuple(ids.shape), V, maxT, dout.dtype, method, bucketing)

    def work():
        # dwte and dwpe are fresh, dout and ids32 contiguous and aligned: the signature decides the rest.
        with on_torch_stream(dout.device):
            _write_ids32(ids32, source, V, False)
            arrays = _view(dwte), _view(dwpe), _view(dout), _view(ids32)
            dims = _signatures.get(("backward", *signature, dout.device),
                                   lambda: validate.backward_args(*arrays, seed, method, False, bucketing)[0])
            backward_validated(dims, *arrays, seed, method, bucketing)

    index = dout.device.index
    key = ("backward", index, _raw_stream(index), loader.PROGRAMMATIC_LAUNCH, ids.dtype, source is None, *signature)
    _planned(key, tensors, seed, work, hold_stream=True)
    return dwte, dwpe
