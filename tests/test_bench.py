"""The benchmark's pure parts on the CPU (arithmetic, summaries, writers, plots, CLI), and one GPU smoke run.

No test asserts anything about how fast something is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpt2enc_edu import bench
from gpt2enc_edu.backend import gpu_status
from gpt2enc_edu.tokens import make_ids

ROOT = Path(__file__).resolve().parents[1]
H200_COPY_RATE = 4273e9  # bytes/s, from the reference README (llm.c's numbers on the project's H200)


# ------------------------------------------------------------------------------------------ minimal bytes
def test_minimal_bytes_by_hand():
    ids = np.array([[1, 1, 2], [3, 1, 2]], dtype=np.int32)  # B=2, T=3: ids {1, 2, 3}
    assert bench.distinct_ids(ids) == 3
    # forward: out 2*3*8*2 = 96, wte rows 3*8*2 = 48, wpe 3*8*2 = 48, ids 6*4 = 24
    assert bench.minimal_bytes("forward", B=2, T=3, C=8, distinct=3) == 96 + 48 + 48 + 24
    # backward: dout 96, dwte rows read + written 2*48, dwpe read + written 2*48, ids 24
    assert bench.minimal_bytes("backward", B=2, T=3, C=8, distinct=3) == 96 + 96 + 96 + 24
    # fp32 storage doubles every float term, not the ids
    assert bench.minimal_bytes("forward", B=2, T=3, C=8, distinct=3, itemsize=4) == 2 * (96 + 48 + 48) + 24


def test_minimal_bytes_one_token():
    # B=1, T=1, C=1: one id, one row of each table
    assert bench.minimal_bytes("forward", B=1, T=1, C=1, distinct=1) == 2 + 2 + 2 + 4
    assert bench.minimal_bytes("backward", B=1, T=1, C=1, distinct=1) == 2 + 4 + 4 + 4


@pytest.mark.parametrize("kwargs, message", [
    (dict(op="sideways", B=1, T=1, C=1, distinct=1), "op must be"),
    (dict(op="forward", B=0, T=1, C=1, distinct=1), "B must be"),
    (dict(op="forward", B=1, T=1, C=1, distinct=2), "cannot exceed"),
    (dict(op="forward", B=1, T=1, C=1, distinct=0), "distinct must be"),
    (dict(op="forward", B=1, T=1, C=1.5, distinct=1), "C must be"),
])
def test_minimal_bytes_rejects(kwargs, message):
    op = kwargs.pop("op")
    with pytest.raises(ValueError, match=message):
        bench.minimal_bytes(op, **kwargs)


def test_floor_reproduces_reference_at_b64_uniform():
    """The reference README's floors (37 us forward, 51 us backward at B=64, uniform ids, 4273 GB/s)."""
    ids = make_ids("uniform", 64, 1024, seed=0)
    distinct = bench.distinct_ids(ids)
    assert 35_000 < distinct < 38_000  # about V * (1 - exp(-B*T/V)) = 36.6k for uniform draws
    fwd = bench.floor_seconds(bench.minimal_bytes("forward", B=64, T=1024, C=768, distinct=distinct), H200_COPY_RATE)
    bwd = bench.floor_seconds(bench.minimal_bytes("backward", B=64, T=1024, C=768, distinct=distinct), H200_COPY_RATE)
    assert round(fwd * 1e6) == 37
    assert round(bwd * 1e6) == 51


# ------------------------------------------------------------------------------------------ floor, percent
def test_floor_and_percent():
    assert bench.floor_seconds(2_000, 1_000.0) == 2.0
    assert bench.percent_of_floor(4.0, 2_000, 1_000.0) == 50.0
    assert bench.percent_of_floor(2.0, 2_000, 1_000.0) == 100.0
    assert bench.percent_of_floor(1.0, 2_000, 1_000.0) == 200.0  # faster than a copy (e.g. cache hits)


@pytest.mark.parametrize("call", [
    lambda: bench.floor_seconds(10, 0.0),
    lambda: bench.floor_seconds(10, float("inf")),
    lambda: bench.floor_seconds(-1, 1.0),
    lambda: bench.percent_of_floor(0.0, 10, 1.0),
    lambda: bench.percent_of_floor(float("nan"), 10, 1.0),
])
def test_floor_rejects(call):
    with pytest.raises(ValueError):
        call()


# ------------------------------------------------------------------------------------------ summaries
def test_summarize_percentiles():
    s = bench.summarize([11, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10])  # order does not matter
    assert (s.median, s.p10, s.p90, s.n) == (6.0, 2.0, 10.0, 11)
    assert bench.summarize([3.5]) == bench.Summary(3.5, 3.5, 3.5, 1)
    assert bench.summarize([1.0, 2.0]).median == 1.5
    us = bench.summarize([2e-6, 4e-6, 6e-6]).scaled(1e6)
    assert (us.median, us.p10, us.p90, us.n) == (pytest.approx(4.0), pytest.approx(2.4), pytest.approx(5.6), 3)


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [float("inf")]])
def test_summarize_rejects(bad):
    with pytest.raises(ValueError):
        bench.summarize(bad)


def test_format_time():
    assert bench.format_time_us(1.234) == "1.23 us"
    assert bench.format_time_us(456.4) == "456 us"
    assert bench.format_time_us(46_100) == "46.1 ms"


# ------------------------------------------------------------------------------------------ fake results
def fake_results(batch_sizes=(1, 64), kinds=("uniform", "zipf")) -> bench.Results:
    """Made-up rows with the real shapes of a run (never to be committed as measurements)."""
    rows = []
    rate = H200_COPY_RATE
    for kind in kinds:
        for B in batch_sizes:
            ids = make_ids(kind, B, 1024, seed=1)
            distinct = bench.distinct_ids(ids)
            for i, case in enumerate(bench.CASES):
                base = (1 + i) * 10e-6 * B ** 0.8
                seconds = bench.Summary(base, 0.9 * base, 1.2 * base, 7)
                rows.append(bench.make_row(case, ids=kind, B=B, T=1024, C=768, V=50257, dtype_name="bf16",
                                           distinct=distinct, seconds=seconds,
                                           timer="perf_counter" if case.family == "host" else "cuda-events",
                                           host_gap_frac=None if case.family == "host" else 0.0,
                                           copy_rate=rate))
    meta = dict(device="FAKE device (test data)", date="2000-01-01T00:00:00+00:00", command="fake",
                shape=dict(T=1024, C=768, V=50257, dtype="bf16"), repeats=7, host_repeats=7,
                copy_rate_GBps=rate / 1e9, torch="fake", failures=[])
    return bench.Results(rows=rows, meta=meta, failures=[])


def test_make_row_fills_floor_only_for_gpu_ops():
    rows = fake_results(batch_sizes=(4,), kinds=("uniform",)).rows
    by_case = {r["case"]: r for r in rows}
    assert set(by_case) == set(bench.CASE_NAMES)
    fwd = by_case["forward"]
    assert fwd["minimal_bytes"] == bench.minimal_bytes("forward", B=4, T=1024, C=768, distinct=fwd["distinct_ids"])
    assert fwd["pct_of_floor"] == pytest.approx(100 * fwd["floor_us"] / fwd["median_us"])
    assert by_case["torch_backward"]["floor_us"] == by_case["bucketed_gpu"]["floor_us"]  # one floor per op
    host = by_case["make_buckets"]
    assert host["minimal_bytes"] is None and host["floor_us"] is None and host["pct_of_floor"] is None


def test_csv_round_trip(tmp_path):
    rows = fake_results().rows
    path = bench.write_csv(rows, tmp_path / "results.csv")
    back = bench.read_csv(path)
    assert len(back) == len(rows)
    for a, b in zip(rows, back):
        assert a.keys() == b.keys()
        for key in bench.COLUMNS:
            if isinstance(a[key], float):
                assert b[key] == pytest.approx(a[key], rel=1e-12), key
            else:
                assert b[key] == a[key], key


def test_read_csv_rejects_other_files(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="missing columns"):
        bench.read_csv(path)


def test_markdown_report():
    results = fake_results()
    text = bench.markdown_report(results.rows, results.meta)
    assert text.startswith("# Encoder benchmark on FAKE device (test data)")
    assert "## uniform ids" in text and "## zipf ids" in text and "## real ids" not in text
    assert "| kernel | B=1 | B=64 |" in text
    forward_b1 = next(r for r in results.rows if r["case"] == "forward" and r["ids"] == "uniform" and r["B"] == 1)
    assert f"| forward | {bench.format_time_us(forward_b1['median_us'])} ({forward_b1['pct_of_floor']:.0f}%) |" in text
    assert "| floor, forward |" in text and "| floor, backward |" in text
    assert "4273 GB/s" in text
    host_b1 = next(r for r in results.rows if r["case"] == "make_buckets" and r["ids"] == "zipf" and r["B"] == 1)
    assert f"| make_buckets alone (NumPy, host) | {bench.format_time_us(host_b1['median_us'])} |" in text  # no %
    assert "## Failures" not in text


def test_markdown_lists_failures():
    results = fake_results()
    meta = dict(results.meta, failures=[dict(case="bucketed_gpu", ids="zipf", B=64, error="RuntimeError: boom")])
    assert "- bucketed_gpu (zipf, B=64): RuntimeError: boom" in bench.markdown_report(results.rows, meta)


def test_write_and_load_results(tmp_path):
    pytest.importorskip("matplotlib")
    results = fake_results()
    paths = bench.write_results(results, tmp_path / "out")
    names = {p.name for p in paths}
    assert names == {"results.csv", "results.md", "meta.json", "time_vs_B.png", "pct_of_floor.png"}
    for p in paths:
        assert p.stat().st_size > 0
    for png in ("time_vs_B.png", "pct_of_floor.png"):
        assert (tmp_path / "out" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows, meta = bench.load_results(tmp_path / "out")
    assert len(rows) == len(results.rows) and meta["device"] == "FAKE device (test data)"
    assert json.loads((tmp_path / "out" / "meta.json").read_text())["copy_rate_GBps"] == pytest.approx(4273)


def test_load_results_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="no benchmark results"):
        bench.load_results(tmp_path)


def test_time_make_buckets_runs_on_the_host():
    samples = bench.time_make_buckets(make_ids("zipf", 2, 64, seed=0), repeats=3)
    assert len(samples) == 3 and all(s > 0 for s in samples)


# ------------------------------------------------------------------------------------------ configuration, CLI
def test_cases_are_named_functions():
    assert len(set(bench.CASE_NAMES)) == len(bench.CASES)
    for case in bench.CASES:
        assert case.family in ("ours", "torch", "host")
        if case.family == "host":
            assert case.setup is None and case.op is None
        else:
            assert case.setup.__name__ == f"case_{case.name}" and case.op in (*bench.OPS, None)


def test_cli_defaults_and_quick():
    parser = bench.build_parser()
    config, out = bench.config_from_args(parser.parse_args([]))
    assert config.batch_sizes == (1, 4, 8, 16, 32, 64) and config.kinds == ("uniform", "zipf", "real")
    assert (config.repeats, config.warmup) == bench.FULL_REPEATS[:2] and out == Path("docs/bench")
    config, out = bench.config_from_args(parser.parse_args(["--quick"]))
    assert config.batch_sizes == (1, 64) and config.quick and out == Path("docs/bench/quick")
    assert config.repeats == bench.QUICK_REPEATS[0]
    config, out = bench.config_from_args(parser.parse_args(
        ["--quick", "--batch-sizes", "2", "8", "--ids", "real", "--repeats", "5", "--warmup", "0", "--out", "x",
         "--no-torch", "--cases", "forward", "bucketed_gpu"]))
    assert config.batch_sizes == (2, 8) and config.kinds == ("real",) and config.repeats == 5
    assert config.warmup == 0 and out == Path("x") and not config.use_torch
    assert config.cases == ("forward", "bucketed_gpu")


@pytest.mark.parametrize("argv", [["--batch-sizes", "0"], ["--ids", "normal"], ["--repeats", "x"],
                                  ["--cases", "nothing"]])
def test_cli_rejects(argv, capsys):
    with pytest.raises(SystemExit) as info:
        bench.build_parser().parse_args(argv)
    assert info.value.code == 2


def test_config_rejects():
    with pytest.raises(ValueError, match="unknown"):
        bench.BenchConfig(kinds=("gaussian",))
    with pytest.raises(ValueError, match="warmup"):
        bench.BenchConfig(warmup=-1)
    with pytest.raises(ValueError, match="repeats"):
        bench.BenchConfig(repeats=0)


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


# ------------------------------------------------------------------------------------------ GPU smoke run
@pytest.mark.gpu
def test_gpu_smoke_run(tmp_path):
    """A tiny real run: every case of ours produces a positive time and the files are written."""
    pytest.importorskip("matplotlib")
    config = bench.BenchConfig(batch_sizes=(1,), kinds=("uniform",), repeats=3, warmup=1, host_repeats=2)
    results = bench.run_benchmark(config, progress=False, command="pytest")
    assert results.failures == []
    cases = {r["case"] for r in results.rows}
    ours = {c.name for c in bench.CASES if c.family != "torch"}
    assert ours <= cases, ours - cases
    assert all(r["median_us"] > 0 and r["repeats"] >= 2 for r in results.rows)
    assert results.meta["copy_rate_GBps"] > 0
    paths = bench.write_results(results, tmp_path)
    assert {p.name for p in paths} >= {"results.csv", "meta.json", "results.md"}


def test_every_case_has_its_own_color():
    from gpt2enc_edu.bench import plots as bench_plots

    colors = [bench_plots.CASE_COLORS[c.name] for c in bench.CASES]
    assert len(set(colors)) == len(colors)


def test_notebook_plots_committed_results(tmp_path, monkeypatch):
    """Notebook 05 without a GPU reads a results folder and plots it (here: made-up results in tmp_path)."""
    if gpu_status().name == "cuda":
        pytest.skip("with a GPU the notebook measures live instead of reading committed results")
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("matplotlib")
    bench.write_results(fake_results(), tmp_path / "results")
    monkeypatch.setenv("GPT2ENC_BENCH_DIR", str(tmp_path / "results"))
    nb = nbformat.read(ROOT / "notebooks" / "05_timings.ipynb", as_version=4)
    nbclient.NotebookClient(nb, timeout=120, resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs)
    assert "device: FAKE device (test data)" in text and "date:   2000-01-01" in text
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2
    assert any("text/markdown" in o.get("data", {}) for o in outputs)
