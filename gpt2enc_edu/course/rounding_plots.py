"""Plots of rounding for the notebooks (02, 04): how far results lie apart in ULPs, how an accumulation drifts,
how uniform the rounding noise is and how often it rounds up. As in ``plots``, each draws one picture from data the
package computed (``compare``, ``rounding``) and returns its Axes (or Figure); matplotlib is imported inside.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .plots import DPI, axes_or_new, labelled


def ulp_histogram(diffs: Mapping[str, np.ndarray], *, limit: int | None = None, ax=None,
                  title: str | None = None, unit: str = "ULPs"):
    """Histograms of integer ULP differences (``compare.ulp_difference``), one per label, log counts.

    With ``limit``, values beyond +-limit are counted in the two outermost bins (drawn at +-(limit + 1)
    and labelled as such), so a few huge differences (sums that cancel to almost zero have tiny ULPs) do
    not squash the picture. Bins are one ULP wide when the range is at most 200 ULPs, else 201 equal bins.
    """
    if not diffs:
        raise ValueError("diffs must hold at least one array")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    arrays = {}
    for label, d in diffs.items():  # counted with bincount, not ax.hist: millions of values stay cheap
        values = np.asarray(d).reshape(-1)
        arrays[label] = values if limit is None else np.clip(values, -limit - 1, limit + 1)
    lo = min(int(a.min(initial=0)) for a in arrays.values())
    hi = max(int(a.max(initial=0)) for a in arrays.values())
    bins = np.arange(lo - 0.5, hi + 1.5) if hi - lo <= 200 else np.linspace(lo - 0.5, hi + 0.5, 202)
    ax = axes_or_new(ax, (6.0, 3.2))
    for label, values in arrays.items():
        nonzero = int(np.count_nonzero(values))
        if hi - lo <= 200:
            counts = np.bincount((values - lo).astype(np.intp), minlength=hi - lo + 1)
        else:
            counts, _ = np.histogram(values, bins=bins)
        ax.stairs(counts, bins, linewidth=1.5, label=f"{label}: {nonzero} of {values.size} differ")
    ax.set_yscale("log")
    if limit is not None:
        ax.set_xticks(*_clipped_ticks(limit))
        ax.set_xlim(-limit - 1.5, limit + 1.5)
    return labelled(ax, f"difference ({unit})", "elements", title)


def _clipped_ticks(limit: int) -> tuple[list[int], list[str]]:
    """Ticks for an axis clipped at +-limit: a round step, and the two overflow bins labelled "<-limit" and
    ">limit" at +-(limit + 1), with no inner tick closer than half a step to them (so labels never collide)."""
    step = next(m * 10**e for e in range(12) for m in (1, 2, 5) if limit / (m * 10**e) <= 4)
    inner = [t for t in range(-(limit // step) * step, limit + 1, step) if abs(t) <= limit + 1 - max(step / 2, 2)]
    return [-limit - 1, *inner, limit + 1], [f"<{-limit}", *[f"{t:g}" for t in inner], f">{limit}"]


def error_vs_adds(adds, errors: Mapping[str, np.ndarray], *, ax=None, title: str | None = None,
                  ylabel: str = "median |error| of the row (ULPs)"):
    """Scatter of one error value per row (e.g. the median |ULP error| of a dwte row) against the number
    of adds the row received, one colour per label, log-scaled adds."""
    adds = np.asarray(adds, dtype=np.float64).reshape(-1)
    ax = axes_or_new(ax, (6.0, 3.5))
    for label, values in errors.items():
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        if values.shape != adds.shape:
            raise ValueError(f"errors[{label!r}] has {values.size} values for {adds.size} rows")
        ax.plot(adds, values, ".", markersize=4, alpha=0.6, label=label)
    ax.set_xscale("log")
    return labelled(ax, "adds into the row (occurrences of the token)", ylabel, title)


def rounding_drift(curves: Mapping[str, np.ndarray], *, exact=None, ax=None, title: str | None = None):
    """Value against step for several accumulations. A 2-D curve (runs, steps) draws each run thinly
    and its mean boldly; ``exact`` (a 1-D array) is drawn dashed."""
    ax = axes_or_new(ax, (6.0, 3.5))
    for label, values in curves.items():
        values = np.asarray(values, dtype=np.float64)
        if values.ndim == 1:
            ax.plot(np.arange(values.size), values, linewidth=1.5, label=label)
            continue
        steps = np.arange(values.shape[1])
        (mean,) = ax.plot(steps, values.mean(axis=0), linewidth=1.5, label=f"{label} (mean of {values.shape[0]} runs)")
        ax.plot(steps, values.T, linewidth=0.5, alpha=0.35, color=mean.get_color())
    if exact is not None:
        exact = np.asarray(exact, dtype=np.float64)
        ax.plot(np.arange(exact.size), exact, "k--", linewidth=1, label="exact")
    return labelled(ax, "step", "accumulated value", title)


def noise_uniformity(values, *, bits: int = 16, pairs: int = 2000):
    """Two panels on random ``bits``-bit integers (e.g. ``noise_2d(...) & 0xFFFF`` of consecutive
    positions): a histogram (flat if uniform) and each value against the next (no pattern if independent)."""
    import matplotlib.pyplot as plt

    values = np.asarray(values).reshape(-1).astype(np.int64)
    if values.size < 2:
        raise ValueError("values must hold at least two numbers")
    top = 1 << bits
    fig, (hist_ax, lag_ax) = plt.subplots(1, 2, figsize=(8.0, 3.2), dpi=DPI, layout="constrained")
    hist_ax.hist(values, bins=64, range=(0, top))
    hist_ax.axhline(values.size / 64, color="black", linestyle="--", linewidth=1, label="uniform")
    hist_ax.set_xlabel(f"value ({bits} bits)")
    hist_ax.set_ylabel("count")
    hist_ax.legend(fontsize=8)
    n = min(pairs, values.size - 1)
    lag_ax.plot(values[:n], values[1 : n + 1], ".", markersize=2)
    lag_ax.set_xlabel("value at position i")
    lag_ax.set_ylabel("value at position i + 1")
    lag_ax.set_xlim(0, top)
    lag_ax.set_ylim(0, top)
    return fig


def round_up_probability(fraction, observed, *, ax=None, title: str | None = None):
    """Observed frequency of rounding up against the value's position between two bf16 neighbours,
    with the ideal ``y = x`` line that unbiased stochastic rounding should follow."""
    fraction = np.asarray(fraction, dtype=np.float64)
    observed = np.asarray(observed, dtype=np.float64)
    if fraction.shape != observed.shape:
        raise ValueError(f"fraction and observed must have one shape, got {fraction.shape} and {observed.shape}")
    ax = axes_or_new(ax, (4.2, 3.6))
    ax.plot([0, 1], [0, 1], "k--", linewidth=1, label="ideal: P(up) = fraction")
    ax.plot(fraction, observed, "o", markersize=4, label="observed")
    return labelled(ax, "position between the two bf16 neighbours", "fraction rounded up", title)
