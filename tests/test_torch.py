"""The PyTorch adapter (``gpt2enc_edu.torch``) against the package's own calls and against ``F.embedding``.

CPU tests need torch (skipped cleanly without it); tests marked ``gpu`` need CuPy, a GPU and a CUDA torch.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import gpt2enc_edu as enc
from gpt2enc_edu import compare, methods
from gpt2enc_edu.problems import random_problem
from gpt2enc_edu.rounding import bfloat16

DTYPES = [pytest.param(bfloat16, id="bf16"), pytest.param(np.float32, id="fp32")]
DETERMINISTIC = list(methods.deterministic_methods())


def test_import_gpt2enc_edu_does_not_import_torch():
    code = "import sys, gpt2enc_edu; gpt2enc_edu.encoder_forward; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def _xp(device):
    if device.type == "cuda":
        import cupy

        return cupy
    return np


def _tensors(tt, p, device):
    """(ids, wte, wpe, dout) of problem ``p`` as torch tensors on ``device``; weights require grad."""
    g = p.on(_xp(device))
    ids = tt.from_array(g.inp).clone()
    wte = tt.from_array(g.wte).clone().requires_grad_(True)
    wpe = tt.from_array(g.wpe).clone().requires_grad_(True)
    return ids, wte, wpe, tt.from_array(g.dout).clone()


@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_is_encoder_forward(tt, device, rng, dtype):
    p = random_problem(3, 40, 64, 500, maxT=48, dtype=dtype, ids="zipf", rng=rng)
    ids, wte, wpe, _ = _tensors(tt, p, device)
    out = tt.encoder(ids, wte, wpe)
    assert out.shape == (3, 40, 64) and out.device.type == device.type and out.requires_grad
    assert compare.bitwise_equal(tt.as_array(out), enc.encoder_forward(p.inp, p.wte, p.wpe))


@pytest.mark.parametrize("method", DETERMINISTIC)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_is_encoder_backward_with_the_drawn_seed(tt, device, rng, dtype, method):
    import torch

    # 1200 ids: the chunked method's backward reads a table (at most 1024 ids it is one kernel with its own sort)
    p = random_problem(4, 300, 264 if dtype == bfloat16 else 132, 300, maxT=310, dtype=dtype, ids="zipf", rng=rng)
    ids, wte, wpe, dout = _tensors(tt, p, device)
    seed = int(rng.integers(2**31))
    out = tt.encoder(ids, wte, wpe, method=method, generator=torch.Generator().manual_seed(seed))
    out.backward(dout)
    expected = p.on(_xp(device))
    expected.dwte[...] = 0
    expected.dwpe[...] = 0
    drawn = tt.draw_seed(torch.Generator().manual_seed(seed))
    enc.encoder_backward(expected.dwte, expected.dwpe, expected.dout, expected.inp, seed=drawn, method=method)
    assert compare.bitwise_equal(tt.as_array(wte.grad), expected.dwte)
    assert compare.bitwise_equal(tt.as_array(wpe.grad), expected.dwpe)
    # and the same bits as the NumPy mirror, whichever device ran
    mirror = p.on(np)
    mirror.dwte[...] = 0
    mirror.dwpe[...] = 0
    enc.encoder_backward(mirror.dwte, mirror.dwpe, mirror.dout, mirror.inp, seed=drawn, method=method)
    assert compare.bitwise_equal(tt.as_array(wte.grad), mirror.dwte)


@pytest.mark.parametrize("method", ["chunked", "bucketed", "atomic"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_within_bound_of_torch_embedding(tt, device, rng, dtype, method):
    import torch
    import torch.nn.functional as F

    p = random_problem(4, 64, 64, 50, maxT=64, dtype=dtype, ids="zipf", rng=rng)
    ids, wte, wpe, dout = _tensors(tt, p, device)
    tt.encoder(ids, wte, wpe, method=method).backward(dout)
    wte64 = wte.detach().double().requires_grad_(True)
    wpe64 = wpe.detach().double().requires_grad_(True)
    out64 = F.embedding(ids.long(), wte64) + wpe64[: ids.shape[1]]
    out64.backward(dout.double())
    ref = enc.reference.backward(np.zeros_like(p.dwte), np.zeros_like(p.dwpe), p.dout, p.inp)
    for ours, theirs, magnitude in ((wte.grad, wte64.grad, ref.dwte_abs), (wpe.grad, wpe64.grad, ref.dwpe_abs)):
        bound = compare.error_bound(dtype, magnitude, ref.max_terms)
        error = np.abs(ours.double().cpu().numpy() - theirs.cpu().numpy())
        assert (error <= bound).all(), f"max excess {(error - bound).max()}"
    assert not torch.equal(wte.grad, torch.zeros_like(wte.grad))


def test_gradients_accumulate_like_pytorch(tt, device, rng):
    """Two backwards add into ``.grad`` (autograd's add); a tied head's gradient adds to the encoder's."""
    import torch

    p = random_problem(2, 16, 32, 20, maxT=16, dtype=np.float32, rng=rng)
    ids, wte, wpe, dout = _tensors(tt, p, device)
    gen = torch.Generator().manual_seed(7)
    tt.encoder(ids, wte, wpe, generator=gen).backward(dout)
    first = wte.grad.clone()
    tt.encoder(ids, wte, wpe, generator=gen).backward(2 * dout)
    assert torch.equal(wte.grad, first + 2 * first)  # fp32: the deterministic sums scale exactly by 2
    wte.grad = None
    x = tt.encoder(ids, wte, wpe)
    logits = x @ wte.t()  # a tied LM head: wte receives two gradients
    logits.sum().backward()
    wte_ref = wte.detach().clone().requires_grad_(True)
    ((wte_ref[ids.long()] + wpe.detach()[:16]) @ wte_ref.t()).sum().backward()
    torch.testing.assert_close(wte.grad, wte_ref.grad, rtol=1e-5, atol=1e-5)


def test_seeded_runs_are_bitwise_reproducible(tt, device, rng):
    import torch

    p = random_problem(4, 64, 64, 100, maxT=64, dtype=bfloat16, ids="zipf", rng=rng)
    grads = []
    for _ in range(2):
        ids, wte, wpe, dout = _tensors(tt, p, device)
        gen = torch.Generator().manual_seed(1234)
        for _ in range(3):  # three steps: three fresh seeds from the generator, the same three each run
            tt.encoder(ids, wte, wpe, generator=gen).backward(dout)
        grads.append((wte.grad, wpe.grad))
    assert torch.equal(grads[0][0].view(torch.int16), grads[1][0].view(torch.int16))
    assert torch.equal(grads[0][1].view(torch.int16), grads[1][1].view(torch.int16))


def test_module(tt, device):
    import torch

    torch.manual_seed(0)
    emb = tt.GPT2Embedding(100, 32, 64, dtype=torch.bfloat16, device=device,
                           generator=torch.Generator().manual_seed(1))
    assert {n for n, _ in emb.named_parameters()} == {"wte", "wpe"}
    ids = torch.randint(0, 100, (2, 20), device=device)  # int64, PyTorch's default: converted
    out = emb(ids)
    assert out.shape == (2, 20, 64) and out.dtype == torch.bfloat16
    expected = enc.encoder_forward(tt.as_array(ids.to(torch.int32)), tt.as_array(emb.wte), tt.as_array(emb.wpe))
    assert compare.bitwise_equal(tt.as_array(out), expected)
    out.float().square().sum().backward()
    assert emb.wte.grad.shape == (100, 64) and emb.wpe.grad[20:].abs().sum() == 0
    assert "method='chunked'" in repr(emb)


def test_int64_ids_are_range_checked_before_conversion(tt):
    import torch

    wte, wpe = torch.zeros(10, 8), torch.zeros(4, 8)
    for bad in (2**32 + 3, -1, 10):
        with pytest.raises(ValueError, match=f"token id {bad}"):
            tt.encoder(torch.tensor([[1, bad]]), wte, wpe)
    same = tt.encoder(torch.tensor([[1, 9]], dtype=torch.int64), wte + 1, wpe)
    assert torch.equal(same, tt.encoder(torch.tensor([[1, 9]], dtype=torch.int32), wte + 1, wpe))


def test_refusals(tt):
    import torch

    ids, wte, wpe = torch.zeros(1, 2, dtype=torch.int32), torch.zeros(10, 8), torch.zeros(4, 8)
    with pytest.raises(TypeError, match="int32 or int64"):
        tt.encoder(ids.float(), wte, wpe)
    with pytest.raises(TypeError, match="int32 or int64"):
        tt.encoder(ids.to(torch.int16), wte, wpe)
    with pytest.raises(TypeError, match="torch.Tensor"):
        tt.encoder(ids.numpy(), wte, wpe)
    with pytest.raises(TypeError, match="bfloat16 or torch.float32"):
        tt.encoder(ids, wte.half(), wpe.half())
    with pytest.raises(TypeError, match="dtype"):  # the package's validation: one dtype for both tables
        tt.encoder(ids, wte.bfloat16(), wpe)
    with pytest.raises(ValueError, match="multiple of 8"):  # bf16 C must fill 128-bit packs
        tt.encoder(ids, torch.zeros(10, 12, dtype=torch.bfloat16), torch.zeros(4, 12, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="2-D"):
        tt.encoder(ids, torch.zeros(10), wpe)
    with pytest.raises(ValueError, match="only 4 rows"):
        tt.encoder(torch.zeros(1, 5, dtype=torch.int32), wte, wpe)
    with pytest.raises(TypeError, match="bfloat16 or torch.float32"):
        tt.GPT2Embedding(10, 4, 8, dtype=torch.float16)


@pytest.mark.gpu
def test_a_refused_signature_is_refused_at_every_call_on_the_gpu(tt):
    """Eager CUDA calls validate a signature once and keep only the ones that passed (``adapter signatures``)."""
    import torch

    from gpt2enc_edu import caches

    caches.clear()
    ids, wte, wpe = (torch.zeros(1, 5, dtype=torch.int32, device="cuda"), torch.zeros(10, 8, device="cuda"),
                     torch.zeros(4, 8, device="cuda", requires_grad=True))
    for _ in range(2):
        with pytest.raises(ValueError, match="only 4 rows"):
            tt.encoder(ids, wte, wpe)
    assert caches.held()["adapter signatures"][0] == 0
    out = tt.encoder(ids[:, :4], wte, wpe)
    out.sum().backward()
    assert caches.held()["adapter signatures"][0] == 2  # the forward's and the backward's
    assert torch.equal(wpe.grad, torch.ones(4, 8, device="cuda"))


def test_options_are_checked_at_the_call(tt):
    import torch

    ids, wte, wpe = torch.zeros(1, 2, dtype=torch.int32), torch.zeros(10, 8, requires_grad=True), torch.zeros(4, 8)
    with pytest.raises(ValueError, match="method must be one of"):
        tt.encoder(ids, wte, wpe, method="nope")
    with pytest.raises(ValueError, match="bucketing must be one of"):
        tt.encoder(ids, wte, wpe, bucketing="tpu")
    with pytest.raises(ValueError, match="method must be one of"):
        tt.GPT2Embedding(10, 4, 8, method="nope")


@pytest.mark.gpu
def test_cuda_runs_on_the_current_stream_without_copies(tt, rng):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    p = random_problem(8, 128, 768, 50257, maxT=128, dtype=bfloat16, ids="real", rng=rng)
    ids, wte, wpe, dout = _tensors(tt, p, torch.device("cuda"))
    assert tt.as_array(wte).data.ptr == wte.data_ptr()  # a view, not a copy
    assert tt.from_array(tt.as_array(wte)).data_ptr() == wte.data_ptr()
    reference_out = tt.encoder(ids, wte, wpe, generator=torch.Generator().manual_seed(5))
    reference_out.backward(dout)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # fresh leaves, so autograd accumulates on the side stream too
        wte_side = wte.detach().clone().requires_grad_(True)
        wpe_side = wpe.detach().clone().requires_grad_(True)
        out = tt.encoder(ids, wte_side, wpe_side, generator=torch.Generator().manual_seed(5))
        out.backward(dout)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(out.view(torch.int16), reference_out.view(torch.int16))
    assert torch.equal(wte_side.grad.view(torch.int16), wte.grad.view(torch.int16))
    assert torch.equal(wpe_side.grad.view(torch.int16), wpe.grad.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("method", DETERMINISTIC)
def test_training_steps_give_the_bits_of_encoder_backward(tt, rng, method):
    """Steps of fresh ids at GPT-2's shape (every route of the table: one sequence, the scatter route), each backward
    with the bits of ``encoder_backward`` on the seed it drew; so do two forwards whose backwards run in reverse
    order."""
    import cupy
    import torch

    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    device = torch.device("cuda")
    problems = [random_problem(B, 1024, 768, 50257, maxT=1024, dtype=bfloat16, ids=kind, rng=rng)
                for B, kind in ((1, "zipf"), (8, "real"), (8, "uniform"), (2, "zipf"))]

    def check(p, wte, wpe, seed):
        g = p.on(cupy)
        g.dwte[...] = 0
        g.dwpe[...] = 0
        drawn = tt.draw_seed(torch.Generator().manual_seed(seed))
        enc.encoder_backward(g.dwte, g.dwpe, g.dout, g.inp, seed=drawn, method=method, bucketing="gpu")
        assert compare.bitwise_equal(tt.as_array(wte.grad), g.dwte)
        assert compare.bitwise_equal(tt.as_array(wpe.grad), g.dwpe)

    for step, p in enumerate(problems):  # one step after another
        ids, wte, wpe, dout = _tensors(tt, p, device)
        tt.encoder(ids.long(), wte, wpe, method=method, generator=torch.Generator().manual_seed(step)).backward(dout)
        check(p, wte, wpe, step)
    first, second = problems[1], problems[2]  # two forwards, then the two backwards in reverse order
    ids1, wte1, wpe1, dout1 = _tensors(tt, first, device)
    ids2, wte2, wpe2, dout2 = _tensors(tt, second, device)
    out1 = tt.encoder(ids1, wte1, wpe1, method=method, generator=torch.Generator().manual_seed(11))
    out2 = tt.encoder(ids2, wte2, wpe2, method=method, generator=torch.Generator().manual_seed(12))
    out2.backward(dout2)
    out1.backward(dout1)
    check(first, wte1, wpe1, 11)
    check(second, wte2, wpe2, 12)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float32", "int32", "int64"])
def test_the_adapters_view_is_as_array_without_dlpack(tt, dtype_name):
    """``torch_arrays.view`` (the adapter's own calls) gives ``as_array``'s array for contiguous CUDA tensors, over
    the same memory, and keeps the tensor alive; other tensors go through ``as_array``."""
    import gc

    import torch

    from gpt2enc_edu import torch_arrays

    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    dtype = getattr(torch, dtype_name)
    t = (torch.arange(24 * 16, device="cuda") % 251 - 125).to(dtype).reshape(24, 16)
    with tt.on_torch_stream(t.device):
        view, reference = torch_arrays.view(t), tt.as_array(t)
    assert view.data.ptr == t.data_ptr() and view.shape == (24, 16) and view.dtype == reference.dtype
    assert compare.bitwise_equal(view, reference)
    expected = reference.get()
    del t, reference
    gc.collect()
    torch.cuda.empty_cache()  # the memory must still be the tensor's: the view holds it
    assert compare.bitwise_equal(view, expected)
    strided = torch.zeros(8, 8, device="cuda", dtype=dtype)[:, ::2]
    with tt.on_torch_stream(strided.device):
        assert torch_arrays.view(strided).shape == (8, 4) and not torch_arrays.view(strided).flags.c_contiguous


def test_the_adapters_view_of_a_cpu_tensor_is_as_array(tt):
    import torch

    from gpt2enc_edu import torch_arrays

    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    view = torch_arrays.view(t)
    assert isinstance(view, np.ndarray) and np.shares_memory(view, t.numpy())


@pytest.mark.gpu
def test_on_torch_stream_makes_torchs_current_stream_cupys(tt):
    import cupy
    import torch

    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side), tt.on_torch_stream(torch.device("cuda")):
        assert cupy.cuda.get_current_stream().ptr == side.cuda_stream
    with tt.on_torch_stream(torch.device("cuda")):
        assert cupy.cuda.get_current_stream().ptr == torch.cuda.current_stream().cuda_stream


# ---------------------------------------------------------------------------------------------- the adapter's edges
@pytest.mark.parametrize("bad", [None, 0, 1, [], "yes"], ids=repr)
def test_check_ids_must_be_a_bool(tt, bad):
    import torch

    ids, wte, wpe = torch.zeros(1, 2, dtype=torch.int32), torch.zeros(10, 8), torch.zeros(4, 8)
    with pytest.raises(TypeError, match="check_ids must be True or False"):
        tt.encoder(ids, wte, wpe, check_ids=bad)
    with pytest.raises(TypeError, match="check_ids must be True or False"):
        tt.GPT2Embedding(10, 4, 8, check_ids=bad)


def test_the_generator_is_checked_where_it_is_given(tt):
    import torch

    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        tt.GPT2Embedding(10, 4, 8, generator=1234)
    emb = tt.GPT2Embedding(10, 4, 8, dtype=torch.float32)
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        emb.generator = "seed"
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        tt.encoder(torch.zeros(1, 2, dtype=torch.int32), emb.wte, emb.wpe, generator=1234)
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="CPU torch.Generator"):
            tt.GPT2Embedding(10, 4, 8, generator=torch.Generator(device="cuda"))


def test_double_backward_raises(tt, device, rng):
    """A tied head makes the encoder's gradient depend on wte: differentiating it again must raise, not be wrong."""
    import torch

    p = random_problem(2, 16, 32, 20, maxT=16, dtype=np.float32, rng=rng)
    ids, wte, wpe, _ = _tensors(tt, p, device)
    x = tt.encoder(ids, wte, wpe)
    loss = (x @ wte.t()).square().sum()
    (first,) = torch.autograd.grad(loss, wte, create_graph=True)  # the first order still works
    wte_ref = wte.detach().clone().requires_grad_(True)
    ((wte_ref[ids.long()] + wpe.detach()[:16]) @ wte_ref.t()).square().sum().backward()
    torch.testing.assert_close(first, wte_ref.grad, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        first.sum().backward()


def test_unaligned_contiguous_dout_and_ids_are_taken(tt, device, rng):
    """``torch.cat``'s backward hands each input a slice of one gradient: contiguous, at an address no 16-byte load
    may read; int32 ids may sit at such an address too. Both give the bits of aligned copies, as nn.Embedding
    takes both."""
    import torch

    p = random_problem(3, 40, 64, 50, maxT=40, dtype=bfloat16, ids="zipf", rng=rng)
    ids, wte, wpe, dout = _tensors(tt, p, device)
    base = torch.empty(1 + ids.numel(), dtype=torch.int32, device=device)
    base[1:] = ids.reshape(-1)
    ids_unaligned = base[1:].view(ids.shape)
    assert ids_unaligned.is_contiguous() and ids_unaligned.data_ptr() % 16
    x = tt.encoder(ids_unaligned, wte, wpe, generator=torch.Generator().manual_seed(3))
    seen = []
    x.register_hook(lambda g: seen.append((g.is_contiguous(), g.data_ptr() % 16)))
    pad = torch.zeros(1, dtype=x.dtype, device=device)
    weights = torch.cat([pad, dout.reshape(-1)])
    (torch.cat([pad, x.reshape(-1)]) * weights).sum().backward()
    assert seen == [(True, 2)]  # the gradient x received: contiguous, one bf16 element past an aligned address
    wte_ref = wte.detach().clone().requires_grad_(True)
    wpe_ref = wpe.detach().clone().requires_grad_(True)
    ref = tt.encoder(ids.clone(), wte_ref, wpe_ref, generator=torch.Generator().manual_seed(3))
    ref.backward(dout.clone())
    assert torch.equal(x.view(torch.int16), ref.view(torch.int16))
    assert torch.equal(wte.grad.view(torch.int16), wte_ref.grad.view(torch.int16))
    assert torch.equal(wpe.grad.view(torch.int16), wpe_ref.grad.view(torch.int16))


def test_unaligned_and_strided_weights_are_copied_for_the_kernels(tt, device, rng):
    import torch

    p = random_problem(2, 8, 16, 30, maxT=8, dtype=np.float32, rng=rng)
    ids, wte, wpe, _ = _tensors(tt, p, device)
    flat = torch.zeros(1 + wte.numel(), device=device)
    flat[1:] = wte.detach().reshape(-1)
    flat.requires_grad_(True)
    wte_unaligned = flat[1:].view(wte.shape)
    wide = torch.zeros(wpe.shape[0], 2 * wpe.shape[1], device=device)
    wide[:, ::2] = wpe.detach()
    wpe_strided = wide[:, ::2]
    out = tt.encoder(ids, wte_unaligned, wpe_strided)
    assert torch.equal(out, tt.encoder(ids, wte.detach(), wpe.detach()))
    out.sum().backward()
    assert torch.equal(flat.grad[1:].view(wte.shape), torch.zeros_like(wte).index_put_(
        (ids.long().reshape(-1),), torch.ones(ids.numel(), wte.shape[1], device=device), accumulate=True))


@pytest.mark.parametrize("method", [m for m, row in methods.METHODS.items() if not row.deterministic])
def test_nondeterministic_methods_obey_use_deterministic_algorithms(tt, device, rng, method):
    import torch

    p = random_problem(2, 16, 32, 20, maxT=16, dtype=bfloat16, rng=rng)
    ids, wte, wpe, dout = _tensors(tt, p, device)
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        torch.use_deterministic_algorithms(True)
        with pytest.raises(RuntimeError, match="does not have a deterministic implementation"):
            tt.encoder(ids, wte, wpe, method=method).backward(dout)
        assert wte.grad is None and wpe.grad is None
        tt.encoder(ids, wte, wpe, method=methods.DEFAULT_METHOD).backward(dout)  # a deterministic one runs
        wte.grad = wpe.grad = None
        torch.use_deterministic_algorithms(True, warn_only=True)
        with pytest.warns(UserWarning, match="does not have a deterministic implementation"):
            tt.encoder(ids, wte, wpe, method=method).backward(dout)
        assert wte.grad is not None
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def test_the_bad_id_check_names_the_id_on_the_cpu(tt):
    import torch

    wte, wpe = torch.zeros(10, 8, requires_grad=True), torch.zeros(4, 8)
    with pytest.raises(ValueError, match=r"token id 10 at position 3, outside \[0, V\) = \[0, 10\)"):
        tt.encoder(torch.tensor([[1, 2], [3, 10]]), wte, wpe)
    assert wte.grad is None


@pytest.mark.gpu
def test_a_bad_id_on_the_gpu_stops_everything(tt):
    """The device-side check: the bad id stops its kernel, which names it, and PyTorch raises at a later call (a child
    process: the CUDA context is lost). That the check needs no sync, the CUDA-graph capture of a checked forward
    shows (test_torch_compile)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    code = (
        "import torch\n"
        "from gpt2enc_edu.torch import GPT2Embedding\n"
        "emb = GPT2Embedding(100, 8, 64, device='cuda')\n"
        "ids = torch.tensor([[1, 2, 3], [4, 100, 5]], device='cuda')\n"
        "try:\n"
        "    emb(ids).float().sum().backward()\n"
        "    torch.cuda.synchronize()\n"
        "except Exception as exc:\n"
        "    print('raised:', type(exc).__name__, exc, flush=True)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    text = result.stdout + result.stderr
    assert "raised: " in text, text
    assert "token id 100 at position 4 lies outside [0, V) = [0, 100)" in text, text


@pytest.mark.gpu
def test_cupys_own_pool_holds_only_the_kept_scratch(tt, rng):
    """What a call allocates for itself comes from torch's caching allocator; CuPy's own pool holds only the scratch
    the package's bounded caches keep between calls (``gpt2enc_edu.caches``): once they let it go, the pool is back
    where it was, over steps of several shapes and streams."""
    import cupy
    import torch

    from gpt2enc_edu import caches

    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    caches.clear()
    pool = cupy.get_default_memory_pool()
    before = pool.used_bytes()
    emb = tt.GPT2Embedding(50257, 1024, 768, device="cuda")
    for B, T in ((1, 1024), (4, 1024), (9, 700), (80, 1024)):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            ids = torch.randint(0, 50257, (B, T), device="cuda")
            emb(ids).float().square().sum().backward()
        torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    assert pool.used_bytes() > before  # the workspaces of the tables built in the backwards
    caches.clear()
    assert pool.used_bytes() == before


def _replays(monkeypatch) -> list:
    """The names of the first tensor of every launch plan replayed from now on ("out": a forward, "dwte": a
    backward)."""
    from gpt2enc_edu import plans

    replayed = []
    replay = plans.Plan.replay
    monkeypatch.setattr(plans.Plan, "replay", lambda plan, *args: replayed.append(plan.names[0]) or replay(plan, *args))
    return replayed


def _planned_steps(tt, rng, method: str, B: int, *, ids_kind: str = "int64, checked", bucketing: str = "auto"):
    """Three steps of one signature with fresh problems: each forward's bits, and each deterministic backward's, are
    those of ``encoder_forward`` and ``encoder_backward`` with the seed drawn."""
    import cupy
    import torch

    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    for step in range(3):
        # GPT-2's V and T (the table's route depends on B*T and V), few channels (quick to draw)
        p = random_problem(B, 1024, 64, 50257, maxT=1024, dtype=bfloat16, ids="real", rng=rng)
        ids, wte, wpe, dout = _tensors(tt, p, torch.device("cuda"))
        ids = ids.long() if ids_kind.startswith("int64") else ids.int()
        out = tt.encoder(ids, wte, wpe, method=method, bucketing=bucketing, check_ids=ids_kind.endswith(", checked"),
                         generator=torch.Generator().manual_seed(step))
        out.backward(dout)
        g = p.on(cupy)
        assert compare.bitwise_equal(tt.as_array(out.detach()), enc.encoder_forward(g.inp, g.wte, g.wpe))
        if methods.METHODS[method].deterministic:
            g.dwte[...] = 0
            g.dwpe[...] = 0
            seed = tt.draw_seed(torch.Generator().manual_seed(step))
            enc.encoder_backward(g.dwte, g.dwpe, g.dout, g.inp, seed=seed, method=method)
            assert compare.bitwise_equal(tt.as_array(wte.grad), g.dwte), (B, step)
            assert compare.bitwise_equal(tt.as_array(wpe.grad), g.dwpe), (B, step)


_PLANNED = [(B, kind) for B in (1, 8) for kind in ("int64, checked", "int32, unchecked")] + [(65, "int64, checked")]


@pytest.mark.gpu
@pytest.mark.parametrize(("B", "ids_kind"), _PLANNED, ids=[f"B={B}, {kind}" for B, kind in _PLANNED])
@pytest.mark.parametrize("method", [m for m in methods.METHODS if m != "atomic"])
def test_eager_calls_replay_their_launch_plans_with_the_package_calls_bits(tt, rng, monkeypatch, method, B, ids_kind):
    """Steps of one signature at B = 1 (the one-launch backward), 8 (the scatter route's table) and 65 (more than
    65536 ids: the cooperative route): the first call of a signature records a launch plan, later ones replay it
    (``plans``) with the bits of the package's calls. int32 ids, unchecked, are read in place, int64 ids through the
    int32 copy."""
    replayed = _replays(monkeypatch)
    _planned_steps(tt, rng, method, B, ids_kind=ids_kind)
    assert replayed.count("out") >= 2 and replayed.count("dwte") >= 2  # every call after the first


@pytest.mark.gpu
@pytest.mark.parametrize(("method", "bucketing"), [("atomic", "auto"), ("chunked", "cpu"), ("bucketed", "cpu")])
def test_a_backward_whose_work_depends_on_more_than_its_signature_makes_no_plan(tt, rng, monkeypatch, method,
                                                                                 bucketing):
    """The atomic method's fp32 rows take a new stamp every call, and a table built on the host (``bucketing="cpu"``,
    llm.c's route) is copied over with a grid set by its contents: such a backward is never replayed from a plan,
    and gives the package's bits at every call (the forward still replays its own)."""
    replayed = _replays(monkeypatch)
    _planned_steps(tt, rng, method, 8, bucketing=bucketing)
    assert replayed.count("dwte") == 0 and replayed.count("out") >= 2


def test_the_operators_called_directly_give_the_functions_bits(tt, device, rng):
    """Eager calls take a lighter path than the registered operators (which ``torch.compile`` traces); both do the same
    work: the same output and, for the seed the function's backward drew, the same gradients."""
    import torch

    p = random_problem(3, 40, 64, 500, maxT=48, dtype=bfloat16, ids="zipf", rng=rng)
    ids, wte, wpe, dout = _tensors(tt, p, device)
    out = tt.encoder(ids.long(), wte, wpe, generator=torch.Generator().manual_seed(9))
    out.backward(dout)
    ops = torch.ops.gpt2enc_edu
    assert torch.equal(ops.encoder_forward(ids.long(), wte, wpe, True, "chunked", "auto", 0).view(torch.int16),
                       out.view(torch.int16))
    seed = tt.draw_seed(torch.Generator().manual_seed(9))
    dwte, dwpe = ops.encoder_backward(dout, ids, 500, 48, "chunked", "auto", seed, 0)
    assert torch.equal(dwte.view(torch.int16), wte.grad.view(torch.int16))
    assert torch.equal(dwpe.view(torch.int16), wpe.grad.view(torch.int16))


def test_torch_without_custom_op_is_refused_at_import_with_the_version_it_needs():
    code = ("import torch; del torch.library.custom_op\n"
            "try:\n    import gpt2enc_edu.torch\nexcept ImportError as e:\n    print(e)")
    pytest.importorskip("torch")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "needs PyTorch 2.4 or newer" in result.stdout


@pytest.mark.parametrize("bad", [150, 2**32 + 3, -(2**32) + 3], ids=repr)  # the last two wrap to 3 as int32
def test_check_ids_false_on_the_cpu_still_refuses_an_id_out_of_range(tt, bad):
    import torch

    emb = tt.GPT2Embedding(100, 16, 32, dtype=torch.float32, check_ids=False)
    with pytest.raises(ValueError, match=rf"token id {bad}\b.*outside \[0, V\)"):
        emb(torch.tensor([[1, 2, bad]]))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_autocast_leaves_the_encoder_in_the_parameters_dtype(tt, rng, dtype):
    import torch

    emb = tt.GPT2Embedding(100, 16, 32, dtype=getattr(torch, dtype))
    ids = torch.from_numpy(rng.integers(0, 100, (2, 16)))
    plain = emb(ids)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = emb(ids)
    assert cast.dtype == plain.dtype == getattr(torch, dtype) and torch.equal(cast, plain)


def test_a_backward_advances_its_generator_and_only_that_one(tt):
    import torch

    ids = torch.tensor([[1, 2, 3]])
    emb = tt.GPT2Embedding(10, 4, 8)
    torch.manual_seed(0)
    expected_after_one_draw = (torch.randint(0, 2**32, (1,)), torch.rand(1))[1]
    torch.manual_seed(0)
    emb(ids).float().sum().backward()  # draws its seed from torch's default generator
    assert torch.equal(torch.rand(1), expected_after_one_draw)
    own = torch.Generator().manual_seed(5)
    emb.generator = own
    state = own.get_state()
    torch.manual_seed(0)
    untouched = torch.rand(1)
    torch.manual_seed(0)
    emb(ids).float().sum().backward()
    assert torch.equal(torch.rand(1), untouched) and not torch.equal(own.get_state(), state)


def test_distributed_data_parallel_with_one_process_gets_the_plain_gradients(tt, rng, tmp_path):
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("this torch has no torch.distributed")
    ids = torch.from_numpy(rng.integers(0, 50, (2, 16)))
    plain = tt.GPT2Embedding(50, 16, 32, generator=torch.Generator().manual_seed(1))
    twin = tt.GPT2Embedding(50, 16, 32, generator=torch.Generator().manual_seed(1))
    twin.load_state_dict(plain.state_dict())
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        wrapped = torch.nn.parallel.DistributedDataParallel(twin)
        plain(ids).float().square().sum().backward()
        wrapped(ids).float().square().sum().backward()
    finally:
        dist.destroy_process_group()
    for a, b in ((plain.wte, twin.wte), (plain.wpe, twin.wpe)):
        assert a.grad is not None and torch.equal(a.grad, b.grad)


@pytest.mark.parametrize("bad", [None, b"chunked", ["chunked"]], ids=repr)
def test_a_method_of_the_wrong_type_is_a_type_error_naming_it(tt, bad):
    import torch

    with pytest.raises(TypeError, match="method must be a string"):
        tt.GPT2Embedding(10, 4, 8, method=bad)
    with pytest.raises(TypeError, match="bucketing must be a string"):
        tt.GPT2Embedding(10, 4, 8, bucketing=bad)
    with pytest.raises(TypeError, match="method must be a string"):
        tt.encoder(torch.zeros(1, 2, dtype=torch.int32), torch.zeros(10, 8), torch.zeros(4, 8), method=bad)


@pytest.mark.parametrize(("kwargs", "exc", "match"), [
    ({"vocab_size": 1.5}, TypeError, "vocab_size must be an integer"),
    ({"vocab_size": True}, TypeError, "vocab_size must be an integer"),
    ({"max_positions": 0}, ValueError, "max_positions must be >= 1"),
    ({"channels": 0}, ValueError, "channels must be >= 1"),
    ({"channels": 12}, ValueError, "channels must be a multiple of 8"),
    ({"dtype": [1]}, TypeError, "dtype must be torch.bfloat16 or torch.float32"),
], ids=lambda v: repr(v) if isinstance(v, dict) else "")
def test_gpt2embedding_refuses_sizes_it_cannot_run_when_it_is_built(tt, kwargs, exc, match):
    sizes = {"vocab_size": 10, "max_positions": 4, "channels": 8} | kwargs
    dtype = sizes.pop("dtype", None)
    with pytest.raises(exc, match=match):
        tt.GPT2Embedding(*sizes.values(), **({} if dtype is None else {"dtype": dtype}))


def test_gpu_bucketing_on_cpu_tensors_is_refused_at_the_forward(tt):
    import torch

    emb = tt.GPT2Embedding(10, 4, 8, bucketing="gpu")  # the module may still move to a GPU
    with pytest.raises(ValueError, match="bucketing='gpu' .* needs CUDA tensors"):
        emb(torch.zeros(1, 2, dtype=torch.int32))


def test_draw_seed_and_sparse_weights_are_refused_with_their_names(tt):
    import torch

    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        tt.draw_seed("x")
    assert 0 <= tt.draw_seed(torch.Generator().manual_seed(3)) < 2**32
    with pytest.raises(TypeError, match="wte must be a dense tensor"):
        tt.encoder(torch.zeros(1, 2, dtype=torch.int32), torch.zeros(10, 8).to_sparse(), torch.zeros(4, 8))


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copied_module_draws_its_seeds_from_its_own_copy_of_the_generator(tt, how):
    import copy
    import gc
    import pickle

    import torch

    original_generator = torch.Generator().manual_seed(1)
    original = tt.GPT2Embedding(10, 4, 8, generator=original_generator)
    twin = copy.deepcopy(original) if how == "deepcopy" else pickle.loads(pickle.dumps(original))
    assert twin.generator is not original_generator
    start = original_generator.get_state()
    twin(torch.tensor([[1, 2]])).float().sum().backward()
    assert torch.equal(original_generator.get_state(), start)  # the copy drew from its own generator
    assert not torch.equal(twin.generator.get_state(), start)
    del original, original_generator
    gc.collect()
    twin(torch.tensor([[1, 2]])).float().sum().backward()  # the original's generator is gone; the copy's is not
