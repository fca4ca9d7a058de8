"""The measured numbers of ``docs/performance.md``, written from a bench run (by default the committed one).

Every number that performance.md states about the current code lies between a pair of markers,
``<!-- perf:NAME:start -->`` and ``<!-- perf:NAME:end -->``; ``blocks`` renders each named block from result rows and
the run's meta, ``update_doc`` rewrites them in the file, and ``tests/test_docs_numbers.py`` checks that the
committed doc holds what the committed results give (and that its prose outside the blocks quotes no time), so the
doc cannot drift from the bench. After a new bench run::

    python -m gpt2enc_edu.bench.perfdoc            # rewrite docs/performance.md from docs/bench/
    python -m gpt2enc_edu.bench.perfdoc --check    # exit 1, naming the stale blocks, if it differs

Older measurements, which the bench does not repeat, live in ``docs/experiments.md`` with their date and card.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .cases import ID_KINDS, chunked_call_builds_table
from .floor import copy_rate_of
from .report import load_results
from .tables import replace_between_markers

#: The batch sizes a block shows (those of them the run measured).
DOC_BATCH_SIZES = (1, 8, 64)
KIND_LETTERS = {"uniform": "u", "zipf": "z", "real": "r"}

_REPO = Path(__file__).resolve().parents[2]
DOC = _REPO / "docs" / "performance.md"
RESULTS = _REPO / "docs" / "bench"


def markers(name: str) -> tuple[str, str]:
    """The start and end marker of block ``name``."""
    return f"<!-- perf:{name}:start -->", f"<!-- perf:{name}:end -->"


def format_us(us: float) -> str:
    """A median in µs as the doc writes it: one decimal below 1000 µs (``102.8``), whole µs above (``1702``)."""
    return f"{us:.1f}" if us < 1000 else f"{us:.0f}"


def _kinds(rows) -> list[str]:
    return [k for k in ID_KINDS if any(r["ids"] == k for r in rows)]


def _sizes(rows) -> list[int]:
    measured = {r["B"] for r in rows}
    return [B for B in DOC_BATCH_SIZES if B in measured]


def _index(rows) -> dict:
    return {(r["case"], r["ids"], r["B"]): r for r in rows}


def _pct(pct: float) -> str:
    """A share of the floor in whole percent; ``<1`` below half a percent (the host's rows), as the report writes."""
    return "<1" if pct < 0.5 else f"{pct:.0f}"


def _cell(by_key: dict, case: str, kinds, B: int, *, pct: bool) -> str:
    """``t_u / t_z / t_r`` in µs, then ``(p_u / p_z / p_r%)`` of the floor where asked and known; ``-`` where
    nothing was measured."""
    found = [by_key.get((case, k, B)) for k in kinds]
    if all(r is None for r in found):
        return "-"
    text = " / ".join("-" if r is None else format_us(r["median_us"]) for r in found)
    if pct and all(r is not None and r["pct_of_floor"] is not None for r in found):
        text += " (" + " / ".join(_pct(r["pct_of_floor"]) for r in found) + "%)"
    return text


def _difference(by_key: dict, minuend: str, subtrahend: str, kinds, B: int) -> str:
    pairs = [(by_key.get((minuend, k, B)), by_key.get((subtrahend, k, B))) for k in kinds]
    if any(a is None or b is None for a, b in pairs):
        return "-"
    return " / ".join(format_us(a["median_us"] - b["median_us"]) for a, b in pairs)


def _ratio(by_key: dict, numerator: str, denominator: str, kinds, B: int) -> str:
    pairs = [(by_key.get((numerator, k, B)), by_key.get((denominator, k, B))) for k in kinds]
    if any(a is None or b is None for a, b in pairs):
        return "-"
    return " / ".join(f"{a['median_us'] / b['median_us']:.1f}×" for a, b in pairs)


def _table(rows, lines: list[tuple[str, object]]) -> str:
    """A markdown table: one row per (label, what), one column per batch size. ``what`` is a case name (time and
    percent of the floor), ``("time", case)`` (time only) or a callable ``(by_key, kinds, B) -> str``."""
    kinds, sizes, by_key = _kinds(rows), _sizes(rows), _index(rows)
    letters = " / ".join(KIND_LETTERS.get(k, k) for k in kinds)
    pct = " (% of the floor)" if any(isinstance(what, str) for _, what in lines) else ""
    out = [f"| µs, {letters}{pct} | " + " | ".join(f"B={B}" for B in sizes) + " |",
           "|---|" + "---|" * len(sizes)]
    for label, what in lines:
        if callable(what):
            cells = [what(by_key, kinds, B) for B in sizes]
        elif isinstance(what, tuple):
            cells = [_cell(by_key, what[1], kinds, B, pct=False) for B in sizes]
        else:
            cells = [_cell(by_key, what, kinds, B, pct=True) for B in sizes]
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def _run_line(rows, meta: dict) -> str:
    shape = meta.get("shape", {})
    rate = copy_rate_of(rows, meta)
    kinds = _kinds(rows)
    names = {"uniform": "uniform", "zipf": "Zipf(1.1)", "real": "real GPT-2"}
    return (f"The committed bench: {meta.get('device', '?')}, {str(meta.get('date', '?'))[:10]}, "
            f"T={shape.get('T', '?')}, C={shape.get('C', '?')}, V={shape.get('V', '?')}, {shape.get('dtype', '?')}; "
            f"medians of {meta.get('repeats', '?')} calls, L2 flushed before each; the floor is the minimal bytes over "
            f"the copy rate measured in the same run ({'?' if rate is None else f'{rate / 1e9:.0f}'} GB/s). "
            + " / ".join(KIND_LETTERS.get(k, k) for k in kinds) + " = "
            + " / ".join(names.get(k, k) for k in kinds) + " ids. Every case and batch size: "
            "[bench/results.md](bench/results.md).")


def _table_cost(by_key: dict, kinds, B: int) -> str:
    """What the chunked call spends on its table: the call minus the call on a table built ahead; at a B where
    the chunked call is one launch (no table), it says so instead."""
    if not chunked_call_builds_table(B):
        return "no table (one launch)"
    return _difference(by_key, "chunked_gpu", "chunked_ahead", kinds, B)


#: Bytes per stored element of the bench's dtypes.
_ITEMSIZE = {"bf16": 2, "fp32": 4}


def _two_reads_bound(by_key: dict, kinds, B: int) -> str:
    """The most of the floor a backward that reads all of dout twice can reach, even at the copy rate: the floor
    over the floor plus one more read of dout (the chunked call's floor; dout is B*T*C elements)."""
    shares = []
    for k in kinds:
        r = by_key.get(("chunked_gpu", k, B))
        if r is None or r["floor_us"] is None or r["dtype"] not in _ITEMSIZE:
            return "-"
        dout_bytes = r["B"] * r["T"] * r["C"] * _ITEMSIZE[r["dtype"]]
        second_read_us = r["floor_us"] * dout_bytes / r["minimal_bytes"]  # at the rate the floor is counted at
        shares.append(100 * r["floor_us"] / (r["floor_us"] + second_read_us))
    return " / ".join(_pct(share) for share in shares) + "%"


def blocks(rows, meta: dict | None = None) -> dict[str, str]:
    """Every named block of performance.md, rendered from ``rows`` (``results.csv``) and ``meta`` (``meta.json``)."""
    rows = list(rows)
    meta = meta or {}
    if not rows:
        raise ValueError("no result rows to render")
    return {
        "run": _run_line(rows, meta),
        "forward": _table(rows, [
            ("forward call (`encoder_forward`)", "forward"),
            ("forward kernel alone", "forward_kernel"),
            ("PyTorch `F.embedding` + wpe", "torch_forward"),
        ]),
        "wpe": _table(rows, [
            ("wpe kernel alone (full grid)", "wpe_kernel"),
        ]),
        "wte": _table(rows, [
            ("bucketed wte kernel (llm.c's scheme), table ready", "wte_bucketed_kernel"),
            ("chunked wte kernels (chunk + combine), table ready", "wte_chunked_kernel"),
        ]),
        "table": _table(rows, [
            ("bucket table alone, with bucket rows (bucketed method's)", ("time", "gpu_buckets")),
            ("bucket table alone, without bucket rows (chunked method's)", ("time", "gpu_buckets_units")),
            ("the same table built by NumPy on the host (`make_buckets`)", ("time", "make_buckets")),
        ]),
        "backward": _table(rows, [
            ("chunked, table built in the call (the default)", "chunked_gpu"),
            ("bucketed, table built in the call", "bucketed_gpu"),
            ("chunked, table built ahead (`buckets=`)", "chunked_ahead"),
            ("bucketed, table built ahead", "bucketed_ahead"),
            ("the table's cost inside the chunked call (in the call − built ahead)", _table_cost),
            ("PyTorch's deterministic backward over the default",
             lambda by_key, kinds, B: _ratio(by_key, "torch_backward_det", "chunked_gpu", kinds, B)),
            ("the most of the floor a call that reads dout twice can reach", _two_reads_bound),
        ]),
        "atomic": _table(rows, [
            ("atomic, fp32 accumulation", "atomic_fp32"),
            ("atomic, bf16 atomics", "atomic_bf16"),
            ("bucketed, table built on the host", "bucketed_cpu"),
            ("PyTorch embedding backward + dwpe sum", "torch_backward"),
            ("the same, deterministic", "torch_backward_det"),
        ]),
    }


def update_text(text: str, rendered: dict[str, str]) -> str:
    """``text`` with each block of ``rendered`` between its markers; every marker must be there exactly once."""
    for name, block in rendered.items():
        start, end = markers(name)
        text = replace_between_markers(text, block, start=start, end=end)
    return text


def stale_blocks(text: str, rendered: dict[str, str]) -> list[str]:
    """Names of the blocks whose text in ``text`` differs from ``rendered`` (or whose markers are missing)."""
    stale = []
    for name, block in rendered.items():
        try:
            if replace_between_markers(text, block, start=markers(name)[0], end=markers(name)[1]) != text:
                stale.append(name)
        except ValueError:
            stale.append(name)
    return stale


def update_doc(path=DOC, results=RESULTS) -> Path:
    """Rewrite the blocks of ``path`` from the bench run in folder ``results``."""
    path = Path(path)
    rows, meta = load_results(results)
    path.write_text(update_text(path.read_text(), blocks(rows, meta)))
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpt2enc_edu.bench.perfdoc", description=__doc__.split("\n\n")[0])
    parser.add_argument("--doc", type=Path, default=DOC, help="the markdown file (default: docs/performance.md)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="a bench run's folder (default: docs/bench)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is stale")
    args = parser.parse_args(argv)
    rows, meta = load_results(args.results)
    rendered = blocks(rows, meta)
    if args.check:
        stale = stale_blocks(args.doc.read_text(), rendered)
        if stale:
            print(f"{args.doc}: stale blocks {', '.join(stale)}; run python -m gpt2enc_edu.bench.perfdoc",
                  file=sys.stderr)
            return 1
        print(f"{args.doc}: every block matches {args.results}")
        return 0
    args.doc.write_text(update_text(args.doc.read_text(), rendered))
    print(f"wrote {len(rendered)} blocks into {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
