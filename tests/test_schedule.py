"""The block-scheduling model of notebook 03: exact small cases, invariants, and the notebook's claims."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpt2enc_edu as enc
from gpt2enc_edu import tokens
from gpt2enc_edu.course import schedule


def test_hand_computed_schedule():
    run = schedule.simulate([3, 1, 1, 1], num_slots=2)
    assert run.slot.tolist() == [0, 1, 1, 1]
    assert run.start.tolist() == [0, 0, 1, 2]
    assert run.end.tolist() == [3, 1, 2, 3]
    assert run.makespan == 3 and run.lower_bound == 3 and run.efficiency == 1.0


def test_ascending_order_leaves_the_long_block_alone_at_the_end():
    run = schedule.simulate_order([3, 1, 1, 1], 2, "ascending")
    assert run.order.tolist() == [1, 2, 3, 0]
    assert run.costs.tolist() == [1, 1, 1, 3]
    assert run.slot.tolist() == [0, 1, 0, 1]  # ties go to the lowest slot
    assert run.start.tolist() == [0, 0, 1, 1]
    assert run.makespan == 4 and run.lower_bound == 3
    assert run.efficiency == pytest.approx(6 / 8)


def test_empty_launch():
    run = schedule.simulate([], 4)
    assert run.makespan == 0 and run.lower_bound == 0 and run.efficiency == 1.0


costs_strategy = st.lists(st.integers(0, 50), min_size=1, max_size=60)


@settings(max_examples=200, deadline=None)
@given(costs_strategy, st.integers(1, 9), st.sampled_from(schedule.ORDERS))
def test_schedule_invariants(costs, num_slots, order):
    run = schedule.simulate_order(costs, num_slots, order, seed=1)
    costs = np.asarray(costs, dtype=np.float64)
    # The launch order is a permutation, and the blocks keep their costs.
    assert sorted(run.order.tolist()) == list(range(costs.size))
    assert np.array_equal(run.costs, costs[run.order])
    # Blocks start in launch order, and a slot never idles while blocks wait: back to back from time 0.
    assert (np.diff(run.start) >= 0).all()
    for s in range(num_slots):
        mine = np.flatnonzero(run.slot == s)
        if mine.size:
            assert run.start[mine[0]] == 0
            assert np.array_equal(run.start[mine[1:]], run.end[mine[:-1]])
    # Graham's bound for greedy list scheduling, whatever the order.
    assert run.lower_bound <= run.makespan <= costs.sum() / num_slots + (1 - 1 / num_slots) * costs.max() + 1e-9


def test_launch_order():
    costs = np.array([5, 1, 4, 1, 3])
    assert schedule.launch_order(costs, "table").tolist() == [0, 1, 2, 3, 4]
    assert schedule.launch_order(costs, "ascending").tolist() == [1, 3, 4, 2, 0]  # stable
    shuffled = schedule.launch_order(costs, "random", seed=3)
    assert sorted(shuffled.tolist()) == [0, 1, 2, 3, 4]
    assert np.array_equal(shuffled, schedule.launch_order(costs, "random", seed=3))


def test_block_costs_of_a_table():
    table = enc.make_buckets(np.array([[5, 2, 5], [2, 9, 5]], dtype=np.int32), 512, enc.bfloat16)
    assert schedule.block_costs(table).tolist() == [3, 3, 2, 2, 1, 1]
    assert schedule.block_costs(table, per_item=2.0, per_block=1.0).tolist() == [7, 7, 5, 5, 3, 3]


def test_block_costs_in_rounds_of_eight_warps():
    """8 warps share a bucket: sizes 1..8 take one round, 9..16 two, and so on."""
    sizes = np.array([1, 8, 9, 16, 17, 100])
    assert schedule.block_costs(sizes, warps=8).tolist() == [1, 1, 2, 2, 3, 13]
    assert schedule.block_costs(sizes, warps=8, per_block=2.0).tolist() == [3, 3, 4, 4, 5, 15]


@pytest.mark.parametrize("call, error", [
    (lambda: schedule.simulate([1, 2], 0), ValueError),
    (lambda: schedule.simulate([1, 2], 2.0), TypeError),
    (lambda: schedule.simulate([1, -2], 2), ValueError),
    (lambda: schedule.simulate([1, np.nan], 2), ValueError),
    (lambda: schedule.simulate([[1, 2]], 2), ValueError),
    (lambda: schedule.simulate(["a"], 2), TypeError),
    (lambda: schedule.launch_order([1, 2], "random"), ValueError),
    (lambda: schedule.launch_order([1, 2], "descending"), ValueError),
    (lambda: schedule.block_costs([1, 2], per_block=-1.0), ValueError),
    (lambda: schedule.block_costs([1, 2], warps=0), ValueError),
])
def test_bad_arguments_are_refused(call, error):
    with pytest.raises(error):
        call()


def test_notebook_toy_largest_first_reaches_the_bound():
    """The Gantt toy of notebook 03: 48 buckets on 4 slots."""
    table = enc.make_buckets(tokens.make_ids("zipf", 1, 96, V=400, seed=2), 256, enc.bfloat16)
    runs = schedule.compare_orders(schedule.block_costs(table), 4, seed=0)
    assert list(runs) == list(schedule.ORDERS)
    assert runs["table"].makespan == runs["table"].lower_bound == 24
    assert runs["random"].makespan > 24 and runs["ascending"].makespan > 24


@pytest.mark.parametrize("kind", ["zipf", "real"])
@pytest.mark.parametrize("per_block, warps", [(0, 1), (8, 1), (0, 8), (2, 8)])
def test_largest_first_wins_at_h200_scale(kind, per_block, warps):
    """Notebook 03's H200 table: for text-like ids, table order is never beaten by the other orders."""
    table = enc.make_buckets(tokens.make_ids(kind, 8, 1024, seed=0), 768, enc.bfloat16)
    slots = schedule.H200_SM_COUNT * schedule.WTE_BLOCKS_PER_SM
    runs = schedule.compare_orders(schedule.block_costs(table, per_block=per_block, warps=warps), slots, seed=0)
    assert runs["table"].makespan == runs["table"].lower_bound
    assert all(run.makespan >= runs["table"].makespan for run in runs.values())
