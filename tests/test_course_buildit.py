"""Build-it checks: the worked solutions pass, open exercises say so, wrong kernels fail with their picture."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import solutions.perthread as solutions
from gpt2enc_edu.course import buildit, grid, skeletons
from gpt2enc_edu.course.grid import fadd, load128, round_to_storage, store128, to_float, to_storage_nearest
from gpt2enc_edu.layout import pack_size
from gpt2enc_edu.loader import kernel_dir, kernel_source
from gpt2enc_edu.rounding import NOISE_STREAM_DWPE

SOLUTIONS = {"forward": solutions.encoder_forward, "atomic": solutions.encoder_backward_atomic_fp32,
             "wpe": solutions.encoder_backward_wpe, "wte_bucketed": solutions.encoder_backward_wte_bucketed}
CUDA_SOLUTIONS = Path(__file__).resolve().parent.parent / "solutions" / "cuda"
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)


@pytest.mark.parametrize("exercise", sorted(SOLUTIONS))
def test_per_thread_solution_passes(exercise, capsys):
    assert buildit.check(exercise, SOLUTIONS[exercise])
    assert "correct - " in capsys.readouterr().out


@pytest.mark.parametrize("exercise", sorted(SOLUTIONS))
def test_open_exercise_is_not_done(exercise, capsys):
    def stub(cuda, *args):
        raise NotImplementedError

    assert not buildit.check(exercise, stub)
    assert not buildit.check(exercise, skeletons.skeleton(exercise))
    out = capsys.readouterr().out
    assert out.count("not done yet - hint") == 2


def test_a_learners_own_bug_is_not_hidden():
    def buggy(cuda, *args):
        return 1 // 0

    with pytest.raises(ZeroDivisionError):
        buildit.check("forward", buggy)


# ------------------------------------------------------------------------------------------------------
# Wrong kernels, each with the mistake a learner makes.
def forward_wrong_row(cuda, out, inp, wte, wpe, B, T, C):
    """Reads wpe[b] instead of wpe[t]."""
    size = pack_size(wte.dtype)
    idx = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * size
    if idx >= B * T * C:
        return
    b, t, c = idx // (T * C), idx // C % T, idx % C
    total = fadd(to_float(load128(wte, int(inp[b * T + t]) * C + c)), to_float(load128(wpe, b * C + c)))
    store128(out, idx, to_storage_nearest(total, out.dtype))


def forward_misses_the_last_pack(cuda, out, inp, wte, wpe, B, T, C):
    size = pack_size(wte.dtype)
    idx = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * size
    if idx >= B * T * C - size:
        return
    solutions.encoder_forward(cuda, out, inp, wte, wpe, B, T, C)


def wpe_round_to_nearest(cuda, dwpe, dout, B, T, C, seed):
    """Rounds the sum to nearest instead of stochastically."""
    idx = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * pack_size(dout.dtype)
    if idx >= T * C:
        return
    accum = np.zeros(pack_size(dout.dtype), dtype=np.float32)
    for b in range(B):
        accum = fadd(accum, to_float(load128(dout, b * T * C + idx)))
    store128(dwpe, idx, to_storage_nearest(fadd(accum, to_float(load128(dwpe, idx))), dwpe.dtype))


def wpe_old_value_first(cuda, dwpe, dout, B, T, C, seed):
    """Starts the sum from the old value: a different order of adds, so different bits."""
    size = pack_size(dout.dtype)
    idx = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * size
    if idx >= T * C:
        return
    accum = to_float(load128(dwpe, idx))
    for b in range(B):
        accum = fadd(accum, to_float(load128(dout, b * T * C + idx)))
    store128(dwpe, idx, round_to_storage(accum, dwpe.dtype, idx + np.arange(size), NOISE_STREAM_DWPE, seed))


def wte_returns_before_the_barrier(cuda, dwte, bucket_info, bt_list, dout, num_buckets, C, seed):
    lane = cuda.threadIdx.x % 32
    start, count, ix, group = (int(v) for v in bucket_info[4 * cuda.blockIdx.x : 4 * cuda.blockIdx.x + 4])
    if group * 32 * pack_size(dout.dtype) + lane * pack_size(dout.dtype) >= C:
        return  # lanes without channels leave early: the others wait at the barrier forever
    yield from solutions.encoder_backward_wte_bucketed(cuda, dwte, bucket_info, bt_list, dout, num_buckets, C, seed)


def atomic_forgets_dwpe(cuda, dwte32, dwpe32, dout, inp, B, T, C):
    size = pack_size(dout.dtype)
    idx = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * size
    if idx >= B * T * C:
        return
    for k in range(size):
        cuda.atomic_add(dwte32, int(inp[idx // C]) * C + idx % C + k, to_float(dout[idx + k]))


def atomic_without_atomics(cuda, dwte32, dwpe32, dout, inp, B, T, C):
    idx = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * pack_size(dout.dtype)
    if idx < B * T * C:
        dwte32[int(inp[idx // C]) * C + idx % C] += to_float(dout[idx])


WRONG = [
    pytest.param("forward", forward_wrong_row, True, id="forward-wpe-row-b"),
    pytest.param("forward", forward_misses_the_last_pack, True, id="forward-last-pack"),
    pytest.param("wpe", wpe_round_to_nearest, True, id="wpe-nearest"),
    pytest.param("wpe", wpe_old_value_first, True, id="wpe-order"),
    pytest.param("wte_bucketed", wte_returns_before_the_barrier, False, id="wte-early-return"),
    pytest.param("atomic", atomic_forgets_dwpe, True, id="atomic-no-dwpe"),
    pytest.param("atomic", atomic_without_atomics, False, id="atomic-plain-add"),
]


@pytest.mark.parametrize("exercise, kernel, has_picture", WRONG)
def test_wrong_kernel_fails_with_its_picture(exercise, kernel, has_picture, capsys):
    verdict = buildit.check(exercise, kernel)
    out = capsys.readouterr().out
    assert not verdict and "FAILED on case" in out
    if not has_picture:  # a hazard: the message names the threads or the rule
        assert "returned before reaching it" in out or "atomic_add" in out
        return
    row, c = verdict.first_wrong
    assert verdict.wrong[row, c] and verdict.wrong.shape == verdict.expected.shape == verdict.block.shape
    assert "expected 0x" in out and ", got 0x" in out
    if exercise in ("forward", "wpe"):  # one owner per element: the picture names it
        assert verdict.block[row, c] >= 0 and f"block {verdict.block[row, c]}, thread {verdict.thread[row, c]}" in out
    import matplotlib

    matplotlib.use("Agg")
    assert verdict.show() is not None


def test_forward_poison_shows_unwritten_elements(capsys):
    verdict = buildit.check("forward", forward_misses_the_last_pack)
    row, c = verdict.first_wrong
    assert verdict.actual[row, c].view(np.uint16 if verdict.actual.itemsize == 2 else np.uint32) in (0x7F7F, 0x7F7F7F7F)


# ------------------------------------------------------------------------------------------------------
# Skeletons and the CUDA solutions.
@pytest.mark.parametrize("exercise", sorted(skeletons.KERNEL_EXERCISES))
def test_skeleton_keeps_the_file_but_not_the_body(exercise):
    spec = skeletons.KERNEL_EXERCISES[exercise]
    real, gap = kernel_source(spec.file), skeletons.skeleton(exercise)
    assert skeletons.GAP_MARK in gap and gap.splitlines()[0] == real.splitlines()[0]
    signature = real[real.index(spec.kernel) : real.index("{", real.index(spec.kernel))]
    assert signature in gap
    for line in ("round_to_storage(accum", "atomicAdd(dwte_ix", "store128(out", "__syncthreads();",
                 "atomic_add_bf16x2(dwte_ix"):
        assert line not in gap


@pytest.mark.parametrize("dtype_flag", ["", "-DENC_FP32"], ids=["bf16", "fp32"])
def test_cuda_solutions_and_skeletons_compile(tmp_path, dtype_flag):
    """The four filled-in solutions (one translation unit: their kernels and #defines do not clash), then the
    four skeletons, each compiled by nvcc as the package's headers see them."""
    if NVCC is None:
        if os.environ.get("CI"):
            pytest.fail("nvcc not found, but CI must compile the CUDA solutions")
        pytest.skip("nvcc not found")
    exercises = sorted(skeletons.KERNEL_EXERCISES)
    units = {"solutions": [skeletons.fill(e, (CUDA_SOLUTIONS / f"{e}.cu").read_text()) for e in exercises],
             "skeletons": [skeletons.skeleton(e) for e in exercises]}
    for name, sources in units.items():
        path = tmp_path / f"{name}.cu"
        path.write_text("\n".join(sources))
        cmd = [NVCC, "-arch=sm_90", "-std=c++17", "-Werror", "all-warnings", f"-I{kernel_dir()}", "-c", str(path),
               "-o", str(tmp_path / "k.o")]
        result = subprocess.run(cmd + ([dtype_flag] if dtype_flag else []), capture_output=True, text=True)
        assert result.returncode == 0, f"{name}: {result.stderr}"


@pytest.mark.gpu
@pytest.mark.parametrize("exercise", sorted(skeletons.KERNEL_EXERCISES))
def test_cuda_solution_passes_on_the_gpu_and_is_timed(exercise, capsys):
    verdict = buildit.check(exercise, (CUDA_SOLUTIONS / f"{exercise}.cu").read_text())
    out = capsys.readouterr().out
    assert verdict, out
    assert set(verdict.timings) == {"yours", "package"} and "your kernel" in out


@pytest.mark.gpu
@pytest.mark.parametrize("exercise", sorted(skeletons.KERNEL_EXERCISES))
def test_the_packages_own_kernel_file_passes_the_cuda_check(exercise):
    """Keeps buildit_cuda's launch shapes in step with the real kernels."""
    assert buildit.check(exercise, kernel_source(skeletons.KERNEL_EXERCISES[exercise].file), time_it=False)


@pytest.mark.gpu
def test_wrong_cuda_kernel_fails_with_its_picture(capsys):
    body = (CUDA_SOLUTIONS / "wpe.cu").read_text().replace("for (int b = 0; b < B; b++)", "for (int b = 1; b < B; b++)")
    verdict = buildit.check("wpe", body)
    assert not verdict and verdict.first_wrong is not None
    assert "expected 0x" in capsys.readouterr().out


@pytest.mark.gpu
def test_cuda_compile_error_is_reported(capsys):
    assert not buildit.check("forward", "int x = ;")
    assert "does not compile" in capsys.readouterr().out


def test_emulator_names_are_the_ones_the_solutions_use():
    assert grid.read_only and grid.launch


def test_cuda_form_without_a_gpu_says_so(capsys):
    from gpt2enc_edu.backend import gpu_status

    if gpu_status().name == "cuda":
        pytest.skip("a GPU is here: the gpu-marked tests cover the CUDA form")
    verdict = buildit.check("forward", (CUDA_SOLUTIONS / "forward.cu").read_text())
    assert not verdict and verdict.message == "no GPU"
    assert "needs a GPU" in capsys.readouterr().out
