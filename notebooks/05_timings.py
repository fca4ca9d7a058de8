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
# # 05 · Timings: how fast are the encoder kernels, and how far from the memory floor?
#
# **Goal.** Put numbers on the kernels of notebooks 01-04: the forward, the atomic backward (nondeterministic, with fp32
# accumulation faster than PyTorch's, yet far from its own floor: section 7 says why) and the deterministic backward
# (llm.c's scheme, the package's bucketed kernel, with the bucket table built on the CPU, as in llm.c, or on the GPU;
# and the chunked kernel of notebook 06, which cuts a frequent token's positions into chunks of 32 and sums each on its
# own; a *unit* is one chunk of one token), next to PyTorch's embedding, at GPT-2 (124M) sizes: T=1024, C=768, V=50257,
# bf16, batch sizes 1 to 64, for uniform, Zipf and real token ids. And say how good a time is by comparing it with a
# *floor*: the time a plain device-to-device copy would need to move the bytes the operation cannot avoid moving.
#
# The measurements come from `python -m gpt2enc_edu.bench`. The full sweep (B = 1, 4, 8, 16, 32 and 64, three
# kinds of ids) committed in `docs/bench/` is drawn on every machine, and says so; on a GPU this notebook also runs
# a small subset live (well under a minute) and shows it beside the committed run.
#
# **Prerequisites:** notebooks 01-03 (what the forward, the atomic and the bucketed backward do); the idea of
# memory bandwidth (bytes per second a GPU's memory moves). No GPU needed: the committed run is drawn.
#
# **After this notebook you can:**
# 1. compute the minimal bytes and the floor of the forward and the backward for a batch (Exercise 5 checks it);
# 2. read from the plots which costs set the time at B=1 (fixed costs) and at B=64 (bytes moved);
# 3. say why the forward stops well short of its floor, and which part of that answer is measured and which inferred;
# 4. say why the floor PyTorch is held to understates its traffic, and where it does not.
#
# **Time:** about 20 minutes for the core sections, 5 more for the one marked *(optional)* (`docs/teaching.md`).
#
# 0. Setup · 1. What is timed, and the floor · 2. Exercise 5: the floor of the backward · 3. The measurements ·
# 4. Why the forward stops short of its floor · 5. PyTorch against our floor · 6. (optional) The CPU bucketing ·
# 7. How to read the results

# %% [markdown]
# ## 0. Setup
# The next cell only makes `import gpt2enc_edu` work. Where the package is installed it does nothing.
# In a checkout it puts the checkout on `sys.path`. On a hosted service (Colab, Kaggle) it installs the
# package with what the notebooks need (from a clone, else from GitHub) and the CuPy wheel that matches the
# runtime's CUDA when there is a GPU.

# %%
import importlib.util, os, subprocess, sys
sys.path[:0] = [os.path.abspath("..")] if os.path.isdir("../gpt2enc_edu") else []  # a checkout: the folder above notebooks/
if importlib.util.find_spec("gpt2enc_edu") is None:  # Colab or Kaggle: pip-install it from the repository GPT2ENC_EDU_REPO names
    repo = os.environ.get("GPT2ENC_EDU_REPO") or sys.exit("gpt2enc_edu is not installed (notebooks/README.md). On Colab or Kaggle run `%env GPT2ENC_EDU_REPO=<owner>/gpt2enc-edu` (its GitHub repository), then this cell again.")
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", f"gpt2enc-edu[notebooks] @ git+https://github.com/{repo}"])
enc = importlib.import_module("gpt2enc_edu.course.hosted").setup()  # Colab or Kaggle: the CuPy for the runtime's CUDA

# %%
import matplotlib.pyplot as plt

from gpt2enc_edu import bench
from gpt2enc_edu.bench import plots as bench_plots
from gpt2enc_edu.course import exercises, measured, timing_plots
from gpt2enc_edu.tokens import make_ids
print(enc.gpu_status())

# %% [markdown]
# ## 1. What is timed, and what the floor is (core)
#
# Each *case* is a named function in `gpt2enc_edu/bench/cases.py` that prepares one call; the timer then runs it many
# times. Before every repeat the timer writes a buffer at least twice the size of the GPU's L2 cache, so the inputs come
# from HBM (the GPU's main memory) as they would in training, and queues a short spin kernel so that the CUDA events
# (timestamps the GPU itself records between two kernels) time the GPU's work rather than Python's launch overhead:
# while the spin kernel keeps the GPU busy, the host queues the start event, the call's kernels and the end event, so
# the GPU meets them back to back instead of waiting for Python between them. The plots draw the median; the 10th and
# 90th percentiles are beside it in `docs/bench/results.md` and `results.csv`.
#
# **Minimal bytes.** An ideal kernel reads each input byte once and writes each output byte once:
#
# * forward: write `out` (B·T·C), read the *distinct* wte rows the batch uses, the T wpe rows, the ids;
# * backward: read `dout` (B·T·C), read **and** write the distinct dwte rows and the T dwpe rows
#   (gradients accumulate), read the ids.
#
# **Floor** = minimal bytes / the device-to-device copy rate (bytes read + written per second), measured
# once per benchmark run, by the benchmark itself (`bench.measure_copy_rate`), and stored with the results
# (`docs/bench/meta.json`). Every floor of a run uses that one rate. *Percent of floor* = floor / median
# time: 100 % would be a kernel as fast as a copy. The cell below does the arithmetic for B=64 with the
# committed run's rate, on ids it draws itself (seed 0): the committed run drew its own, so its distinct-id
# counts differ a little from these (under 1 % at B=64). Zipf and real text repeat ids, so they touch fewer rows
# and their floor is lower.

# %%
# NBVAL_CHECK_OUTPUT
print("cases timed by python -m gpt2enc_edu.bench:")
for case in bench.CASES:
    print(f"  {case.name:19s} {case.family:5s}  {case.label}")

RESULTS_DIR = measured.bench_dir()  # docs/bench/, or the copy an installed wheel carries
try:
    committed_rows, committed_meta = bench.load_results(RESULTS_DIR)
except FileNotFoundError as exc:
    committed_rows, committed_meta = None, {}
    print(f"\nNo committed GPU results: {exc}")
COPY_RATE = committed_meta.get("copy_rate_GBps", 4000) * 1e9  # bytes/s, read + write
B, T, C = 64, 1024, 768
print(f"\nfloors at B={B}, T={T}, C={C}, bf16, copy rate {COPY_RATE / 1e9:.0f} GB/s "
      f"({'the committed run' if committed_rows else 'a round number: no committed run'}):")
for kind in bench.ID_KINDS:
    distinct = bench.distinct_ids(make_ids(kind, B, T, seed=0))
    parts = []
    for op in bench.OPS:
        nbytes = bench.minimal_bytes(op, B=B, T=T, C=C, distinct=distinct)
        parts.append(f"{op} {nbytes / 1e6:6.1f} MB -> {bench.floor_seconds(nbytes, COPY_RATE) * 1e6:5.1f} us")
    print(f"  {kind:8s} {distinct:6d} distinct ids: " + ";  ".join(parts))

# %% [markdown]
# The same arithmetic at **B = 1**: one sequence. The output (or `dout`) is then 1.5 MB, the wpe rows as much
# again, and the distinct wte rows up to as much again (uniform ids touch almost a row per position); the backward
# reads and writes its gradient rows. So the minimal bytes are a few megabytes (the cell prints them) and the floor
# a few microseconds at most; keep these numbers in mind for section 3.

# %%
print(f"B=1: minimal bytes and floor (copy rate {COPY_RATE / 1e9:.0f} GB/s)")
for kind in bench.ID_KINDS:
    distinct = bench.distinct_ids(make_ids(kind, 1, T, seed=0))
    cells = []
    for op in bench.OPS:
        nbytes = bench.minimal_bytes(op, B=1, T=T, C=C, distinct=distinct)
        cells.append(f"{op} {nbytes / 1e6:4.1f} MB = {bench.floor_seconds(nbytes, COPY_RATE) * 1e6:4.2f} us")
    print(f"  {kind:8s} {distinct:5d} distinct ids: " + ";  ".join(cells))


# %% [markdown]
# ## 2. Exercise 5: the floor of the backward (core)
#
# Write `backward_bytes(inp, C, itemsize)`: the bytes the deterministic backward cannot avoid moving for the
# ids `inp` (B, T), C channels and `itemsize` bytes per stored element (2 for bf16, 4 for fp32). It works
# on the active backend: `inp` is a NumPy or CuPy array.
#
# The answer is a number of bytes: an integer (`12.0` or `12 + 0.9` is refused). The check draws its id
# batches and shapes when it runs.
#
# *Hint:* section 1 of this notebook: which arrays must the backward read, which must it write
# (it adds into the gradients), and which rows of `dwte` does a batch touch at all? Solution:
# `solutions/exercises.py` (in the repository, outside the package).

# %%
def backward_bytes(inp, C, itemsize):
    """Exercise 5: the minimal bytes of the encoder backward for ids ``inp``."""
    raise NotImplementedError("Exercise 5: count the bytes the backward must read and write")


# %%
done = exercises.check_backward_bytes(backward_bytes)

# %% [markdown]
# ## 3. The measurements (core)
#
# First the committed full sweep (`docs/bench/`, B = 1, 4, 8, 16, 32 and 64 and three kinds of ids; set
# `GPT2ENC_BENCH_DIR` to read another folder): its device, date and copy rate. Its numbers as tables are in
# `docs/bench/results.md`; here they are drawn. On a GPU a quick subset is measured now as well (B in {1, 64},
# uniform and Zipf ids, few repeats) and drawn beside it.

# %%
rows, meta = committed_rows, committed_meta
if rows:
    print(f"committed full sweep, from {RESULTS_DIR.name}/\ndevice: {meta.get('device')}\ndate:   {meta.get('date')}\n"
          f"copy rate: {meta.get('copy_rate_GBps', float('nan')):.0f} GB/s; PyTorch: {meta.get('torch')}")
live_rows = None
if enc.gpu_status().name == "cuda":
    config = bench.BenchConfig.quick_config(kinds=("uniform", "zipf"))
    live = bench.run_benchmark(config, progress=False, command="notebooks/05_timings (live, quick subset)")
    live_rows = live.rows
    print(f"measured now on {live.meta.get('device')} (quick subset), copy rate "
          f"{live.meta.get('copy_rate_GBps', float('nan')):.0f} GB/s")

# %% [markdown]
# ### How does each time grow with B, and how far is it from the floor?
#
# One row of panels per kind of ids, one panel per question, a few lines each. The black dashed line is the
# memory floor of the panel's operation; the grey dotted line in the last panel is host work (NumPy on the
# CPU), not a kernel.

# %%
GROUPS = {
    "forward": {"forward": "ours", "torch_forward": "PyTorch F.embedding + wpe"},
    "backward, deterministic": {"chunked_gpu": "chunked, GPU table", "bucketed_gpu": "bucketed, GPU table",
                                "torch_backward_det": "PyTorch, deterministic mode"},
    "backward, nondeterministic": {"atomic_bf16": "bf16 atomics", "atomic_fp32": "fp32 atomics",
                                   "torch_backward": "PyTorch"},
    "the bucket table": {"gpu_buckets": "GPU table alone", "bucketed_cpu": "bucketed, CPU table",
                         "make_buckets": "make_buckets alone (host NumPy)"},
}
FLOORS = {"forward": "forward", "backward, deterministic": "backward", "backward, nondeterministic": "backward"}
if rows:
    fig = timing_plots.sweep(rows, GROUPS, floor_op=FLOORS, title=f"committed full sweep ({meta.get('device')})")
    plt.show()
if live_rows:
    fig = timing_plots.sweep(live_rows, GROUPS, floor_op=FLOORS, title="measured now (quick subset)")
    plt.show()

# %% [markdown]
# *Figure: time per call against B (log-log), panels by question and rows by kind of ids, floors dashed.
# PyTorch's lines are held to our floor, which undercounts the bytes PyTorch must move (section 5).*
#
# Toward small B the floor falls almost in proportion to B (less at the smallest B, where the T wpe rows and one
# sequence's distinct rows are a fixed share); the measured lines do not follow it down. At B=1 the minimal bytes are
# the few megabytes of section 1, a few microseconds of copying, but a call still pays its launches, its sort of the ids
# (the bucket table's chain of short steps, or, at B=1, the sort of the ids that every block of the chunked method's
# one-launch kernel does for itself; notebook 06 section 8), and for the CPU route the host round trip: those **fixed
# costs** set the time at small B. The last panel answers a second question, what the bucket table costs where it is
# built: the CPU route (the ids to the host, `make_buckets` in NumPy, the table back) takes about half a millisecond for
# one sequence and milliseconds for many, the GPU table alone microseconds (under ten for one sequence, a few tens at B
# = 64), which is why the package builds the table on the GPU for CuPy arrays.
#
# ### How close to a copy does each operation get, and from which B on?
#
# Percent of the floor: higher is better; 100 % is the speed of a copy of the minimal bytes. Where the fixed
# costs dominate (small B) every line drops.

# %%
if rows:
    fig = plt.figure(figsize=(13, 4), dpi=80, layout="constrained")
    bench_plots.plot_percent_of_floor(rows, fig=fig, meta=meta)
    plt.show()

# %% [markdown]
# *Figure: percent of the floor against B, one panel per kind of ids, one line per case.*
#
# ## 4. Why the forward stops short of its floor (core)
#
# The forward gets closer to its floor than any whole backward, and it still levels off well below 100 % at large B.
# First what its minimal bytes are made of, at B=64, from the committed run:

# %%
if rows:
    fwd = {(r["ids"], int(r["B"])): r for r in rows if r["case"] == "forward"}
    written = B * T * C * 2  # out, bf16
    print(f"forward at B={B}: out is {written / 1e6:.0f} MB written; a wte row is C x 2 = {C * 2} bytes")
    for kind in bench.ID_KINDS:
        r = fwd.get((kind, B))
        if r:
            total, distinct = int(r["minimal_bytes"]), int(r["distinct_ids"])
            print(f"  {kind:8s} {float(r['pct_of_floor']):5.1f}% of floor ({float(r['achieved_GBps']):4.0f} GB/s of "
                  f"{COPY_RATE / 1e9:.0f}); writes {100 * written / total:3.0f}% of its {total / 1e6:5.1f} MB, "
                  f"gathers {distinct} rows ({distinct * C * 2 / 1e6:4.1f} MB)")

# %% [markdown]
# The floor assumes the copy's rate for any mix of reads and writes at any addresses. The forward's mix is
# different from a copy's in two ways: most of its bytes are **writes** (the cell above), and its reads are
# **gathers**: each thread first waits for its ids, then for rows of 1.5 KB at addresses the ids pick, and only
# then stores.
#
# *Measured* (`docs/experiments.md`, section "Forward", B=64). Each share below is of the copy rate of the card
# it was measured on; compare shares within one card only.
#
# * On the **H100**, the committed run's card (section 3 prints it): the forward with **every id equal**, which
#   writes the same output but reads almost nothing (one `wte` row, from cache), ran at 91 % of the copy rate,
#   and the package's forward in the same run at about the shares printed above. That is the ceiling of this kernel's
#   own mix: even a perfect gather would not reach 100 % of this floor. The gap splits in two: from 100 % down to
#   that ceiling is what the kernel's own mix costs even with nothing to gather (its writes, and the loads each
#   store waits for); from the ceiling down to the forward's share is what the gathers cost.
# * On the **H200** (a copy rate of about 4.2 TB/s): writing alone is not the limit there, since a memset of the
#   output's bytes and a kernel that only stores with the forward's thread map both ran at 93 % of the copy rate.
#   The all-equal forward moved its bytes at 3.15 TB/s, about three quarters, and the package's forward came within
#   a few points of that ceiling. So there the mix's cost lies not in the writes but in the loads the stores wait
#   for (the inferred paragraph below). No memset figure from the H100 is committed.
# * On uniform ids Nsight Compute (NVIDIA's kernel profiler) counts more bytes read from DRAM than the distinct rows
#   hold (rows evicted from L2 between two uses are read twice). Other thread maps, cache hints, and maps that
#   keep loads and stores in flight together gained at most a microsecond or two.
#
# *Inferred*, not measured directly: why the all-equal forward stays below a memset, and what the gathers cost on top.
# A thread's loads and its stores come one after the other (its ids, then its rows, then the store), so fewer bytes
# are in flight than in a memset or a copy, which stream without waiting; and scattered 1.5 KB rows, some read twice,
# cost more than a contiguous read of the same size.
#
# ## 5. PyTorch against our floor, which undercounts its bytes (core)
#
# PyTorch's embedding backward computes a **fresh** dwte: it does not add into an existing gradient, so it
# need not read old rows, but it must write **all V rows** of its result (zeros where no id points), where our
# floor counts read and write of only the distinct rows. Its own minimum is therefore `dout` + V rows + T rows
# (dwpe, also fresh) + the ids. Which is larger?
#
# ### How much more must PyTorch move than the floor it is held to?

# %%
if rows:
    torch_rows = [r for r in rows if r["case"] == "torch_backward"]
    ratio = {}
    for r in torch_rows:
        b, V = int(r["B"]), int(r["V"])
        own = (b * T * C + V * C + T * C) * 2 + b * T * 4  # read dout, write every dwte row and the dwpe rows, ids
        ratio.setdefault(r["ids"], {})[b] = own / int(r["minimal_bytes"])
    above = sum(x > 1 for by_b in ratio.values() for x in by_b.values())
    print(f"PyTorch's own minimum exceeds the floor it is held to in {above} of {len(torch_rows)} cells "
          f"(kind x B); the rest:", [(kind, b, round(x, 2)) for kind, by_b in ratio.items()
                                     for b, x in by_b.items() if x <= 1])
    fig, ax = plt.subplots(figsize=(5.5, 3.2), dpi=80, layout="constrained")
    for kind, by_b in ratio.items():
        ax.plot(list(by_b), list(by_b.values()), timing_plots.KIND_STYLE.get(kind, "-"), marker="o", label=f"{kind} ids")
    ax.axhline(1, color="k", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sorted({int(r["B"]) for r in torch_rows}), [str(b) for b in sorted({int(r["B"]) for r in torch_rows})])
    ax.minorticks_off()
    ax.set_xlabel("batch size B")
    ax.set_ylabel("PyTorch's own minimum / our floor")
    ax.legend(fontsize=8)
    plt.show()

# %% [markdown]
# *Figure: PyTorch's own minimal bytes over the floor it is held to, against B; above the black line our floor
# understates its traffic.*
#
# Reading and writing a distinct row costs two row-sizes, writing every row once costs V row-sizes: so the
# floor we hold PyTorch to is **lower** than what its design must move wherever a batch has fewer than about
# (V − T) / 2 distinct ids, half the vocabulary, which is every cell the cell counts except the largest uniform
# batch. Its percent of floor understates how well it uses the memory; its times are what a training step pays
# either way.
#
# ## 6. (optional) The CPU bucketing on this machine
#
# `make_buckets` (the package's NumPy bucket table, `gpt2enc_edu/buckets/host.py`) timed now, on whatever CPU runs
# this notebook (so it varies from machine to machine, and is not the committed run's host's figure in the last
# panel above). The benchmark times this route twice: inside the backward (`bucketed_cpu`: CUDA events around the
# whole call, copies included) and alone (`make_buckets`: `time.perf_counter` around the NumPy call); two
# separate measurements of host code on a shared CPU, so their difference is noisy.

# %%
print(f"make_buckets (NumPy) on this machine, T={T}, C={C}, bf16, median of 5:")
for kind in ("uniform", "zipf"):
    cells = []
    for b in (1, 8, 64):
        seconds = bench.summarize(bench.time_make_buckets(make_ids(kind, b, T, seed=0), C, repeats=5)).median
        cells.append(f"B={b}: {bench.format_time_us(seconds * 1e6)}")
    print(f"  {kind:8s} " + ",  ".join(cells))

# %% [markdown]
# ## 7. How to read the results (core)
#
# * The **forward** gathers a row per position and adds a position row: pure memory traffic, mostly writes,
#   so its percent of floor says how close a gather beside a write stream gets to the copy rate (section 4;
#   notebook 01 times its three versions).
# * The **atomic backward** with fp32 accumulation widens the `dwte` rows the batch touches to fp32, adds there and
#   rounds them back: three kernels; bf16 atomics need one, but round at every add (notebook 02) and depend on the order
#   of the adds. Both are fast next to PyTorch (in section 3's plot the fp32 route beats PyTorch's nondeterministic
#   backward at every B; bf16 atomics fall behind it on skewed ids at the largest B) and slow next to their floor,
#   although each reads dout only once. The fp32 route's widen and narrow kernels move 12 bytes per element of each
#   touched row (read bf16, write fp32, then read fp32, write bf16) where the floor counts 4. And an atomic is a
#   read-modify-write that the L2 cache carries out for one address at a time, so the adds into one row queue behind
#   each other (every occurrence of a frequent token, every sequence at one position), and on uniform ids the fp32 rows
#   of a large batch's many distinct tokens are more than L2 holds at once. (Inferred from how atomics work and from the
#   plots, where uniform ids, which queue least, come closest to the floor; no profile of the atomic kernels is
#   committed.)
# * The **deterministic backward with CPU bucketing** includes the ids' trip to the host, the NumPy table
#   and its trip back: at large B that host work, not the GPU, sets the time. The **GPU bucketing** route
#   removes the host round trip; the **chunked** kernel splits long buckets (frequent tokens) into
#   32-position chunks, so skewed ids (Zipf, real text) do not leave one block with most of the work
#   (notebook 06).
# * **PyTorch**'s embedding backward writes a fresh dwte of all V rows: held to our floor, it is held to fewer
#   bytes than it must move in all but one cell (section 5).
#
# `docs/benchmarks.md` describes the method in full; `docs/bench/` holds the committed numbers and plots.
