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
# The measurements come from `python -m gpt2enc_edu.bench`. On a GPU this notebook runs a small subset of
# it live (well under a minute); without a GPU it plots the measurements committed in `docs/bench/`.

# %% [markdown]
# ## 0. Setup
# The next cell only makes `import gpt2enc_edu` work. Where the package is installed it does nothing.
# In a checkout it puts the checkout on `sys.path`. On a hosted service (Colab, Kaggle) with the
# repository cloned or uploaded, it also installs whatever is missing (`ml_dtypes`, `matplotlib`, `tqdm`,
# and CuPy when there is a GPU).

# %%
import importlib.util, os, shutil, subprocess, sys
from pathlib import Path

try:
    import gpt2enc_edu
except ImportError:
    here = Path.cwd()
    roots = [d for d in (here.parent, here, *sorted(here.glob("*/"))) if (d / "gpt2enc_edu" / "__init__.py").is_file()]
    if not roots:
        raise
    sys.path.insert(0, str(roots[0]))
    if "google.colab" in sys.modules or any(k.startswith(("COLAB_", "KAGGLE_")) for k in os.environ):
        wanted = {"ml_dtypes": "ml_dtypes", "matplotlib": "matplotlib", "tqdm": "tqdm"}
        if shutil.which("nvidia-smi"):
            wanted["cupy"] = "cupy-cuda12x"
        missing = [pip_name for module, pip_name in wanted.items() if importlib.util.find_spec(module) is None]
        if missing:
            subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", *missing])
    import gpt2enc_edu

print(gpt2enc_edu.gpu_status())

# %%
import matplotlib.pyplot as plt
from IPython.display import Markdown, display

from gpt2enc_edu import bench
from gpt2enc_edu.bench import plots as bench_plots
from gpt2enc_edu.course import exercises
from gpt2enc_edu.tokens import make_ids

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
# in the same run. *Percent of floor* = floor / median time: 100 % would be a kernel as fast as a copy.
# The cell below does this arithmetic for B=64 with the copy rate of the project's H200
# (4273 GB/s, from `shared/reference/README.md`); it reproduces llm.c's floors there (37 us and 51 us
# for uniform ids). Zipf and real text repeat ids, so they touch fewer rows and their floor is lower.

# %%
# NBVAL_CHECK_OUTPUT
print("cases timed by python -m gpt2enc_edu.bench:")
for case in bench.CASES:
    print(f"  {case.name:19s} {case.family:5s}  {case.label}")

H200_COPY_RATE = 4273e9  # bytes/s, read + write
B, T, C = 64, 1024, 768
print(f"\nfloors at B={B}, T={T}, C={C}, bf16, copy rate {H200_COPY_RATE / 1e9:.0f} GB/s:")
for kind in bench.ID_KINDS:
    distinct = bench.distinct_ids(make_ids(kind, B, T, seed=0))
    parts = []
    for op in bench.OPS:
        nbytes = bench.minimal_bytes(op, B=B, T=T, C=C, distinct=distinct)
        parts.append(f"{op} {nbytes / 1e6:6.1f} MB -> {bench.floor_seconds(nbytes, H200_COPY_RATE) * 1e6:5.1f} us")
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
# On a GPU: a quick subset (B in {1, 64}, uniform and Zipf ids, few repeats), measured now through the
# benchmark's own functions. Without one: the full run committed in `docs/bench/` (set the environment
# variable `GPT2ENC_BENCH_DIR` to read another folder).

# %%
REPO = Path(gpt2enc_edu.__file__).resolve().parent.parent
RESULTS_DIR = Path(os.environ.get("GPT2ENC_BENCH_DIR", REPO / "docs" / "bench"))

rows, meta = None, None
if gpt2enc_edu.gpu_status().name == "cuda":
    config = bench.BenchConfig.quick_config(kinds=("uniform", "zipf"))
    results = bench.run_benchmark(config, progress=False, command="notebooks/05_timings (live, quick subset)")
    rows, meta = results.rows, results.meta
    source = "measured live on this GPU (quick subset; the full run is `python -m gpt2enc_edu.bench`)"
else:
    try:
        rows, meta = bench.load_results(RESULTS_DIR)
        source = f"committed measurements from {RESULTS_DIR}"
    except FileNotFoundError as exc:
        print(f"No committed GPU results yet: {exc}.\nThe plots below need them; the rest of the notebook runs.")

if rows is not None:
    print(f"{source}\ndevice: {meta.get('device')}\ndate:   {meta.get('date')}\n"
          f"copy rate: {meta.get('copy_rate_GBps', float('nan')):.0f} GB/s; PyTorch: {meta.get('torch')}")

# %%
if rows is not None:
    display(Markdown(bench.markdown_report(rows, meta)))

# %% [markdown]
# ### Time per call against batch size
#
# Solid lines are this project's kernels, dashed ones PyTorch, the dotted one the CPU bucketing alone.
# The black lines are the floors; the shaded bands the 10th-90th percentiles.

# %%
if rows is not None:
    fig = plt.figure(figsize=(16, 5.5), layout="constrained")
    bench_plots.plot_times(rows, fig=fig, meta=meta)
    plt.show()

# %% [markdown]
# ### Percent of the floor
#
# Higher is better; 100 % is the speed of a copy of the minimal bytes. At small B fixed costs (launches,
# the host round trip of CPU bucketing) dominate, so the percentages drop there.

# %%
if rows is not None:
    fig = plt.figure(figsize=(16, 5), layout="constrained")
    bench_plots.plot_percent_of_floor(rows, fig=fig, meta=meta)
    plt.show()

# %% [markdown]
# ## The CPU bucketing alone, on this machine
#
# The deterministic backward needs a bucket table (which positions hold which token). llm.c builds it on
# the CPU with a C++ hash map; on the project's H200 host that took 46 ms at B=64 with uniform ids. Ours
# is `make_buckets` (NumPy sorts, `gpt2enc_edu/buckets.py`); this times it here, on whatever CPU runs the
# notebook (so the numbers vary from machine to machine).

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
#   its percent of floor says how close it gets to the copy rate.
# * The **atomic backward** with fp32 accumulation pays for fp32 copies of the whole gradient tables
#   (`dwte` is 50257 x 768) on every call, whatever B is; bf16 atomics avoid the copies but round at every
#   add and depend on the order of the adds.
# * The **deterministic backward with CPU bucketing** includes the ids' trip to the host, the NumPy table
#   and its trip back: at large B that host work, not the GPU, sets the time. The **GPU bucketing** route
#   removes the host round trip; the **chunked** kernel splits long buckets (frequent tokens) into
#   32-item chunks, so skewed ids (Zipf, real text) do not leave one block with most of the work.
# * **PyTorch**'s embedding backward computes a fresh dwte (it does not accumulate into an existing one),
#   so it is held to the same floor as ours, which is slightly generous to it.
#
# `docs/benchmarks.md` describes the method in full; `docs/bench/` holds the committed numbers and plots.
