"""The adapter's operators under PyTorch's tools: ``torch.library.opcheck``, ``torch.compile(fullgraph=True)`` (the
same bits as eager, bf16 and fp32), and on the GPU CUDA graphs (``torch.cuda.graph`` and
``torch.compile(mode="reduce-overhead")``), whose replays give the bits of eager calls.

CPU tests need torch (skipped cleanly without it); tests marked ``gpu`` need CuPy, a GPU and a CUDA torch.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpt2enc_edu import methods
from gpt2enc_edu.problems import random_problem
from gpt2enc_edu.rounding import bfloat16

DTYPES = [pytest.param("bfloat16", id="bf16"), pytest.param("float32", id="fp32")]


@pytest.fixture
def cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip(f"torch {torch.__version__} sees no CUDA GPU")
    return torch.device("cuda")


def _bits(t):
    import torch

    return t.detach().view(torch.int16) if t.dtype == torch.bfloat16 else t.detach()


def _same(a, b) -> bool:
    import torch

    return torch.equal(_bits(a), _bits(b))


def _module(tt, V, maxT, C, dtype_name, device, seed=0):
    import torch

    torch.manual_seed(seed)
    return tt.GPT2Embedding(V, maxT, C, dtype=getattr(torch, dtype_name), device=device,
                            generator=torch.Generator())


def _step(module, ids, dout, seed):
    """One forward and backward from zeroed gradients, the module's generator seeded with ``seed``: (out, dwte,
    dwpe)."""
    module.generator.manual_seed(seed)
    module.zero_grad(set_to_none=True)
    out = module(ids)
    out.backward(dout)
    return out.detach().clone(), module.wte.grad.clone(), module.wpe.grad.clone()


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_opcheck(tt, device, rng, dtype_name):
    import torch

    dtype = getattr(torch, dtype_name)
    ids = torch.from_numpy(rng.integers(0, 50, (3, 24))).to(device)  # int64, PyTorch's default
    wte = torch.randn(50, 64, device=device).to(dtype).requires_grad_(True)
    wpe = torch.randn(32, 64, device=device).to(dtype).requires_grad_(True)
    dout = torch.randn(3, 24, 64, device=device).to(dtype)
    for method in methods.deterministic_methods():
        torch.library.opcheck(torch.ops.gpt2enc_edu.encoder_forward.default,
                              (ids, wte, wpe, True, method, "auto", 0))
        torch.library.opcheck(torch.ops.gpt2enc_edu.encoder_backward.default,
                              (dout, ids.int(), 50, 32, method, "auto", int(rng.integers(2**32)), 0))


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_compile_fullgraph_gives_the_bits_of_eager(tt, device, rng, dtype_name):
    """Three training steps, eager and compiled with ``fullgraph=True``: every forward and every gradient bit for
    bit the same (the compiled backward draws the eager one's seeds), at two shapes (the second recompiles)."""
    import torch

    torch._dynamo.reset()
    eager = _module(tt, 300, 64, 64, dtype_name, device)
    compiled_module = _module(tt, 300, 64, 64, dtype_name, device)
    compiled = torch.compile(compiled_module, fullgraph=True)
    dtype = getattr(torch, dtype_name)
    for step, (B, T) in enumerate(((4, 64), (4, 64), (2, 48))):
        ids = torch.from_numpy(rng.integers(0, 300, (B, T))).to(device)
        dout = torch.randn(B, T, 64, device=device).to(dtype)
        expected = _step(eager, ids, dout, seed=step)
        compiled_module.generator.manual_seed(step)
        compiled_module.zero_grad(set_to_none=True)
        out = compiled(ids)
        out.backward(dout)
        got = (out, compiled_module.wte.grad, compiled_module.wpe.grad)
        assert all(_same(a, b) for a, b in zip(got, expected)), f"step {step}"


def test_compile_fullgraph_of_the_function_in_a_model(tt, rng):
    """``encoder`` inside a compiled model (tied head, loss): the same loss and gradients as eager."""
    import torch

    torch._dynamo.reset()
    V, C = 40, 32
    wte = torch.randn(V, C, requires_grad=True)
    wpe = torch.randn(16, C, requires_grad=True)
    ids = torch.from_numpy(rng.integers(0, V, (2, 16)))

    def loss_fn(ids, wte, wpe):
        x = tt.encoder(ids, wte, wpe)
        return torch.nn.functional.cross_entropy((x @ wte.t()).reshape(-1, V), ids.reshape(-1))

    results = []
    for fn in (loss_fn, torch.compile(loss_fn, fullgraph=True)):
        wte.grad = wpe.grad = None
        loss = fn(ids, wte, wpe)
        loss.backward()
        results.append((loss.detach(), wte.grad.clone(), wpe.grad.clone()))
    # inductor fuses the head's math (another fp32 order), so dout, and with it every gradient, may differ in the last
    # bits; the encoder's own bits under compile are the test above
    torch.testing.assert_close(results[0], results[1], rtol=1e-5, atol=1e-6)


def test_compile_refuses_a_generator_given_to_the_function(tt):
    """The function's generator is looked up where dynamo cannot trace: a clear error, not a graph break."""
    import torch

    torch._dynamo.reset()
    wte, wpe = torch.randn(40, 32, requires_grad=True), torch.randn(16, 32, requires_grad=True)
    generator = torch.Generator()

    def loss(ids):
        return tt.encoder(ids, wte, wpe, generator=generator).sum()

    with pytest.raises(Exception, match="give the generator to GPT2Embedding"):
        torch.compile(loss, fullgraph=True)(torch.randint(0, 40, (2, 16)))


@pytest.mark.gpu
@pytest.mark.parametrize("capture_on", ["torch's capture stream", "the warm-up stream"])
@pytest.mark.parametrize("B", [1, 8])
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_cuda_graph_replays_give_the_bits_of_eager(tt, cuda, rng, dtype_name, B, capture_on, monkeypatch):
    """Forward and backward captured with ``torch.cuda.graph`` (warm-up on a side stream, as PyTorch's guide says),
    then replayed on new ids copied into the captured input: each replay gives the bits of an eager step with the
    seed drawn while capturing (B=1: the one-launch backward; B=8: the table built on the GPU in the backward).
    Captured on the warm-up stream, the calls replay the launch plans the warm-up recorded into the graph, which
    pins them (``caches``); on torch's own capture stream they run the package's calls."""
    import torch

    from gpt2enc_edu import caches, plans

    V, T, C = 50257, 1024, 768
    dtype = getattr(torch, dtype_name)
    module = _module(tt, V, T, C, dtype_name, cuda)
    eager = _module(tt, V, T, C, dtype_name, cuda)
    static_ids = torch.from_numpy(rng.integers(0, V, (B, T))).to(cuda)
    static_dout = torch.randn(B, T, C, device=cuda).to(dtype)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for step in range(2):
            _step(module, static_ids, static_dout, seed=step)
    torch.cuda.current_stream().wait_stream(side)
    module.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    module.generator.manual_seed(1234)
    replayed = []
    replay = plans.Plan.replay
    monkeypatch.setattr(plans.Plan, "replay", lambda plan, *args: replayed.append(plan) or replay(plan, *args))
    with torch.cuda.graph(graph, stream=side if capture_on == "the warm-up stream" else None):
        static_out = module(static_ids)
        static_out.backward(static_dout)
    monkeypatch.undo()
    if capture_on == "the warm-up stream":
        assert len(replayed) == 2 and caches.held()["launch plans"][1] >= 2  # forward and backward, pinned
    else:
        assert not replayed
    for kind in ("uniform", "zipf", "real"):
        problem = random_problem(B, T, C, V, maxT=T, dtype=bfloat16, ids=kind, rng=rng)
        static_ids.copy_(torch.from_numpy(problem.inp.astype(np.int64)))
        graph.replay()
        expected = _step(eager, static_ids, static_dout, seed=1234)
        got = (static_out, module.wte.grad, module.wpe.grad)
        assert all(_same(a, b) for a, b in zip(got, expected)), kind


@pytest.mark.gpu
def test_compile_reduce_overhead_replays_give_the_bits_of_eager(tt, cuda, rng):
    """``torch.compile(mode="reduce-overhead")``: the forward and the backward run as CUDA graphs (no graph skipped),
    and every replay gives eager's bits (fp32: the gradients do not depend on the seed)."""
    import torch
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    V, T, C, B = 50257, 1024, 768, 8
    module = _module(tt, V, T, C, "float32", cuda)
    eager = _module(tt, V, T, C, "float32", cuda)
    compiled = torch.compile(module, mode="reduce-overhead", fullgraph=True)
    for step in range(4):
        ids = torch.from_numpy(rng.integers(0, V, (B, T))).to(cuda)
        dout = torch.randn(B, T, C, device=cuda)
        module.zero_grad(set_to_none=True)
        out = compiled(ids)
        out.backward(dout)
        expected = _step(eager, ids, dout, seed=step)
        assert all(_same(a, b) for a, b in zip((out, module.wte.grad, module.wpe.grad), expected)), step
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
