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
# # 02 · The atomic backward: correct, but not reproducible
#
# **Goal:** see the encoder's backward pass as a scatter-add, understand why the simple kernel needs
# atomics, and measure what atomics cost: results whose low bits change from run to run, and, when the
# atomics work on bf16 itself, lost precision.
#
# **Prerequisites:** notebook 01 (the forward's thread map, 128-bit packs, bf16 and fp32 storage); that
# a float has a fixed number of significant bits, so a sum is rounded.
#
# **After this notebook you can:**
# 1. write the atomic backward as a Python function of one thread (the build-it checks it);
# 2. show with three numbers that fp32 addition is not associative, and say why two adds into zero
#    agree in any order but three may not (Exercise 2 checks it);
# 3. say why a row's bits change from run to run with atomics, and why the GPU's `dwpe` did not change here;
# 4. say why bf16 atomics lose small updates that fp32 accumulation keeps.
#
# **Time:** about 20 minutes for the core sections; the sections marked *(optional)* add about 15, and
# the CUDA build-it at the end (with a GPU) about 15.
#
# 0. Setup · 1. Backward is a scatter-add · 2. Why atomics · 3. Float addition is not associative · 4. Run it twice
# (and why the fp32 route copies only the used rows) · 5. bf16 atomics lose precision · 6. (optional) llm.c does it
# this way · 7. Exercise 2 · (optional) Build it in CUDA

# %%
import importlib.util, os, subprocess, sys
sys.path[:0] = [os.path.abspath("..")] if os.path.isdir("../gpt2enc_edu") else []  # a checkout: the folder above notebooks/
if importlib.util.find_spec("gpt2enc_edu") is None:  # Colab or Kaggle: pip-install it from the repository GPT2ENC_EDU_REPO names
    repo = os.environ.get("GPT2ENC_EDU_REPO") or sys.exit("gpt2enc_edu is not installed (notebooks/README.md). On Colab or Kaggle run `%env GPT2ENC_EDU_REPO=<owner>/gpt2enc-edu` (its GitHub repository), then this cell again.")
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", f"gpt2enc-edu[notebooks] @ git+https://github.com/{repo}"])
enc = importlib.import_module("gpt2enc_edu.course.hosted").setup()  # Colab or Kaggle: the CuPy for the runtime's CUDA

# %%
import dataclasses

import numpy as np
from IPython.display import Markdown, display

from gpt2enc_edu import compare, reference, rounding
from gpt2enc_edu.course import arrays, exercises, rounding_plots
from gpt2enc_edu.backend import to_numpy
from gpt2enc_edu.problems import random_problem

xp = arrays()  # prints which backend runs the kernels, as notebook 01 did by hand

# %% [markdown]
# ## 1. Backward is a scatter-add (core)
#
# The forward pass *gathered*: `out[b, t] = wte[inp[b, t]] + wpe[t]`. Each output element came from one
# element of `wte` and one of `wpe`, so its gradient `dout[b, t]` flows back to exactly those two:
#
# $$\text{dwte}[\text{inp}[b, t], :] \mathrel{+}= \text{dout}[b, t, :] \qquad
#   \text{dwpe}[t, :] \mathrel{+}= \text{dout}[b, t, :] \qquad \text{for every } (b, t)$$
#
# The opposite of a gather is a *scatter-add*: every position whose token is the same adds into the same
# row of `dwte`, and the B sequences add into each row of `dwpe`. (The gradients are *added* to what is
# already there, so gradient accumulation over micro-batches works.)
#
# In the example, position `bt = b·T + t` sends the gradient 10^bt, so each digit of a result shows which
# positions reached that row. Token 3 sits at positions 0, 2 and 4.

# %%
# NBVAL_CHECK_OUTPUT
inp = np.array([[3, 0, 3], [1, 3, 2]], dtype=np.int32)  # B = 2, T = 3
V, C = 5, 4
B, T = inp.shape
dout = np.repeat((10.0 ** np.arange(B * T)).reshape(B, T, 1), C, axis=2).astype(np.float32)
dwte, dwpe = xp.zeros((V, C), dtype=xp.float32), xp.zeros((T, C), dtype=xp.float32)
enc.encoder_backward(dwte, dwpe, xp.asarray(dout), xp.asarray(inp), seed=0, method="atomic")
print("dwte[:, 0] =", to_numpy(dwte)[:, 0].astype(np.int64))
print("dwpe[:, 0] =", to_numpy(dwpe)[:, 0].astype(np.int64))
print("adds into each dwte row:", np.bincount(inp.ravel(), minlength=V))

# %% [markdown]
# ## 2. Why atomics (core)
#
# The simple kernel gives each thread one 128-bit pack of `dout` and lets it add the pack into
# `dwte[inp[b, t]]` and `dwpe[t]`. Threads of different positions with the same token hit the same
# addresses at about the same time. A plain `x += d` is three steps, load, add, store: if two threads
# both load the old value before either stores, one of the two updates is lost. `atomicAdd` makes the
# read-modify-write indivisible: the memory system applies the adds one at a time, **in whatever order
# they arrive**. The result is correct up to rounding, but the order is decided by the hardware at run time.
#
# This simple kernel is the one you build and the one the NumPy mirror imitates. For fp32 accumulation the package
# launches a variant that adds fewer atomics into `dwpe`; section 4 shows where that difference becomes visible.

# %% [markdown]
# ### Build it first: the atomic kernel as a Python function of one thread (core)
#
# Write the fp32 atomic kernel yourself, in Python: a function of one thread
# (`cuda.blockIdx.x`, `cuda.threadIdx.x`, `cuda.blockDim.x`), run over the grid with the real launch shape
# by `gpt2enc_edu.course.grid`. It adds into the fp32 gradients `dwte32` and `dwpe32` (flat arrays) with
# `cuda.atomic_add(array, index, value)`, and the emulator applies those adds in an order that changes
# from run to run, as the GPU does. A plain `+=` into them is refused: threads run one after another in
# the emulator, so it would work here and race on a GPU. `load128(array, start)` reads a pack, `to_float`
# converts it to fp32.
#
# Because the order changes, no fixed bits can be asked: the check compares with the float64 reference
# within `compare.error_bound`, and rows that receive nothing must keep their bits. The package's form opens
# after the check once yours passes. Worked solution: `solutions/perthread.py` (outside the package).

# %%

from gpt2enc_edu.course import buildit, perthread, skeletons
from gpt2enc_edu.course.grid import load128, to_float  # noqa: F401 (for your kernel)


def my_atomic_backward(cuda, dwte32, dwpe32, dout, inp, B, T, C):
    """Build it: the fp32 atomic backward, one thread (about 12 lines)."""
    raise NotImplementedError("write the atomic backward for one thread")


# %%
verdict = buildit.check_backward_atomic(my_atomic_backward)
verdict.show()

# %% [markdown]
# The package's per-thread form (`gpt2enc_edu/course/perthread.py`) makes the adds of the CUDA kernel
# `encoder_backward_atomic_fp32_kernel`, which issues them four floats to an atomic; it opens once your kernel passed
# (`unlocked=True` opens it now):

# %%
from gpt2enc_edu.course import reveal

reveal.perthread("atomic", unlocked=verdict)

# %% [markdown]
# Run twice on one problem, the per-thread form gives two different results, as the GPU does:

# %%
tiny = random_problem(4, 16, 8, 3, dtype=np.float32, rng=np.random.default_rng(5))
per_thread_runs = []
for _ in range(2):
    dwte_run, dwpe_run = tiny.dwte.copy(), tiny.dwpe.copy()
    perthread.launch_backward_atomic(perthread.encoder_backward_atomic_fp32, dwte_run, dwpe_run, tiny.dout, tiny.inp)
    per_thread_runs.append(dwte_run)
print("elements of dwte that differ between the two runs:",
      compare.count_bit_differences(per_thread_runs[0], per_thread_runs[1]), "of", per_thread_runs[0].size)

# %% [markdown]
# ## 3. Float addition is not associative (core)
#
# Why the order matters: every fp32 addition rounds its result to 24 significant bits. Adding a small
# number to a large one can lose it, so which additions happen first changes the rounding. Three
# numbers are enough (`rounding.fadd` is one GPU fp32 addition):

# %%
# NBVAL_CHECK_OUTPUT
a, b, c = np.float32(1.0), np.float32(2.0**-24), np.float32(2.0**-24)
left = rounding.fadd(rounding.fadd(a, b), c)   # (a + b) + c: each tiny add rounds back to 1.0
right = rounding.fadd(a, rounding.fadd(b, c))  # a + (b + c): the two tiny ones survive together
for name, value in (("(a + b) + c", left), ("a + (b + c)", right)):
    print(f"{name} = {float(value):.9f}  bits 0x{int(np.asarray(value).view(np.uint32)):08X}")

# %% [markdown]
# ## 4. Run it twice (core)
#
# A GPT-2-sized batch (B = 8, T = 1024, C = 768) with token ids drawn from a Zipf law (the token of rank k is drawn in
# proportion to k^-1.1), so that, as in text, a few tokens repeat hundreds of times. The vocabulary is cut to V = 8192
# rows so that the CPU mirror stays fast; it changes nothing below. The gradients are stored in **fp32** here, so that
# every difference in the order of the adds can show in the bits.
#
# On the GPU the order comes from the hardware. The NumPy mirror imitates it: each call adds the
# positions in a fresh random order (`np.add.at` over a random permutation). Both are run where a GPU
# is present.

# %%
B, T, C, V = 8, 1024, 768, 8192
p32 = random_problem(B, T, C, V, dtype=np.float32, ids="zipf", rng=np.random.default_rng(2))
backends = {"GPU": xp, "CPU mirror": np} if xp is not np else {"CPU mirror": np}


def run(problem, module, method):
    """One backward on a fresh copy of the problem's gradients; returns (dwte, dwpe) as NumPy arrays."""
    on = problem.on(module)
    enc.encoder_backward(on.dwte, on.dwpe, on.dout, on.inp, seed=0, method=method)
    return to_numpy(on.dwte), to_numpy(on.dwpe)


runs32 = {name: [run(p32, module, "atomic") for _ in range(2)] for name, module in backends.items()}
for name, (first, second) in runs32.items():
    print(f"{name}: run 1 and run 2 bitwise equal? dwte {compare.bitwise_equal(first[0], second[0])}, "
          f"dwpe {compare.bitwise_equal(first[1], second[1])}; "
          f"{compare.count_bit_differences(first[0], second[0]):,} of {first[0].size:,} dwte elements differ")

# %% [markdown]
# Look at `dwpe`: where a GPU ran, its two runs can agree while the mirror's differ. The order of the adds
# can only show where an element receives two or more of them on top of its old value. The package does
# not launch the one-pack-per-thread kernel of the build-it: it launches
# `encoder_backward_atomic_fp32_rows_kernel`, whose thread takes one pack of one position `t` for
# `ATOMIC_ROWS` batch rows. It still adds every row into `dwte` with its own atomic, but it sums those rows
# for `dwpe[t]` in registers, in the fixed order b = 0, 1, …, and adds the sum with **one** atomic (fewer
# atomics on the row every sequence hits). Up to `ATOMIC_ROWS` sequences, each `dwpe` element receives one
# atomic add: old value + sum, nothing to reorder, the same bits every run. The mirror adds one batch row
# at a time, B adds per element in a random order, as the build-it's kernel would. With more sequences the
# GPU's `dwpe` gets several atomics per element, and its bits may change too (into a `dwpe` that starts at zero,
# only from three atomics on, as Exercise 2 shows for rows of `dwte`).

# %%
from gpt2enc_edu import layout

print(f"B = {B}: atomic adds per dwpe element on the GPU {-(-B // layout.ATOMIC_ROWS)} "
      f"(sums of up to ATOMIC_ROWS = {layout.ATOMIC_ROWS} rows), in the mirror {B} (one per batch row)")

# %% [markdown]
# How far apart are the two runs? `compare.ulp_difference` counts the representable fp32 values between
# them. Most changed elements move by a few ULPs. A few move by thousands: where the gradients of a row
# cancel to almost zero, the ULP is tiny, so the same absolute rounding error is many ULPs (those are
# gathered in the outermost bins).

# %%
ax = rounding_plots.ulp_histogram({name: compare.ulp_difference(first[0], second[0]) for name, (first, second) in runs32.items()},
                         limit=16, title="dwte (fp32): run 1 minus run 2")

# %% [markdown]
# *Figure: histogram (log counts) of the ULP difference between two fp32 atomic runs: a tall peak at 0, tails of a
# few ULPs, and the overflow bins at the ends.*
#
# Different bits, but both runs are equally right: each lies within `compare.error_bound` of the
# float64 reference (notebook 01, section 5; here fp32 sums of up to `max_terms` terms, the old value counted as
# one of them):

# %%
# NBVAL_CHECK_OUTPUT
ref32 = reference.backward(p32.dwte, p32.dwpe, p32.dout, p32.inp)
bound32 = compare.error_bound(np.float32, ref32.dwte_abs, ref32.max_terms)
print("most adds into one dwte row:", ref32.max_terms - 1)
print("every run within the bound:",
      all(compare.within_bound(dwte, ref32.dwte, bound32) for pair in runs32.values() for dwte, _ in pair))
del ref32, bound32  # 200 MB of float64 the rest of the notebook does not need

# %% [markdown]
# With **bf16** storage, `method="atomic"` adds into fp32 copies and rounds to bf16 once at the end.
# The rounding throws away 16 bits, and with them almost all of the order dependence: the two runs
# differ only where an fp32 sum happens to lie next to a bf16 rounding boundary (often nowhere at all).
# Hiding is not removing, though: nothing guarantees equal bits.

# %%
p16 = random_problem(B, T, C, V, dtype=enc.bfloat16, ids="zipf", rng=np.random.default_rng(3))
runs16 = {method: [run(p16, xp, method) for _ in range(2)] for method in ("atomic", "atomic_bf16")}
for method, (first, second) in runs16.items():
    print(f"bf16 storage, method={method!r}: {compare.count_bit_differences(first[0], second[0]):,} of "
          f"{first[0].size:,} dwte elements differ between two runs")

# %% [markdown]
# ### Why the fp32 route copies only the rows the batch uses (core)
#
# fp32 atomics need fp32 targets, and bf16 gradients are not fp32. A route that converts the whole of `dwte` to fp32
# before the adds and back after them reads and writes all V × C elements twice, however few rows the batch touched. At
# small batches that is far more traffic than the adds themselves: measured at B = 1, such a route took 390 µs, 19 times
# PyTorch's `index_add_` plus the sum for `dwpe` (`docs/experiments.md`, "Atomic baselines", H200, 2026-12-02). So a
# *widen* kernel copies to fp32 only the rows of the tokens the batch uses (a per-token stamp lets the first warp that
# meets a token claim its row, so each row is copied once), and a *narrow* kernel rounds those rows back to bf16 once
# after the adds: 21-25 µs at B = 1 in the same measurement, at most 1.21 times PyTorch's `index_add_` plus the `dwpe`
# sum, so about PyTorch's speed at B = 1 there (notebook 05's committed bench, another card and PyTorch's embedding
# backward, has the fp32 route ahead of PyTorch's at every B). The bytes of both designs for a batch of this size at
# GPT-2's vocabulary (the same Zipf law, drawn over all 50,257 rows rather than section 4's 8192):

# %%
from gpt2enc_edu import tokens

V_gpt2, per_element = tokens.GPT2_VOCAB_SIZE, 2 + 4 + 4 + 2  # widen: read bf16, write fp32; narrow: read fp32, write bf16
distinct = np.unique(tokens.make_ids("zipf", B, T, seed=3, V=V_gpt2)).size
print(f"{distinct:,} distinct ids in {B * T:,} positions. Converting all {V_gpt2:,} rows: "
      f"{V_gpt2 * C * per_element / 1e6:,.0f} MB per call; only the used rows: {distinct * C * per_element / 1e6:.1f} MB; "
      f"reading dout: {B * T * C * 2 / 1e6:.1f} MB")

# %% [markdown]
# ## 5. bf16 atomics lose precision (core)
#
# `method="atomic_bf16"` does what a kernel without fp32 scratch space would do: `atomicAdd` on the bf16
# gradients themselves. Now **every** add rounds to 8 significant bits, and the rounding errors of a row
# pile up with the number of adds (and still depend on the order, as the bf16 runs of section 4 showed).
#
# **Which GPUs have a bf16 `atomicAdd`?** (`sm_XY` names a GPU generation by its compute capability X.Y: sm_90
# is Hopper, the H100 and H200; sm_80 the A100; sm_75 a T4.) `atomicAdd` on `__nv_bfloat162` is a single native
# instruction only from **sm_90** on: `cuda_bf16.hpp` emits `atom.add.noftz.bf16x2` under `NV_PROVIDES_SM_90`.
# Below sm_90 the header's `atomicAdd` is a compare-and-swap loop on the 32-bit word (read the pair, add, write it
# back only if nobody changed it meanwhile, else try again). CUDA 12.2 and newer, 13 included, provide that
# function on every architecture; CUDA 12.0 and 12.1 only from sm_80. So `kernels/encoder_backward_atomic.cu`
# writes the same loop itself below sm_80 (a T4 is sm_75): equivalent to the header's, needed only with those
# older toolkits. The loop is just as correct, only slower under contention, and it rounds after every add
# exactly as the native instruction does.
#
# The histogram compares each result with the float64 reference rounded to bf16 (in bf16 ULPs). Read the
# numbers, not just the shape: fp32 accumulation is almost always exact to the last bit; bf16 atomics
# differ in a few percent of the elements, most of those by **one** ULP (the far tail is again sums that
# cancel to almost zero).

# %%
ref16 = reference.backward(p16.dwte, p16.dwpe, p16.dout, p16.inp)
target = rounding.to_bf16_nearest(ref16.dwte.astype(np.float32))
ulps16 = {method: compare.ulp_difference(pair[0][0], target) for method, pair in runs16.items()}
ax = rounding_plots.ulp_histogram(ulps16, limit=16, title="dwte (bf16) minus the reference rounded to bf16")
for method, ulps in ulps16.items():
    off = np.abs(ulps[ulps != 0])
    print(f"{method:12s}: {100 * off.size / ulps.size:.2f}% of elements differ"
          + (f"; of those {100 * np.mean(off == 1):.0f}% by 1 ULP, {100 * np.mean(off > 2):.0f}% by more than 2"
             if off.size else ""))

# %% [markdown]
# *Figure: histogram of each bf16 result minus the rounded reference, in bf16 ULPs: fp32 accumulation almost only at
# 0; bf16 atomics with side bins at plus and minus 1 and a thin tail.*
#
# Per row, against the number of adds the row received (the median over the row's 768 channels, which
# ignores the few channels whose sum cancels to almost zero): one rounding per add means the error grows
# with the number of adds, while fp32 accumulation rounds once whatever the count.

# %%
adds = np.bincount(p16.inp.ravel(), minlength=V)
rows = np.flatnonzero(adds)
errors = {method: np.median(np.abs(compare.ulp_difference(pair[0][0][rows], target[rows])), axis=1)
          for method, pair in runs16.items()}
ax = rounding_plots.error_vs_adds(adds[rows], errors, title="dwte (bf16): error per row")

# %% [markdown]
# *Figure: median error per dwte row against the number of adds the row received: flat near 0 for fp32 accumulation,
# growing with the adds for bf16 atomics.*
#
# That looks mild, and with these inputs it is: `dout` and `dwte` are both N(0, 1), so every add is about as large as
# the value it lands on, and one bf16 rounding per add costs little. **The real failure needs small updates**, as in
# training: a gradient accumulated over many micro-batches is large, the next micro-batch's contributions are small.
# Here `dout` is scaled by 10⁻³ while `dwte` stays N(0, 1): half a bf16 ULP of a value between 1 and 2 is 2⁻⁸ ≈ 0.004,
# several times a typical add. Not every add is below that line, and not every value is near 1 (between 0.5 and 1 the
# ULP is half as large, below 0.5 a quarter or less): the next cell counts both for this batch. An add smaller than half
# an ULP of the value it lands on is rounded away by itself. bf16 atomics round after every add, so such adds vanish one
# by one, however many a row receives; fp32 accumulation adds them all first and rounds once, so a row's total arrives
# once it is large enough.

# %%
small = dataclasses.replace(p16, dout=(p16.dout.astype(np.float32) * np.float32(1e-3)).astype(enc.bfloat16))
landing = small.dwte.astype(np.float32)[small.inp]  # (B, T, C): the value each add lands on (before the batch)
half_ulp = np.ldexp(np.float32(1), np.frexp(landing)[1] - 9)  # half a bf16 ULP of it (8 significant bits)
large = np.abs(small.dout.astype(np.float32)) >= half_ulp
print(f"{np.count_nonzero(large):,} of {large.size:,} single adds ({100 * np.mean(large):.2f}%) are at least half a "
      f"bf16 ULP of the value they land on; {100 * np.mean(np.abs(landing) < 0.5):.0f}% of the adds land on a value "
      f"below 0.5 in magnitude")
del landing, half_ulp, large

# %% [markdown]
# Below, for each touched row: the fraction of the exact update (the float64 sum of the row's `dout`
# terms) that actually arrived in `dwte`, against the number of adds.

# %%
compact = np.searchsorted(rows, small.inp).astype(np.int32)  # the reference on the touched rows only
exact = reference.backward(small.dwte[rows], small.dwpe, small.dout, compact).dwte - small.dwte[rows].astype(np.float64)
arrived = {}
for method in ("atomic", "atomic_bf16"):
    applied = run(small, xp, method)[0][rows].astype(np.float64) - small.dwte[rows].astype(np.float64)
    arrived[method] = (applied * exact).sum(axis=1) / (exact * exact).sum(axis=1)  # projection on the exact update
    print(f"{method:12s}: rows with >= 100 adds received {np.median(arrived[method][adds[rows] >= 100]):.2f} "
          f"of their update (median); {100 * np.mean(applied == 0):.0f}% of touched elements did not move at all")
ax = rounding_plots.error_vs_adds(adds[rows], arrived, ylabel="fraction of the exact update that arrived",
                         title="dout x 1e-3 into dwte ~ N(0, 1), bf16 storage")

# %% [markdown]
# *Figure: one point per touched row; with fp32 accumulation the fraction climbs towards 1 as rows get more
# adds, with bf16 atomics it stays far below: the updates were swallowed one by one.* Rounding the fp32 total
# to nearest still loses the rows whose whole update is under half an ULP; notebook 04's stochastic
# rounding fixes that part. The printed share of touched elements that "did not move at all" counts exactly these
# losses: with fp32 accumulation, elements whose whole update is under half an ULP of their value; with bf16
# atomics, also elements every one of whose adds was.
#
# Both runs of the first bf16 problem stay within their own error bound (bf16 atomics get the far looser
# `rounding_per_add=True` bound, one bf16 rounding per add):

# %%
# NBVAL_CHECK_OUTPUT
for method, pair in runs16.items():
    bound = compare.error_bound(enc.bfloat16, ref16.dwte_abs, ref16.max_terms,
                                rounding_per_add=(method == "atomic_bf16"))
    print(f"{method}: both runs within their bound:", all(compare.within_bound(dwte, ref16.dwte, bound) for dwte, _ in pair))


# %% [markdown]
# ## 6. (optional) llm.c does it this way
#
# llm.c's own encoder backward, in
# [`llmc/encoder.cuh`](https://github.com/karpathy/llm.c/blob/master/llmc/encoder.cuh), uses **no atomics**:
# it is the deterministic, bucketed scheme of notebook 03. The atomic scatter-add of this notebook is
# version 1 of llm.c's `dev/cuda/encoder_backward.cu`, the simple starting point (fp32 `atomicAdd`).
#
# The next notebook removes the atomics altogether and gets the same bits on every run, and on both
# backends.
#
# ## 7. Exercise 2: which rows can change? (core)
#
# Not every row of `dwte` can differ between two atomic runs. Take a fresh gradient: `dwte` **starts at
# zero** and is stored in fp32. Write `rows_that_can_differ(inp, V)` that returns a boolean array of shape
# `(V,)`, True for the rows whose bits can depend on the order of the atomic adds. `inp` may be a NumPy or
# a CuPy array: use the same module for the answer.
#
# *Hint:* for a row that receives n adds, list the orders in which they can arrive, and ask which orders can give
# different fp32 results when the row starts at 0 ("Float addition is not associative"). The check draws its id
# batches when it runs, then runs the atomic kernel a few times from zero and shows which rows really changed.
# Solution: `solutions/exercises.py` (in the repository, outside the package). After it comes the CUDA build-it
# exercise.

# %%
def rows_that_can_differ(inp, V):
    """Exercise 2: a (V,) boolean array, True where the atomic adds' order can change dwte's bits."""
    raise NotImplementedError("Exercise 2: find the dwte rows whose result can depend on the order of the adds")


# %%
done = exercises.check_rows_that_can_differ(rows_that_can_differ, xp=xp)

# %% [markdown]
# **After the exercise: two adds into zero, and three.** Starting from zero, a row that receives two adds `a` and `b`
# ends as `(0 + a) + b` or `(0 + b) + a`. `0 + a` is exactly `a` (for every `a` but −0, which it makes +0, an equal
# value), and fp32 addition is commutative (`a + b` and `b + a` round the same exact sum), so both orders give the same
# bits. With three adds the orders group differently, `(a + b) + c` against `(b + c) + a`, and as in "Float addition is
# not associative" those can round differently. The same numbers as there, added into zero:

# %%
terms = {"a": a, "b": b, "c": c}  # 1, 2^-24 and 2^-24, from "Float addition is not associative"
for order in ("ab", "ba", "abc", "bca"):
    total = np.float32(0.0)
    for name in order:
        total = rounding.fadd(total, terms[name])
    print(f"0 + {' + '.join(order):9s} = {float(total):.9f}  bits 0x{int(np.asarray(total).view(np.uint32)):08X}")

# %% [markdown]
# ### (optional) Build it in CUDA
#
# With a GPU, write the fp32 atomic kernel itself. Here is `kernels/encoder_backward_atomic.cu` with the
# body of `encoder_backward_atomic_fp32_kernel` cut out (and the bf16 kernel emptied: it would give the
# answer away), made from the file when this cell runs. Write the body into `my_atomic_cu`. The check
# compiles it with the package's loader, launches it with the real launch shape on problems drawn when it
# runs, and compares with the float64 reference within the documented bound: the order of the atomic adds
# is the hardware's, so no fixed bits can be asked. On success it times your kernel next to the package's.
# Worked solution: `solutions/cuda/atomic.cu` (outside the package).

# %%
display(Markdown(f"```cuda\n{skeletons.skeleton('atomic')}\n```"))

# %%
my_atomic_cu = r"""
    // ===== YOUR CODE HERE =====
"""

# %%
verdict = buildit.check_backward_atomic(my_atomic_cu)
verdict.show()

# %% [markdown]
# The whole `kernels/encoder_backward_atomic.cu` (the kernel above, the rows kernel the package launches,
# the widen and narrow kernels and the bf16 atomics) opens here once your CUDA kernel passed (`unlocked=True`
# opens it now, for instance without a GPU):

# %%
reveal.kernel("atomic", unlocked=verdict)
