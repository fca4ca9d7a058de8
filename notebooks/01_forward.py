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
# # 01 · The encoder forward pass
#
# **Goal:** know what GPT-2's encoder computes, how each CUDA thread finds the elements it owns, why it
# moves them 128 bits at a time, and check the kernel's result against a float64 reference, on the GPU
# if this machine has one and in the bit-exact NumPy mirror if it does not.
#
# **Prerequisites:** Python and NumPy; what a CUDA kernel is: many *threads*, grouped in *blocks* of up to
# 1024 (here 256), the blocks forming a *grid*; each thread knows its `blockIdx.x` and `threadIdx.x`. One
# more word: a **warp** is 32 consecutive threads of a block that the GPU runs together, one instruction
# for all 32 at once, so their memory requests are served together too. No GPU needed.
#
# **After this notebook you can:**
# 1. say which output elements a thread of the kernel owns, and which thread owns a given element
#    (Exercise 1 checks it);
# 2. write the forward as a Python function of one thread that gives the GPU's bits (the build-it checks it);
# 3. say why the kernel moves 128 bits at a time, and which two rules on its inputs that costs;
# 4. check a result against a float64 reference within one rounding.
#
# **Time:** about 25 minutes for the core sections; the sections marked *(optional)* add about 15, and
# the CUDA build-it at the end (with a GPU) about 20.
#
# 0. Setup · 1. What the encoder computes · 2. Which thread computes what · 3. Why 128-bit packs · 4. The kernel ·
# 5. Run it and check it · 6. (optional) llm.c does it this way · 7. (optional) Three versions, measured ·
# 8. Exercise 1 · (optional) Build it in CUDA

# %%
import importlib.util, os, subprocess, sys
sys.path[:0] = [os.path.abspath("..")] if os.path.isdir("../gpt2enc_edu") else []  # a checkout: the folder above notebooks/
if importlib.util.find_spec("gpt2enc_edu") is None:  # Colab or Kaggle: pip-install it from the repository GPT2ENC_EDU_REPO names
    repo = os.environ.get("GPT2ENC_EDU_REPO") or sys.exit("gpt2enc_edu is not installed (notebooks/README.md). On Colab or Kaggle run `%env GPT2ENC_EDU_REPO=<owner>/gpt2enc-edu` (its GitHub repository), then this cell again.")
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", f"gpt2enc-edu[notebooks] @ git+https://github.com/{repo}"])
enc = importlib.import_module("gpt2enc_edu.course.hosted").setup()  # Colab or Kaggle: the CuPy for the runtime's CUDA

# %% [markdown]
# Which backend runs the kernels, and why: `array_module()` returns CuPy when a CUDA GPU is usable (then
# the CUDA kernels in `kernels/` run) and NumPy otherwise (then the NumPy mirror runs: the same index math
# and the same float32 operations, in the same order). `GPT2ENC_BACKEND=numpy` forces the mirror.

# %%
import dataclasses
import inspect

import numpy as np
from IPython.display import Markdown, display

from gpt2enc_edu import compare, layout, mirror, reference
from gpt2enc_edu.course import exercises, plots
from gpt2enc_edu.problems import random_problem

xp = enc.array_module()
print("arrays:", xp.__name__, "->", "the CUDA kernels" if xp is not np else "the NumPy mirror")
print("gpu_status():", enc.gpu_status())

# %% [markdown]
# ## 1. What the encoder computes (core)
#
# The first layer of GPT-2 turns token ids into vectors. For every sequence `b` of the batch and every
# position `t`:
#
# $$\text{out}[b, t, :] = \text{wte}[\,\text{inp}[b, t], :\,] + \text{wpe}[t, :]$$
#
# `wte` (V × C) holds one row per token of the vocabulary, `wpe` (maxT × C) one row per position. For
# GPT-2 small V = 50257, maxT = 1024, C = 768. There is one addition per output element and nothing else:
# the kernel's whole job is moving bytes well.
#
# A tiny example you can check by eye: `wte[v, c] = 100·v + 10·c` and `wpe[t, c] = t`, so in the output
# the hundreds are the token, the tens the channel and the units the position.

# %%
# NBVAL_CHECK_OUTPUT
V, maxT, C = 5, 3, 4
inp = np.array([[3, 0, 3], [1, 4, 2]], dtype=np.int32)  # B = 2 sequences of T = 3 tokens
wte = (100 * np.arange(V)[:, None] + 10 * np.arange(C)).astype(np.float32)
wpe = np.repeat(np.arange(maxT, dtype=np.float32)[:, None], C, axis=1)
out = enc.encoder_forward(xp.asarray(inp), xp.asarray(wte), xp.asarray(wpe))
print(enc.backend.to_numpy(out))

# %% [markdown]
# ## 2. Which thread computes what (core)
#
# The kernel in its plainest fast form (version 2 of section 7: llm.c's thread map and packs; it caches `wpe` where
# llm.c streams it, section 6) starts one thread per **128-bit pack** of the output: 8 bf16 values or 4 fp32
# values. This section, the build-it and Exercise 1 use this thread map; `encoder_forward` launches version 3, a
# different map with the same bits (section 7).
# Thread number `i` (that is `blockIdx.x * blockDim.x + threadIdx.x`) owns the pack that starts at flat
# element `idx = i * x128::size` of the (B, T, C) output, and recovers its coordinates with three divisions:
#
# ```c
# int bt = idx / C;   // which (b, t) row
# int b = bt / T;
# int t = bt % T;
# int c = idx % C;    // first channel of the pack
# ```
#
# The picture colours each element of a small B = 2, T = 3, C = 16 output by the thread that owns it.
# Because C is a multiple of the pack width, a pack never straddles two rows: every thread needs exactly
# one token id.

# %%
ax = plots.thread_map(2, 3, 16, enc.bfloat16)
ax = plots.thread_map(2, 3, 16, np.float32)

# %% [markdown]
# *Figure: two grids of a B=2, T=3, C=16 output, one row per (b, t), coloured and labelled by the owning thread: 8
# elements per thread in bf16, 4 in fp32.*
#
# The same arithmetic for one thread, by hand:

# %%
# NBVAL_CHECK_OUTPUT
B, T, C = 2, 3, 16
size = layout.pack_size(enc.bfloat16)
for thread in (0, 5, 11):
    idx = thread * size
    bt = idx // C
    print(f"thread {thread:2d}: idx = {idx:2d}, bt = {bt}, b = {bt // T}, t = {bt % T}, c = {idx % C}")

# %% [markdown]
# ## 3. Why 128-bit packs (core)
#
# The encoder does one addition per 6 bytes it moves (bf16: read 2 from `wte`, 2 from `wpe`, write 2), so
# it is limited by memory, never by arithmetic. The memory system serves whole 32-byte sectors and
# 128-byte cache lines. When the 32 threads of a warp each load 16 consecutive bytes, one instruction
# covers 512 contiguous bytes: four full cache lines. With 2-byte loads the same bytes would need eight
# instructions, eight times the index math, and eight times as many requests to keep the same bytes in flight.
#
# The price is two rules, which the package checks before launching anything: C must be a multiple of the
# pack width, so that no pack straddles two rows, and arrays must start on a 16-byte boundary, since a 128-bit load
# or store must have an address divisible by 16 (the GPU faults on any other).

# %%
# NBVAL_CHECK_OUTPUT
B, T, C = 8, 1024, 768  # one GPT-2 small micro-batch
for dtype in (enc.bfloat16, np.float32):
    size = layout.pack_size(dtype)
    threads = B * T * C // size
    blocks = -(-threads // layout.BLOCK_SIZE)
    megabytes = 3 * B * T * C * np.dtype(dtype).itemsize / 1e6
    print(f"{layout.dtype_name(dtype)}: {size} per pack, {threads:,} threads in {blocks:,} blocks of "
          f"{layout.BLOCK_SIZE}, at most {megabytes:.1f} MB moved for {B * T * C:,} additions")

# %%
# NBVAL_CHECK_OUTPUT
bad_wte = xp.asarray(np.ones((5, 12), dtype=enc.bfloat16))  # C = 12 is not a multiple of 8
bad_wpe = xp.asarray(np.ones((3, 12), dtype=enc.bfloat16))
try:
    enc.encoder_forward(xp.asarray(np.zeros((1, 2), dtype=np.int32)), bad_wte, bad_wpe)
except ValueError as err:
    print("refused:", err)

# %% [markdown]
# ### Build it first: the kernel as a Python function of one thread (core)
#
# Before reading the CUDA, write the kernel yourself, in Python: a function of **one thread** that
# `gpt2enc_edu.course.grid` runs over the whole grid as a GPU would, with the real kernel's launch shape
# (blocks of 256 threads, one thread per 128-bit pack). Your function gets `cuda` (`cuda.blockIdx.x`,
# `cuda.threadIdx.x`, `cuda.blockDim.x`) and the kernel's arguments, the arrays flat like CUDA pointers.
# `load128(array, start)` and `store128(array, start, pack)` move one 128-bit pack (a small NumPy array),
# `fadd` adds in fp32 exactly as the GPU does, `to_float` and `to_storage_nearest(value, dtype)` convert.
#
# The check draws fresh problems each time (random shapes and ids, B = 1 with T < maxT, odd sizes, one token
# hundreds of times, all ids distinct), runs your kernel, and compares its bits with the mirror's. A wrong
# element is named with its expected and actual bits and drawn on the thread map. No GPU needed.
#
# The package's own per-thread form opens in the cell after the check once your kernel passes (or when you
# ask for it there). Worked solution: `solutions/perthread.py` (in the repository, outside the package).

# %%
from gpt2enc_edu.course import buildit, perthread, skeletons
from gpt2enc_edu.course.grid import fadd, load128, store128, to_float, to_storage_nearest  # noqa: F401 (for your kernel)


def my_forward(cuda, out, inp, wte, wpe, B, T, C):
    """Build it: the forward kernel, one thread (about 12 lines)."""
    raise NotImplementedError("write the forward kernel for one thread")


# %%
verdict = buildit.check_forward(my_forward)
verdict.show()

# %% [markdown]
# The package's per-thread form (`gpt2enc_edu/course/perthread.py`) reads line for line like version 2 of
# the CUDA kernel. It opens here once your kernel passed (`unlocked=True` opens it now):

# %%
from gpt2enc_edu.course import reveal

reveal.perthread("forward", unlocked=verdict)

# %% [markdown]
# Whichever you read, yours or the package's, it gives the mirror's bits:

# %%
small = random_problem(2, 5, 16, 11, maxT=7, rng=np.random.default_rng(3))
out_per_thread = np.zeros((small.B, small.T, small.C), dtype=small.dtype)
out_mirror = np.zeros_like(out_per_thread)
perthread.launch_forward(perthread.encoder_forward, out_per_thread, small.inp, small.wte, small.wpe)
mirror.encoder_forward(out_mirror, small.inp, small.wte, small.wpe, small.B, small.T, small.C)
print("per-thread Python == NumPy mirror, bit for bit:", compare.bitwise_equal(out_per_thread, out_mirror))

# %% [markdown]
# ## 4. The kernel (core)
#
# Which rows does the forward read, and how often? Every position reads one `wte` row and one `wpe` row.
# A `wpe` row is read B times (once per sequence). A `wte` row is read as often as its token occurs, and
# in real text that is far from once: in one GPT-2 micro-batch of the package's real token sample
# (B = 8, T = 1024), the newline and space tokens' rows (ids 198 and 220) are read hundreds of times.

# %%
# NBVAL_CHECK_OUTPUT
from gpt2enc_edu import tokens

for seed in range(4):
    reads = np.bincount(tokens.make_ids("real", 8, 1024, seed=seed).ravel())
    top = np.argsort(-reads, kind="stable")[:3]
    print(f"batch {seed}: {np.count_nonzero(reads):,} distinct wte rows for 8,192 positions; most read: "
          + ", ".join(f"row {r} x {reads[r]}" for r in top))

# %% [markdown]
# The kernel lives in `kernels/encoder_forward.cu`, which holds three versions of it (section 7 times
# them); sections 2 and 3 described **version 2**, one thread per pack, which is also the CUDA build-it at
# the end: the file opens after that build-it, so that writing it is not retyping it. What to look for
# then: the thread map of section 2; the cache hints (`load128cs` is a *streaming*, "evict first" load, for
# data that will not be read again; plain `load128` lets the line stay in L2 (the GPU's last-level cache, in
# front of its memory), which suits the `wpe` row every sequence reads; version 2 streams `wte` and caches `wpe`,
# and version 3, the one the package launches, loads both plainly, so that a frequent token's `wte` row can stay in
# L2 too); the sum in fp32, rounded to nearest into the storage type.
#
# The NumPy mirror does the same with one array row per thread (`np.arange` plays `threadIdx`) and one
# column per element of the pack:

# %%
display(Markdown(f"```python\n{inspect.getsource(mirror.encoder_forward)}\n```"))

# %% [markdown]
# ## 5. Run it and check it (core)
#
# A GPT-2-sized problem with random embeddings (seeded, so both backends see the same numbers). The result is compared
# with `reference.forward`, which computes in float64: the difference may not exceed `compare.error_bound`, one rounding
# of the fp32 sum to the storage type. The bound is `(terms × 2⁻²³ + ε) × magnitude`: `magnitude` is the float64 sum of
# the absolute values that were added, each of the `terms` fp32 adds may round by 2⁻²³ of it, and ε is one ULP of the
# storage type at 1 (2⁻⁷ for bf16, 2⁻²³ for fp32), a whole ULP so that a stochastic rounding (notebook 04) fits as well
# as a rounding to nearest. A tiny absolute term per add (`compare.FTZ_FLOOR_PER_TERM`) lets subnormals be flushed to
# zero. The backward's checks use the same bound for every row, with `terms` the most terms any row's sum holds
# (`max_terms`: its adds and the old value they start from); for bf16 atomics (`rounding_per_add=True`) each add may
# round by ε instead of 2⁻²³, since every add rounds to bf16.

# %%
B, T, C, V = 8, 1024, 768, 50257
problems = {}
for name, dtype in (("bf16", enc.bfloat16), ("fp32", np.float32)):  # the forward needs no gradients: drop them
    p = random_problem(B, T, C, V, dtype=dtype, ids="real", rng=np.random.default_rng(1))
    problems[name] = dataclasses.replace(p, dout=None, dwte=None, dwpe=None)
outputs = {}
for name, p in problems.items():  # no copies on the CPU (xp.asarray of a NumPy array is the array)
    outputs[name] = enc.encoder_forward(xp.asarray(p.inp), xp.asarray(p.wte), xp.asarray(p.wpe))
print(enc.last_backend())

# %% [markdown]
# The checks. `checksum` fingerprints the bits of each result; it is the same on the GPU and in the CPU
# mirror (this cell's stored output comes from a GPU run, and the test suite re-runs it on a CPU).
# `bitwise_equal` compares with the mirror directly (on a machine without a GPU that compares the mirror
# with itself). The float64 reference is computed on the rows the batch uses (`rows`, with the ids
# renumbered into them): the whole table in float64 would be 300 MB and teach nothing more.

# %%
# NBVAL_CHECK_OUTPUT
for name, p in problems.items():
    rows, compact = np.unique(p.inp, return_inverse=True)
    compact = compact.reshape(p.inp.shape)
    ref = reference.forward(compact, p.wte[rows], p.wpe)
    magnitude = reference.forward(compact, np.abs(p.wte[rows].astype(np.float64)), np.abs(p.wpe.astype(np.float64)))
    bound = compare.error_bound(p.dtype, magnitude, terms=1)
    print(f"{name}: checksum {compare.checksum(outputs[name])}, "
          f"within the bound of the float64 reference: {compare.within_bound(outputs[name], ref, bound)}, "
          f"bitwise equal to the NumPy mirror: {compare.bitwise_equal(outputs[name], enc.encoder_forward(p.inp, p.wte, p.wpe))}")

# %% [markdown]
# One fp32 add rounded to nearest leaves a kernel no freedom: any kernel that computes it, with the same flush of
# subnormals to zero, gives these bits. That is why this forward is also bitwise equal to llm.c's own on the same
# inputs (section 6 says where that was compared).
#
# ## 6. (optional) llm.c does it this way
#
# This kernel grew from llm.c's `encoder_forward_kernel3` in
# [`llmc/encoder.cuh`](https://github.com/karpathy/llm.c/blob/master/llmc/encoder.cuh): the same thread
# map, the same 128-bit packs, the same fp32 add rounded to nearest. Two differences, and what follows:
#
# * **Cache hints.** llm.c loads *both* the `wte` and the `wpe` pack with `load128cs` (streaming, evict
#   first). Version 2 here streams `wte` and caches `wpe`, which every sequence reads again; version 3
#   loads both plainly, and each `wpe` pack once per thread, reused from registers for up to 8 sequences. Stores take
#   hints too; version 3 stores plainly, since a streaming store measured no faster (`docs/experiments.md`).
#   A hint cannot change a result, only where lines live in L2.
# * **The package's fastest forward is version 3** (section 7), a different thread map; llm.c's kernel has version
#   2's thread map and packs, with its own cache hints (above).
#
# What follows from the same arithmetic (one fp32 add, one rounding to nearest): on the same inputs the outputs are
# **bitwise equal** to llm.c's, as a comparison on an H200 found (B = 64, uniform and Zipf ids, llm.c commit
# `f1e2ace6`). No cell draws llm.c's timings: no recorded llm.c run is kept for a cell to read them from
# (`docs/experiments.md`, "Against llm.c", describes the comparisons made and when; notebook 03, section 7, quotes the
# backward's). Section 7 measures version 2, llm.c's thread map and packs. llm.c's forward needs only the ids on the
# GPU; its backward also takes them on the host (notebook 03).
#
# ## 7. (optional) Three versions, measured
#
# In the style of llm.c's `dev/cuda/` files: the same operation written three times, each a small step
# from the one before, each checked (bitwise equal to version 3, the one the package launches) and timed.
#
# * **version 1**: one element per thread, 2-byte loads and stores (bf16);
# * **version 2**: one 128-bit pack per thread (sections 2-4; llm.c's thread map and packs);
# * **version 3**: one pack column of one position per thread, for up to 8 sequences: the `wpe` pack is
#   loaded once, 8 `wte` loads are in flight at once.
#
# On a GPU the cell below measures them now (B = 8 and 64, real ids, median of repeated runs); on a CPU it
# draws the committed numbers (`docs/walkthrough/forward_versions.json`; the line above the figure names the card).
# The dashed line is the memory floor: the minimal bytes (notebook 05) over the measured copy rate.

# %%
from gpt2enc_edu.course import measured, timing_plots

forward_times = measured.forward_versions(xp)
print(forward_times["source"] if forward_times else "no GPU here and no committed numbers in docs/walkthrough/")
ax = timing_plots.forward_versions(forward_times)


# %% [markdown]
# *Figure: time per call of forward versions 1, 2 and 3 at two batch sizes, with the memory floor.*
# Packs are not a style choice: version 1 issues eight times as many memory instructions for the same
# bytes, and it shows. The step from version 2 to 3 is smaller: both move whole cache lines; version 3 keeps
# more loads in flight per thread and reads `wpe` once.

# %% [markdown]
# ## 8. Exercise 1: which thread writes `out[b, t, c]`? (core)
#
# "Which thread computes what" went from a thread to its elements. Go the other way: write `element_to_thread(b, t, c,
# T, C, dtype)` that returns, for arrays `b`, `t`, `c` (NumPy or CuPy), the number of the thread that writes `out[b,
# t, c]` and the place `k` (0 ≤ k < pack width) of that element in the thread's pack.
#
# *Hint:* compute the element's flat index in the (B, T, C) output first. `layout.pack_size(dtype)` gives
# the pack width. Is B needed? The check cell below prints "not done yet" until the stub is filled in;
# `solutions/exercises.py` (in the repository, outside the package) has a worked solution. After it comes
# the CUDA build-it exercise.

# %%
def element_to_thread(b, t, c, T, C, dtype):
    """Exercise 1: return (thread, k) for every element (b, t, c)."""
    raise NotImplementedError("Exercise 1: compute the thread and the place in its pack of out[b, t, c]")


# %%
done = exercises.check_element_to_thread(element_to_thread, xp=xp)

# %% [markdown]
# ### (optional) Build it in CUDA
#
# With a GPU, write the real thing. Here is `kernels/encoder_forward.cu` as the package compiles it, with
# the kernel's body cut out (`skeletons.skeleton("forward")` makes it from the file when this cell runs).
# Write the body into the string `my_forward_cu`, in place of the marked line. The check compiles it with
# the package's own loader (the same `common.cuh` and NVRTC flags, for bf16 and fp32), launches it with
# the real launch shape on problems drawn when it runs (those of the Python check plus two GPT-2-sized
# ones), compares its bits with the mirror, and on success times it next to the package's kernel.
# Without a GPU it says so. Worked solution: `solutions/cuda/forward.cu` (outside the package).

# %%
display(Markdown(f"```cuda\n{skeletons.skeleton('forward')}\n```"))

# %%
my_forward_cu = r"""
    // ===== YOUR CODE HERE =====
"""

# %%
verdict = buildit.check_forward(my_forward_cu)
verdict.show()

# %% [markdown]
# The whole `kernels/encoder_forward.cu`, as the package compiles it (all three versions), opens here once
# your CUDA kernel passed (`unlocked=True` opens it now, for instance without a GPU):

# %%
reveal.kernel("forward", unlocked=verdict)
