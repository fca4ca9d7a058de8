"""Shared fixtures: the two backends, fresh random generators, and the GPU mark's skip rule."""

from __future__ import annotations

import numpy as np
import pytest

from gpt2enc_edu.backend import gpu_status

GPU = gpu_status()


def pytest_collection_modifyitems(config, items):
    if GPU.name == "cuda":
        return
    skip = pytest.mark.skip(reason=f"no CUDA backend: {GPU.reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


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
