"""The bench room on the CPU (arithmetic, summaries, files, tables, README markers, plots, CLI) and GPU smoke runs.

No test asserts anything about how fast an encoder kernel is; the GPU timer test checks the timer against a
kernel that spins for a known time.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpt2enc_edu import bench
from gpt2enc_edu.backend import gpu_status
from gpt2enc_edu.bench import cases, cli, floor, plots, report, run, tables, timer
from gpt2enc_edu.tokens import make_ids

ROOT = Path(__file__).resolve().parents[1]
H200_COPY_RATE = 4273e9  # bytes/s, from the reference README (llm.c's numbers on the project's H200)
BENCH_DIR = ROOT / "gpt2enc_edu" / "bench"


# ------------------------------------------------------------------------------------------ the package's shape
def _bench_imports(path: Path) -> set[str]:
    """The bench modules a module imports (``from .x import`` / ``from . import x``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module} if node.module else {a.name for a in node.names}
    return found


def test_modules_small_and_without_circles():
    modules = {p.stem: p for p in BENCH_DIR.glob("*.py") if p.stem not in ("__init__", "__main__")}
    assert {"floor", "cases", "timer", "report", "tables", "plots", "run", "cli"} <= set(modules)
    for path in modules.values():
        assert len(path.read_text().splitlines()) < 400, path
    graph = {name: _bench_imports(path) & set(modules) for name, path in modules.items()}

    def reaches(start, target, seen=()):
        return any(n == target or (n not in seen and reaches(n, target, (*seen, n))) for n in graph[start])

    for name in graph:
        assert not reaches(name, name), f"import circle through bench.{name}"
    assert not reaches("plots", "report") and not reaches("floor", "cases")  # arrows point down


def test_spin_kernel_is_a_kernel_file():
    from gpt2enc_edu.loader import kernel_source

    source = kernel_source(timer.SPIN_KERNEL[0])
    assert f"void {timer.SPIN_KERNEL[1]}(" in source and "globaltimer" in source
    assert "__global__" not in (BENCH_DIR / "timer.py").read_text()  # no CUDA kept in Python strings


# ------------------------------------------------------------------------------------------ minimal bytes
def test_minimal_bytes_by_hand():
    ids = np.array([[1, 1, 2], [3, 1, 2]], dtype=np.int32)  # B=2, T=3: ids {1, 2, 3}
    assert floor.distinct_ids(ids) == 3
    # forward: out 2*3*8*2 = 96, wte rows 3*8*2 = 48, wpe 3*8*2 = 48, ids 6*4 = 24
    assert floor.minimal_bytes("forward", B=2, T=3, C=8, distinct=3) == 96 + 48 + 48 + 24
    # backward: dout 96, dwte rows read + written 2*48, dwpe read + written 2*48, ids 24
    assert floor.minimal_bytes("backward", B=2, T=3, C=8, distinct=3) == 96 + 96 + 96 + 24
    # the pieces: the wpe kernel reads dout and updates dwpe; the wte kernel reads dout and ids, updates dwte rows
    assert floor.minimal_bytes("backward_wpe", B=2, T=3, C=8, distinct=3) == 96 + 96
    assert floor.minimal_bytes("backward_wte", B=2, T=3, C=8, distinct=3) == 96 + 96 + 24
    # fp32 storage doubles every float term, not the ids
    assert floor.minimal_bytes("forward", B=2, T=3, C=8, distinct=3, itemsize=4) == 2 * (96 + 48 + 48) + 24


def test_pieces_read_dout_once_more_than_the_whole():
    kw = dict(B=4, T=16, C=64, distinct=37)
    pieces = floor.minimal_bytes("backward_wpe", **kw) + floor.minimal_bytes("backward_wte", **kw)
    assert pieces - floor.minimal_bytes("backward", **kw) == 4 * 16 * 64 * 2


def test_minimal_bytes_one_token():
    # B=1, T=1, C=1: one id, one row of each table
    assert floor.minimal_bytes("forward", B=1, T=1, C=1, distinct=1) == 2 + 2 + 2 + 4
    assert floor.minimal_bytes("backward", B=1, T=1, C=1, distinct=1) == 2 + 4 + 4 + 4


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(op="sideways", B=1, T=1, C=1, distinct=1), ValueError, "op must be"),
    (dict(op="forward", B=0, T=1, C=1, distinct=1), ValueError, "B must be >= 1"),
    (dict(op="forward", B=1, T=1, C=1, distinct=2), ValueError, "cannot exceed"),
    (dict(op="forward", B=1, T=1, C=1, distinct=0), ValueError, "distinct must be >= 1"),
    (dict(op="forward", B=1, T=1, C=1.5, distinct=1), TypeError, "C must be an integer"),
    (dict(op="forward", B=True, T=1, C=1, distinct=1), TypeError, "B must be an integer"),
])
def test_minimal_bytes_rejects(kwargs, error, message):
    op = kwargs.pop("op")
    with pytest.raises(error, match=message):
        floor.minimal_bytes(op, **kwargs)


def test_floor_reproduces_reference_at_b64_uniform():
    """The reference README's floors (37 us forward, 51 us backward at B=64, uniform ids, 4273 GB/s)."""
    ids = make_ids("uniform", 64, 1024, seed=0)
    distinct = floor.distinct_ids(ids)
    assert 35_000 < distinct < 38_000  # about V * (1 - exp(-B*T/V)) = 36.6k for uniform draws
    fwd = floor.floor_seconds(floor.minimal_bytes("forward", B=64, T=1024, C=768, distinct=distinct), H200_COPY_RATE)
    bwd = floor.floor_seconds(floor.minimal_bytes("backward", B=64, T=1024, C=768, distinct=distinct), H200_COPY_RATE)
    assert round(fwd * 1e6) == 37
    assert round(bwd * 1e6) == 51


# ------------------------------------------------------------------------------------------ floor, percent, GB/s
def test_floor_percent_and_bandwidth():
    assert floor.floor_seconds(2_000, 1_000.0) == 2.0
    assert floor.percent_of_floor(4.0, 2_000, 1_000.0) == 50.0
    assert floor.percent_of_floor(2.0, 2_000, 1_000.0) == 100.0
    assert floor.percent_of_floor(1.0, 2_000, 1_000.0) == 200.0  # faster than a copy (e.g. cache hits)
    assert floor.achieved_bytes_per_s(4.0, 2_000) == 500.0
    # the roofline's ratio is the percent of the floor
    assert 100 * floor.achieved_bytes_per_s(4.0, 2_000) / 1_000.0 == floor.percent_of_floor(4.0, 2_000, 1_000.0)


@pytest.mark.parametrize("call", [
    lambda: floor.floor_seconds(10, 0.0),
    lambda: floor.floor_seconds(10, float("inf")),
    lambda: floor.floor_seconds(-1, 1.0),
    lambda: floor.percent_of_floor(0.0, 10, 1.0),
    lambda: floor.percent_of_floor(float("nan"), 10, 1.0),
    lambda: floor.achieved_bytes_per_s(0.0, 10),
    lambda: floor.achieved_bytes_per_s(1.0, -1),
])
def test_floor_rejects(call):
    with pytest.raises(ValueError):
        call()


def test_copy_rate_of_meta_or_rows():
    assert floor.copy_rate_of([], {"copy_rate_GBps": 4000.0}) == 4000e9
    assert floor.copy_rate_of([dict(minimal_bytes=8_000, floor_us=2.0)]) == pytest.approx(4e9)
    assert floor.copy_rate_of([dict(minimal_bytes=None, floor_us=None)]) is None


# ------------------------------------------------------------------------------------------ summaries
def test_summarize_percentiles():
    s = timer.summarize([11, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10])  # order does not matter
    assert (s.median, s.p10, s.p90, s.n) == (6.0, 2.0, 10.0, 11)
    assert timer.summarize([3.5]) == timer.Summary(3.5, 3.5, 3.5, 1)
    assert timer.summarize([1.0, 2.0]).median == 1.5
    us = timer.summarize([2e-6, 4e-6, 6e-6]).scaled(1e6)
    assert (us.median, us.p10, us.p90, us.n) == (pytest.approx(4.0), pytest.approx(2.4), pytest.approx(5.6), 3)


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [float("inf")]])
def test_summarize_rejects(bad):
    with pytest.raises(ValueError):
        timer.summarize(bad)


class _Clock:
    """A stand-in for ``time.perf_counter`` that moves only when a timed call says how long it took."""

    def __init__(self):
        self.now, self.calls, self.syncs = 0.0, [], 0

    def call(self, name: str, seconds: float):
        def fn():
            self.calls.append(name)
            self.now += seconds
        return fn

    def sync(self):
        self.syncs += 1


def test_calls_timed_in_turn_each_get_their_own_time_in_a_rotating_order(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(timer.time, "perf_counter", lambda: clock.now)
    costs = {"a": 1.0, "b": 2.0, "c": 4.0}
    got = timer.time_synchronised_in_turn({n: clock.call(n, c) for n, c in costs.items()}, clock.sync, warmup=2,
                                          repeats=4)
    assert got == {n: [c] * 4 for n, c in costs.items()}  # a call's time holds nothing of the others'
    assert clock.calls[:6] == ["a", "a", "b", "b", "c", "c"]  # the warm-up calls, each call's in a row
    assert clock.calls[6:] == list("abc" "bca" "cab" "abc")  # each repeat starts one further along
    assert clock.syncs == 1 + 12  # once after the warm-up, then after every timed call
    assert timer.time_synchronised(clock.call("d", 0.5), clock.sync, warmup=0, repeats=3) == [0.5] * 3
    with pytest.raises(ValueError, match="repeats must be"):
        timer.time_synchronised_in_turn({"a": clock.call("a", 1.0)}, clock.sync, warmup=0, repeats=0)
    with pytest.raises(ValueError, match="at least one call"):
        timer.time_synchronised_in_turn({}, clock.sync, warmup=0, repeats=1)


def test_the_steps_of_a_workload_are_timed_together_and_torn_down_in_reverse(monkeypatch):
    """A step whose setup raises is reported and the others are timed; every teardown runs, the last set up first
    (each restores what its own setup found, the deterministic-algorithms flag among them)."""
    clock, torn = _Clock(), []
    monkeypatch.setattr(timer.time, "perf_counter", lambda: clock.now)

    def setup_of(name, seconds):
        if seconds is None:
            def setup(w):
                raise RuntimeError("no CUDA graphs here")
        else:
            def setup(w):
                return cases.Timed(clock.call(name, seconds), None, teardown=lambda: torn.append(name))
        return setup

    steps = [cases.Case(n, n, "step", None, setup_of(n, c)) for n, c in (("s1", 3e-4), ("s2", None), ("s3", 2e-4))]
    runtime = type("runtime", (), {"deviceSynchronize": staticmethod(clock.sync)})
    session = type("Session", (), {"cp": type("cp", (), {"cuda": type("cuda", (), {"runtime": runtime})}),
                                   "copy_rate": 3e12})()
    w = type("Workload", (), dict(kind="zipf", B=8, T=1024, C=768, V=50257, distinct=2484))()
    live = []
    rows, failures = run.time_steps(session, run.BenchConfig.quick_config(), steps, w,
                                    while_live=lambda timed: live.append((sorted(timed), list(torn))))
    assert live == [(["s1", "s3"], [])]  # the steps that were set up, before any teardown
    assert [(r["case"], r["median_us"], r["timer"], r["B"]) for r in rows] == [
        ("s1", pytest.approx(300.0), "perf_counter", 8), ("s3", pytest.approx(200.0), "perf_counter", 8)]
    assert failures == [dict(case="s2", ids="zipf", B=8, error="RuntimeError: no CUDA graphs here")]
    assert torn == ["s3", "s1"]
    with pytest.raises(ValueError, match="time_steps times the steps"):
        run.time_case(session, run.BenchConfig.quick_config(), steps[0], w)
    torn.clear()

    def fails(timed):
        raise RuntimeError("the caller's measurement failed")

    with pytest.raises(RuntimeError, match="caller's measurement"):
        run.time_steps(session, run.BenchConfig.quick_config(), steps, w, while_live=fails)
    assert torn == ["s3", "s1"]  # torn down all the same


def test_format_time():
    assert tables.format_time_us(1.234) == "1.23 us"
    assert tables.format_time_us(456.4) == "456 us"
    assert tables.format_time_us(46_100) == "46.1 ms"


def test_time_make_buckets_runs_on_the_host():
    samples = timer.time_make_buckets(make_ids("zipf", 2, 64, seed=0), repeats=3)
    assert len(samples) == 3 and all(s > 0 for s in samples)
    with pytest.raises(TypeError, match="repeats must be an integer"):
        timer.time_make_buckets(make_ids("zipf", 1, 8, seed=0), repeats=2.0)


# ------------------------------------------------------------------------------------------ fake results
#: Made-up medians (us) of the breakdown at B=64, uniform ids, so the tables can be checked by hand.
FAKE_B64_UNIFORM = dict(wpe_kernel=20.0, gpu_buckets=50.0, gpu_buckets_units=40.0, wte_chunked_kernel=80.0,
                        chunked_gpu=160.0, bucketed_gpu=250.0, torch_backward_det=800.0)


def fake_results(batch_sizes=(1, 64), kinds=("uniform", "zipf")) -> report.Results:
    """Made-up rows with the real shapes of a run (never to be committed as measurements)."""
    rows = []
    for kind in kinds:
        for B in batch_sizes:
            distinct = floor.distinct_ids(make_ids(kind, B, 1024, seed=1))
            for i, case in enumerate(cases.CASES):
                base = (1 + i) * 10e-6 * B ** 0.8
                if (kind, B) == ("uniform", 64) and case.name in FAKE_B64_UNIFORM:
                    base = FAKE_B64_UNIFORM[case.name] * 1e-6
                seconds = timer.Summary(base, 0.9 * base, 1.2 * base, 7)
                rows.append(report.make_row(case, ids=kind, B=B, T=1024, C=768, V=50257, dtype_name="bf16",
                                            distinct=distinct, seconds=seconds,
                                            timer="perf_counter" if case.family == "host" else "cuda-events",
                                            host_gap_frac=None if case.family == "host" else 0.0,
                                            copy_rate=H200_COPY_RATE))
    meta = dict(device="FAKE device (test data)", date="2000-01-01T00:00:00+00:00", command="fake",
                shape=dict(T=1024, C=768, V=50257, dtype="bf16"), repeats=7, host_repeats=7,
                copy_rate_GBps=H200_COPY_RATE / 1e9, torch="fake", failures=[])
    return report.Results(rows=rows, meta=meta, failures=[])


def _row(rows, case, kind="uniform", B=64):
    return next(r for r in rows if r["case"] == case and r["ids"] == kind and r["B"] == B)


def test_make_row_fills_floor_only_for_cases_with_an_op():
    rows = fake_results(batch_sizes=(4,), kinds=("uniform",)).rows
    by_case = {r["case"]: r for r in rows}
    assert set(by_case) == set(cases.CASE_NAMES)
    fwd = by_case["forward"]
    assert fwd["minimal_bytes"] == floor.minimal_bytes("forward", B=4, T=1024, C=768, distinct=fwd["distinct_ids"])
    assert fwd["pct_of_floor"] == pytest.approx(100 * fwd["floor_us"] / fwd["median_us"])
    assert fwd["achieved_GBps"] == pytest.approx(fwd["minimal_bytes"] / fwd["median_us"] / 1e3)
    assert by_case["torch_backward"]["floor_us"] == by_case["bucketed_gpu"]["floor_us"]  # one floor per op
    wte = by_case["wte_chunked_kernel"]
    assert wte["minimal_bytes"] == floor.minimal_bytes("backward_wte", B=4, T=1024, C=768, distinct=wte["distinct_ids"])
    for name in ("make_buckets", "gpu_buckets"):
        r = by_case[name]
        assert r["minimal_bytes"] is None and r["floor_us"] is None and r["pct_of_floor"] is None
        assert r["achieved_GBps"] is None


def test_csv_round_trip(tmp_path):
    rows = fake_results().rows
    back = report.read_csv(report.write_csv(rows, tmp_path / "results.csv"))
    assert len(back) == len(rows)
    for a, b in zip(rows, back):
        assert a.keys() == b.keys() == set(report.COLUMNS)
        for key in report.COLUMNS:
            if isinstance(a[key], float):
                assert b[key] == pytest.approx(a[key], rel=1e-12), key
            else:
                assert b[key] == a[key], key


def test_read_csv_of_an_older_run_computes_the_new_column(tmp_path):
    rows = fake_results(batch_sizes=(1,), kinds=("zipf",)).rows
    old = [c for c in report.COLUMNS if c not in report.OPTIONAL_COLUMNS]
    lines = [",".join(old)] + [",".join("" if r[c] is None else str(r[c]).replace(",", ";") for c in old)
                               for r in rows]
    path = tmp_path / "old.csv"
    path.write_text("\n".join(lines) + "\n")
    back = {r["case"]: r for r in report.read_csv(path)}
    assert back["forward"]["achieved_GBps"] == pytest.approx(_row(rows, "forward", "zipf", 1)["achieved_GBps"])
    assert back["make_buckets"]["achieved_GBps"] is None


def test_read_csv_rejects_other_files(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="missing columns"):
        report.read_csv(path)


# ------------------------------------------------------------------------------------------ markdown
def test_markdown_report():
    results = fake_results()
    text = tables.markdown_report(results.rows, results.meta)
    assert text.startswith("# Encoder benchmark on FAKE device (test data)")
    assert "## uniform ids" in text and "## zipf ids" in text and "## real ids" not in text
    assert "| kernel | B=1 | B=64 |" in text
    forward_b1 = _row(results.rows, "forward", B=1)
    assert f"| forward | {tables.format_time_us(forward_b1['median_us'])} ({forward_b1['pct_of_floor']:.0f}%) |" in text
    assert "| floor, forward |" in text and "| floor, backward |" in text
    assert "4273 GB/s" in text
    host_b1 = _row(results.rows, "make_buckets", "zipf", 1)
    assert f"| make_buckets alone (NumPy, host) | {tables.format_time_us(host_b1['median_us'])} |" in text  # no %
    assert "## Failures" not in text


def test_breakdown_table_by_hand():
    rows = fake_results().rows
    lines = tables.breakdown_markdown(rows, "uniform")
    assert lines[0] == "### Where the time goes, uniform ids"
    line = next(line for line in lines if line.startswith("| 64 |"))
    # wpe 20 + the chunked method's table 40 + chunked wte 80 = 140 us; its table is 40/160 = 25% of the chunked
    # call; the whole table 50/250 = 20% of the bucketed one
    chunked, bucketed = _row(rows, "chunked_gpu"), _row(rows, "bucketed_gpu")
    assert line.endswith(f"| 140 us | 160 us ({chunked['pct_of_floor']:.0f}%) | 25% | "
                         f"250 us ({bucketed['pct_of_floor']:.0f}%) | 20% |")
    # a run from before the chunked method's own table was timed: the whole table stands in (50 us, 31%)
    older = [r for r in rows if r["case"] != "gpu_buckets_units"]
    line = next(line for line in tables.breakdown_markdown(older, "uniform") if line.startswith("| 64 |"))
    assert line.endswith(f"| 150 us | 160 us ({chunked['pct_of_floor']:.0f}%) | 31% | "
                         f"250 us ({bucketed['pct_of_floor']:.0f}%) | 20% |")
    assert tables.breakdown_markdown([r for r in rows if r["case"] != "gpu_buckets"], "uniform") == []


def test_the_chunked_table_share_says_where_one_launch_builds_none():
    """At B=1 (1024 ids) the chunked call is one kernel with its own sort: no table, so no share of one; from B=2 on
    it builds the table again."""
    rows = fake_results(batch_sizes=(1, 2), kinds=("uniform",)).rows
    assert cases.chunked_call_builds_table(2) and not cases.chunked_call_builds_table(1)
    lines = tables.breakdown_markdown(rows, "uniform")
    one, two = (next(line for line in lines if line.startswith(f"| {B} |")) for B in (1, 2))
    assert "| none (one launch) |" in one and "none" not in two
    assert "| none (one launch) |" not in "\n".join(tables.breakdown_markdown(rows, "uniform", T=2048))


def test_markdown_lists_failures():
    results = fake_results()
    meta = dict(results.meta, failures=[dict(case="bucketed_gpu", ids="zipf", B=64, error="RuntimeError: boom")])
    assert "- bucketed_gpu (zipf, B=64): RuntimeError: boom" in tables.markdown_report(results.rows, meta)


# ------------------------------------------------------------------------------------------ README table
def test_readme_block():
    results = fake_results(kinds=("uniform", "zipf", "real"))
    text = tables.readme_block(results.rows, results.meta, results_link="x/results.md")
    assert "| B=64 | uniform ids | Zipf ids |" in text and "4273 GB/s" in text
    assert "[x/results.md](x/results.md)" in text
    table = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith(("| B=", "| step"))]
    assert [line.split(" | ")[0][2:] for line in table] == [*tables.README_ROWS.values(), (
        "speed-up of the default backward over PyTorch's deterministic one"), *tables.README_STEP_ROWS.values()]
    assert set(tables.README_ROWS) <= set(cases.CASE_NAMES)
    assert "| speed-up of the default backward over PyTorch's deterministic one | 5.0x |" in text  # 800 / 160
    assert "| step | B=1 | B=64 |" in text  # the step table: the sizes of README_STEP_SIZES the run measured
    step = _row(results.rows, "adapter_step", tables.README_STEP_KIND, 64)
    label = tables.README_STEP_ROWS["adapter_step"]
    assert f"| {label} | " in text and tables.format_time_us(step["median_us"]) in text
    assert "| B=1 |" in tables.readme_block(results.rows, results.meta, B=1)
    with pytest.raises(ValueError, match="B=8 was not measured"):
        tables.readme_block(results.rows, results.meta, B=8)


def test_the_step_table_says_its_steps_were_timed_in_turn_only_where_the_run_did():
    results = fake_results(kinds=("uniform", "zipf", "real"))
    older = tables.readme_block(results.rows, results.meta)
    newer = tables.readme_block(results.rows, {**results.meta, "step_timing": timer.STEP_TIMING_IN_TURN})
    assert "timed in turn" not in older and "the steps of each B timed in turn, medians:" in newer


def test_the_step_table_names_the_pytorch_it_ran_where_the_run_recorded_it():
    results = fake_results(kinds=("uniform", "zipf", "real"))
    named = tables.readme_block(results.rows, {**results.meta, "torch": "torch 9.9.9 (CUDA 99.0)"})
    assert "(its card and shape; torch 9.9.9 (CUDA 99.0)):" in named
    unnamed = tables.readme_block(results.rows, {k: v for k, v in results.meta.items() if k != "torch"})
    assert "(its card and shape):" in unnamed


def test_readme_block_without_step_rows_has_no_step_table():
    results = fake_results()
    rows = [r for r in results.rows if r["case"] not in tables.README_STEP_ROWS]
    assert "| step |" not in tables.readme_block(rows, results.meta)


def test_replace_between_markers():
    text = f"# t\n\nbefore\n{tables.README_START}\nold table\n{tables.README_END}\nafter\n"
    new = tables.replace_between_markers(text, "new table\n")
    assert new == f"# t\n\nbefore\n{tables.README_START}\n\nnew table\n\n{tables.README_END}\nafter\n"
    assert tables.replace_between_markers(new, "new table") == new  # idempotent
    for bad in ("no markers", text + tables.README_START, f"{tables.README_END}\n{tables.README_START}"):
        with pytest.raises(ValueError):
            tables.replace_between_markers(bad, "x")


def test_the_readme_has_the_markers():
    tables.replace_between_markers((ROOT / "README.md").read_text(), "x")  # raises if they are missing


def test_the_readme_table_is_the_committed_run():
    """The README's table is what the generator makes from docs/bench/ (``--readme README.md --readme-only``)."""
    rows, meta = report.load_results(ROOT / "docs" / "bench")
    text = (ROOT / "README.md").read_text()
    assert tables.replace_between_markers(text, tables.readme_block(rows, meta)) == text, (
        "README.md's table differs from docs/bench/: python -m gpt2enc_edu.bench --readme README.md --readme-only")


def test_cli_readme_only_writes_the_table_alone(tmp_path, capsys):
    """No GPU and no matplotlib needed: only the README's table is rewritten, the run's folder is left alone."""
    results = fake_results()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    report.write_csv(results.rows, run_dir / "results.csv")
    report.write_meta(results.meta, run_dir / "meta.json")
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{tables.README_START}\nstale\n{tables.README_END}\nrest\n")
    assert cli.main(["--from-results", str(run_dir), "--readme", str(readme), "--readme-only"]) == 0
    assert sorted(p.name for p in run_dir.iterdir()) == ["meta.json", "results.csv"]
    text = readme.read_text()
    assert "stale" not in text and "[run/results.md](run/results.md)" in text
    assert tables.replace_between_markers(text, tables.readme_block(results.rows, results.meta,
                                                                    results_link="run/results.md")) == text
    assert "rewrote the table" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["--readme-only"])


# ------------------------------------------------------------------------------------------ files, plots
def test_write_and_load_results(tmp_path):
    pytest.importorskip("matplotlib")
    results = fake_results()
    paths = report.write_results(results, tmp_path / "out")
    assert {p.name for p in paths} == {"results.csv", "results.md", "meta.json", plots.TIME_PNG, plots.FLOOR_PNG,
                                       plots.ROOFLINE_PNG, plots.BREAKDOWN_PNG}
    for p in paths:
        assert p.stat().st_size > 0
        if p.suffix == ".png":
            assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows, meta = report.load_results(tmp_path / "out")
    assert len(rows) == len(results.rows) and meta["device"] == "FAKE device (test data)"
    assert json.loads((tmp_path / "out" / "meta.json").read_text())["copy_rate_GBps"] == pytest.approx(4273)


def test_no_breakdown_plot_without_the_pieces(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [r for r in fake_results().rows if r["family"] != "piece"]
    assert not plots.has_breakdown(rows)
    names = {p.name for p in plots.save_plots(rows, tmp_path)}
    assert plots.BREAKDOWN_PNG not in names and plots.ROOFLINE_PNG in names
    with pytest.raises(ValueError, match="no per-kernel rows"):
        plots.plot_breakdown(rows)


def test_roofline_draws_the_copy_rate():
    pytest.importorskip("matplotlib")
    results = fake_results(kinds=("uniform",))
    fig = plots.plot_roofline(results.rows, meta=results.meta)
    ax = fig.axes[0]
    roof = [line for line in ax.get_lines() if line.get_label().startswith("copy rate")]
    assert len(roof) == 1 and roof[0].get_ydata()[0] == pytest.approx(4273)
    forward = next(line for line in ax.get_lines() if line.get_label() == "forward")
    assert list(forward.get_ydata()) == pytest.approx([_row(results.rows, "forward", B=b)["achieved_GBps"]
                                                      for b in (1, 64)])


def test_load_results_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="no benchmark results"):
        report.load_results(tmp_path)


def test_every_case_has_its_own_color():
    colors = [plots.CASE_COLORS[c.name] for c in cases.CASES]
    assert len(set(colors)) == len(colors)


# ------------------------------------------------------------------------------------------ configuration, CLI
def test_cases_are_named_functions():
    assert len(set(cases.CASE_NAMES)) == len(cases.CASES)
    for case in cases.CASES:
        assert case.family in cases.FAMILIES
        if case.family == "host":
            assert case.setup is None and case.op is None
        else:
            assert case.setup.__name__ == f"case_{case.name}" and case.op in (*floor.ALL_OPS, None)


def test_cli_defaults_and_quick():
    parser = cli.build_parser()
    config, out = cli.config_from_args(parser.parse_args([]))
    assert config.batch_sizes == (1, 4, 8, 16, 32, 64) and config.kinds == ("uniform", "zipf", "real")
    assert (config.repeats, config.warmup) == run.FULL_REPEATS[:2] and out == Path("docs/bench")
    config, out = cli.config_from_args(parser.parse_args(["--quick"]))
    assert config.batch_sizes == (1, 64) and config.quick and out == Path("docs/bench/quick")
    assert config.repeats == run.QUICK_REPEATS[0]
    config, out = cli.config_from_args(parser.parse_args(
        ["--quick", "--batch-sizes", "2", "8", "--ids", "real", "--repeats", "5", "--warmup", "0", "--out", "x",
         "--no-torch", "--cases", "forward", "bucketed_gpu"]))
    assert config.batch_sizes == (2, 8) and config.kinds == ("real",) and config.repeats == 5
    assert config.warmup == 0 and out == Path("x") and not config.use_torch
    assert config.cases == ("forward", "bucketed_gpu")


@pytest.mark.parametrize("argv", [["--batch-sizes", "0"], ["--ids", "normal"], ["--repeats", "x"],
                                  ["--repeats", "2.5"], ["--warmup", "-1"], ["--cases", "nothing"]])
def test_cli_rejects(argv, capsys):
    with pytest.raises(SystemExit) as info:
        cli.build_parser().parse_args(argv)
    assert info.value.code == 2
    assert "expected an integer" in capsys.readouterr().err or argv[0] in ("--ids", "--cases")


def test_config_rejects():
    with pytest.raises(ValueError, match="unknown"):
        run.BenchConfig(kinds=("gaussian",))
    with pytest.raises(ValueError, match="warmup"):
        run.BenchConfig(warmup=-1)
    with pytest.raises(ValueError, match="repeats"):
        run.BenchConfig(repeats=0)
    with pytest.raises(TypeError, match="batch size must be an integer"):
        run.BenchConfig(batch_sizes=(1.0,))


def test_cli_from_results_rewrites_files_and_readme(tmp_path, capsys):
    """No GPU needed: a finished run's folder is rendered again and the README's table rewritten."""
    pytest.importorskip("matplotlib")
    results = fake_results()
    report.write_csv(results.rows, (tmp_path / "run").mkdir() or tmp_path / "run" / "results.csv")
    report.write_meta(results.meta, tmp_path / "run" / "meta.json")
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{tables.README_START}\nstale\n{tables.README_END}\nrest\n")
    assert cli.main(["--from-results", str(tmp_path / "run"), "--readme", str(readme)]) == 0
    assert (tmp_path / "run" / "roofline.png").is_file() and (tmp_path / "run" / "results.md").is_file()
    text = readme.read_text()
    assert "stale" not in text and text.endswith(f"{tables.README_END}\nrest\n")
    assert "| B=64 | uniform ids | Zipf ids |" in text and "[run/results.md](run/results.md)" in text
    assert "rewrote" in capsys.readouterr().out


def test_no_gpu_exits_cleanly(tmp_path):
    """With no GPU visible the command says so (with gpu_status's reason), exits 0 and writes nothing."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
    out = tmp_path / "bench-out"
    proc = subprocess.run([sys.executable, "-m", "gpt2enc_edu.bench", "--out", str(out)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("No GPU: ")
    reason = subprocess.run([sys.executable, "-c", "import gpt2enc_edu; print(gpt2enc_edu.gpu_status().reason)"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120).stdout.strip()
    assert reason and reason in proc.stdout
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_module_entry_point_is_the_cli():
    assert "from .cli import main" in (BENCH_DIR / "__main__.py").read_text() and bench.main is cli.main
    assert 'gpt2enc-bench = "gpt2enc_edu.bench:main"' in (ROOT / "pyproject.toml").read_text()


# ------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
def test_gpu_timer_measures_a_known_spin():
    """The timer against a kernel that spins for 200 us of the GPU's clock: the median is at least that."""
    import cupy as cp

    from gpt2enc_edu.loader import get_kernel

    spin = get_kernel(*timer.SPIN_KERNEL, np.float32)
    gpu_timer = timer.GpuTimer(cp, flush_bytes=1 << 20)
    stream = cp.cuda.get_current_stream()
    samples, _ = gpu_timer.time(lambda: spin((1,), (1,), (np.uint64(200_000),)), stream, warmup=1, repeats=5)
    assert 200e-6 <= timer.summarize(samples).median < 2e-3


@pytest.mark.gpu
def test_gpu_smoke_run(tmp_path):
    """A tiny real run: every case but PyTorch's gives a positive time, and every file is written."""
    pytest.importorskip("matplotlib")
    config = run.BenchConfig(batch_sizes=(1, 2), kinds=("zipf",), repeats=3, warmup=1, host_repeats=2)
    results = run.run_benchmark(config, progress=False, command="pytest")
    assert results.failures == []
    ours = {c.name for c in cases.CASES if c.family != "torch"}
    assert ours <= {r["case"] for r in results.rows}, ours - {r["case"] for r in results.rows}
    assert all(r["median_us"] > 0 and r["repeats"] >= 2 for r in results.rows)
    assert results.meta["copy_rate_GBps"] > 0
    paths = report.write_results(results, tmp_path)
    assert {p.name for p in paths} >= {"results.csv", "meta.json", "results.md", plots.ROOFLINE_PNG,
                                       plots.BREAKDOWN_PNG}
    assert "### Where the time goes, Zipf ids" in (tmp_path / "results.md").read_text()


def test_notebook_plots_committed_results(tmp_path, monkeypatch):
    """Notebook 05 without a GPU reads a results folder and plots it (here: made-up results in tmp_path)."""
    if gpu_status().name == "cuda":
        pytest.skip("with a GPU the notebook measures live instead of reading committed results")
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("matplotlib")
    report.write_results(fake_results(), tmp_path / "results")
    monkeypatch.setenv("GPT2ENC_BENCH_DIR", str(tmp_path / "results"))
    nb = nbformat.read(ROOT / "notebooks" / "05_timings.ipynb", as_version=4)
    nbclient.NotebookClient(nb, timeout=120, resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs)
    assert "device: FAKE device (test data)" in text and "date:   2000-01-01" in text
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 2  # the notebook draws, it prints no tables


def test_breakdown_plot_stacks_each_methods_own_table():
    """The chunked bar stacks the chunked method's table (no bucket rows: 40 us here), the bucketed bar the whole
    table (50 us); rows from a run that did not time the former stack the whole table in both."""
    pytest.importorskip("matplotlib")
    rows = fake_results(batch_sizes=(64,), kinds=("uniform",)).rows

    def table_heights(rows):
        ax = plots.plot_breakdown(rows).axes[0]
        chunked_table, bucketed_table = ax.containers[1], ax.containers[4]  # wpe, table, wte per stack
        return chunked_table.patches[0].get_height(), bucketed_table.patches[0].get_height()

    assert table_heights(rows) == pytest.approx((40.0, 50.0))
    older = [r for r in rows if r["case"] != "gpu_buckets_units"]
    assert plots.has_breakdown(older)
    assert table_heights(older) == pytest.approx((50.0, 50.0))
