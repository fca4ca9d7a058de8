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
# # 03 · The bucketed backward: the same bits every time
#
# **Goal:** remove the atomics from the backward pass. Every gradient element gets one owner that adds
# its terms in a fixed order, so the result is the same on every run and on both backends. The
# position gradient is easy. For the token gradient we group the work into *buckets*, and we will
# see why the bucket table is sorted largest first.
#
# **Prerequisites:** notebooks 01 and 02 (threads, warps and 128-bit packs; the backward as a scatter-add; why atomics
# make the bits change); for the wte build-it, what a thread block's *shared memory* and a *barrier* are (notebook
# 00's warm-up 3 practises them; explained again where they are needed). Notebook 04 explains the stochastic rounding
# used here; it is not needed first.
#
# **After this notebook you can:**
# 1. build the bucket table of a small batch by hand and read it (Exercise 3 checks it);
# 2. write the wpe kernel and the bucketed wte kernel as Python functions of one thread that give the GPU's
#    bits (the build-its check them);
# 3. say why the table is sorted largest first, and what sets the kernel's time when one token is frequent;
# 4. say why the result is the same on every run, in any bucket order and on both backends.
#
# **Time:** about 30 minutes for the core sections; the sections marked *(optional)* add about 20, and
# the two CUDA build-its at the end (with a GPU) about 30.
#
# 0. Setup · 1. One owner per element · 2. The bucket table, step by step · 3. Bucket sizes in practice ·
# 4. Why largest first · 5. The wte kernel · 6. Run it: same bits, every time · 7. (optional) llm.c does it this way ·
# 8. Exercise 3 · (optional) Build them in CUDA

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

import gpt2enc_edu.cuda
from gpt2enc_edu import compare, layout, mirror, reference, tokens
from gpt2enc_edu.course import arrays, exercises, plots, schedule
from gpt2enc_edu.backend import to_numpy
from gpt2enc_edu.problems import random_problem

# %% [markdown]
# ## 1. One owner per element (core)
#
# Atomics were needed because many threads added into the same element. Turn it around: give every
# gradient element **one** thread that reads all of its terms and adds them itself, in an order fixed
# in advance. No two threads write the same element, no atomics, and the same order on every run.
#
# For `dwpe` this is easy: element `dwpe[t, c]` receives exactly B terms, `dout[0, t, c]`, …,
# `dout[B-1, t, c]`. One thread per 128-bit pack of `dwpe` loops over `b = 0, 1, …, B-1`, adds the
# old value and rounds once:

# %% [markdown]
# ### Build it first: the wpe kernel as a Python function of one thread (core)
#
# Write this kernel yourself, in Python: a function of one thread (`cuda.blockIdx.x`,
# `cuda.threadIdx.x`, `cuda.blockDim.x`), run over the grid with the real launch shape by
# `gpt2enc_edu.course.grid` (arrays flat, like CUDA pointers). `load128`/`store128` move a 128-bit pack,
# `fadd` adds in fp32 as the GPU does, `to_float` converts, and
# `round_to_storage(value, dtype, element, NOISE_STREAM_DWPE, seed)` rounds as the kernel does (stochastic
# for bf16, keyed by each element's flat index in `dwpe`: notebook 04). The check draws fresh problems and
# wants the mirror's bits exactly: the order of the adds matters. The package's form opens after the check
# once yours passes. Worked solution: `solutions/perthread.py` (outside the package).

# %%

from gpt2enc_edu.course import buildit, perthread, skeletons
from gpt2enc_edu.course.grid import fadd, load128, round_to_storage, store128, to_float  # noqa: F401 (for your kernel)
from gpt2enc_edu.rounding import NOISE_STREAM_DWPE, NOISE_STREAM_DWTE  # noqa: F401 (for your kernel)


def my_wpe_backward(cuda, dwpe, dout, B, T, C, seed):
    """Build it: the wpe backward, one thread (about 12 lines)."""
    raise NotImplementedError("write the wpe backward for one thread")


# %%
verdict = buildit.check_backward_wpe(my_wpe_backward)
verdict.show()

# %% [markdown]
# The package's per-thread form (`gpt2enc_edu/course/perthread.py`) adds what the CUDA kernel
# `encoder_backward_wpe_kernel` adds, in the same order (the kernel issues several loads before adding them); it opens
# once your kernel passed (`unlocked=True` opens it now). One thing yours need not have: a loop over packs. Launched
# with fewer threads than packs, thread `i` takes pack `i`, then `i` plus the grid's thread count, and so on; an element
# still has one owner, so the bits do not change. The package uses that beside the bucket table that the GPU builds in
# the same call for 2 to 64 sequences (the scatter route of notebook 06): the wpe kernel then gets only a share of the
# SMs (the GPU's streaming multiprocessors, which run the blocks; `layout.WPE_SM_SHARE_BESIDE_TABLE`), so that the
# table's kernels are not kept waiting for room.

# %%
from gpt2enc_edu.course import reveal

reveal.perthread("wpe", unlocked=verdict)

# %% [markdown]
# Whichever you read, it gives the mirror's bits:

# %%
small = random_problem(3, 6, 16, 9, maxT=8, rng=np.random.default_rng(6))
dwpe_per_thread, dwpe_mirror = small.dwpe.copy(), small.dwpe.copy()
perthread.launch_backward_wpe(perthread.encoder_backward_wpe, dwpe_per_thread, small.dout, 42)
mirror.encoder_backward_wpe(dwpe_mirror, small.dout, small.B, small.T, small.C, 42)
print("per-thread Python == NumPy mirror, bit for bit:", compare.bitwise_equal(dwpe_per_thread, dwpe_mirror))

# %% [markdown]
# For `dwte` it is harder: row `ix` receives one term per occurrence of token `ix`, which may be none or
# thousands, anywhere in the batch. A thread cannot search the batch for its token, so we first **group
# the positions by token**: a *bucket* lists the positions of one token, and one thread block sums
# them.
#
# ## 2. The bucket table, step by step (core)
#
# A toy batch (B = 2, T = 4) and C = 512 bf16 channels. The steps below build the table with plain
# Python on purpose, to show the idea. The package's `make_buckets` builds the same table with vectorised
# NumPy for NumPy ids, and **on the GPU for CuPy ids** (no trip through the host), by one of three routes
# picked by the batch's size: one block for a single sequence, a scatter over many blocks for larger
# batches, a cooperative kernel for the largest (notebook 06 shows them). All give the same table, in the
# same order.
#
# **Why on the GPU, when llm.c builds it on the host?** llm.c's training loop already holds the ids on the host
# (its `encoder_backward` takes `inputs_cpu`), and it launches the wpe kernel first, so the GPU works on `dwpe`
# while the CPU builds the table: the host work costs no copy and is partly hidden. A CuPy caller here has the
# ids on the GPU only. Copying them to the host would wait behind the wpe kernel, which loses the overlap, and the
# host work would then stand alone in the call, milliseconds at large batches (notebook 05 measures it).
#
# **Step 1: the key.** Position `bt = b·T + t` carries token `inp[b, t]`; the token is the key.

# %%
# NBVAL_CHECK_OUTPUT
inp = np.array([[5, 2, 5, 7], [2, 9, 5, 2]], dtype=np.int32)
C, dtype = 512, enc.bfloat16
flat = inp.ravel()
print("bt:   ", np.arange(flat.size))
print("token:", flat)

# %% [markdown]
# **Step 2: collect each token's positions**, in ascending `bt`: this fixes the order in which the token's
# gradients will be added. The number of a token's positions (its `size`) is the number of adds.

# %%
# NBVAL_CHECK_OUTPUT
positions_of = {int(token): np.flatnonzero(flat == token).tolist() for token in np.unique(flat)}
for token, positions in positions_of.items():
    print(f"token {token}: positions {positions}, size {len(positions)}")

# %% [markdown]
# **Step 3: largest first.** Sort the tokens by size, descending, ties broken by token id (section 4
# shows why the big ones go first).
#
# **Step 4: channel groups.** One block handles 256 bf16 channels (a warp of 8-channel packs; 128 for
# fp32), so a row of C = 512 channels becomes two buckets, `(token, channel group 0)` and
# `(token, channel group 1)`, which share the same positions. Splitting long rows gives more blocks,
# and so more parallel work.

# %%
# NBVAL_CHECK_OUTPUT
order = sorted(positions_of, key=lambda token: (-len(positions_of[token]), token))
n_groups = layout.num_c_groups(C, dtype)
toy = [(token, g, positions_of[token]) for token in order for g in range(n_groups)]
print(f"{n_groups} channel groups of {layout.c_per_group(dtype)}")
for bucket, (token, g, positions) in enumerate(toy):
    first = g * layout.c_per_group(dtype)
    print(f"bucket {bucket}: token {token}, channels {first}..{first + layout.c_per_group(dtype) - 1}, "
          f"positions {positions}")

# %% [markdown]
# **The real table.** `make_buckets` stores the same thing in two int32 arrays, ready for the GPU:
# `info[bucket] = (start, size, token, channel group)`, and `bt_list`, all positions one token after another
# (a token's buckets, one per channel group, share its range), so that bucket `k` reads
# `bt_list[start : start + size]`. (The `units` array serves the package's other deterministic kernel,
# `method="chunked"`, which notebook 06 explains.)

# %%
# NBVAL_CHECK_OUTPUT
table = enc.make_buckets(inp, C, dtype)
print(f"{table.num_buckets} buckets of {table.c_per_group} channels over {table.bt_list.size} positions")
print("info (start, size, token, group):\n", table.info)
print("bt_list:", table.bt_list)
same = [(int(tok), int(g), table.bt_list[s : s + n].tolist()) for s, n, tok, g in table.info] == toy
print("the toy steps give the same buckets in the same order:", same)

# %% [markdown]
# ## 3. Bucket sizes in practice (core)
#
# How big do buckets get? It depends on the text. One GPT-2 micro-batch (B = 8, T = 1024, C = 768 bf16,
# so 3 channel groups) with ids drawn uniformly, from a Zipf law, and from real text (the package's
# sample of real GPT-2 token ids, see `docs/token_sample.md`). Below, one point per token: its
# bucket size against its rank.

# %%
# NBVAL_CHECK_OUTPUT
B, T, C = 8, 1024, 768
tables = {kind: enc.make_buckets(tokens.make_ids(kind, B, T, seed=0), C, enc.bfloat16) for kind in tokens.KINDS}
for kind, t in tables.items():
    print(f"{kind:8s}: {t.num_buckets:6d} buckets ({t.num_buckets // t.num_c_groups} tokens x {t.num_c_groups} "
          f"groups), largest {t.sizes[0]:4d}, sizes 1: {int((t.sizes == 1).sum()) // t.num_c_groups} tokens")

# %%
ax = plots.bucket_rank_size({kind: t.sizes[t.c_groups == 0] for kind, t in tables.items()},
                            title="B=8, T=1024: bucket size by rank")

# %% [markdown]
# *Figure: log-log bucket size against rank: uniform ids nearly flat at 1 to 4, Zipf and real ids falling in a
# straight line from hundreds or a thousand positions.*
#
# Uniform ids give thousands of tiny buckets. Text follows a power law (a straight line on log-log
# axes): a few tokens (in the real sample `"\n"`, `" "` and `","`) fill buckets of hundreds of positions,
# and most tokens occur once or twice. A block's work grows with its bucket's size, so the blocks of one
# launch differ in length by a factor of several hundred.
#
# ## 4. Why largest first (core)
#
# The GPU runs a fixed number of blocks at once. Each multiprocessor (SM) holds a few (each such place is
# a *block slot*), and when one block ends another block of the launch takes its place. Which one is up to
# the hardware: CUDA does **not** promise that blocks start in launch order. In practice low block indices
# go first, and that is all the largest-first table relies on. `gpt2enc_edu.course.schedule` simulates
# that practice: blocks handed out in launch order, each to the slot that frees first. The run ends when
# the **last** block ends; that time is the *makespan*. No order can beat the *lower bound*: the longest
# block, or all the work spread evenly over the slots, whichever is larger. If a long block starts late,
# every other slot idles while it finishes.
#
# First a toy where a block's cost is simply its bucket's size.
#
# A toy: 48 buckets of one short Zipf sequence on a GPU with 4 slots, launched in table order (largest
# first), in a random order, and smallest first.

# %%
toy_table = enc.make_buckets(tokens.make_ids("zipf", 1, 96, V=400, seed=2), 256, enc.bfloat16)
toy_runs = schedule.compare_orders(schedule.block_costs(toy_table), num_slots=4, seed=0)
fig = plots.gantt_comparison(toy_runs, title="48 buckets on 4 slots (colour: bucket size)")

# %% [markdown]
# *Figure: three Gantt charts of the same 48 blocks on 4 block slots, colour = block cost: largest first ends at the
# bound; random and ascending orders leave the big block running alone at the end.*

# %%
# NBVAL_CHECK_OUTPUT
for name, run in toy_runs.items():
    print(f"{name:9s}: makespan {run.makespan:4.0f}, lower bound {run.lower_bound:4.0f}, "
          f"slots busy {100 * run.efficiency:5.1f}% of the time")

# %% [markdown]
# Largest first reaches the lower bound here: the big bucket starts at once and the small ones fill the
# gaps around it. Smallest first saves the big bucket for last and it runs alone. (Greedy largest-first
# scheduling is never worse than 4/3 of the best possible schedule; an arbitrary order can take almost
# twice as long.)
#
# At the scale of an H100 SXM or an H200 (132 SMs, 8 blocks of 256 threads each = 1056 slots, the most an SM's 2048
# threads allow; the kernel llm.c launches, one block per bucket, is modelled) and one GPT-2 micro-batch, the cost has
# to be closer to the kernel (section 5). A bucket's **items** are its positions `bt`, one row of dout each; the **8
# warps of a block share its bucket**, one item per warp per round, so a bucket of `size` items takes `ceil(size / 8)`
# rounds (1 to 8 items: one round), plus a fixed start-up (read the table entry, load and store `dwte`, round). Its size
# is not measured, so the model tries two values that bracket it: 0 (free) and 2 rounds.

# %%
# NBVAL_CHECK_OUTPUT
slots = schedule.H200_SM_COUNT * schedule.WTE_BLOCKS_PER_SM
print(f"{slots} slots; makespan / lower bound for each launch order (cost in rounds of 8 warps)")
for per_block in (0, 2):
    for kind, t in tables.items():
        runs = schedule.compare_orders(schedule.block_costs(t, per_block=per_block, warps=8), slots, seed=0)
        ratios = ", ".join(f"{name} {run.makespan / run.lower_bound:.3f}" for name, run in runs.items())
        print(f"cost = ceil(size/8) + {per_block}, {kind:8s}: lower bound {runs['table'].lower_bound:5.1f}, "
              f"largest block {runs['table'].costs.max():4.0f}; {ratios}")

# %% [markdown]
# With Zipf and real ids largest first reaches the bound, and the other orders pay up to a quarter more for a tail.
# With uniform ids order hardly matters: every bucket is one round, and every order ends a few percent above the
# bound, because the bound spreads the work evenly over the slots (a fraction of a round more per slot), while a
# slot can only finish whole blocks. The model also shows where the time goes with text
# (Zipf and real ids): the lower bound is the **largest block itself**, longer than all the other work
# spread over the 1056 slots. However cleverly the blocks are ordered, one block summing the most frequent
# token sets the kernel's time. That is what the package's `method="chunked"` kernel changes: it cuts a
# token's positions into chunks of 32 and gives each chunk its own warps, one per channel group (notebook 06).
#
# ## 5. The wte kernel (core)
#
# One block of 256 threads (8 warps) per bucket. Lane `l` of every warp owns the same 8 channels (one
# pack) of the bucket's channel group. Warp `w` adds items `w, w + 8, w + 16, …` of the bucket, so the
# 8 warps share the positions; then warp 0 adds the partial sums of warps 1, 2, …, 7 in that order
# (through shared memory), adds the old `dwte` value and rounds once. Every sum has a fixed order. A bucket
# with fewer than 8 items keeps only that many warps busy.
#
# Warp 0 must not read the partial sums before the other warps wrote them: a **barrier** stands between. The
# notebook meets it in three forms, all giving the same sums:
#
# * **your build-it and the package's per-thread form**: every warp, busy or not, waits at one barrier for the
#   whole block, the simplest correct form;
# * **the package's CUDA block kernel** (`encoder_backward_wte_bucketed_kernel`; for small buckets the package launches
#   a warps form, the optional subsection below): warps without an item leave at once (they issue nothing more, though
#   the block keeps its place on the SM until its busy warps end), and the busy ones meet at a *named* barrier that
#   counts only them, so nothing rests on how a GPU treats threads that exited;
# * **llm.c's kernel**: every warp but warp 0 returns (a warp with items first writes its sum), and warp 0 waits alone
#   at `__syncthreads()`, counting on exited threads to release it (section 7 says where that rule is written).
#
# The rounding to bf16 is stochastic (notebook 04), and its random numbers are keyed by the **element**
# `(token, channel)` and the seed, not by the block or the thread, so the order in which blocks run
# cannot change them either.

# %% [markdown]
# ### Build it first: the wte kernel in Python, with a barrier (core)
#
# This kernel needs two things the forward and the atomic kernel did not, both met in notebook 00's warm-up 3
# and both in the emulator. **Shared memory**:
# `cuda.shared_array(name, shape, dtype)` is one array per block, the same for every thread of it (it
# starts as NaN, so reading a slot nobody wrote shows). **A barrier**: `yield cuda.syncthreads()` waits
# until every thread of the block has arrived (a thread that uses it is a Python generator). Every thread
# must reach it, as CUDA C++ asks of `__syncthreads()` (only in code that the whole block reaches): the
# emulator reports a thread that returns while the others wait. On a GPU that is outside CUDA C++'s rules;
# the PTX ISA documents that exiting threads release a barrier (section 7 says more), so it does not hang, but a
# thread that left before writing what the others read leaves them reading a value never written. Between
# barriers the threads run in a random order, so reading another thread's write without the barrier shows too.
#
# Arguments: `bucket_info` is the table's `info` flattened (4 ints per bucket: start, size, token,
# channel group), `num_buckets` a 1-element array, one block of `WTE_BLOCK_SIZE = 256` threads per bucket.
# Round with `round_to_storage(value, dtype, element, NOISE_STREAM_DWTE, seed)`. The check draws fresh
# problems, with one-item buckets, a token seen hundreds of times and a C that ends inside a channel group (lanes
# with no channels), and wants the mirror's bits. The package's form opens after the check once yours passes.
# Worked solution: `solutions/perthread.py`.

# %%
from gpt2enc_edu.layout import WARP_SIZE, WTE_BLOCK_SIZE, WTE_WARPS  # noqa: F401 (for your kernel)


def my_wte_backward(cuda, dwte, bucket_info, bt_list, dout, num_buckets, C, seed):
    """Build it: the bucketed wte backward, one thread of a 256-thread block (about 30 lines)."""
    raise NotImplementedError("write the bucketed wte backward for one thread")


# %%
verdict = buildit.check_backward_wte_bucketed(my_wte_backward)
verdict.show()

# %% [markdown]
# The package's per-thread form (`gpt2enc_edu/course/perthread.py`) adds the same terms in the same order as
# the CUDA kernel `encoder_backward_wte_bucketed_kernel`, with one simplification: every warp waits at one
# barrier for the whole block. The CUDA kernel lets warps without items leave first and meets the busy ones
# at a named barrier that counts only them (the file, shown after the CUDA build-it, has it; section 7 says
# why). It opens once your kernel passed (`unlocked=True` opens it now):

# %%
reveal.perthread("wte_bucketed", unlocked=verdict)

# %% [markdown]
# Whichever you read, it gives the mirror's bits:

# %%
small = random_problem(2, 12, 24, 5, rng=np.random.default_rng(7))
small_table = enc.make_buckets(small.inp, small.C, small.dtype)
dwte_per_thread, dwte_mirror = small.dwte.copy(), small.dwte.copy()
perthread.launch_backward_wte_bucketed(perthread.encoder_backward_wte_bucketed, dwte_per_thread, small_table,
                                       small.dout, 42)
mirror.encoder_backward_wte_bucketed(dwte_mirror, small_table, small.dout, small.C, 42)
print("per-thread Python == NumPy mirror, bit for bit:", compare.bitwise_equal(dwte_per_thread, dwte_mirror))

# %% [markdown]
# ### (optional) The form the package launches: a warp per small bucket
#
# The kernel file holds a second kernel, `encoder_backward_wte_bucketed_warps_kernel`, and that is the one the
# package launches for `method="bucketed"`. It sums the same buckets in the same fp32 order, so it writes the
# same bits; what changes is who sums a bucket. In the block form a one-item bucket still takes a whole block,
# whose idle warps leave at once but whose slot on the SM stays taken until the block ends, and with uniform
# ids almost every bucket is tiny (the cell below counts them for a large batch). So the warps form gives a
# bucket of at most 8 items to **one warp**, which adds the items in order: that is exactly the block's sum,
# since warp w of a block would hold item w alone. A bigger bucket still gets a whole block. On uniform ids
# this about halved the kernel's time (`docs/experiments.md` has the measurement). A third kernel,
# `encoder_backward_wte_bucketed_warps_prefetch_kernel`, is the warps form whose blocks first ask L2 for every row
# of their big bucket, so that the warps' chains of loads find them there; the package launches it where `dout`
# fits easily in L2. The second cell below checks the claim of equal bits on a GPU, for all three.

# %%
wide = enc.make_buckets(tokens.make_ids("uniform", 64, 1024, seed=0), 768, enc.bfloat16)
print(f"B = 64, T = 1024, uniform ids: {wide.num_buckets:,} buckets, {np.count_nonzero(wide.sizes <= WTE_WARPS):,} "
      f"of them with at most {WTE_WARPS} items")
del wide

# %%
xp = enc.array_module()
if xp is np:
    print("no GPU here: the NumPy mirror stands for both kernels (same sums, same order); a GPU runs and compares them")
else:
    check = random_problem(4, 256, 776, 300, ids="zipf", rng=np.random.default_rng(3)).on(xp)
    check_table = enc.make_buckets(check.inp, 776, check.dtype, V=300)  # built on the GPU
    forms = {}
    for form in gpt2enc_edu.cuda.BUCKETED_FORMS:
        forms[form] = check.dwte.copy()
        gpt2enc_edu.cuda.encoder_backward_wte_bucketed(forms[form], check_table, check.dout, 776, 99, form=form)
    print(f"forms {', '.join(forms)} write the same bits:",
          all(compare.bitwise_equal(forms["block"], bits) for bits in forms.values()))

# %% [markdown]
# ## 6. Run it: same bits, every time (core)
#
# A GPT-2-sized batch (B = 8, T = 1024, C = 768, Zipf ids, V cut to 8192 rows so the CPU mirror stays
# quick), bf16 and fp32 storage, `method="bucketed"`, on the active backend, twice.

# %%
xp = arrays()  # the active backend
B, T, C, V = 8, 1024, 768, 8192
problems = {name: random_problem(B, T, C, V, dtype=dtype, ids="zipf", rng=np.random.default_rng(4))
            for name, dtype in (("bf16", enc.bfloat16), ("fp32", np.float32))}


def backward(problem, module, seed, method="bucketed"):
    """One backward on a fresh copy of the problem's gradients; returns (dwte, dwpe) as NumPy arrays."""
    on = problem.on(module)
    enc.encoder_backward(on.dwte, on.dwpe, on.dout, on.inp, seed=seed, method=method)
    return to_numpy(on.dwte), to_numpy(on.dwpe)


results = {name: [backward(p, xp, seed=1234) for _ in range(2)] for name, p in problems.items()}
print(enc.last_backend())

# %% [markdown]
# The checksums below are the same on the GPU and in the CPU mirror: this cell's stored output comes from a GPU run
# (the line above names the backend), and the test suite re-runs it on a CPU and compares. `bitwise_equal(…, mirror)`
# compares with the mirror directly (on a machine without a GPU it compares the mirror with itself).
#
# The two checks answer different questions: equal bits with the mirror say that the kernel adds what the mirror
# adds, in the same order; the bound of the float64 reference says that this order gives a correct sum at all (a
# mirror with the kernel's mistake would agree with it bit for bit).

# %%
# NBVAL_CHECK_OUTPUT
for name, p in problems.items():
    (dwte1, dwpe1), (dwte2, dwpe2) = results[name]
    mirror_dwte, mirror_dwpe = backward(p, np, seed=1234)
    ref = reference.backward(p.dwte, p.dwpe, p.dout, p.inp)
    print(f"{name}: checksums dwte {compare.checksum(dwte1)}, dwpe {compare.checksum(dwpe1)}")
    print(f"  run 1 == run 2: {compare.bitwise_equal(dwte1, dwte2) and compare.bitwise_equal(dwpe1, dwpe2)}; "
          f"== NumPy mirror: {compare.bitwise_equal(dwte1, mirror_dwte) and compare.bitwise_equal(dwpe1, mirror_dwpe)}; "
          f"within the bound of the float64 reference: "
          f"{compare.within_bound(dwte1, ref.dwte, compare.error_bound(p.dtype, ref.dwte_abs, ref.max_terms))}")

# %% [markdown]
# Two more facts, checked on the bf16 problem:
#
# * the **seed** is the only randomness: another seed changes the stochastic rounding of bf16 (hence
#   the bits), the same seed never does;
# * the **order of the buckets does not matter**: each bucket writes its own elements, and their rounding
#   is keyed by element. Below, the wte kernel (or its mirror) is handed the same table with its buckets
#   shuffled. This calls the backend module directly, bypassing the public API, to pass a modified table.

# %%
# NBVAL_CHECK_OUTPUT
p = problems["bf16"]
other_seed = backward(p, xp, seed=4321)
print("seed 4321 gives other bits than seed 1234:", not compare.bitwise_equal(other_seed[0], results["bf16"][0][0]))

runner = mirror if xp is np else gpt2enc_edu.cuda
table = enc.make_buckets(p.inp, C, p.dtype)
# (the table's `units` list belongs to the chunked kernel; the bucketed kernel reads only info and bt_list)
shuffled = dataclasses.replace(table, info=table.info[np.random.default_rng(5).permutation(table.num_buckets)])
on = p.on(xp)
runner.encoder_backward_wte_bucketed(on.dwte, shuffled, on.dout, C, 1234)
print("shuffled bucket order, same dwte bits:", compare.bitwise_equal(on.dwte, results["bf16"][0][0]))


# %% [markdown]
# Compare this with notebook 02: the atomic kernel's bits changed from run to run, these never do, and
# the GPU and the CPU mirror agree to the last bit.
#
# **And llm.c's bits?** `method="bucketed"` adds each element's terms in llm.c's order: the same items per warp, the
# warps combined in the same order. A comparison harness kept outside the repository ran llm.c's kernels (llm.c commit
# `f1e2ace6`) and the package's on the same inputs (H200, B = 64, uniform and Zipf ids; `docs/experiments.md`, "Against
# llm.c"). Every value of llm.c's `dwpe` and `dwte` was one of the two bf16 neighbours of the package's fp32 sum: what
# equal fp32 sums give, and the same terms added in the same order should be equal (the check is consistent with that;
# it does not read llm.c's fp32 sums, so it does not prove it). The two differ by at most 1 bf16 ULP, where their
# rounding noise picks different neighbours: llm.c keys the noise by thread, block and bucket index, the package by
# element (section 7, item 1). They cannot be equal bit for bit without llm.c's keys. Only the bucketed method can match
# llm.c this closely: `method="chunked"` (notebook 06) adds in another order, so its fp32 sums may differ from llm.c's
# in the last bits as well.
#
# ## 7. (optional) llm.c does it this way
#
# The scheme is llm.c's: `wte_backward_kernel`, `wpe_backward_kernel` and `encoder_backward` in
# [`llmc/encoder.cuh`](https://github.com/karpathy/llm.c/blob/master/llmc/encoder.cuh). The package differs
# in five places; each has a consequence.
#
# 1. **What keys the rounding noise.** llm.c draws each element's threshold from
#    `Get2dNoiseUint(threadIdx.x, blockIdx.x * blockDim.x + blockIdx.y, seed + bucket * WARP_SIZE +
#    threadIdx.x + k)`: thread, block and **bucket index**. Here it is `noise_2d(element, tensor, seed)`
#    (notebook 04). So in llm.c the bits of `dwte` depend on which bucket got which index, and that order
#    comes from a `std::unordered_map` (iteration order unspecified) and a `std::sort` by size (not stable:
#    ties land in any order). llm.c's `dwte` is reproducible run to run with the same binary and standard
#    library, but a different compiler or library may give other bits. Here the table order is documented
#    and, as the shuffle above showed, does not matter anyway.
# 2. **Who reaches the barrier.** In llm.c only warp 0 reaches its `__syncthreads()`. Lanes with no channel (`c >= C`)
#    and warps with no item (`warp_id >= bucket_size`) return at the start, and every other warp, busy ones included,
#    writes its partial sum to shared memory and returns; warp 0 then waits at the barrier and reads sums written by
#    warps that have exited. Its comment says exited threads count as arrived. That is documented: the PTX ISA (PTX is
#    the instruction set CUDA C++ compiles to) says a barrier waits for the threads that have not exited (its `barrier`
#    instruction, of which `bar.sync` is a form), and that exiting threads release it (its `exit` instruction). CUDA C++
#    asks for more, `__syncthreads()` only in code that the whole block reaches, so llm.c's kernel rests on the PTX rule
#    beneath the C++ one. The package's kernel also lets idle warps leave early (they issue nothing more), but the busy
#    warps stay and meet at a **named barrier** that states how many threads it waits for, `bar.sync 1, busy_warps *
#    32`, and lanes without channels stay with their warp until it. Every thread the barrier counts reaches it, so
#    nothing rests on how exited threads are counted, and compute-sanitizer's `synccheck` and `racecheck` have nothing
#    to flag.
# 3. **Item lists.** llm.c files every position once per channel group: a `std::unordered_map` keyed by
#    token and channel group (`c_group + num_c_groups * token`) holds one list per bucket, and each entry is a
#    64-bit word packing `bt`, the channel group and the token; it copies B·T·(C/256) such entries. Here the
#    channel groups of a token share **one** list of positions (`bt_list` has B·T entries): a third of the
#    table for C = 768.
# 4. **Where the table is built, and the overlap.** llm.c builds it on the host while its wpe kernel runs
#    (section 2 says why that suits llm.c and not a CuPy caller). The package's CPU route queues the wpe kernel
#    first too, but its copy of the ids to the host waits behind it. The GPU route runs the wpe kernel beside the
#    bucketing and the wte kernel, on two streams, with no host work at all, on a share of the SMs only while the
#    table is built (the loop over packs above).
# 5. **Who sums a small bucket.** llm.c gives every bucket a block. The package launches the warps form (section
#    5): one warp per bucket of at most 8 items, 8 such buckets per block of 8 warps, so an eighth as many blocks.
#    The sums and the bits are the same; on uniform ids, where almost every bucket is tiny, the kernel takes about
#    half the time.
#
# One thing is the same: both read `dout` with `load128cs`, a streaming load, since each pack is read by one
# bucket only.
#
# No cell draws llm.c's timings: no recorded llm.c run is kept for a cell to read them from. `docs/experiments.md`,
# "Against llm.c", lists the comparisons made and when. In the one on an H100 (2026-12-05, B = 64) llm.c's whole
# backward took 58 ms, the package's whole backward with its table built on the GPU 126 µs (in that harness's own run,
# not the committed bench). llm.c's GPU kernels account for well under a millisecond of that (its wte kernel, the
# longest, took 139-452 µs at B = 64 in the H200 runs), so the rest is its host bucketing (the hash map over B·T·(C/256)
# entries, a sort, two copies), the step that notebook 06 moves to the GPU.
#
# ## 8. Exercise 3: read the bucket table (core)
#
# Which block reads `dout[b, t, c]`? Write `locate(table, inp, b, t, c)` returning `(bucket, item)`: the
# index of the bucket in `table` that reads that gradient, and its place in the bucket's list of
# positions (`table.bt_list[start + item] == b * T + t`). `table` comes from `enc.make_buckets(inp, C,
# dtype)` with a NumPy `inp`, so here it is built on the CPU (for CuPy ids the package builds it on the GPU).
#
# *Hint:* the bucket's token is `inp[b, t]` and its channel group is `c // table.c_per_group`. The
# table's `token_ids`, `c_groups`, `starts` and `sizes` properties are columns of `info`. Answer with
# integers (`bucket` and `item` are indices). The check draws its batches and picks when it runs. Solution:
# `solutions/exercises.py` (in the repository, outside the package). After it come the CUDA build-it
# exercises for this notebook's two kernels.

# %%
def locate(table, inp, b, t, c):
    """Exercise 3: (bucket, item) of the bucket of ``table`` that reads dout[b, t, c]."""
    raise NotImplementedError("Exercise 3: find the bucket and the item that read dout[b, t, c]")


# %%
done = exercises.check_locate(locate)

# %% [markdown]
# ### (optional) Build them in CUDA
#
# With a GPU, write the two kernels themselves. Below are `kernels/encoder_backward_wpe.cu` and
# `kernels/encoder_backward_wte_bucketed.cu` with the kernels' bodies cut out, made from the files when
# the cells run. Write each body into its string. The check compiles it with the package's own loader
# (same `common.cuh`, same flags, bf16 and fp32), launches it with the real launch shape on problems drawn
# when it runs, compares its bits with the mirror, and on success times it next to the package's kernel.
# Worked solutions: `solutions/cuda/wpe.cu` and `solutions/cuda/wte_bucketed.cu` (outside the package).

# %%
display(Markdown(f"```cuda\n{skeletons.skeleton('wpe')}\n```"))

# %%
my_wpe_cu = r"""
    // ===== YOUR CODE HERE =====
"""

# %%
verdict = buildit.check_backward_wpe(my_wpe_cu)
verdict.show()

# %% [markdown]
# The whole `kernels/encoder_backward_wpe.cu`, as the package compiles it, opens here once your wpe kernel
# passed (`unlocked=True` opens it now, for instance without a GPU):

# %%
reveal.kernel("wpe", unlocked=verdict)

# %%
display(Markdown(f"```cuda\n{skeletons.skeleton('wte_bucketed')}\n```"))

# %%
my_wte_cu = r"""
    // ===== YOUR CODE HERE =====
"""

# %%
verdict = buildit.check_backward_wte_bucketed(my_wte_cu)
verdict.show()

# %% [markdown]
# The whole `kernels/encoder_backward_wte_bucketed.cu` (the block form, the warps form the package launches and
# its prefetching variant) opens here once your wte kernel passed (`unlocked=True` opens it now):

# %%
reveal.kernel("wte_bucketed", unlocked=verdict)
