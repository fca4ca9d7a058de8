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
# # 04 · Stochastic rounding, deterministically
#
# **Goal:** see why bf16 gradients need stochastic rounding (rounding to nearest silently drops small
# updates), and how the kernels round stochastically and still give the same bits on every run and
# on both backends: a stateless hash (SquirrelNoise5) of the element's position, and a 16-bit
# threshold.
#
# **Prerequisites:** notebook 02 (bf16 storage, rounding after an add, ULPs); notebook 03 helps for the
# comparison with llm.c but is not needed. Bit operations on integers (`&`, shifts) in Python or C.
#
# **After this notebook you can:**
# 1. say why round-to-nearest bf16 stalls a sum of small updates, and what stochastic rounding does instead;
# 2. compute the probability that the 16-bit threshold trick rounds a value away from zero (Exercise 4
#    checks it);
# 3. say why the kernels key the noise by element, tensor and seed, and what a fixed seed would do.
#
# **Time:** about 15 minutes for the core sections; the sections marked *(optional)* add about 10.
#
# 0. Setup · 1. bf16 drops small updates · 2. Drift: many small additions · 3. SquirrelNoise5 ·
# 4. The 16-bit threshold trick · 5. Why key the noise by element and seed · 6. (optional) llm.c does it this way ·
# 7. Through the real kernels · 8. (optional) The accumulation stall, method by method · 9. Exercise 4

# %%
import importlib.util, os, subprocess, sys
sys.path[:0] = [os.path.abspath("..")] if os.path.isdir("../gpt2enc_edu") else []  # a checkout: the folder above notebooks/
if importlib.util.find_spec("gpt2enc_edu") is None:  # Colab or Kaggle: pip-install it from the repository GPT2ENC_EDU_REPO names
    repo = os.environ.get("GPT2ENC_EDU_REPO") or sys.exit("gpt2enc_edu is not installed (notebooks/README.md). On Colab or Kaggle run `%env GPT2ENC_EDU_REPO=<owner>/gpt2enc-edu` (its GitHub repository), then this cell again.")
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", f"gpt2enc-edu[notebooks] @ git+https://github.com/{repo}"])
enc = importlib.import_module("gpt2enc_edu.course.hosted").setup()  # Colab or Kaggle: the CuPy for the runtime's CUDA

# %%
import numpy as np
from IPython.display import Markdown, display

from gpt2enc_edu import compare, rounding
from gpt2enc_edu.course import arrays, exercises, rounding_plots
from gpt2enc_edu.backend import to_numpy
from gpt2enc_edu.loader import kernel_source

# %% [markdown]
# ## 1. bf16 drops small updates (core)
#
# bf16 is the top half of an fp32 number: the same 8 exponent bits, but 7 stored mantissa bits instead
# of 23. Between 1 and 2 its values are 2⁻⁷ = 0.0078125 apart. Add 1e-4 to 1.0 in fp32, round to the
# nearest bf16, and the update is gone: 1.0001 is much closer to 1.0 than to the next bf16 value.

# %%
# NBVAL_CHECK_OUTPUT
one = np.float32(1.0)
total = rounding.fadd(one, np.float32(1e-4))  # fp32 keeps it
stored = rounding.to_bf16_nearest(total)      # bf16, round to nearest even: lost
print(f"fp32: {float(total):.7f}  bits 0x{int(np.asarray(total).view(np.uint32)):08X}")
print(f"bf16: {float(stored):.7f}  bits 0x{int(np.asarray(stored).view(np.uint16)):04X}")
print(f"next bf16 above 1.0: {1 + 2**-7}")


# %% [markdown]
# One lost update is harmless. But a weight, or a gradient accumulated over micro-batches, receives
# updates much smaller than its own ULP **all the time**, and round-to-nearest loses every one of them,
# always in the same direction.
#
# ## 2. Drift: many small additions (core)
#
# Start at 1.0 and add 1e-4 ten thousand times; the exact answer is 2.0. Three ways of storing the running value: fp32;
# bf16 with round-to-nearest; bf16 with stochastic rounding, which rounds to the neighbour farther from zero with
# probability equal to how far the value lies towards it (here all values are positive, so that is rounding **up**). On
# average stochastic rounding adds exactly what was added. Eight independent runs (eight elements) show its spread.

# %%
def accumulate_bf16(increment, steps, runs, seed_of_step):
    """Add ``increment`` to 1.0 ``steps`` times, storing bf16 with stochastic rounding after every add.
    Run r is element r (its own random numbers); returns the values, shape (runs, steps + 1)."""
    element = np.arange(runs)
    values = np.empty((runs, steps + 1), np.float32)
    values[:, 0] = x = rounding.to_bf16_nearest(np.ones(runs))
    for step in range(1, steps + 1):
        x = rounding.stochastic_round_bf16(rounding.fadd(rounding.to_float(x), increment), element, 0,
                                           seed=seed_of_step(step))
        values[:, step] = x
    return values


steps, increment, runs = 10_000, np.float32(1e-4), 8
stochastic = accumulate_bf16(increment, steps, runs, seed_of_step=lambda step: step)  # a fresh seed per step
fp32, nearest = np.empty(steps + 1, np.float32), np.empty(steps + 1, np.float32)
fp32[0] = x32 = np.float32(1.0)
nearest[0] = xn = rounding.to_bf16_nearest(1.0)
for step in range(1, steps + 1):
    fp32[step] = x32 = rounding.fadd(x32, increment)
    nearest[step] = xn = rounding.to_bf16_nearest(rounding.fadd(rounding.to_float(xn), increment))

# %%
ax = rounding_plots.rounding_drift({"bf16, round to nearest": nearest, "bf16, stochastic": stochastic, "fp32": fp32},
                          exact=1.0 + np.arange(steps + 1) * 1e-4, title="1.0 + 10000 additions of 1e-4")

# %% [markdown]
# *Figure: accumulated value against step for 10,000 additions of 1e-4 to 1.0: round-to-nearest bf16 stays flat at
# 1.0, stochastic bf16 runs scatter around the exact line, fp32 lies on it.*

# %%
# NBVAL_CHECK_OUTPUT
print(f"after {steps} additions (exact 2.0):")
print(f"  fp32                    {float(fp32[-1]):.6f}")
print(f"  bf16, round to nearest  {float(nearest[-1]):.6f}")
print(f"  bf16, stochastic        mean of {runs} runs {float(stochastic[:, -1].mean()):.6f}, "
      f"runs {np.round(stochastic[:, -1].astype(np.float64), 4).tolist()}")

# %% [markdown]
# Round-to-nearest never moves. Stochastic rounding follows the exact line (fp32 lies on it); each run
# wanders around it, the price of storing only 8 significant bits, but without bias. By how many bf16 steps
# (one step is the bf16 ULP at the exact value: 2⁻⁷ below 2.0):

# %%
exact_line = 1.0 + np.arange(steps + 1) * float(increment)
step_size = np.ldexp(1.0, np.frexp(exact_line)[1] - 8)  # the bf16 ULP at each exact value
distance = np.abs(stochastic.astype(np.float64) - exact_line) / step_size
print(f"distance of the {runs} runs from the exact line, in bf16 steps: at most {distance.max():.1f} along the way, "
      f"{distance[:, -1].min():.1f} to {distance[:, -1].max():.1f} at the end")

# %% [markdown]
#
# ## 3. SquirrelNoise5: random numbers without state (core)
#
# A GPU kernel has no convenient random generator to draw from: a generator has state, and thousands
# of threads sharing it would need coordination (and would draw in a timing-dependent order).
# SquirrelNoise5 is a *hash*: a few multiplications, additions and shifts turn `(position, seed)` into 32
# bits that look random. The same inputs give the same bits, on any thread, on any device, in any order.
# `noise_2d(x, y, seed)` folds a 2-D position into one. Here is the code the kernels use, read from
# `kernels/common.cuh`:

# %%
source = kernel_source("common.cuh")
start = source.index("// Random numbers without state")
display(Markdown(f"```cuda\n{source[start:]}\n```"))

# %% [markdown]
# `gpt2enc_edu.rounding` computes the same thing in wrapping `np.uint32` arithmetic, so the mirror draws
# the GPU's numbers exactly:

# %%
# NBVAL_CHECK_OUTPUT
for seed in (0, 1):
    values = rounding.squirrel_noise5(np.arange(4), seed)
    print(f"seed {seed}: squirrel_noise5(0..3) =", " ".join(f"0x{int(v):08X}" for v in values))

# %% [markdown]
# Neighbouring positions get unrelated numbers, and the low 16 bits, the part the rounding uses, are
# spread evenly:

# %%
thresholds = rounding.noise_2d(np.arange(1 << 16), 0, 2024) & 0xFFFF
fig = rounding_plots.noise_uniformity(thresholds)

# %% [markdown]
# *Figure: left, a flat histogram of 65,536 16-bit thresholds; right, each threshold against the next, a
# structureless cloud.*
#
# ## 4. The 16-bit threshold trick (core)
#
# bf16 keeps the top 16 bits of an fp32 value and drops the low 16. Read those 16 dropped bits as a number
# `dropped` between 0 and 65535: it says how far the value lies from the lower bf16 neighbour
# (towards zero) to the upper one, in steps of 1/65536. Draw a random 16-bit `threshold`, then
#
# * if `dropped > threshold`: set all 16 low bits to 1, and round-to-nearest rounds **up** (away from zero);
# * otherwise: clear them, and the value is exactly the lower neighbour (truncation).
#
# The first happens for `dropped` of the 65536 possible thresholds, so the value rounds up with
# probability `dropped / 65536`: its position between the neighbours. Setting the bits and letting
# the hardware's round-to-nearest do the rest handles carries into the exponent, infinities and NaNs
# without any special case. Step by step for one value, six elements and seed 7:

# %%
# NBVAL_CHECK_OUTPUT
x = np.float32(1.0 + 0.3 * 2**-7)  # 30% of the way from 1.0 to the next bf16 value
dropped = int(np.asarray(x).view(np.uint32)) & 0xFFFF
print(f"x = {float(x):.7f}, bits 0x{int(np.asarray(x).view(np.uint32)):08X}, dropped = {dropped} "
      f"({dropped / 65536:.3f} of the way up)")
elements = np.arange(6)
threshold = rounding.noise_2d(elements, 0, 7) & 0xFFFF
result = rounding.stochastic_round_bf16(np.full(6, x), elements, 0, 7)
for e, th, r in zip(elements, threshold, result):
    print(f"element {e}: threshold {int(th):5d} -> {'up  ' if dropped > th else 'down'} -> bf16 {float(r):.7f}")

# %% [markdown]
# Over many elements, the frequency of rounding up follows the position between the neighbours:

# %%
fractions = np.linspace(0, 1, 21)[:-1]
draws = np.arange(1 << 16)
observed = [float((rounding.stochastic_round_bf16(np.full(draws.size, np.float32(1 + f * 2**-7)), draws, 0, 99)
                   > 1.0).mean()) for f in fractions]
ax = rounding_plots.round_up_probability(fractions, observed, title="1 + f * 2^-7, 65536 draws each")

# %% [markdown]
# *Figure: the observed fraction rounded up against the position between two bf16 neighbours; the points lie on the
# diagonal.*
#
# ## 5. Why key the noise by element and seed (core)
#
# The kernels draw the threshold of element `e` of a gradient tensor as `noise_2d(e, stream, seed)`:
#
# * **the element's flat index**, not the thread's or the block's: which thread writes an element
#   depends on the launch shape and on the bucket table, and must not change the result. Keyed by the
#   element, the GPU and the mirror draw the same number, and bucket order cannot matter (notebook 03);
# * **a stream per tensor** (`dwte` 0, `dwpe` 1; a *stream* of the noise, a separate sequence of its numbers,
#   nothing to do with CUDA streams), so that element 5 of `dwte` and element 5 of `dwpe` do not share their
#   random numbers;
# * **a fresh seed every step**. With a fixed seed each element keeps its threshold forever, and the rounding stops
#   being random: an element whose threshold lies above the update's `dropped` bits never rounds up (stuck, like
#   round-to-nearest), one whose threshold lies below always rounds up (a full bf16 step for every small update). With
#   updates of a quarter of a bf16 step (2⁻⁹), each element runs away with probability one quarter (3 of the 8 below),
#   and the rest never move. A runaway element climbs while its threshold stays below the update's share of a bf16 step:
#   a quarter of a step between 1 and 2, an eighth between 2 and 4 (the step doubles), a sixteenth above 4. So each
#   stops at the first power of two where its threshold no longer passes: 2.0 or 4.0 here. (A CUDA graph replays the
#   seed it was captured with, which is this fixed seed again: notebook 07, section 7.) The mean is biased either way:

# %%
quarter, steps_q = np.float32(2.0**-9), 512
fresh = accumulate_bf16(quarter, steps_q, runs, seed_of_step=lambda step: step)
fixed = accumulate_bf16(quarter, steps_q, runs, seed_of_step=lambda step: 0)
ax = rounding_plots.rounding_drift({"fresh seed every step": fresh, "the same seed every step": fixed},
                          exact=1.0 + np.arange(steps_q + 1) * 2.0**-9, title="1.0 + 512 additions of 2^-9")

# %% [markdown]
# *Figure: 512 additions of 2^-9: with a fresh seed per step the runs follow the exact line; with one seed some runs
# climb in full bf16 steps and the others never move.*

# %%
# NBVAL_CHECK_OUTPUT
print("after 512 additions of 2^-9 (exact 2.0), the 8 runs:")
print("  fresh seed every step:", fresh[:, -1].astype(np.float64).tolist())
print("  the same seed        :", fixed[:, -1].astype(np.float64).tolist())

# %% [markdown]
# ## 6. (optional) llm.c does it this way
#
# The threshold trick and SquirrelNoise5 are llm.c's (`stochastic_rounding` in its `llmc/cuda_utils.cuh`,
# called from [`llmc/encoder.cuh`](https://github.com/karpathy/llm.c/blob/master/llmc/encoder.cuh)). The
# key differs. llm.c draws
#
# ```c
# Get2dNoiseUint(threadIdx.x, blockIdx.x * blockDim.x + blockIdx.y, seed')
# // wte kernel: seed' = seed + bucket * WARP_SIZE + threadIdx.x + k
# // wpe kernel: seed' = seed + idx + k
# ```
#
# so an element's random number depends on **which thread of which block wrote it**, and for `dwte` on the
# index of its bucket. Three consequences:
#
# * the bits of llm.c's `dwte` change if the bucket order changes, and that order comes from an
#   `unordered_map` and an unstable `std::sort` (notebook 03): reproducible with the same binary and
#   standard library, not across them;
# * a different launch shape (block size, a kernel that splits buckets, like the chunked one of notebook
#   06) would round differently, so every variant would need its own reference bits;
# * a CPU mirror would have to replay the launch to draw the same numbers.
#
# Keyed by `(element, tensor, seed)`, none of this arises: every kernel variant, any table order and the
# NumPy mirror round each element with the same threshold. The price is llm.c's exact bits: `method="bucketed"`
# sums in llm.c's order, yet its result differs from llm.c's by up to 1 ULP wherever the two noises pick different
# bf16 neighbours of what should be the same fp32 sum (notebook 03, section 6, has the comparison).
#
# ## 7. Through the real kernels (core)
#
# The same experiment with `encoder_backward` itself, on the active backend: one token at one position (B = T = 1, V =
# 1, C = 64 bf16 channels), `dwte` starting at 1.0, and a gradient of 1e-3 every step, 1000 steps. `method="bucketed"`
# rounds stochastically with the step as seed; `method="atomic"` adds in fp32 and rounds to nearest. fp32 accumulation,
# which kept notebook 02's small updates, cannot help here: it lasts one call, and each call rounds its result to bf16
# once, so from one step to the next the value lives in bf16 and an update below half an ULP is lost at every step.

# %%
xp = arrays()  # the active backend
steps_k, C = 1000, 64
grad = np.float32(1e-3).astype(enc.bfloat16)  # 0.00099945..., the nearest bf16
dout = xp.asarray(np.full((1, 1, C), grad, dtype=enc.bfloat16))
inp = xp.asarray(np.zeros((1, 1), dtype=np.int32))
curves, finals = {}, {}
for method in ("atomic", "bucketed"):
    dwte = xp.asarray(np.ones((1, C), dtype=enc.bfloat16))
    dwpe = xp.asarray(np.zeros((1, C), dtype=enc.bfloat16))
    means = [1.0]
    for step in range(1, steps_k + 1):
        enc.encoder_backward(dwte, dwpe, dout, inp, seed=step, method=method)
        means.append(float(to_numpy(dwte).astype(np.float64).mean()))
    curves[f"method={method!r}"], finals[method] = np.array(means), to_numpy(dwte)
print(enc.last_backend())
ax = rounding_plots.rounding_drift(curves, exact=1.0 + np.arange(steps_k + 1) * float(grad),
                          title=f"dwte (bf16), {steps_k} backward steps of 1e-3")

# %% [markdown]
# *Figure: mean of dwte over 1000 backward steps of 1e-3: the bucketed kernel (stochastic rounding) follows the
# exact line, the atomic one (round to nearest) stays at 1.0.*

# %%
# NBVAL_CHECK_OUTPUT
for method, dwte in finals.items():
    print(f"{method:8s}: mean of dwte after {steps_k} steps {dwte.astype(np.float64).mean():.5f}, "
          f"checksum {compare.checksum(dwte)}")

# %% [markdown]
# The bucketed kernel tracks the exact sum, the atomic one (round to nearest) stays at 1.0. The
# checksum of the bucketed result is the same on the GPU and in the CPU mirror: stochastic, yet
# reproducible.
#
# ## 8. (optional) The accumulation stall, method by method
#
# Gradient accumulation adds into `dwte` call after call, and every call rounds its result to the storage
# dtype once. What that does depends on the rounding, so here are all four methods, in bf16 and in fp32:
# 1000 calls adding 1e-3 into 1.0, 256 channels (256 independently rounded elements).
#
# * **Round to nearest** (`atomic`: fp32 adds, rounded once per call; `atomic_bf16`: every add rounded): an
#   update smaller than half an ULP of the stored value is lost, every call. Between 1 and 2 a bf16 ULP is
#   2⁻⁷, half of it 0.0039 > 0.001: the accumulation **stalls** at exactly 1.0.
# * **Stochastic rounding** (`bucketed`, `chunked`): unbiased, so each element's expected value is the exact
#   sum. Its spread comes from the ULP: one stochastic rounding onto a grid of spacing u has variance at
#   most u²/4; the values stay below 4, so u ≤ 2⁻⁶, and the mean of 256 elements after 1000 calls has a
#   standard deviation of at most √(1000 · 2⁻¹² / 4 / 256) ≈ 0.015.
# * **fp32**: round to nearest too, but 1e-3 is far above half an fp32 ULP (6e-8 at 1.0): every method keeps up.

# %%
from gpt2enc_edu import validate

calls, width = 1000, 256
one_id = xp.zeros((1, 1), dtype=np.int32)
exact_sum = 1.0 + calls * float(np.float32(1e-3).astype(enc.bfloat16))  # the bf16 gradient, added 1000 times
sigma_of_mean = np.sqrt(calls * 2.0**-12 / 4 / width)
print(f"exact sum {exact_sum:.5f}; the stochastic methods' mean must lie within 5 sigma = {5 * sigma_of_mean:.3f}")
for dtype in (enc.bfloat16, np.float32):
    for method in validate.METHODS:
        if method == "atomic_bf16" and np.dtype(dtype) != np.dtype(enc.bfloat16):
            continue  # bf16 atomics need bf16 storage
        dwte_s = xp.asarray(np.ones((1, width), dtype=dtype))
        dwpe_s = xp.asarray(np.ones((1, width), dtype=dtype))
        dout_s = xp.asarray(np.full((1, 1, width), 1e-3, dtype=np.float32).astype(dtype))
        for call in range(calls):
            enc.encoder_backward(dwte_s, dwpe_s, dout_s, one_id, seed=call, method=method, check_ids=False)
        got = to_numpy(dwte_s).astype(np.float64)
        exact = 1.0 + calls * float(np.float32(1e-3).astype(dtype))
        if np.dtype(dtype) == np.dtype(np.float32):
            verdict = "keeps up"
            assert np.abs(got - exact).max() <= calls * 2.0**-23
        elif method.startswith("atomic"):
            verdict = "stalled at 1.0"
            assert (got == 1.0).all()
        else:
            verdict = "reaches the sum on average"
            assert abs(got.mean() - exact) < 5 * sigma_of_mean and got.max() < 4
        print(f"{np.dtype(dtype).name:8s} {method:11s}: mean {got.mean():.5f}, min {got.min():.5f}, "
              f"max {got.max():.5f}  ({verdict})")


# %% [markdown]
# This is the lesson of stochastic rounding in one table: with bf16 storage, only the stochastically rounded
# methods keep gradient accumulation working for updates below half an ULP. (With one position per call no
# method has anything to reorder: each call makes the same single fp32 add, old value + 1e-3. So the atomic
# methods' stall is exact to the bit, on both backends, and the `bucketed` and `chunked` rows are identical: the
# same sum, rounded with the same element-keyed threshold.)
# `tests/test_bounds.py` asserts the same on both backends, and `docs/reliability.md` states the drift per
# method.
#
# ## 9. Exercise 4: the probability of rounding away from zero (core)
#
# Write `away_from_zero_probability(x)`: for each fp32 value of the array `x` (NumPy or CuPy), the
# probability that stochastic rounding stores the bf16 neighbour farther from zero. Values that bf16
# holds exactly must get 0. Every such probability is a multiple of 1/65536, so the check asks for it
# exactly: it hands you values with all 65536 patterns of the bits bf16 drops (under signs and exponents
# drawn when it runs), then shows a few of your answers next to the package's rounding, drawn with a fresh
# seed.
#
# *Hint:* "The 16-bit threshold trick" above and `round_to_storage` in `kernels/common.cuh`: which bits does
# bf16 drop, and what is the threshold compared with? Solution: `solutions/exercises.py` (in the
# repository, outside the package).

# %%
def away_from_zero_probability(x):
    """Exercise 4: P(stochastic rounding to bf16 moves each fp32 value of x away from zero)."""
    raise NotImplementedError("Exercise 4: compute the probability of rounding away from zero")


# %%
done = exercises.check_away_from_zero_probability(away_from_zero_probability, xp=xp)
