"""Build-it checks: the worked solutions pass quickly, open exercises say so, natural mistakes fail naming the
thread and the array (with a picture), and the CUDA path compiles and grades on the GPU.

Cheats are in ``test_course_grading.py``, the CUDA source rules in ``test_course_cudasource.py``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import solutions.perthread as solutions
from gpt2enc_edu.course import buildit, cudasource, grid, skeletons
from gpt2enc_edu.course.grid import fadd, load128, round_to_storage, store128, to_float, to_storage_nearest
from gpt2enc_edu.layout import WARP_SIZE, WTE_WARPS, pack_size
from gpt2enc_edu.loader import kernel_dir, kernel_source
from gpt2enc_edu.rounding import NOISE_STREAM_DWPE, NOISE_STREAM_DWTE

SOLUTIONS = {"forward": solutions.encoder_forward, "atomic": solutions.encoder_backward_atomic_fp32,
             "wpe": solutions.encoder_backward_wpe, "wte_bucketed": solutions.encoder_backward_wte_bucketed}
CUDA_SOLUTIONS = Path(__file__).resolve().parent.parent / "solutions" / "cuda"
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
#: The honest path's budget: 2 s for a graded per-thread check on an idle 2-core CPU; a loaded shared CI machine
#: gets twice that.
HONEST_SECONDS = 4.0


@pytest.fixture(autouse=True)
def _record(tmp_path, monkeypatch):
    """Checks record into a file of the test's own, not the user's home."""
    monkeypatch.setenv("GPT2ENC_EDU_RECORD", str(tmp_path / "checks.jsonl"))


@pytest.mark.parametrize("exercise", sorted(SOLUTIONS))
def test_per_thread_solution_passes_quickly(exercise, capsys):
    verdict = buildit.check(exercise, SOLUTIONS[exercise])
    out = capsys.readouterr().out
    assert verdict and "correct - " in out and "separate process" in out
    assert verdict.seconds < HONEST_SECONDS, f"the graded run took {verdict.seconds:.2f} s"


@pytest.mark.parametrize("exercise", sorted(SOLUTIONS))
def test_open_exercise_is_not_done(exercise, capsys):
    def stub(cuda, *args):
        """Build it."""
        raise NotImplementedError("write it")

    assert not buildit.check(exercise, stub)
    assert not buildit.check(exercise, skeletons.skeleton(exercise))
    assert not buildit.check(exercise, f"\n    {skeletons.GAP_MARK}\n    // my notes: __global__ means a kernel\n")
    out = capsys.readouterr().out
    assert out.count("not done yet - hint") == 3


def test_a_learners_own_bug_is_shown_with_their_line(capsys):
    def buggy(cuda, out, inp, wte, wpe, B, T, C):
        return 1 // 0

    verdict = buildit.check("forward", buggy)
    out = capsys.readouterr().out
    assert not verdict and "ZeroDivisionError" in out and "return 1 // 0" in out and "raised an error" in out


def _pack_of(cuda, size):
    """A learner's helper: the flat index of this thread's first element."""
    return (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * size


def _make_forward():
    import math

    def forward_in_my_own_style(cuda, out, inp, wte, wpe, B, T, C):
        """NumPy on whole packs, a helper, a closure constant, ``math`` and a print-free ``sum`` of a mask."""
        size = pack_size(wte.dtype)
        idx = _pack_of(cuda, size)
        if idx >= B * T * C or math.isnan(float(idx)):
            return
        b, rest = divmod(idx, T * C)
        t, c = divmod(rest, C)
        row = int(inp[b * T + t]) * C + c
        total = fadd(wte[row : row + size].astype(np.float32), wpe[t * C + c : t * C + c + size].astype(np.float32))
        assert np.sum(np.isnan(total)) <= size
        out[idx : idx + size] = total.astype(out.dtype)

    return forward_in_my_own_style


def test_an_honest_kernel_in_another_style_passes(capsys):
    assert buildit.check("forward", _make_forward()), capsys.readouterr().out


# ------------------------------------------------------------------------------------------------------
# Wrong results: the picture names the owning thread.
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
    t, c = idx // C % T, idx % C
    total = fadd(to_float(load128(wte, int(inp[idx // C]) * C + c)), to_float(load128(wpe, t * C + c)))
    store128(out, idx, to_storage_nearest(total, out.dtype))


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


def atomic_forgets_dwpe(cuda, dwte32, dwpe32, dout, inp, B, T, C):
    size = pack_size(dout.dtype)
    idx = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * size
    if idx >= B * T * C:
        return
    for k in range(size):
        cuda.atomic_add(dwte32, int(inp[idx // C]) * C + idx % C + k, to_float(dout[idx + k]))


WRONG = [
    pytest.param("forward", forward_wrong_row, id="forward-wpe-row-b"),
    pytest.param("forward", forward_misses_the_last_pack, id="forward-last-pack"),
    pytest.param("wpe", wpe_round_to_nearest, id="wpe-nearest"),
    pytest.param("wpe", wpe_old_value_first, id="wpe-order"),
    pytest.param("atomic", atomic_forgets_dwpe, id="atomic-no-dwpe"),
]


@pytest.mark.parametrize("exercise, kernel", WRONG)
def test_wrong_result_fails_with_its_picture(exercise, kernel, capsys):
    verdict = buildit.check(exercise, kernel)
    out = capsys.readouterr().out
    assert not verdict and "FAILED on case" in out and verdict.status == "failed"
    row, c = verdict.first_wrong
    assert verdict.wrong[row, c] and verdict.wrong.shape == verdict.expected.shape == verdict.block.shape
    assert "expected 0x" in out and ", got 0x" in out
    if exercise in ("forward", "wpe"):  # one owner per element: the picture names it
        assert verdict.block[row, c] >= 0 and f"block {verdict.block[row, c]}, thread {verdict.thread[row, c]}" in out
    import matplotlib

    matplotlib.use("Agg")
    assert verdict.show() is not None
    pytest.importorskip("matplotlib.pyplot").close("all")


def test_forward_poison_shows_unwritten_elements():
    verdict = buildit.check("forward", forward_misses_the_last_pack)
    row, c = verdict.first_wrong
    assert verdict.actual[row, c].view(np.uint16 if verdict.actual.itemsize == 2 else np.uint32) in (0x7F7F, 0x7F7F7F7F)


# ------------------------------------------------------------------------------------------------------
# Natural mistakes the emulator reports as a sanitizer would: the thread and the array named, and a picture.
def _wte_sum(cuda, bucket_info, bt_list, dout, C):
    """The bucketed kernel's first half (a helper of the learner's, sent with the kernel): this thread's partial."""
    size = pack_size(dout.dtype)
    start, count, ix, group = (int(v) for v in bucket_info[4 * cuda.blockIdx.x : 4 * cuda.blockIdx.x + 4])
    warp, lane = divmod(cuda.threadIdx.x, WARP_SIZE)
    c = group * WARP_SIZE * size + lane * size
    accum = np.zeros(size, dtype=np.float32)
    if c < C:
        for item in range(warp, count, WTE_WARPS):
            accum = fadd(accum, to_float(load128(dout, int(bt_list[start + item]) * C + c)))
    return accum, warp, lane, c, count, ix


def _wte_combine(cuda, dwte, shared, accum, lane, c, count, ix, C, seed, combiner):
    """The combine: warp ``combiner`` adds the other warps' partials, then the old value, and rounds."""
    size = accum.size
    total = accum
    for w in range(WTE_WARPS):
        if w != combiner and w < min(WTE_WARPS, count):
            total = fadd(total, shared[w, lane])
    element = ix * C + c + np.arange(size)
    store128(dwte, ix * C + c, round_to_storage(fadd(total, to_float(load128(dwte, ix * C + c))), dwte.dtype,
                                                element, NOISE_STREAM_DWTE, seed))


def wte_last_warp_combines_without_a_barrier(cuda, dwte, bucket_info, bt_list, dout, num_buckets, C, seed):
    shared = cuda.shared_array("partials", (WTE_WARPS, WARP_SIZE, pack_size(dout.dtype)), np.float32)
    accum, warp, lane, c, count, ix = _wte_sum(cuda, bucket_info, bt_list, dout, C)
    shared[warp, lane] = accum
    if warp == WTE_WARPS - 1 and c < C:  # no __syncthreads() before reading the others' partials
        _wte_combine(cuda, dwte, shared, accum, lane, c, count, ix, C, seed, WTE_WARPS - 1)


def wte_barrier_in_each_branch(cuda, dwte, bucket_info, bt_list, dout, num_buckets, C, seed):
    shared = cuda.shared_array("partials", (WTE_WARPS, WARP_SIZE, pack_size(dout.dtype)), np.float32)
    accum, warp, lane, c, count, ix = _wte_sum(cuda, bucket_info, bt_list, dout, C)
    shared[warp, lane] = accum
    if warp == 0:
        yield cuda.syncthreads()
        if c < C:
            _wte_combine(cuda, dwte, shared, accum, lane, c, count, ix, C, seed, 0)
    else:
        yield cuda.syncthreads()


def wte_returns_before_the_barrier(cuda, dwte, bucket_info, bt_list, dout, num_buckets, C, seed):
    shared = cuda.shared_array("partials", (WTE_WARPS, WARP_SIZE, pack_size(dout.dtype)), np.float32)
    accum, warp, lane, c, count, ix = _wte_sum(cuda, bucket_info, bt_list, dout, C)
    if c >= C:
        return  # lanes without channels leave early: the others wait at the barrier forever
    shared[warp, lane] = accum
    yield cuda.syncthreads()
    if warp == 0:
        _wte_combine(cuda, dwte, shared, accum, lane, c, count, ix, C, seed, 0)


def forward_writes_its_input(cuda, out, inp, wte, wpe, B, T, C):
    size = pack_size(wte.dtype)
    idx = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * size
    if idx >= B * T * C:
        return
    t, c = idx // C % T, idx % C
    total = fadd(to_float(load128(wte, int(inp[idx // C]) * C + c)), to_float(load128(wpe, t * C + c)))
    store128(wpe, t * C + c, to_storage_nearest(total, out.dtype))  # the wrong array: an input
    store128(out, idx, to_storage_nearest(total, out.dtype))


def forward_off_by_one_bound(cuda, out, inp, wte, wpe, B, T, C):
    size = pack_size(wte.dtype)
    idx = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * size
    if idx > B * T * C:  # > instead of >=: the first thread past the end goes on
        return
    t, c = idx // C % T, idx % C
    total = fadd(to_float(load128(wte, int(inp[idx // C]) * C + c)), to_float(load128(wpe, t * C + c)))
    store128(out, idx, to_storage_nearest(total, out.dtype))


def forward_misaligned_pack(cuda, out, inp, wte, wpe, B, T, C):
    size = pack_size(wte.dtype)
    idx = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * size
    if idx >= B * T * C:
        return
    t, c = idx // C % T, idx % C
    total = fadd(to_float(load128(wte, int(inp[idx // C]) * C + c)), to_float(load128(wpe, t * C + c + 1)))
    store128(out, idx, to_storage_nearest(total, out.dtype))


def wpe_threads_past_T_go_on(cuda, dwpe, dout, B, T, C, seed):
    """No bound: threads past the first T rows add into rows >= T (or read past dout's end)."""
    size = pack_size(dout.dtype)
    idx = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * size
    accum = np.zeros(size, dtype=np.float32)
    for b in range(B):
        accum = fadd(accum, to_float(load128(dout, b * T * C + idx)))
    value = fadd(accum, to_float(load128(dwpe, idx)))
    store128(dwpe, idx, round_to_storage(value, dwpe.dtype, idx + np.arange(size), NOISE_STREAM_DWPE, seed))


def atomic_without_atomics(cuda, dwte32, dwpe32, dout, inp, B, T, C):
    idx = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * pack_size(dout.dtype)
    if idx < B * T * C:
        dwte32[int(inp[idx // C]) * C + idx % C] += to_float(dout[idx])


MISTAKES = [
    pytest.param("wte_bucketed", wte_last_warp_combines_without_a_barrier,
                 r"race on shared memory partials\[\d+\]: thread \d+ of block \d+", id="last-warp-no-barrier"),
    pytest.param("wte_bucketed", wte_barrier_in_each_branch, r"different __syncthreads\(\) \(threads",
                 id="divergent-barriers"),
    pytest.param("wte_bucketed", wte_returns_before_the_barrier, "returned before reaching it", id="early-return"),
    pytest.param("forward", forward_writes_its_input, r"thread \d+ of block \d+: wrote into wpe, but it is an input",
                 id="writes-an-input"),
    pytest.param("forward", forward_off_by_one_bound, r"thread \d+ of block \d+: read inp\[\d+\], outside the array",
                 id="off-by-one-bound"),
    pytest.param("forward", forward_misaligned_pack, r"thread \d+ of block \d+: load128 of wpe at element \d+, not a "
                 "multiple", id="misaligned-load128"),
    pytest.param("wpe", wpe_threads_past_T_go_on, r"(thread \d+ of block \d+: (read|load128 of) (dout|dwpe)|elements "
                 "of dwpe differ)", id="threads-past-T"),
    pytest.param("atomic", atomic_without_atomics, r"thread \d+ of block \d+: wrote into dwte32, but many threads",
                 id="atomic-plain-add"),
]


@pytest.mark.parametrize("exercise, kernel, message", MISTAKES)
def test_natural_mistake_is_caught_naming_thread_and_array(exercise, kernel, message, capsys):
    import matplotlib

    matplotlib.use("Agg")
    for _ in range(2):  # whatever the problems and the order of the threads
        verdict = buildit.check(exercise, kernel)
        out = capsys.readouterr().out
        assert not verdict and "FAILED" in out
        assert re.search(message, out), out
        if verdict.fault:
            assert verdict.fault["roles"] and verdict.show() is not None
            pytest.importorskip("matplotlib.pyplot").close("all")


# ------------------------------------------------------------------------------------------------------
# Ways around the emulator's record: refused before the run, or caught in it.
def _one_thread_forward(out, inp, wte, wpe, B, T, C):
    """The whole forward in NumPy (what a kernel that skips the thread map would compute)."""
    rows = np.asarray(wte).reshape(-1, C)[np.asarray(inp).reshape(B, T)]
    total = fadd(to_float(rows), to_float(np.asarray(wpe).reshape(-1, C)[:T][None]))
    return to_storage_nearest(total, out.dtype).reshape(-1)


def forward_rewritable_view(cuda, out, inp, wte, wpe, B, T, C):
    if cuda.blockIdx.x == 0 and cuda.threadIdx.x == 0:
        view = np.asarray(out)
        view.flags["WRITEABLE"] = True
        view[:] = _one_thread_forward(out, inp, wte, wpe, B, T, C)


def forward_wipes_the_write_counts(cuda, out, inp, wte, wpe, B, T, C):
    if cuda.blockIdx.x == 0 and cuda.threadIdx.x == 0:
        out[:] = _one_thread_forward(out, inp, wte, wpe, B, T, C)
        grid.last_launch.written.clear()


def forward_forgets_its_fault(cuda, out, inp, wte, wpe, B, T, C):
    from gpt2enc_edu.course.grid import forget

    try:
        wte[wte.size + 5]
    except grid.KernelFault:
        forget()


def forward_keeps_state_in_a_module(cuda, out, inp, wte, wpe, B, T, C):
    np.sctypeDict["total"] = 0


def forward_reads_through_a_view(cuda, out, inp, wte, wpe, B, T, C):
    size = pack_size(wte.dtype)
    idx = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * size
    if idx < B * T * C:
        out[idx] = out.reshape(-1)[idx]


def block_sum_reads_shared_whole_without_a_barrier(cuda, out, x, n):
    sums = cuda.shared_array("sums", 4, "float32")
    value = x[cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x]
    for offset in (16, 8, 4, 2, 1):
        value = fadd(value, (yield cuda.shfl_down_sync(value, offset)))
    if cuda.threadIdx.x % 32 == 0:
        sums[cuda.threadIdx.x // 32] = value
    if cuda.threadIdx.x == 0:  # no __syncthreads(): warps 1-3 may not have written their sums yet
        out[cuda.blockIdx.x] = np.sum(np.asarray(sums))


@pytest.mark.parametrize(("check", "kernel", "message"), [
    ("forward", forward_rewritable_view, r"`\.flags` is not available|writes only into arrays it names"),
    ("forward", forward_wipes_the_write_counts, r"`\.last_launch` is not available"),
    ("forward", forward_forgets_its_fault, r"`forget` is not available"),
    ("forward", forward_keeps_state_in_a_module, "writes only into arrays it names"),
    ("forward", forward_reads_through_a_view, "made an array from out with an array method"),
    ("block_sum", block_sum_reads_shared_whole_without_a_barrier, r"race on shared memory sums\[\d\]"),
], ids=lambda v: getattr(v, "__name__", None) or "")
def test_a_kernel_cannot_go_around_the_record(check, kernel, message, capsys):
    import matplotlib

    from gpt2enc_edu.course import warmups

    matplotlib.use("Agg")
    verdict = (warmups.check if check in warmups.TITLES else buildit.check)(check, kernel)
    out = capsys.readouterr().out
    assert not verdict and re.search(message, out), out
    pytest.importorskip("matplotlib.pyplot").close("all")


@pytest.mark.parametrize(("label", "kernel"), [
    ("large vocabulary, wide rows", "ids as 8 bits"),
    ("NaN, Inf and subnormals", "NumPy's add"),
])
def test_the_cpu_cases_catch_kernels_right_only_on_small_tame_problems(label, kernel, capsys):
    """Ids kept in 8 bits, and an add without the GPU's flush-to-zero that clips non-finite values, pass every other
    case: the large-vocabulary and the special-values cases fail them."""
    verdict = buildit.check("forward", forward_8_bit_ids if kernel == "ids as 8 bits" else forward_plain_add)
    out = capsys.readouterr().out
    assert not verdict and f"FAILED on case '{label}'" in out, out


def forward_8_bit_ids(cuda, out, inp, wte, wpe, B, T, C):
    size = pack_size(wte.dtype)
    idx = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * size
    if idx < B * T * C:
        t, c, token = idx // C % T, idx % C, int(inp[idx // C]) % 256
        total = fadd(to_float(load128(wte, token * C + c)), to_float(load128(wpe, t * C + c)))
        store128(out, idx, to_storage_nearest(total, out.dtype))


def forward_plain_add(cuda, out, inp, wte, wpe, B, T, C):
    size = pack_size(wte.dtype)
    idx = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * size
    if idx < B * T * C:
        t, c, token = idx // C % T, idx % C, int(inp[idx // C])
        total = to_float(load128(wte, token * C + c)) + to_float(load128(wpe, t * C + c))
        store128(out, idx, to_storage_nearest(np.clip(np.nan_to_num(total), -1e30, 1e30), out.dtype))


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
    units = {"solutions": [cudasource.fill(e, (CUDA_SOLUTIONS / f"{e}.cu").read_text()) for e in exercises],
             "skeletons": [skeletons.skeleton(e) for e in exercises]}
    for name, sources in units.items():
        path = tmp_path / f"{name}.cu"
        path.write_text("\n".join(sources))
        cmd = [NVCC, "-arch=sm_90", "-std=c++17", "-Werror", "all-warnings", f"-I{kernel_dir()}", "-c", str(path),
               "-o", str(tmp_path / "k.o")]
        result = subprocess.run(cmd + ([dtype_flag] if dtype_flag else []), capture_output=True, text=True)
        assert result.returncode == 0, f"{name}: {result.stderr}"


def test_cuda_form_without_a_gpu_says_so(capsys):
    """A body written below the kept marker line is graded (the marker is a comment): here, without a GPU, the
    grading process says it needs one."""
    from gpt2enc_edu.backend import gpu_status

    if gpu_status().name == "cuda":
        pytest.skip("a GPU is here: the gpu-marked tests cover the CUDA form")
    body = f"\n    {skeletons.GAP_MARK}\n" + (CUDA_SOLUTIONS / "forward.cu").read_text()
    verdict = buildit.check("forward", body)
    assert not verdict and verdict.message == "no GPU"
    assert "needs a GPU" in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.parametrize("exercise", sorted(skeletons.KERNEL_EXERCISES))
def test_cuda_solution_passes_on_the_gpu_and_is_timed(exercise, capsys):
    body = f"\n    {skeletons.GAP_MARK}\n" + (CUDA_SOLUTIONS / f"{exercise}.cu").read_text()  # code below the marker
    verdict = buildit.check(exercise, body)
    out = capsys.readouterr().out
    assert verdict, out
    assert set(verdict.timings) == {"yours", "package"} and "your kernel" in out
    assert "GPT-2 size" in verdict.detail


@pytest.mark.gpu
def test_a_graded_cuda_check_takes_under_ten_seconds():
    verdict = buildit.check("wte_bucketed", (CUDA_SOLUTIONS / "wte_bucketed.cu").read_text(), time_it=False)
    assert verdict and verdict.seconds < 10.0, f"the graded CUDA run took {verdict.seconds:.1f} s"


@pytest.mark.gpu
@pytest.mark.parametrize("exercise", sorted(skeletons.KERNEL_EXERCISES))
def test_the_launch_shapes_match_the_packages_kernels(exercise):
    """The grading runner launches the package's own kernel files like the package does (bits of the mirror)."""
    from gpt2enc_edu.course import buildit_cuda
    from gpt2enc_edu.course.specs import fresh_rng

    exercise_ = buildit.BuildIt(exercise)
    runner = buildit_cuda.Runner.create(exercise, kernel_source(skeletons.KERNEL_EXERCISES[exercise].file))
    for case in exercise_.cases(fresh_rng(), gpu=True):
        got = runner.run({name: a.copy() for name, a in case.arrays.items()}, case.scalars)
        assert exercise_.compare(case, got) is None, case.label


@pytest.mark.gpu
def test_wrong_cuda_kernel_fails_with_its_picture(capsys):
    body = (CUDA_SOLUTIONS / "wpe.cu").read_text().replace("for (int b = 0; b < B; b++)", "for (int b = 1; b < B; b++)")
    verdict = buildit.check("wpe", body)
    assert not verdict and verdict.first_wrong is not None
    assert "expected 0x" in capsys.readouterr().out


@pytest.mark.gpu
def test_a_cuda_kernel_right_only_at_small_shapes_fails_at_gpt2_size():
    body = "    if (C == 768) { return; }\n" + (CUDA_SOLUTIONS / "forward.cu").read_text()
    verdict = buildit.check("forward", body, time_it=False)
    assert not verdict and "GPT-2 size" in verdict.case


@pytest.mark.gpu
def test_a_cuda_kernel_that_writes_its_input_fails():
    body = "    const_cast<floatX*>(wpe)[0] = (floatX)0.0f;\n" + (CUDA_SOLUTIONS / "forward.cu").read_text()
    verdict = buildit.check("forward", body, time_it=False)
    assert not verdict and "changed its input wpe" in verdict.message


@pytest.mark.gpu
def test_cuda_compile_error_points_at_the_learners_line(capsys):
    assert not buildit.check("forward", "\n    int idx = 0;\n    int x = ;\n")
    out = capsys.readouterr().out
    assert "does not compile" in out and "your line 3" in out


def test_emulator_names_are_the_ones_the_solutions_use():
    assert grid.read_only and grid.launch and grid.RaceHazard
