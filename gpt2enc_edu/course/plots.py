"""Plotting helpers for the notebooks: each draws one picture and returns its Axes (or Figure).

matplotlib is imported inside the functions, so ``import gpt2enc_edu`` never needs it. Every function
takes an optional ``ax`` to draw into; without one it makes a small figure (``FIGSIZE``-ish, ``DPI``) so
notebooks stay light. The data drawn comes from the package (``compare``, ``schedule``, ``rounding``):
these functions only draw. The plots of rounding (notebooks 02 and 04) are in ``rounding_plots``, those of
measured times in ``timing_plots``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..layout import c_per_group, pack_size

#: Resolution of the figures made here: enough for a notebook, small in the stored .ipynb.
DPI = 80


def axes_or_new(ax, figsize):
    """``ax`` itself, or the Axes of a new figure of ``figsize`` inches."""
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=figsize, dpi=DPI, layout="constrained")
    return ax


def labelled(ax, xlabel: str, ylabel: str, title: str | None = None, *, legend: int | None = 8,
             title_size: int | None = None):
    """Name ``ax``'s axes, draw its legend (font size ``legend``; ``None``: none) and its title if any; returns
    ``ax``: the last lines every plot of the course shares."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if legend is not None:
        ax.legend(fontsize=legend)
    if title:
        ax.set_title(title, **({} if title_size is None else {"fontsize": title_size}))
    return ax


def thread_of_element(B: int, T: int, C: int, dtype) -> np.ndarray:
    """``(B*T, C)`` array: which thread of the elementwise kernels owns each element of a (B, T, C) tensor.

    Thread ``i`` owns the 128-bit pack that starts at flat element ``i * pack_size(dtype)``; rows are the
    ``(b, t)`` pairs in order ``b*T + t``.
    """
    return (np.arange(B * T * C, dtype=np.int64) // pack_size(dtype)).reshape(B * T, C)


def thread_map(B: int, T: int, C: int, dtype, *, ax=None):
    """Colour each element of a (B, T, C) tensor by the thread that owns it, and label each thread once."""
    import matplotlib.pyplot as plt

    threads = thread_of_element(B, T, C, dtype)
    size = pack_size(dtype)
    ax = axes_or_new(ax, (max(4.0, 0.42 * C), 0.5 * B * T + 1.0))
    cmap = plt.get_cmap("tab20", 20)
    ax.imshow(threads % 20, cmap=cmap, vmin=0, vmax=19, aspect="auto", interpolation="nearest")
    for row in range(B * T):
        for c in range(0, C, size):
            ax.text(c + (size - 1) / 2, row, f"thread {threads[row, c]}", ha="center", va="center", fontsize=8)
    ax.set_yticks(range(B * T), [f"b={bt // T}, t={bt % T}" for bt in range(B * T)])
    ax.set_xticks(range(C))
    ax.set_xlabel("channel c")
    ax.set_xticks(np.arange(-0.5, C, size), minor=True)
    ax.set_yticks(np.arange(-0.5, B * T, 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=2)
    ax.tick_params(which="minor", length=0)
    for c in range(1, C):  # faint lines between the elements of a pack
        if c % size:
            ax.axvline(c - 0.5, color="white", linewidth=0.5, alpha=0.6)
    ax.set_title(f"{np.dtype(dtype).name}, B={B}, T={T}, C={C}: one thread per {size}-element pack "
                 f"({B * T * C // size} threads)", fontsize=10)
    return ax


def bucket_rank_size(sizes: Mapping[str, np.ndarray], *, ax=None, title: str | None = None):
    """Log-log plot of bucket size against rank (1 = largest), one line per label."""
    if not sizes:
        raise ValueError("sizes must hold at least one array")
    ax = axes_or_new(ax, (5.5, 3.5))
    for label, values in sizes.items():
        values = np.sort(np.asarray(values).reshape(-1))[::-1]
        ax.loglog(np.arange(1, values.size + 1), values, marker=".", markersize=3, linewidth=1,
                  label=f"{label} ({values.size} tokens, largest {int(values[0]) if values.size else 0})")
    return labelled(ax, "rank of the token (1 = most frequent)", "bucket size (positions)", title)


def gantt(schedule, *, ax=None, title: str | None = None, vmax: float | None = None, colorbar: bool = True):
    """Gantt chart of a ``schedule.Schedule``: one row per block slot, one bar per block, coloured by its cost.

    A red line marks the makespan, a dashed line the lower bound no order can beat. A slot is one place
    where a block can run (an SM holds several), so the y axis says "block slot", not "SM".
    """
    import matplotlib.pyplot as plt
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    ax = axes_or_new(ax, (6.0, 0.35 * schedule.num_slots + 1.2))
    cmap = plt.get_cmap("viridis")
    vmax = float(schedule.costs.max(initial=1.0)) if vmax is None else vmax
    for s in range(schedule.num_slots):
        mine = np.flatnonzero(schedule.slot == s)
        if mine.size == 0:
            continue
        bars = [(float(schedule.start[i]), float(schedule.costs[i])) for i in mine]
        colors = [cmap(float(schedule.costs[i]) / vmax if vmax else 0.0) for i in mine]
        ax.broken_barh(bars, (s - 0.4, 0.8), facecolors=colors, edgecolors="white", linewidth=0.5)
    ax.axvline(schedule.makespan, color="red", linewidth=1.5, label=f"makespan {schedule.makespan:g}")
    ax.axvline(schedule.lower_bound, color="black", linestyle="--", linewidth=1,
               label=f"lower bound {schedule.lower_bound:g}")
    ax.set_yticks(range(schedule.num_slots))
    ax.set_ylim(schedule.num_slots - 0.5, -0.5)
    ax.set_ylabel("block slot")
    ax.set_xlabel("time (units of one item)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if colorbar:
        bar = ax.figure.colorbar(ScalarMappable(Normalize(0, vmax), cmap), ax=ax, pad=0.01, fraction=0.04)
        bar.set_label("block cost", fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def gantt_comparison(schedules: Mapping[str, object], *, title: str | None = None):
    """Stacked Gantt charts of the same blocks launched in several orders, sharing the time axis and one
    colorbar (the block's cost)."""
    import matplotlib.pyplot as plt
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    if not schedules:
        raise ValueError("schedules must hold at least one schedule")
    first = next(iter(schedules.values()))
    height = (0.3 * first.num_slots + 0.9) * len(schedules)
    fig, axes = plt.subplots(len(schedules), 1, figsize=(7.5, height), dpi=DPI, sharex=True,
                             layout="constrained", squeeze=False)
    vmax = max(float(s.costs.max(initial=1.0)) for s in schedules.values())
    for ax, (name, sched) in zip(axes[:, 0], schedules.items()):
        gantt(sched, ax=ax, vmax=vmax, colorbar=False,
              title=f"{name} order: makespan {sched.makespan:g} ({sched.makespan / sched.lower_bound:.2f} x bound)")
        if ax is not axes[-1, 0]:
            ax.set_xlabel("")
    bar = fig.colorbar(ScalarMappable(Normalize(0, vmax), plt.get_cmap("viridis")), ax=axes[:, 0].tolist(),
                       location="bottom", shrink=0.5, aspect=40)
    bar.set_label("block cost (colour of a bar)")
    if title:
        fig.suptitle(title)
    return fig


def chunk_units(table, *, chunk: int = 32, top: int = 12, ax=None, title: str | None = None):
    """The chunked wte kernel's work: the ``top`` largest tokens of a bucket table, each drawn as its row
    of 32-position chunks (one unit each, one warp per unit and channel group), against what the bucketed
    kernel gives the same token (one block of 8 warps per channel group). Bar length = positions; the bucketed
    kernel's time grows with the longest bar, the chunked kernel's with the longest chunk."""
    sizes = np.asarray(table.sizes)[np.asarray(table.c_groups) == 0][:top]
    tokens = np.asarray(table.token_ids)[np.asarray(table.c_groups) == 0][:top]
    groups = int(table.num_c_groups)
    ax = axes_or_new(ax, (7.0, 0.3 * len(sizes) + 1.4))
    import matplotlib.pyplot as plt

    colors = plt.get_cmap("tab10")
    for row, size in enumerate(sizes.tolist()):
        starts = list(range(0, size, chunk))
        ax.broken_barh([(s, min(chunk, size - s)) for s in starts], (row - 0.4, 0.8),
                       facecolors=[colors(i % 2) for i in range(len(starts))], edgecolors="white", linewidth=0.3)
        ax.text(size + 3, row, f"{len(starts)} unit{'s' if len(starts) > 1 else ''} = {len(starts) * groups} warps",
                va="center", fontsize=7)
    ax.set_yticks(range(len(sizes)), [f"token {t}" for t in tokens.tolist()], fontsize=7)
    ax.set_ylim(len(sizes) - 0.5, -0.5)
    ax.set_xlabel(f"positions of the token in the batch (alternating colours: one {chunk}-position chunk = one unit "
                  f"= {groups} warps, one per channel group)")
    ax.set_xlim(0, max(sizes.max(initial=1) * 1.25, chunk))
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def token_flow(table, token: int | None = None, *, chunk: int = 32, max_chunks: int = 16, ax=None,
               title: str | None = None):
    """How the chunked wte kernels sum one token: its positions (from ``bt_list``) cut into chunks of ``chunk``,
    one warp per (chunk, channel group), one partial sum per chunk, and the one combine that adds the partials
    in chunk order. ``token`` defaults to the table's most frequent one; at most ``max_chunks`` chunks are
    drawn (the title says when there are more)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    units = np.asarray(table.units)
    token = int(units[0, 0]) if token is None else int(token)
    mine = units[units[:, 0] == token]
    if not len(mine):
        raise ValueError(f"token {token} is not in the table")
    start, size = int(mine[0, 2]), int(mine[0, 3])
    positions = np.asarray(table.bt_list)[start : start + size]
    groups = int(table.num_c_groups)
    per_group = c_per_group(table.dtype)
    n_chunks = len(mine)
    shown = min(n_chunks, max_chunks)
    ax = axes_or_new(ax, (min(max(2.5 + 0.75 * shown, 6.0), 13.0), 1.2 + 0.55 * (groups + 3)))
    colors = plt.get_cmap("tab10")
    rows = {"positions": groups + 2, **{f"group {g}": groups + 1 - g for g in range(groups)}, "partials": 1,
            "combine": 0}

    def box(x, y, w, text, color, fontsize=6):
        ax.add_patch(Rectangle((x - w / 2, y - 0.32), w, 0.64, facecolor=color, edgecolor="0.3", linewidth=0.5))
        ax.text(x, y, text, ha="center", va="center", fontsize=fontsize)

    for k in range(shown):
        items = positions[k * chunk : (k + 1) * chunk]
        ax.plot([k, k], [rows["partials"], rows["positions"]], color="0.6", linewidth=0.6, zorder=0)
        ax.plot([k, shown / 2 - 0.5], [rows["partials"], rows["combine"]], color="0.6", linewidth=0.6, zorder=0)
        box(k, rows["positions"], 0.9, f"chunk {k}\n{len(items)} pos.\nbt {items[0]}..{items[-1]}",
            colors(k % 2), fontsize=5)
        for g in range(groups):
            box(k, rows[f"group {g}"], 0.8, "warp", plt.get_cmap("Pastel1")(g))
        box(k, rows["partials"], 0.8, f"$p_{{{k}}}$", "0.92", fontsize=7)
    more = f" + ... + $p_{{{n_chunks - 1}}}$" if n_chunks > 2 else ""
    box(shown / 2 - 0.5, rows["combine"], shown - 0.1,
        f"combine: dwte = round((($p_0$ + $p_1$){more}) + old dwte), once per channel" if n_chunks > 1
        else "a single chunk: its warps finish dwte themselves", "lightyellow", fontsize=7)
    labels = {"positions": "positions\n(bt_list)", "partials": "partial sums\n(fp32, C each)",
              "combine": "combine kernel"}
    for g in range(groups):
        labels[f"group {g}"] = f"group {g}: ch. {g * per_group}..{min((g + 1) * per_group, table.C) - 1}"
    ax.set_yticks(list(rows.values()), [labels[name] for name in rows], fontsize=7)
    ax.set_xticks([])
    ax.set_xlim(-0.6, shown - 0.4)
    ax.set_ylim(-0.6, groups + 2.6)
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_title(title or (f"token {token}: {size} positions -> {n_chunks} chunks (units) -> {n_chunks} x {groups} "
                           f"warps -> {n_chunks} partial sums -> one combine"
                           + (f" (first {shown} chunks drawn)" if shown < n_chunks else "")), fontsize=9)
    return ax


def loss_curves(curves: Mapping[str, np.ndarray], *, ax=None, title: str | None = None):
    """One line per run: the training loss against the step (``{label: losses}``)."""
    ax = axes_or_new(ax, (6.0, 3.2))
    styles = ("-", "--", ":", "-.")
    for i, (label, losses) in enumerate(curves.items()):
        losses = np.asarray(losses, dtype=np.float64)
        ax.plot(np.arange(len(losses)), losses, styles[i % len(styles)], linewidth=1.2, label=label)
    ax.grid(alpha=0.3)
    return labelled(ax, "step", "training loss", title, legend=7, title_size=9)


def loss_gaps(gaps: Mapping[str, np.ndarray], *, ax=None, title: str | None = None):
    """Per step, ``|loss of run 1 - loss of run 2|`` of pairs of runs (``{label: gaps}``), on a log axis. A zero
    (the same bits) has no place on a log axis: only the steps whose losses differ are drawn, and a pair that
    never parts is named in the legend with no points."""
    ax = axes_or_new(ax, (7.0, 3.4))
    for label, gap in gaps.items():
        gap = np.asarray(gap, dtype=np.float64)
        steps = np.flatnonzero(gap > 0)
        if steps.size:
            ax.plot(steps, gap[steps], marker="o", markersize=3, linewidth=1,
                    label=f"{label}: parts at step {steps[0]}")
        else:
            ax.plot([], [], " ", label=f"{label}: equal losses at every step")
    if any(np.any(np.asarray(g) > 0) for g in gaps.values()):
        ax.set_yscale("log")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_xlim(-0.5, max((len(g) for g in gaps.values()), default=1) - 0.5)
    ax.grid(alpha=0.3, which="both")
    return labelled(ax, "step", "|loss run 1 - loss run 2| (log)", title, legend=None, title_size=9)
