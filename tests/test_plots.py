"""The notebooks' plotting helpers draw the data they are given (checked on the artists, Agg backend)."""

from __future__ import annotations

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import gpt2enc_edu as enc  # noqa: E402
from gpt2enc_edu.course import measured, plots, rounding_plots, schedule, timing_plots  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_importing_the_package_does_not_import_matplotlib():
    import subprocess
    import sys

    code = "import sys, gpt2enc_edu, gpt2enc_edu.course.plots; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    assert out.stdout.strip() == "False"


def test_thread_of_element():
    threads = plots.thread_of_element(2, 3, 16, enc.bfloat16)
    assert threads.shape == (6, 16)
    assert threads[0].tolist() == [0] * 8 + [1] * 8
    assert threads[5].tolist() == [10] * 8 + [11] * 8
    fp32 = plots.thread_of_element(2, 3, 16, np.float32)
    assert fp32[1].tolist() == [4] * 4 + [5] * 4 + [6] * 4 + [7] * 4


@pytest.mark.parametrize("dtype, threads", [(enc.bfloat16, 12), (np.float32, 24)])
def test_thread_map(dtype, threads):
    ax = plots.thread_map(2, 3, 16, dtype)
    image = np.asarray(ax.images[0].get_array())
    assert np.array_equal(image, plots.thread_of_element(2, 3, 16, dtype) % 20)
    labels = [text.get_text() for text in ax.texts]
    assert labels == [f"thread {i}" for i in range(threads)]
    size = 16 // np.dtype(dtype).itemsize
    x, y = ax.texts[5].get_position()
    assert (x, y) == ((5 * size) % 16 + (size - 1) / 2, (5 * size) // 16)  # centred on thread 5's pack
    assert [t.get_text() for t in ax.get_yticklabels()][4] == "b=1, t=1"


def _step_heights(patch) -> float:
    return float(patch.get_data().values.max())


def test_ulp_histogram_counts_and_clipping():
    diffs = {"a": np.array([0, 0, 0, 1, -1, 500]), "b": np.array([0, -700, 2])}
    ax = rounding_plots.ulp_histogram(diffs, limit=2, title="t")
    assert len(ax.patches) == 2
    assert _step_heights(ax.patches[0]) == 3  # three zeros in "a"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["a: 3 of 6 differ", "b: 2 of 3 differ"]
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks[0] == "<-2" and ticks[-1] == ">2"
    assert ax.get_yscale() == "log" and ax.get_title() == "t"


def test_ulp_histogram_refuses_nothing_and_bad_limit():
    with pytest.raises(ValueError):
        rounding_plots.ulp_histogram({})
    with pytest.raises(ValueError):
        rounding_plots.ulp_histogram({"a": np.array([1])}, limit=0)


def test_bucket_rank_size():
    ax = plots.bucket_rank_size({"x": np.array([1, 5, 2]), "y": np.array([3])})
    (x_line, y_line) = ax.get_lines()
    assert x_line.get_xdata().tolist() == [1, 2, 3]
    assert x_line.get_ydata().tolist() == [5, 2, 1]
    assert y_line.get_ydata().tolist() == [3]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"


def test_gantt_draws_every_block():
    run = schedule.simulate([3, 1, 1, 1, 2], num_slots=3)
    ax = plots.gantt(run, title="g")
    bars = sum(len(collection.get_paths()) for collection in ax.collections)
    assert bars == 5
    assert len(ax.collections) == len(set(run.slot.tolist()))
    vertical = sorted(float(line.get_xdata()[0]) for line in ax.get_lines())
    assert vertical == sorted([run.lower_bound, run.makespan])
    # The bar of block 0 spans its start to its end in its slot's row.
    extents = ax.collections[0].get_paths()[0].get_extents()
    assert (extents.x0, extents.x1) == (run.start[0], run.end[0])


def test_gantt_comparison_shares_time_and_titles_the_makespan():
    runs = schedule.compare_orders([5, 1, 1, 1, 1, 1], 2, seed=0)
    fig = plots.gantt_comparison(runs, title="cmp")
    assert len(fig.axes) == 4  # three charts and one shared colorbar
    for ax, (name, run) in zip(fig.axes, runs.items()):
        assert ax.get_title().startswith(f"{name} order: makespan {run.makespan:g}")
        assert ax.get_ylabel() == "block slot"
    assert "block cost" in fig.axes[3].get_xlabel()
    assert fig.axes[0].get_shared_x_axes().joined(fig.axes[0], fig.axes[2])
    with pytest.raises(ValueError):
        plots.gantt_comparison({})


def test_error_vs_adds():
    ax = rounding_plots.error_vs_adds([1, 10, 100], {"m": [0.0, 1.0, 2.0]})
    (line,) = ax.get_lines()
    assert line.get_xdata().tolist() == [1, 10, 100] and line.get_ydata().tolist() == [0, 1, 2]
    assert ax.get_xscale() == "log"
    with pytest.raises(ValueError):
        rounding_plots.error_vs_adds([1, 2], {"m": [1.0]})


def test_rounding_drift_draws_runs_and_their_mean():
    runs = np.array([[1.0, 2.0, 3.0], [1.0, 0.0, 1.0]])
    ax = rounding_plots.rounding_drift({"one": np.array([1.0, 1.0, 1.0]), "runs": runs}, exact=[1.0, 1.5, 2.0])
    lines = ax.get_lines()
    assert len(lines) == 1 + 1 + 2 + 1  # 1-D curve, mean, two runs, exact
    assert lines[1].get_ydata().tolist() == [1.0, 1.0, 2.0]  # the mean
    assert all(line.get_color() == lines[1].get_color() for line in lines[2:4])
    assert lines[-1].get_linestyle() == "--" and lines[-1].get_ydata().tolist() == [1.0, 1.5, 2.0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["one", "runs (mean of 2 runs)", "exact"]


def test_noise_uniformity():
    values = np.arange(1000) * 61 % 65536
    fig = rounding_plots.noise_uniformity(values, pairs=100)
    hist_ax, lag_ax = fig.axes
    assert len(hist_ax.patches) == 64
    assert sum(p.get_height() for p in hist_ax.patches) == 1000
    (points,) = lag_ax.get_lines()
    assert points.get_xdata().tolist() == values[:100].tolist()
    assert points.get_ydata().tolist() == values[1:101].tolist()
    with pytest.raises(ValueError):
        rounding_plots.noise_uniformity([1])


def test_round_up_probability():
    ax = rounding_plots.round_up_probability([0.0, 0.5], [0.01, 0.49])
    ideal, observed = ax.get_lines()
    assert ideal.get_xdata().tolist() == [0, 1]
    assert observed.get_xdata().tolist() == [0.0, 0.5] and observed.get_ydata().tolist() == [0.01, 0.49]
    with pytest.raises(ValueError):
        rounding_plots.round_up_probability([0.0], [0.1, 0.2])


def test_drawing_into_a_given_axes():
    fig, (left, right) = plt.subplots(1, 2)
    assert plots.bucket_rank_size({"x": [1, 2]}, ax=left) is left
    assert plots.gantt(schedule.simulate([1], 1), ax=right, colorbar=False) is right
    assert len(fig.axes) == 2
    plots.gantt(schedule.simulate([1], 1), ax=right)
    assert len(fig.axes) == 3  # the colorbar


@pytest.mark.parametrize("limit", [1, 2, 5, 16, 50, 1000])
def test_ulp_histogram_tick_labels_do_not_collide(limit):
    """The overflow bins, labelled at +-(limit+1), keep at least 2 ULPs from the nearest inner tick."""
    ax = rounding_plots.ulp_histogram({"a": np.array([-limit - 5, 0, limit + 5])}, limit=limit)
    ticks = list(ax.get_xticks())
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks[0] == -limit - 1 and ticks[-1] == limit + 1
    assert labels[0] == f"<{-limit}" and labels[-1] == f">{limit}"
    assert ticks[1] - ticks[0] >= min(2, limit) and ticks[-1] - ticks[-2] >= min(2, limit) and len(ticks) <= 9


def test_chunk_units_draws_one_bar_per_chunk():
    inp = np.array([[7] * 70 + [3] * 33 + [1] * 5], dtype=np.int32)
    table = enc.make_buckets(inp, 256, enc.bfloat16)
    ax = plots.chunk_units(table, top=3)
    bars = [len(collection.get_paths()) for collection in ax.collections]
    assert bars == [3, 2, 1]  # 70 -> 32 + 32 + 6, 33 -> 32 + 1, 5 -> 5
    assert [t.get_text() for t in ax.get_yticklabels()] == ["token 7", "token 3", "token 1"]
    assert ax.texts[0].get_text() == "3 units = 3 warps"  # C=256 in bf16: one channel group


def test_token_flow_draws_a_warp_per_chunk_and_group_and_one_combine():
    inp = np.array([[7] * 70 + [3] * 33 + [1] * 5], dtype=np.int32)
    table = enc.make_buckets(inp, 768, enc.bfloat16)  # 3 channel groups
    ax = plots.token_flow(table)  # token 7: 70 positions -> chunks of 32, 32, 6
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("warp") == 3 * 3
    assert [t for t in texts if t.startswith("chunk")] == [f"chunk {k}\n{n} pos.\nbt {a}..{b}" for k, n, a, b in
                                                          ((0, 32, 0, 31), (1, 32, 32, 63), (2, 6, 64, 69))]
    assert sum(t.startswith("combine:") for t in texts) == 1
    assert "token 7: 70 positions -> 3 chunks" in ax.get_title()
    with pytest.raises(ValueError, match="token 5"):
        plots.token_flow(table, token=5)


# ---------------------------------------------------------------------------------------------- timing plots


def _rows():
    rows = []
    for kind, scale in (("uniform", 1.0), ("zipf", 2.0)):
        for B in (1, 8, 64):
            rows.append(dict(case="bucketed_gpu", ids=kind, B=B, op="backward", median_us=scale * 10 * B,
                             floor_us=B * 0.5))
            rows.append(dict(case="make_buckets", ids=kind, B=B, op=None, median_us=100.0 * B, floor_us=None))
    return rows


def test_committed_walkthrough_numbers_load_and_draw():
    """The CPU path of notebooks 01 and 06: the committed files load, say where they come from, and draw."""
    forward = measured.forward_versions(np)
    phases = measured.bucketing_phases(np)
    assert forward is not None and "committed" in forward["source"] and "no GPU here" in forward["source"]
    for numbers in (forward, phases):  # the card they ran on, for a reader comparing them with the bench
        assert f"from {numbers['device']} (" in numbers["source"]
    assert {r["version"] for r in forward["rows"]} == {1, 2, 3}
    assert all(r["bitwise_equal_to_v3"] for r in forward["rows"])
    ax = timing_plots.forward_versions(forward)
    assert len(ax.patches) == len(forward["rows"])
    fig = timing_plots.bucketing_phases(phases)
    assert len(fig.axes) == len(phases["runs"])
    assert "no measurements" in timing_plots.forward_versions(None).texts[0].get_text()


def test_forward_floor_bytes():
    inp = np.array([[1, 2, 1]], dtype=np.int32)  # B=1, T=3, two distinct rows
    assert measured.forward_floor_bytes(inp, 8, 2) == (3 * 8 + 2 * 8 + 3 * 8) * 2 + 3 * 4


def test_skew_vs_time_and_sweep_draw_one_line_per_kind_and_the_floor():
    rows = _rows()
    fig = timing_plots.skew_vs_time(rows, {"bucketed_gpu": "bucketed"})
    (ax,) = fig.axes
    assert [line.get_label() for line in ax.get_lines()] == ["uniform ids", "zipf ids"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "8", "64"]
    assert timing_plots.spread_by_kind(rows, "bucketed_gpu")[64] == {"uniform": 640.0, "zipf": 1280.0}
    fig = timing_plots.sweep(rows, {"p": {"bucketed_gpu": "b", "make_buckets": "host"}}, floor_op={"p": "backward"})
    assert len(fig.axes) == 2  # one row per kind present
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert labels == ["b", "host", "memory floor"]
    host, floor = fig.axes[0].get_lines()[1:]
    assert host.get_linestyle() == ":" and floor.get_linestyle() == "--" and floor.get_color() == "k"


def test_loss_curves_and_gaps_draw_what_they_are_given():
    rng = np.random.default_rng()
    losses = 10 - np.cumsum(rng.random(20))
    ax = plots.loss_curves({"a": losses, "b": losses + 0.1})
    assert [line.get_label() for line in ax.get_lines()] == ["a", "b"]
    assert np.array_equal(ax.get_lines()[1].get_ydata(), losses + 0.1)
    gap = np.zeros(20)
    gap[7:] = rng.random(13) + 1e-6
    ax = plots.loss_gaps({"parts": gap, "same": np.zeros(20)})
    drawn, never = ax.get_lines()
    assert drawn.get_label() == "parts: parts at step 7" and list(drawn.get_xdata()) == list(range(7, 20))
    assert never.get_label() == "same: equal losses at every step" and len(never.get_xdata()) == 0
    assert ax.get_yscale() == "log"
