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
# # 07 · In a training loop: bitwise-identical losses
#
# **Goal:** use the encoder kernels from PyTorch (`gpt2enc_edu.torch`) inside a small GPT-2-shaped model,
# train it for a few dozen steps on real GPT-2 tokens, and check llm.c's strongest test of determinism:
# two runs give the **same bits** for every loss and every final weight. Then swap in the atomic backward
# (with bf16 atomics the runs part at once; with fp32 accumulation they may agree for many steps, but nothing
# guarantees it) and PyTorch's own `nn.Embedding`, with and without
# `torch.use_deterministic_algorithms(True)`.
#
# **Prerequisites:** notebooks 02 and 03 (atomic against deterministic backward) and 04 (stochastic rounding);
# PyTorch basics: `nn.Module`, `loss.backward()`, an optimizer step. Notebook 06 helps for section 3.
#
# **After this notebook you can:**
# 1. use the kernels in a PyTorch model through `gpt2enc_edu.torch.GPT2Embedding`;
# 2. check a training loop for bitwise reproducibility (loss and weight hashes of two runs) and read from the
#    figures where two runs part;
# 3. list what besides the encoder a bitwise-reproducible loss needs (section 8);
# 4. say why the encoder's time per call here is mostly host work, and what that means for a whole step.
#
# **Time:** about 15 minutes for the core sections, 10 more for those marked *(optional)* (`docs/teaching.md`).
#
# 0. Setup · 1. The adapter · 2. The model · 3. Two runs, same bits · 4. Atomics part ·
# 5. PyTorch's `nn.Embedding` · 6. The runs drawn · 7. (optional) Time: the encoder in a step ·
# 8. What made the rest deterministic · 9. (optional) Exercise
#
# ## 0. Setup
#
# Needs PyTorch (the CPU build is enough). Without it, the cells below say so and skip their work.

# %%
import importlib.util, os, subprocess, sys
sys.path[:0] = [os.path.abspath("..")] if os.path.isdir("../gpt2enc_edu") else []  # a checkout: the folder above notebooks/
if importlib.util.find_spec("gpt2enc_edu") is None:  # Colab or Kaggle: pip-install it from the repository GPT2ENC_EDU_REPO names
    repo = os.environ.get("GPT2ENC_EDU_REPO") or sys.exit("gpt2enc_edu is not installed (notebooks/README.md). On Colab or Kaggle run `%env GPT2ENC_EDU_REPO=<owner>/gpt2enc-edu` (its GitHub repository), then this cell again.")
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", f"gpt2enc-edu[notebooks] @ git+https://github.com/{repo}"])
enc = importlib.import_module("gpt2enc_edu.course.hosted").setup()  # Colab or Kaggle: the CuPy for the runtime's CUDA

# %%
# cuBLAS picks its reduction order by workspace: a fixed workspace makes matmuls reproducible. It must be set
# before CUDA starts, so before torch touches the GPU.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
try:
    import torch
except ImportError:
    torch = None

if torch is None:
    print("PyTorch is not installed: this notebook needs it. The CPU build is enough:\n"
          "  pip install torch --index-url https://download.pytorch.org/whl/cpu\n"
          "(a plain `pip install torch` on Linux downloads the CUDA build, several GB). The cells below skip their work.")
else:
    from gpt2enc_edu import torch as enc_torch
    from gpt2enc_edu.course import training

    # the GPU when CuPy and torch both see one (GPT2ENC_BACKEND=numpy forces the CPU and the NumPy mirror)
    DEVICE = torch.device("cuda" if torch.cuda.is_available() and enc.array_module().__name__ == "cupy" else "cpu")
    CFG = training.GPU_CONFIG if DEVICE.type == "cuda" else training.CPU_CONFIG
    if DEVICE.type == "cpu":
        torch.set_num_threads(1)  # small matrices: one thread beats threads fighting over a busy machine's cores
    print(f"torch {torch.__version__}; the encoder runs on {DEVICE} ({enc.gpu_status()})")
    print(CFG)

# %% [markdown]
# ## 1. The adapter (core)
#
# `gpt2enc_edu.torch.encoder(ids, wte, wpe, method=...)` is a differentiable function of tensors, registered with
# PyTorch as two custom operators (so `torch.compile` traces it); `GPT2Embedding` is the `nn.Module` around it,
# with parameters `wte` (V, C) and `wpe` (maxT, C). On CUDA tensors it runs the kernels of notebooks 01-04 and 06 on
# torch's current stream, with no copies (the tensors are viewed as CuPy arrays); on CPU tensors it runs the NumPy
# mirror (the same bits). `int64` ids are range-checked and converted to `int32`.
#
# Its backward returns fresh gradients and lets autograd add them into `.grad`, exactly as for
# `nn.Embedding`, so a tied LM head and gradient accumulation just work. Every backward draws a new
# stochastic-rounding seed from a `torch.Generator`: seed the generator, and the seeds repeat.
#
# Inside a call the adapter never waits for the GPU: on a GPU the ids are checked by a kernel
# (`kernels/token_ids.cu`, which also writes the `int32` copy the other kernels read; an id out of range stops it
# with a trap, as `nn.Embedding`'s device-side assert does), and nothing the host decides depends on the GPU's
# data. So the host can queue a step ahead of the GPU, and a whole step can be captured in a CUDA graph
# (`torch.cuda.graph`, or `torch.compile(mode="reduce-overhead")`; `docs/torch.md`).
#
# First, the adapter against the package's own calls, on this backend:

# %%
if torch is None:
    print("skipped: no PyTorch")
else:
    from gpt2enc_edu import compare

    g = torch.Generator().manual_seed(0)
    V, T, C = 1000, 64, 64
    ids = torch.randint(0, V, (4, T), generator=g).to(DEVICE)
    wte = (0.02 * torch.randn(V, C, generator=g)).to(DEVICE, CFG.dtype).requires_grad_(True)
    wpe = (0.01 * torch.randn(T, C, generator=g)).to(DEVICE, CFG.dtype).requires_grad_(True)
    out = enc_torch.encoder(ids, wte, wpe, generator=torch.Generator().manual_seed(42))
    dout = torch.randn(out.shape, generator=g).to(DEVICE, CFG.dtype)
    out.backward(dout)

    as_array = enc_torch.as_array
    same_out = compare.bitwise_equal(as_array(out), enc.encoder_forward(as_array(ids.int()), as_array(wte), as_array(wpe)))
    dwte, dwpe = torch.zeros_like(wte), torch.zeros_like(wpe)
    seed = enc_torch.draw_seed(torch.Generator().manual_seed(42))  # the seed the backward drew
    enc.encoder_backward(as_array(dwte), as_array(dwpe), as_array(dout), as_array(ids.int()), seed=seed, method="chunked")
    print("forward == encoder_forward:", same_out)
    print("backward == encoder_backward with the drawn seed:",
          compare.bitwise_equal(as_array(wte.grad), as_array(dwte)) and compare.bitwise_equal(as_array(wpe.grad), as_array(dwpe)))

# %% [markdown]
# ## 2. The model (core)
#
# `gpt2enc_edu.course.training.TinyGPT`: the encoder, two pre-norm transformer blocks (causal self-attention
# written as matmuls and a softmax, a GELU MLP), a final LayerNorm and the LM head tied to `wte` (the logits
# are `x @ wte.T`, so `wte` gets two gradients per step: the encoder's and the head's, added by autograd).
# The data are fixed windows of the shipped GPT-2 token sample (82,249 ids of real text), in a fixed order;
# the optimizer is AdamW. On a GPU: GPT-2's 50,257-token vocabulary, T = 256, C = 384, bf16 weights, 50 steps.
# On a CPU a smaller run (the sample's 6,404 distinct ids renumbered, T = 64, C = 64, fp32, 20 steps) keeps
# the notebook to seconds.

# %%
if torch is None:
    print("skipped: no PyTorch")
else:
    import inspect

    print(inspect.getsource(training.Block.attention))
    print(inspect.getsource(training.TinyGPT.forward))


# %% [markdown]
# ## 3. Two runs with the deterministic encoder: the same bits (core)
#
# `train` seeds everything (`torch.manual_seed` for the weights, a separate generator for the encoder's
# rounding seeds), trains, and hashes the loss of every step and the final weights (SHA-256 of their bytes).
# The encoder's backward is the chunked kernel (`method="chunked"`); the bucketed one gives the same guarantee.

# %%
def show(name, a, b):
    """Hashes of two runs, and how they compare (identical, where the losses part, or how the weights differ)."""
    print(f"{name:<34} loss hashes {a.loss_hash} {b.loss_hash}  weights {a.weights_hash} {b.weights_hash}")
    print(f"{'':<34} {a.agreement(b)}; loss {a.losses[0]:.4f} -> {a.losses[-1]:.4f}; {a.step_ms:.1f} ms/step")
    return a.parts_from(b) is None and a.weights_hash == b.weights_hash


RUNS = {}
if torch is None:
    print("skipped: no PyTorch")
else:
    for method in ("chunked", "bucketed"):
        RUNS[method] = [training.train(CFG, encoder="ours", method=method, device=DEVICE) for _ in range(2)]
        identical = show(f"ours, {method}", *RUNS[method])
        assert identical, f"two runs with the deterministic {method} encoder differ"

# %% [markdown]
# Every loss, and every bit of every weight after the last step, is the same in both runs. That is llm.c's
# test, passed by a model whose embedding gradient adds up, every step, the many repeats of frequent tokens
# ("\n", " ", ",") in an order that never changes.
#
# **The chunked against the bucketed runs.** Notebook 06 calls the two methods two different orders of the fp32
# sum, so their runs need not agree with each other; the cell compares them:

# %%
if torch is None:
    print("skipped: no PyTorch")
else:
    print(f"chunked run against bucketed run, {CFG.dtype}: {RUNS['chunked'][0].agreement(RUNS['bucketed'][0])}")

# %% [markdown]
# Where they agree (in the committed GPU run, with bf16 weights, they do) it is not luck of the hashes: notebook 06,
# section 4, measured that fp32 sums of bf16 values are almost always exact, so their order does not change them,
# and that rounded to bf16 the two methods gave the same bits there. Nothing *guarantees* it: with fp32 weights (the
# CPU configuration) the gradients are not bf16 values, and the two orders may give other last bits. Each method is
# reproducible on its own; that is the promise.
#
# ## 4. Two runs with the atomic encoder backward (core)
#
# `method="atomic_bf16"` adds bf16 values with `atomicAdd` directly, as a naive bf16 kernel would: the order of the adds
# depends on thread scheduling, every add rounds to 8 significant bits, so the sums differ from run to run, and once one
# gradient differs the runs never meet again. `method="atomic"` adds in fp32 and rounds to the storage dtype once: its
# order-dependent last fp32 bits change the result only where a sum lies within that wobble of a rounding boundary.
# Rounded to bf16 that is rare, and two runs may well agree for many steps; in fp32 storage (the CPU configuration)
# every order-dependent last bit shows, so they part sooner. Either way nothing *guarantees* agreement. (On the CPU the
# mirror draws a random order each call to play the scheduler.) The adapter tells PyTorch that these two methods are
# nondeterministic, as PyTorch's own atomic operators do, so under `torch.use_deterministic_algorithms(True)` they
# raise: these runs turn the switch off.

# %%
if torch is None:
    print("skipped: no PyTorch")
else:
    methods = ("atomic", "atomic_bf16") if CFG.dtype == torch.bfloat16 else ("atomic",)
    for method in methods:
        RUNS[method] = [training.train(CFG, encoder="ours", method=method, deterministic=False, device=DEVICE)
                        for _ in range(2)]
        show(f"ours, {method}", *RUNS[method])

# %% [markdown]
# Where the runs part, the loss of the step whose gradient first differed still agrees: a different gradient
# changes only the *next* step's weights. From there a difference in the last bit of one weight grows: AdamW
# normalises updates, and training dynamics amplify small perturbations.
#
# ## 5. PyTorch's `nn.Embedding`, with and without `torch.use_deterministic_algorithms(True)` (core)
#
# The same model with `nn.Embedding` for tokens and positions (same initial weights: the same draws in the same order,
# so step 0's loss is the same as above). The switch changes which CUDA code computes the embedding's backward (`python
# -m gpt2enc_edu.bench` times both: at GPT-2 size the deterministic one is the slower); whether two runs part is what
# the cell shows (without the switch PyTorch may use code whose order is not fixed; two runs may still give the same
# bits, but nothing guarantees it). On the CPU PyTorch's embedding backward is deterministic either way. Times are the
# median of one whole training step (the encoder is a small part of it here). A step of this small model is mostly
# host time (Python, launches), which moves by tens of percent from one run to the next (section 7): on a GPU, gaps
# between the rows larger than the whole encoder call (under a millisecond there, section 7) are that movement, not
# the encoders. So the column cannot show the README's speed-up of our backward over PyTorch's deterministic one: that
# is the GPU's work, a small part of such a step, which a large model's step pays instead. Section 7 measures both.

# %%
if torch is None:
    print("skipped: no PyTorch")
else:
    for deterministic in (True, False):
        name = f"torch, deterministic={deterministic}"
        RUNS[name] = [training.train(CFG, encoder="torch", deterministic=deterministic, device=DEVICE) for _ in range(2)]
        show(f"nn.Embedding, deterministic={deterministic}", *RUNS[name])

# %%
if torch is None:
    print("skipped: no PyTorch")
else:
    print(f"{'encoder':<34} {'ms per step':>11}  {'two runs':<14} {'step 0 loss':>11}")
    for name, (a, b) in RUNS.items():
        label = f"ours, {name}" if not name.startswith("torch") else name.replace("torch", "nn.Embedding")
        parts = a.parts_from(b)
        same = ("identical" if parts is None and a.weights_hash == b.weights_hash
                else f"part at {parts}" if parts is not None else "weights differ")
        print(f"{label:<34} {a.step_ms:>11.2f}  {same:<14} {a.losses[0].item():>11.4f}")

# %% [markdown]
# ## 6. The runs drawn (core)
#
# ### Do the encoders train the model alike?
#
# The loss of every step, one line per encoder (the first of its two runs). The curves lie on top of each other:
# the encoders compute the same sums up to rounding, so the model learns the same thing with each.

# %%
if torch is None:
    print("skipped: no PyTorch")
else:
    import matplotlib.pyplot as plt

    from gpt2enc_edu.course import plots

    names = {name: (f"ours, {name}" if not name.startswith("torch") else name.replace("torch", "nn.Embedding"))
             for name in RUNS}
    ax = plots.loss_curves({names[name]: a.losses.numpy() for name, (a, b) in RUNS.items()},
                           title=f"training loss, {DEVICE.type} configuration")
    plt.show()

# %% [markdown]
# *Figure: training loss against step, one line per encoder.*
#
# ### Where do two runs of the same encoder part, and how fast does the gap grow?
#
# Per step, the absolute difference between the two runs' losses, on a log axis. Identical steps have no place on a
# log axis: a pair is drawn from the step where it parts, and a pair that never parts is named in the panel.

# %%
if torch is None:
    print("skipped: no PyTorch")
else:
    ax = plots.loss_gaps({names[name]: a.loss_gaps(b) for name, (a, b) in RUNS.items()},
                         title="|loss of run 1 - loss of run 2| per step")
    plt.show()
    for name, (a, b) in RUNS.items():
        print(f"{names[name]:<34} {a.agreement(b)}")

# %% [markdown]
# *Figure: per-step loss difference of the two runs of each encoder (log scale), from the step where they part.*
#
# A run that parts does so by one step's gradient: the loss of that step still agrees, the next one's differs
# slightly. From there the two runs are two different trainings: the gap may stay small for a while (a loss rounded
# to fp32 can even come out equal again) or grow by orders of magnitude (AdamW normalises updates, and training
# amplifies small perturbations); the figure shows which, for these runs. Steps with equal losses are not drawn.
#
# ## 7. (optional) Time: the encoder in a step
#
# A whole step of this small model is mostly other work (and, at these sizes, Python and kernel launches). The encoder
# alone, forward plus backward into `.grad`, timed from the host around synchronised calls (so Python, launches and the
# id check are included, as a training step pays them). On the GPU at GPT-2 size (B = 8, T = 1024, C = 768, V = 50,257,
# bf16); on the CPU at this notebook's CPU size, where "ours" is the NumPy mirror, written to show the kernels'
# arithmetic, not to be fast. `check_ids=False` skips the id check (on the GPU one small kernel, on the CPU a NumPy
# comparison). The variants are timed in turn, each repeat running each once, so the rows compare with each other. At
# this size every row is mostly host time: our methods' GPU work differs by a few tens of microseconds (notebook 05),
# less than the host's time moves from run to run, so our deterministic rows come out close together and in no fixed
# order. The `atomic` row can stand apart: on bf16 its fp32 rows take a new stamp every call (a number the kernels
# compare to see which rows this call has widened already, notebook 02), a launch argument that changes from call to
# call, so the adapter cannot replay the launches it recorded for the shape (`gpt2enc_edu.plans`) and each call takes
# the full Python path for its three kernels. That this is what its extra time is made of is inferred, not profiled.

# %%
if torch is None:
    print("skipped: no PyTorch")
else:
    if DEVICE.type == "cuda":
        sizes = dict(B=8, T=1024, C=768, V=50257, dtype=torch.bfloat16)
    else:
        sizes = dict(B=CFG.batch_size, T=CFG.block_size, C=CFG.n_embd, V=6404, dtype=CFG.dtype)
    print(sizes)
    for label, ms in training.time_encoders(**sizes, device=DEVICE).items():
        print(f"{label:<34} {ms:8.3f} ms")

# %% [markdown]
# These are not the README's and notebook 05's numbers, which find our backward several times faster than PyTorch's
# deterministic one, and they need not agree with them: they time different things. The benchmark times the **GPU's
# work** of one call (CUDA events, host overhead hidden); the cell above times the **host** around a whole forward and
# backward, which for our encoder includes its Python: the adapter's autograd function, whose backward runs on
# autograd's device thread, and one driver call per kernel (after the first call of a shape, the adapter replays the
# launches it recorded then: `gpt2enc_edu.plans`). `nn.Embedding`'s path is C++ all the way. The next cell prints, from
# the committed benchmark, the GPU's work of the same calls and the same steps host-timed (its GPU is named; the cell
# above ran on this machine). The benchmark's step rows and the cell above time the same step, but in two processes at
# two moments, and often on two machines: host times differ between two processes by tens of percent or more (compare
# the cell above with the bench's rows), and between two hosts by up to several times (below): compare rows within one
# of them, not across. Even the order of rows can differ between hosts: a slower host weighs the adapter's Python more
# than `nn.Embedding`'s C++. On a second H100 host (`docs/experiments.md`, "A second host's step timings": its steps
# took 1.2 to 3.6 times the committed run's) the adapter's eager step at B = 8 was still shorter than `nn.Embedding`'s
# deterministic one for every kind of ids, but no longer shorter than the non-deterministic one, as the cell above may
# find too.

# %%
from gpt2enc_edu import bench
from gpt2enc_edu.course import measured

try:
    bench_rows, bench_meta = bench.load_results(measured.bench_dir())
except FileNotFoundError as exc:
    bench_rows, bench_meta = [], {}
    print(exc)
gpu_us = {r["case"]: float(r["median_us"]) for r in bench_rows if int(r["B"]) == 8 and r["ids"] == "real"}
if {"forward", "chunked_gpu", "torch_forward", "torch_backward_det"} <= gpu_us.keys():
    print(f"GPU time per call, B=8, T=1024, C=768, real ids ({bench_meta.get('device')}, committed bench):")
    print(f"  {'ours: forward + chunked backward':<42} {gpu_us['forward'] + gpu_us['chunked_gpu']:7.1f} us")
    print(f"  {'PyTorch: forward + deterministic backward':<42} {gpu_us['torch_forward'] + gpu_us['torch_backward_det']:7.1f} us")
steps = {case: gpu_us[case] for case in ("adapter_step", "adapter_step_graph", "torch_step", "torch_step_det")
         if case in gpu_us}
if steps:
    print("host-timed forward + backward, the same size (committed bench):")
    for case, us in steps.items():
        print(f"  {case:<42} {us:7.1f} us")

# %% [markdown]
# Where our host-timed figure is far above the GPU's work, the difference is host work. What it changes in a whole
# step depends on which side waits. Where the host is the bottleneck (a small model like this one, whose GPU work
# per step is short), the encoder's host time, ours or `nn.Embedding`'s, adds to every step, a small part of the
# steps of section 5.
# Where the GPU is (a real model, whose forward and backward keep the GPU busy for far longer than the host needs
# to queue them), the host runs ahead, since no call of the adapter waits for the GPU; its overhead hides behind
# the GPU's work, and what the step pays is the kernels' GPU time, where ours are the faster. A CUDA graph of the
# step takes the Python out altogether: `adapter_step_graph` above is a replay of one, host-timed, against
# `adapter_step`, the same step eager. A replay rounds with the seed drawn when the graph was captured, the same
# seed at every step, which is the fixed seed of notebook 04 section 5: over many replays its rounding errors add
# up where fresh seeds would average them out. Capture again to draw a new seed (`docs/torch.md`, "Seeds"); how
# often is a trade between a capture's cost and that drift, which this course does not measure.
#
# ### The step compiled (optional)
#
# `torch.compile(model, fullgraph=True)` traces the whole training step, the encoder included: the adapter's forward
# and backward are custom operators with fake implementations (shape-only stand-ins that tracing runs instead of the
# kernels), so the trace needs no graph break, and the compiled step draws its rounding seeds as the eager one does.
# Inductor (`torch.compile`'s code generator) fuses the *rest* of the model (LayerNorms, GELU,
# softmax, AdamW's inputs) into fewer kernels, and fusion changes their rounding: a compiled run's losses are close
# to the eager run's, not equal to them. What must hold is the promise itself: two compiled runs with our encoder
# give the same bits. The first two steps compile (tens of seconds on a CPU) and are not timed.

# %%
if torch is None:
    print("skipped: no PyTorch")
else:
    compiled = [training.train(CFG, encoder="ours", method="chunked", device=DEVICE, compile=True) for _ in range(2)]
    compiled_torch = training.train(CFG, encoder="torch", device=DEVICE, compile=True)
    print(f"two compiled runs, ours (chunked): {compiled[0].agreement(compiled[1])}")
    eager_ours, eager_torch = RUNS["chunked"][0], RUNS["torch, deterministic=True"][0]
    print(f"compiled against eager, ours: losses differ by at most "
          f"{(compiled[0].losses - eager_ours.losses).abs().max().item():.1e}")
    print(f"{'ms per training step':<34} {'eager':>8} {'compiled':>9}")
    for label, eager, comp in (("ours, chunked", eager_ours, compiled[0]),
                               ("nn.Embedding, deterministic", eager_torch, compiled_torch)):
        print(f"{label:<34} {eager.step_ms:>8.2f} {comp.step_ms:>9.2f}")

# %% [markdown]
# What the encoder changes in a whole step is the difference between the two rows, against the step itself. In a model
# this small the step is mostly launches and Python on both sides. Compiling takes launches and Python out of the
# *rest* of the model, and with `nn.Embedding` out of the encoder too: Inductor generates its gather and the position
# add itself and can fuse them with the kernels around them. It cannot with ours: the adapter's two custom operators
# still run their Python and their launches every step. So compiling takes more host work out of the `nn.Embedding`
# step than out of ours. Whether that step then gains more is not settled by one run: both gains are host time, which
# moves by tens of percent from one run to the next (section 5), so the stored run's two columns may come out in either
# order; they are one sample, not a ranking. The difference between the rows is host time, not GPU time (as the
# host-timed figures above show; which part of our operators' host time counts most here has not been profiled).
# In a model whose GPU work per step is long, the host's time hides behind it and the encoder's share of the step is
# its GPU time.

# %% [markdown]
# ## 8. What made the rest of the model deterministic (core)
#
# A bitwise-reproducible loss needs **every** op to be reproducible, not just the encoder:
#
# * **Seeds**: `torch.manual_seed` before building the model (initial weights); the encoder's stochastic
#   rounding draws from its own `torch.Generator`, seeded too. No dropout.
# * **Data order**: fixed windows of the token sample, the same at every run (no shuffling).
# * **Matmuls**: cuBLAS is reproducible on one GPU with a fixed workspace configuration,
#   `CUBLAS_WORKSPACE_CONFIG=:4096:8`, set before CUDA starts (the second code cell of section 0).
# * **Attention**: written out (`q @ k.T`, mask, softmax, `@ v`) rather than a fused attention kernel, some of
#   whose backward passes use atomics.
# * **Everything else** (LayerNorm, GELU, softmax, cross-entropy, AdamW's elementwise update) reduces in a
#   fixed order. `torch.use_deterministic_algorithms(True)` (on for the deterministic runs) makes PyTorch raise on
#   any op it knows to be nondeterministic, and it raised nothing. For our kernels it knows only what the adapter
#   declares (the atomic methods raise, section 4); that the chunked and bucketed ones keep their promise is what
#   the two identical runs above show.
# * **The same machine**: bits are reproducible on the same GPU model, software and batch size. A different
#   GPU (another cuBLAS algorithm) or the CPU gives other bits, identical from run to run.
#
# ## 9. (optional) Exercise
#
# Gradient accumulation: split each batch in two halves and call `backward` on each before the optimizer
# step. With the adapter, `.grad` is the sum of two fresh gradients (each stochastically rounded in bf16,
# then added by PyTorch's round-to-nearest add). Are two such runs still bitwise identical? Are they
# identical to the runs above? Predict, then try it with a copy of `training.train`.
