# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 00 · Warm-ups: three small kernels, one thread at a time
#
# **Goal:** write three tiny GPU kernels as Python functions of *one thread*, the form every build-it of the
# course uses, and see how the checks grade them: a thread map for the data, a shuffle to exchange values
# within a warp, a barrier and shared memory to exchange them within a block.
#
# **Prerequisites:** Python and NumPy. What a CUDA kernel is: many *threads*, grouped in *blocks*, the blocks
# forming a *grid*; each thread knows `blockIdx.x`, `threadIdx.x` and `blockDim.x`. A **warp** is 32
# consecutive threads of a block that run one instruction together. No GPU needed.
#
# **After this notebook you can:**
# 1. turn a thread's block and thread index into the element it owns, and stop the threads past the end
#    (warm-up 1 checks it);
# 2. sum 32 values across a warp with `__shfl_down_sync`, and say why the order of the adds is part of the
#    answer (warm-up 2);
# 3. hand values from warps to one thread through shared memory, with the barrier that makes it safe
#    (warm-up 3);
# 4. read a failed check: the thread and the array it names, and its picture.
#
# **Time:** about 20 minutes, all of it core.
#
# 0. Setup · 1. A kernel as a function of one thread · 2. Warm-up 1: add a bias · 3. Warm-up 2: a warp's sum ·
# 4. Warm-up 3: a block's sum · 5. Which checks passed

# %%
import importlib.util, os, subprocess, sys
sys.path[:0] = [os.path.abspath("..")] if os.path.isdir("../gpt2enc_edu") else []  # a checkout: the folder above notebooks/
if importlib.util.find_spec("gpt2enc_edu") is None:  # Colab or Kaggle: pip-install it from the repository GPT2ENC_EDU_REPO names
    repo = os.environ.get("GPT2ENC_EDU_REPO") or sys.exit("gpt2enc_edu is not installed (notebooks/README.md). On Colab or Kaggle run `%env GPT2ENC_EDU_REPO=<owner>/gpt2enc-edu` (its GitHub repository), then this cell again.")
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", f"gpt2enc-edu[notebooks] @ git+https://github.com/{repo}"])
enc = importlib.import_module("gpt2enc_edu.course.hosted").setup()  # Colab or Kaggle: the CuPy for the runtime's CUDA

# %% [markdown]
# ## 1. A kernel as a function of one thread (core)
#
# A CUDA kernel is the code of *one* thread; the launch runs it for every thread of the grid. Here a kernel
# is a Python function `kernel(cuda, ...)`: `cuda.blockIdx.x`, `cuda.threadIdx.x` and `cuda.blockDim.x` say
# which thread it is, and the other arguments are the kernel's arguments, arrays flat like CUDA pointers.
# `gpt2enc_edu.course.grid` runs it over the grid as a GPU would: blocks and threads in a random order,
# every index checked, an input refused any write, and two threads touching one element with no barrier
# between them reported as a race, the way NVIDIA's compute-sanitizer reports it on a GPU.
#
# A copy kernel, launched on 300 elements with blocks of 128 threads: the grid has 384 threads, and this
# one forgets that the last 84 have no element.

# %%
import inspect

import numpy as np
from IPython.display import Markdown, display

from gpt2enc_edu.course import grid, verdict, warmups
from gpt2enc_edu.course.grid import fadd  # noqa: F401 (for your kernels: the GPU's fp32 add)


def copy(cuda, out, x):
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    out[i] = x[i]  # no bound: threads past the end read and write outside the arrays


try:
    grid.launch(copy, 3, 128, (np.zeros(300, np.float32), np.ones(300, np.float32)), writes={"out"})
except grid.KernelFault as fault:
    print(fault)
    verdict.draw_hazard(fault.picture, "copy")

# %% [markdown]
# The message names the thread (its block and its index in the block), the array and the index; the picture
# shows the failing block, one row per warp, one column per lane, with the thread that faulted in colour.
# The threads of a block run in a random order, so the thread named can differ from run to run.
#
# The checks below run your kernel the same way, but in a **separate process**, on problems drawn when the
# check runs (random sizes, so nothing can be recorded ahead), with the inputs checked unchanged afterwards
# and the expected bits computed only after your kernel has run. A check prints `not done yet` while your
# function still raises `NotImplementedError`, then `correct` or what went wrong.

# %% [markdown]
# ## 2. Warm-up 1: add a bias (core)
#
# **Goal:** `out[r, c] = x[r, c] + bias[c]` for an (R, C) array, one thread per element. The launch has
# blocks of 128 threads and rounds the grid up to whole blocks; your kernel gets `(cuda, out, x, bias, n, C)`
# with `n = R * C` and the arrays flat. Add with `fadd(a, b)`, the GPU's fp32 add: NumPy's float32 `+` keeps
# subnormals (values below 2⁻¹²⁶), while the kernels, compiled by CuPy with flush-to-zero, turn them into zero
# before and after the add; `fadd` does the same, so the bits agree even there. The NumPy spec (what the check
# compares with, bit for bit):

# %%
display(Markdown(f"```python\n{inspect.getsource(warmups.spec_add_bias)}```"))


# %%
def add_bias(cuda, out, x, bias, n, C):
    """Warm-up 1: one element per thread (about 4 lines). Add with fadd(a, b), the GPU's fp32 add."""
    raise NotImplementedError("write warm-up 1")


# %%
done = warmups.check_add_bias(add_bias)

# %% [markdown]
# ## 3. Warm-up 2: a warp's sum with shuffles (core)
#
# **Goal:** one warp per 32 values of `x`; lane 0 of warp `w` writes `out[w]`, the sum of
# `x[32w : 32w + 32]`. A warp's lanes can read each other's registers without memory: with
# `__shfl_down_sync(mask, value, offset)` lane `l` receives lane `l + offset`'s value. Here it is
# `value = yield cuda.shfl_down_sync(value, offset)`: the `yield` is where the thread waits for the other
# lanes of its warp (a function with `yield` is how a thread waits here; every lane must take part).
#
# Adding what comes down at offsets 16, 8, 4, 2 and 1 leaves the sum in lane 0 in five steps instead of 31.
# That order of adds is part of the answer: fp32 addition is not associative, so the sum of the same 32
# values in another order can differ in its last bits, and the check compares bits. The spec:

# %%
display(Markdown(f"```python\n{inspect.getsource(warmups.spec_warp_sum)}```"))


# %%
def warp_sum(cuda, out, x, n):
    """Warm-up 2: the warp of this thread sums 32 values with five shuffles down (about 9 lines)."""
    raise NotImplementedError("write warm-up 2")


# %%
done = warmups.check_warp_sum(warp_sum)

# %% [markdown]
# ## 4. Warm-up 3: a block's sum through shared memory (core)
#
# **Goal:** one block of 128 threads (4 warps) per 128 values; thread 0 of block `b` writes `out[b]`. Each warp sums
# its 32 values as in warm-up 2; lane 0 of each warp writes its sum into a **shared** array, which every thread of the
# block sees (`cuda.shared_array("sums", 4, "float32")`, CUDA's `__shared__ float sums[4]`); then thread 0 adds the
# four in warp order. Thread 0 reads what threads 32, 64 and 96 (lane 0 of warps 1 to 3) wrote, so a **barrier** must
# lie between the writes and the reads: `yield cuda.syncthreads()`, CUDA's `__syncthreads()`, which every thread of
# the block must reach. Without it the check reports a race. The shuffles of warm-up 2 needed no such barrier: a
# shuffle waits for the lanes of its own warp, and those are all it reads from; the four warps of a block, though,
# run independently of each other, so nothing orders one warp's write before another's read until a barrier does.
# This is the shape of llm.c's deterministic backward
# (notebook 03): warps sum, shared memory, a barrier, one warp combines. The spec:

# %%
display(Markdown(f"```python\n{inspect.getsource(warmups.spec_block_sum)}```"))


# %%
def block_sum(cuda, out, x, n):
    """Warm-up 3: warp sums, shared memory, a barrier, thread 0 adds (about 14 lines)."""
    raise NotImplementedError("write warm-up 3")


# %%
done = warmups.check_block_sum(block_sum)

# %% [markdown]
# Stuck? The hint printed with `not done yet` says where to start; worked solutions are in
# `solutions/warmups.py` (in the repository, outside the package). A failed check draws its picture with
# `warmups.check_block_sum(block_sum, show=True)`.
#
# ## 5. Which checks passed (core)
#
# Every graded check is recorded on this machine (`~/.gpt2enc_edu/checks.jsonl`, or the file
# `GPT2ENC_EDU_RECORD` names). `course.report()` lists them; `course.report(save="my_checks.json")` also
# writes the list to a file to hand in.

# %%
from gpt2enc_edu import course

rows = course.report()
