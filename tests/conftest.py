"""Shared fixtures: the two backends, fresh random generators, and the GPU mark's skip rule.

Without a GPU every test marked ``gpu`` is skipped, and the summary (``-ra``) gives them one line,
``SKIPPED [N] GPU tests (mark "gpu"): no CUDA backend: <why>``, instead of one line per test function
(and likewise one line for the PyTorch tests without torch); other skips keep their own lines.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpt2enc_edu.backend import gpu_status

GPU = gpu_status()
GPU_SKIP_REASON = f"no CUDA backend: {GPU.reason}"


def pytest_collection_modifyitems(config, items):
    if GPU.name == "cuda":
        return
    skip = pytest.mark.skip(reason=GPU_SKIP_REASON)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _skip_group(reason: str) -> str | None:
    """The one summary line a skip belongs to: the GPU tests, the PyTorch tests, or its own (``None``)."""
    if reason == GPU_SKIP_REASON:
        return 'GPU tests (mark "gpu")'
    if reason.startswith("could not import 'torch'"):
        return "PyTorch tests"
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Give every GPU skip (and every no-torch skip) one location, so the short summary folds them."""
    report = yield
    longrepr = report.longrepr
    if report.skipped and isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2]).removeprefix("Skipped: ")
        group = _skip_group(reason)
        if group:
            report.longrepr = (group, None, reason)
    return report


@pytest.fixture
def rng(request):
    """A fresh generator per test; its seed is printed on failure so a failing draw can be replayed."""
    seed = np.random.SeedSequence().entropy
    request.node.user_properties.append(("rng_seed", seed))
    print(f"rng seed: {seed}")
    return np.random.default_rng(seed)


def _cupy():
    import cupy

    return cupy


@pytest.fixture(params=["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def xp(request):
    """The array module of one backend: NumPy (the mirror) always, CuPy (the kernels) with a GPU."""
    return np if request.param == "numpy" else _cupy()


@pytest.fixture
def tt():
    """``gpt2enc_edu.torch`` (the PyTorch adapter), or a skip when torch is not installed."""
    pytest.importorskip("torch")
    from gpt2enc_edu import torch as adapter

    return adapter


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request):
    """The torch device of one backend: the CPU (NumPy mirror) always, CUDA (the kernels) with a GPU."""
    torch = pytest.importorskip("torch")
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip(f"torch {torch.__version__} sees no CUDA GPU")
    return torch.device(request.param)
