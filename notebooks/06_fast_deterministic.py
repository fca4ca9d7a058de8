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
# # 06 · The fast deterministic path: chunked wte kernel and GPU bucketing
#
# **Goal:** read the two kernels that make the deterministic backward fast: the **chunked** wte kernel,
# which no longer lets one frequent token set the time, and the **GPU bucket table**, which builds the
# table of notebook 03 on the GPU, with no host round trip, instead of on the host. Then tie the skew of the ids
# to measured time.
#
# **Prerequisites:** notebook 03 (the bucket table, the bucketed kernel: one block of 8 warps per bucket) and basic
# CUDA: threads, blocks, warps of 32 lanes, `__shfl_sync`, shared memory and `__syncthreads`. The few CUDA features
# beyond that appear mostly in optional sections and are glossed in the table below, one line each. Notebook 04's
# stochastic rounding is used, not explained again.
#
# **After this notebook you can:**
# 1. say what a chunk, a unit, a channel group and a warp are in the chunked kernel, count the warps a token gets (3 per
#    chunk at C = 768 in bf16), and find the unit, the channel group and the item that read one element of `dout`
#    (Exercise 6 checks it);
# 2. write down the chunked method's order of the fp32 adds, and say why it gives other bits than the bucketed
#    one in fp32 but usually the same in bf16;
# 3. say which route builds the bucket table on the GPU for a given batch size, and why none of them makes the host
#    wait;
# 4. read from the committed timings why the chunked kernel's time does not grow with the skew of the ids.
#
# **Time:** about 30 minutes for the core sections, 20 more for those marked *(optional)* (`docs/teaching.md`).
#
# 0. Setup · 1. What was slow · 2. The words, once: one token from positions to `dwte`; Exercise 6 · 3. The
# chunked kernel, per thread (3a, optional: the combine kernel; 3b, optional: in CUDA) · 4. Same bits every run, a
# different order than bucketed · 5. The GPU bucket table: three routes (5a-5c, optional: each route) · 6. (optional)
# What the table costs, phase by phase · 7. Skew against measured time · 8. (optional) One sequence, one launch

# %% [markdown]
# ### (optional) CUDA beyond the prerequisites
#
# One line each (the helpers named are in `kernels/common.cuh`); the last column says which section uses it. Read a
# row when you reach its section.
#
# | feature | what it does | where |
# |---|---|---|
# | `__match_any_sync(mask, v)` | a warp **match**: each lane gets the mask of the lanes whose `v` equals its own (sm_70 and newer) | 5a, 5b |
# | `__ballot_sync(mask, p)` | a warp **ballot**: every lane gets the same 32-bit mask, bit `l` set where lane `l`'s predicate `p` is true | 5b |
# | `__syncwarp()` | a barrier for the 32 lanes of one warp only | 3b |
# | `cp.async` (`copy16_async`, then `commit_async_copies` and `wait_async_copies`) | copies 16 bytes from global to shared memory without holding a register while it travels; the thread waits for its copies before it reads them (sm_80 and newer) | 3a, 3b |
# | programmatic dependent launch (`allow_next_grid` / `wait_for_previous_grid`) | the next kernel on the stream starts its setup while this one still runs, and waits in `wait_for_previous_grid` until this one's writes are visible (sm_90 and newer; elsewhere both do nothing) | 3b, 7 (its optional part) |
# | cooperative launch | a launch whose blocks are all resident on the GPU at once (the grid must fit), so that `grid.sync()` can be a barrier across the whole grid | 5c |
# | CUDA graph | a sequence of launches recorded once from a stream and replayed with one call from the host | 5b, 6 |

# %%
import importlib.util, os, subprocess, sys
sys.path[:0] = [os.path.abspath("..")] if os.path.isdir("../gpt2enc_edu") else []  # a checkout: the folder above notebooks/
if importlib.util.find_spec("gpt2enc_edu") is None:  # Colab or Kaggle: pip-install it from the repository GPT2ENC_EDU_REPO names
    repo = os.environ.get("GPT2ENC_EDU_REPO") or sys.exit("gpt2enc_edu is not installed (notebooks/README.md). On Colab or Kaggle run `%env GPT2ENC_EDU_REPO=<owner>/gpt2enc-edu` (its GitHub repository), then this cell again.")
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", f"gpt2enc-edu[notebooks] @ git+https://github.com/{repo}"])
enc = importlib.import_module("gpt2enc_edu.course.hosted").setup()  # Colab or Kaggle: the CuPy for the runtime's CUDA

# %%
import inspect

import numpy as np
from IPython.display import HTML, Markdown, display

from gpt2enc_edu import bench, compare, layout, reference, tokens
from gpt2enc_edu.buckets import gpu as gpu_buckets
from gpt2enc_edu.buckets import mirror_cooperative, mirror_scatter, mirror_small
from gpt2enc_edu.backend import to_numpy
from gpt2enc_edu.course import arrays, cudasource, exercises, measured, perthread, plots, timing_plots
from gpt2enc_edu.loader import kernel_source
from gpt2enc_edu.problems import random_problem

# %% [markdown]
# ## 1. What was slow (core)
#
# Notebook 03's bucketed kernel gives each bucket (token × channel group) one block of 8 warps (the package's form gives
# a bucket of at most 8 items one warp instead, and a bigger bucket still a block). Its time is set by the **largest**
# bucket: with real text, one block sums the hundreds of positions of `"\n"` or `" "` in `ceil(size / 8)` rounds while
# the rest of the GPU has long finished. And llm.c builds the table on the host, from the ids its training loop already
# holds there: a hash map and a sort, then the table is copied to the GPU.
#
# One GPT-2 micro-batch of real text, in numbers:

# %%
# NBVAL_CHECK_OUTPUT
B, T, C = 8, 1024, 768
ids = tokens.make_ids("real", B, T, seed=0)
table = enc.make_buckets(ids, C, enc.bfloat16)
sizes = table.sizes[table.c_groups == 0]
print(f"{sizes.size} tokens, {table.num_buckets} buckets; the largest has {sizes[0]} positions "
      f"= {-(-sizes[0] // layout.WTE_WARPS)} rounds of 8 warps; the median bucket {int(np.median(sizes))} position(s)")
print(f"chunked: {table.num_units} units of at most {layout.CHUNK_ITEMS} positions, "
      f"{int((sizes > layout.CHUNK_ITEMS).sum())} tokens need more than one")

# %% [markdown]
# ## 2. The words, once (core)
#
# This notebook uses five words, always in these senses (the wte kernel files use the same ones):
#
# * **position**: one `(b, t)` of the batch, numbered `bt = b·T + t`. A token's positions are listed, ascending,
#   in its range of `bt_list` (the kernels call each entry of that list an *item*).
# * **channel group**: 256 consecutive channels in bf16 (32 lanes × a 16-byte pack of 8 channels each; 128 channels
#   in fp32). C = 768 in bf16 has 3 of them (the cell below computes it). A warp only ever sums one channel group.
# * **chunk**: up to 32 consecutive positions of one token's list (32, so that each lane of a warp loads one
#   position); a token seen n times has ⌈n / 32⌉ chunks, the last one shorter.
# * **unit**: one chunk of one token, the row `units[u] = (token, chunk, start, size)` of the table (`start` and
#   `size` are the token's whole range in `bt_list`; the chunk begins `chunk · 32` items in).
# * **warp**: the *chunk kernel* (the first of the chunked method's two kernels; the *combine kernel*, section 3,
#   is the second) gives **one warp to each (unit, channel group)**: at C = 768 in bf16, 3 warps per unit. A block
#   holds the warps of 8 units for one channel group (`blockIdx.y`), so the 3 warps of a unit sit in 3 blocks and
#   never share one. (Notebook 03's *bucket* is a (token, channel group), given a block of 8 warps by llm.c's kernel:
#   the next cell prints both counts.)

# %%
groups = layout.num_c_groups(C, enc.bfloat16)
print(f"C={C}, bf16: {groups} channel groups of {layout.c_per_group(enc.bfloat16)} channels")
print(f"this batch: {table.num_units} units -> {table.num_units * groups} warps of the chunk kernel; "
      f"{table.num_buckets} buckets -> {table.num_buckets * layout.WTE_WARPS} warps of llm.c's bucketed kernel")

# %% [markdown]
# ### Which tokens need several chunks?
#
# The twelve most frequent tokens of the batch, one bar per token, cut into its chunks (alternating colours).
# The bucketed kernel gives each bar (per channel group) to one block; the chunked kernel gives each coloured
# piece, a unit, one warp per channel group, so no warp sums more than 32 positions.

# %%
ax = plots.chunk_units(table, title="B=8, T=1024, real ids: the 12 most frequent tokens, cut into 32-position chunks")

# %% [markdown]
# *Figure: one bar per frequent token, its length the token's positions, cut into alternating-colour 32-position
# chunks, each labelled with its units and warps.*
#
# ### What happens to one frequent token, from its positions to `dwte`?
#
# The most frequent token of the batch: its positions in `bt_list`, cut into chunks, one unit each (top row); each
# unit's warps, one per channel group, each adding its chunk's `dout` rows for its 256 channels in position order;
# the warps of a unit together leave one **partial sum** of C fp32 values; one **combine** then adds the partials in
# chunk order, adds the old `dwte` value and rounds once.

# %%
ax = plots.token_flow(table)

# %% [markdown]
# *Figure: one token's positions -> chunks (units) -> a warp per (unit, channel group) -> one partial sum per
# unit -> one combine in chunk order.*
#
# The same units in the table (the first rows: the most frequent token's chunks):

# %%
# NBVAL_CHECK_OUTPUT
print("units[:4] (token, chunk, start, size):\n", table.units[:4])
top = table.units[table.units[:, 0] == table.units[0, 0]]
print(f"token {top[0, 0]}: {len(top)} units, chunks {top[0, 1]}..{top[-1, 1]}, positions "
      f"bt_list[{top[0, 2]} : {top[0, 2] + top[0, 3]}]")


# %% [markdown]
# Small units help at the other end too: a token seen once (most tokens) occupies one warp per channel group, where
# llm.c's bucketed kernel starts 8 warps per bucket and 7 of them find nothing to do.
#
# ### Exercise 6: which warp reads `dout[b, t, c]`? (core)
#
# Write `locate_unit(table, inp, b, t, c)` returning `(unit, group, item)`: the row of `table.units` whose warps
# read that gradient, the channel group of the one warp among them that reads it (its `blockIdx.y`), and the item
# of the unit's chunk that is position `(b, t)` (0 to 31: lane `item` of the warp loads that position, and its row
# is add number `item`, counting from 0, of the chunk partial; unlike Exercise 3's, this item counts from the start
# of the chunk, not of the token's whole list). `table` comes from `enc.make_buckets(inp, C,
# dtype)` with a NumPy `inp`, as in the cells above.
#
# *Hint:* the token is `inp[b, t]`, and a channel group is `table.c_per_group` channels wide; a token's units are
# consecutive rows of `table.units`, in chunk order, and every one of them holds the token's whole range of
# `bt_list` (`start`, `size`), not its chunk's. Answer with
# integers. The check draws its batches (each with a token seen more than 32 times, and C of two channel groups or
# more) and its picks when it runs. Solution: `solutions/exercises.py` (in the repository, outside the package).

# %%
def locate_unit(table, inp, b, t, c):
    """Exercise 6: (unit, channel group, item) of the chunk kernel's warp that reads dout[b, t, c]."""
    raise NotImplementedError("Exercise 6: find the unit, the channel group and the item that read dout[b, t, c]")


# %%
done = exercises.check_locate_unit(locate_unit)

# %% [markdown]
# ## 3. The chunked kernel, per thread (core)
#
# Every sum still has one fixed order. For each channel:
#
# * the **chunk partial** adds the chunk's items in `bt` order: `p = ((0 + d[item 0]) + d[item 1]) + …`;
# * the **token total** adds the partials in **chunk order**: `s = ((p₀ + p₁) + p₂) + …`;
# * `dwte = round(s + old dwte)`, once (stochastically for bf16, keyed by the element as in notebook 04).
#
# A token of one chunk is finished by its warps. A token of several chunks needs its partials added in chunk order,
# and a block holds only 8 units, so its chunks' warps may sit in different blocks (they always do past 8 chunks),
# which cannot wait for each other inside one launch (no barrier spans a grid, short of a cooperative launch, whose
# blocks are all resident at once). So they store their partials in a scratch buffer, and a second, small kernel, the
# *combine* kernel, adds them in chunk order once the first has ended. One launch could do it too, the last of a
# token's warps to finish adding the partials after an atomic count; measured, that was slower (section 3a).
#
# Below, the chunk kernel in per-thread Python (`gpt2enc_edu.course.perthread`: the CUDA's index math and fp32 adds,
# one lane at a time): `unit` from the block and warp index (`CHUNKED_WARPS_PER_BLOCK` = 8 warps per block, a unit
# each), the channel group from `blockIdx.y`, lane `l` loading item `l`'s position, the loop over the chunk's items,
# then either the rounded store into `dwte` (a token of one chunk) or the partial into `partials`.

# %%
display(Markdown(f"```python\n{inspect.getsource(perthread.encoder_backward_wte_chunked)}\n```"))

# %% [markdown]
# Run over the grid by `perthread.launch_backward_wte_chunked`, with the combine kernel of section 3a, on a small
# skewed problem, it gives the bits of the package (the NumPy mirror on a CPU, the kernel on a GPU; the next cell
# says which runs here):

# %%
xp = arrays()

# %%
# NBVAL_CHECK_OUTPUT
small = random_problem(2, 48, 512, 64, dtype=enc.bfloat16, ids="zipf", rng=np.random.default_rng(6))
small.inp[:, ::2] = 3  # token 3 at half of the 96 positions: 48 items, two chunks
small_table = enc.make_buckets(small.inp, small.C, small.dtype)
by_thread = small.dwte.copy()
perthread.launch_backward_wte_chunked(perthread.encoder_backward_wte_chunked, perthread.encoder_backward_wte_chunk_combine,
                                      by_thread, small_table, small.dout, 77)
on = small.on(xp)
enc.encoder_backward(on.dwte, on.dwpe, on.dout, on.inp, seed=77, method="chunked")
print(f"{small_table.num_units} units ({int((small_table.sizes[small_table.c_groups == 0] > 32).sum())} token(s) "
      f"with several chunks); per-thread Python == encoder_backward(method='chunked'):",
      compare.bitwise_equal(by_thread, on.dwte))

# %% [markdown]
# ### 3a. (optional) The combine kernel, per thread
#
# The combine kernel has a block for every unit (the blocks of single-chunk tokens leave at once); the blocks of one
# token share out its channels, so a token of hundreds of chunks is added by many SMs at once. The scratch buffer
# `partials` holds one row per unit, C fp32 values rounded up to whole channel groups (`c_padded`), so a token's
# partials are consecutive rows, from row `unit - chunk` on. The kernel's words:
#
# * **column**: 4 channels, one 16-byte pack of fp32 partials, added by one thread;
# * **slice**: `width` consecutive columns of the token. `combine_slices(num_chunks, C)` gives `(num_slices, width)`:
#   about one slice per chunk, none wider than the block's `COMBINE_THREADS` threads nor much narrower than
#   `COMBINE_MIN_COLUMNS` columns; the block of chunk `k` takes slice `k` (and `k + num_chunks`, … where there are more
#   slices than chunks), and a block with no slice leaves;
# * **stage**: up to `COMBINE_STAGE_PACKS` 16-byte packs of the slice's partial rows, which the whole block copies
#   into shared memory before thread `col` adds its column of them in chunk order (the CUDA keeps two stages in flight
#   with `cp.async`; the per-thread form, one).
#
# Why not one launch, with the last warp of a token to finish adding its partials (an atomic count after a
# `__threadfence()`)? It was measured: the chunk kernel went past its register cap, and at B = 64 it was up to twice
# as slow (`docs/experiments.md`, "L2 prefetch of a chunk's rows; the combine done by the last warp").

# %%
print(f"COMBINE_THREADS = {layout.COMBINE_THREADS}, COMBINE_MIN_COLUMNS = {layout.COMBINE_MIN_COLUMNS}, "
      f"COMBINE_STAGE_PACKS = {layout.COMBINE_STAGE_PACKS}")
for num_chunks in (2, 16, 289):
    num_slices, width = (int(v) for v in layout.combine_slices(num_chunks, C))
    print(f"C={C}, {num_chunks:3d} chunks: {num_slices} slices of {width} columns")
display(Markdown(f"```python\n{inspect.getsource(perthread.encoder_backward_wte_chunk_combine)}\n```"))

# %% [markdown]
# ### 3b. (optional) The same kernels in CUDA
#
# Read from `kernels/encoder_backward_wte_chunked.cu` (the cell shows it collapsed: click its line to open it).
# Things to notice:
#
# * **The warps.** One warp per (unit, channel group); `blockIdx.y` is the channel group. Lane `l` first loads the
#   position of item `l` of the chunk, and the warp then passes positions around with `__shfl_sync`: no block
#   barrier.
# * **Two forms of the chunk kernel**, one `chunk_warp` template apart, adding the same rows in the same order: rows
#   read one at a time into registers, or 8 at a time into the warp's own region of shared memory with `cp.async` (more
#   rows in flight without the registers to hold them). The package takes the second where the grid is one *wave* (all
#   its blocks fit on the SMs at once, so none waits for another to finish): at GPT-2 shapes on a GPU of 132 SMs (an
#   H100 SXM or an H200), up to two sequences.
# * **The combine kernel.** The whole block copies its slice of a token's partials into shared memory, two stages
#   in flight, then adds them in chunk order, one thread per column.

# %%
display(HTML(cudasource.listing(kernel_source('encoder_backward_wte_chunked.cu'),
                                 "kernels/encoder_backward_wte_chunked.cu: the chunk and combine kernels (click to open)")))

# %% [markdown]
# ## 4. Same bits every run, a different order than bucketed (core)
#
# The chunked kernel adds the same terms as the bucketed one, in another fixed order (chunks of 32 in `bt`
# order, instead of 8 warps striding over the bucket). So: bitwise equal from run to run and to the mirror,
# within the same bound of the float64 reference, but **not** bitwise equal to the bucketed kernel. Both are
# deterministic; they are two different definitions of the fp32 sum. The problem below stores **fp32**
# gradients, where every low bit shows. B = 4 and V = 8192 rows keep the CPU run light.

# %%
# NBVAL_CHECK_OUTPUT
p = random_problem(4, 1024, 768, 8192, dtype=np.float32, ids="zipf", rng=np.random.default_rng(7))
results = {}
for method in ("chunked", "chunked", "bucketed"):
    on = p.on(xp)
    enc.encoder_backward(on.dwte, on.dwpe, on.dout, on.inp, seed=99, method=method)
    results.setdefault(method, []).append(to_numpy(on.dwte))
cpu = p.on(np)
enc.encoder_backward(cpu.dwte, cpu.dwpe, cpu.dout, cpu.inp, seed=99, method="chunked")
ref = reference.backward(p.dwte, p.dwpe, p.dout, p.inp)
bound = compare.error_bound(p.dtype, ref.dwte_abs, ref.max_terms)
chunked, bucketed = results["chunked"][0], results["bucketed"][0]
print("chunked: checksum", compare.checksum(chunked))
print("  run 1 == run 2:", compare.bitwise_equal(*results["chunked"]), "; == NumPy mirror:", compare.bitwise_equal(chunked, cpu.dwte))
print("  within the bound of float64:", compare.within_bound(chunked, ref.dwte, bound))
ulps = np.abs(compare.ulp_difference(chunked, bucketed))
print(f"chunked vs bucketed: {np.count_nonzero(ulps):,} of {chunked.size:,} elements differ, "
      f"{100 * np.mean(ulps[ulps > 0] <= 2):.0f}% of those by 1 or 2 ULPs (more where the terms cancel and an "
      "ULP of the result is tiny); bucketed within the bound:",
      compare.within_bound(bucketed, ref.dwte, bound))
del results, cpu, ref, bound, chunked, bucketed, ulps


# %% [markdown]
# ### Why bf16 runs of the two methods usually agree
#
# In training the gradients are **bf16** values, and notebook 07 (GPU configuration, bf16 weights) finds the chunked
# and bucketed runs identical, bit for bit. Two reasons. An fp32 sum of bf16 values (8 significant bits; fp32 keeps
# 24) is exact as long as every partial sum, from its leading bit down to the lowest bit of any term, fits in 24 bits:
# true for most sums of values of similar size, and an exact sum does not depend on the order. Where two orders do
# give different fp32 sums, the difference sits in the low 16 bits that rounding to bf16 drops: with the same
# element-keyed threshold for both methods, stochastic rounding gives them the same bf16 value unless the threshold
# falls between the two, a chance of (their difference in fp32 ULPs) / 65536 when both lie between the same two bf16
# values (notebook 04). The cell runs the same problem three ways with `dwte` starting at zero, so every
# difference of the sums shows (the cell above added each sum to a nonzero old `dwte`, which can hide one: its count
# is the smaller).

# %%
def differing(problem):
    """Elements of dwte (starting at zero) where the chunked and the bucketed method give other bits."""
    bits = []
    for method in ("chunked", "bucketed"):
        on = problem.on(xp)
        on.dwte[...] = 0
        enc.encoder_backward(on.dwte, on.dwpe, on.dout, on.inp, seed=99, method=method)
        bits.append(to_numpy(on.dwte))
    return int(np.count_nonzero(compare.ulp_difference(*bits)))


bf16_values = random_problem(4, 1024, 768, 8192, dtype=np.float32, ids="zipf", rng=np.random.default_rng(7))
bf16_values.dout[...] = bf16_values.dout.astype(enc.bfloat16).astype(np.float32)  # the same dout, 8 bits each
bf16_storage = random_problem(4, 1024, 768, 8192, dtype=enc.bfloat16, ids="zipf", rng=np.random.default_rng(7))
for name, problem in (("fp32 dout, fp32 sums stored", p), ("bf16-valued dout, fp32 sums stored", bf16_values),
                      ("bf16 dout, sums rounded to bf16", bf16_storage)):
    print(f"{name:36s}: chunked and bucketed differ in {differing(problem):>9,} of {p.dwte.size:,} elements")
del p, bf16_values, bf16_storage

# %% [markdown]
# With full fp32 inputs the two orders differ in tens of thousands of elements; with bf16-valued inputs the fp32 sums
# are almost all exact, so the order shows in very few; rounded to bf16 they agree (the output says how many differ, if
# any). A different order is a different definition, and nothing *guarantees* agreement: it is a property of these
# values, which is why the package tests each method against its own mirror, not against the other method.
#
# ## 5. The GPU bucket table: three routes (core)
#
# The table itself is a sort: positions gathered by token, tokens by count descending, ties by id. llm.c does
# it on the host with a hash map and `std::sort`; the package's NumPy route with NumPy sorts. On the GPU the
# package builds the **same table, bit for bit,** with no host round trip, by one of three routes, which
# `gpt2enc_edu.buckets.bucketing_route` picks by the number of ids:
#
# | route | its name in the package and the figures | kernel file: kernels | launches | the idea |
# |---|---|---|---|---|
# | one-block | `small` | `kernels/bucketing_small.cu`: `bucketing_small_kernel` | one block, one launch | sort all (id, position) keys of one sequence in one block |
# | scatter | `scatter` | `kernels/bucketing_scatter.cu`: five `scatter_*_kernel`s | five short kernels, replayed as one CUDA graph | count each token, compute each token's start by arithmetic, scatter the positions, sort each token's few positions |
# | cooperative | `cooperative` | `kernels/bucketing.cu`: `bucketing_kernel` | one cooperative launch | two grid-wide radix sorts, phases separated by grid-wide barriers |
#
# Two words the routes share: a token seen more than 32 times (`CHUNK_ITEMS`) is **big**; every other token belongs
# to the **class** of its count, 1 to 32. The bucket order puts the big tokens first, then the classes 32, 31, …, 1,
# ids ascending inside a class.
#
# (A *CUDA graph* is a sequence of launches recorded once and replayed with one call from the host; a *cooperative
# launch* keeps all its blocks resident at once, so a barrier across the whole grid is legal. The cells below print
# the names of the second column; section 6's figures title each panel with its route and kernel.)
#
# Which batch sizes take which route at T = 1024 (any route that takes a batch can also be asked for by name,
# `gpt2enc_edu.buckets.build_bucket_table_gpu(..., route=...)`). For at most 1024 ids on a GPU, `method="chunked"`
# needs no table at all: one kernel does its whole backward (section 8); the table serves the bucketed method, larger
# batches, and a table built ahead of the call.

# %%
for batch in (1, 2, 8, 64, 65, 128):
    print(f"B={batch:3d}: {batch * T:6d} ids -> {gpu_buckets.bucketing_route(batch * T, tokens.GPT2_VOCAB_SIZE)}; "
          f"routes that can take it: {', '.join(gpu_buckets.routes_for(batch * T, tokens.GPT2_VOCAB_SIZE))}")

# %% [markdown]
# **No host sync**, whichever route. A launch's grid size is set on the host, so a table whose size only the GPU knows
# would make the host wait for it. Instead the size stays on the GPU (`counters`); the wte kernel is launched for an
# upper bound of buckets or units that the host knows from B·T and V alone, and its blocks past the real count, read
# from `counters`, leave at once. The host never waits.
#
# ### 5a. (optional) The one-block route (`small`): one sequence
#
# With so few ids nothing is limited by bandwidth; what costs is every launch and every barrier. One block of 512
# threads holds two keys per thread and sorts all 1024 keys (id, position) with a bitonic network, which gathers the
# positions of each token, in ascending order. Of the network's 55 compare-exchange steps, 10 swap registers inside a
# thread, 35 swap through warp shuffles, and only 10 need shared memory and a barrier (a bitonic network is a fixed
# sequence of compare-and-swap steps that sorts any input, so every thread knows its partner at each step). The tokens
# are then put in bucket order without a second sort, by their count classes (5b says why classes make that
# arithmetic). The (at most 1024) distinct tokens, in id order, form 32 **sets** of 32 consecutive tokens, one set in
# the 32 lanes of a warp (the kernel's comments call a set a *group*, `SMALL_GROUPS`; this notebook keeps that word
# for channel groups). A warp finds which tokens of its set share a count with a warp **match** (`__match_any_sync`:
# every lane learns which lanes hold the same value as its own), a scan (running sums: each entry gets the sum of the
# entries before it) per class over the 32 sets gives each token its place in its class, and the few tokens seen more
# than 32 times are ranked by comparing them with each other. A scan of the counts gives every token its start in
# `bt_list`. One launch in all. (The chunked wte kernels read only the units and `bt_list`, so for the chunked method
# the kernel skips the bucket rows: three 16-byte rows per token, written from one SM, would cost up to a tenth of its
# time.)
#
# ### 5b. (optional) The scatter route: up to 64 sequences
#
# (Why 64: one of its steps keeps a bitmap of all B·T positions in a block's shared memory, one bit each, sized for
# 64 × 1024 positions; larger batches take the cooperative kernel of 5c.) It needs no sort of the positions and no
# grid-wide barrier, because of two facts about this particular table:
#
# * **Most tokens are seen at most 32 times**, so most tokens are in a class, and the big ones are few. All tokens of
#   a class have the same count, so a token's start in `bt_list` is arithmetic: the class's first slot + (its place in
#   the class) × count. Its place in the class is a count of same-class tokens with smaller ids: per *tile* of 1024
#   consecutive token ids (one block, a set of 32 ids per warp), one warp match (`__match_any_sync`) and a scan over
#   32 warps. The big tokens (at most B·T / 33 of them) are ranked by one block comparing (count, id) keys.
# * **Inside a token, `bt_list` must be ascending, and that is a small sort.** Every position goes into its
#   token's range at whatever slot an integer atomic hands out; then each range is sorted on its own: a warp
#   sorts a small token's ≤ 32 positions (each lane counts the positions smaller than its own), a block sorts
#   a big token's by setting one bit per position in a bitmap of all B·T positions and reading the set bits
#   out in order. The warp needs nothing but the class starts to find a small token's range: its rank says its
#   class (one ballot, `__ballot_sync`, over the 32 classes' first ranks), and the arithmetic above says where the
#   range begins. So the chunked method's table skips the small tokens' bucket rows here too.
#
# Five short kernels: count; classify (which also counts the big tokens and adds up their items and units); rows,
# where one block ranks the big tokens while every other block writes a tile's small tokens (each block finds where
# the classes start from the class totals and those three numbers of the big tokens, so none waits for another);
# scatter positions; sort each range. No memset before them: the scatter kernel counts every token back down, so the
# counts are zero again for the next table. The package replays the five as one CUDA graph, so the host pays for one
# call instead of five launches (a graph keeps the address of the ids it was captured with: an ids buffer seen before
# gets a graph of its own that reads it in place; any other is first copied into the buffer of a shared graph).
#
# ### 5c. (optional) The cooperative kernel: larger batches
#
# The same table from two stable radix sorts (sorts digit by digit that keep equal keys in their order: tokens by
# count class, positions by their token's rank) in one
# cooperative launch, whose phases are separated by about twenty grid-wide barriers (`grid.sync()`, legal because a
# cooperative launch keeps every block resident).
#
# ### Every route, the same table (core)
#
# What the classes (section 5's opening) look like for the B = 8 real-text batch of this notebook, and the NumPy twins
# (kernel by kernel: `gpt2enc_edu.buckets.mirror_scatter`; phase by phase: `gpt2enc_edu.buckets.mirror_cooperative`
# and, on the batch's first sequence, `gpt2enc_edu.buckets.mirror_small`) against `make_buckets`; on a GPU, the
# default route too:

# %%
# NBVAL_CHECK_OUTPUT
V = tokens.GPT2_VOCAB_SIZE
counts = np.bincount(ids.ravel(), minlength=V)
big = counts > layout.CHUNK_ITEMS
print(f"{int((counts > 0).sum())} distinct tokens: {int(big.sum())} big ones ({int(counts[big].sum())} of the "
      f"{ids.size} positions), the rest in classes 1..32 by count:")
print("  tokens per class:", {c: int((counts == c).sum()) for c in (1, 2, 3, 4, 8, 16, 32)}, "...")
first_sequence = ids[:1]
for name, twin, want in (
        ("scatter route", mirror_scatter.bucketing_scatter(ids, C, enc.bfloat16, V), table),
        ("cooperative kernel", mirror_cooperative.bucketing_kernel(ids, C, enc.bfloat16, V, num_blocks=4), table),
        ("one-block kernel (first sequence)", mirror_small.bucketing_small_kernel(first_sequence, C,
                                                                                            enc.bfloat16, V),
         enc.make_buckets(first_sequence, C, enc.bfloat16))):
    print(f"twin of the {name} == make_buckets:",
          all(np.array_equal(getattr(twin, f), getattr(want, f)) for f in ("info", "bt_list", "units")))
device_table = enc.make_buckets(xp.asarray(ids), C, enc.bfloat16, V=V)
host_copy = device_table.to_host() if xp is not np else device_table
print("make_buckets on this backend == make_buckets with NumPy:",
      all(np.array_equal(getattr(host_copy, f), getattr(table, f)) for f in ("info", "bt_list", "units")))
del counts, big, first_sequence, twin, want

# %% [markdown]
# ## 6. (optional) What the table costs, phase by phase
#
# `gpt2enc_edu.buckets.gpu.phase_times_us` runs a route stopped after step 1, 2, … and takes the differences (for the
# cooperative kernel "launch" is a run that returns at once; each step of the scatter route is a launch of its
# own). On a GPU the cell measures now; on a CPU it draws the numbers committed from a GPU run
# (`docs/walkthrough/bucketing_phases.json`). The title says which, and names the card.
#
# ### Where does the table's time go, for one sequence and for 64?

# %%
phases = measured.bucketing_phases(xp)
print(phases["source"] if phases else "no GPU here and no committed numbers in docs/walkthrough/")
fig = timing_plots.bucketing_phases(phases)

# %% [markdown]
# *Figure: the GPU bucket table's time split by phase: the one-block kernel and the scatter route at B = 1, the
# scatter route and the cooperative kernel at B = 64, each with its whole time in grey.*
#
# At **B = 1** there are 1024 ids, 4 KB: no step is limited by bandwidth. Each of the scatter route's kernels
# costs one to four microseconds, most of it the latency of a launch and of a few dependent loads; the
# one-block kernel pays one launch, and its sort of the positions is the largest of its phases. At
# **B = 64** (65,536 ids) the cooperative kernel spends most of its time in the two stable sorts and the scans,
# each a chain of grid-wide barriers; the scatter route does the same job in less than half the time: its
# largest steps are the atomics of the counting and scattering kernels, the per-token sorts and the rows step
# (whose block 0 ranks the big tokens), and none of them waits for the whole grid. Either is tens of microseconds,
# against milliseconds for the host route (notebook 05).
#
# **Why the benchmark's B = 1 table takes longer than the one-block panel's whole bar above.** The two measure different
# things. The phase plot times 20 launches captured back to back in one CUDA graph, with the ids and the workspace
# already in L2, and divides by 20: each launch starts while the one before drains, so this is the kernel's own work.
# The benchmark (`gpu_buckets` in `docs/bench/`, `bench/cases.py`) times **one** call the way a training step makes it:
# CUDA events around it, after a write of at least twice the L2 size has evicted the inputs, so it also pays a lone
# launch's start and drain and its first reads from HBM. The cell prints both: the phases as the figure has them (on a
# GPU measured now, on a CPU the committed ones: the line above the figure says which, and names the card) and the
# bench's line with its card. Compare the two where the card is the same (the cell says when it is not):

# %%
try:
    rows, meta = bench.load_results(measured.bench_dir())  # docs/bench/, or the copy an installed wheel carries
except FileNotFoundError as exc:
    rows, meta = [], {}
    print(exc)
one_block = next((run for run in (phases or {}).get("runs", []) if run["B"] == 1 and run["route"] == "small"), None)
if one_block:
    print(f"phase plot, one-block route, B=1 ({phases.get('device')}): {one_block['total_us']:.1f} us per launch, "
          "20 back to back in a graph")
bench_b1 = {r["ids"]: float(r["median_us"]) for r in rows if r["case"] == "gpu_buckets" and int(r["B"]) == 1}
if bench_b1:
    print(f"benchmark, gpu_buckets, B=1 ({meta.get('device')}): one call, cold L2: "
          + ", ".join(f"{kind} {us:.1f} us" for kind, us in bench_b1.items()))
if one_block and bench_b1 and phases.get("device") != meta.get("device"):
    print("two different cards: the gap between the lines holds the cards' difference too")

# %% [markdown]
# On one card, most of the difference is what the bench's timer adds to any call: `docs/experiments.md` ("What a timed
# call holds besides the kernels") times a kernel of one thread the bench's way: 2.9 µs on an H200 (no H100 figure is
# committed), of the order of the gap between the two lines above; the cold reads of the ids add a little (the same
# section times the table with and without the flush).
#
# ## 7. Skew against measured time (core)
#
# The point of both kernels, measured: time per call against B for uniform, Zipf and real ids, for the bucketed method
# (the package's kernel, in llm.c's order; llm.c's own is not timed here) and the chunked one, from the committed
# benchmark (`docs/bench/results.csv`, `python -m gpt2enc_edu.bench`; the output names its card; the notebook does not
# re-run it). The "wte kernel alone" panels appear where the results hold those cases. The bench times one call as a
# training step makes it: CUDA events around a lone launch after an L2 flush, so each time also holds the start and
# drain of a launch (the timer's own cost, a few microseconds) and the first reads from memory. That is why a small
# call's time here sits above the same work timed back to back with warm caches (section 6's phase plot; its last cell
# prints the two for the B = 1 table). First, how skewed each kind of ids is, and how many distinct tokens each has:

# %%
# NBVAL_CHECK_OUTPUT
for kind in tokens.KINDS:
    counts = np.bincount(tokens.make_ids(kind, 64, 1024, seed=0).ravel())
    print(f"B=64, {kind:8s} ids: the most frequent token fills {100 * counts.max() / counts.sum():4.1f}% of the positions "
          f"({counts.max()} of them: {-(-counts.max() // layout.WTE_WARPS)} rounds of the bucketed block, "
          f"{-(-counts.max() // layout.CHUNK_ITEMS)} chunks); {int((counts > 0).sum())} distinct tokens")

# %% [markdown]
# ### Does the kind of ids change the time, for each method?

# %%
wanted = {"wte_bucketed_kernel": "wte kernel alone: bucketed (package's kernel, llm.c's order)",
          "wte_chunked_kernel": "wte kernel alone: chunked",
          "bucketed_gpu": "whole backward: bucketed, GPU table",
          "chunked_gpu": "whole backward: chunked, GPU table"}
present = {case: label for case, label in wanted.items() if any(r["case"] == case for r in rows)}
if present:
    print(f"committed results: {meta.get('device')}, {meta.get('date')}")
    for case, label in present.items():
        by_b = timing_plots.spread_by_kind(rows, case)
        big = max(by_b)
        times = ", ".join(f"{kind} {us:.0f} µs" for kind, us in by_b[big].items())
        print(f"  {label} at B={big}: {times}; slowest / fastest kind {max(by_b[big].values()) / min(by_b[big].values()):.2f}")
    largest = max(int(r["B"]) for r in rows)
    above = {r["ids"]: float(r["median_us"]) / float(r["floor_us"]) for r in rows
             if r["case"] == "chunked_gpu" and int(r["B"]) == largest}
    print(f"  whole chunked backward at B={largest}, time / memory floor:",
          ", ".join(f"{kind} {x:.1f}x" for kind, x in above.items()))
    fig = timing_plots.skew_vs_time(rows, present, title="deterministic wte backward: time against B, by kind of ids")

# %% [markdown]
# *Figure: one panel per kernel or route, time against B on log axes, one line per kind of ids.*
#
# How to read it, with the printed numbers beside it. Skew is a property of the ids: Zipf(1.1) is the most skewed here,
# the real text about half as much, uniform not at all (the first cell of this section). The **bucketed** kernel (the
# largest bucket on one block) follows that skew at large B: the Zipf line lies above the others, because one block sums
# the top token's thousands of positions in the rounds that cell prints while the rest of the GPU waits. With the
# **chunked** kernel the kinds come together: each chunk of the top token is a unit with 3 warps of its own, no warp
# sums more than 32 positions, and at large B the skewed batches even cost less than the uniform one (fewer distinct
# tokens mean fewer `dwte` rows to read and write: the likely reason). Yet the whole chunked backward stays above its
# memory floor by the printed ratio, and the fewer distinct tokens the ids have, the farther above it: real ids, with
# the fewest, sit farthest, though Zipf ids are the more skewed. What holds it there, we infer (it has not been
# profiled), is the table's chain of short steps, the wte kernels' scattered row reads and, for tokens of several
# chunks, the combine kernel: costs that do not shrink with the floor when fewer distinct tokens make it smaller. At
# small B every line flattens: fixed costs (launches, the table's short steps of section 6) outweigh the bytes moved,
# which is also why no kernel gets near its floor there (notebook 05).
#
# ### (optional) Why a piece alone can take longer than the whole call
#
# Compare, in the printed lines, the bucketed wte kernel alone with the whole bucketed backward that holds it. The bench
# times each piece alone, after overwriting L2 (cold: all of `dout` comes from memory). Inside the whole call the wpe
# kernel reads all of `dout` beside the table and the wte kernel, so the wte kernel can find in L2 part of `dout` that
# the wpe kernel has just read; and on sm_90 and newer the call sets the wte kernel up while the kernel before it runs
# (`docs/benchmarks.md`, on the pieces; `docs/experiments.md`, "dout left in L2 for the wte kernels", for what keeping
# more of `dout` there changes).

# %% [markdown]
# ## 8. (optional) One sequence, one launch
#
# Built from a table as above, the chunked backward at B = 1 is four kernels: the table (one block, section 5), the
# chunk and combine kernels, and the wpe kernel beside them. Each costs a few microseconds that do not depend on the
# bytes: a launch, a wait for the kernel before, one SM sorting while the others idle.
# `kernels/encoder_backward_small.cu` does the whole backward of at most 1024 ids in one launch. **Every block sorts
# the ids itself**, with the one-block table's sort in shared memory, so every block knows the tokens' segments
# without a table in memory or a barrier across the grid, and takes its share of the tokens by index. A token seen at
# most 8 times is one warp's task, its rows all asked for at once. A more frequent token gets a whole block per
# channel group, whose threads each take 8 bytes of channels (4 bf16) of one chunk: 64 threads cover a channel group,
# so a block of 512 threads works on 8 chunks at once, and a chunk's 32 rows are read at once instead of one after
# another. The sums, and so the bits, are the chunked method's; `encoder_backward(..., method="chunked")` takes this
# path by itself for up to 1024 ids on the GPU (`docs/performance.md`, "One launch for one sequence"), so the four
# kernels above are what it runs from a table built ahead, or for more ids. The cell below shows the file collapsed:
# click its line to open it.

# %%
display(HTML(cudasource.listing(kernel_source('encoder_backward_small.cu'),
                                 "kernels/encoder_backward_small.cu: the backward in one launch (click to open)")))

# %% [markdown]
# The check: one Zipf sequence with one token put at 600 of its positions (19 chunks: three passes of a block
# that works on 8 chunks at once).
# The one-launch backward (on a GPU the kernel, without one its mirror) against the table path (the table, the
# chunk and combine kernels and the wpe kernel, in the NumPy mirror), bit for bit.

# %%
# NBVAL_CHECK_OUTPUT
from gpt2enc_edu import cuda as launchers
from gpt2enc_edu import mirror as mirrors

one = random_problem(1, 1024, 256, 5000, dtype=enc.bfloat16, ids="zipf", rng=np.random.default_rng(8))
one.inp.reshape(-1)[np.random.default_rng(9).permutation(1024)[:600]] = 42  # a token in 19 chunks
fast, table_path = one.on(xp), one.on(np)
(launchers if xp is not np else mirrors).encoder_backward_small(fast.dwte, fast.dwpe, fast.dout, fast.inp, 1, 1024,
                                                                256, seed=2026)
enc.encoder_backward(table_path.dwte, table_path.dwpe, table_path.dout, table_path.inp, seed=2026, method="chunked")
print("one launch against the table path, dwte same bits:", compare.bitwise_equal(to_numpy(fast.dwte), table_path.dwte))
print("one launch against the table path, dwpe same bits:", compare.bitwise_equal(to_numpy(fast.dwpe), table_path.dwpe))
