"""Plots of benchmark results (``gpt2enc_edu.bench`` rows): time vs B, percent of the floor, achieved bandwidth
against the copy rate (roofline-style), and the deterministic backward taken apart kernel by kernel.

The functions draw into a ``matplotlib.figure.Figure`` -- a new one (no pyplot, so the command-line
benchmark works without a display) or one you pass, e.g. ``plt.figure()`` in a notebook.
"""

from __future__ import annotations

from pathlib import Path

from .cases import CASES, CASES_BY_NAME, ID_KINDS, PIECE_FALLBACK, piece_value
from .floor import OPS, copy_rate_of

#: Line style per family: ours solid, PyTorch dashed, the host-only bucketing and the host-timed steps dotted, single
#: kernels dash-dotted.
_FAMILY_STYLE = {"ours": "-", "torch": "--", "host": ":", "piece": "-.", "step": ":"}
_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink",
           "tab:olive", "tab:gray", "tab:cyan", "darkgoldenrod", "navy", "crimson", "teal", "indigo", "lime",
           "salmon", "black", "gold", "darkgreen", "magenta", "sienna")
CASE_COLORS = {case.name: _COLORS[i % len(_COLORS)] for i, case in enumerate(CASES)}

TIME_PNG = "time_vs_B.png"
FLOOR_PNG = "pct_of_floor.png"
ROOFLINE_PNG = "roofline.png"
BREAKDOWN_PNG = "breakdown.png"
#: The breakdown's stacks, left and right bar: (pieces stacked bottom to top, the whole call drawn as a marker).
#: (Each method's own table: the chunked method builds it without the bucket rows.)
BREAKDOWN_STACKS = ((("wpe_kernel", "gpu_buckets_units", "wte_chunked_kernel"), "chunked_gpu"),
                    (("wpe_kernel", "gpu_buckets", "wte_bucketed_kernel"), "bucketed_gpu"))
_PIECE_HATCH = {"wpe_kernel": "", "gpu_buckets": "//", "gpu_buckets_units": "\\\\", "wte_chunked_kernel": "..",
                "wte_bucketed_kernel": "xx"}


def _new_figure(fig, ncols: int, *, height: float = 4.2):
    from matplotlib.figure import Figure

    if fig is None:
        fig = Figure(figsize=(5.2 * ncols, height), layout="constrained")
    axes = fig.subplots(1, ncols, sharey=True, squeeze=False)[0]
    return fig, axes


def _kinds(rows) -> list[str]:
    kinds = [k for k in ID_KINDS if any(r["ids"] == k for r in rows)]
    if not kinds:
        raise ValueError("no rows to plot")
    return kinds


def _legend(fig, axes) -> None:
    """One legend under the panels, with every label of every panel once (a case may miss from one)."""
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize="small")


def _series(rows, case: str, kind: str, key: str):
    points = sorted((r["B"], r[key]) for r in rows if r["case"] == case and r["ids"] == kind and r[key] is not None)
    return [p[0] for p in points], [p[1] for p in points]


def _batch_axis(ax, rows) -> None:
    """Log2 batch-size axis, ticked at the batch sizes measured."""
    from matplotlib.ticker import NullLocator

    sizes = sorted({r["B"] for r in rows})
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("batch size B (T=1024)")


def _log_panel(ax, rows, kind: str) -> None:
    """What every line plot's panel has: the batch-size axis, a log time or rate axis, the id kind, a grid."""
    _batch_axis(ax, rows)
    ax.set_yscale("log")
    ax.set_title(f"{kind} ids")
    ax.grid(True, which="both", alpha=0.3)


def _case_lines(ax, rows, kind: str, key: str) -> None:
    """One line per case of ``key`` against B, in the case's color and its family's style."""
    for case in CASES:
        bs, values = _series(rows, case.name, kind, key)
        if bs:
            ax.plot(bs, values, _FAMILY_STYLE[case.family], marker="o", ms=3, color=CASE_COLORS[case.name],
                    label=case.label)


def _finish(fig, axes, ylabel: str, title: str, meta):
    """The first panel's y label, the legend and the title; returns the figure."""
    axes[0].set_ylabel(ylabel)
    _legend(fig, axes)
    fig.suptitle(_title(title, meta))
    return fig


def _title(text: str, meta) -> str:
    """A figure's title, followed by the run's device and date when the results carry them."""
    if not meta:
        return text
    return f"{text}  ({meta.get('device', '?')}, {str(meta.get('date', '?'))[:10]})"


def plot_times(rows, *, fig=None, meta=None, floors: bool = True):
    """Median time (p10-p90 band) vs batch size, one panel per id kind, one line per kernel.

    The floors (minimal bytes / copy rate) of the forward and the backward are drawn in black.
    """
    rows = list(rows)
    kinds = _kinds(rows)
    fig, axes = _new_figure(fig, len(kinds))
    for ax, kind in zip(axes, kinds):
        for case in CASES:
            bs, med = _series(rows, case.name, kind, "median_us")
            if not bs:
                continue
            _, lo = _series(rows, case.name, kind, "p10_us")
            _, hi = _series(rows, case.name, kind, "p90_us")
            color = CASE_COLORS[case.name]
            ax.plot(bs, med, _FAMILY_STYLE[case.family], marker="o", ms=3, color=color, label=case.label)
            ax.fill_between(bs, lo, hi, color=color, alpha=0.15, linewidth=0)
        if floors:
            for op, style in zip(OPS, ("-.", ":")):
                points = sorted({(r["B"], r["floor_us"]) for r in rows
                                 if r["ids"] == kind and r["op"] == op and r["floor_us"] is not None})
                if points:
                    ax.plot([p[0] for p in points], [p[1] for p in points], style, color="black", lw=1.5,
                            label=f"floor, {op}")
        _log_panel(ax, rows, kind)
    return _finish(fig, axes, "time per call (us), median", "GPT-2 encoder: time vs batch size", meta)


def plot_percent_of_floor(rows, *, fig=None, meta=None):
    """Percent of the floor (floor / median; 100 = as fast as a copy of the minimal bytes) vs batch size."""
    rows = [r for r in rows if r["pct_of_floor"] is not None]
    kinds = _kinds(rows)
    fig, axes = _new_figure(fig, len(kinds))
    for ax, kind in zip(axes, kinds):
        _case_lines(ax, rows, kind, "pct_of_floor")
        ax.axhline(100, color="black", lw=1)
        _log_panel(ax, rows, kind)
    return _finish(fig, axes, "% of floor (higher is better)", "Percent of the memory floor", meta)


def plot_roofline(rows, *, fig=None, meta=None):
    """Achieved bandwidth (minimal bytes / median time) vs batch size, under the roof of the measured copy rate.

    Every case with a floor is drawn, the single kernels too (their minimal bytes are their own: the wpe
    kernel's, the wte kernel's); a point at the roof moves its minimal bytes as fast as a copy does.
    """
    rows = [r for r in rows if r.get("achieved_GBps") is not None]
    kinds = _kinds(rows)
    rate = copy_rate_of(rows, meta)
    fig, axes = _new_figure(fig, len(kinds))
    for ax, kind in zip(axes, kinds):
        _case_lines(ax, rows, kind, "achieved_GBps")
        if rate is not None:
            ax.axhline(rate / 1e9, color="black", lw=1.5, label=f"copy rate (roof), {rate / 1e9:.0f} GB/s")
            lowest = min(r["achieved_GBps"] for r in rows if r["ids"] == kind)
            ax.set_ylim(min(lowest, rate / 1e9) / 2, 2 * rate / 1e9)
        _log_panel(ax, rows, kind)
    return _finish(fig, axes, "achieved GB/s = minimal bytes / time", "Achieved bandwidth against the copy rate", meta)


def has_breakdown(rows) -> bool:
    """Whether the rows hold the pieces ``plot_breakdown`` stacks (a run with the ``piece`` cases)."""
    names = {r["case"] for r in rows}
    return any(all(p in names or PIECE_FALLBACK.get(p) in names for p in pieces) for pieces, _ in BREAKDOWN_STACKS)


def plot_breakdown(rows, *, fig=None, meta=None):
    """The deterministic backward taken apart: per B, the pieces' medians stacked (wpe kernel, bucket table,
    wte kernel; chunked on the left, bucketed on the right) and the whole call as a black marker.

    The pieces are timed one at a time: a stack taller than its marker means the call overlaps pieces (the
    wpe kernel runs beside the table and the wte kernel), a shorter one that the call pays for gaps between them.
    """
    rows = list(rows)
    if not has_breakdown(rows):
        raise ValueError("no per-kernel rows to plot (a run with the wpe_kernel, gpu_buckets and wte_* cases)")
    kinds = _kinds(rows)
    by_key = {(r["case"], r["ids"], r["B"]): r["median_us"] for r in rows}
    sizes = sorted({r["B"] for r in rows})
    fig, axes = _new_figure(fig, len(kinds))
    width = 0.38
    for ax, kind in zip(axes, kinds):
        for side, (pieces, whole) in enumerate(BREAKDOWN_STACKS):
            xs = [i + (side - 0.5) * width for i in range(len(sizes))]
            bottom = [0.0] * len(sizes)
            for piece in pieces:
                heights = [piece_value(by_key, piece, kind, b) or 0.0 for b in sizes]
                ax.bar(xs, heights, width * 0.95, bottom=bottom, color=CASE_COLORS[piece],
                       hatch=_PIECE_HATCH.get(piece, ""), edgecolor="white", label=CASES_BY_NAME[piece].label)
                bottom = [lo + h for lo, h in zip(bottom, heights)]
            totals = [(x, by_key[(whole, kind, b)]) for x, b in zip(xs, sizes) if (whole, kind, b) in by_key]
            if totals:
                ax.plot([t[0] for t in totals], [t[1] for t in totals], "_", ms=14, mew=2.5, color="black",
                        label="whole call (chunked left, bucketed right)")
        ax.set_xticks(range(len(sizes)), [str(b) for b in sizes])
        ax.set_xlabel("batch size B (T=1024); left bar chunked, right bar bucketed")
        ax.set_title(f"{kind} ids")
        ax.grid(True, axis="y", alpha=0.3)
    return _finish(fig, axes, "time (us), median of each piece alone", "Deterministic backward, kernel by kernel", meta)


def save_plots(rows, out_dir, *, meta=None) -> list[Path]:
    """Write the plots into ``out_dir`` (the breakdown only when the rows hold its pieces); returns their paths."""
    out_dir = Path(out_dir)
    rows = list(rows)
    draws = [(TIME_PNG, plot_times), (FLOOR_PNG, plot_percent_of_floor), (ROOFLINE_PNG, plot_roofline)]
    if has_breakdown(rows):
        draws.append((BREAKDOWN_PNG, plot_breakdown))
    paths = []
    for name, draw in draws:
        path = out_dir / name
        draw(rows, meta=meta).savefig(path, dpi=110)
        paths.append(path)
    return paths
