"""The warm-ups of notebook 00: their specs, their worked solutions, and the mistakes they are there to teach."""

from __future__ import annotations

import re

import numpy as np
import pytest

import solutions.warmups as solutions
from gpt2enc_edu.course import warmups
from gpt2enc_edu.course.grid import fadd
from gpt2enc_edu.course.launchers import WARMUP_BLOCK

NAMES = ("add_bias", "warp_sum", "block_sum")


@pytest.fixture(autouse=True)
def _record(tmp_path, monkeypatch):
    monkeypatch.setenv("GPT2ENC_EDU_RECORD", str(tmp_path / "checks.jsonl"))


def test_the_specs_add_in_the_order_the_kernels_do(rng):
    x = rng.standard_normal(2 * WARMUP_BLOCK, dtype=np.float32)
    warp = x[:32].copy()
    for offset in (16, 8, 4, 2, 1):  # lane 0's value after each step of __shfl_down_sync
        warp[: 32 - offset] = fadd(warp[: 32 - offset], warp[offset:])
    assert warmups.spec_warp_sum(x)[0].view(np.uint32) == warp[0].view(np.uint32)
    sums = warmups.spec_warp_sum(x)
    block0 = fadd(fadd(fadd(sums[0], sums[1]), sums[2]), sums[3])
    assert warmups.spec_block_sum(x)[0].view(np.uint32) == np.float32(block0).view(np.uint32)
    assert np.allclose(warmups.spec_block_sum(x), x.reshape(-1, WARMUP_BLOCK).sum(axis=1), atol=1e-4)
    bias = rng.standard_normal(5, dtype=np.float32)
    assert (warmups.spec_add_bias(x[:20].reshape(4, 5), bias) == x[:20].reshape(4, 5) + bias).all()


@pytest.mark.parametrize("name", NAMES)
def test_the_worked_solutions_pass_and_a_stub_is_open(name, capsys):
    verdict = warmups.check(name, getattr(solutions, name))
    assert verdict and verdict.seconds < 4.0
    assert "correct - 5 problems" in capsys.readouterr().out

    def stub(cuda, out, x, n):
        raise NotImplementedError

    assert not warmups.check(name, stub)
    assert "not done yet - hint" in capsys.readouterr().out


def add_bias_no_guard(cuda, out, x, bias, n, C):
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    out[i] = fadd(x[i], bias[i % C])


def warp_sum_in_lane_order(cuda, out, x, n):
    """Lane 0 adds the 32 values one after another: the right sum, but not the shuffles' order of adds."""
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if i // 32 < n // 32 and i % 32 == 0:
        total = x[i]
        for lane in range(1, 32):
            total = fadd(total, x[i + lane])
        out[i // 32] = total


def warp_sum_lane_leaves_early(cuda, out, x, n):
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if i >= n or i % 32 == 31:
        return
    value = x[i]
    for offset in (16, 8, 4, 2, 1):
        value = fadd(value, (yield cuda.shfl_down_sync(value, offset)))
    if i % 32 == 0:
        out[i // 32] = value


def block_sum_without_the_barrier(cuda, out, x, n):
    sums = cuda.shared_array("sums", 4, "float32")
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    value = x[i]
    for offset in (16, 8, 4, 2, 1):
        value = fadd(value, (yield cuda.shfl_down_sync(value, offset)))
    if cuda.threadIdx.x % 32 == 0:
        sums[cuda.threadIdx.x // 32] = value
    if cuda.threadIdx.x == 0:
        out[cuda.blockIdx.x] = fadd(fadd(fadd(sums[0], sums[1]), sums[2]), sums[3])


@pytest.mark.parametrize("name, kernel, message", [
    ("add_bias", add_bias_no_guard, r"thread \d+ of block \d+: (read x|wrote out)\[\d+\], outside the array"),
    ("warp_sum", warp_sum_in_lane_order, r"elements of out differ from the spec's bits"),
    ("warp_sum", warp_sum_lane_leaves_early, r"lanes of warp \d+ wait at __shfl_sync while threads \d+"),
    ("block_sum", block_sum_without_the_barrier, r"race on shared memory sums\[\d\]"),
])
def test_the_mistakes_each_warm_up_teaches_are_named(name, kernel, message, capsys):
    verdict = warmups.check(name, kernel)
    out = capsys.readouterr().out
    assert not verdict and re.search(message, out), out


def test_warm_ups_have_no_cuda_form(capsys):
    verdict = warmups.check("add_bias", "out[0] = 1;")
    assert not verdict and verdict.status == "refused" and "no CUDA form" in capsys.readouterr().out


OFFSETS = [16, 8, 4, 2, 1]  # a learner's constant, as a list


def warp_sum_with_a_list_of_offsets(cuda, out, x, n):
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if i // 32 >= n // 32:
        return
    value = x[i]
    for offset in OFFSETS:
        value = fadd(value, (yield cuda.shfl_down_sync(value, offset)))
    if i % 32 == 0:
        out[i // 32] = value


SEEN = []


def warp_sum_passing_values_through_a_list(cuda, out, x, n):
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if i < n:
        SEEN.append(x[i])  # threads would share values outside the arrays: the list arrives as a tuple


def test_constant_lists_arrive_as_tuples(capsys):
    assert warmups.check("warp_sum", warp_sum_with_a_list_of_offsets), capsys.readouterr().out
    verdict = warmups.check("warp_sum", warp_sum_passing_values_through_a_list)
    assert not verdict and "has no attribute 'append'" in capsys.readouterr().out
