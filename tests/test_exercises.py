"""Every exercise check accepts its worked solution, reports an open stub as not done, and rejects wrong answers,
including the known ways to fool a checker: near misses, floats where integers belong, answers replayed from an
earlier run (a hard-coded table), and the back doors the package used to leave open."""

from __future__ import annotations

import importlib
import inspect
import re

import numpy as np
import pytest

import solutions.exercises as solutions
from gpt2enc_edu.course import exercises


@pytest.fixture(autouse=True)
def _record(tmp_path, monkeypatch):
    """The checks record into a file of the test's own, not the user's home."""
    monkeypatch.setenv("GPT2ENC_EDU_RECORD", str(tmp_path / "checks.jsonl"))


def _np(x):
    return np.asarray(x.get() if hasattr(x, "get") else x)


# (exercise number, check, solution, a wrong answer, whether the check takes xp)
CASES = [
    pytest.param(1, exercises.check_element_to_thread, solutions.element_to_thread,
                 lambda b, t, c, T, C, dtype: ((b * T + t) * C + c, c % 8), True, id="ex1"),
    pytest.param(2, exercises.check_rows_that_can_differ, solutions.rows_that_can_differ,
                 lambda inp, V: solutions.rows_that_can_differ(inp, V) | True, True, id="ex2"),
    pytest.param(3, exercises.check_locate, solutions.locate,
                 lambda table, inp, b, t, c: (solutions.locate(table, inp, b, t, c)[0], 0), False, id="ex3"),
    pytest.param(4, exercises.check_away_from_zero_probability, solutions.away_from_zero_probability,
                 lambda x: solutions.away_from_zero_probability(x) * 0 + 0.5, True, id="ex4"),
    pytest.param(5, exercises.check_backward_bytes, solutions.backward_bytes,  # dwte rows counted once only
                 lambda inp, C, itemsize: solutions.backward_bytes(inp, C, itemsize)
                 - int(np.unique(_np(inp)).size) * C * itemsize, True, id="ex5"),
    pytest.param(6, exercises.check_locate_unit, solutions.locate_unit,  # the item counted from the token's start
                 lambda table, inp, b, t, c: _place_in_token(table, inp, b, t, c), False, id="ex6"),
]


def _place_in_token(table, inp, b, t, c):
    """A wrong answer to Exercise 6: the token's first unit, and the item counted over the token's whole list."""
    T = inp.shape[1]
    first = int(np.flatnonzero(table.units[:, 0] == inp[b, t])[0])
    start, size = (int(v) for v in table.units[first, 2:])
    return first, c // table.c_per_group, int(np.flatnonzero(table.bt_list[start : start + size] == b * T + t)[0])


def _run(check, fn, takes_xp, xp):
    return check(fn, xp=xp) if takes_xp else check(fn)


@pytest.mark.parametrize("number, check, solution, wrong, takes_xp", CASES)
def test_solution_passes(xp, capsys, number, check, solution, wrong, takes_xp):
    assert _run(check, solution, takes_xp, xp) is True
    last_line = capsys.readouterr().out.strip().splitlines()[-1]
    assert last_line.startswith(f"Exercise {number} (") and last_line.endswith("correct.")


@pytest.mark.parametrize("number, check, solution, wrong, takes_xp", CASES)
def test_open_stub_is_reported_not_done(xp, capsys, number, check, solution, wrong, takes_xp):
    def stub(*args):
        raise NotImplementedError(f"Exercise {number}: fill me in")

    assert _run(check, stub, takes_xp, xp) is False
    out = capsys.readouterr().out
    assert f"Exercise {number}" in out and "not done yet" in out
    assert exercises.EXERCISES[number].hint in out


@pytest.mark.parametrize("number, check, solution, wrong, takes_xp", CASES)
def test_wrong_answer_is_rejected(xp, number, check, solution, wrong, takes_xp):
    with pytest.raises(exercises.ExerciseError, match=f"Exercise {number}"):
        _run(check, wrong, takes_xp, xp)


@pytest.mark.parametrize("number, check, solution, wrong, takes_xp", CASES)
def test_a_learners_own_bug_is_not_hidden(xp, number, check, solution, wrong, takes_xp):
    def buggy(*args):
        raise ZeroDivisionError("a bug in the learner's code")

    with pytest.raises(ZeroDivisionError):
        _run(check, buggy, takes_xp, xp)


@pytest.mark.parametrize("number, check, solution, wrong, takes_xp", CASES)
def test_answers_replayed_from_an_earlier_check_are_rejected(number, check, solution, wrong, takes_xp):
    """A hard-coded table: answers recorded while the solution passed one check, played back in the next."""
    recorded = []

    def recorder(*args):
        recorded.append(solution(*args))
        return recorded[-1]

    assert _run(check, recorder, takes_xp, np)
    replay = iter(list(recorded))
    with pytest.raises(exercises.ExerciseError, match=f"Exercise {number}"):
        _run(check, lambda *args: next(replay), takes_xp, np)


# ------------------------------------------------------------------------------------------------------
# Near misses and loose types.
NEAR_MISSES_4 = {
    "8-bit precision": lambda x: np.floor(solutions.away_from_zero_probability(x) * 256) / 256,
    "rounded to 2 decimals": lambda x: np.round(solutions.away_from_zero_probability(x), 2),
    "off by 200/65536 where inexact": lambda x: (lambda p: np.where(p > 0, np.minimum(p + 200 / 65536, 1.0), p))(
        solutions.away_from_zero_probability(x)),
    "float32 sums of halves": lambda x: (solutions.away_from_zero_probability(x) + 1e-7).astype(np.float32),
    "integer numerators": lambda x: (_np(x).view(np.uint32) & 0xFFFF),
}


@pytest.mark.parametrize("name", sorted(NEAR_MISSES_4))
def test_probability_near_misses_are_rejected(name):
    with pytest.raises(exercises.ExerciseError, match="Exercise 4"):
        exercises.check_away_from_zero_probability(NEAR_MISSES_4[name], xp=np)


@pytest.mark.parametrize("fake", [
    pytest.param(lambda n: n + 0.9, id="plus-0.9"),
    pytest.param(lambda n: float(n), id="float"),
    pytest.param(lambda n: str(n), id="string"),
    pytest.param(lambda n: np.float64(n), id="numpy-float"),
])
def test_byte_counts_must_be_integers(fake):
    with pytest.raises(exercises.ExerciseError, match="must be an integer"):
        exercises.check_backward_bytes(lambda inp, C, itemsize: fake(solutions.backward_bytes(inp, C, itemsize)),
                                       xp=np)
    assert exercises.check_backward_bytes(lambda *a: np.int64(solutions.backward_bytes(*a)), xp=np)


@pytest.mark.parametrize("fake", [
    pytest.param(lambda bucket, item: (float(bucket), float(item)), id="floats"),
    pytest.param(lambda bucket, item: (bucket, item + 0.0), id="float-item"),
    pytest.param(lambda bucket, item: (bucket == bucket, item), id="bool"),
])
def test_bucket_indices_must_be_integers(fake):
    with pytest.raises(exercises.ExerciseError, match="must be an integer"):
        exercises.check_locate(lambda *args: fake(*solutions.locate(*args)))


WRONG_6 = {
    "the token's first unit": lambda table, inp, b, t, c: (_place_in_token(table, inp, b, t, c)[0],
                                                          *solutions.locate_unit(table, inp, b, t, c)[1:]),
    "the item over the token's list": lambda table, inp, b, t, c: (*solutions.locate_unit(table, inp, b, t, c)[:2],
                                                                   _place_in_token(table, inp, b, t, c)[2]),
    "bf16's channel groups for fp32": lambda table, inp, b, t, c: (solutions.locate_unit(table, inp, b, t, c)[0],
                                                                   c // 256, solutions.locate_unit(table, inp, b, t,
                                                                                                   c)[2]),
    "the bucket for the unit": lambda table, inp, b, t, c: (solutions.locate(table, inp, b, t, c)[0],
                                                            *solutions.locate_unit(table, inp, b, t, c)[1:]),
    "the warp's index in the grid": lambda table, inp, b, t, c: (
        (lambda u, g, i: (u * table.num_c_groups + g, g, i))(*solutions.locate_unit(table, inp, b, t, c))),
}


@pytest.mark.parametrize("name", sorted(WRONG_6))
def test_wrong_units_groups_and_items_are_caught_and_the_case_named(name):
    with pytest.raises(exercises.ExerciseError, match=r"Exercise 6: inp=.*C=\d+ \(\w+\), \(b, t, c\)=\(\d+, \d+, "
                                                      r"\d+\): unit \d+ \(token \d+, chunk \d+\), channel group \d+, "
                                                      r"item \d+ reads it"):
        exercises.check_locate_unit(WRONG_6[name])


def test_unit_answers_must_be_three_integers():
    with pytest.raises(exercises.ExerciseError, match="three integers"):
        exercises.check_locate_unit(lambda table, inp, b, t, c: solutions.locate_unit(table, inp, b, t, c)[:2])
    with pytest.raises(exercises.ExerciseError, match="must be an integer"):
        exercises.check_locate_unit(lambda *args: tuple(float(v) for v in solutions.locate_unit(*args)))


def test_exercise_2_counts_two_adds_from_zero_as_deterministic():
    with pytest.raises(exercises.ExerciseError, match="occurs 2 times .* cannot change"):
        exercises.check_rows_that_can_differ(lambda inp, V: np.bincount(_np(inp).ravel(), minlength=V) >= 2, xp=np)
    assert "starting at zero" in exercises.EXERCISES[2].title


# ------------------------------------------------------------------------------------------------------
# Back doors.
def test_no_answers_behind_the_package():
    with pytest.raises(ImportError):
        importlib.import_module("gpt2enc_edu.solutions")
    assert not hasattr(exercises, "_where_each_item_is")
    source = inspect.getsource(exercises)
    assert not re.search(r"default_rng\(\s*\d", source), "a fixed seed in the checker lets answers be precomputed"
    for hint in (e.hint for e in exercises.EXERCISES.values()):
        assert "bincount" not in hint and "0xFFFF" not in hint and "unique" not in hint


def _overwrites_its_inputs(answer):
    """A wrong answer that first overwrites the arrays it was handed, so that they match ``answer`` of them."""
    def fn(*args):
        for a in args:
            if isinstance(a, np.ndarray):
                a[...] = 0 if a.dtype.kind in "iu" else 1.0
        return answer(*args)
    return fn


@pytest.mark.parametrize(("check", "answer"), [
    (exercises.check_rows_that_can_differ, lambda inp, V: np.arange(V) == 0),  # all ids 0: only row 0 repeats
    (exercises.check_away_from_zero_probability, lambda x: np.zeros(x.shape)),  # all 1.0: nothing dropped
], ids=["exercise 2", "exercise 4"])
def test_an_answer_that_overwrites_its_inputs_is_judged_on_the_real_ones(check, answer):
    with pytest.raises(exercises.ExerciseError):
        check(_overwrites_its_inputs(answer), xp=np)


def test_wrong_shapes_are_explained():
    with pytest.raises(exercises.ExerciseError, match="tuple"):
        exercises.check_element_to_thread(lambda b, t, c, T, C, dtype: b, xp=np)
    with pytest.raises(exercises.ExerciseError, match="boolean"):
        exercises.check_rows_that_can_differ(lambda inp, V: np.zeros(V, dtype=np.int64), xp=np)
    with pytest.raises(exercises.ExerciseError, match="two integers"):
        exercises.check_locate(lambda table, inp, b, t, c: None)
    with pytest.raises(exercises.ExerciseError, match="shape"):
        exercises.check_away_from_zero_probability(lambda x: x[:2], xp=np)


def test_every_exercise_has_a_check_and_a_solution():
    assert sorted(exercises.EXERCISES) == [1, 2, 3, 4, 5, 6]
    names = {1: "element_to_thread", 2: "rows_that_can_differ", 3: "locate", 4: "away_from_zero_probability",
             5: "backward_bytes", 6: "locate_unit"}
    for name in names.values():
        assert callable(getattr(solutions, name))
        assert callable(getattr(exercises, f"check_{name}"))
