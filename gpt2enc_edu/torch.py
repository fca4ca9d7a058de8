"""The encoder for PyTorch: two custom operators (``torch.ops.gpt2enc_edu.encoder_forward`` and ``.encoder_backward``)
with autograd, a function (``encoder``) and an ``nn.Module`` (``GPT2Embedding``) that run the package's kernels on
torch tensors.

    import torch
    from gpt2enc_edu.torch import GPT2Embedding

    emb = GPT2Embedding(50257, 1024, 768, dtype=torch.bfloat16, device="cuda")
    ids = torch.randint(0, 50257, (8, 1024), device="cuda")
    x = emb(ids)                    # (B, T, C) = wte[ids] + wpe[:T]
    x.float().square().sum().backward()   # emb.wte.grad, emb.wpe.grad

``import gpt2enc_edu`` never imports this module (nor torch); ``import gpt2enc_edu.torch`` needs torch 2.4 or newer.
docs/torch.md says what the adapter promises and what bounds it. The parts of this file:

* the two operators, registered with ``torch.library.custom_op`` with fake implementations and autograd, which
  ``torch.compile(fullgraph=True)`` traces and CUDA graphs capture;
* ``_Eager``, an ``autograd.Function`` that does the operators' work for eager calls without their Python dispatch;
* the generators: an operator's schema has no ``torch.Generator``, so it passes an int key, resolved when the
  backward draws its seed (``draw_seed``);
* ``encoder`` and ``GPT2Embedding``, the public calls, which check their tensors and options before anything runs.

The work itself (the id check, the launches, the launch plans) is in ``gpt2enc_edu.torch_calls``; the views of
tensors as arrays and the stream in ``gpt2enc_edu.torch_arrays``.
"""

from __future__ import annotations

import itertools
import weakref

import numpy as np
import torch

if not hasattr(torch.library, "custom_op"):  # custom_op, register_fake and register_autograd came in 2.4
    raise ImportError(f"gpt2enc_edu.torch needs PyTorch 2.4 or newer (torch.library.custom_op); this is torch "
                      f"{torch.__version__}")

from torch import nn  # noqa: E402  (after the version check: an older torch fails above with a clear message)
from torch._prims_common import alert_not_deterministic
from torch.autograd.function import once_differentiable

from . import torch_calls as calls
from . import validate
from .checks import check_choice, check_int
from .layout import pack_size
from .methods import BUCKETINGS, DEFAULT_METHOD, METHODS
from .rounding import bfloat16
from .torch_arrays import as_array, from_array, on_torch_stream

__all__ = ["GPT2Embedding", "as_array", "draw_seed", "encoder", "from_array", "on_torch_stream"]

_STORAGE = {torch.bfloat16: bfloat16, torch.float32: np.dtype(np.float32)}
_ID_DTYPES = (torch.int32, torch.int64)
_METHOD_NAMES = tuple(METHODS)


def draw_seed(generator: torch.Generator | None = None) -> int:
    """A stochastic-rounding seed in ``[0, 2**32)`` from ``generator`` (default ``torch.default_generator``)."""
    generator = torch.default_generator if generator is None else generator
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, not {type(generator).__name__}")
    return int(torch.randint(0, 2**32, (1,), generator=generator, device=generator.device).item())


# ------------------------------------------------------------------------------------------------ generators
# The operators take a generator as an int key (an operator's schema has no Generator), resolved when the backward
# runs. Key 0 is torch's default generator. Any other key names a _Held box: torch.Generator takes weak references
# only from torch 2.12 on, so the table refers weakly to a box around the generator, and whoever needs the generator
# later holds the box (a GPT2Embedding for its life, the autograd graph of an encoder() call until its backward).
class _Held:
    __slots__ = ("generator", "key", "__weakref__")


_held: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_next_key = itertools.count(1)


def _hold(generator) -> _Held | None:
    """A box for ``generator`` under a fresh key (None for torch's default one); TypeError for anything but a CPU
    ``torch.Generator``."""
    if generator is None:
        return None
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, not {type(generator).__name__}")
    if generator.device.type != "cpu":
        raise ValueError(f"generator must be a CPU torch.Generator (the seed is a launch argument), not one on "
                         f"{generator.device}")
    held = _Held()
    held.generator, held.key = generator, next(_next_key)
    _held[held.key] = held
    return held


def _generator(key: int) -> torch.Generator:
    if key == 0:
        return torch.default_generator
    held = _held.get(key)
    if held is None:
        raise RuntimeError(f"the generator of key {key} no longer exists; keep the generator alive while its "
                           "module or graph is used")
    return held.generator


# ------------------------------------------------------------------------------------------------ the operators
def _backward_work(dout, ids, V: int, maxT: int, method: str, bucketing: str, seed, generator: int):
    """The backward's work, for both ways of calling it: (dwte, dwpe), fresh, with a seed drawn from the generator of
    key ``generator`` where ``seed`` is None."""
    if method in METHODS and not METHODS[method].deterministic:
        alert_not_deterministic(f"gpt2enc_edu::encoder_backward with method={method!r}")
    seed = draw_seed(_generator(generator)) if seed is None else validate.check_seed(seed)
    return calls.backward(dout, ids, V, maxT, method, bucketing, seed)


@torch.library.custom_op("gpt2enc_edu::encoder_forward", mutates_args=())
def _forward_op(ids: torch.Tensor, wte: torch.Tensor, wpe: torch.Tensor, check_ids: bool, method: str,
                bucketing: str, generator: int) -> torch.Tensor:
    """``wte[ids] + wpe[:T]`` (B, T, C). ``method``, ``bucketing`` and ``generator`` (a key) are the backward's."""
    return calls.forward(ids, wte, wpe, check_ids)[0]


@_forward_op.register_fake
def _(ids, wte, wpe, check_ids, method, bucketing, generator):
    return wte.new_empty((*ids.shape, wte.shape[1]))


@torch.library.custom_op("gpt2enc_edu::encoder_backward", mutates_args=())
def _backward_op(dout: torch.Tensor, ids: torch.Tensor, V: int, maxT: int, method: str, bucketing: str,
                 seed: int | None, generator: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(dwte (V, C), dwpe (maxT, C)): fresh gradients of ``wte[ids] + wpe[:T]`` for ``dout`` (B, T, C). ``seed``:
    the stochastic-rounding seed, or None to draw one from the generator of key ``generator``."""
    return _backward_work(dout, ids, V, maxT, method, bucketing, seed, generator)


@_backward_op.register_fake
def _(dout, ids, V, maxT, method, bucketing, seed, generator):
    C = dout.shape[-1]
    return dout.new_empty((V, C)), dout.new_empty((maxT, C))


def _setup_context(ctx, inputs, output, ids=None):
    """What the backward needs: the ids (``ids``: the int32 ids of the forward, where it has them), the shapes, the
    options, and the generator, held by the graph until its backward (``encoder(generator=...)``)."""
    ids_in, wte, wpe, _, method, bucketing, generator = inputs
    ctx.save_for_backward(ids_in if ids is None else ids)
    ctx.rows, ctx.dtype, ctx.options = (wte.shape[0], wpe.shape[0]), wte.dtype, (method, bucketing, generator)
    ctx.generator = _held.get(generator)  # the box, alive until the backward


def _gradients(ctx, dout, backward):
    """The forward's input gradients from ``backward`` (the operator or its work), for the inputs that want one."""
    wants_wte, wants_wpe = ctx.needs_input_grad[1:3]
    if not (wants_wte or wants_wpe):
        return None, None, None, None, None, None, None
    (ids,) = ctx.saved_tensors
    method, bucketing, generator = ctx.options
    dwte, dwpe = backward(dout.to(ctx.dtype), ids, *ctx.rows, method, bucketing, None, generator)
    return None, dwte if wants_wte else None, dwpe if wants_wpe else None, None, None, None, None


@once_differentiable
def _backward(ctx, dout):
    return _gradients(ctx, dout, _backward_op)


_forward_op.register_autograd(_backward, setup_context=_setup_context)


class _Eager(torch.autograd.Function):
    """The operators' work without their dispatch, for eager calls (``torch.compile`` traces the operators instead):
    the Python dispatch of a ``custom_op`` and its autograd costs more host time per step than the rest of a small
    call. The same functions do the work, so the bits are the operators'; the forward's int32 ids are kept for the
    backward, which then needs no copy of int64 ids."""

    @staticmethod
    def forward(ctx, ids, wte, wpe, check_ids, method, bucketing, generator):
        out, ids32 = calls.forward(ids, wte, wpe, check_ids)
        _setup_context(ctx, (ids, wte, wpe, check_ids, method, bucketing, generator), out, ids=ids32)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        return _gradients(ctx, dout, _backward_work)


# ------------------------------------------------------------------------------------------------ the public calls
def _check_tensors(inp, wte, wpe) -> None:
    if not isinstance(inp, torch.Tensor):
        raise TypeError(f"inp must be a torch.Tensor of token ids, not {type(inp).__name__}")
    if inp.dtype not in _ID_DTYPES:
        raise TypeError(f"inp must hold int32 or int64 token ids, not {inp.dtype}")
    for name, t in (("wte", wte), ("wpe", wpe)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
        if t.layout != torch.strided:
            raise TypeError(f"{name} must be a dense tensor, not {t.layout} (a sparse one: .to_dense())")
        if t.dtype not in _STORAGE:
            raise TypeError(f"{name} must be torch.bfloat16 or torch.float32, not {t.dtype}")
        if t.ndim != 2:
            raise ValueError(f"{name} must be 2-D (rows, C), got shape {tuple(t.shape)}")
        if t.device != inp.device:
            raise ValueError(f"{name} is on {t.device} but inp is on {inp.device}; put them on one device")


def _check_options(method, bucketing, check_ids) -> tuple[str, str, bool]:
    """(method, bucketing, check_ids), checked: TypeError for the wrong type, ValueError for an unknown name."""
    return (check_choice("method", method, _METHOD_NAMES), check_choice("bucketing", bucketing, BUCKETINGS),
            validate.check_flag("check_ids", check_ids))


def _encoder(inp, wte, wpe, method: str, bucketing: str, generator: int, check_ids) -> torch.Tensor:
    _check_tensors(inp, wte, wpe)
    method, bucketing, check_ids = _check_options(method, bucketing, check_ids)
    if bucketing == "gpu" and not inp.is_cuda:  # refused here, not first in the backward
        raise ValueError(f"bucketing='gpu' builds the table on the GPU and needs CUDA tensors; these are on "
                         f"{inp.device} (bucketing='auto' builds it where the tensors are)")
    if torch.compiler.is_compiling():
        return _forward_op(inp, wte, wpe, check_ids, method, bucketing, generator)
    return _Eager.apply(inp, wte, wpe, check_ids, method, bucketing, generator)


def encoder(inp: torch.Tensor, wte: torch.Tensor, wpe: torch.Tensor, *, method: str = DEFAULT_METHOD,
            bucketing: str = "auto", generator: torch.Generator | None = None,
            check_ids: bool = True) -> torch.Tensor:
    """``wte[inp] + wpe[:T]`` as a differentiable torch op; ``inp`` (B, T) int32/int64 ids.

    ``method`` and ``bucketing`` are ``encoder_backward``'s; ``generator`` (a CPU ``torch.Generator``, None for
    torch's default one) gives one seed per backward; ``check_ids`` (a bool) checks the ids against ``[0, V)`` (on
    the GPU in a kernel, with no host sync; docs/torch.md, "Token ids", says what a bad id then does).
    """
    if generator is not None and torch.compiler.is_compiling():
        raise RuntimeError("encoder(generator=...) cannot be traced by torch.compile (the generator is looked up in a "
                           "weak table); give the generator to GPT2Embedding, which takes it at construction, or "
                           "leave it None for torch's default generator")
    held = _hold(generator)  # alive through the call: the forward's context takes it
    return _encoder(inp, wte, wpe, method, bucketing, 0 if held is None else held.key, check_ids)


class GPT2Embedding(nn.Module):
    """Token plus position embedding with parameters ``wte`` (V, C) and ``wpe`` (maxT, C), GPT-2 style.

    ``forward(ids)`` with (B, T) ids, ``T <= maxT``, returns (B, T, C) in the parameters' dtype. Parameters
    start as GPT-2's: normal with std 0.02 (wte) and 0.01 (wpe), drawn from ``torch``'s global generator.
    ``generator`` (a CPU ``torch.Generator``, checked here) gives the stochastic-rounding seeds; ``None`` uses
    torch's default one. ``check_ids`` (a bool) checks every forward's ids against ``V``, on the GPU without a host
    sync (docs/torch.md, "Token ids"). ``method`` and ``bucketing`` are ``encoder_backward``'s. Sizes and options
    are checked here (``TypeError`` for the wrong type, ``ValueError`` for a wrong value: sizes below 1, ``channels``
    not a multiple of the 16-byte pack).
    """

    def __init__(self, vocab_size: int, max_positions: int, channels: int, *, dtype=torch.bfloat16,
                 device=None, method: str = DEFAULT_METHOD, bucketing: str = "auto",
                 generator: torch.Generator | None = None, check_ids: bool = True):
        super().__init__()
        if not isinstance(dtype, torch.dtype) or dtype not in _STORAGE:
            raise TypeError(f"dtype must be torch.bfloat16 or torch.float32, not {dtype!r}")
        vocab_size, max_positions = check_int("vocab_size", vocab_size, minimum=1), check_int(
            "max_positions", max_positions, minimum=1)
        channels = check_int("channels", channels, minimum=1)
        if channels % pack_size(_STORAGE[dtype]):
            raise ValueError(f"channels must be a multiple of {pack_size(_STORAGE[dtype])} for {dtype} (the kernels "
                             f"move 16-byte packs), got {channels}")
        method, bucketing, check_ids = _check_options(method, bucketing, check_ids)
        self.generator = generator
        self.wte = nn.Parameter(torch.empty(vocab_size, channels, dtype=dtype, device=device))
        self.wpe = nn.Parameter(torch.empty(max_positions, channels, dtype=dtype, device=device))
        self.method, self.bucketing, self.check_ids = method, bucketing, check_ids
        self.reset_parameters()

    @property
    def generator(self) -> torch.Generator | None:
        """The generator of the stochastic-rounding seeds (None: torch's default one); checked when set."""
        return self._generator

    @generator.setter
    def generator(self, generator) -> None:
        self._held = _hold(generator)
        self._generator_key = 0 if self._held is None else self._held.key
        self._generator = generator

    def __getstate__(self) -> dict:
        # a copy (deepcopy, pickle) registers its own generator under a fresh key when restored: the key and the
        # box belong to this process's table and to this module's generator, not to the copy's
        return {k: v for k, v in self.__dict__.items() if k not in ("_held", "_generator_key")}

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self.generator = state.get("_generator")

    def reset_parameters(self) -> None:
        nn.init.normal_(self.wte, std=0.02)
        nn.init.normal_(self.wpe, std=0.01)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return _encoder(ids, self.wte, self.wpe, self.method, self.bucketing, self._generator_key, self.check_ids)

    def extra_repr(self) -> str:
        V, C = self.wte.shape
        return f"{V}, {self.wpe.shape[0]}, {C}, dtype={self.wte.dtype}, method={self.method!r}"
