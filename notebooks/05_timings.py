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
# **Goal.** Put numbers on the kernels of notebooks 01-04: the forward, the atomic backward (fast,
# nondeterministic) and the deterministic backward (llm.c's bucketed kernel with the bucket table built on
# the CPU, as in llm.c, or on the GPU; and the chunked kernel), next to PyTorch's embedding, at GPT-2
# (124M) sizes: T=1024, C=768, V=50257, bf16, batch sizes 1 to 64, for uniform, Zipf and real token ids.
# And say how good a time is by comparing it with a *floor*: the time a plain device-to-device copy would
# need to move the bytes the operation cannot avoid moving.
#
# The measurements come from `python -m gpt2enc_edu.bench`. The full sweep (every B from 1 to 64, three kinds
# of ids) committed in `docs/bench/` is drawn on every machine, and says so; on a GPU this notebook also runs
# a small subset live (well under a minute) and shows it beside the committed run.

# %% [markdown]
# ## 0. Setup
# The next cell only makes `import gpt2enc_edu` work. Where the package is installed it does nothing.
# In a checkout it puts the checkout on `sys.path`. On a hosted service (Colab, Kaggle) it installs the
# package with what the notebooks need (from a clone, else from GitHub) and the CuPy wheel that matches the
# runtime's CUDA when there is a GPU.

# %%
# 0. Setup: make `import gpt2enc_edu` work. Installed: nothing to do. In a checkout: put it on sys.path.
# On Colab or Kaggle: install the package (from a clone, else from GitHub) and the CuPy for the runtime's CUDA.
import os, subprocess, sys
from pathlib import Path

REPO = "OWNER/gpt2enc-edu"  # the GitHub repository hosted runtimes install from (placeholder; course/hosted.py)
HOSTED = "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ or "KAGGLE_KERNEL_RUN_TYPE" in os.environ
try:
    import gpt2enc_edu
except ImportError:
    here = Path.cwd()
    roots = [d for d in (here.parent, here, *sorted(here.glob("*/"))) if (d / "gpt2enc_edu" / "__init__.py").is_file()]
    if roots:
        sys.path.insert(0, str(roots[0]))
    if HOSTED:
        target = f"{roots[0]}[notebooks]" if roots else f"gpt2enc-edu[notebooks] @ git+https://github.com/{REPO}"
        subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", target])
    elif not roots:
        raise
    import gpt2enc_edu
if HOSTED:
    from gpt2enc_edu.course import hosted
    print(hosted.ensure_cupy())
enc = gpt2enc_edu

# %%
import matplotlib.pyplot as plt
from IPython.display import Markdown, display

from gpt2enc_edu import bench
from gpt2enc_edu.bench import plots as bench_plots
from gpt2enc_edu.course import exercises, timing_plots
from gpt2enc_edu.tokens import make_ids
print(gpt2enc_edu.gpu_status())

# %% [markdown]
# ## What is timed, and what the floor is
#
# Each *case* is a named function in `gpt2enc_edu/bench/cases.py` that prepares one call; the timer then runs
# it many times. Before every repeat the timer writes a buffer twice the size of the GPU's L2 cache, so
# the inputs come from HBM as they would in training, and queues a short spin kernel so that the CUDA
# events time the GPU's work rather than Python's launch overhead. We report the median and the 10th and
# 90th percentiles.
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
# committed run's rate. Zipf and real text repeat ids, so they touch fewer rows and their floor is lower.

# %%
# NBVAL_CHECK_OUTPUT
print("cases timed by python -m gpt2enc_edu.bench:")
for case in bench.CASES:
    print(f"  {case.name:19s} {case.family:5s}  {case.label}")

REPO = Path(gpt2enc_edu.__file__).resolve().parent.parent
RESULTS_DIR = Path(os.environ.get("GPT2ENC_BENCH_DIR", REPO / "docs" / "bench"))
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
# ## Exercise 5: the floor of the backward
#
# Write `backward_bytes(inp, C, itemsize)`: the bytes the deterministic backward cannot avoid moving for the
# ids `inp` (B, T), C channels and `itemsize` bytes per stored element (2 for bf16, 4 for fp32). It works
# on the active backend: `inp` is a NumPy or CuPy array.
#
# The answer is a number of bytes: an integer (`12.0` or `12 + 0.9` is refused). The check draws its id
# batches and shapes when it runs.
#
# *Hint:* the floor section of this notebook: which arrays must the backward read, which must it write
# (it adds into the gradients), and which rows of `dwte` does a batch touch at all? Solution:
# `solutions/exercises.py` (in the repository, outside the package).

# %%
def backward_bytes(inp, C, itemsize):
    """Exercise 5: the minimal bytes of the encoder backward for ids ``inp``."""
    raise NotImplementedError("Exercise 5: count the bytes the backward must read and write")


# %%
done = exercises.check_backward_bytes(backward_bytes)

# %% [markdown]
# ## The measurements
#
# First the committed full sweep (`docs/bench/`; set `GPT2ENC_BENCH_DIR` to read another folder): its
# device, date and copy rate. On a GPU, a quick subset measured now follows it (B in {1, 64}, uniform and
# Zipf ids, few repeats).

# %%
rows, meta = committed_rows, committed_meta
if rows:
    print(f"committed full sweep, from {RESULTS_DIR.name}/\ndevice: {meta.get('device')}\ndate:   {meta.get('date')}\n"
          f"copy rate: {meta.get('copy_rate_GBps', float('nan')):.0f} GB/s; PyTorch: {meta.get('torch')}")
live_rows = None
if gpt2enc_edu.gpu_status().name == "cuda":
    config = bench.BenchConfig.quick_config(kinds=("uniform", "zipf"))
    live = bench.run_benchmark(config, progress=False, command="notebooks/05_timings (live, quick subset)")
    live_rows = live.rows
    print(f"measured now on {live.meta.get('device')} (quick subset), copy rate "
          f"{live.meta.get('copy_rate_GBps', float('nan')):.0f} GB/s")
    display(Markdown(bench.markdown_report(live.rows, live.meta)))

# %%
if rows:
    display(Markdown(bench.markdown_report(rows, meta)))

# %% [markdown]
# ### Time per call against batch size
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
# *Figure: time per call against B (log-log), panels by question and rows by kind of ids, floors dashed.*
#
# ### What dominates at small B: fixed costs
#
# The floor falls in proportion to B; the measured lines do not follow it down. At B=1 the minimal bytes are
# a megabyte or two, a microsecond of copying, but a call still pays its launches, its sort of the ids (the
# bucketing kernel's chain of phases, or at B=1 the sort every block of the chunked method's one kernel does;
# notebook 06), and for the CPU route the host round trip. The table shows the share:

# %%
if rows:
    pick = ("forward", "chunked_gpu", "bucketed_gpu", "atomic_bf16", "bucketed_cpu")
    by = {(r["case"], int(r["B"])): r for r in rows if r["ids"] == "real"}
    print("real ids      B=1: time   floor  % of floor |  B=64: time   floor  % of floor")
    for case in pick:
        cells = []
        for b in (1, 64):
            r = by.get((case, b))
            if r:
                us, floor = float(r["median_us"]), float(r["floor_us"])
                cells.append(f"{us:9.1f} {floor:7.1f} {100 * floor / us:8.1f}%")
        print(f"{case:13s} " + " | ".join(cells))

# %% [markdown]
# ### Percent of the floor
#
# Higher is better; 100 % is the speed of a copy of the minimal bytes. At small B the fixed costs above
# dominate, so the percentages drop there.

# %%
if rows:
    fig = plt.figure(figsize=(16, 5), layout="constrained")
    bench_plots.plot_percent_of_floor(rows, fig=fig, meta=meta)
    plt.show()

# %% [markdown]
# ## The CPU bucketing: alone, and inside the backward
#
# The deterministic backward needs a bucket table. llm.c builds it on the CPU with a C++ hash map; the
# package's CPU route uses `make_buckets` (NumPy sorts, `gpt2enc_edu/buckets.py`). The benchmark times that
# route twice: **inside** the backward (`bucketed_cpu`: CUDA events around the whole call, which includes
# the ids' copy to the host, `make_buckets`, the table's copy back and the kernels) and **alone**
# (`make_buckets`: `time.perf_counter` around the NumPy call on the host). The difference should be the
# GPU's part plus the copies; since the two are separate measurements, with separate timers, of host code
# on a shared CPU, the difference is noisy and can come out small or even negative where the NumPy part
# dominates. Both are far above the GPU-built table (`gpu_buckets`), which is why the package builds the
# table on the GPU for CuPy arrays.

# %%
if rows:
    by = {(r["case"], r["ids"], int(r["B"])): float(r["median_us"]) for r in rows}
    print("committed run:          make_buckets alone | bucketed_cpu (whole call) | difference | GPU table alone")
    for kind in ("uniform", "zipf", "real"):
        for b in (1, 8, 64):
            if ("make_buckets", kind, b) in by and ("bucketed_cpu", kind, b) in by:
                alone, whole = by[("make_buckets", kind, b)], by[("bucketed_cpu", kind, b)]
                print(f"  {kind:8s} B={b:2d}: {alone:12.0f} us | {whole:18.0f} us | {whole - alone:7.0f} us | "
                      f"{by.get(('gpu_buckets', kind, b), float('nan')):8.0f} us")

# %% [markdown]
# And `make_buckets` timed now, on whatever CPU runs this notebook (so it varies from machine to machine, and
# is not the H200 host's figure above):

# %%
print(f"make_buckets (NumPy) on this machine, T={T}, C={C}, bf16, median of 5:")
for kind in ("uniform", "zipf"):
    cells = []
    for b in (1, 8, 64):
        seconds = bench.summarize(bench.time_make_buckets(make_ids(kind, b, T, seed=0), C, repeats=5)).median
        cells.append(f"B={b}: {bench.format_time_us(seconds * 1e6)}")
    print(f"  {kind:8s} " + ",  ".join(cells))

# %% [markdown]
# ## How to read the results
#
# * The **forward** gathers a row per position and adds a position row: it is pure memory traffic, so
#   its percent of floor says how close it gets to the copy rate (notebook 01 times its three versions).
# * The **atomic backward** with fp32 accumulation widens the `dwte` rows the batch touches to fp32, adds
#   there and rounds them back: three kernels; bf16 atomics need one, but round at every add (notebook 02)
#   and depend on the order of the adds.
# * The **deterministic backward with CPU bucketing** includes the ids' trip to the host, the NumPy table
#   and its trip back: at large B that host work, not the GPU, sets the time. The **GPU bucketing** route
#   removes the host round trip; the **chunked** kernel splits long buckets (frequent tokens) into
#   32-item chunks, so skewed ids (Zipf, real text) do not leave one block with most of the work
#   (notebook 06).
# * **PyTorch**'s embedding backward computes a fresh dwte (it does not accumulate into an existing one),
#   so it is held to the same floor as ours, which is slightly generous to it.
#
# `docs/benchmarks.md` describes the method in full; `docs/bench/` holds the committed numbers and plots.
