"""Markdown from result rows: the report (``results.md``), the per-kernel breakdown, and the README's table.

``markdown_report`` gives, per id kind, every whole call against B (median, percent of the floor), then where
the time of the deterministic backward goes (``breakdown_markdown``: each kernel alone and the bucket table's
share), then every row. ``readme_block`` is the README's small headline table at one batch size (``README_ROWS``
and the speed-up over PyTorch), and ``update_readme`` puts it between the ``<!-- bench-table:start -->`` and
``<!-- bench-table:end -->`` markers, so the README's numbers come from one run, with that run's copy rate.
"""

from __future__ import annotations

from pathlib import Path

from .cases import CASES, ID_KINDS, T_GPT2, chunked_call_builds_table, piece_value
from .floor import OPS, copy_rate_of
from .timer import STEP_TIMING_IN_TURN

README_START = "<!-- bench-table:start -->"
README_END = "<!-- bench-table:end -->"
KIND_TITLES = {"uniform": "uniform ids", "zipf": "Zipf ids", "real": "real ids"}
#: The README's headline rows, in order, each with its wording there (the full table is the report's).
README_ROWS = {"forward": "forward",
               "chunked_gpu": "backward, deterministic (`method=\"chunked\"`, the default)",
               "chunked_ahead": "the same, bucket table built ahead (`buckets=`)",
               "torch_backward_det": "PyTorch, deterministic (embedding backward + dwpe sum)"}
#: The README's training-step rows (the bench's ``step`` family), in order, each with its wording there: one id kind
#: (``README_STEP_KIND``) at the batch sizes of ``README_STEP_SIZES`` the run measured.
README_STEP_ROWS = {"adapter_step": "`GPT2Embedding`, eager",
                    "adapter_step_graph": "`GPT2Embedding`, a CUDA-graph replay of the step",
                    "torch_step": "`nn.Embedding` + wpe",
                    "torch_step_det": "`nn.Embedding` + wpe, deterministic algorithms"}
README_STEP_KIND = "real"
README_STEP_SIZES = (1, 8, 64)


def format_time_us(us: float) -> str:
    """``12.3 us``, ``456 us``, ``4.56 ms``: three significant figures."""
    if us < 1000:
        return f"{us:.3g} us" if us < 100 else f"{us:.0f} us"
    return f"{us / 1000:.3g} ms"


def _cell(row: dict | None) -> str:
    if row is None:
        return "-"
    text = format_time_us(row["median_us"])
    pct = row["pct_of_floor"]
    if pct is not None:
        text += " (<1%)" if pct < 0.5 else f" ({pct:.0f}%)"
    return text


def _index(rows) -> dict:
    return {(r["case"], r["ids"], r["B"]): r for r in rows}


def _kinds(rows) -> list[str]:
    return [k for k in ID_KINDS if any(r["ids"] == k for r in rows)]


def _floor(rows, kind: str, B: int, op: str) -> float | None:
    return next((r["floor_us"] for r in rows if r["ids"] == kind and r["B"] == B and r["op"] == op
                 and r["floor_us"] is not None), None)


def _share(part: dict | None, whole: dict | None) -> str:
    if part is None or whole is None:
        return "-"
    return f"{100 * part['median_us'] / whole['median_us']:.0f}%"


def _header(meta: dict) -> list[str]:
    lines = [f"# Encoder benchmark on {meta.get('device') or 'unknown device'}", ""]
    if meta:
        shape = meta.get("shape", {})
        lines.append(f"- date: {meta.get('date', '?')}; command: `{meta.get('command', '?')}`")
        lines.append(f"- T={shape.get('T', '?')}, C={shape.get('C', '?')}, V={shape.get('V', '?')}, "
                     f"{shape.get('dtype', '?')}; GPU times are medians of {meta.get('repeats', '?')} repeats "
                     f"(CUDA events, L2 flushed before each), host times medians of "
                     f"{meta.get('host_repeats', '?')} (perf_counter)")
        if meta.get("copy_rate_GBps") is not None:
            lines.append(f"- device-to-device copy rate, measured in this run: {meta['copy_rate_GBps']:.0f} GB/s "
                         "(read + write); floor = minimal bytes / copy rate; the percentage in brackets = floor / "
                         "median")
        if meta.get("torch"):
            lines.append(f"- PyTorch: {meta['torch']}")
    lines.append("")
    return lines


def breakdown_markdown(rows, kind: str, T: int = T_GPT2) -> list[str]:
    """Where the deterministic backward's time goes, for one id kind: a row per B, a column per piece.

    The pieces are timed one at a time (each with a cold L2), so their sum need not equal the whole call:
    less when the bucketing overlaps the wpe kernel, more when launches or Python leave gaps. Where the chunked call
    builds no table (at most 1024 ids: one kernel, ``chunked_call_builds_table``), its table share reads so.
    """
    rows = [r for r in rows if r["ids"] == kind]
    by_key = _index(rows)
    batch_sizes = sorted({r["B"] for r in rows})

    def get(name, B):
        return by_key.get((name, kind, B))

    if not any(get("gpu_buckets", B) for B in batch_sizes):
        return []
    columns = {"forward_kernel": "forward kernel", "wpe_kernel": "wpe kernel", "gpu_buckets": "bucket table",
               "gpu_buckets_units": "table, no bucket rows",
               "wte_bucketed_kernel": "wte kernel, bucketed", "wte_chunked_kernel": "wte kernel, chunked"}
    present = [c for c in columns if any(get(c, B) for B in batch_sizes)]
    lines = [f"### Where the time goes, {KIND_TITLES.get(kind, kind)}", "",
             "Each kernel alone (the wte kernels with the table ready), the whole deterministic backward, and the "
             "share of it of the method's own bucket table (the chunked method's has no bucket rows). For at most 1024 "
             "ids the chunked call is one kernel that sorts the ids itself and builds no table: its pieces here are "
             "then those of the table path (which a call with a table built ahead takes).", "",
             "| B | " + " | ".join(columns[c] for c in present)
             + " | wpe + table + chunked wte | chunked backward | table share | bucketed backward | table share |",
             "|---|" + "---|" * (len(present) + 5)]
    for B in batch_sizes:
        cells = [_cell(get(c, B)) for c in present]
        chunked_table = piece_value(by_key, "gpu_buckets_units", kind, B)  # the chunked method's own table
        pieces = [get("wpe_kernel", B), chunked_table, get("wte_chunked_kernel", B)]
        total = "-" if None in pieces else format_time_us(sum(p["median_us"] for p in pieces))
        chunked, bucketed, table = get("chunked_gpu", B), get("bucketed_gpu", B), get("gpu_buckets", B)
        chunked_share = _share(chunked_table, chunked) if chunked_call_builds_table(B, T) else "none (one launch)"
        cells += [total, _cell(chunked), chunked_share, _cell(bucketed), _share(table, bucketed)]
        lines.append(f"| {B} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def markdown_report(rows, meta: dict | None = None) -> str:
    """A markdown summary: per id kind, whole calls x B (median, % of floor) and the breakdown; every row."""
    rows = list(rows)
    meta = meta or {}
    lines = _header(meta)
    batch_sizes = sorted({r["B"] for r in rows})
    whole = [c for c in CASES if c.family != "piece" and any(r["case"] == c.name for r in rows)]
    by_key = _index(rows)
    for kind in _kinds(rows):
        lines += [f"## {kind} ids", "", "| kernel | " + " | ".join(f"B={b}" for b in batch_sizes) + " |",
                  "|---|" + "---|" * len(batch_sizes)]
        for case in whole:
            cells = [_cell(by_key.get((case.name, kind, b))) for b in batch_sizes]
            lines.append(f"| {case.label} | " + " | ".join(cells) + " |")
        for op in OPS:
            floors = [_floor(rows, kind, b, op) for b in batch_sizes]
            if any(f is not None for f in floors):
                lines.append(f"| floor, {op} | " + " | ".join("-" if f is None else format_time_us(f)
                                                              for f in floors) + " |")
        lines.append("")
        lines += breakdown_markdown(rows, kind, meta.get("shape", {}).get("T", T_GPT2))
    lines += ["## Every row", "", "<details><summary>median, p10, p90, % of floor, GB/s, host-gap share</summary>",
              "", "| kernel | ids | B | distinct ids | median | p10 | p90 | % of floor | GB/s | host gap |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        pct = "-" if r["pct_of_floor"] is None else f"{r['pct_of_floor']:.1f}%"
        gbps = "-" if r.get("achieved_GBps") is None else f"{r['achieved_GBps']:.0f}"
        gap = "-" if r["host_gap_frac"] is None else f"{r['host_gap_frac']:.2f}"
        lines.append(f"| {r['label']} | {r['ids']} | {r['B']} | {r['distinct_ids']} | "
                     f"{format_time_us(r['median_us'])} | {format_time_us(r['p10_us'])} | "
                     f"{format_time_us(r['p90_us'])} | {pct} | {gbps} | {gap} |")
    lines += ["", "</details>", ""]
    failures = meta.get("failures") or []
    if failures:
        lines += ["## Failures", ""]
        lines += [f"- {f['case']} ({f['ids']}, B={f['B']}): {f['error']}" for f in failures]
        lines.append("")
    return "\n".join(lines)


def readme_block(rows, meta: dict | None = None, *, B: int | None = None, results_link: str = "docs/bench/results.md",
                 method_link: str = "docs/benchmarks.md") -> str:
    """The README's headline table at batch size ``B`` (default: the largest measured): ``README_ROWS`` per id kind
    and the default backward's speed-up over PyTorch's deterministic one, under one line saying what was measured."""
    rows = list(rows)
    meta = meta or {}
    sizes = sorted({r["B"] for r in rows})
    if not sizes:
        raise ValueError("no rows to tabulate")
    B = sizes[-1] if B is None else B
    if B not in sizes:
        raise ValueError(f"B={B} was not measured (measured: {sizes})")
    kinds = _kinds(rows)
    by_key = _index(rows)
    rate = copy_rate_of(rows, meta)
    shape = meta.get("shape", {})
    lines = [f"{meta.get('device', '?')} ({str(meta.get('date', '?'))[:10]}), B={B}, T={shape.get('T', '?')}, "
             f"C={shape.get('C', '?')}, V={shape.get('V', '?')}, {shape.get('dtype', '?')}: medians of "
             f"{meta.get('repeats', '?')} repeats with L2 flushed before each; the percentage in brackets = the "
             "memory floor over the time (floor = minimal bytes / the device-to-device copy rate measured in the "
             "same run, "
             f"{'?' if rate is None else f'{rate / 1e9:.0f}'} GB/s). Every case and batch size: "
             f"[{results_link}]({results_link}); method: [{method_link}]({method_link}).", "",
             f"| B={B} | " + " | ".join(KIND_TITLES.get(k, k) for k in kinds) + " |",
             "|---|" + "---|" * len(kinds)]
    for name, label in README_ROWS.items():
        cells = [_cell(by_key.get((name, k, B))) for k in kinds]
        if any(c != "-" for c in cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    ratios = []
    for k in kinds:
        ours, theirs = by_key.get(("chunked_gpu", k, B)), by_key.get(("torch_backward_det", k, B))
        ratios.append("-" if ours is None or theirs is None else f"{theirs['median_us'] / ours['median_us']:.1f}x")
    if any(r != "-" for r in ratios):
        lines.append("| speed-up of the default backward over PyTorch's deterministic one | " + " | ".join(ratios)
                     + " |")
    return "\n".join(lines + _step_lines(by_key, sizes, in_turn=meta.get("step_timing") == STEP_TIMING_IN_TURN,
                                          torch=meta.get("torch")))


def _step_lines(by_key: dict, sizes: list[int], *, in_turn: bool, torch: str | None = None) -> list[str]:
    """The README's second table: a training step through PyTorch (``README_STEP_ROWS``), where the run timed one;
    ``torch`` (the run's ``meta.json`` entry) names the PyTorch it ran."""
    sizes = [b for b in README_STEP_SIZES if b in sizes]
    rows = {label: [by_key.get((name, README_STEP_KIND, b)) for b in sizes] for name, label in README_STEP_ROWS.items()}
    if not any(r is not None for cells in rows.values() for r in cells):
        return []
    lines = ["", f"A training step through PyTorch, forward + backward into fresh gradients, {README_STEP_KIND} ids, "
             f"in the same run as the table above (its card and shape{f'; {torch}' if torch else ''}): "
             "host time around synchronised calls (what a training loop waits for), "
             + ("the steps of each B timed in turn, " if in_turn else "") + "medians:", "",
             "| step | " + " | ".join(f"B={b}" for b in sizes) + " |", "|---|" + "---|" * len(sizes)]
    for label, cells in rows.items():
        lines.append(f"| {label} | " + " | ".join(_cell(r) for r in cells) + " |")
    return lines


def replace_between_markers(text: str, block: str, *, start: str = README_START, end: str = README_END) -> str:
    """``text`` with what lies between its one ``start`` and one ``end`` marker replaced by ``block``.

    The block gets a blank line on each side, so the markdown around the markers (a table) stays separate.
    """
    if text.count(start) != 1 or text.count(end) != 1:
        raise ValueError(f"expected exactly one {start!r} and one {end!r} marker, found {text.count(start)} "
                         f"and {text.count(end)}")
    head, rest = text.split(start)
    if end not in rest:
        raise ValueError(f"{end!r} comes before {start!r}")
    _, tail = rest.split(end)
    return f"{head}{start}\n\n{block.strip()}\n\n{end}{tail}"


def update_readme(path, rows, meta: dict | None = None, *, results_md=None, B: int | None = None) -> Path:
    """Rewrite the table between the README's markers from ``rows``; ``results_md`` is linked relative to it."""
    path = Path(path)
    links = {}
    if results_md is not None:
        target = Path(results_md).resolve()
        try:
            links["results_link"] = target.relative_to(path.resolve().parent).as_posix()
        except ValueError:
            links["results_link"] = target.as_posix()
    path.write_text(replace_between_markers(path.read_text(), readme_block(rows, meta, B=B, **links)))
    return path
