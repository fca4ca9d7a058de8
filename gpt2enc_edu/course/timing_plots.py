"""Plots of measured times for notebooks 01, 05 and 06: each takes the numbers (``course.measured`` dicts or
the benchmark's result rows) and only draws. Every figure says in its title where the numbers come from.
"""

from __future__ import annotations

import numpy as np

from .plots import DPI, axes_or_new

KIND_STYLE = {"uniform": ":", "zipf": "--", "real": "-"}


def forward_versions(data: dict | None, *, ax=None):
    """Bars: median time of each forward version per batch size, the memory floor as a dashed line."""
    ax = axes_or_new(ax, (6.0, 3.4))
    if not data:
        ax.text(0.5, 0.5, "no measurements: no GPU and no committed numbers", ha="center", transform=ax.transAxes)
        return ax
    rows = data["rows"]
    batches = sorted({r["B"] for r in rows})
    versions = sorted({r["version"] for r in rows})
    width = 0.8 / len(versions)
    for i, version in enumerate(versions):
        times = [next((r["median_us"] for r in rows if r["B"] == B and r["version"] == version), np.nan)
                 for B in batches]
        bars = ax.bar(np.arange(len(batches)) + (i - (len(versions) - 1) / 2) * width, times, width,
                      label=f"version {version}")
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    for j, B in enumerate(batches):
        floor = next(r["floor_us"] for r in rows if r["B"] == B)
        ax.hlines(floor, j - 0.45, j + 0.45, colors="black", linestyles="--", linewidth=1,
                  label="memory floor" if j == 0 else None)
    ax.set_xticks(range(len(batches)), [f"B={B}" for B in batches])
    ax.set_yscale("log")
    ax.set_ylabel("time per call (µs, log)")
    ax.set_title(f"forward versions, T={data['T']}, C={data['C']}, bf16, {data['ids']} ids ({data['device']})",
                 fontsize=9)
    ax.set_ylim(top=ax.get_ylim()[1] * 2)
    ax.legend(fontsize=8, loc="upper left", ncols=2)
    return ax


def bucketing_phases(data: dict | None):
    """One panel per (batch size, route): the GPU bucket table's cost per phase (for a one-kernel route the
    first bar, "launch", is a run that returns at once), and the whole (grey)."""
    import matplotlib.pyplot as plt

    runs = (data or {}).get("runs") or []
    fig, axes = plt.subplots(1, max(len(runs), 1), figsize=(5.2 * max(len(runs), 1), 3.4), dpi=DPI,
                             layout="constrained", squeeze=False)
    if not runs:
        axes[0, 0].text(0.5, 0.5, "no measurements: no GPU and no committed numbers", ha="center")
        return fig
    for ax, run in zip(axes[0], runs):
        labels = [*run["phases_us"], "whole"]
        values = [max(v, 0.0) for v in run["phases_us"].values()] + [run["total_us"]]
        bars = ax.barh(range(len(labels)), values, color=["tab:blue"] * (len(labels) - 1) + ["tab:gray"])
        ax.bar_label(bars, fmt="%.1f", fontsize=7, padding=2)
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.set_ylim(len(labels) - 0.5, -0.5)
        ax.set_xlim(0, max(values) * 1.3)
        ax.set_xlabel("µs per call")
        ax.set_title(f"B={run['B']}, {run.get('route', '')} route: {run['kernel']}", fontsize=9)
    fig.suptitle(f"GPU bucketing, T={data['T']}, real ids ({data['device']}, {data['date']})", fontsize=10)
    return fig


def _series(rows, case: str, kind: str):
    picked = sorted((r for r in rows if r["case"] == case and r["ids"] == kind), key=lambda r: int(r["B"]))
    return [int(r["B"]) for r in picked], [float(r["median_us"]) for r in picked]


def _batch_axis(ax, rows) -> None:
    """Log-log axes with the measured batch sizes as plain-number ticks."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    batches = sorted({int(r["B"]) for r in rows})
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.minorticks_off()
    ax.set_xlabel("batch size B")


def spread_by_kind(rows, case: str) -> dict[int, dict[str, float]]:
    """``{B: {kind: median_us}}`` of one case: how much the kind of ids changes its time at each B."""
    out: dict[int, dict[str, float]] = {}
    for r in rows:
        if r["case"] == case:
            out.setdefault(int(r["B"]), {})[r["ids"]] = float(r["median_us"])
    return dict(sorted(out.items()))


def skew_vs_time(rows, cases: dict[str, str], *, kinds=("uniform", "zipf", "real"), title: str | None = None):
    """One panel per case (``{case name: label}``), time against B, one line per id kind (few lines each)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(cases), figsize=(4.2 * len(cases), 3.4), dpi=DPI, sharey=True,
                             layout="constrained", squeeze=False)
    for ax, (case, label) in zip(axes[0], cases.items()):
        for kind in kinds:
            B, us = _series(rows, case, kind)
            if B:
                ax.plot(B, us, KIND_STYLE.get(kind, "-"), marker="o", markersize=3, label=f"{kind} ids")
        _batch_axis(ax, rows)
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3, which="both")
    axes[0, 0].set_ylabel("time per call (µs)")
    axes[0, -1].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def sweep(rows, groups: dict[str, dict[str, str]], *, floor_op: dict[str, str] | None = None,
          kinds=("uniform", "zipf", "real"), host_cases=("make_buckets",), title: str | None = None):
    """The full sweep: one row of panels per id kind, one panel per group (``{panel title: {case: label}}``,
    a few cases each), time against B. The memory floor of the panel's operation (``floor_op``) is a black
    dashed line; host-side timings (``host_cases``) are grey and dotted, so neither reads as a kernel."""
    import matplotlib.pyplot as plt

    kinds = [k for k in kinds if any(r["ids"] == k for r in rows)]
    fig, axes = plt.subplots(len(kinds), len(groups), figsize=(3.7 * len(groups), 2.6 * len(kinds)), dpi=DPI,
                             sharex=True, sharey=True, layout="constrained", squeeze=False)
    for i, kind in enumerate(kinds):
        for ax, (panel, cases) in zip(axes[i], groups.items()):
            for case, label in cases.items():
                B, us = _series(rows, case, kind)
                if not B:
                    continue
                if case in host_cases:
                    ax.plot(B, us, ":", color="0.45", marker="s", markersize=3, label=label)
                else:
                    ax.plot(B, us, marker="o", markersize=3, label=label)
            op = (floor_op or {}).get(panel)
            floor = {int(r["B"]): float(r["floor_us"]) for r in rows
                     if op and r["op"] == op and r["ids"] == kind and r["floor_us"] not in ("", None)}
            if floor:
                ax.plot(sorted(floor), [floor[b] for b in sorted(floor)], "k--", linewidth=1.4, label="memory floor")
            _batch_axis(ax, rows)
            ax.grid(alpha=0.3, which="both")
            ax.set_title(f"{panel} · {kind} ids", fontsize=9)
            if i < len(kinds) - 1:
                ax.set_xlabel("")
            if i == 0:
                ax.legend(fontsize=7, loc="upper left")
        axes[i, 0].set_ylabel("time per call (µs)")
    if title:
        fig.suptitle(title, fontsize=10)
    return fig
