"""A run's files: result rows, ``results.csv``, ``meta.json``, and writing or reading a whole results folder.

A row (``COLUMNS``) is one (case, ids, B) measurement with its floor; ``meta.json`` holds what the run was
(device, date, command, versions, the copy rate it measured, failures). ``write_results`` writes both, the
markdown report (``tables.markdown_report``) and the plots (``plots.save_plots``); ``load_results`` reads a
folder back, also one written before the newer columns existed.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from . import plots, tables
from .cases import Case
from .floor import achieved_bytes_per_s, floor_seconds, minimal_bytes, percent_of_floor
from .timer import Summary

#: Files a run writes into its output folder (besides the plots).
RESULTS_CSV = "results.csv"
RESULTS_MD = "results.md"
META_JSON = "meta.json"

COLUMNS = ("case", "label", "family", "op", "ids", "B", "T", "C", "V", "dtype", "distinct_ids",
           "median_us", "p10_us", "p90_us", "repeats", "timer", "host_gap_frac",
           "minimal_bytes", "floor_us", "pct_of_floor", "achieved_GBps")
#: Columns a results file may lack (added later); they are recomputed from the others when read.
OPTIONAL_COLUMNS = ("achieved_GBps",)
_INT_COLUMNS = {"B", "T", "C", "V", "distinct_ids", "repeats", "minimal_bytes"}
_FLOAT_COLUMNS = {"median_us", "p10_us", "p90_us", "host_gap_frac", "floor_us", "pct_of_floor", "achieved_GBps"}


@dataclass
class Results:
    """The outcome of a run: rows (``COLUMNS``), meta (for ``meta.json``), failures (also in meta)."""

    rows: list[dict]
    meta: dict
    failures: list[dict]


def _achieved_GBps(row: dict) -> float | None:
    if row["minimal_bytes"] is None or not row["median_us"]:
        return None
    return achieved_bytes_per_s(row["median_us"] * 1e-6, row["minimal_bytes"]) / 1e9


def make_row(case: Case, *, ids: str, B: int, T: int, C: int, V: int, dtype_name: str, distinct: int,
             seconds: Summary, timer: str, host_gap_frac: float | None, copy_rate: float | None,
             itemsize: int = 2) -> dict:
    """One result row (``COLUMNS``). The floor columns are filled for cases with an ``op``, else None."""
    us = seconds.scaled(1e6)
    row = dict(case=case.name, label=case.label, family=case.family, op=case.op, ids=ids, B=B, T=T, C=C, V=V,
               dtype=dtype_name, distinct_ids=distinct, median_us=us.median, p10_us=us.p10, p90_us=us.p90,
               repeats=us.n, timer=timer, host_gap_frac=host_gap_frac,
               minimal_bytes=None, floor_us=None, pct_of_floor=None, achieved_GBps=None)
    if case.op is not None and copy_rate is not None:
        nbytes = minimal_bytes(case.op, B=B, T=T, C=C, distinct=distinct, itemsize=itemsize)
        row.update(minimal_bytes=nbytes, floor_us=floor_seconds(nbytes, copy_rate) * 1e6,
                   pct_of_floor=percent_of_floor(seconds.median, nbytes, copy_rate))
        row["achieved_GBps"] = _achieved_GBps(row)
    return row


def write_csv(rows, path) -> Path:
    """Write rows (dicts with the ``COLUMNS`` keys) as CSV; None becomes an empty field."""
    path = Path(path)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="raise")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row[k] is None else row[k]) for k in COLUMNS})
    return path


def _parse(key: str, value: str):
    if value == "":
        return None
    if key in _INT_COLUMNS:
        return int(value)
    if key in _FLOAT_COLUMNS:
        return float(value)
    return value


def read_csv(path) -> list[dict]:
    """Read a ``results.csv`` back into rows with numbers as numbers and empty fields as None."""
    rows = []
    with Path(path).open(newline="") as f:
        reader = csv.DictReader(f)
        missing = set(COLUMNS) - set(OPTIONAL_COLUMNS) - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: not a benchmark results file (missing columns {sorted(missing)})")
        for raw in reader:
            row = {key: _parse(key, raw.get(key) or "") for key in COLUMNS}
            if "achieved_GBps" not in raw:
                row["achieved_GBps"] = _achieved_GBps(row)
            rows.append(row)
    return rows


def write_meta(meta: dict, path) -> Path:
    """Write ``meta.json`` (indented, one trailing newline)."""
    path = Path(path)
    path.write_text(json.dumps(meta, indent=2) + "\n")
    return path


def load_results(folder) -> tuple[list[dict], dict]:
    """(rows, meta) of a finished run in ``folder``; ``FileNotFoundError`` saying what is missing."""
    folder = Path(folder)
    csv_path, meta_path = folder / RESULTS_CSV, folder / META_JSON
    missing = [p.name for p in (csv_path, meta_path) if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"no benchmark results in {folder} (missing {', '.join(missing)}); "
                                "run `python -m gpt2enc_edu.bench` on a GPU machine to make them")
    return read_csv(csv_path), json.loads(meta_path.read_text())


def write_results(results: Results, out_dir) -> list[Path]:
    """Write ``results.csv``, ``results.md``, ``meta.json`` and the PNG plots into ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [write_csv(results.rows, out_dir / RESULTS_CSV)]
    md = out_dir / RESULTS_MD
    md.write_text(tables.markdown_report(results.rows, results.meta))
    paths += [md, write_meta(results.meta, out_dir / META_JSON)]
    paths += plots.save_plots(results.rows, out_dir, meta=results.meta)
    return paths
