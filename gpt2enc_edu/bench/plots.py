"""Plots of benchmark results (``gpt2enc_edu.bench`` rows): time vs B, and percent of the floor.

The functions draw into a ``matplotlib.figure.Figure`` -- a new one (no pyplot, so the command-line
benchmark works without a display) or one you pass, e.g. ``plt.figure()`` in a notebook.
"""

from __future__ import annotations

from pathlib import Path

from ._legacy import CASES, ID_KINDS, OPS

#: Line style per family: ours solid, PyTorch dashed, the host-only bucketing dotted.
_FAMILY_STYLE = {"ours": "-", "torch": "--", "host": ":"}
_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink",
           "tab:olive", "tab:gray", "tab:cyan", "darkgoldenrod", "navy", "crimson")
CASE_COLORS = {case.name: _COLORS[i % len(_COLORS)] for i, case in enumerate(CASES)}

TIME_PNG = "time_vs_B.png"
FLOOR_PNG = "pct_of_floor.png"


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


def _title(meta) -> str:
    if not meta:
        return ""
    return f"{meta.get('device', '?')}, {str(meta.get('date', '?'))[:10]}"


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
        _batch_axis(ax, rows)
        ax.set_yscale("log")
        ax.set_title(f"{kind} ids")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("time per call (us), median")
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes[1:]:  # a case may be missing from the first panel
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize="small")
    fig.suptitle(f"GPT-2 encoder: time vs batch size  ({_title(meta)})" if meta else "GPT-2 encoder: time vs batch size")
    return fig


def plot_percent_of_floor(rows, *, fig=None, meta=None):
    """Percent of the floor (floor / median; 100 = as fast as a copy of the minimal bytes) vs batch size."""
    rows = [r for r in rows if r["pct_of_floor"] is not None]
    kinds = _kinds(rows)
    fig, axes = _new_figure(fig, len(kinds))
    for ax, kind in zip(axes, kinds):
        for case in CASES:
            bs, pct = _series(rows, case.name, kind, "pct_of_floor")
            if bs:
                ax.plot(bs, pct, _FAMILY_STYLE[case.family], marker="o", ms=3, color=CASE_COLORS[case.name],
                        label=case.label)
        ax.axhline(100, color="black", lw=1)
        _batch_axis(ax, rows)
        ax.set_yscale("log")
        ax.set_title(f"{kind} ids")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("% of floor (higher is better)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize="small")
    fig.suptitle(f"Percent of the memory floor  ({_title(meta)})" if meta else "Percent of the memory floor")
    return fig


def save_plots(rows, out_dir, *, meta=None) -> list[Path]:
    """Write ``time_vs_B.png`` and ``pct_of_floor.png`` into ``out_dir``; returns their paths."""
    out_dir = Path(out_dir)
    rows = list(rows)
    paths = []
    for name, draw in ((TIME_PNG, plot_times), (FLOOR_PNG, plot_percent_of_floor)):
        path = out_dir / name
        draw(rows, meta=meta).savefig(path, dpi=110)
        paths.append(path)
    return paths
